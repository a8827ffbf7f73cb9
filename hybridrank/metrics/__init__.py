"""Metrics: ranking (NDCG, MAP, MRR, AUC, GAUC) and calibration (log loss, NE, ECE, PCOC, field ECE)
as pure functions, the streaming ``ListMetrics``, per-request statistics and bootstrap intervals.

- ``ranking.py``, ``calibration.py``: pure functions over padded ``[G, L]`` lists (or flat ``[N]``
  for calibration), every one ``f(scores, labels, *, mask, ...)``: ``mask`` keyword-only, as in the
  losses; ``list_kernels.py``: the per-list kernels behind the ranking functions and the engine.
- the metric engine, one import ``request_stats.py``: ``request_sums.py`` (the per-request kernel),
  ``statistics.py`` (every metric as a formula over column totals), ``per_request.py``
  (``RequestStats``: points, replicates, tables), ``builders.py`` (``flat_stats`` and its adapters);
  ``uncertainty.py``: bootstrap over requests.
- ``list_metrics.py``: :class:`ListMetrics` (torchmetrics): the engine's column totals as sum states
  (DDP-exact, memory-flat) plus the logit histogram of ``logit_histogram.py``, for training-time
  validation.
- ``report.py``: calibration summaries and figures of ``hybridrank-eval``.
"""

from hybridrank._lazy import lazy_exports

_EXPORTS = {
    "EPS": "hybridrank.metrics.calibration",
    "Interval": "hybridrank.metrics.uncertainty",
    "ListMetrics": "hybridrank.metrics.list_metrics",
    "PairedResult": "hybridrank.metrics.uncertainty",
    "PositionCalibration": "hybridrank.metrics.calibration",
    "ReliabilityTable": "hybridrank.metrics.calibration",
    "RequestStats": "hybridrank.metrics.per_request",
    "Statistic": "hybridrank.metrics.statistics",
    "auc": "hybridrank.metrics.ranking",
    "auc_from_counts": "hybridrank.metrics.ranking",
    "auc_per_list": "hybridrank.metrics.ranking",
    "average_precision_per_list": "hybridrank.metrics.ranking",
    "bin_index": "hybridrank.metrics.calibration",
    "bootstrap": "hybridrank.metrics.uncertainty",
    "bootstrap_replicates": "hybridrank.metrics.uncertainty",
    "calibration_stats": "hybridrank.metrics.builders",
    "check_same_requests": "hybridrank.metrics.per_request",
    "compare_bootstrap": "hybridrank.metrics.uncertainty",
    "ece": "hybridrank.metrics.calibration",
    "field_ece": "hybridrank.metrics.calibration",
    "field_stats": "hybridrank.metrics.builders",
    "flat_stats": "hybridrank.metrics.builders",
    "format_interval": "hybridrank.metrics.uncertainty",
    "frame_stats": "hybridrank.metrics.builders",
    "gauc": "hybridrank.metrics.ranking",
    "interval_table": "hybridrank.metrics.uncertainty",
    "list_stats": "hybridrank.metrics.builders",
    "log_loss": "hybridrank.metrics.calibration",
    "mean_average_precision": "hybridrank.metrics.ranking",
    "metric_statistics": "hybridrank.metrics.statistics",
    "mrr": "hybridrank.metrics.ranking",
    "ndcg": "hybridrank.metrics.ranking",
    "ndcg_per_list": "hybridrank.metrics.ranking",
    "normalized_entropy": "hybridrank.metrics.calibration",
    "paired_bootstrap": "hybridrank.metrics.uncertainty",
    "pcoc": "hybridrank.metrics.calibration",
    "pcoc_by_position": "hybridrank.metrics.calibration",
    "pcoc_interval": "hybridrank.metrics.calibration",
    "ranking_stats": "hybridrank.metrics.builders",
    "ratio": "hybridrank.metrics.statistics",
    "ratio_stats": "hybridrank.metrics.builders",
    "reciprocal_rank_per_list": "hybridrank.metrics.ranking",
    "reliability_table": "hybridrank.metrics.calibration",
    "request_offsets": "hybridrank.metrics.builders",
    "resample_counts": "hybridrank.metrics.uncertainty",
    "split_stats": "hybridrank.metrics.builders",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
