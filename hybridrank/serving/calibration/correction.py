"""The negative-downsampling correction: undo the click-rate inflation of dropped negatives.

When training kept each negative with probability ``w`` and did *not* re-weight the kept ones,
the model's odds are ``1 / w`` times too high (He et al. 2014). The correction
``q = p / (p + (1 - p) / w)`` is the same as adding ``log w`` to the logit
(:func:`downsampling_correction`, :func:`correction_shift`); :func:`resolve_correction` decides,
from the ``correction: auto|always|never`` option, whether an export applies it.
"""

from __future__ import annotations

import math

__all__ = ["CORRECTIONS", "downsampling_correction", "correction_shift", "resolve_correction"]

CORRECTIONS = ("auto", "always", "never")


def downsampling_correction(p, w: float):
    """Undo the CTR inflation of negative downsampling: ``q = p / (p + (1 - p) / w)``.

    Equivalently ``logit(q) = logit(p) + log(w)``. Works on floats, numpy arrays and tensors.

    Args:
        p: predicted probability of a model trained with negatives kept at rate ``w``.
        w: the negative keep rate, ``0 < w <= 1`` (1: nothing dropped, ``q = p``).

    Returns:
        The corrected probability, same type as ``p``.

    >>> round(downsampling_correction(0.5, 0.1), 6)   # odds 1 -> 0.1
    0.090909
    """
    _check_rate(w)
    return p / (p + (1 - p) / w)


def correction_shift(w: float) -> float:
    """The logit shift of the correction, ``log(w)`` (0 when nothing was dropped).

    >>> correction_shift(1.0), round(correction_shift(0.5), 6)
    (0.0, -0.693147)
    """
    _check_rate(w)
    return math.log(w)


def _check_rate(w: float) -> None:
    if not (isinstance(w, int | float) and 0 < w <= 1):
        raise ValueError(f"negative keep rate must lie in (0, 1], got {w!r}")


def resolve_correction(mode: str, neg_keep_rate: float, loss_reweighted: bool) -> bool:
    """Whether to apply the downsampling correction.

    Args:
        mode: ``"auto"``: apply iff negatives were dropped (``neg_keep_rate < 1``) and the loss
            did *not* re-weight the kept negatives by ``1 / w`` (with re-weighting the pointwise
            loss is already an unbiased estimate of the full-data loss, so correcting again would
            under-predict by the factor ``w`` in odds). ``"always"``: apply whenever
            ``neg_keep_rate < 1``. ``"never"``: do not apply.
        neg_keep_rate: the share of negatives the training sampler kept.
        loss_reweighted: whether the kept negatives carried weight ``1 / w`` in the loss.

    Returns:
        True when the export adds ``log(neg_keep_rate)`` to every logit.

    >>> resolve_correction("auto", 0.2, loss_reweighted=False), resolve_correction("auto", 0.2, True)
    (True, False)
    """
    if mode not in CORRECTIONS:
        raise ValueError(f"correction must be one of {CORRECTIONS}, got {mode!r}")
    _check_rate(float(neg_keep_rate))
    dropped = float(neg_keep_rate) < 1.0
    if mode == "never" or not dropped:
        return False
    return mode == "always" or not loss_reweighted
