"""hybridrank: train CTR rankers that are both well ordered and calibrated.

A PyTorch Lightning module whose loss is a weighted pointwise BCE plus pairwise / listwise ranking
terms (including the calibration-compatible ones: calibrated softmax, RCR, JRC), trained on batches
of whole impression lists from a group-aware sampler, reporting NDCG and calibration.

Sub-packages by concept, imports pointing one way (docs/ARCHITECTURE.md):
``lists`` (the data model) and ``_dcg`` at the base, then :mod:`hybridrank.data`,
:mod:`hybridrank.losses`, :mod:`hybridrank.metrics`, :mod:`hybridrank.models`,
:mod:`hybridrank.serving`, :mod:`hybridrank.evaluation`, and :mod:`hybridrank.cli` on top. The names most users need are
re-exported here; they are imported on first use, so ``import hybridrank`` stays cheap.
"""

from hybridrank._lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    # the data model
    "Batch": "hybridrank.lists", "ListData": "hybridrank.lists",
    # data
    "ClickLogSource": "hybridrank.data.sources", "LetorSource": "hybridrank.data.sources",
    "SimulatedSource": "hybridrank.data.sources", "Splits": "hybridrank.data.sources",
    "ColumnMap": "hybridrank.data.readers", "read_clicklog": "hybridrank.data.readers",
    "Schema": "hybridrank.data.schema", "read_libsvm": "hybridrank.data.libsvm",
    "ListDataModule": "hybridrank.data.datamodule", "GroupBatchSampler": "hybridrank.data.sampler",
    "ListDataset": "hybridrank.data.collate", "collate": "hybridrank.data.collate",
    "unit_ids": "hybridrank.data.sampler", "ClickLogScanner": "hybridrank.data.scanner",
    "simulate_clicklog": "hybridrank.data.simulate",
    "StreamingClickLogSource": "hybridrank.data.streaming",
    # losses
    "LOSSES": "hybridrank.losses", "HybridLoss": "hybridrank.losses", "click_logit": "hybridrank.losses",
    # metrics
    "ListMetrics": "hybridrank.metrics", "auc": "hybridrank.metrics", "gauc": "hybridrank.metrics",
    "mean_average_precision": "hybridrank.metrics", "mrr": "hybridrank.metrics",
    "ndcg": "hybridrank.metrics", "ece": "hybridrank.metrics", "log_loss": "hybridrank.metrics",
    "pcoc": "hybridrank.metrics", "bootstrap": "hybridrank.metrics",
    "compare_bootstrap": "hybridrank.metrics", "format_interval": "hybridrank.metrics",
    "paired_bootstrap": "hybridrank.metrics",
    # models
    "HybridRanker": "hybridrank.models", "DCNv2Scorer": "hybridrank.models",
    "DeepFMScorer": "hybridrank.models", "FMScorer": "hybridrank.models",
    "LinearScorer": "hybridrank.models", "ListAwareScorer": "hybridrank.models",
    "MLPScorer": "hybridrank.models", "PositionBias": "hybridrank.models",
    # serving
    "IdentityCalibrator": "hybridrank.serving", "IsotonicCalibrator": "hybridrank.serving",
    "PlattCalibrator": "hybridrank.serving", "downsampling_correction": "hybridrank.serving",
    "PortableRanker": "hybridrank.serving", "export_onnx": "hybridrank.serving",
    "export_torchscript": "hybridrank.serving", "read_scores": "hybridrank.serving",
    "score_frame": "hybridrank.serving", "position_factors": "hybridrank.serving",
    "replay_auctions": "hybridrank.serving", "replay_frame": "hybridrank.serving",
    "run_auction": "hybridrank.serving",
    # evaluation
    "evaluate_chunks": "hybridrank.evaluation", "evaluate_logits": "hybridrank.evaluation",
    "evaluate_model": "hybridrank.evaluation",
    # entry point
    "train": "hybridrank.cli.train",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
