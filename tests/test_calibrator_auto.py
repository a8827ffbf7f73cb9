"""calibrator=auto: cross-fitted by request, keeps the identity unless a calibrator beats its noise."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hybridrank.serving.calibration import (
    AutoCalibrator,
    IdentityCalibrator,
    IsotonicCalibrator,
    PlattCalibrator,
    calibrator_from_dict,
)


def _requests(n_req: int, size: int, seed: int, distort=lambda z: z):
    """Logits and clicks of ``n_req`` requests of ``size`` impressions; clicks ~ σ(distort(z))."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n_req * size, generator=g) * 1.2 - 3.0
    y = (torch.rand(n_req * size, generator=g) < torch.sigmoid(distort(z))).double()
    groups = torch.arange(n_req * size) // size
    return z, y, groups


def _nll(p, y):
    p = p.clamp(1e-7, 1 - 1e-7)
    return float(-(y * torch.log(p) + (1 - y) * torch.log1p(-p)).mean())


def test_calibrated_model_on_a_small_split_keeps_the_identity():
    """100 requests of a well-calibrated model: adopting a calibrator is noise fitting; auto must
    rarely do it (the one-sided 2-SE rule: a few percent; bound it by a binomial tolerance)."""
    adopted = 0
    for seed in range(40):
        z, y, g = _requests(100, 10, seed)
        cal = AutoCalibrator().fit(z, y, groups=g)
        adopted += cal.chosen.name != "none"
        assert cal.decision["requests"] == 100
    assert adopted <= 6, adopted


def test_mis_scaled_model_gets_a_calibrator_that_helps_on_fresh_data():
    distort = lambda z: 0.4 * z - 0.8  # noqa: E731  (the model is over-confident and too high)
    z, y, g = _requests(2000, 10, seed=1, distort=distort)
    cal = AutoCalibrator().fit(z, y, groups=g)
    assert cal.chosen.name in ("platt", "isotonic")
    assert cal.decision["candidates"][cal.chosen.name]["passes"]
    zt, yt, _ = _requests(2000, 10, seed=2, distort=distort)
    assert _nll(cal.predict_proba(zt), yt) < _nll(torch.sigmoid(zt), yt) - 0.005


def test_cross_fitting_matches_a_loop_reference():
    """Fold assignment by request, out-of-fold predictions and the paired SE, recomputed by hand."""
    z, y, g = _requests(60, 7, seed=3, distort=lambda z: 0.6 * z)
    auto = AutoCalibrator(candidates=("platt",), folds=3, seed=5, min_clicks_per_param=0).fit(z, y, groups=g)
    n = 60
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(5))
    fold = torch.empty(n, dtype=torch.long)
    fold[perm] = torch.arange(n) % 3
    oof = torch.empty_like(z, dtype=torch.float64)
    for k in range(3):
        test = fold[g] == k
        oof[test] = PlattCalibrator().fit(z[~test], y[~test]).predict_proba(z[test])
    per_req = []
    for r in range(n):
        m = g == r
        base = -(y[m] * torch.log(torch.sigmoid(z[m].double())) +
                 (1 - y[m]) * torch.log1p(-torch.sigmoid(z[m].double()))).sum()
        p = oof[m].clamp(1e-7, 1 - 1e-7)
        loss = -(y[m] * torch.log(p) + (1 - y[m]) * torch.log1p(-p)).sum()
        per_req.append(float(base - loss))
    d = np.array(per_req)
    got = auto.decision["candidates"]["platt"]
    assert got["improvement"] == pytest.approx(d.sum() / z.numel(), rel=1e-9, abs=1e-12)
    assert got["se"] == pytest.approx(d.std(ddof=1) * math.sqrt(n) / z.numel(), rel=1e-9)
    assert got["passes"] == (got["improvement"] > 2 * got["se"])


