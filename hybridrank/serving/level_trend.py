"""The click level's trend over time: what a time-blind model's pCTR misses after its log ends.

A model that does not see time learns the average click level of its training period. When the
level drifts one way (a campaign ramping up, a season, a growing audience), the pCTR an auction
reads after the log is off by the drift since that average: on 60 randomly built logs with a
linear drift of 0.1-0.5 logit over the log, a perfect time-blind model's PCOC at slot 1 on the
next period ranged 0.64-1.60 (docs/BENCHMARKS.md, "Level drift").

:func:`fit_level_trend` tests for such a trend on the rows before the scored period and, only when
the evidence says the level moves along a straight line, returns a :class:`LevelTrend` whose
:meth:`~LevelTrend.shift` moves each scored row's logit to the level the line forecasts at that
row's time. The test, on the model's click logits and the clicks, per block of ``block_seconds``
(one day by default):

1. the level gap of every block (:func:`block_gaps`: the logit shift that matches the block's
   observed clicks, with its variance);
2. the inverse-variance weighted regression of the gaps on time **and a weekly cycle** (the
   week's first harmonic: two parameters), so that a level that rises and falls with the week is
   not read as a trend; the slope is the trend net of the cycle. A trained model's own errors
   vary from day to day, so the gaps scatter more than their binomial noise: when the residual
   chi-square says so (5 %), its ratio to the degrees of freedom (``phi``) widens the slope's
   standard error by ``sqrt(phi)`` (quasi-likelihood);
3. the slope must differ from zero at ``alpha`` (two-sided, 1 % by default).

With fewer than two degrees of freedom left for the cycle (a log of a few days), the line alone
is fitted and must also fit (its lack of fit not significant at ``fit_alpha``, 5 %).

Why not simply follow the line: on 60 weekly-cycling worlds a straight line through the days
raised the RMS log PCOC from 0.109 to 0.128 (small) and 0.133 (400k impressions); with the cycle
in the regression the trend never fired there. Why the overdispersion: on trained models with
many clicks per day (400k impressions at 8.7 and 10.5 % CTR) a plain lack-of-fit test refused
true linear drifts because of the model's day-to-day scatter (docs/BENCHMARKS.md, "Level
drift").

The forecast is clamped: a row later than the end of the log by more than ``max_horizon`` times
the log's span gets the level at that limit, and a row earlier than the log's start the level at
its start. A row without a time (scored data without a time column, a portable model) gets the
level at the end of the log.

Every number of the decision is in :meth:`LevelTrend.to_dict` (export metadata) and
:meth:`LevelTrend.describe` (one console line).

The same gaps over the time blocks of a calibration split give :func:`level_stability`, the test
``calibrator=auto`` reads before carrying a fitted map into another period
(:mod:`hybridrank.serving.calibration.rules`).

>>> g = torch.Generator().manual_seed(0)
>>> t = torch.arange(40_000, dtype=torch.float64) * 60.0          # 40,000 minutes: ~28 days
>>> drift = 0.4 * (t / t.max() - 0.5)                              # +0.4 logit over the log
>>> y = (torch.rand(40_000, generator=g) < torch.sigmoid(-2.0 + drift)).double()
>>> trend = fit_level_trend(torch.full((40_000,), -2.0), y, t)
>>> trend.applied, abs(trend.slope_per_day * float(t.max()) / DAY_SECONDS - 0.4) < 0.1
(True, True)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["LevelTrend", "fit_level_trend", "model_level_trend", "block_gaps", "weighted_line",
           "level_stability", "DAY_SECONDS"]

DAY_SECONDS = 86_400.0


def block_gaps(logits: Tensor, clicks: Tensor, weights: Tensor, block: Tensor, n_blocks: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The level gap of every non-empty block: the logit shift that matches its clicks.

    ``g_k`` solves ``Σ_i w_i σ(z_i + g_k) = (Y_k + ½) N_k / (N_k + 1)`` over the block's rows (the
    observed clicks with half a click and half a non-click added, so a block without clicks
    gets a finite gap), by safeguarded Newton steps; its variance is the inverse information
    ``1 / Σ_i w_i σ(z_i + g_k) (1 - σ(z_i + g_k))`` (``Y`` clicks, ``N`` impressions, all weighted).
    This is the shift a level trend applies to every row's logit. The one-step form
    ``logit(Y/N) - logit(P/N)`` (``P = Σ σ(z)``) equals it when the block's logits are all equal,
    and falls short of it when they spread: averaging probabilities flattens a logit shift by
    ``1 - Var(p) / (p̄ (1 - p̄))``. At a 12 % click rate with logits of sd 1.4 a linear drift's
    slope came out 0.83 of the truth that way, and trained models on randomly built 400k logs at
    12 % CTR read 0.53-0.64 of it (docs/BENCHMARKS.md, "Following the trend"). Returns the blocks'
    indices, gaps and variances (float64).

    >>> z = torch.full((200,), -2.0); y = torch.zeros(200); y[:30] = 1
    >>> k, g, v = block_gaps(z, y, torch.ones(200), torch.arange(200) // 100, 2)
    >>> k.tolist(), [round(float(x), 2) for x in g]
    ([0, 1], [1.16, -3.3])
    """
    z = logits.double()
    w = weights.double()
    b = block.long()

    def per_block(x: Tensor) -> Tensor:
        return torch.zeros(n_blocks, dtype=torch.float64).index_add_(0, b, x)

    n, yk = per_block(w), per_block(w * clicks.double())
    seen = torch.nonzero(n > 0).reshape(-1)
    target = (yk + 0.5) * n / (n + 1.0)
    # start from the shift that would be exact if the block's logits were all equal to their
    # mean (finite however far the logits sit in a tail), then Newton steps on the increasing
    # sum, each capped at one logit
    gap = torch.zeros(n_blocks, dtype=torch.float64)
    zbar = per_block(w * z)[seen] / n[seen]
    gap[seen] = torch.log(target[seen] / (n[seen] - target[seen])) - zbar
    for _ in range(200):
        p = torch.sigmoid(z + gap[b])
        step = ((per_block(w * p) - target) / per_block(w * p * (1 - p)).clamp(min=1e-300))[seen]
        gap[seen] -= step.clamp(-1.0, 1.0)
        if seen.numel() == 0 or float(step.abs().max()) < 1e-10:
            break
    else:  # pragma: no cover - the sum is monotone in the gap and every step is capped
        raise RuntimeError("block_gaps: the per-block logit shift did not converge")
    p = torch.sigmoid(z + gap[b])
    info = per_block(w * p * (1 - p))
    return seen.numpy(), gap[seen].numpy(), (1.0 / info[seen].clamp(min=1e-300)).numpy()


