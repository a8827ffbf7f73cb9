"""Per-list kernels of the ranking metrics: the one implementation of NDCG, AP, RR and AUC per list.

The pure functions of :mod:`hybridrank.metrics.ranking` average these values over lists; the
per-request kernel of the metric engine (:func:`~hybridrank.metrics.request_sums.ranking_sums`)
sums them per request. Both call the same kernels, so a mean of the engine equals the pure
function on the same conventions. Everything is vectorised over lists (no Python loop over lists
or items) and runs on CPU or CUDA tensors.

Inputs follow the glossary of :mod:`hybridrank.lists`: ``labels [G, L]`` graded (>= 0), a bool
``mask [G, L]`` (True = a real impression), passed by keyword as in every metric and loss, and
``blocks = (order, first, last)``, the tie blocks of the scores from :func:`hybridrank._dcg.tie_blocks`
(one sort per list, shared by every kernel of a call). The conventions (``empty``, ``gain``,
``ties``, pessimistic ties of AP / RR) are those of :mod:`hybridrank.metrics.ranking`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from hybridrank._dcg import block_means, gains, ideal_dcg, position_discounts

__all__ = ["K", "EMPTY", "GAINS", "TIES", "Blocks", "check_options", "check_lists", "resolve_ks",
           "value_dtype", "ndcg_blocks", "apply_empty", "ap_rr_blocks", "auc_blocks"]

K = int | None
"""An NDCG cut-off: a positive int, or ``None`` for the whole list."""

EMPTY = ("skip", "zero", "one")
"""What a list without a positive label scores (``empty=``)."""

GAINS = ("exp", "linear")
"""NDCG gains (``gain=``): ``2^rel - 1`` or ``rel``."""

TIES = ("average",)
"""Tie handling of NDCG (``ties=``): the expectation over random orders of tied scores."""

Blocks = tuple[Tensor, Tensor, Tensor]
"""``(order, first, last)`` of :func:`hybridrank._dcg.tie_blocks`, each ``[G, L]`` int64."""


# --- checks of the conventions and the lists ----------------------------------------------------


def check_options(*, empty: str = "skip", gain: str = "exp", ties: str = "average") -> None:
    """Raise ``ValueError`` naming the option unless ``empty``, ``gain`` and ``ties`` are known.

    >>> check_options(empty="never")
    Traceback (most recent call last):
    ...
    ValueError: empty must be one of ('skip', 'zero', 'one'), got 'never'
    """
    for name, value, allowed in (("empty", empty, EMPTY), ("gain", gain, GAINS),
                                 ("ties", ties, TIES)):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def check_lists(scores: Tensor, labels: Tensor, *, mask: Tensor) -> None:
    """Raise ``ValueError`` unless ``scores``, ``labels``, ``mask`` share one ``[G, L]`` shape,
    ``mask`` is bool, and no real impression has a NaN score, a NaN label or a label below 0.

    Args:
        scores: ``[G, L]``. labels: ``[G, L]``. mask: ``[G, L]`` bool.
    """
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


def resolve_ks(k: K | Sequence[K]) -> tuple[tuple[K, ...], bool]:
    """``(ks, scalar)``: the cut-offs as a tuple, and whether ``k`` was one cut-off.

    >>> resolve_ks(10), resolve_ks((1, None))
    (((10,), True), ((1, None), False))
    """
    scalar = k is None or isinstance(k, int)
    ks = (k,) if scalar else tuple(k)
    if not ks or any(v is not None and (not isinstance(v, int) or v < 1) for v in ks):
        raise ValueError(f"k must be a positive int, None, or a sequence of them, got {k!r}")
    return ks, scalar


def value_dtype(*ts: Tensor) -> torch.dtype:
    """The float type the kernels compute in: float64 if any input is float64, else float32."""
    return torch.float64 if any(t.dtype == torch.float64 for t in ts) else torch.float32


# --- the kernels ----------------------------------------------------------------------------------


def ndcg_blocks(blocks: Blocks, labels: Tensor, *, mask: Tensor, ks: tuple[K, ...], gain: str,
                dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Tie-averaged NDCG@k of every list for every cut-off, before the ``empty`` rule.

    ``NDCG@k = DCG@k / IDCG@k``; an item of a tied block on ranks a..b contributes
    ``gain / (b - a + 1) * sum_{r=a}^{min(b, k)} 1 / log2(r + 1)``
    (:func:`~hybridrank.metrics.ranking.ndcg_per_list` states the conventions).

    Args:
        blocks: tie blocks of the scores. labels, mask: ``[G, L]``. ks: cut-offs
            (:func:`resolve_ks`). gain: ``"exp"`` or ``"linear"``. dtype: :func:`value_dtype`.

    Returns:
        ``(values [G, K], has_pos [G])``: 0 where the ideal DCG is 0 (never NaN), and whether the
        list has a positive gain (exactly where it has a label > 0).
    """
    order, first, last = blocks
    g = gains(labels.to(dtype), gain).masked_fill(~mask, 0)
    dk = position_discounts(mask.shape[1], ks, dtype=dtype, device=g.device)  # [K, L], 0 past k
    mean_disc = block_means(dk, first, last)  # [K, G, L]: each slot's tie-averaged discount
    dcg = (mean_disc * g.gather(1, order)).sum(-1).T
    idcg = ideal_dcg(g, mask, dk)
    has_pos = (g > 0).any(1)
    return dcg / torch.where(has_pos[:, None], idcg, 1), has_pos


