"""``RequestStats``: the container of the metric engine, one row of per-request sums per request.

It holds the columns of one score set (:mod:`hybridrank.metrics.request_sums`) with the
:class:`~hybridrank.metrics.statistics.Statistic` of every metric, and derives from them:

- the **point estimate**: the formula on the plain column sums (:meth:`RequestStats.point`);
- a **bootstrap replicate**: the formula on ``counts @ columns``, requests re-weighted by how
  often a resample drew them (:meth:`RequestStats.values_of`, :mod:`hybridrank.metrics.uncertainty`);
  all counts 1 give the point estimate;
- **field tables** (PCOC per position / category) and the **reliability table**: the per-cell
  totals (:meth:`RequestStats.field_table`, :meth:`RequestStats.reliability`).

The builders of :mod:`hybridrank.metrics.builders` make one from scores; :func:`check_same_requests`
says whether two cover the same requests (the paired tests).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from hybridrank.metrics.calibration import (
    PositionCalibration,
    ReliabilityTable,
    field_table_from_sums,
    table_from_sums,
)
from hybridrank.metrics.statistics import Statistic

__all__ = ["RequestStats", "check_same_requests", "as_float64"]

_TOTALS_BLOCK = 1 << 22  # replicate rows x sparse-column cells materialised at once


def as_float64(x) -> np.ndarray:
    """A float64 numpy array of a tensor (any device, bool and ints converted) or an array-like."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        x = x.double() if x.is_floating_point() or x.dtype == torch.bool else x
    return np.asarray(x, dtype=np.float64)


def _column(name: str, col, r: int) -> Tensor:
    col = col if isinstance(col, torch.Tensor) else torch.from_numpy(as_float64(col))
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
        sizes = as_float64(self.sizes)
        if sizes.ndim != 1:
            raise ValueError(f"sizes must be [R], got shape {sizes.shape}")
        object.__setattr__(self, "sizes", sizes)
        r = sizes.shape[0]
        object.__setattr__(self, "columns", {n: _column(n, c, r) for n, c in self.columns.items()})
        if self.positives is not None:
            object.__setattr__(self, "positives", as_float64(self.positives))
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
