"""Models: the scorers, the position-bias tower and the ``HybridRanker`` LightningModule.

- ``scorers.py`` (+ ``attention.py``): MLP, linear, FM, DeepFM, DCN-v2, list-aware scorers.
- ``position/``: :class:`PositionBias`, a logit offset per display slot (estimators, module, report).
- ``unseen.py``: unseen-value dropout, which trains the out-of-vocabulary row (pure functions).
- ``ranker.py``: :class:`HybridRanker` (one shared step, the one scoring path ``serve``).
"""

from hybridrank._lazy import lazy_exports

_EXPORTS = {
    "DCNv2Scorer": "hybridrank.models.scorers",
    "DeepFMScorer": "hybridrank.models.scorers",
    "FMScorer": "hybridrank.models.scorers",
    "HybridRanker": "hybridrank.models.ranker",
    "LinearScorer": "hybridrank.models.scorers",
    "ListAwareScorer": "hybridrank.models.scorers",
    "MLPScorer": "hybridrank.models.scorers",
    "PositionBias": "hybridrank.models.position",
    "embedding_dim": "hybridrank.models.scorers",
    "init_output_bias": "hybridrank.models.scorers",
    "serve": "hybridrank.models.ranker",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