def test_round_trip_and_portable_module():
    z, y, g = _requests(500, 8, seed=4, distort=lambda z: 2.0 * z + 2.0)
    cal = AutoCalibrator().fit(z, y, groups=g)
    back = calibrator_from_dict(cal.to_dict())
    assert isinstance(back, AutoCalibrator) and back.chosen.name == cal.chosen.name
    assert back.decision == cal.decision
    assert torch.allclose(back.predict_proba(z), cal.predict_proba(z))
    assert torch.allclose(cal.module()(z.double()), cal.chosen.module()(z.double()))
    assert isinstance(cal.chosen, PlattCalibrator | IsotonicCalibrator)


def test_bad_input():
    z, y, g = _requests(3, 4, seed=0)
    with pytest.raises(ValueError, match="3 request\\(s\\) cannot make 5 folds"):
        AutoCalibrator().fit(z, y, groups=g)
    with pytest.raises(ValueError, match="unknown candidates \\['sigmoid'\\]"):
        AutoCalibrator(candidates=("sigmoid",))
    with pytest.raises(ValueError, match="groups has 2 entries"):
        AutoCalibrator().fit(z, y, groups=torch.tensor([0, 1]))
    assert isinstance(AutoCalibrator().chosen, IdentityCalibrator)


# --- the rules that keep auto from making scores worse ---------------------------------------
def test_shift_is_the_one_parameter_maximum_likelihood():
    from scipy.optimize import minimize_scalar

    from hybridrank.serving.calibration import ShiftCalibrator

    z, y, _ = _requests(300, 10, seed=7, distort=lambda z: z + 0.7)
    b = ShiftCalibrator(l2=0.0).fit(z, y).b  # Newton to 1e-12

    def nll(t):  # float64: in float32 the log loss is flat to rounding over ~1e-4 of t
        return _nll(torch.sigmoid(z.double() + t), y)

    ref = minimize_scalar(nll, bounds=(-3, 3), method="bounded", options={"xatol": 1e-10}).x
    assert b == pytest.approx(ref, abs=2e-5)  # the bounded scalar search stops at ~1e-5 in b
    assert float((torch.sigmoid(z.double() + b) - y).sum()) == pytest.approx(0.0, abs=1e-8)  # score equation
    assert abs(b - 0.7) < 0.2  # within sampling error of the truth (~ 200 clicks)


def test_platt_slope_shrinks_toward_one_when_clicks_are_few():
    steep = lambda z: 2.0 * z + 3.0  # noqa: E731
    z, y, _ = _requests(20, 10, seed=8, distort=steep)      # a few dozen clicks
    free = PlattCalibrator(slope_prior_sd=None).fit(z, y).a
    shrunk = PlattCalibrator().fit(z, y).a
    assert abs(shrunk - 1) < abs(free - 1)
    z, y, _ = _requests(5000, 10, seed=9, distort=steep)    # thousands of clicks: the data win
    assert PlattCalibrator().fit(z, y).a == pytest.approx(PlattCalibrator(slope_prior_sd=None).fit(z, y).a,
                                                          rel=0.02)


def test_a_model_ranking_in_reverse_is_flagged_and_never_reversed():
    from hybridrank.serving.calibration import NotRankingError

    z, y, g = _requests(2000, 10, seed=10, distort=lambda z: -z - 6.0)   # clicks fall with the score
    with pytest.raises(NotRankingError, match="rank clicks in reverse"):
        PlattCalibrator().fit(z, y)
    auto = AutoCalibrator().fit(z, y, groups=g)
    assert auto.decision["ranking"]["verdict"].startswith("the scores rank this split's clicks WORSE")
    assert "refused" in auto.decision["candidates"]["platt"]
    assert "not ranking" in auto.describe()
    p = auto.predict_proba(z)
    order = torch.argsort(z)
    assert bool((p[order][1:] >= p[order][:-1] - 1e-12).all())  # monotone non-decreasing in z


def test_candidates_need_clicks_per_parameter():
    z, y, g = _requests(500, 6, seed=11, distort=lambda z: z - 0.3)
    clicks = float(y.sum())
    assert 100 <= clicks < 200, clicks
    auto = AutoCalibrator().fit(z, y, groups=g)
    cands = auto.decision["candidates"]
    assert "improvement" in cands["shift"]
    assert "refused" in cands["platt"] and "refused" in cands["isotonic"]


