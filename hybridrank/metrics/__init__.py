"""Metrics: ranking (NDCG, MAP, MRR, AUC, GAUC) and calibration (log loss, NE, ECE, PCOC, field ECE)
as pure functions, the streaming ``ListMetrics``, per-request statistics and bootstrap intervals.

- ``ranking.py``, ``calibration.py``: pure functions over padded ``[G, L]`` lists.
- ``request_stats.py``: the metric engine: per-request sufficient statistics from which every point
  estimate, field table and bootstrap replicate derives; ``uncertainty.py``: bootstrap over requests.
- ``list_metrics.py``: :class:`ListMetrics` (torchmetrics): the engine's column totals as sum states
  (DDP-exact, memory-flat) for training-time validation.
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
    "RequestStats": "hybridrank.metrics.request_stats",
    "Statistic": "hybridrank.metrics.request_stats",
    "auc": "hybridrank.metrics.ranking",
    "auc_from_counts": "hybridrank.metrics.ranking",
    "auc_per_list": "hybridrank.metrics.ranking",
    "average_precision_per_list": "hybridrank.metrics.ranking",
    "bin_index": "hybridrank.metrics.calibration",
    "bootstrap": "hybridrank.metrics.uncertainty",
    "bootstrap_replicates": "hybridrank.metrics.uncertainty",
    "calibration_stats": "hybridrank.metrics.request_stats",
    "check_same_requests": "hybridrank.metrics.request_stats",
    "compare_bootstrap": "hybridrank.metrics.uncertainty",
    "ece": "hybridrank.metrics.calibration",
    "field_ece": "hybridrank.metrics.calibration",
    "field_stats": "hybridrank.metrics.request_stats",
    "flat_stats": "hybridrank.metrics.request_stats",
    "format_interval": "hybridrank.metrics.uncertainty",
    "frame_stats": "hybridrank.metrics.request_stats",
    "gauc": "hybridrank.metrics.ranking",
    "interval_table": "hybridrank.metrics.uncertainty",
    "list_stats": "hybridrank.metrics.request_stats",
    "log_loss": "hybridrank.metrics.calibration",
    "mean_average_precision": "hybridrank.metrics.ranking",
    "metric_statistics": "hybridrank.metrics.request_stats",
    "mrr": "hybridrank.metrics.ranking",
    "ndcg": "hybridrank.metrics.ranking",
    "ndcg_per_list": "hybridrank.metrics.ranking",
    "normalized_entropy": "hybridrank.metrics.calibration",
    "paired_bootstrap": "hybridrank.metrics.uncertainty",
    "pcoc": "hybridrank.metrics.calibration",
    "pcoc_by_position": "hybridrank.metrics.calibration",
    "pcoc_interval": "hybridrank.metrics.calibration",
    "ranking_stats": "hybridrank.metrics.request_stats",
    "ratio": "hybridrank.metrics.request_stats",
    "ratio_stats": "hybridrank.metrics.request_stats",
    "reciprocal_rank_per_list": "hybridrank.metrics.ranking",
    "reliability_table": "hybridrank.metrics.calibration",
    "request_offsets": "hybridrank.metrics.request_stats",
    "resample_counts": "hybridrank.metrics.uncertainty",
    "split_stats": "hybridrank.metrics.request_stats",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
