"""Brute-force references for every loss: plain Python loops over lists, items and pairs.

Written from the formulas in docs/CONVENTIONS.md §6 and the papers, independently of
``hybridrank.losses`` (no shared helper), in float64 Python arithmetic. Each ``ref_*`` function
takes nested lists (or tensors, converted) ``logits [G][L]``, ``labels [G][L]``, ``mask [G][L]``,
optional ``weights [G][L]`` and returns ``(per_list, counted)``: the loss of every list and
whether that list enters the mean. :func:`reduce` applies the reduction contract.
"""

from __future__ import annotations

import functools
import itertools
import math
import re

import numpy as np
import torch


def _rows(logits, labels, mask, weights=None):
    """Yield per list the real items as lists: scores, labels, weights."""
    to = (lambda t: t.tolist()) if isinstance(logits, torch.Tensor) else (lambda t: t)
    logits, labels, mask = to(logits), to(labels), to(mask)
    weights = to(weights) if weights is not None else None
    for g in range(len(labels)):
        idx = [i for i in range(len(labels[g])) if mask[g][i]]
        s = [logits[g][i] for i in idx]
        y = [float(labels[g][i]) for i in idx]
        w = [float(weights[g][i]) for i in idx] if weights is not None else [1.0] * len(idx)
        yield s, y, w


def reduce(per_list, counted, reduction="mean", denom=None):
    """The contract: uncounted lists give 0, mean over counted lists (or over ``denom``)."""
    vals = [v if c else 0.0 for v, c in zip(per_list, counted)]
    if reduction == "none":
        return vals
    total = sum(vals)
    if reduction == "sum":
        return total
    n = sum(1 for c in counted if c) if denom is None else denom
    return total / n if n > 0 else 0.0


def _lse(xs):
    m = max(xs)
    return m + math.log(sum(math.exp(x - m) for x in xs))


def _sig(x):
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def _softplus(x):
    return max(x, 0.0) + math.log1p(math.exp(-abs(x)))


def _learnable(y):
    return len(y) >= 2 and max(y) > min(y)


def _gain(y, gain="exp"):
    return 2.0**y - 1.0 if gain == "exp" else y


def _disc(r):
    return 1.0 / math.log2(1.0 + r)


def _idcg(y, gain="exp", k=None):
    top = sorted((_gain(v, gain) for v in y), reverse=True)
    return sum(g * _disc(r + 1) for r, g in enumerate(top) if k is None or r < k)


def _weighted_idcg(y, w, k=None):
    """Ideal DCG of the weighted gains ``w_i g_i`` (the weights scale an item's gain)."""
    top = sorted((wi * _gain(v) for v, wi in zip(y, w)), reverse=True)
    return sum(g * _disc(r + 1) for r, g in enumerate(top) if k is None or r < k)


# --- pointwise -------------------------------------------------------------------------------


def ref_bce(logits, labels, mask, weights=None, target="binary", label_max=1.0):
    """Per-list sums of ``-t log σ(s) - (1 - t) log(1 - σ(s))``; returns (per_list, counted, Σw)."""
    per, counted, wsum = [], [], 0.0
    for s, y, w in _rows(logits, labels, mask, weights):
        tot = 0.0
        for si, yi, wi in zip(s, y, w):
            t = (1.0 if yi > 0 else 0.0) if target == "binary" else yi / label_max
            tot += wi * (t * _softplus(-si) + (1 - t) * _softplus(si))
            wsum += wi
        per.append(tot)
        counted.append(len(s) > 0)
    return per, counted, wsum


# --- pairwise --------------------------------------------------------------------------------


def _avg_rank(s, i):
    above = sum(1 for j in range(len(s)) if s[j] > s[i])
    tied = sum(1 for j in range(len(s)) if j != i and s[j] == s[i])
    return 1.0 + above + tied / 2.0


