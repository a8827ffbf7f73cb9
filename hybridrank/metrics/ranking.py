"""Ranking metrics as pure functions over padded lists (the streaming shell: ``list_metrics.py``).

Inputs follow the glossary of :mod:`hybridrank.lists`: ``scores [G, L]`` (logits or any monotone
score), graded ``labels [G, L]`` (>= 0) and a bool ``mask [G, L]`` (True = a real impression).
Everything is vectorised over lists and runs on CPU or CUDA tensors.

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
import torch.nn.functional as F
from torch import Tensor

from hybridrank._dcg import block_means, gains, ideal_dcg, position_discounts, tie_blocks

__all__ = [
    "ndcg", "ndcg_per_list", "mean_average_precision", "average_precision_per_list", "mrr",
    "reciprocal_rank_per_list", "auc", "auc_per_list", "auc_from_counts", "gauc",
]

_EMPTY = ("skip", "zero", "one")
_GAINS = ("exp", "linear")
_TIES = ("average",)
K = int | None


# --- validation and the shared sort ------------------------------------------------------------


def _check_options(*, empty: str = "skip", gain: str = "exp", ties: str = "average") -> None:
    for name, value, allowed in (("empty", empty, _EMPTY), ("gain", gain, _GAINS),
                                 ("ties", ties, _TIES)):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def _check_lists(scores: Tensor, labels: Tensor, mask: Tensor) -> None:
    if scores.dim() != 2 or scores.shape != labels.shape or scores.shape != mask.shape:
        raise ValueError("scores, labels and mask must share one [G, L] shape, got "
                         f"{tuple(scores.shape)}, {tuple(labels.shape)}, {tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor, got {mask.dtype}")
    bad = labels < 0
    if labels.is_floating_point():
        bad |= torch.isnan(labels)
    if scores.is_floating_point():
        bad |= torch.isnan(scores)
    if bool((bad & mask).any()):  # one device sync on the happy path; name the culprit after
        if scores.is_floating_point() and bool((torch.isnan(scores) & mask).any()):
            raise ValueError("scores contains NaN at a real impression")
        if labels.is_floating_point() and bool((torch.isnan(labels) & mask).any()):
            raise ValueError("labels contains NaN at a real impression")
        raise ValueError("labels must be >= 0")


def _resolve_ks(k: K | Sequence[K]) -> tuple[tuple[K, ...], bool]:
    """``(ks, scalar)``; ``None`` means the whole list."""
    scalar = k is None or isinstance(k, int)
    ks = (k,) if scalar else tuple(k)
    if not ks or any(v is not None and (not isinstance(v, int) or v < 1) for v in ks):
        raise ValueError(f"k must be a positive int, None, or a sequence of them, got {k!r}")
    return ks, scalar


def _dtype(*ts: Tensor) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in ts) else torch.float32


def _ndcg_blocks(blocks, labels, mask, ks, gain, dt):
    """``[G, K]`` NDCG (NaN-free, 0 where the ideal DCG is 0) and ``[G]`` has-positive flags."""
    order, first, last = blocks
    g = gains(labels.to(dt), gain).masked_fill(~mask, 0)
    dk = position_discounts(mask.shape[1], ks, dtype=dt, device=g.device)  # [K, L], 0 past k
    mean_disc = block_means(dk, first, last)  # [K, G, L]: each slot's tie-averaged discount
    dcg = (mean_disc * g.gather(1, order)).sum(-1).T
    idcg = ideal_dcg(g, mask, dk)
    has_pos = (g > 0).any(1)
    return dcg / torch.where(has_pos[:, None], idcg, 1), has_pos


def _apply_empty(values: Tensor, has_pos: Tensor, mask: Tensor, empty: str):
    fill = 1.0 if empty == "one" else 0.0
    hp = has_pos.reshape(has_pos.shape + (1,) * (values.dim() - 1))
    values = torch.where(hp, values, torch.full_like(values, fill))
    nonempty = mask.any(1)
    return values, (nonempty & has_pos) if empty == "skip" else nonempty


def _mean_valid(values: Tensor, valid: Tensor, what: str) -> Tensor:
    n = valid.sum()
    if int(n) == 0:
        raise ValueError(f"{what} undefined: no valid list (every list is padding, or has no "
                         "positive label under empty='skip')")
    w = valid.to(values.dtype).reshape(valid.shape + (1,) * (values.dim() - 1))
    return (values * w).sum(0) / n


# --- NDCG -----------------------------------------------------------------------------------------


def ndcg_per_list(
    scores: Tensor, labels: Tensor, mask: Tensor, *, k: K | Sequence[K] = 10, gain: str = "exp",
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
    ...                       torch.tensor([[True, True]]), k=None)
    >>> round(float(v[0, 0]), 6), ok.tolist()   # (1 / log2 3) / 1
    (0.63093, [True])

    Reference: Järvelin & Kekäläinen 2002; tie averaging as McSherry & Najork 2008.
    """
    ks, _ = _resolve_ks(k)
    _check_options(empty=empty, gain=gain, ties=ties)
    _check_lists(scores, labels, mask)
    vals, has_pos = _ndcg_blocks(tie_blocks(scores, mask), labels, mask, ks, gain,
                                 _dtype(scores, labels))
    return _apply_empty(vals, has_pos, mask, empty)


