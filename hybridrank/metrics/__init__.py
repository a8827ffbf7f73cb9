"""Metrics: ranking (NDCG, MAP, MRR, AUC, GAUC) and calibration (log loss, NE, ECE, PCOC, field ECE)
as pure functions, the streaming ``ListMetrics``, per-request statistics and bootstrap intervals.

- ``ranking.py``, ``calibration.py``: pure functions over padded ``[G, L]`` lists.
- ``list_metrics.py``: :class:`ListMetrics` (torchmetrics, sum states, DDP-exact).
- ``request_stats.py``: per-request sufficient statistics; ``uncertainty.py``: bootstrap over requests.
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
    "format_interval": "hybridrank.metrics.uncertainty",
    "frame_stats": "hybridrank.metrics.request_stats",
    "gauc": "hybridrank.metrics.ranking",
    "log_loss": "hybridrank.metrics.calibration",
    "mean_average_precision": "hybridrank.metrics.ranking",
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
    "split_intervals": "hybridrank.metrics.uncertainty",
    "split_stats": "hybridrank.metrics.request_stats",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