def test_a_calibration_split_unlike_the_scored_data_keeps_the_identity():
    from hybridrank.serving.calibration import compare_score_distributions

    distort = lambda z: 0.4 * z - 0.8  # noqa: E731
    z, y, g = _requests(2000, 10, seed=1, distort=distort)
    same, _, _ = _requests(2000, 10, seed=12)
    assert AutoCalibrator().fit(z, y, groups=g, reference=same, reference_requests=2000).chosen.name != "none"
    moved = AutoCalibrator().fit(z, y, groups=g, reference=same + 1.5, reference_requests=2000)
    assert moved.chosen.name == "none"
    assert moved.decision["resemblance"]["verdict"] == "differs"
    assert any("overruled" in c for c in moved.decision["candidates"].values())
    warn = AutoCalibrator(on_mismatch="warn").fit(z, y, groups=g, reference=same + 1.5, reference_requests=2000)
    assert warn.chosen.name != "none"
    # the check itself: a small sample of the same distribution resembles it
    r = compare_score_distributions(same[:3000], same[3000:], calibration_requests=300, scored_requests=1700)
    assert r["verdict"] == "resembles", r


def test_time_ordered_folds_predict_each_block_from_the_past():
    """With request times the folds are blocks of time, each predicted by a fit on the blocks
    before it; the first block is never scored. Recomputed by hand."""
    z, y, g = _requests(50, 8, seed=13, distort=lambda z: 0.6 * z)
    t = (49 - g).double()  # later requests first in storage: time order is the reverse
    auto = AutoCalibrator(candidates=("platt",), folds=3, min_clicks_per_param=0).fit(z, y, groups=g, order=t)
    rank = 49 - torch.arange(50)             # rank in time of request r
    fold = rank * 3 // 50
    oof = torch.empty_like(z, dtype=torch.float64)
    for k in (1, 2):
        train, test = fold[g] < k, fold[g] == k
        oof[test] = PlattCalibrator().fit(z[train], y[train]).predict_proba(z[test])
    ev = fold[g] > 0
    base = -(y * torch.log(torch.sigmoid(z.double())) + (1 - y) * torch.log1p(-torch.sigmoid(z.double())))
    p = oof.clamp(1e-7, 1 - 1e-7)
    loss = -(y * torch.log(p) + (1 - y) * torch.log1p(-p))
    assert auto.decision["candidates"]["platt"]["improvement"] == pytest.approx(
        float((base - loss)[ev].sum() / ev.sum()), rel=1e-9)
    assert "time blocks" in auto.decision["rule"]


def test_a_miscalibration_that_moves_with_time_is_not_carried_forward():
    """The model's level is off by +0.8 early in the split and by +0.1 late (drift): a map fitted
    on the split would carry the average gap into the next period. With request times auto sees
    the gap move between time blocks and keeps the identity; without them it cannot tell."""
    g = torch.Generator().manual_seed(14)
    n_req, size = 4000, 10
    z = torch.randn(n_req * size, generator=g) - 3.0
    req = torch.arange(n_req * size) // size
    t = req.double()                                    # stored in time order
    gap = 0.8 - 0.7 * t / n_req
    y = (torch.rand(n_req * size, generator=g) < torch.sigmoid(z + gap)).double()
    blind = AutoCalibrator().fit(z, y, groups=req)
    assert blind.chosen.name != "none"
    timed = AutoCalibrator().fit(z, y, groups=req, order=t)
    assert timed.chosen.name == "none"
    assert timed.decision["stability"]["stable"] is False
    assert "MOVING" in timed.describe()