def weighted_line(t: np.ndarray, g: np.ndarray, v: np.ndarray) -> dict[str, float]:
    """The inverse-variance weighted straight line ``g ≈ mean + slope (t - t̄)`` and its tests.

    Returns ``t_mean`` (``t̄``, the weighted mean of ``t``), ``mean``, ``slope``, ``slope_se``,
    ``slope_p`` (``χ²(1)`` of ``(slope / se)²``), the total heterogeneity ``q`` (Cochran's Q about
    the mean, ``χ²(K - 1)``), ``q_p``, and the residual chi-square about the line ``resid_q``
    (``χ²(K - 2)``) with ``resid_p`` (the line's lack of fit; 1 with two points). Needs two
    distinct ``t`` at least.

    >>> r = weighted_line(np.arange(5.0), 0.1 * np.arange(5.0), np.full(5, 0.01))
    >>> round(r["slope"], 6), round(r["resid_q"], 6)
    (0.1, 0.0)
    """
    from scipy.stats import chi2

    t, g, v = (np.asarray(x, dtype=np.float64) for x in (t, g, v))
    w = 1.0 / v
    t_mean = float((w * t).sum() / w.sum())
    k = len(g)
    coef, resid_q, rank, cov = _wls(np.stack([np.ones(k), t - t_mean], 1), g, v)
    if rank < 2:
        raise ValueError("weighted_line needs two distinct times")
    mean = float((w * g).sum() / w.sum())   # = coef[0]: the centred time is orthogonal to 1
    slope, se = float(coef[1]), math.sqrt(float(cov[1, 1]))
    q = float((w * (g - mean) ** 2).sum())
    return {"t_mean": t_mean, "mean": mean, "slope": slope, "slope_se": se,
            "slope_p": float(chi2.sf((slope / se) ** 2, 1)), "q": q,
            "q_p": float(chi2.sf(q, k - 1)) if k > 1 else 1.0, "resid_q": resid_q,
            "resid_p": float(chi2.sf(resid_q, k - 2)) if k > 2 else 1.0}