def ndcg(
    scores: Tensor, labels: Tensor, mask: Tensor, *, k: K | Sequence[K] = 10, gain: str = "exp",
    empty: str = "skip", ties: str = "average",
) -> Tensor:
    """Mean NDCG@k over the valid lists (see :func:`ndcg_per_list` for the formula and options).

    Returns:
        a scalar for an int / ``None`` ``k``, a ``[K]`` tensor for a sequence. Raises ``ValueError``
        when no list is valid.

    >>> s, y = torch.tensor([[1., 1., 1.]]), torch.tensor([[1., 0., 0.]])
    >>> m = torch.ones(1, 3, dtype=torch.bool)
    >>> round(float(ndcg(s, y, m, k=1)), 6)   # the relevant item is first in 1 of 3 orders
    0.333333
    """
    ks, scalar = _resolve_ks(k)
    vals, valid = ndcg_per_list(scores, labels, mask, k=ks, gain=gain, empty=empty, ties=ties)
    out = _mean_valid(vals, valid, "ndcg")
    return out[0] if scalar else out


# --- MAP, MRR -------------------------------------------------------------------------------------


def _ap_rr_blocks(blocks, labels, mask, dt):
    order, first, last = blocks
    rel = ((labels > 0) & mask).gather(1, order).to(dt)
    n_ge = (last + 1).to(dt)  # items scored at least as high (pessimistic rank)
    rel_ge = rel.cumsum(1).gather(1, last)  # relevant items scored at least as high
    n_rel = rel.sum(1)
    ap = (rel * rel_ge / n_ge).sum(1) / n_rel.clamp_min(1)
    rr = (rel / n_ge).amax(1) if rel.shape[1] else n_rel
    return ap, rr, n_rel > 0


def average_precision_per_list(
    scores: Tensor, labels: Tensor, mask: Tensor, *, empty: str = "skip"
) -> tuple[Tensor, Tensor]:
    """Average precision of every list, binary relevance ``label > 0``, pessimistic ties.

    ``AP = (1/R) sum_{i relevant} |{j relevant: s_j >= s_i}| / |{j: s_j >= s_i}|``.

    Args:
        scores, labels, mask: ``[G, L]``. empty: module docstring.

    Returns:
        ``(values [G], valid [G])`` as in :func:`ndcg_per_list`.
    """
    _check_options(empty=empty)
    _check_lists(scores, labels, mask)
    ap, _, has_pos = _ap_rr_blocks(tie_blocks(scores, mask), labels, mask, _dtype(scores, labels))
    return _apply_empty(ap, has_pos, mask, empty)


def mean_average_precision(
    scores: Tensor, labels: Tensor, mask: Tensor, *, empty: str = "skip"
) -> Tensor:
    """MAP: mean of :func:`average_precision_per_list` over the valid lists.

    >>> s, y = torch.tensor([[3., 2., 1.]]), torch.tensor([[1., 0., 1.]])
    >>> m = torch.ones(1, 3, dtype=torch.bool)
    >>> round(float(mean_average_precision(s, y, m)), 6)   # (1/1 + 2/3) / 2
    0.833333

    Reference: Baeza-Yates & Ribeiro-Neto, Modern Information Retrieval.
    """
    return _mean_valid(*average_precision_per_list(scores, labels, mask, empty=empty), "map")


