"""The metric engine: per-request sufficient statistics, and every metric as a formula over their sums.

One kernel turns scored requests into **per-request sums** (torch float64, one row per request):

==========================  ============  ==========================================================
column                      shape         per request
==========================  ============  ==========================================================
``lists:n``                 ``[R]``       1 (a request has an impression)
``lists:empty``             ``[R]``       1 if it has no positive label
``lists:valid``             ``[R]``       1 if it enters the NDCG / MAP / MRR means (``empty``)
``ndcg@k:sum``, ``map:sum``  ``[R]``       the list's value times ``lists:valid``
``mrr:sum``
``gauc:num``, ``gauc:den``  ``[R]``       ``n AUC`` and ``n`` (impressions) if it has both classes
``cal:n``, ``cal:ll``       ``[R]``       impressions, summed clipped BCE, summed p, positives
``cal:sum_p``, ``cal:sum_y``
``ece:n|p|y``               ``[R, B]``    impressions, summed p, positives per calibration bin
``field:{f}:n|p|y``         ``[R, V]``    the same per value of a field (``position``: 1..P)
``auc:pos``, ``auc:neg``    ``[R, D]``    positives / negatives per distinct-score bucket (sparse)
==========================  ============  ==========================================================

Every metric is a :class:`Statistic`, a formula over the **totals** of these columns; the formulas
are written once, in :mod:`hybridrank.metrics.calibration` (log loss, NE, PCOC, the gap of ECE and
F-ECE) and :mod:`hybridrank.metrics.ranking` (AUC over score buckets), and means over lists are
ratios of sums. From the same columns:

- the **point estimate** is the formula on the plain column sums (:meth:`RequestStats.point`);
- a **bootstrap replicate** is the formula on ``counts @ columns``, requests re-weighted by how
  often a resample drew them (:meth:`RequestStats.values`, :mod:`hybridrank.metrics.uncertainty`);
  all counts 1 give the point estimate;
- **field tables** (PCOC per position / category) and the **reliability table** are the per-cell
  totals (:meth:`RequestStats.field_table`, :meth:`RequestStats.reliability`);
- :class:`~hybridrank.metrics.list_metrics.ListMetrics` runs the same kernel on every batch with
  all requests in one group: its states are the column totals (sums, exact under DDP) and its
  ``compute`` applies the same statistics.

Conventions (``ks``, ``gain``, ``empty``, ``ties``, ``bins``, ``binning``, ``positions``) are those
of :mod:`hybridrank.metrics.ranking` and :class:`~hybridrank.metrics.list_metrics.ListMetrics`, and
the point estimates equal the pure functions of :mod:`hybridrank.metrics` on the same conventions.

**Quantile-bin ECE and global AUC** need the whole sample: the bins are the quantile rule of
:func:`~hybridrank.metrics.calibration.bin_index` applied once to the full sample's p, and the AUC
buckets are the full sample's distinct scores. Both are part of the statistic's definition: each
request keeps its sums per bin (per bucket) and a replicate re-weights them. A replicate's ECE is
therefore the ECE of the resample **over the full sample's bins** (it does not draw new quantile
edges, as a histogram keeps its cut-offs), and its AUC is the exact AUC of the resample. The point
estimates equal :func:`~hybridrank.metrics.calibration.ece` and
:func:`~hybridrank.metrics.ranking.auc` exactly. ``ListMetrics`` never holds the whole sample: it
approximates the same quantile bins and the AUC from its logit histogram (with stated bounds), for
training-time validation only; the final figures of a run come from here.

All-padding rows of ``[G, L]`` inputs (and zero-length requests of flat inputs) are not requests
and are dropped (``R <= G``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from hybridrank._dcg import tie_blocks
from hybridrank.lists import pad_index
from hybridrank.metrics.calibration import (
    PositionCalibration,
    ReliabilityTable,
    _check_binning,
    _div,
    bce,
    bin_index,
    field_table_from_sums,
    gap_from_sums,
    logloss_from_sums,
    ne_from_sums,
    pcoc_from_sums,
    table_from_sums,
)
from hybridrank.metrics.ranking import (
    _ap_rr_blocks,
    _apply_empty,
    _auc_blocks,
    _check_lists,
    _check_options,
    _dtype,
    _ndcg_blocks,
    _resolve_ks,
    auc_from_counts,
    score_buckets,
)

__all__ = ["Statistic", "RequestStats", "ratio", "metric_statistics", "ranking_sums",
           "impression_sums", "flat_stats", "list_stats", "split_stats", "frame_stats",
           "ranking_stats", "calibration_stats", "field_stats", "ratio_stats", "request_offsets",
           "check_same_requests", "RANKING"]

Totals = Mapping[str, Tensor]
RANKING = ("ndcg", "map", "mrr", "gauc")
_TOTALS_BLOCK = 1 << 22  # replicate rows x sparse-column cells materialised at once
_RANK_CHUNK = 1 << 20  # padded [g, L] cells per chunk of the ranking kernel


# --- statistics: formulas over column totals -------------------------------------------------


@dataclass(frozen=True)
class Statistic:
    """A metric as a formula over column totals: ``fn(totals) -> (value [B], defined [B])``.

    ``totals`` maps column names to their ``[B]`` (or ``[B, m]``) weighted sums over requests, one
    row per replicate. ``undefined`` says why a value can be undefined (reported with it);
    ``needs`` names the columns ``fn`` reads (None: all), so a bootstrap totals only those.
    """

    fn: Callable[[Totals], tuple[Tensor, Tensor]]
    undefined: str = "undefined"
    needs: tuple[str, ...] | None = None


def ratio(num: str, den: str, *, scale: float = 1.0, undefined: str = "zero denominator") -> Statistic:
    """``scale * sum(num) / sum(den)``, defined where ``sum(den) > 0``.

    >>> s = ratio("clicks", "n")
    >>> s.fn({"clicks": torch.tensor([3.0]), "n": torch.tensor([4.0])})
    (tensor([0.7500]), tensor([True]))
    """

    def fn(t: Totals) -> tuple[Tensor, Tensor]:
        v, ok = _div(t[num], t[den])
        return v * scale, ok

    return Statistic(fn, undefined, (num, den))


def _total(col: str, minus: str | None = None) -> Statistic:
    """A count: ``sum(col)`` (minus ``sum(minus)``), always defined."""

    def fn(t: Totals) -> tuple[Tensor, Tensor]:
        v = t[col] - t[minus] if minus else t[col]
        return v, torch.ones_like(v, dtype=torch.bool)

    return Statistic(fn, "", (col,) if minus is None else (col, minus))


def _gap(prefix: str, undefined: str) -> Statistic:
    """ECE / F-ECE over the cells of ``prefix``: :func:`~hybridrank.metrics.calibration.gap_from_sums`."""
    cols = (f"{prefix}:p", f"{prefix}:y", f"{prefix}:n")
    return Statistic(lambda t: gap_from_sums(t[cols[0]], t[cols[1]], t[cols[2]]), undefined, cols)


def _cell_pcoc(prefix: str, j: int, undefined: str) -> Statistic:
    cols = (f"{prefix}:p", f"{prefix}:y")
    return Statistic(lambda t: pcoc_from_sums(t[cols[0]][..., j], t[cols[1]][..., j]), undefined, cols)


def metric_statistics(*, ks: int | Sequence[int | None] | None = (10,), empty: str = "skip",
                      include: Sequence[str] = RANKING, calibration: bool = True, ece: bool = True,
                      auc: bool = False, n_positions: int = 0, fields: Sequence[str] = (),
                      ) -> dict[str, Statistic]:
    """The statistics of the columns :func:`ranking_sums` / :func:`impression_sums` produce.

    Names and order: ``ndcg@k`` per k, ``map``, ``mrr``, ``auc``, ``gauc``, ``logloss``, ``ne``,
    ``ece``, ``pcoc``, ``ctr``, ``pcoc@pos{i}``, ``f_ece@position``, ``f_ece@{field}``, and the
    counts ``n_lists``, ``n_empty``, ``n_skipped``, ``n_impressions``, ``n_positives``.
    """
    kk, _ = _resolve_ks(ks)
    why = ("no valid request (every request lacks a positive label under empty='skip')"
           if empty == "skip" else "no request")
    out: dict[str, Statistic] = {}
    if "ndcg" in include:
        for k in kk:
            name = "ndcg" if k is None else f"ndcg@{k}"
            out[name] = ratio(f"{name}:sum", "lists:valid", undefined=why)
    for name in ("map", "mrr"):
        if name in include:
            out[name] = ratio(f"{name}:sum", "lists:valid", undefined=why)
    if auc:
        out["auc"] = Statistic(lambda t: auc_from_counts(t["auc:pos"], t["auc:neg"]),
                               "labels have a single class", ("auc:pos", "auc:neg"))
    if "gauc" in include:
        out["gauc"] = ratio("gauc:num", "gauc:den",
                            undefined="no request has both a positive and a negative")
    if calibration:
        out["logloss"] = Statistic(lambda t: logloss_from_sums(t["cal:ll"], t["cal:n"]),
                                   "no impression", ("cal:ll", "cal:n"))
        out["ne"] = Statistic(lambda t: ne_from_sums(t["cal:ll"], t["cal:n"], t["cal:sum_y"]),
                              "labels have a single class", ("cal:ll", "cal:n", "cal:sum_y"))
        if ece:
            out["ece"] = _gap("ece", "no impression")
        out["pcoc"] = Statistic(lambda t: pcoc_from_sums(t["cal:sum_p"], t["cal:sum_y"]),
                                "no positive label", ("cal:sum_p", "cal:sum_y"))
        out["ctr"] = ratio("cal:sum_y", "cal:n", undefined="no impression")
    for j in range(n_positions):
        out[f"pcoc@pos{j + 1}"] = _cell_pcoc("field:position", j, f"no positive label at position {j + 1}")
    if n_positions:
        out["f_ece@position"] = _gap("field:position", f"no impression at positions 1..{n_positions}")
    for name in fields:
        out[f"f_ece@{name}"] = _gap(f"field:{name}", "no impression")
    if include:
        out["n_lists"] = _total("lists:n")
        out["n_empty"] = _total("lists:empty")
        out["n_skipped"] = _total("lists:n", minus="lists:valid")
    if calibration:
        out["n_impressions"] = _total("cal:n")
        out["n_positives"] = _total("cal:sum_y")
    return out


# --- the kernel: per-request sums ------------------------------------------------------------


def _into(values: Tensor, group: Tensor | None, n_groups: int | None) -> Tensor:
    values = values.double()
    if group is None:
        return values
    if n_groups == 1:  # everything in one group (ListMetrics): a plain sum
        return values.sum().reshape(1)
    return torch.zeros(n_groups, dtype=torch.float64, device=values.device).index_add_(0, group, values)


def _by_row(row: Tensor, n_rows: int, w: Tensor | None = None) -> Tensor:
    """``[n_rows]`` sums of ``w`` (None: counts) per row."""
    if n_rows == 1:
        return (torch.tensor(float(row.numel()), dtype=torch.float64, device=row.device) if w is None
                else w.sum()).reshape(1)
    return torch.bincount(row, w, minlength=n_rows).double()


def ranking_sums(scores: Tensor, labels: Tensor, mask: Tensor, *, ks: Sequence[int | None] = (10,),
                 gain: str = "exp", empty: str = "skip", ties: str = "average",
                 include: Sequence[str] = RANKING, group: Tensor | None = None,
                 n_groups: int | None = None) -> dict[str, Tensor]:
    """The ranking columns (``lists:*``, ``ndcg@k:sum``, ``map:sum``, ``mrr:sum``, ``gauc:*``) of
    padded lists ``[G, L]``: one row per list, or summed into ``n_groups`` rows by ``group [G]``.

    The per-list values are the kernels of :mod:`hybridrank.metrics.ranking` (tie-averaged NDCG,
    pessimistic AP / RR, per-list AUC), so the means equal its pure functions.
    """
    ks, _ = _resolve_ks(tuple(ks) if not isinstance(ks, int) and ks is not None else ks)
    _check_options(empty=empty, gain=gain, ties=ties)
    _check_lists(scores, labels, mask)
    blocks = tie_blocks(scores, mask)
    dt = _dtype(scores, labels)
    nonempty = mask.any(1)
    if "ndcg" in include:  # gains > 0 exactly where labels > 0: its has-positive flags serve all
        nd, has_pos = _ndcg_blocks(blocks, labels, mask, ks, gain, dt)
    else:
        has_pos = ((labels > 0) & mask).any(1)
    valid = (nonempty & has_pos) if empty == "skip" else nonempty
    v = valid.double()
    cols = {"lists:n": nonempty.double(), "lists:empty": (nonempty & ~has_pos).double(),
            "lists:valid": v}
    if "ndcg" in include:
        nd, _ = _apply_empty(nd, has_pos, mask, empty)
        for j, k in enumerate(ks):
            cols[("ndcg" if k is None else f"ndcg@{k}") + ":sum"] = nd[:, j].double() * v
    if "map" in include or "mrr" in include:
        ap, rr, _ = _ap_rr_blocks(blocks, labels, mask, dt)
        if "map" in include:
            cols["map:sum"] = _apply_empty(ap, has_pos, mask, empty)[0].double() * v
        if "mrr" in include:
            cols["mrr:sum"] = _apply_empty(rr, has_pos, mask, empty)[0].double() * v
    if "gauc" in include:
        au, ok = _auc_blocks(blocks, labels, mask)
        w = mask.sum(1).double() * ok
        cols["gauc:num"], cols["gauc:den"] = au * w, w
    return {name: _into(c, group, n_groups) for name, c in cols.items()}


def _cells(prefix: str, row: Tensor, col: Tensor, n_rows: int, width: int, dense: bool | None,
           **weights: Tensor | None) -> dict[str, Tensor]:
    """Sums per (row, cell) of each weight (None: 1 per impression), ``[n_rows, width]``: dense,
    or a coalesced sparse COO tensor when ``n_rows * width`` is large (``dense=None``)."""
    if dense is None:
        dense = n_rows * width <= max(1 << 16, 4 * row.numel())
    out = {}
    if dense:
        flat = row * width + col
        for name, w in weights.items():
            out[f"{prefix}:{name}"] = torch.bincount(
                flat, None if w is None else w, minlength=n_rows * width).double().view(n_rows, width)
        return out
    key, inv = torch.unique(row * width + col, return_inverse=True)  # sorted: coalesced order
    index = torch.stack([torch.div(key, width, rounding_mode="floor"), key % width])
    for name, w in weights.items():
        vals = torch.zeros(key.numel(), dtype=torch.float64, device=row.device).index_add_(
            0, inv, torch.ones(row.numel(), dtype=torch.float64, device=row.device) if w is None else w)
        out[f"{prefix}:{name}"] = torch.sparse_coo_tensor(index, vals, (n_rows, width),
                                                          is_coalesced=True, check_invariants=False)
    return out


def impression_sums(p: Tensor, y: Tensor, row: Tensor, n_rows: int, *, bins: int = 15,
                    bin_idx: Tensor | None = None, position: Tensor | None = None,
                    n_positions: int = 0, fields: Mapping[str, tuple[Tensor, int]] | None = None,
                    auc_bucket: tuple[Tensor, int] | None = None, calibration: bool = True,
                    dense: bool | None = None) -> dict[str, Tensor]:
    """The per-impression columns summed by request ``row``: ``cal:*``, ``ece:*`` (with
    ``bin_idx``), ``field:position:*`` (positions 1..``n_positions``), ``field:{f}:*`` and
    ``auc:*``.

    Args:
        p: ``[n]`` float64 probabilities. y: ``[n]`` float64 binary labels. row: ``[n]`` int64
            request (0..n_rows-1) of each impression.
        bin_idx: ``[n]`` calibration bin of each impression (0..bins-1), or None: no ECE columns.
        position: ``[n]`` 1-based display positions; only 1..n_positions count.
        fields: ``{name: (codes [n] in 0..width-1, width)}``.
        auc_bucket: ``(bucket [n], n_buckets)`` of :func:`~hybridrank.metrics.ranking.score_buckets`.
        dense: cell columns dense (True), sparse (False) or by size (None); calibration bins and
            positions are always dense.
    """
    cols: dict[str, Tensor] = {}
    if calibration:
        cols = {"cal:n": _by_row(row, n_rows), "cal:ll": _by_row(row, n_rows, bce(p, y)),
                "cal:sum_p": _by_row(row, n_rows, p), "cal:sum_y": _by_row(row, n_rows, y)}
    if bin_idx is not None:
        cols.update(_cells("ece", row, bin_idx, n_rows, bins, True, n=None, p=p, y=y))
    if n_positions and position is not None:
        code = position.long() - 1
        keep = (code >= 0) & (code < n_positions)
        cols.update(_cells("field:position", row[keep], code[keep], n_rows, n_positions, True,
                           n=None, p=p[keep], y=y[keep]))
    for name, (codes, width) in (fields or {}).items():
        cols.update(_cells(f"field:{name}", row, codes.long(), n_rows, width, dense, n=None, p=p, y=y))
    if auc_bucket is not None:
        bucket, width = auc_bucket
        cols.update(_cells("auc", row, bucket, n_rows, width, dense, pos=y, neg=1 - y))
    return cols


# --- per-request statistics ------------------------------------------------------------------


def _f64(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        x = x.double() if x.is_floating_point() or x.dtype == torch.bool else x
    return np.asarray(x, dtype=np.float64)


def _column(name: str, col, r: int) -> Tensor:
    col = col if isinstance(col, torch.Tensor) else torch.from_numpy(_f64(col))
    col = col.detach()
    if col.is_sparse:
        col = col.coalesce().double()
        vals = col.values()
    else:
        col = col.double().contiguous()
        vals = col
    if col.shape[:1] != (r,) or col.dim() > 2:
        raise ValueError(f"column {name!r} has shape {tuple(col.shape)}, expected [{r}] or [{r}, m]")
    if not bool(torch.isfinite(vals).all()):
        raise ValueError(f"column {name!r} holds NaN or infinite values")
    return col


@dataclass(frozen=True)
class RequestStats:
    """Per-request sufficient statistics of one score set, and the metrics built on them.

    Attributes:
        columns: name -> ``[R]`` or ``[R, m]`` float64 per-request sums (torch; cell columns with
            many cells are sparse COO). numpy arrays are accepted and converted.
        metrics: name -> :class:`Statistic` over the column totals.
        sizes: ``[R]`` impressions per request (checked by the paired test).
        positives: ``[R]`` positive labels per request, or None (unlabelled statistics).
        request_key: ``[R]`` request ids, or None.
        values: field name -> ``[V]`` the value of each cell of its ``field:{name}:*`` columns.
        conventions: the metric conventions the columns were computed with.
    """

    columns: Mapping[str, Tensor]
    metrics: Mapping[str, Statistic]
    sizes: np.ndarray
    positives: np.ndarray | None = None
    request_key: np.ndarray | None = None
    values: Mapping[str, Tensor] = field(default_factory=dict)
    conventions: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        sizes = _f64(self.sizes)
        if sizes.ndim != 1:
            raise ValueError(f"sizes must be [R], got shape {sizes.shape}")
        object.__setattr__(self, "sizes", sizes)
        r = sizes.shape[0]
        object.__setattr__(self, "columns", {n: _column(n, c, r) for n, c in self.columns.items()})
        if self.positives is not None:
            object.__setattr__(self, "positives", _f64(self.positives))
        for name, arr in (("positives", self.positives), ("request_key", self.request_key)):
            if arr is not None and len(arr) != r:
                raise ValueError(f"{name} has length {len(arr)}, expected {r} requests")

    @property
    def n_requests(self) -> int:
        return int(self.sizes.shape[0])

    @property
    def n_positives(self) -> int | None:
        return None if self.positives is None else int(self.positives.sum())

    def totals(self, weights=None, names: Sequence[str] | None = None) -> dict[str, Tensor]:
        """Column totals ``weights [B, R] @ column`` (default: plain sums, one row ``[1]``).

        ``names`` limits the columns totalled (default all).
        """
        r = self.n_requests
        w = (torch.ones(1, r, dtype=torch.float64) if weights is None
             else torch.as_tensor(weights).to(torch.float64))
        if w.dim() != 2 or w.shape[1] != r:
            raise ValueError(f"weights must be [B, {r}], got {tuple(w.shape)}")
        names = list(self.columns) if names is None else list(names)
        dense = [n for n in names if not self.columns[n].is_sparse]
        out: dict[str, Tensor] = {}
        if dense:
            x = torch.cat([self.columns[n].reshape(r, -1) for n in dense], 1)
            t = w @ x
            j = 0
            for n in dense:
                c = self.columns[n]
                m = 1 if c.dim() == 1 else c.shape[1]
                out[n] = t[:, j] if c.dim() == 1 else t[:, j:j + m]
                j += m
        for n in names:
            c = self.columns[n]
            if c.is_sparse:  # sum_r w[b, r] x[r, j] over the stored cells
                row, col = c.indices()
                out[n] = torch.zeros(w.shape[0], c.shape[1], dtype=torch.float64).index_add_(
                    1, col, w[:, row] * c.values())
        return {n: out[n] for n in names}

    def values_of(self, weights=None, names: Sequence[str] | None = None
                  ) -> dict[str, tuple[Tensor, Tensor]]:
        """Each named metric (default all) on the totals of ``weights [B, R]`` (default: the full
        sample, one row): name -> ``(value [B], defined [B])``. A bootstrap replicate is a row of
        resample counts; all counts 1 give the point estimate."""
        names = list(self.metrics) if names is None else list(names)
        need: list[str] = []
        for n in names:
            cols = self.metrics[n].needs
            need.extend(self.columns if cols is None else cols)
        need = list(dict.fromkeys(need))
        w = (torch.ones(1, self.n_requests, dtype=torch.float64) if weights is None
             else torch.as_tensor(weights).to(torch.float64))
        cells = max([self.columns[n].shape[1] + self.columns[n].values().numel()
                     for n in need if self.columns[n].is_sparse] or [1])
        step = max(1, _TOTALS_BLOCK // cells)  # replicates per block: [step, cells] at once
        parts = []
        for wb in w.split(step):
            t = self.totals(wb, need)
            parts.append({n: self.metrics[n].fn(t) for n in names})
        return {n: (torch.cat([p[n][0] for p in parts]), torch.cat([p[n][1] for p in parts]))
                for n in names}

    def point(self) -> dict[str, float | None]:
        """Each metric on the full sample; None where undefined (computed once, then cached)."""
        if "_point" not in self.__dict__:
            object.__setattr__(self, "_point", {n: float(v[0]) if bool(ok[0]) else None
                                                for n, (v, ok) in self.values_of().items()})
        return dict(self.__dict__["_point"])

    def field_table(self, name: str) -> PositionCalibration:
        """Per-value calibration of a field (``"position"``: the display positions 1..P): the
        values seen, their impressions, predicted clicks, clicks and PCOC (``+inf`` without clicks)."""
        if f"field:{name}:n" not in self.columns:
            have = [n for n in self.values]
            raise ValueError(f"no field {name!r} in these statistics (fields: {have})")
        t = self.totals(None, [f"field:{name}:{part}" for part in ("n", "p", "y")])
        return field_table_from_sums(self.values[name], *(v[0] for v in t.values()))

    def reliability(self) -> ReliabilityTable:
        """The reliability table of the calibration bins (``ece:*`` columns)."""
        if "ece:n" not in self.columns:
            raise ValueError("these statistics hold no calibration bins")
        t = self.totals(None, ["ece:n", "ece:p", "ece:y"])
        return table_from_sums(t["ece:n"][0], t["ece:p"][0], t["ece:y"][0])

    def merge(self, other: RequestStats) -> RequestStats:
        """The union of two statistics of the same requests (e.g. ranking + calibration)."""
        check_same_requests(self, other)
        clash = set(self.metrics) & set(other.metrics)
        if clash:
            raise ValueError(f"both statistics define the metrics {sorted(clash)}")
        cols = dict(self.columns)
        for n, c in other.columns.items():
            if n in cols and not _same_column(cols[n], c):
                raise ValueError(f"column {n!r} differs between the two statistics")
            cols[n] = c
        pos = self.positives if self.positives is not None else other.positives
        key = self.request_key if self.request_key is not None else other.request_key
        return RequestStats(cols, {**self.metrics, **other.metrics}, self.sizes, pos, key,
                            {**self.values, **other.values}, {**self.conventions, **other.conventions})


def _same_column(a: Tensor, b: Tensor) -> bool:
    if a.is_sparse != b.is_sparse or a.shape != b.shape:
        return False
    if a.is_sparse:
        return torch.equal(a.indices(), b.indices()) and torch.equal(a.values(), b.values())
    return torch.equal(a, b)


# --- builders ----------------------------------------------------------------------------------


def _check_flat(labels: Tensor, p: Tensor | None) -> None:
    if labels.is_floating_point() and bool(torch.isnan(labels).any()):
        raise ValueError("labels contains NaN at a real impression")
    if bool((labels < 0).any()):
        raise ValueError("labels must be >= 0")
    if p is not None:
        if bool(torch.isnan(p).any()):
            raise ValueError("p contains NaN at a real impression")
        if bool(((p < 0) | (p > 1)).any()):
            raise ValueError("p must lie in [0, 1] at real impressions")


def _positions(positions: bool | int) -> int:
    if positions is True:
        return 10
    if positions is False or positions is None:
        return 0
    if not isinstance(positions, int) or positions < 0:
        raise ValueError(f"positions must be False, True or a number of positions, got {positions!r}")
    return positions


def _rank_chunks(scores: Tensor, labels: Tensor, lengths: Tensor) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
    """Padded ``[g, L]`` chunks of whole requests, at most ~``_RANK_CHUNK`` cells each."""
    r = lengths.numel()
    if r == 0:
        return
    step = max(1, _RANK_CHUNK // max(1, int(lengths.max())))
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    for a in range(0, r, step):
        b = min(r, a + step)
        index, mask = pad_index(lengths[a:b])
        lo = int(offsets[a])
        index = index + lo
        yield scores[index].masked_fill(~mask, 0), labels[index].masked_fill(~mask, 0), mask


def flat_stats(scores: Tensor, labels: Tensor, lengths: Tensor, *, p: Tensor | None = None,
               position: Tensor | None = None, fields: Mapping[str, Tensor] | None = None,
               request_key=None, ks: int | Sequence[int | None] | None = (1, 3, 5, 10),
               gain: str = "exp", empty: str = "skip", ties: str = "average", bins: int = 15,
               binning: str = "quantile", positions: bool | int = False,
               include: Sequence[str] = RANKING, calibration: bool = True, auc: bool = True,
               hist_bins: int | None = None, auc_tolerance: float | None = None) -> RequestStats:
    """The per-request statistics of flat scores of requests stored one after another.

    Args:
        scores: ``[N]`` ranking scores (logits). labels: ``[N]`` graded labels >= 0 (clicks:
            ``label > 0``). lengths: ``[R]`` impressions per request, in storage order.
        p: ``[N]`` probabilities for the calibration metrics (default ``σ(scores)``).
        position: ``[N]`` 1-based display positions (``pcoc@pos{i}``, ``f_ece@position`` over
            positions 1..``positions``). fields: ``{name: [N] int codes}`` (``f_ece@{name}``).
        request_key: ``[R]`` request ids.
        ks, gain, empty, ties, bins, binning, positions: the metric conventions
            (:class:`~hybridrank.metrics.list_metrics.ListMetrics`; the keyword arguments of a
            metrics config; ``hist_bins`` and ``auc_tolerance`` concern streaming only and are
            ignored).
        include: which ranking metrics (a subset of ``ndcg``, ``map``, ``mrr``, ``gauc``; empty:
            no ranking columns). calibration: log loss, NE, ECE, PCOC, CTR. auc: global AUC.

    Returns:
        :class:`RequestStats` over the requests with at least one impression.

    >>> st = flat_stats(torch.tensor([2., 1., 0.]), torch.tensor([0., 1., 1.]),
    ...                 torch.tensor([2, 1]), ks=(None,))
    >>> round(st.point()["ndcg"], 6), st.point()["auc"]   # 2nd request: one item, NDCG 1; AUC: both clicks below
    (0.815465, 0.0)
    """
    del hist_bins, auc_tolerance  # streaming-only options of a metrics config
    kk, _ = _resolve_ks(tuple(ks) if ks is not None and not isinstance(ks, int) else ks)
    _check_options(empty=empty, gain=gain, ties=ties)
    _check_binning(bins, binning)
    unknown = sorted(set(include) - set(RANKING))
    if unknown:
        raise ValueError(f"unknown ranking metrics {unknown}; choose from {RANKING}")
    n_positions = _positions(positions)
    scores, labels = torch.as_tensor(scores).detach(), torch.as_tensor(labels).detach()
    lengths = torch.as_tensor(lengths).detach().long().reshape(-1).cpu()
    n = scores.shape[0] if scores.dim() else -1
    if scores.dim() != 1 or labels.shape != scores.shape:
        raise ValueError(f"scores and labels must be [N] of one shape, got {tuple(scores.shape)} "
                         f"and {tuple(labels.shape)}")
    if bool((lengths < 0).any()) or int(lengths.sum()) != n:
        raise ValueError(f"lengths must be >= 0 and sum to the {n} impressions, got sum "
                         f"{int(lengths.sum())}")
    if request_key is not None:
        request_key = np.asarray(request_key)
        if request_key.shape[0] != lengths.shape[0]:
            raise ValueError(f"request_key has {request_key.shape[0]} entries for "
                             f"{lengths.shape[0]} requests")
        request_key = request_key[(lengths > 0).numpy()]
    lengths = lengths[lengths > 0]  # a request without an impression is not a request
    r = lengths.numel()
    scores, labels = scores.cpu(), labels.cpu()
    if p is not None:
        p = torch.as_tensor(p).detach().cpu().double().reshape(-1)
        if p.shape != scores.shape:
            raise ValueError(f"p has shape {tuple(p.shape)}, expected [{n}]")
    needs_p = calibration or bool(fields) or (n_positions and position is not None)
    _check_flat(labels, p if needs_p else None)
    if scores.is_floating_point() and bool(torch.isnan(scores).any()):
        raise ValueError("scores contains NaN at a real impression")
    if needs_p and p is None:
        p = torch.sigmoid(scores.double())
    row = torch.repeat_interleave(torch.arange(r), lengths)
    y = (labels > 0).double()
    # the final figures are computed in float64 (order and ties of float32 scores are kept)
    scores, labels = scores.double(), labels.double()

    cols: dict[str, Tensor] = {}
    if include:
        parts = [ranking_sums(s, lab, m, ks=kk, gain=gain, empty=empty, ties=ties, include=include)
                 for s, lab, m in _rank_chunks(scores, labels, lengths)]
        if not parts:  # no request: the (empty) columns of an empty chunk
            parts = [ranking_sums(torch.zeros(0, 0), torch.zeros(0, 0),
                                  torch.zeros(0, 0, dtype=torch.bool), ks=kk, include=include)]
        cols.update({name: torch.cat([q[name] for q in parts]) for name in parts[0]})
    cell_fields: dict[str, tuple[Tensor, int]] = {}
    values: dict[str, Tensor] = {}
    for name, codes in (fields or {}).items():
        codes = torch.as_tensor(codes).detach().cpu().reshape(-1)
        if codes.shape != scores.shape or codes.is_floating_point() or codes.dtype == torch.bool:
            raise ValueError(f"field {name!r}: codes must be an int tensor of shape [{n}], got "
                             f"{codes.dtype} {tuple(codes.shape)}")
        uniq, inv = torch.unique(codes, return_inverse=True)
        values[name] = uniq
        cell_fields[name] = (inv.reshape(-1), int(uniq.numel()))
    use_pos = bool(n_positions) and position is not None
    if use_pos:
        position = torch.as_tensor(position).detach().cpu().reshape(-1)
        if position.shape != scores.shape:
            raise ValueError(f"position has shape {tuple(position.shape)}, expected [{n}]")
        values["position"] = torch.arange(1, n_positions + 1)
    cols.update(impression_sums(
        p if p is not None else y, y, row, r, bins=bins,
        bin_idx=bin_index(p, bins, binning) if calibration else None,
        position=position if use_pos else None, n_positions=n_positions if use_pos else 0,
        fields=cell_fields, auc_bucket=score_buckets(scores) if auc else None,
        calibration=calibration))
    mets = metric_statistics(ks=kk, empty=empty, include=include, calibration=calibration,
                             auc=auc, n_positions=n_positions if use_pos else 0, fields=list(cell_fields))
    conv = dict(ks=list(kk), gain=gain, empty=empty, ties=ties, bins=bins, binning=binning,
                positions=n_positions)
    return RequestStats(cols, mets, lengths.double().numpy(),
                        torch.bincount(row, y, minlength=r).numpy(), request_key, values, conv)


def list_stats(scores: Tensor, labels: Tensor, mask: Tensor, *, p: Tensor | None = None,
               position: Tensor | None = None, fields: Mapping[str, Tensor] | None = None,
               request_key=None, **options) -> RequestStats:
    """:func:`flat_stats` of padded lists: ``scores``, ``labels``, ``mask`` (and ``p``,
    ``position``, field codes) all ``[G, L]``; all-padding rows are not requests.

    >>> s = torch.tensor([[2., 1.], [1., 1.]]); y = torch.tensor([[0., 1.], [0., 0.]])
    >>> st = list_stats(s, y, torch.ones(2, 2, dtype=torch.bool), ks=None)
    >>> round(st.point()["ndcg"], 6), st.n_requests, st.point()["gauc"]   # 2nd list: skipped
    (0.63093, 2, 0.0)
    """
    for name, t in (("scores", scores), ("labels", labels), ("mask", mask)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch tensor, got {type(t).__name__}")
    if scores.dim() != 2 or scores.shape != labels.shape or scores.shape != mask.shape:
        raise ValueError("scores, labels and mask must share one [G, L] shape, got "
                         f"{tuple(scores.shape)}, {tuple(labels.shape)}, {tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor, got {mask.dtype}")

    def flat(t, name):
        if t is None:
            return None
        t = torch.as_tensor(t)
        if t.shape != mask.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(mask.shape)}")
        return t[mask]

    return flat_stats(scores[mask], labels[mask], mask.sum(1), p=flat(p, "p"),
                      position=flat(position, "position"),
                      fields={n: flat(c, f"field {n!r}") for n, c in (fields or {}).items()},
                      request_key=request_key, **options)


def ranking_stats(scores, labels, mask, *, ks: int | Sequence[int | None] | None = 10,
                  gain: str = "exp", empty: str = "skip", ties: str = "average",
                  request_key=None, include: Sequence[str] = RANKING) -> RequestStats:
    """Per-request ranking statistics only: ``ndcg@k`` per k, ``map``, ``mrr``, ``gauc`` (and the
    list counts) of padded ``[G, L]`` scores (any monotone score, not only probabilities)."""
    return list_stats(scores, labels, mask, request_key=request_key, ks=ks, gain=gain, empty=empty,
                      ties=ties, include=include, calibration=False, auc=False)


def calibration_stats(p, labels, mask, *, bins: int = 15, binning: str = "quantile",
                      request_key=None) -> RequestStats:
    """Per-request calibration statistics only: ``logloss``, ``ne``, ``ece``, ``pcoc``, ``ctr``
    of padded ``[G, L]`` probabilities.

    >>> p = torch.tensor([[0.2, 0.4], [0.6, 0.0]]); y = torch.tensor([[0., 1.], [0., 0.]])
    >>> m = torch.tensor([[True, True], [True, False]])
    >>> round(calibration_stats(p, y, m).point()["pcoc"], 6)
    1.2
    """
    return list_stats(p, labels, mask, p=p, request_key=request_key, bins=bins, binning=binning,
                      include=(), auc=False)


def field_stats(p, labels, mask, fields: Mapping[str, Any], *, request_key=None) -> RequestStats:
    """Per-request statistics of the field-level ECE ``f_ece@{field}`` of each field only.

    >>> p = torch.tensor([[0.2, 0.2], [0.3, 0.3]]); y = torch.tensor([[1., 0.], [0., 0.]])
    >>> m = torch.ones(2, 2, dtype=torch.bool)
    >>> round(field_stats(p, y, m, {"c": torch.tensor([[0, 0], [1, 1]])}).point()["f_ece@c"], 6)
    0.3
    """
    return list_stats(p, labels, mask, p=p, fields=fields, request_key=request_key, include=(),
                      calibration=False, auc=False)


def split_stats(data, logits: Tensor, *, p: Tensor | None = None,
                fields: Mapping[str, Tensor] | None = None, **conventions) -> RequestStats:
    """:func:`flat_stats` of flat ``[N]`` logits on a split (``ListData``): its requests in
    storage order, its labels and display positions. ``conventions`` as :func:`flat_stats`
    (a model's ``metric_conventions``); ``fields``: ``{name: [N] int codes}``."""
    return flat_stats(logits, data.label, data.lengths, p=p, position=data.position, fields=fields,
                      **conventions)


def frame_stats(frame, *, score: str = "pctr", label: str = "label", request: str = "request_id",
                ks: Sequence[int | None] = (10,), empty: str = "skip", bins: int = 15,
                binning: str = "quantile") -> RequestStats:
    """Ranking + calibration statistics of an export frame (rows sorted by request).

    ``score`` is the probability for calibration and the ranking score.
    """
    for c in (score, label, request):
        if c not in frame.columns:
            raise ValueError(f"column {c!r} not in the frame (columns: {frame.columns})")
    for c in (score, label):
        if frame[c].null_count():
            raise ValueError(f"column {c!r} holds {frame[c].null_count()} missing value(s)")
    offsets, keys = request_offsets(frame[request])
    p = torch.from_numpy(frame[score].to_numpy().astype(np.float64))
    y = torch.from_numpy(frame[label].to_numpy().astype(np.float64))
    return flat_stats(p, y, torch.from_numpy(np.diff(offsets)), p=p, request_key=keys, ks=ks,
                      empty=empty, bins=bins, binning=binning)


def ratio_stats(num, den, *, name: str = "mean", sizes=None, positives=None, request_key=None,
                scale: float = 1.0) -> RequestStats:
    """Statistics of one ratio of per-request sums, ``scale * sum_r num_r / sum_r den_r``.

    A per-request mean is ``ratio_stats(values, ones)``; a CTR ``ratio_stats(clicks, impressions)``.

    Args:
        num, den: ``[R]`` per-request sums. sizes: ``[R]`` impressions (default ``den``).
        positives, request_key: optional ``[R]`` (see :class:`RequestStats`).

    >>> ratio_stats(np.array([1.0, 0.0, 2.0]), np.array([2.0, 2.0, 4.0]), name="ctr").point()
    {'ctr': 0.375}
    """
    num, den = _f64(num), _f64(den)
    if num.shape != den.shape or num.ndim != 1:
        raise ValueError(f"num and den must be [R] of one shape, got {num.shape} and {den.shape}")
    sz = den if sizes is None else _f64(sizes)
    pos = None if positives is None else _f64(positives)
    return RequestStats({f"{name}:num": num, f"{name}:den": den},
                        {name: ratio(f"{name}:num", f"{name}:den", scale=scale)}, sz, pos,
                        None if request_key is None else np.asarray(request_key))


def request_offsets(request_ids) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets [R + 1], keys [R])`` of contiguous runs of request ids (storage order).

    Raises ``ValueError`` when an id appears in two separate runs (the rows are not sorted by
    request) or when an id is missing.

    >>> off, key = request_offsets(np.array([7, 7, 3, 5, 5]))
    >>> off.tolist(), key.tolist()
    ([0, 2, 3, 5], [7, 3, 5])
    """
    if hasattr(request_ids, "to_numpy"):
        if hasattr(request_ids, "null_count") and request_ids.null_count():
            raise ValueError(f"request ids hold {request_ids.null_count()} missing value(s)")
        request_ids = request_ids.to_numpy()
    ids = np.asarray(request_ids)
    if ids.ndim != 1:
        raise ValueError(f"request ids must be 1-d, got shape {ids.shape}")
    n = ids.shape[0]
    new = np.ones(n, dtype=bool)
    if n > 1:
        new[1:] = ids[1:] != ids[:-1]
    starts = np.flatnonzero(new)
    keys = ids[starts]
    uniq, first, counts = np.unique(keys, return_index=True, return_counts=True)
    if uniq.shape[0] != keys.shape[0]:
        bad = uniq[counts > 1][0]
        rows = starts[np.flatnonzero(keys == bad)][:2]
        raise ValueError(f"request id {bad!r} appears in separate runs (rows {rows[0]} and {rows[1]}): "
                         "rows must be sorted by request, as exports are")
    return np.append(starts, n).astype(np.int64), keys


def check_same_requests(a: RequestStats, b: RequestStats) -> None:
    """Raise ``ValueError`` saying what differs unless ``a`` and ``b`` cover the same requests.

    Compared in order: request counts, request ids (when both have them), impressions per
    request, positives per request (when both are labelled).
    """
    if a.n_requests != b.n_requests:
        raise ValueError(f"different requests: {a.n_requests} vs {b.n_requests} requests")

    def first_diff(x, y, what):
        diff = np.flatnonzero(np.asarray(x) != np.asarray(y))
        if diff.size:
            i = int(diff[0])
            key = "" if a.request_key is None else f" (id {a.request_key[i]!r})"
            raise ValueError(f"different requests: {what} differ at {diff.size} request(s), first at "
                             f"index {i}{key}: {x[i]!r} vs {y[i]!r}")

    if a.request_key is not None and b.request_key is not None:
        first_diff(a.request_key, b.request_key, "request ids")
    first_diff(a.sizes, b.sizes, "impressions per request")
    if a.positives is not None and b.positives is not None:
        first_diff(a.positives, b.positives, "positive labels per request")
