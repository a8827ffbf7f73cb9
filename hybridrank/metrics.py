"""Ranking metrics as pure functions over padded lists, and a streaming ``ListMetrics`` shell.

Inputs follow the glossary of :mod:`hybridrank.lists`: ``scores [G, L]`` (logits or any monotone
score), graded ``labels [G, L]`` (>= 0) and a bool ``mask [G, L]`` (True = a real impression).
Everything is vectorised over lists and runs on CPU or CUDA tensors.

Conventions (CONVENTIONS.md §2), each a named argument or stated here:

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

Calibration metrics live in :mod:`hybridrank.calibration_metrics` and are re-exported here.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import Metric

from hybridrank._dcg import block_means, gains, ideal_dcg, position_discounts, tie_blocks
from hybridrank.calibration_metrics import (
    EPS,
    PositionCalibration,
    ReliabilityTable,
    _bce_sum,
    _binary_entropy,
    _check_binning,
    _ece_from_sums,
    _table_from_sums,
    auc_from_hist,
    bin_index,
    ece,
    hist_empty,
    hist_merge,
    hist_of,
    hist_parts,
    hist_reduce,
    log_loss,
    normalized_entropy,
    pcoc,
    pcoc_by_position,
    quantile_sums_from_hist,
    reliability_table,
)

__all__ = [
    "ndcg",
    "ndcg_per_list",
    "mean_average_precision",
    "average_precision_per_list",
    "mrr",
    "reciprocal_rank_per_list",
    "auc",
    "auc_per_list",
    "gauc",
    "ListMetrics",
    "log_loss",
    "normalized_entropy",
    "ece",
    "pcoc",
    "pcoc_by_position",
    "reliability_table",
    "bin_index",
    "ReliabilityTable",
    "PositionCalibration",
    "EPS",
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


def auc(scores: Tensor, labels: Tensor, mask: Tensor | None = None) -> Tensor:
    """Global ROC AUC over all real impressions (binary ``label > 0``, ties counted 1/2).

    ``AUC = (1 / (P N)) sum_{i pos, j neg} [s_i > s_j] + [s_i = s_j] / 2``.

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
    value, valid = auc_per_list(s, y, torch.ones_like(s, dtype=torch.bool))
    if not bool(valid[0]):
        raise ValueError("AUC undefined: only one class")
    return value[0]


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


# --- streaming ---------------------------------------------------------------------------------


