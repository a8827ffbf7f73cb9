"""hybridrank: train CTR rankers that are both well ordered and calibrated.

A PyTorch Lightning module whose loss is a weighted pointwise BCE plus pairwise / listwise ranking
terms (including the calibration-compatible ones: calibrated softmax, RCR, JRC), trained on batches
of whole impression lists from a group-aware sampler, reporting NDCG and calibration.
See ``docs/ARCHITECTURE.md`` for how the parts fit. Submodules hold the full APIs
(``hybridrank.losses``, ``hybridrank.metrics``, ``hybridrank.calibration``, ``hybridrank.export``);
the names most users need are re-exported here.
"""

from .auction import position_factors, replay_auctions, replay_frame, run_auction
from .calibration import IdentityCalibrator, IsotonicCalibrator, PlattCalibrator, downsampling_correction
from .data import ClickLogSource, ColumnMap, LetorSource, Schema, SimulatedSource, Splits, read_clicklog, read_libsvm
from .datamodule import ListDataModule
from .export import PortableRanker, export_onnx, export_torchscript, read_scores, score_frame
from .lists import Batch, ListData
from .losses import LOSSES, HybridLoss, click_logit
from .metrics import ListMetrics, auc, ece, gauc, log_loss, mean_average_precision, mrr, ndcg, pcoc
from .module import HybridRanker, evaluate_chunks, evaluate_logits
from .nets import DCNv2Scorer, DeepFMScorer, FMScorer, LinearScorer, ListAwareScorer, MLPScorer
from .sampler import GroupBatchSampler, ListDataset, collate, unit_ids
from .scanner import ClickLogScanner
from .simulate import simulate_clicklog
from .streaming import StreamingClickLogSource, StreamingDataModule
from .uncertainty import bootstrap, compare_bootstrap, format_interval, paired_bootstrap

__version__ = "0.1.0"

__all__ = [
    "DCNv2Scorer", "DeepFMScorer", "FMScorer", "ListAwareScorer", "bootstrap", "compare_bootstrap",
    "format_interval", "paired_bootstrap", "position_factors", "replay_auctions", "replay_frame",
    "run_auction",
    "LOSSES", "Batch", "ClickLogScanner", "ClickLogSource", "ColumnMap", "GroupBatchSampler", "HybridLoss",
    "HybridRanker", "IdentityCalibrator", "IsotonicCalibrator", "LetorSource", "LinearScorer", "ListData",
    "ListDataModule", "ListDataset", "ListMetrics", "MLPScorer", "PlattCalibrator", "PortableRanker", "Schema",
    "SimulatedSource", "Splits", "StreamingClickLogSource", "StreamingDataModule", "auc", "click_logit",
    "collate", "downsampling_correction", "ece", "evaluate_chunks", "evaluate_logits", "export_onnx",
    "export_torchscript", "gauc", "log_loss", "mean_average_precision", "mrr", "ndcg", "pcoc", "read_clicklog",
    "read_libsvm", "read_scores", "score_frame", "simulate_clicklog", "unit_ids",
]