@functools.lru_cache(maxsize=256)
def _score_orders(s):
    """Every ordering of the items consistent with descending scores (all tie orders)."""
    return [o for o in itertools.permutations(range(len(s)))
            if all(s[o[k]] >= s[o[k + 1]] for k in range(len(s) - 1))]


def _expected_disc_gap(s, i, j):
    """``E |1/log2(1 + r_i) - 1/log2(1 + r_j)|`` over uniformly random orders of tied scores."""
    total, orders = 0.0, _score_orders(tuple(s))
    for o in orders:
        rank = {item: pos + 1 for pos, item in enumerate(o)}
        total += abs(_disc(rank[i]) - _disc(rank[j]))
    return total / len(orders)


def _lambda(scheme, s, y, i, j, mu=10.0, gain="exp"):
    if scheme is None:
        return 1.0
    gi, gj = _gain(y[i], gain), _gain(y[j], gain)
    if scheme == "gain":
        return abs(gi - gj)
    idcg = _idcg(y, gain)
    dg = abs(gi - gj) / idcg
    ri, rj = _avg_rank(s, i), _avg_rank(s, j)
    rho = dg * _expected_disc_gap(s, i, j) if scheme != "ndcg2" else 0.0
    gap = max(abs(ri - rj), 1.0)
    delta = dg * abs(_disc(gap) - _disc(gap + 1.0))
    return {"ndcg": rho, "ndcg2": delta, "ndcg2pp": rho + mu * delta}[scheme]


def ref_pairwise(kernel, logits, labels, mask, weights=None, scheme=None, mu=10.0):
    """Weighted mean of ``λ_ij kernel(s_i - s_j)`` over the pairs ``y_i > y_j`` of each list."""
    per, counted = [], []
    for s, y, w in _rows(logits, labels, mask, weights):
        num = den = 0.0
        n_pairs = 0
        for i in range(len(s)):
            for j in range(len(s)):
                if y[i] > y[j]:
                    n_pairs += 1
                    num += w[i] * w[j] * _lambda(scheme, s, y, i, j, mu) * kernel(s[i] - s[j])
                    den += w[i] * w[j]
        per.append(num / den if den > 0 else 0.0)
        counted.append(n_pairs > 0)
    return per, counted


def ref_ranknet(logits, labels, mask, weights=None, scheme=None):
    return ref_pairwise(lambda d: _softplus(-d), logits, labels, mask, weights, scheme)


def ref_hinge(logits, labels, mask, weights=None, margin=1.0):
    return ref_pairwise(lambda d: max(0.0, margin - d), logits, labels, mask, weights)


def ref_lambdaloss(logits, labels, mask, weights=None, scheme="ndcg2pp", mu=10.0):
    kernel = lambda d: _softplus(-d) / math.log(2.0)  # noqa: E731 - one-line kernel
    return ref_pairwise(kernel, logits, labels, mask, weights, scheme, mu)


# --- listwise --------------------------------------------------------------------------------


def ref_softmax(logits, labels, mask, weights=None):
    per, counted = [], []
    for s, y, w in _rows(logits, labels, mask, weights):
        t = [wi * yi for wi, yi in zip(w, y)]
        if not _learnable(y) or sum(t) <= 0:
            per.append(0.0)
            counted.append(False)
            continue
        lse = _lse(s)
        per.append(-sum(ti * (si - lse) for ti, si in zip(t, s)) / sum(t))
        counted.append(True)
    return per, counted


def ref_listmle(logits, labels, mask, weights=None, position_aware=False):
    """Plackett–Luce NLL of the label order; labels must be distinct within a list (no ties)."""
    per, counted = [], []
    for s, y, w in _rows(logits, labels, mask, weights):
        assert len(set(y)) == len(y), "reference ListMLE needs distinct labels"
        order = sorted(range(len(s)), key=lambda i: -y[i])
        n = len(order)
        raw = [2.0 ** (n - k + 1) - 1.0 for k in range(1, n + 1)]
        tot = 0.0
        for k, i in enumerate(order):
            term = _lse([s[j] for j in order[k:]]) - s[i]
            a = raw[k] / sum(raw) if position_aware else 1.0
            tot += a * w[i] * term
        per.append(tot if _learnable(y) else 0.0)
        counted.append(_learnable(y))
    return per, counted


