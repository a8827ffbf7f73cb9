"""``ListMetrics``: the streaming (torchmetrics) shell over the ranking and calibration metrics.

States are float64 sums (``dist_reduce_fx="sum"``) plus one exactly mergeable logit histogram,
so DDP sync is exact and memory does not grow with the data.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

from hybridrank._dcg import tie_blocks
from hybridrank.metrics.calibration import (
    PositionCalibration,
    ReliabilityTable,
    _bce_sum,
    _binary_entropy,
    _check_binning,
    _ece_from_sums,
    _table_from_sums,
    auc_from_hist,
    bin_index,
    hist_empty,
    hist_merge,
    hist_of,
    hist_parts,
    hist_reduce,
    quantile_sums_from_hist,
)
from hybridrank.metrics.ranking import (
    K,
    _ap_rr_blocks,
    _apply_empty,
    _auc_blocks,
    _check_lists,
    _check_options,
    _dtype,
    _ndcg_blocks,
    _resolve_ks,
)

__all__ = ["ListMetrics"]

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
        bins, binning: ECE bins (:mod:`hybridrank.metrics.calibration`).
        positions: False, or the number P of display positions (1..P) that get ``pcoc@pos{i}``
            (True = 10); positions outside 1..P count only in the global metrics, and with
            False the ``positions`` given to ``update`` are ignored.
        hist_bins: number of fine logit bins.
        auc_tolerance: ``compute`` warns when the streaming AUC's error bound exceeds it.
        fields: ``{name: n_values}`` of fields to calibrate by (a categorical column: category,
            device; codes ``0..n_values-1``), each giving ``f_ece@{name}``
            (:func:`~hybridrank.metrics.calibration.field_ece`) and a per-value table
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
                    "hybridrank.metrics.ranking.auc on the logits for the exact value", stacklevel=2)
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
