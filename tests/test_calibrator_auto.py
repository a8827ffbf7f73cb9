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
    auto = AutoCalibrator(candidates=("platt",), folds=3, seed=5).fit(z, y, groups=g)
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
