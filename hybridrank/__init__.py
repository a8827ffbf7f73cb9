"""hybridrank: train CTR rankers that are both well ordered and calibrated.

A PyTorch Lightning module whose loss is a weighted pointwise BCE plus pairwise / listwise ranking
terms (including the calibration-compatible ones: calibrated softmax, RCR, JRC), trained on batches
of whole impression lists from a group-aware sampler, reporting NDCG and calibration.
See ``docs/ARCHITECTURE.md`` for how the parts fit.
"""

from .data import (
    ClickLogSource,
    ColumnMap,
    LetorSource,
    Schema,
    SimulatedSource,
    Splits,
    read_clicklog,
    read_libsvm,
)
from .lists import Batch, ListData
from .losses import HybridLoss, click_logit
from .metrics import ListMetrics
from .module import HybridRanker, evaluate_logits, predict_logits
from .nets import LinearScorer, MLPScorer
from .sampler import GroupBatchSampler, ListDataset, collate, unit_ids
from .simulate import simulate_clicklog

__version__ = "0.1.0"

__all__ = [
    "Batch", "ClickLogSource", "ColumnMap", "GroupBatchSampler", "HybridLoss", "HybridRanker",
    "LetorSource", "LinearScorer", "ListData", "ListDataset", "ListMetrics", "MLPScorer", "Schema",
    "SimulatedSource", "Splits", "click_logit", "collate", "evaluate_logits", "predict_logits",
    "read_clicklog", "read_libsvm", "simulate_clicklog", "unit_ids",
]