def reciprocal_rank_per_list(
    scores: Tensor, labels: Tensor, mask: Tensor, *, empty: str = "skip"
) -> tuple[Tensor, Tensor]:
    """Reciprocal rank of the best-scored relevant item, pessimistic ties.

    ``RR = 1 / |{j: s_j >= max_{i relevant} s_i}|`` (relevance ``label > 0``).

    Returns:
        ``(values [G], valid [G])`` as in :func:`ndcg_per_list`.
    """
    _check_options(empty=empty)
    _check_lists(scores, labels, mask)
    _, rr, has_pos = _ap_rr_blocks(tie_blocks(scores, mask), labels, mask, _dtype(scores, labels))
    return _apply_empty(rr, has_pos, mask, empty)


def mrr(scores: Tensor, labels: Tensor, mask: Tensor, *, empty: str = "skip") -> Tensor:
    """MRR: mean of :func:`reciprocal_rank_per_list` over the valid lists.

    >>> s, y = torch.tensor([[2., 2., 1.]]), torch.tensor([[0., 1., 0.]])
    >>> m = torch.ones(1, 3, dtype=torch.bool)
    >>> float(mrr(s, y, m))   # tied with the top item: pessimistic rank 2
    0.5

    Reference: Voorhees 1999, TREC-8 QA track.
    """
    return _mean_valid(*reciprocal_rank_per_list(scores, labels, mask, empty=empty), "mrr")


# --- AUC, GAUC -----------------------------------------------------------------------------------


def _auc_blocks(blocks, labels, mask):
    order, first, last = blocks
    rel = (labels > 0) & mask
    pos = rel.gather(1, order).double()
    neg = (mask & ~rel).gather(1, order).double()
    c = F.pad(neg.cumsum(1), (1, 0))  # c[:, j] = negatives at sorted positions < j
    c_last, c_first = c.gather(1, last + 1), c.gather(1, first)
    n_pos, n_neg = pos.sum(1), neg.sum(1)
    wins = (pos * ((n_neg[:, None] - c_last) + 0.5 * (c_last - c_first))).sum(1)
    return wins / (n_pos * n_neg).clamp_min(1), (n_pos > 0) & (n_neg > 0)


def auc_per_list(scores: Tensor, labels: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """ROC AUC inside every list: ``P(s_pos > s_neg) + P(s_pos = s_neg) / 2`` over its pairs.

    Returns:
        ``(values [G] float64, valid [G])``, valid where the list has both classes.
    """
    _check_lists(scores, labels, mask)
    return _auc_blocks(tie_blocks(scores, mask), labels, mask)


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


def auc(scores: Tensor, labels: Tensor, mask: Tensor | None = None) -> Tensor:
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
    _check_lists(s, y, torch.ones_like(s, dtype=torch.bool))
    bucket, n_buckets = score_buckets(s)
    rel = (y.reshape(-1) > 0).double()
    value, ok = auc_from_counts(torch.bincount(bucket, rel, minlength=n_buckets),
                                torch.bincount(bucket, 1 - rel, minlength=n_buckets))
    if not bool(ok):
        raise ValueError("AUC undefined: only one class")
    return value


def gauc(scores: Tensor, labels: Tensor, mask: Tensor) -> Tensor:
    """Group AUC: per-list AUC weighted by list impressions, over lists with both classes.

    ``GAUC = sum_g n_g AUC_g / sum_g n_g`` over lists g holding a positive and a negative; ``n_g``
    counts all of the list's real impressions.

    Returns:
        float64 scalar; ``ValueError`` when no list has both classes.

    Reference: Zhu et al. 2017, "Optimized Cost per Click in Taobao Display Advertising".
    """
    values, valid = auc_per_list(scores, labels, mask)
    w = mask.sum(1).double() * valid
    if float(w.sum()) == 0:
        raise ValueError("GAUC undefined: no list has both classes")
    return (values * w).sum() / w.sum()