def apply_empty(values: Tensor, has_pos: Tensor, *, mask: Tensor, empty: str) -> tuple[Tensor, Tensor]:
    """The ``empty`` rule: lists without a positive hold 1 under ``"one"`` and 0 otherwise.

    Args:
        values: ``[G]`` or ``[G, K]`` per-list values. has_pos: ``[G]``. mask: ``[G, L]`` bool.
        empty: ``"skip"``, ``"zero"`` or ``"one"``.

    Returns:
        ``(values, valid [G])``: valid lists have a real impression, and under ``"skip"`` a
        positive label too.
    """
    fill = 1.0 if empty == "one" else 0.0
    hp = has_pos.reshape(has_pos.shape + (1,) * (values.dim() - 1))
    values = torch.where(hp, values, torch.full_like(values, fill))
    nonempty = mask.any(1)
    return values, (nonempty & has_pos) if empty == "skip" else nonempty


def ap_rr_blocks(blocks: Blocks, labels: Tensor, *, mask: Tensor,
                 dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    """Average precision and reciprocal rank of every list, relevance ``label > 0``, pessimistic
    ties (an item's rank counts every item scored at least as high).

    ``AP = (1/R) sum_{i relevant} |{j relevant: s_j >= s_i}| / |{j: s_j >= s_i}|``,
    ``RR = 1 / |{j: s_j >= max_{i relevant} s_i}|``.

    Args:
        blocks: tie blocks of the scores. labels, mask: ``[G, L]``. dtype: :func:`value_dtype`.

    Returns:
        ``(ap [G], rr [G], has_pos [G])``, 0 for a list without a relevant item.
    """
    order, first, last = blocks
    rel = ((labels > 0) & mask).gather(1, order).to(dtype)
    n_ge = (last + 1).to(dtype)  # items scored at least as high (pessimistic rank)
    rel_ge = rel.cumsum(1).gather(1, last)  # relevant items scored at least as high
    n_rel = rel.sum(1)
    ap = (rel * rel_ge / n_ge).sum(1) / n_rel.clamp_min(1)
    rr = (rel / n_ge).amax(1) if rel.shape[1] else n_rel
    return ap, rr, n_rel > 0


def auc_blocks(blocks: Blocks, labels: Tensor, *, mask: Tensor) -> tuple[Tensor, Tensor]:
    """ROC AUC inside every list, binary ``label > 0``, ties counted 1/2.

    ``AUC = P(s_pos > s_neg) + P(s_pos = s_neg) / 2`` over the list's positive-negative pairs.

    Args:
        blocks: tie blocks of the scores. labels, mask: ``[G, L]``.

    Returns:
        ``(values [G] float64, defined [G])``: defined where the list has both classes (0 elsewhere).
    """
    order, first, last = blocks
    rel = (labels > 0) & mask
    pos = rel.gather(1, order).double()
    neg = (mask & ~rel).gather(1, order).double()
    c = F.pad(neg.cumsum(1), (1, 0))  # c[:, j] = negatives at sorted positions < j
    c_last, c_first = c.gather(1, last + 1), c.gather(1, first)
    n_pos, n_neg = pos.sum(1), neg.sum(1)
    wins = (pos * ((n_neg[:, None] - c_last) + 0.5 * (c_last - c_first))).sum(1)
    return wins / (n_pos * n_neg).clamp_min(1), (n_pos > 0) & (n_neg > 0)
