"""``ListMetrics``: the streaming (torchmetrics) shell of the metric engine.

Every batch goes through the per-request kernels of :mod:`hybridrank.metrics.request_sums` with all
requests in one group: the states are the totals of the per-request columns (one packed float64
sum, ``dist_reduce_fx="sum"``) plus one exactly mergeable logit histogram
(:mod:`hybridrank.metrics.logit_histogram`), so DDP sync is exact and memory does not grow with the
data; ``compute`` applies the engine's statistics (:mod:`hybridrank.metrics.statistics`) to those
totals.

Arguments: ``update(logits, labels, *, mask, positions=None, fields=None)`` takes ``mask`` by
keyword, like the pure metric functions and the losses. torchmetrics fixes no positional order
beyond its own metrics' ``(preds, target)``: ``Metric.forward`` and ``update`` pass keyword
arguments through, and a ``MetricCollection`` routes them by the names of the ``update``
signature. So the one convention of the package costs nothing here, and a positional mask fails
with a ``TypeError`` instead of being read as something else.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

from hybridrank.metrics.calibration import (
    PositionCalibration,
    ReliabilityTable,
    bin_index,
    check_binning,
    field_table_from_sums,
    table_from_sums,
)
from hybridrank.metrics.list_kernels import K, check_options, resolve_ks
from hybridrank.metrics.logit_histogram import (
    hist_empty,
    hist_merge,
    hist_of,
    hist_parts,
    hist_reduce,
    quantile_sums_from_hist,
)
from hybridrank.metrics.request_sums import impression_sums, ranking_sums
from hybridrank.metrics.statistics import RANKING, metric_statistics

__all__ = ["ListMetrics"]


class ListMetrics(Metric):
    """Streaming ranking + calibration metrics over whole lists, with sum states only.

    The states are the totals of the per-request columns of
    :mod:`hybridrank.metrics.request_sums` (one packed float64 sum with ``dist_reduce_fx="sum"``)
    and a fine logit histogram, whose exact merge is its own reduction, so DDP sync is exact and
    memory is flat in the data size; ``compute`` applies the engine's statistics (the same formulas
    as the pure functions and :class:`~hybridrank.metrics.per_request.RequestStats`). Each
    ``update`` must receive whole lists. ``ndcg@k``, ``map``, ``mrr``, ``gauc``, ``logloss``,
    ``ne``, ``pcoc``, ``ctr``, uniform-bin ``ece``, ``pcoc@pos{i}`` and the F-ECEs equal the pure
    functions up to float rounding. This is the training-time (validation) path: the final figures
    of a run (``hybridrank-train``'s table and ``metrics.json``, ``hybridrank-eval``) come from
    :class:`~hybridrank.metrics.per_request.RequestStats` of the whole split, exact for every
    metric. Global ``auc`` and quantile-bin ``ece`` come from an adaptive histogram of
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

    ``update(logits [G, L], labels [G, L], *, mask [G, L], positions=None, fields=None)``:
    ``p = sigmoid(logits)``; ``fields`` maps every configured field to its ``[G, L]`` codes.

    ``compute()`` returns float64 scalars: ``ndcg@k`` per k, ``map``, ``mrr``, ``auc``, ``gauc``,
    ``logloss``, ``ne``, ``ece``, ``pcoc``, ``ctr``, ``pcoc@pos{i}``, ``f_ece@position`` (over
    positions 1..P), ``f_ece@{field}``, and the counts ``n_lists`` (lists with
    an impression), ``n_empty`` (of those, without a positive), ``n_skipped`` (left out of
    ndcg/map/mrr: ``n_empty`` under ``"skip"``, else 0), ``n_impressions``, ``n_positives``. A value
    that is undefined (AUC or NE with one class, GAUC without a two-class list, PCOC without a
    positive, means over zero lists) is absent from the dict rather than NaN.

    >>> m = ListMetrics(ks=(1,))
    >>> m.update(torch.tensor([[2.0, 0.0]]), torch.tensor([[1.0, 0.0]]), mask=torch.ones(1, 2) > 0)
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
        self.ks, _ = resolve_ks(tuple(ks))
        check_options(empty=empty, gain=gain, ties=ties)
        check_binning(bins, binning)
        self.gain, self.empty, self.ties, self.bins, self.binning = gain, empty, ties, bins, binning
        self.n_positions = 10 if positions is True else int(positions)
        if not isinstance(hist_bins, int) or hist_bins < 2:
            raise ValueError(f"hist_bins must be an int >= 2, got {hist_bins!r}")
        self.hist_bins, self.auc_tolerance = hist_bins, float(auc_tolerance)
        self.fields: dict[str, int] = {}
        for name, size in (fields or {}).items():
            if not isinstance(name, str) or not name or isinstance(size, bool) or not (
                    isinstance(size, int) and size >= 1):
                raise ValueError(f"fields must map field names to their number of values (an "
                                 f"int >= 1), got {name!r}: {size!r}")
            self.fields[name] = size
        self.statistics = metric_statistics(ks=self.ks, empty=empty, auc=True,
                                            n_positions=self.n_positions, fields=list(self.fields))
        # the layout of the packed sums: the kernel's columns on an empty batch
        z = torch.zeros(0, 0)
        none = torch.zeros(0, dtype=torch.float64)
        empty_sums = self._sums(z, z, mask=z > 0, position=torch.zeros(0, dtype=torch.long), p=none, y=none,
                                codes={})
        self._layout = {name: tuple(c.shape[1:]) for name, c in empty_sums.items()}
        size = sum(c.numel() for c in empty_sums.values())
        self.add_state("sums", torch.zeros(size, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("hist", hist_empty(hist_bins), dist_reduce_fx=hist_reduce)

    def _sums(self, logits: Tensor, labels: Tensor, *, mask: Tensor, position: Tensor | None,
              p: Tensor, y: Tensor, codes: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """The column totals of a batch: the engine's kernel, every list in group 0 (``p``, ``y``:
        the probabilities and binary labels of the real impressions, ``[n]``)."""
        group = torch.zeros(mask.shape[0], dtype=torch.long, device=mask.device)
        out = ranking_sums(logits, labels, mask=mask, ks=self.ks, gain=self.gain, empty=self.empty,
                           ties=self.ties, include=RANKING, group=group, n_groups=1)
        row = torch.zeros(y.numel(), dtype=torch.long, device=mask.device)
        if position is None:  # position 0 counts nowhere: the columns keep their layout
            position = row
        out.update(impression_sums(
            p, y, row, 1, bins=self.bins,
            bin_idx=bin_index(p, self.bins, "uniform") if self.binning == "uniform" else None,
            position=position, n_positions=self.n_positions,
            fields={n: (codes.get(n, row), size) for n, size in self.fields.items()}, dense=True))
        return out

    def update(self, logits: Tensor, labels: Tensor, *, mask: Tensor,
               positions: Tensor | None = None, fields: Mapping[str, Tensor] | None = None) -> None:
        """Add whole lists: ``logits``, ``labels``, ``mask``, int ``positions``, all ``[G, L]``,
        and ``fields``, ``{name: [G, L] int codes}`` for every configured field."""
        logits = logits.detach()  # the kernel checks the lists (ranking_sums)
        position = None
        if positions is not None and self.n_positions:
            if positions.shape != mask.shape:
                raise ValueError("positions must have the [G, L] shape of mask")
            position = positions[mask]
        codes = self._field_codes(fields, mask)
        z = logits[mask].double()
        p, y = torch.sigmoid(z), (labels[mask] > 0).double()
        sums = self._sums(logits, labels, mask=mask, position=position, p=p, y=y, codes=codes)
        self.sums += torch.cat([c.reshape(-1) for c in sums.values()])
        self.hist = hist_merge(self.hist, hist_of(z, p, y, self.hist_bins))

    def _field_codes(self, fields: Mapping[str, Tensor] | None, mask: Tensor) -> dict[str, Tensor]:
        if not self.fields:
            return {}
        given = dict(fields or {})
        missing = [f for f in self.fields if f not in given]
        if missing:
            raise ValueError(f"ListMetrics was built with fields {list(self.fields)}: update needs "
                             f"their [G, L] codes, missing {missing}")
        out = {}
        for name, size in self.fields.items():
            codes = given[name]
            if codes.shape != mask.shape or codes.is_floating_point():
                raise ValueError(f"field {name!r}: codes must be an int tensor of shape "
                                 f"{tuple(mask.shape)}, got {codes.dtype} {tuple(codes.shape)}")
            v = codes[mask].long()
            if v.numel() and (int(v.min()) < 0 or int(v.max()) >= size):
                bad = v[(v < 0) | (v >= size)][0]
                raise ValueError(f"field {name!r}: code {int(bad)} outside 0..{size - 1} (the "
                                 f"field was configured with {size} values)")
            out[name] = v
        return out

    def totals(self) -> dict[str, Tensor]:
        """The column totals seen so far, each with a leading replicate dimension of 1, plus the
        histogram's: ``auc:pos`` / ``auc:neg`` per fine logit bin and, for quantile bins,
        ``ece:n|p|y`` (:func:`~hybridrank.metrics.logit_histogram.quantile_sums_from_hist`)."""
        out, j = {}, 0
        for name, shape in self._layout.items():
            m = 1 if not shape else shape[0]
            out[name] = self.sums[j:j + m].reshape(1, *shape)
            j += m
        _, _, cnt, sum_p, pos, _, _ = hist_parts(self.hist)
        out["auc:pos"], out["auc:neg"] = pos[None], (cnt - pos)[None]
        if self.binning == "quantile":
            q = quantile_sums_from_hist(cnt, sum_p, pos, self.bins)
            out.update({"ece:n": q[0][None], "ece:p": q[1][None], "ece:y": q[2][None]})
        return out

    def field_table(self, name: str) -> PositionCalibration:
        """Per-value calibration of a configured field (``"position"`` for the display positions):
        the values seen so far, their impressions, predicted clicks, clicks and PCOC (``+inf``
        for a value without clicks)."""
        if name == "position" and name not in self.fields:
            if not self.n_positions:
                raise ValueError("field_table('position') needs ListMetrics(positions=P)")
            value = torch.arange(1, self.n_positions + 1)
        elif name in self.fields:
            value = torch.arange(self.fields[name])
        else:
            raise ValueError(f"unknown field {name!r}: configured {list(self.fields)}")
        t = self.totals()
        return field_table_from_sums(value, *(t[f"field:{name}:{part}"][0] for part in ("n", "p", "y")))

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
        pairs that share a fine bin holding two distinct logits (only those can be mis-ordered;
        a pair tied exactly is counted 1/2 by the exact AUC too)."""
        _, _, cnt, _, pos, lo, hi = hist_parts(self.hist)
        inside = pos * (cnt - pos) * (hi > lo)
        pairs = pos.sum() * (cnt - pos).sum()
        return 0.5 * inside.sum() / pairs.clamp_min(1)

    def reliability(self) -> ReliabilityTable:
        """The reliability table of everything seen so far (the configured binning)."""
        t = self.totals()
        return table_from_sums(t["ece:n"][0], t["ece:p"][0], t["ece:y"][0])

    def compute(self) -> dict[str, Tensor]:
        t = self.totals()
        out: dict[str, Tensor] = {}
        for name, stat in self.statistics.items():
            value, ok = stat.fn(t)
            if bool(ok[0]):
                out[name] = value[0]
        bound = self.auc_bound()
        if "auc" in out and float(bound) > self.auc_tolerance:
            warnings.warn(
                f"ListMetrics: the streaming AUC is only known to within ±{float(bound):.1e} "
                f"(> auc_tolerance={self.auc_tolerance:g}): many impressions share a fine "
                f"logit bin of width {self.hist_width:.3g} (logits tied, or a few far-out "
                f"logits stretch the range over hist_bins={self.hist_bins}); use "
                "hybridrank.metrics.ranking.auc on the logits for the exact value", stacklevel=2)
        return out
