"""Brute-force loop references for the metrics: plain Python over one list at a time.

Each function takes Python lists (one request: ``scores``, ``labels`` of equal length, no padding)
and follows the definition literally, without sorting tricks. Slow by design; small inputs only.
"""

from __future__ import annotations

import itertools
import math


def dcg_of_order(labels, order, k, gain="exp"):
    """DCG@k of the items taken in ``order`` (``k=None``: all)."""
    k = len(order) if k is None else k
    total = 0.0
    for r, i in enumerate(order[:k], start=1):
        g = 2.0 ** labels[i] - 1 if gain == "exp" else float(labels[i])
        total += g / math.log2(r + 1)
    return total


def ndcg_ref(scores, labels, k=10, gain="exp"):
    """NDCG@k averaged over every ordering consistent with the scores (all tie orders); None if
    the ideal DCG is 0."""
    n = len(scores)
    ideal = dcg_of_order(labels, sorted(range(n), key=lambda i: -labels[i]), k, gain)
    if ideal == 0:
        return None
    orders = [o for o in itertools.permutations(range(n))
              if all(scores[o[j]] >= scores[o[j + 1]] for j in range(n - 1))]
    return sum(dcg_of_order(labels, o, k, gain) for o in orders) / len(orders) / ideal


def ap_ref(scores, labels):
    """Average precision, relevance label > 0, pessimistic ties; None without a relevant item."""
    rel = [i for i in range(len(scores)) if labels[i] > 0]
    if not rel:
        return None
    total = 0.0
    for i in rel:
        above = [j for j in range(len(scores)) if scores[j] >= scores[i]]
        total += sum(1 for j in above if labels[j] > 0) / len(above)
    return total / len(rel)


def rr_ref(scores, labels):
    """Reciprocal rank of the first relevant item, pessimistic ties; None without one."""
    ranks = [sum(1 for j in range(len(scores)) if scores[j] >= scores[i])
             for i in range(len(scores)) if labels[i] > 0]
    return 1.0 / min(ranks) if ranks else None


def auc_ref(scores, labels):
    """Pairwise AUC with ties 1/2; None with a single class."""
    pos = [s for s, y in zip(scores, labels) if y > 0]
    neg = [s for s, y in zip(scores, labels) if y <= 0]
    if not pos or not neg:
        return None
    wins = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in pos for b in neg)
    return wins / (len(pos) * len(neg))


def gauc_ref(lists):
    """GAUC over ``[(scores, labels), ...]``: AUC weighted by list length, two-class lists only."""
    num = den = 0.0
    for scores, labels in lists:
        a = auc_ref(scores, labels)
        if a is not None:
            num += len(scores) * a
            den += len(scores)
    return num / den if den else None


def mean_over_lists(fn, lists, empty="skip"):
    """Mean of a per-list reference under an empty-list policy."""
    vals = []
    for scores, labels in lists:
        if not scores:
            continue
        v = fn(scores, labels)
        if v is None:
            if empty == "skip":
                continue
            v = 0.0 if empty == "zero" else 1.0
        vals.append(v)
    return sum(vals) / len(vals) if vals else None


def bin_ref(p, bins, binning):
    """Bin of every probability, straight from the stated rules."""
    n = len(p)
    if binning == "uniform":
        return [min(int(math.floor(q * bins)), bins - 1) for q in p]
    return [sum(1 for r in p if r < q) * bins // n for q in p]


def ece_ref(p, y, bins=15, binning="quantile"):
    """``sum_b n_b / n |mean_p_b - mean_y_b|`` with binary y = label > 0."""
    b = bin_ref(p, bins, binning)
    total = 0.0
    for j in set(b):
        idx = [i for i in range(len(p)) if b[i] == j]
        mp = sum(p[i] for i in idx) / len(idx)
        my = sum(1.0 if y[i] > 0 else 0.0 for i in idx) / len(idx)
        total += len(idx) / len(p) * abs(mp - my)
    return total


def pcoc_ref(p, y):
    return sum(p) / sum(1.0 if v > 0 else 0.0 for v in y)


def log_loss_ref(p, y, eps=1e-7):
    total = 0.0
    for q, v in zip(p, y):
        q = min(max(q, eps), 1 - eps)
        total -= math.log(q) if v > 0 else math.log(1 - q)
    return total / len(p)