def ref_approx_ndcg(logits, labels, mask, weights=None, temperature=0.1):
    per, counted = [], []
    for s, y, w in _rows(logits, labels, mask, weights):
        if not _learnable(y):
            per.append(0.0)
            counted.append(False)
            continue
        dcg = 0.0
        for i in range(len(s)):
            rank = 1.0 + sum(_sig((s[j] - s[i]) / temperature) for j in range(len(s)) if j != i)
            dcg += w[i] * _gain(y[i]) * _disc(rank)
        per.append(1.0 - dcg / _weighted_idcg(y, w))
        counted.append(True)
    return per, counted


def ref_neural_ndcg(logits, labels, mask, weights=None, temperature=1.0, iters=30, k=None):
    per, counted = [], []
    for s, y, w in _rows(logits, labels, mask, weights):
        n = len(s)
        if not _learnable(y):
            per.append(0.0)
            counted.append(False)
            continue
        a = [sum(abs(s[i] - s[j]) for j in range(n)) for i in range(n)]
        p = []
        for r in range(1, n + 1):
            row = [((n + 1 - 2 * r) * s[i] - a[i]) / temperature for i in range(n)]
            lse = _lse(row)
            p.append([math.exp(v - lse) for v in row])
        for _ in range(iters):
            cols = [sum(p[r][i] for r in range(n)) for i in range(n)]
            p = [[p[r][i] / cols[i] for i in range(n)] for r in range(n)]
            p = [[v / sum(row) for v in row] for row in p]
        dcg = 0.0
        for r in range(n):
            if k is None or r < k:
                dcg += sum(p[r][i] * w[i] * _gain(y[i]) for i in range(n)) * _disc(r + 1)
        per.append(1.0 - dcg / _weighted_idcg(y, w, k=k))
        counted.append(True)
    return per, counted


# --- calibration-compatible ------------------------------------------------------------------


def ref_calibrated_softmax(logits, labels, mask, weights=None, y0=1.0, s0=0.0, link="sigmoid"):
    """Softmax CE over ``[s0] + u`` with targets ``[y0] + y``, ``u = log σ(s)`` or ``u = s``."""
    per, counted = [], []
    for s, y, w in _rows(logits, labels, mask, weights):
        t = [wi * yi for wi, yi in zip(w, y)]
        mass = sum(t) + y0
        if not s or mass <= 0:
            per.append(0.0)
            counted.append(False)
            continue
        u = [math.log(_sig(v)) if link == "sigmoid" else v for v in s]
        lse = _lse([s0] + u)
        per.append(-y0 * (s0 - lse) - sum(ti * (ui - lse) for ti, ui in zip(t, u)))
        counted.append(True)
    return per, counted


def ref_rcr(logits, labels, mask, weights=None):
    per, counted = [], []
    for s, y, w in _rows(logits, labels, mask, weights):
        t = [wi * yi for wi, yi in zip(w, y)]
        if not _learnable(y) or sum(t) <= 0:
            per.append(0.0)
            counted.append(False)
            continue
        total_sig = sum(_sig(v) for v in s)
        per.append(-sum(ti * math.log(_sig(si) / total_sig) for ti, si in zip(t, s)) / sum(t))
        counted.append(True)
    return per, counted


def ref_jrc(logits, labels, mask, weights=None, opposite_only=False, scope="batch"):
    """``logits [G][L][2]``. ``scope="list"``: per list the weighted mean of ``L_gen_i`` over lists
    with both labels; ``scope="batch"``: per list the weighted sum, every non-empty list counted
    (the mean then divides by the total weight, see :func:`ref_jrc_denominator`)."""
    per, counted = [], []
    for z, y, w in _rows(logits, labels, mask, weights):
        c = [1 if v > 0 else 0 for v in y]
        both = 0 < sum(c) < len(c)
        if scope == "list" and not both:
            per.append(0.0)
            counted.append(False)
            continue
        tot = 0.0
        for i in range(len(z)):
            pool = [j for j in range(len(z)) if j == i or not opposite_only or c[j] != c[i]]
            tot += w[i] * (_lse([z[j][c[i]] for j in pool]) - z[i][c[i]])
        if scope == "list":
            per.append(tot / sum(w) if sum(w) > 0 else 0.0)
        else:
            per.append(tot)
        counted.append(len(z) > 0)
    return per, counted


