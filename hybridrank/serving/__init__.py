"""Serving: post-hoc calibrators, score exports and portable models, auction replay, checkpoints.

- ``calibration/``: the calibrators (identity / shift / Platt / isotonic), the downsampling
  correction, and the rules of ``auto`` with :class:`AutoCalibrator`.
- ``level_trend.py``: the click level's trend over time, followed by exports to each row's time.
- ``export.py``: score files with metadata, TorchScript / ONNX (``PortableRanker``).
- ``auction.py``: GSP / first-price replay with the oracle allocation.
- ``checkpoint.py``: atomic Lightning checkpoints, and loading a trained model back.
"""

from hybridrank._lazy import lazy_exports

_EXPORTS = {
    "CALIBRATORS": "hybridrank.serving.calibration",
    "AtomicCheckpointIO": "hybridrank.serving.checkpoint",
    "AuctionOutcome": "hybridrank.serving.auction",
    "AuctionResult": "hybridrank.serving.auction",
    "AutoCalibrator": "hybridrank.serving.calibration",
    "CORRECTIONS": "hybridrank.serving.calibration",
    "Calibrator": "hybridrank.serving.calibration",
    "IdentityCalibrator": "hybridrank.serving.calibration",
    "IsotonicCalibrator": "hybridrank.serving.calibration",
    "LevelTrend": "hybridrank.serving.level_trend",
    "MECHANISMS": "hybridrank.serving.auction",
    "META_KEYS": "hybridrank.serving.export",
    "PlattCalibrator": "hybridrank.serving.calibration",
    "PortableRanker": "hybridrank.serving.export",
    "ScoreWriter": "hybridrank.serving.export",
    "atomic_torch_save": "hybridrank.serving.checkpoint",
    "auction_stats": "hybridrank.serving.auction",
    "build_metadata": "hybridrank.serving.export",
    "calibrator_from_dict": "hybridrank.serving.calibration",
    "correction_shift": "hybridrank.serving.calibration",
    "downsampling_correction": "hybridrank.serving.calibration",
    "export_onnx": "hybridrank.serving.export",
    "export_torchscript": "hybridrank.serving.export",
    "fit_level_trend": "hybridrank.serving.level_trend",
    "position_factors": "hybridrank.serving.auction",
    "ranks_within_requests": "hybridrank.serving.export",
    "read_scores": "hybridrank.serving.export",
    "replay_auctions": "hybridrank.serving.auction",
    "replay_frame": "hybridrank.serving.auction",
    "resolve_correction": "hybridrank.serving.calibration",
    "run_auction": "hybridrank.serving.auction",
    "score_frame": "hybridrank.serving.export",
    "sha256_file": "hybridrank.serving.export",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
