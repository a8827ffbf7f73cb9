"""The formula layer of the metric engine: every metric as a :class:`Statistic` over column totals.

A statistic reads the **totals** of per-request columns (:mod:`hybridrank.metrics.request_sums`
names them: ``lists:*``, ``ndcg@k:sum``, ``cal:*``, ``ece:*``, ``field:{f}:*``, ``auc:*``), one
row per replicate, and returns ``(value [B], defined [B])``. The formulas themselves are written
once, in :mod:`hybridrank.metrics.calibration` (log loss, NE, PCOC, the gap of ECE and F-ECE) and
:mod:`hybridrank.metrics.ranking` (AUC over score buckets); means over lists are ratios of sums.
The same statistics serve the point estimate and every bootstrap replicate of
:class:`~hybridrank.metrics.per_request.RequestStats` and the ``compute`` of
:class:`~hybridrank.metrics.list_metrics.ListMetrics`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from hybridrank.metrics.calibration import gap_from_sums, logloss_from_sums, ne_from_sums, pcoc_from_sums, safe_div
from hybridrank.metrics.list_kernels import resolve_ks
from hybridrank.metrics.ranking import auc_from_counts

__all__ = ["Totals", "RANKING", "Statistic", "ratio", "metric_statistics"]

Totals = Mapping[str, Tensor]
"""Column name -> ``[B]`` (or ``[B, m]``) weighted sums over requests, one row per replicate."""

RANKING = ("ndcg", "map", "mrr", "gauc")
"""The ranking metrics of the per-request kernel (``include=``)."""


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
        v, ok = safe_div(t[num], t[den])
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
    """The statistics of the columns :func:`~hybridrank.metrics.request_sums.ranking_sums` /
    :func:`~hybridrank.metrics.request_sums.impression_sums` produce.

    Names and order: ``ndcg@k`` per k, ``map``, ``mrr``, ``auc``, ``gauc``, ``logloss``, ``ne``,
    ``ece``, ``pcoc``, ``ctr``, ``pcoc@pos{i}``, ``f_ece@position``, ``f_ece@{field}``, and the
    counts ``n_lists``, ``n_empty``, ``n_skipped``, ``n_impressions``, ``n_positives``.
    """
    kk, _ = resolve_ks(ks)
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
