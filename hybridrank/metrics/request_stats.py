"""The metric engine in one import: per-request sufficient statistics, every metric a formula over them.

Every figure a run reports (the train table, ``metrics.json``, the eval report, hybridrank-compare,
the auction replay's intervals) is a formula over the totals of **per-request sums**, computed
once. The engine is a few focused modules; this module re-exports their public names, so
``from hybridrank.metrics.request_stats import flat_stats, RequestStats`` is all a caller needs:

- :mod:`~hybridrank.metrics.list_kernels`: per-list kernels (NDCG, AP / RR, AUC of each list),
  shared with the pure functions of :mod:`~hybridrank.metrics.ranking`;
- :mod:`~hybridrank.metrics.request_sums`: the per-request kernel, :func:`ranking_sums` and
  :func:`impression_sums` (and the table of the columns they produce);
- :mod:`~hybridrank.metrics.statistics`: the formula layer, :class:`Statistic`, :func:`ratio`,
  :func:`metric_statistics`, ``RANKING``;
- :mod:`~hybridrank.metrics.per_request`: the container :class:`RequestStats` (point estimates,
  replicates, field and reliability tables, merge) and :func:`check_same_requests`;
- :mod:`~hybridrank.metrics.builders`: :func:`flat_stats` (the one builder of scored requests) and
  its adapters :func:`list_stats`, :func:`ranking_stats`, :func:`calibration_stats`,
  :func:`field_stats`, :func:`split_stats`, :func:`frame_stats`, :func:`ratio_stats`, and
  :func:`request_offsets`.

From the same columns:

- the **point estimate** is the formula on the plain column sums (:meth:`RequestStats.point`);
- a **bootstrap replicate** is the formula on ``counts @ columns``, requests re-weighted by how
  often a resample drew them (:meth:`RequestStats.values_of`, :mod:`hybridrank.metrics.uncertainty`);
- **field tables** and the **reliability table** are the per-cell totals;
- :class:`~hybridrank.metrics.list_metrics.ListMetrics` runs the same kernels on every batch with
  all requests in one group: its states are the column totals (sums, exact under DDP) and its
  ``compute`` applies the same statistics.
"""

from __future__ import annotations

from hybridrank.metrics.builders import (
    calibration_stats,
    field_stats,
    flat_stats,
    frame_stats,
    list_stats,
    ranking_stats,
    ratio_stats,
    request_offsets,
    split_stats,
)
from hybridrank.metrics.per_request import RequestStats, check_same_requests
from hybridrank.metrics.request_sums import impression_sums, ranking_sums
from hybridrank.metrics.statistics import RANKING, Statistic, Totals, metric_statistics, ratio

__all__ = ["Statistic", "Totals", "RequestStats", "ratio", "metric_statistics", "ranking_sums",
           "impression_sums", "flat_stats", "list_stats", "split_stats", "frame_stats",
           "ranking_stats", "calibration_stats", "field_stats", "ratio_stats", "request_offsets",
           "check_same_requests", "RANKING"]
