"""The click level by period: does the test period sit at a level validation cannot show?

Validation stops training and fits ``calibrator=auto``; it can only speak for the test period
where the two share a click level. Under the default click-log split (the latest sessions test,
validation drawn by hash over the earlier ones) validation holds the training period's average
level, so a level that moves over time reaches the test period unseen; a validation block just
before test (``val_by: time``) follows a trend part of the way. Two checks, on the labels alone
(no model), each level the logit of a click rate (``label > 0``):

- **trend**: the training and validation requests in time order, cut into ``blocks`` blocks of
  equal impressions; a weighted line through the blocks' logit levels (weights ``1 / SE²``, the
  slope's standard error widened by the blocks' excess dispersion, so a cycle is not read as a
  trend) predicts the test level minus validation's as ``slope x (mean test time - mean
  validation time)``;
- **observed**: the test split's level minus validation's, where the test labels are at hand (an
  offline evaluation).

Either gap counts when it exceeds ``min_gap`` logit and ``z`` of its standard errors. Standard
errors treat requests as independent (clicks within a request are summed first). Splits without
request times (LETOR) are not checked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hybridrank.lists import ListData

__all__ = ["Level", "PeriodCheck", "split_level", "check_periods"]


@dataclass(frozen=True)
class Level:
    """The click level of a set of requests: ``logit`` of the click rate and its standard error."""

    logit: float
    se: float
    impressions: int
    clicks: float
    time: float  # mean request time, impression-weighted


def _level(clicks: np.ndarray, sizes: np.ndarray, times: np.ndarray) -> Level:
    """``clicks`` / ``sizes`` / ``times`` per request; the rate is smoothed by half a click."""
    n, c = float(sizes.sum()), float(clicks.sum())
    p = (c + 0.5) / (n + 1.0)
    var = float(((clicks - p * sizes) ** 2).sum()) / n**2 if n else math.inf  # of the rate
    se = math.sqrt(max(var, p * (1 - p) / max(n, 1.0))) / (p * (1 - p))
    t = float((times * sizes).sum() / n) if n else math.nan
    return Level(math.log(p / (1 - p)), se, int(n), c, t)


def _per_request(data: ListData) -> tuple[np.ndarray, np.ndarray]:
    clicks = (data.label.numpy() > 0).astype(np.float64)
    offsets = data.offsets.numpy()
    return np.add.reduceat(clicks, offsets[:-1]) if clicks.size else clicks, np.diff(offsets).astype(np.float64)


def split_level(data: ListData) -> Level:
    """The click level of a split (``label > 0`` is a click).

    >>> import torch
    >>> d = ListData(torch.zeros(4, 0), torch.zeros(4, 0, dtype=torch.long),
    ...              torch.tensor([1.0, 0, 0, 0]), torch.tensor([0, 2, 4]), time=torch.tensor([0, 1]))
    >>> round(split_level(d).logit, 4)    # (1 + 0.5) / (4 + 1) = 0.3
    -0.8473
    """
    clicks, sizes = _per_request(data)
    times = data.time.numpy().astype(np.float64) if data.time is not None else np.zeros(sizes.size)
    return _level(clicks, sizes, times)


@dataclass(frozen=True)
class PeriodCheck:
    """What :func:`check_periods` found; ``message`` is None when nothing needs saying."""

    train: Level
    val: Level
    test: Level
    slope: float            # logit per time unit, through the training + validation blocks
    slope_se: float
    predicted_gap: float    # test level minus validation's, from the trend
    predicted_se: float
    observed_gap: float     # test level minus validation's, from the test labels
    observed_se: float
    message: str | None


def _trend(clicks: np.ndarray, sizes: np.ndarray, times: np.ndarray, blocks: int) -> tuple[float, float]:
    """Weighted line through the levels of ``blocks`` time blocks of equal impressions: slope and
    its standard error (widened by the residual dispersion beyond the blocks' own errors)."""
    order = np.argsort(times, kind="stable")
    clicks, sizes, times = clicks[order], sizes[order], times[order]
    cum = np.cumsum(sizes)
    cut = np.searchsorted(cum, cum[-1] * np.arange(1, blocks) / blocks, side="left") + 1
    parts = [p for p in np.split(np.arange(times.size), cut) if p.size]
    if len(parts) < 3:
        return 0.0, math.inf
    lv = [_level(clicks[p], sizes[p], times[p]) for p in parts]
    y = np.array([v.logit for v in lv])
    t = np.array([v.time for v in lv])
    w = 1.0 / np.array([v.se for v in lv]) ** 2
    tm = float((w * t).sum() / w.sum())
    sxx = float((w * (t - tm) ** 2).sum())
    if sxx <= 0:
        return 0.0, math.inf
    slope = float((w * (t - tm) * (y - (w * y).sum() / w.sum())).sum() / sxx)
    resid = y - (w * y).sum() / w.sum() - slope * (t - tm)
    dispersion = max(1.0, float((w * resid**2).sum()) / (len(lv) - 2))
    return slope, math.sqrt(dispersion / sxx)


def check_periods(train: ListData, val: ListData | None, test: ListData | None, *,
                  blocks: int = 8, z: float = 3.0, min_gap: float = 0.05) -> PeriodCheck | None:
    """Compare the click level the test period will have with what validation shows.

    Args:
        train, val, test: the splits, with request times (``ListData.time``).
        blocks: time blocks of the trend.
        z: how many standard errors a gap must exceed.
        min_gap: the smallest gap (logit) worth a warning (0.05: about 5 % of the click rate).

    Returns:
        A :class:`PeriodCheck` (its ``message`` says what validation cannot show, or is None);
        None when a split is empty or has no times.
    """
    splits = (train, val, test)
    if any(d is None or d.n_requests == 0 or d.time is None for d in splits):
        return None
    lv_train, lv_val, lv_test = (split_level(d) for d in splits)
    parts = [_per_request(d) for d in (train, val)]
    clicks = np.concatenate([p[0] for p in parts])
    sizes = np.concatenate([p[1] for p in parts])
    times = np.concatenate([d.time.numpy().astype(np.float64) for d in (train, val)])
    slope, slope_se = _trend(clicks, sizes, times, blocks)
    dt = lv_test.time - lv_val.time
    pred, pred_se = slope * dt, slope_se * abs(dt)
    obs, obs_se = lv_test.logit - lv_val.logit, math.hypot(lv_test.se, lv_val.se)
    notes = []
    if abs(pred) > min_gap and abs(pred) > z * pred_se:
        notes.append(f"the click level trends over the training period (slope {slope:+.3g} logit "
                     f"per time unit, {abs(slope) / slope_se:.1f} SE): at the test period's mean "
                     f"time it lies {pred:+.3f} logit from validation's ({pred_se:.3f} SE)")
    if abs(obs) > min_gap and abs(obs) > z * obs_se:
        notes.append(f"the test split's click rate ({_rate(lv_test):.4f}) differs from "
                     f"validation's ({_rate(lv_val):.4f}) by {obs:+.3f} logit ({abs(obs) / obs_se:.1f} SE)")
    message = None
    if notes:
        message = ("validation cannot show a level shift the test period has: " + "; ".join(notes)
                   + ". Early stopping, val/ metrics and calibrator=auto see validation's level, "
                   "so test PCOC and log loss will be off by about that much; a later validation "
                   "block (split.val_by: time) or the export's level trend (level_trend) follow a "
                   "trend, a one-off jump needs data from the new period")
    return PeriodCheck(lv_train, lv_val, lv_test, slope, slope_se, pred, pred_se, obs, obs_se, message)


def _rate(level: Level) -> float:
    return level.clicks / level.impressions if level.impressions else math.nan