def ref_jrc_denominator(labels, mask, weights=None):
    """Total weight of the real impressions: the ``"batch"`` scope's mean divides by it."""
    return sum(sum(w) for _, _, w in _rows(labels, labels, mask, weights))


def ref_jrc_flat(z, clicks, session, opposite_only=False):
    """JRC's generative term on a flat batch with session ids, written the way Alibaba's EasyRec /
    TorchEasyRec state it: a ``[B, B]`` same-session mask, each impression's log-softmax over its
    session on the logit of its own label, then the mean over all ``B`` impressions."""
    b = len(clicks)
    total = 0.0
    for i in range(b):
        c = clicks[i]
        pool = [j for j in range(b) if session[j] == session[i]
                and (j == i or not opposite_only or clicks[j] != c)]
        total += _lse([z[j][c] for j in pool]) - z[i][c]
    return total / b


# ----------------------------------------------------------------------------------------------
# LibSVM / LETOR: the documented grammar, line by line
# ----------------------------------------------------------------------------------------------
_NUM = re.compile(r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf(?:inity)?|nan)\Z",
                  re.IGNORECASE)
_INT = re.compile(r"[+-]?[0-9]+\Z")


class LibsvmRejected(Exception):
    def __init__(self, line: int | None, why: str):
        super().__init__(f"line {line}: {why}")
        self.line = line


def ref_libsvm(raw: bytes, n_features: int | None = None) -> dict:
    """A line-by-line reference of the documented LibSVM grammar (docs/CONVENTIONS.md §1.4: ``label qid:Q i:v``).

    The one LibSVM reference of the tests (the reader's agreement on valid files, its first error
    line on malformed ones). Returns ``{"label", "qid", "comment", "line", "dense"}`` (``dense``:
    ``[rows, n_features or the largest index]`` float64), or raises :class:`LibsvmRejected` with
    the first bad line (``None``: no row at all).
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise LibsvmRejected(raw.count(b"\n", 0, e.start) + 1, "not UTF-8") from None
    labels, qids, comments, lines, feats = [], [], [], [], []
    for no, line in enumerate(text.split("\n"), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        body, sep, comment = line.partition("#")
        toks = body.split()
        if not toks or not _NUM.match(toks[0]):
            raise LibsvmRejected(no, "bad label")
        if len(toks) < 2 or not toks[1].startswith("qid:") or len(toks[1]) == 4:
            raise LibsvmRejected(no, "qid")
        row = {}
        for tok in toks[2:]:
            k, colon, v = tok.partition(":")
            if not colon or not _INT.match(k) or not _NUM.match(v):
                raise LibsvmRejected(no, f"feature {tok!r}")
            i = int(k)
            if not 1 <= i < 2**63 or (n_features is not None and i > n_features) or i in row:
                raise LibsvmRejected(no, f"index {tok!r}")
            row[i] = float(v)
        labels.append(float(toks[0]))
        qids.append(toks[1][4:])
        comments.append(comment.strip() if sep else None)
        lines.append(no)
        feats.append(row)
    if not lines:
        raise LibsvmRejected(None, "empty file")
    width = n_features if n_features is not None else max((max(r) for r in feats if r), default=0)
    dense = np.zeros((len(lines), width))
    for j, row in enumerate(feats):
        for i, v in row.items():
            dense[j, i - 1] = v
    return {"label": labels, "qid": qids, "comment": comments, "line": lines, "dense": dense}
