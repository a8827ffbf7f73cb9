"""Ranking metrics as pure functions over padded lists (the streaming shell: ``list_metrics.py``).

Inputs follow the glossary of :mod:`hybridrank.lists`: ``scores [G, L]`` (logits or any monotone
score), graded ``labels [G, L]`` (>= 0) and a bool ``mask [G, L]`` (True = a real impression).
Everything is vectorised over lists and runs on CPU or CUDA tensors. The per-list values come from
the kernels of :mod:`hybridrank.metrics.list_kernels`, which the metric engine sums per request.

Arguments follow one convention across the metrics and the losses: the tensors positionally, then
``mask`` and every option by keyword (``ndcg(scores, labels, *, mask, k=10)``, as
``softmax_loss(logits, labels, *, mask, weights=None)``). ``mask`` is keyword-only, so a call that
passes it positionally fails with a ``TypeError`` instead of binding it to another parameter.

Conventions (docs/CONVENTIONS.md §4), each a named argument or stated here:

- ``empty``: what a list without a positive label (ideal DCG 0) scores. ``"skip"`` leaves it out of
  the mean (the ``*_per_list`` functions return it as not valid, ``ListMetrics`` counts it in
  ``n_skipped``), ``"zero"`` scores it 0, ``"one"`` scores it 1. A row without any real impression
  (all padding) is never a list: it is ignored under every policy.
- ``ties="average"`` (NDCG): the expected DCG over uniformly random orderings of tied scores, i.e.
  a tied block's gain spread evenly over the ranks it occupies, cut-offs inside a block included
  (as ``sklearn.metrics.ndcg_score``). The result never depends on storage order.
- MAP and MRR use binary relevance ``label > 0`` and treat ties **pessimistically**: an item's rank
  is the number of items scored at least as high, and precision at that rank counts every relevant
  item scored at least as high (sklearn's ``average_precision_score`` rule). Storage order never
  matters; a constant-score model gets the worst rank for every item.
- AUC is global over all real impressions, GAUC the per-list AUC weighted by the list's number of
  impressions over the lists with both classes; both binary (``label > 0``) with ties counted 1/2.
- Undefined values raise ``ValueError`` in the pure functions (AUC with a single class, a mean over
  zero valid lists); ``ListMetrics.compute`` leaves the key out instead, next to the counts
  (``n_lists``, ``n_skipped``, ``n_positives``...) that explain why.

Calibration metrics live in :mod:`hybridrank.metrics.calibration`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from hybridrank._dcg import tie_blocks
from hybridrank.metrics.list_kernels import (
    K,
    ap_rr_blocks,
    apply_empty,
    auc_blocks,
    check_lists,
    check_options,
    ndcg_blocks,
    resolve_ks,
    value_dtype,
)

__all__ = [
    "ndcg", "ndcg_per_list", "mean_average_precision", "average_precision_per_list", "mrr",
    "reciprocal_rank_per_list", "auc", "auc_per_list", "auc_from_counts", "score_buckets", "gauc",
]


def _mean_valid(values: Tensor, valid: Tensor, what: str) -> Tensor:
    n = valid.sum()
    if int(n) == 0:
        raise ValueError(f"{what} undefined: no valid list (every list is padding, or has no "
                         "positive label under empty='skip')")
    w = valid.to(values.dtype).reshape(valid.shape + (1,) * (values.dim() - 1))
    return (values * w).sum(0) / n


# --- NDCG -----------------------------------------------------------------------------------------


def ndcg_per_list(
    scores: Tensor, labels: Tensor, *, mask: Tensor, k: K | Sequence[K] = 10, gain: str = "exp",
    empty: str = "skip", ties: str = "average",
) -> tuple[Tensor, Tensor]:
    """NDCG@k of every list, for one or several cut-offs at once.

    ``DCG@k = sum_{rank r <= k} gain(rel_r) / log2(r + 1)`` with ``gain = 2^rel - 1`` (``"exp"``) or
    ``rel`` (``"linear"``); ``NDCG@k = DCG@k / IDCG@k``. With ``ties="average"`` the DCG is its
    expectation over random orderings of tied scores: an item of a tied block spanning ranks a..b
    contributes ``gain / (b - a + 1) * sum_{r=a}^{min(b, k)} 1 / log2(r + 1)``.

    Args:
        scores: ``[G, L]`` scores. labels: ``[G, L]`` graded labels >= 0. mask: ``[G, L]`` bool.
        k: an int, ``None`` (the whole list), or a sequence of them.
        gain, empty, ties: conventions of the module docstring.

    Returns:
        ``(values [G, K], valid [G])``: lists without a positive hold 0 / 1 under ``"zero"`` /
        ``"one"`` and 0 under ``"skip"``, where they and all-padding rows are not ``valid``.

    >>> v, ok = ndcg_per_list(torch.tensor([[2., 1.]]), torch.tensor([[0., 1.]]),
    ...                       mask=torch.tensor([[True, True]]), k=None)
    >>> round(float(v[0, 0]), 6), ok.tolist()   # (1 / log2 3) / 1
    (0.63093, [True])

    Reference: Järvelin & Kekäläinen 2002; tie averaging as McSherry & Najork 2008.
    """
    ks, _ = resolve_ks(k)
    check_options(empty=empty, gain=gain, ties=ties)
    check_lists(scores, labels, mask=mask)
    vals, has_pos = ndcg_blocks(tie_blocks(scores, mask), labels, mask=mask, ks=ks, gain=gain,
                                dtype=value_dtype(scores, labels))
    return apply_empty(vals, has_pos, mask=mask, empty=empty)


def ndcg(
    scores: Tensor, labels: Tensor, *, mask: Tensor, k: K | Sequence[K] = 10, gain: str = "exp",
    empty: str = "skip", ties: str = "average",
) -> Tensor:
    """Mean NDCG@k over the valid lists (see :func:`ndcg_per_list` for the formula and options).

    Returns:
        a scalar for an int / ``None`` ``k``, a ``[K]`` tensor for a sequence. Raises ``ValueError``
        when no list is valid.

    >>> s, y = torch.tensor([[1., 1., 1.]]), torch.tensor([[1., 0., 0.]])
    >>> m = torch.ones(1, 3, dtype=torch.bool)
    >>> round(float(ndcg(s, y, mask=m, k=1)), 6)   # the relevant item is first in 1 of 3 orders
    0.333333
    """
    ks, scalar = resolve_ks(k)
    vals, valid = ndcg_per_list(scores, labels, mask=mask, k=ks, gain=gain, empty=empty, ties=ties)
    out = _mean_valid(vals, valid, "ndcg")
    return out[0] if scalar else out


# --- MAP, MRR -------------------------------------------------------------------------------------


def average_precision_per_list(
    scores: Tensor, labels: Tensor, *, mask: Tensor, empty: str = "skip"
) -> tuple[Tensor, Tensor]:
    """Average precision of every list, binary relevance ``label > 0``, pessimistic ties.

    ``AP = (1/R) sum_{i relevant} |{j relevant: s_j >= s_i}| / |{j: s_j >= s_i}|``.

    Args:
        scores, labels, mask: ``[G, L]``. empty: module docstring.

    Returns:
        ``(values [G], valid [G])`` as in :func:`ndcg_per_list`.
    """
    check_options(empty=empty)
    check_lists(scores, labels, mask=mask)
    ap, _, has_pos = ap_rr_blocks(tie_blocks(scores, mask), labels, mask=mask,
                                  dtype=value_dtype(scores, labels))
    return apply_empty(ap, has_pos, mask=mask, empty=empty)


def mean_average_precision(
    scores: Tensor, labels: Tensor, *, mask: Tensor, empty: str = "skip"
) -> Tensor:
    """MAP: mean of :func:`average_precision_per_list` over the valid lists.

    >>> s, y = torch.tensor([[3., 2., 1.]]), torch.tensor([[1., 0., 1.]])
    >>> m = torch.ones(1, 3, dtype=torch.bool)
    >>> round(float(mean_average_precision(s, y, mask=m)), 6)   # (1/1 + 2/3) / 2
    0.833333

    Reference: Baeza-Yates & Ribeiro-Neto, Modern Information Retrieval.
    """
    return _mean_valid(*average_precision_per_list(scores, labels, mask=mask, empty=empty), "map")


def reciprocal_rank_per_list(
    scores: Tensor, labels: Tensor, *, mask: Tensor, empty: str = "skip"
) -> tuple[Tensor, Tensor]:
    """Reciprocal rank of the best-scored relevant item, pessimistic ties.

    ``RR = 1 / |{j: s_j >= max_{i relevant} s_i}|`` (relevance ``label > 0``).

    Returns:
        ``(values [G], valid [G])`` as in :func:`ndcg_per_list`.
    """
    check_options(empty=empty)
    check_lists(scores, labels, mask=mask)
    _, rr, has_pos = ap_rr_blocks(tie_blocks(scores, mask), labels, mask=mask,
                                  dtype=value_dtype(scores, labels))
    return apply_empty(rr, has_pos, mask=mask, empty=empty)


def mrr(scores: Tensor, labels: Tensor, *, mask: Tensor, empty: str = "skip") -> Tensor:
    """MRR: mean of :func:`reciprocal_rank_per_list` over the valid lists.

    >>> s, y = torch.tensor([[2., 2., 1.]]), torch.tensor([[0., 1., 0.]])
    >>> m = torch.ones(1, 3, dtype=torch.bool)
    >>> float(mrr(s, y, mask=m))   # tied with the top item: pessimistic rank 2
    0.5

    Reference: Voorhees 1999, TREC-8 QA track.
    """
    return _mean_valid(*reciprocal_rank_per_list(scores, labels, mask=mask, empty=empty), "mrr")


# --- AUC, GAUC -----------------------------------------------------------------------------------


def auc_per_list(scores: Tensor, labels: Tensor, *, mask: Tensor) -> tuple[Tensor, Tensor]:
    """ROC AUC inside every list: ``P(s_pos > s_neg) + P(s_pos = s_neg) / 2`` over its pairs.

    Returns:
        ``(values [G] float64, valid [G])``, valid where the list has both classes.
    """
    check_lists(scores, labels, mask=mask)
    return auc_blocks(tie_blocks(scores, mask), labels, mask=mask)


def auc_from_counts(pos: Tensor, neg: Tensor) -> tuple[Tensor, Tensor]:
    """Global AUC from positives and negatives per score bucket, buckets in ascending score order.

    ``AUC = sum_b pos_b (neg_{<b} + neg_b / 2) / (P N)``: a pair in one bucket counts 1/2. With one
    bucket per distinct score this is the exact AUC (ties counted 1/2); :func:`auc`, the per-request
    statistics and the streaming histogram of :class:`~hybridrank.metrics.list_metrics.ListMetrics`
    all use it. Vectorised over leading dimensions (buckets last).

    Returns:
        ``(auc, defined)``, defined where both classes occur.

    >>> auc_from_counts(torch.tensor([0., 1., 1.]), torch.tensor([1., 1., 0.]))[0].item()
    0.875
    """
    below = neg.cumsum(-1) - neg
    pairs = pos.sum(-1) * neg.sum(-1)
    ok = pairs > 0
    wins = (pos * (below + 0.5 * neg)).sum(-1)
    return torch.where(ok, wins / torch.where(ok, pairs, torch.ones_like(pairs)),
                       torch.zeros_like(wins)), ok


def score_buckets(scores: Tensor) -> tuple[Tensor, int]:
    """``(bucket [n], n_buckets)``: the rank of each flat score among the distinct scores,
    ascending (tied scores share a bucket), for :func:`auc_from_counts`."""
    s = scores if scores.is_floating_point() else scores.double()
    uniq, inv = torch.unique(s, return_inverse=True)
    return inv.reshape(-1), int(uniq.numel())


def auc(scores: Tensor, labels: Tensor, *, mask: Tensor | None = None) -> Tensor:
    """Global ROC AUC over all real impressions (binary ``label > 0``, ties counted 1/2).

    ``AUC = (1 / (P N)) sum_{i pos, j neg} [s_i > s_j] + [s_i = s_j] / 2``, computed by
    :func:`auc_from_counts` over the distinct scores.

    Args:
        scores, labels: any one shape, e.g. ``[G, L]`` or flat ``[N]``. mask: optional bool.

    Returns:
        float64 scalar. Raises ``ValueError("AUC undefined: only one class")`` without both classes.

    >>> float(auc(torch.tensor([0.1, 0.4, 0.4, 0.8]), torch.tensor([0., 0., 1., 1.])))
    0.875
    """
    mask = torch.ones_like(scores, dtype=torch.bool) if mask is None else mask
    if scores.shape != labels.shape or scores.shape != mask.shape:
        raise ValueError("scores, labels and mask must share one shape")
    s, y = scores[mask].reshape(1, -1), labels[mask].reshape(1, -1)
    check_lists(s, y, mask=torch.ones_like(s, dtype=torch.bool))
    bucket, n_buckets = score_buckets(s)
    rel = (y.reshape(-1) > 0).double()
    value, ok = auc_from_counts(torch.bincount(bucket, rel, minlength=n_buckets),
                                torch.bincount(bucket, 1 - rel, minlength=n_buckets))
    if not bool(ok):
        raise ValueError("AUC undefined: only one class")
    return value


def gauc(scores: Tensor, labels: Tensor, *, mask: Tensor) -> Tensor:
    """Group AUC: per-list AUC weighted by list impressions, over lists with both classes.

    ``GAUC = sum_g n_g AUC_g / sum_g n_g`` over lists g holding a positive and a negative; ``n_g``
    counts all of the list's real impressions.

    Returns:
        float64 scalar; ``ValueError`` when no list has both classes.

    Reference: Zhu et al. 2017, "Optimized Cost per Click in Taobao Display Advertising".
    """
    values, valid = auc_per_list(scores, labels, mask=mask)
    w = mask.sum(1).double() * valid
    if float(w.sum()) == 0:
        raise ValueError("GAUC undefined: no list has both classes")
    return (values * w).sum() / w.sum()