def level_stability(logits: Tensor, clicks: Tensor, weights: Tensor, block: Tensor,
                    n_blocks: int, alpha: float = 0.05) -> dict[str, Any]:
    """Is the model's miscalibration the same over time? Cochran's Q over time blocks.

    Per block ``k`` the level gap ``g_k``, the logit shift that matches the block's observed
    clicks, with its variance ``var_k`` (:func:`block_gaps`); ``Q = Σ (g_k - ḡ)² / var_k`` (``ḡ``
    the inverse-variance mean) is ``χ²(K - 1)`` when the gap is constant. A small p-value says the
    gap moves with time: a map fitted on this split would carry one period's gap into another.
    With three blocks or more, its one-degree-of-freedom part along time is reported too:
    ``trend`` (the inverse-variance weighted slope of the gap on the block's order, logit per
    block), ``trend_se``, ``trend_p`` (``χ²(1)``) and ``trending`` (``trend_p < alpha``). It is
    reported, it decides nothing: a level that drifts one way is what a time-blind model's pCTR
    misses after the log ends.

    Args:
        logits, clicks, weights: ``[N]`` the model's click logits, 0/1 labels, row weights.
        block: ``[N]`` each row's time block, ``0 <= block < n_blocks``.
        n_blocks: the number of blocks (an empty one is skipped, not counted).
        alpha: the level of both tests.

    Returns:
        ``{"stable": None, "blocks": K}`` with fewer than two non-empty blocks; else ``stable``
        (``p_value >= alpha``), ``q``, ``p_value``, the ``gaps`` (rounded to 1e-4) and ``blocks``,
        plus the trend's four keys from three blocks on.

    >>> z = torch.zeros(4000); y = (torch.arange(4000) % 10 == 0).double()
    >>> level_stability(z - 2.2, y, torch.ones(4000), torch.arange(4000) // 1000, 4)["stable"]
    True
    """
    seen, g, v = block_gaps(logits, clicks, weights, block, n_blocks)
    if len(g) < 2:
        return {"stable": None, "blocks": len(g)}
    # the blocks' own order (an empty one is skipped); with three blocks or more, the slope of
    # the gap along it is the one-degree-of-freedom part of Q that a one-way drift concentrates in
    line = weighted_line(seen.astype(np.float64), g, v)
    q, pval = line["q"], line["q_p"]
    out = {"stable": pval >= alpha, "q": q, "p_value": pval, "gaps": [round(float(x), 4) for x in g],
           "blocks": len(g)}
    if len(g) >= 3:
        out.update(trend=line["slope"], trend_se=line["slope_se"], trend_p=line["slope_p"],
                   trending=line["slope_p"] < alpha)
    return out


def _wls(x: np.ndarray, g: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, float, int, np.ndarray]:
    """Weighted least squares of ``g`` on the columns of ``x`` (weights ``1/v``): coefficients,
    residual chi-square, rank and ``(X' W X)^-1`` (pseudo-inverse where rank-deficient)."""
    sw = 1.0 / np.sqrt(v)
    a = x * sw[:, None]
    beta, _, rank, _ = np.linalg.lstsq(a, g * sw, rcond=None)
    r = g * sw - a @ beta
    return beta, float(r @ r), int(rank), np.linalg.pinv(a.T @ a)


def _trend_test(t: np.ndarray, g: np.ndarray, v: np.ndarray, cycle_seconds: float | None,
                over_alpha: float = 0.05) -> dict[str, Any]:
    """The slope of the gaps ``g`` (variances ``v``) over the times ``t`` (seconds), its test
    widened by the overdispersion, and the check of a cycle against the line (module docstring)."""
    from scipy.stats import chi2, f, norm

    k = len(g)
    w = 1.0 / v
    t_mean = float((w * t).sum() / w.sum())
    d = (t - t_mean) / DAY_SECONDS
    line, q_line, rank_line, cov_line = _wls(np.stack([np.ones(k), d], 1), g, v)
    df = extra = 0
    if cycle_seconds is not None:
        phase = 2 * np.pi * t / cycle_seconds
        rich, q_rich, rank_rich, cov_rich = _wls(np.stack([np.ones(k), d, np.sin(phase), np.cos(phase)], 1),
                                                 g, v)
        df, extra = k - rank_rich, rank_rich - rank_line
    phi = 1.0
    if df >= 2 and extra > 0:
        if float(chi2.sf(q_rich, df)) < over_alpha:  # scatter beyond the binomial noise
            phi = q_rich / df
        stat = max(q_line - q_rich, 0.0) / extra
        cycle_p = float(f.sf(stat / phi, extra, df)) if phi > 1 else float(chi2.sf(stat * extra, extra))
        check = ("weekly cycle" if cycle_seconds == 7 * DAY_SECONDS
                 else f"cycle of {cycle_seconds / DAY_SECONDS:g} days")
        slope, var = float(rich[1]), float(cov_rich[1, 1])
    else:
        cycle_p = float(chi2.sf(q_line, k - 2)) if k > 2 else 1.0
        check, slope, var = "lack of fit", float(line[1]), float(cov_line[1, 1])
    se = math.sqrt(var * phi)
    return {"t_mean": t_mean, "slope_per_day": slope, "slope_se_per_day": se,
            "slope_p": float(2 * norm.sf(abs(slope) / se)), "phi": phi, "cycle_p": cycle_p,
            "check": check, "line_q": q_line}