def test_the_stability_test_reads_the_gaps_before_a_trend_already_applied():
    """The export adds its level trend to the logits before auto; auto's stability test must
    still see the model's own level moving (``moved``), else the detrended gaps look stable and a
    shift fitted on them is carried into the next period. Here the trend follows the drift exactly:
    handed the moved logits without ``moved``, auto sees a stable gap and adopts a calibrator;
    with ``moved`` it keeps the identity, as it does for the model's own logits."""
    g = torch.Generator().manual_seed(14)
    n_req, size = 4000, 10
    z = torch.randn(n_req * size, generator=g) - 3.0
    req = torch.arange(n_req * size) // size
    t = req.double()
    drift = 0.8 - 0.7 * t / n_req
    y = (torch.rand(n_req * size, generator=g) < torch.sigmoid(z + drift + 0.3)).double()
    trend = drift - drift.mean()                        # what a fitted trend adds, centred
    unaware = AutoCalibrator().fit(z + trend, y, groups=req, order=t)
    assert unaware.decision["stability"]["stable"] is True and unaware.chosen.name != "none"
    aware = AutoCalibrator().fit(z + trend, y, groups=req, order=t, moved=trend)
    assert aware.decision["stability"]["stable"] is False and aware.chosen.name == "none"
    own = AutoCalibrator().fit(z, y, groups=req, order=t)
    assert own.decision["stability"]["p_value"] == pytest.approx(aware.decision["stability"]["p_value"])


def test_a_level_trend_already_applied_keeps_the_identity():
    """When the export follows a level trend (``moved`` varies with time), its test already found
    the click level moving on more rows than the calibration split holds: ``auto`` keeps the
    identity even where the split's own Q test reads the gap as stable, and says why. Here the
    model is off by a constant 0.4 logit (Q stable), so a calibrator would pass; a constant
    ``moved`` (no trend) changes nothing."""
    g = torch.Generator().manual_seed(15)
    n_req, size = 3000, 10
    z = torch.randn(n_req * size, generator=g) - 3.0
    req = torch.arange(n_req * size) // size
    t = req.double()
    y = (torch.rand(n_req * size, generator=g) < torch.sigmoid(z - 0.4)).double()
    plain = AutoCalibrator().fit(z, y, groups=req, order=t, moved=torch.zeros_like(z))
    assert plain.decision["stability"]["stable"] is True
    assert plain.decision["stability"]["level_trend_applied"] is False
    assert plain.chosen.name != "none"
    trend = 1e-6 * (t - t.mean())                       # tiny, but a trend: the level moves
    kept = AutoCalibrator().fit(z + trend, y, groups=req, order=t, moved=trend)
    assert kept.decision["stability"]["stable"] is True
    assert kept.decision["stability"]["level_trend_applied"] is True
    assert kept.chosen.name == "none"
    overruled = [c["overruled"] for c in kept.decision["candidates"].values() if "overruled" in c]
    assert overruled and "level trend" in overruled[0]
    assert "follows a level trend" in kept.describe()
    # without request times there are no time blocks, and a trend cannot vary: nothing changes
    untimed = AutoCalibrator().fit(z, y, groups=req)
    assert untimed.chosen.name != "none" and untimed.decision["stability"] is None


def test_auto_says_when_the_level_trends_over_the_calibration_split():
    """Requests in time order whose click level rises 0.6 logit over the split: ``auto`` keeps
    the stability evidence with its trend in the decision and says TRENDING on its console line;
    the same requests without the drift do not."""
    z, y, g = _requests(20_000, 5, seed=9)
    t = g.double()                                         # request order = time order
    drift = 0.6 * t / float(t.max())
    y_drift = (torch.rand(len(z), generator=torch.Generator().manual_seed(10))
               < torch.sigmoid(z + drift)).double()
    moving = AutoCalibrator().fit(z, y_drift, groups=g, order=t)
    st = moving.decision["stability"]
    assert st["trending"] is True and st["trend"] > 0, st
    assert "level TRENDING" in moving.describe()
    steady = AutoCalibrator().fit(z, y, groups=g, order=t)
    assert steady.decision["stability"]["trending"] is False
    assert "TRENDING" not in steady.describe()
