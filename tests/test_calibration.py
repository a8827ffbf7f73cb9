"""Post-hoc calibrators and the negative-downsampling correction (pure, fast)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from hybridrank.metrics.calibration import ece, pcoc
from hybridrank.serving.calibration import (
    IdentityCalibrator,
    IsotonicCalibrator,
    PlattCalibrator,
    calibrator_from_dict,
    correction_shift,
    downsampling_correction,
    resolve_correction,
)


def known_truth(n: int = 40_000, seed: int = 0):
    """True logits around a 3 % CTR, and clicks drawn from them."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(n, generator=g, dtype=torch.float64) * 1.2 - 3.6
    y = (torch.rand(n, generator=g, dtype=torch.float64) < torch.sigmoid(t)).double()
    return t, y


# --- downsampling correction -------------------------------------------------------------------
def test_correction_by_hand():
    # q = p / (p + (1 - p) / w)
    assert downsampling_correction(0.5, 0.1) == pytest.approx(0.5 / (0.5 + 0.5 / 0.1))  # 1/11
    assert downsampling_correction(0.2, 0.5) == pytest.approx(0.2 / 1.8)
    assert downsampling_correction(0.3, 1.0) == pytest.approx(0.3)
    p = torch.tensor([0.01, 0.2, 0.9], dtype=torch.float64)
    q = downsampling_correction(p, 0.25)
    # the same correction as a logit shift by log(w)
    z = torch.logit(p)
    assert torch.allclose(q, torch.sigmoid(z + correction_shift(0.25)), atol=1e-12)
    with pytest.raises(ValueError, match="keep rate"):
        downsampling_correction(0.5, 0.0)
    with pytest.raises(ValueError, match="keep rate"):
        correction_shift(1.5)


@pytest.mark.parametrize(("mode", "w", "reweighted", "expected"), [
    ("auto", 1.0, False, False),     # nothing dropped
    ("auto", 0.2, True, False),      # dropped, but the loss re-weighted the kept negatives
    ("auto", 0.2, False, True),      # dropped and not re-weighted: correct
    ("always", 0.2, True, True),
    ("always", 1.0, False, False),   # nothing to correct
    ("never", 0.2, False, False),
])
def test_resolve_correction(mode, w, reweighted, expected):
    assert resolve_correction(mode, w, reweighted) is expected


def test_resolve_correction_rejects_unknown_mode():
    with pytest.raises(ValueError, match="auto"):
        resolve_correction("sometimes", 0.5, False)


def test_correction_restores_pcoc_after_downsampling():
    """Drop negatives at rate w, fit logistic regression unweighted, correct: PCOC back near 1."""
    g = torch.Generator().manual_seed(1)
    n, w = 200_000, 0.1
    x = torch.randn(n, generator=g, dtype=torch.float64)
    y = (torch.rand(n, generator=g, dtype=torch.float64) < torch.sigmoid(-3.5 + 1.2 * x)).double()
    keep = (y > 0) | (torch.rand(n, generator=g, dtype=torch.float64) < w)
    # a two-parameter logistic regression on x is exactly Platt scaling of the "logit" x
    model = PlattCalibrator().fit(x[keep], y[keep])
    p = model.predict_proba(x)
    assert float(pcoc(p, y)) > 3.0  # inflated by about 1 / w in odds
    q = downsampling_correction(p, w)
    assert float(pcoc(q, y)) == pytest.approx(1.0, abs=0.06)
    assert model.a == pytest.approx(1.2, abs=0.1)  # the slope is unaffected by downsampling


# --- calibrators ------------------------------------------------------------------------------
@pytest.mark.parametrize("cal", [PlattCalibrator, IsotonicCalibrator])
def test_calibrators_fix_a_misscaled_model(cal):
    t, y = known_truth()
    z = 3 * t + 1  # over-confident and biased
    half = t.numel() // 2
    c = cal().fit(z[:half], y[:half])
    before = float(ece(torch.sigmoid(z[half:]), y[half:]))
    after = float(ece(c.predict_proba(z[half:]), y[half:]))
    oracle = float(ece(torch.sigmoid(t[half:]), y[half:]))
    assert before > 0.02
    assert after < 0.5 * before
    assert after < oracle + 0.01
    assert float(pcoc(c.predict_proba(z[half:]), y[half:])) == pytest.approx(1.0, abs=0.1)


def test_platt_recovers_the_scaling():
    t, y = known_truth(100_000)
    c = PlattCalibrator().fit(3 * t + 1, y)
    # sigma(a (3t + 1) + b) = sigma(t)  =>  a = 1/3, b = -1/3
    assert c.a == pytest.approx(1 / 3, abs=0.03)
    assert c.b == pytest.approx(-1 / 3, abs=0.15)


def test_platt_matches_sklearn():
    sk = pytest.importorskip("sklearn.linear_model")
    t, y = known_truth(20_000, seed=3)
    z = 2 * t - 0.5
    c = PlattCalibrator(l2=0.0, slope_prior_sd=None).fit(z, y)
    ref = sk.LogisticRegression(C=1e10, tol=1e-10, max_iter=1000).fit(z.numpy()[:, None], y.numpy())
    assert c.a == pytest.approx(float(ref.coef_[0, 0]), rel=1e-3)
    assert c.b == pytest.approx(float(ref.intercept_[0]), abs=1e-3)