@dataclass
class LevelTrend:
    """A fitted level trend: ``shift(t) = slope · (clamp(t) - origin)`` logits when ``applied``.

    Attributes:
        applied: whether scored rows are moved (the tests passed); otherwise every shift is 0.
        slope: logit per second (0 when not applied).
        origin: the time at which the line meets the training level (the weighted mean time of
            the blocks; the model's in-sample level is the average over the log).
        start, end: the first and last time of the rows tested (seconds).
        max_horizon: how far past ``end`` the line is followed, as a share of ``end - start``.
        verdict: one sentence: what was decided and why.
        evidence: the numbers behind it (blocks, gaps, the line's tests).
    """

    applied: bool = False
    slope: float = 0.0
    origin: float = 0.0
    start: float = 0.0
    end: float = 0.0
    max_horizon: float = 0.25
    verdict: str = "not fitted"
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def slope_per_day(self) -> float:
        return self.slope * DAY_SECONDS

    @property
    def limit(self) -> float:
        """The latest time the line is followed to."""
        return self.end + self.max_horizon * (self.end - self.start)

    def shift(self, time: Tensor | None, n: int | None = None) -> Tensor | float:
        """Logit shift of rows at ``time`` (``[N]`` seconds, float64 result); ``time=None``: the
        shift at the end of the log (a float, or ``[n]`` copies of it)."""
        if not self.applied:
            return 0.0 if time is None and n is None else torch.zeros(
                n if time is None else time.numel(), dtype=torch.float64)
        if time is None:
            s = self.slope * (self.end - self.origin)
            return s if n is None else torch.full((n,), s, dtype=torch.float64)
        t = torch.as_tensor(time).double().clamp(self.start, self.limit)
        return self.slope * (t - self.origin)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["slope_per_day"] = self.slope_per_day
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LevelTrend:
        keys = ("applied", "slope", "origin", "start", "end", "max_horizon", "verdict", "evidence")
        return cls(**{k: d[k] for k in keys if k in d})

    def describe(self) -> str:
        """One console line."""
        if not self.applied:
            return f"level trend: none applied ({self.verdict})"
        return (f"level trend: {self.slope_per_day:+.4f} logit/day applied to scored rows "
                f"(at the end of the log {self.shift(None):+.3f}; {self.verdict})")