class ListMetrics(Metric):
    """Streaming ranking + calibration metrics over whole lists, with sum states only.

    Every state is a float64 sum with ``dist_reduce_fx="sum"`` except the fine logit histogram,
    whose exact merge is its own reduction, so DDP sync is exact and memory is flat in the data
    size. Each ``update`` must receive whole lists. ``ndcg@k``, ``map``, ``mrr``, ``gauc``,
    ``logloss``, ``ne``, ``pcoc``, uniform-bin ``ece`` and ``pcoc@pos{i}`` equal the pure functions
    up to float rounding. Global ``auc`` and quantile-bin ``ece`` come from an adaptive histogram of
    ``hist_bins`` equal-width logit bins (count, sum p, positives per bin) whose width is the
    smallest power of two at which every logit seen so far fits (bins re-merge exactly when later
    logits widen the range, so the bins always span the data, wherever the scale puts it; logits
    beyond ``±2^20`` are clamped). AUC counts pairs sharing a fine bin as ties, an error of at most
    ``0.5 sum_h pos_h neg_h / (P N)`` (:meth:`auc_bound`); ``compute`` warns when that bound exceeds
    ``auc_tolerance`` (e.g. a few extreme outlier logits stretch the range). Quantile ECE treats
    each fine bin as one tied block, exact unless a fine bin holds two distinct p, and within
    ``2 m / n`` otherwise (``m`` impressions in fine bins straddling a quantile boundary). On
    10^4-10^5 impressions the AUC bound is ~1e-4-1e-3 and observed errors ~1e-6.

    Args:
        ks: NDCG cut-offs (``None`` = whole list, key ``ndcg``).
        gain, empty, ties: conventions of the module docstring.
        bins, binning: ECE bins (:mod:`hybridrank.calibration_metrics`).
        positions: False, or the number P of display positions (1..P) that get ``pcoc@pos{i}``
            (True = 10); positions outside 1..P count only in the global metrics, and with
            False the ``positions`` given to ``update`` are ignored.
        hist_bins: number of fine logit bins.
        auc_tolerance: ``compute`` warns when the streaming AUC's error bound exceeds it.
        fields: ``{name: n_values}`` of fields to calibrate by (a categorical column: category,
            device; codes ``0..n_values-1``), each giving ``f_ece@{name}``
            (:func:`~hybridrank.calibration_metrics.field_ece`) and a per-value table
            (:meth:`field_table`). Sums of ``n_values`` floats each: keep it to fields of modest
            cardinality.

    ``update(logits [G, L], labels [G, L], mask [G, L], positions=None, fields=None)``:
    ``p = sigmoid(logits)``; ``fields`` maps every configured field to its ``[G, L]`` codes.

    ``compute()`` returns float64 scalars: ``ndcg@k`` per k, ``map``, ``mrr``, ``auc``, ``gauc``,
    ``logloss``, ``ne``, ``ece``, ``pcoc``, ``pcoc@pos{i}``, ``f_ece@position`` (over positions
    1..P), ``f_ece@{field}``, and the counts ``n_lists`` (lists with
    an impression), ``n_empty`` (of those, without a positive), ``n_skipped`` (left out of
    ndcg/map/mrr: ``n_empty`` under ``"skip"``, else 0), ``n_impressions``, ``n_positives``. A value
    that is undefined (AUC or NE with one class, GAUC without a two-class list, PCOC without a
    positive, means over zero lists) is absent from the dict rather than NaN.

    >>> m = ListMetrics(ks=(1,))
    >>> m.update(torch.tensor([[2.0, 0.0]]), torch.tensor([[1.0, 0.0]]), torch.ones(1, 2) > 0)
    >>> out = m.compute(); float(out["ndcg@1"]), float(out["auc"]), int(out["n_lists"])
    (1.0, 1.0, 1)
    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    def __init__(
        self, ks: Sequence[K] = (1, 3, 5, 10), gain: str = "exp", empty: str = "skip",
        ties: str = "average", bins: int = 15, binning: str = "quantile",
        positions: bool | int = False, hist_bins: int = 8192, auc_tolerance: float = 1e-3,
        fields: Mapping[str, int] | None = None,
        **kwargs,  # torchmetrics.Metric options (sync_on_compute, ...); it rejects unknown keys
    ) -> None:
        super().__init__(**kwargs)
        self.ks, _ = _resolve_ks(tuple(ks))
        _check_options(empty=empty, gain=gain, ties=ties)
        _check_binning(bins, binning)
        self.gain, self.empty, self.bins, self.binning = gain, empty, bins, binning
        self.n_positions = 10 if positions is True else int(positions)
        if not isinstance(hist_bins, int) or hist_bins < 2:
            raise ValueError(f"hist_bins must be an int >= 2, got {hist_bins!r}")
        self.hist_bins, self.auc_tolerance = hist_bins, float(auc_tolerance)

        def add(name: str, size: int = 0) -> None:
            shape = (size,) if size else ()
            self.add_state(name, torch.zeros(shape, dtype=torch.float64), dist_reduce_fx="sum")

        add("ndcg_sum", len(self.ks))
        for name in ("ap_sum", "rr_sum", "n_lists", "n_empty", "gauc_sum", "gauc_weight",
                     "logloss_sum", "n_impressions"):
            add(name)
        self.add_state("hist", hist_empty(hist_bins), dist_reduce_fx=hist_reduce)
        for name in ("ubin_count", "ubin_sum_p", "ubin_pos"):
            add(name, bins)
        for name in ("pos_count", "pos_sum_p", "pos_pos"):
            add(name, max(self.n_positions, 1))
        self.fields: dict[str, int] = {}
        for name, size in (fields or {}).items():
            if not isinstance(name, str) or not name or isinstance(size, bool) or not (
                    isinstance(size, int) and size >= 1):
                raise ValueError(f"fields must map field names to their number of values (an "
                                 f"int >= 1), got {name!r}: {size!r}")
            self.fields[name] = size
            for part in ("count", "sum_p", "pos"):
                add(f"field{len(self.fields) - 1}_{part}", size)

    def update(self, logits: Tensor, labels: Tensor, mask: Tensor,
               positions: Tensor | None = None, fields: Mapping[str, Tensor] | None = None) -> None:
        """Add whole lists: ``logits``, ``labels``, ``mask``, int ``positions``, all ``[G, L]``,
        and ``fields``, ``{name: [G, L] int codes}`` for every configured field."""
        logits = logits.detach()
        _check_lists(logits, labels, mask)
        blocks = tie_blocks(logits, mask)
        dt = _dtype(logits, labels)
        nd, has_pos = _ndcg_blocks(blocks, labels, mask, self.ks, self.gain, dt)
        ap, rr, _ = _ap_rr_blocks(blocks, labels, mask, dt)
        nd, valid = _apply_empty(nd, has_pos, mask, self.empty)
        ap, _ = _apply_empty(ap, has_pos, mask, self.empty)
        rr, _ = _apply_empty(rr, has_pos, mask, self.empty)
        v = valid.double()
        self.ndcg_sum += (nd.double() * v[:, None]).sum(0)
        self.ap_sum += (ap.double() * v).sum()
        self.rr_sum += (rr.double() * v).sum()
        nonempty = mask.any(1)
        self.n_lists += nonempty.sum()
        self.n_empty += (nonempty & ~has_pos).sum()
        g_auc, g_ok = _auc_blocks(blocks, labels, mask)
        w = mask.sum(1).double() * g_ok
        self.gauc_sum += (g_auc * w).sum()
        self.gauc_weight += w.sum()

        z = logits[mask].double()
        p = torch.sigmoid(z)
        y = (labels[mask] > 0).double()
        self.logloss_sum += _bce_sum(p, y)
        self.n_impressions += p.numel()
        self.hist = hist_merge(self.hist, hist_of(z, p, y, self.hist_bins))
        u = bin_index(p, self.bins, "uniform")
        self.ubin_count += torch.bincount(u, minlength=self.bins)
        self.ubin_sum_p += torch.bincount(u, p, minlength=self.bins)
        self.ubin_pos += torch.bincount(u, y, minlength=self.bins)
        if positions is not None and self.n_positions:
            if positions.shape != mask.shape:
                raise ValueError("positions must have the [G, L] shape of mask")
            pos = positions[mask].long() - 1
            keep = (pos >= 0) & (pos < self.n_positions)
            pos, pk, yk = pos[keep], p[keep], y[keep]
            self.pos_count += torch.bincount(pos, minlength=self.n_positions)
            self.pos_sum_p += torch.bincount(pos, pk, minlength=self.n_positions)
            self.pos_pos += torch.bincount(pos, yk, minlength=self.n_positions)
        if self.fields:
            self._update_fields(fields, mask, p, y)

    def _update_fields(self, fields: Mapping[str, Tensor] | None, mask: Tensor, p: Tensor,
                       y: Tensor) -> None:
        given = dict(fields or {})
        missing = [f for f in self.fields if f not in given]
        if missing:
            raise ValueError(f"ListMetrics was built with fields {list(self.fields)}: update needs "
                             f"their [G, L] codes, missing {missing}")
        for i, (name, size) in enumerate(self.fields.items()):
            codes = given[name]
            if codes.shape != mask.shape or codes.is_floating_point():
                raise ValueError(f"field {name!r}: codes must be an int tensor of shape "
                                 f"{tuple(mask.shape)}, got {codes.dtype} {tuple(codes.shape)}")
            v = codes[mask].long()
            if v.numel() and (int(v.min()) < 0 or int(v.max()) >= size):
                bad = v[(v < 0) | (v >= size)][0]
                raise ValueError(f"field {name!r}: code {int(bad)} outside 0..{size - 1} (the "
                                 f"field was configured with {size} values)")
            getattr(self, f"field{i}_count").add_(torch.bincount(v, minlength=size))
            getattr(self, f"field{i}_sum_p").add_(torch.bincount(v, p, minlength=size))
            getattr(self, f"field{i}_pos").add_(torch.bincount(v, y, minlength=size))

    def field_table(self, name: str) -> PositionCalibration:
        """Per-value calibration of a configured field (``"position"`` for the display positions):
        the values seen so far, their impressions, predicted clicks, clicks and PCOC (``+inf``
        for a value without clicks)."""
        if name == "position" and name not in self.fields:
            if not self.n_positions:
                raise ValueError("field_table('position') needs ListMetrics(positions=P)")
            value = torch.arange(1, self.n_positions + 1)
            count, sum_p, pos = self.pos_count, self.pos_sum_p, self.pos_pos
        elif name in self.fields:
            i = list(self.fields).index(name)
            value = torch.arange(self.fields[name])
            count, sum_p, pos = (getattr(self, f"field{i}_{part}") for part in ("count", "sum_p", "pos"))
        else:
            raise ValueError(f"unknown field {name!r}: configured {list(self.fields)}")
        seen = count > 0
        ratio = torch.where(pos > 0, sum_p / pos.clamp_min(1), torch.inf)
        return PositionCalibration(value[seen.cpu()], count[seen], sum_p[seen], pos[seen], ratio[seen])

    @property
    def hist_count(self) -> Tensor:
        """``[hist_bins]`` impressions per fine logit bin."""
        return hist_parts(self.hist)[2]

    @property
    def hist_sum_p(self) -> Tensor:
        """``[hist_bins]`` summed p per fine logit bin."""
        return hist_parts(self.hist)[3]

    @property
    def hist_pos(self) -> Tensor:
        """``[hist_bins]`` positives per fine logit bin."""
        return hist_parts(self.hist)[4]

    @property
    def hist_width(self) -> float:
        """Width of a fine logit bin (a power of two, set by the range of the logits seen)."""
        return 2.0 ** hist_parts(self.hist)[0]

    def auc_bound(self) -> Tensor:
        """Upper bound on ``|streaming auc - exact auc|``: half the share of positive-negative
        pairs that share a fine bin holding two distinct logits."""
        _, _, cnt, _, pos, lo, hi = hist_parts(self.hist)
        return auc_from_hist(pos, cnt - pos, hi > lo)[1]

    def _bin_sums(self) -> tuple[Tensor, Tensor, Tensor]:
        if self.binning == "uniform":
            return self.ubin_count, self.ubin_sum_p, self.ubin_pos
        return quantile_sums_from_hist(self.hist_count, self.hist_sum_p, self.hist_pos, self.bins)

    def reliability(self) -> ReliabilityTable:
        """The reliability table of everything seen so far (the configured binning)."""
        return _table_from_sums(*self._bin_sums())

    def compute(self) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        n_empty = self.n_empty
        n_skipped = n_empty if self.empty == "skip" else torch.zeros_like(n_empty)
        n_valid = self.n_lists - n_skipped
        if float(n_valid) > 0:
            for k, s in zip(self.ks, self.ndcg_sum / n_valid):
                out["ndcg" if k is None else f"ndcg@{k}"] = s
            out["map"] = self.ap_sum / n_valid
            out["mrr"] = self.rr_sum / n_valid
        n_pos, n = self.hist_pos.sum(), self.n_impressions
        if 0 < float(n_pos) < float(n):
            _, _, cnt, _, pos, lo, hi = hist_parts(self.hist)
            value, bound = auc_from_hist(pos, cnt - pos, hi > lo)
            out["auc"] = value
            if float(bound) > self.auc_tolerance:
                warnings.warn(
                    f"ListMetrics: the streaming AUC is only known to within ±{float(bound):.1e} "
                    f"(> auc_tolerance={self.auc_tolerance:g}): many impressions share a fine "
                    f"logit bin of width {self.hist_width:.3g} (logits tied, or a few far-out "
                    f"logits stretch the range over hist_bins={self.hist_bins}); use "
                    "hybridrank.metrics.auc on the logits for the exact value", stacklevel=2)
        if float(self.gauc_weight) > 0:
            out["gauc"] = self.gauc_sum / self.gauc_weight
        if float(n) > 0:
            out["logloss"] = self.logloss_sum / n
            if 0 < float(n_pos) < float(n):
                out["ne"] = out["logloss"] / _binary_entropy(n_pos / n)
            _, sum_p, sum_y = self._bin_sums()
            out["ece"] = _ece_from_sums(sum_p, sum_y, n)
        if float(n_pos) > 0:
            out["pcoc"] = self.hist_sum_p.sum() / n_pos
        for i in range(self.n_positions):
            if float(self.pos_pos[i]) > 0:
                out[f"pcoc@pos{i + 1}"] = self.pos_sum_p[i] / self.pos_pos[i]
        if self.n_positions and float(self.pos_count.sum()) > 0:
            out["f_ece@position"] = _ece_from_sums(self.pos_sum_p, self.pos_pos, self.pos_count.sum())
        for i, name in enumerate(self.fields):
            count = getattr(self, f"field{i}_count").sum()
            if float(count) > 0:
                out[f"f_ece@{name}"] = _ece_from_sums(getattr(self, f"field{i}_sum_p"),
                                                     getattr(self, f"field{i}_pos"), count)
        out.update(n_lists=self.n_lists, n_empty=n_empty, n_skipped=n_skipped,
                   n_impressions=n, n_positives=n_pos)
        return out
