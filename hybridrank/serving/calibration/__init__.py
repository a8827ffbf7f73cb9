"""Post-hoc calibration of click logits, and the negative-downsampling correction.

- :mod:`~hybridrank.serving.calibration.calibrators`: the calibrators (``none``, ``shift``,
  ``platt``, ``isotonic``), their common interface and :func:`calibrator_from_dict`.
- :mod:`~hybridrank.serving.calibration.correction`: the downsampling correction
  (``logit + log w``) and :func:`resolve_correction` (``correction: auto|always|never``).
- :mod:`~hybridrank.serving.calibration.rules`: the rules of ``auto``, each a named pure function.
- :mod:`~hybridrank.serving.calibration.auto`: :class:`AutoCalibrator`, those rules in order.

The names are re-exported here: ``from hybridrank.serving.calibration import PlattCalibrator``.
:func:`~hybridrank.serving.level_trend.level_stability`, the time-block test ``auto`` reads, lives
with the level trend and is re-exported for the same import path.
"""

from hybridrank.serving.calibration.auto import AutoCalibrator
from hybridrank.serving.calibration.calibrators import (
    CALIBRATORS,
    Calibrator,
    IdentityCalibrator,
    IsotonicCalibrator,
    NotRankingError,
    PlattCalibrator,
    ShiftCalibrator,
    calibrator_from_dict,
)
from hybridrank.serving.calibration.correction import (
    CORRECTIONS,
    correction_shift,
    downsampling_correction,
    resolve_correction,
)
from hybridrank.serving.calibration.rules import compare_score_distributions
from hybridrank.serving.level_trend import level_stability

__all__ = [
    "Calibrator", "IdentityCalibrator", "ShiftCalibrator", "PlattCalibrator", "IsotonicCalibrator",
    "AutoCalibrator", "NotRankingError", "compare_score_distributions", "level_stability",
    "CALIBRATORS", "calibrator_from_dict", "downsampling_correction", "correction_shift",
    "resolve_correction", "CORRECTIONS",
]