def test_isotonic_blocks_match_sklearn():
    iso_mod = pytest.importorskip("sklearn.isotonic")
    t, y = known_truth(5_000, seed=4)
    c = IsotonicCalibrator(eps=0.0).fit(t, y)
    # knot values strictly increase, and at each block centre equal sklearn's fitted step value
    assert bool((c.y[1:] > c.y[:-1]).all())
    ref = iso_mod.IsotonicRegression(out_of_bounds="clip").fit(t.numpy(), y.numpy())
    assert torch.allclose(c.y, torch.from_numpy(ref.predict(c.x.numpy())), atol=1e-9)
    # the weighted mean of the knots is the click rate (PAV preserves sums)
    p = c.predict_proba(t)
    assert bool((p[torch.argsort(t)].diff() >= -1e-12).all())  # monotone


def _loop_isotonic_knots(z, y, w):
    """Brute-force reference: sort, aggregate equal logits, pool adjacent violators with a list
    (a block joins its predecessor while the predecessor's rate is not strictly lower)."""
    agg = {}
    for zi, yi, wi in zip(z.tolist(), y.tolist(), w.tolist()):
        if wi > 0:
            s = agg.setdefault(zi, [0.0, 0.0])
            s[0] += wi
            s[1] += wi * (yi > 0)
    blocks = []  # [weight, clicks, weight * logit]
    for zi in sorted(agg):
        cur = [agg[zi][0], agg[zi][1], agg[zi][0] * zi]
        while blocks and blocks[-1][1] / blocks[-1][0] >= cur[1] / cur[0]:
            prev = blocks.pop()
            cur = [cur[0] + prev[0], cur[1] + prev[1], cur[2] + prev[2]]
        blocks.append(cur)
    return [b[2] / b[0] for b in blocks], [b[1] / b[0] for b in blocks]


@pytest.mark.parametrize("grid", [None, 0.05])
def test_isotonic_knots_match_loop_pav(grid):
    t, y = known_truth(4_000, seed=8)
    if grid:  # many tied logits
        t = torch.round(t / grid) * grid
    w = torch.rand(t.numel(), generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 3
    w[::17] = 0.0  # zero weights are dropped
    c = IsotonicCalibrator().fit(t, y, weights=w)
    x_ref, y_ref = _loop_isotonic_knots(t, y, w)
    assert c.n_knots == len(x_ref)
    assert torch.allclose(c.x, torch.tensor(x_ref, dtype=torch.float64), rtol=0, atol=1e-9)
    assert torch.allclose(c.y, torch.tensor(y_ref, dtype=torch.float64), rtol=0, atol=1e-12)
    assert bool((c.y[1:] > c.y[:-1]).all())


def test_isotonic_interpolates_and_clips():
    c = IsotonicCalibrator(eps=0.01, x=[0.0, 1.0, 3.0], y=[0.0, 0.5, 1.0])
    p = c.predict_proba(torch.tensor([-5.0, 0.0, 0.5, 1.0, 2.0, 3.0, 9.0]))
    assert p.tolist() == pytest.approx([0.01, 0.01, 0.25, 0.5, 0.75, 0.99, 0.99])
    single = IsotonicCalibrator(x=[0.3], y=[0.2])
    assert single.predict_proba(torch.tensor([-1.0, 5.0])).tolist() == pytest.approx([0.2, 0.2])


def test_weights_act_as_repeats():
    t, y = known_truth(3_000, seed=5)
    w = torch.randint(1, 4, (t.numel(),), generator=torch.Generator().manual_seed(0)).double()
    rep = torch.repeat_interleave(torch.arange(t.numel()), w.long())
    for cal in (PlattCalibrator, IsotonicCalibrator):
        a = cal().fit(t, y, weights=w).predict_proba(t)
        b = cal().fit(t[rep], y[rep]).predict_proba(t)
        assert torch.allclose(a, b, atol=1e-7)


@pytest.mark.parametrize("cal", [IdentityCalibrator, PlattCalibrator, IsotonicCalibrator])
def test_dict_round_trip_and_module(cal):
    t, y = known_truth(4_000, seed=6)
    c = cal().fit(2 * t, y)
    d = json.loads(json.dumps(c.to_dict()))
    assert d["name"] == c.name
    back = calibrator_from_dict(d)
    z = torch.linspace(-10, 4, 57, dtype=torch.float64)
    assert torch.allclose(back.predict_proba(z), c.predict_proba(z), atol=1e-12)
    # the module (what exports embed) agrees in float32 too
    m = c.module().float()
    assert torch.allclose(m(z.float()).double(), c.predict_proba(z), atol=1e-6)


def test_fit_errors_are_clear():
    with pytest.raises(ValueError, match="both clicks and non-clicks"):
        PlattCalibrator().fit(torch.randn(10), torch.zeros(10))
    with pytest.raises(ValueError, match="differ in length"):
        IsotonicCalibrator().fit(torch.randn(10), torch.zeros(9))
    with pytest.raises(ValueError, match="non-finite"):
        IsotonicCalibrator().fit(torch.tensor([0.0, math.nan]), torch.tensor([0.0, 1.0]))
    with pytest.raises(RuntimeError, match="not fitted"):
        IsotonicCalibrator().module()
    with pytest.raises(ValueError, match="unknown calibrator"):
        calibrator_from_dict({"name": "beta"})