def fit_level_trend(logits: Tensor, clicks: Tensor, time: Tensor | None, weights: Tensor | None = None,
                    *, block_seconds: float = DAY_SECONDS, alpha: float = 0.01, fit_alpha: float = 0.05,
                    min_blocks: int = 4, max_horizon: float = 0.25,
                    cycle_seconds: float | None = 7 * DAY_SECONDS) -> LevelTrend:
    """Test the rows for a straight-line trend of the click level and fit it (module docstring).

    Args:
        logits: ``[N]`` the model's click logits where the clicks were drawn (at the logged slot
            for a model with a position tower), after any downsampling correction.
        clicks: ``[N]`` 0/1 labels.
        time: ``[N]`` each row's time in seconds (its request's), or None (nothing to test).
        weights: ``[N]`` row weights (default 1).
        block_seconds: the width of a block (one day: a day averages the hours' cycle).
        alpha: the slope's two-sided significance level.
        fit_alpha: on a log too short for the cycle, the line is refused when its lack of fit
            is significant at this level.
        min_blocks: fewer non-empty blocks than this: too short to tell a trend.
        max_horizon: how far past the log's end the line is followed (share of its span).
        cycle_seconds: the period of the cycle regressed out beside the line (a week); None:
            the line alone, with its lack of fit checked, at any length.

    Returns:
        A :class:`LevelTrend` (``applied`` False unless both tests pass).
    """
    if not 0 < alpha < 1 or not 0 < fit_alpha < 1:
        raise ValueError(f"level trend: alpha and fit_alpha must lie in (0, 1), got {alpha}, {fit_alpha}")
    if not block_seconds > 0:
        raise ValueError(f"level trend: block_seconds must be > 0, got {block_seconds}")
    if max_horizon < 0:
        raise ValueError(f"level trend: max_horizon must be >= 0, got {max_horizon}")
    if cycle_seconds is not None and not cycle_seconds > 0:
        raise ValueError(f"level trend: cycle_seconds must be > 0, got {cycle_seconds}")
    if int(min_blocks) < 3:
        raise ValueError(f"level trend: min_blocks must be >= 3 (a line and its fit), got {min_blocks}")
    base = {"max_horizon": float(max_horizon)}
    if time is None:
        return LevelTrend(verdict="the rows carry no time", **base)
    z = torch.as_tensor(logits).reshape(-1).double()
    y = torch.as_tensor(clicks).reshape(-1).double()
    t = torch.as_tensor(time).reshape(-1).double()
    w = torch.ones_like(z) if weights is None else torch.as_tensor(weights).reshape(-1).double()
    if not z.numel() == y.numel() == t.numel() == w.numel():
        raise ValueError(f"level trend: logits, clicks, time and weights differ in length "
                         f"({z.numel()}, {y.numel()}, {t.numel()}, {w.numel()})")
    if z.numel() == 0:
        return LevelTrend(verdict="no rows", **base)
    if not bool(torch.isfinite(t).all()):
        raise ValueError("level trend: time holds NaN or infinite values")
    start, end = float(t.min()), float(t.max())
    base.update(start=start, end=end)
    block = torch.floor((t - start) / float(block_seconds)).long()
    n_blocks = int(block.max()) + 1
    seen, gaps, var = block_gaps(z, y, w, block, n_blocks)
    # each block's time: its rows' weighted mean
    tsum = torch.zeros(n_blocks, dtype=torch.float64).index_add_(0, block, w * t).numpy()
    wsum = torch.zeros(n_blocks, dtype=torch.float64).index_add_(0, block, w).numpy()
    tb = tsum[seen] / wsum[seen]
    evidence: dict[str, Any] = {"block_seconds": float(block_seconds), "blocks": int(seen.size),
                                "clicks": float((w * y).sum()), "alpha": alpha, "fit_alpha": fit_alpha}
    if seen.size < int(min_blocks):
        return LevelTrend(verdict=f"{seen.size} block(s) of {block_seconds:g} s: too short to tell a "
                                  f"trend (needs {int(min_blocks)})", evidence=evidence, **base)
    test = _trend_test(tb, gaps, var, None if cycle_seconds is None else float(cycle_seconds))
    evidence.update(test)
    evidence["gaps"] = [round(float(x), 4) for x in gaps]
    if test["slope_p"] >= alpha:
        verdict = f"no trend: slope p = {test['slope_p']:.3g} >= {alpha:g}"
    elif test["check"] == "lack of fit" and test["cycle_p"] < fit_alpha:  # a short log: the line alone
        verdict = (f"the level moves but not along a line ({test['check']} p = {test['cycle_p']:.3g} "
                   f"< {fit_alpha:g}): not extrapolated")
    else:
        return LevelTrend(applied=True, slope=test["slope_per_day"] / DAY_SECONDS, origin=test["t_mean"],
                          verdict=(f"slope p = {test['slope_p']:.3g}, {test['check']} p = "
                                   f"{test['cycle_p']:.3g}, overdispersion {test['phi']:.2f}, "
                                   f"{seen.size} blocks"),
                          evidence=evidence, **base)
    return LevelTrend(verdict=verdict, evidence=evidence, **base)


def model_level_trend(model, chunks, shift: float = 0.0, **options: Any) -> LevelTrend:
    """:func:`fit_level_trend` of a model on whole requests: its click logits where the clicks were
    drawn (at the logged slot for a position tower; ``model.predict_split(data,
    at_logged_position=True)``) plus ``shift`` (a downsampling correction), against the labels,
    at each impression's request time. ``chunks``: ``ListData`` pieces (e.g. the training and
    validation splits); one without a time gives no trend. ``options``: as
    :func:`fit_level_trend`."""
    zs, ys, ts = [], [], []
    for data in chunks:
        if data.time is None:
            return LevelTrend(verdict="the data has no time column",
                              max_horizon=float(options.get("max_horizon", 0.25)))
        zs.append(model.predict_split(data, at_logged_position=True)[0].double() + shift)
        ys.append(data.label.double())
        ts.append(data.time[data.request_of_row()].double())
    if not zs:
        return LevelTrend(verdict="no rows", max_horizon=float(options.get("max_horizon", 0.25)))
    return fit_level_trend(torch.cat(zs), torch.cat(ys), torch.cat(ts), **options)
