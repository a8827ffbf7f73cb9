"""Request-level bootstrap: point estimates, replicates vs a brute-force loop, coverage, paired test."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import padded_lists

from hybridrank import metrics as M
from hybridrank.metrics.request_stats import (
    RequestStats,
    calibration_stats,
    check_same_requests,
    frame_stats,
    ranking_stats,
    ratio_stats,
    request_offsets,
)
from hybridrank.metrics.uncertainty import (
    Interval,
    bootstrap,
    bootstrap_replicates,
    compare_bootstrap,
    format_interval,
    paired_bootstrap,
    resample_counts,
)


def _or_none(fn, *args):
    try:
        return float(fn(*args))
    except ValueError:
        return None


def _close(a, b):
    assert (a is None) == (b is None), (a, b)
    if a is not None:
        assert a == pytest.approx(b, rel=1e-9, abs=1e-12)


# --- point estimates = the one-shot metrics --------------------------------------------------


@settings(max_examples=30)
@given(padded_lists(max_lists=5, max_len=7, label_max=2), st.sampled_from(["skip", "zero", "one"]))
def test_ranking_point_estimates_equal_metrics(lists, empty):
    s, y, m = lists.logits, lists.labels, lists.mask
    if not bool(m.any()):
        return
    pt = ranking_stats(s, y, mask=m, ks=(1, 3, None), empty=empty).point()
    for k, name in ((1, "ndcg@1"), (3, "ndcg@3"), (None, "ndcg")):
        _close(pt[name], _or_none(lambda k=k: M.ndcg(s, y, mask=m, k=k, empty=empty)))
    _close(pt["map"], _or_none(lambda: M.mean_average_precision(s, y, mask=m, empty=empty)))
    _close(pt["mrr"], _or_none(lambda: M.mrr(s, y, mask=m, empty=empty)))
    _close(pt["gauc"], _or_none(lambda: M.gauc(s, y, mask=m)))


@settings(max_examples=30)
@given(padded_lists(max_lists=5, max_len=7, label_max=1), st.sampled_from(["quantile", "uniform"]),
       st.integers(1, 6))
def test_calibration_point_estimates_equal_metrics(lists, binning, bins):
    p, y, m = torch.sigmoid(lists.logits / 2), lists.labels, lists.mask
    if not bool(m.any()):
        return
    pt = calibration_stats(p, y, mask=m, bins=bins, binning=binning).point()
    _close(pt["logloss"], _or_none(lambda: M.log_loss(p, y, mask=m)))
    _close(pt["ne"], _or_none(lambda: M.normalized_entropy(p, y, mask=m)))
    _close(pt["pcoc"], _or_none(lambda: M.pcoc(p, y, mask=m)))
    _close(pt["ece"], _or_none(lambda: M.ece(p, y, mask=m, bins=bins, binning=binning)))


def test_all_padding_rows_are_not_requests():
    s = torch.tensor([[1.0, 0.0], [0.0, 0.0], [2.0, 1.0]])
    y = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]])
    m = torch.tensor([[True, True], [False, False], [True, True]])
    st_ = ranking_stats(s, y, mask=m, request_key=["a", "b", "c"])
    assert st_.n_requests == 2 and st_.request_key.tolist() == ["a", "c"] and st_.n_positives == 2


# --- replicates = a brute-force loop over resampled data sets ----------------------------------


def _sample(seed, r=30, ctr=0.2):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 8, (r,), generator=g)
    width = int(lengths.max())
    m = torch.arange(width)[None, :] < lengths[:, None]
    z = torch.randn(r, width, generator=g, dtype=torch.float64)
    p_true = torch.sigmoid(z + math.log(ctr / (1 - ctr)))
    y = (torch.rand(r, width, generator=g, dtype=torch.float64) < p_true).double()
    noise = torch.randn(r, width, generator=g, dtype=torch.float64)
    return p_true, y * m, m, noise


_REFS = {"ndcg@3": lambda s, y, m: M.ndcg(s, y, mask=m, k=3), "gauc": lambda s, y, m: M.gauc(s, y, mask=m),
         "logloss": lambda s, y, m: M.log_loss(s, y, mask=m), "pcoc": lambda s, y, m: M.pcoc(s, y, mask=m)}


def test_replicates_equal_brute_force_loop():
    p, y, m, _ = _sample(1)
    st_ = ranking_stats(p, y, mask=m, ks=(3,)).merge(calibration_stats(p, y, mask=m))
    n_boot, seed = 40, 7
    reps = bootstrap_replicates(st_, n_boot=n_boot, seed=seed, metrics=["ndcg@3", "gauc", "logloss", "pcoc"])
    counts = np.concatenate(list(resample_counts(st_.n_requests, n_boot, seed=seed)))
    assert counts.shape == (n_boot, 30) and (counts.sum(1) == 30).all()
    for i in range(n_boot):
        idx = torch.from_numpy(np.repeat(np.arange(30), counts[i]))  # the resampled data set
        ps, ys, ms = p[idx], y[idx], m[idx]
        for name, ref in _REFS.items():
            v, ok = reps[name][0][i], reps[name][1][i]
            _close(float(v) if ok else None, _or_none(ref, ps, ys, ms))


def test_resample_counts_are_seeded():
    a = np.concatenate(list(resample_counts(50, 30, seed=3)))
    b = np.concatenate(list(resample_counts(50, 30, seed=3)))
    c = np.concatenate(list(resample_counts(50, 30, seed=4)))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    # every request is drawn Binomial(R, 1/R) times: mean 1, variance 1 - 1/R (sd of the mean
    # over 4000 replicates ~0.015 per request: 5 sd tolerance)
    many = np.concatenate(list(resample_counts(10, 4000, seed=0)))
    assert np.abs(many.mean(0) - 1).max() < 0.08
    assert np.abs(many.var(0) - 0.9).max() < 0.15
    pois = np.concatenate(list(resample_counts(2000, 50, seed=0, scheme="poisson")))
    assert abs(pois.mean() - 1) < 0.02 and not (pois.sum(1) == 2000).all()


def test_determinism_per_seed():
    p, y, m, _ = _sample(2, r=60)
    st_ = calibration_stats(p, y, mask=m)
    a, b = bootstrap(st_, n_boot=200, seed=5), bootstrap(st_, n_boot=200, seed=5)
    c = bootstrap(st_, n_boot=200, seed=6)
    assert a == b
    assert a["logloss"].lower != c["logloss"].lower
    assert a["logloss"].estimate == c["logloss"].estimate


# --- coverage and the paired test on known-truth data -----------------------------------------


def test_interval_of_a_mean_covers_the_truth_at_its_level():
    """A 95 % interval of a CTR covers the true CTR in ~95 % of 200 seeds (binomial tolerance)."""
    truth, covered, n_seeds = 0.1, 0, 200
    for seed in range(n_seeds):
        rng = np.random.default_rng(1000 + seed)
        sizes = 1 + rng.poisson(6, size=150)
        clicks = rng.binomial(sizes, truth)
        iv = bootstrap(ratio_stats(clicks, sizes, name="ctr"), n_boot=400, seed=seed)["ctr"]
        covered += iv.lower <= truth <= iv.upper
    # Binomial(200, 0.95): mean 190, sd 3.1; outside [180, 199] has probability < 0.3 %
    assert 180 <= covered <= 199, covered


def _noisy(p_true, noise, sd):
    return torch.sigmoid(torch.log(p_true) - torch.log1p(-p_true) + sd * noise)  # torch.logit: slow in f64


def test_paired_test_detects_a_planted_difference():
    p, y, m, noise = _sample(3, r=400, ctr=0.1)
    a = calibration_stats(p, y, mask=m).merge(ranking_stats(p, y, mask=m))
    worse = _noisy(p, noise, 1.0)
    b = calibration_stats(worse, y, mask=m).merge(ranking_stats(worse, y, mask=m))
    res = paired_bootstrap(a, b, n_boot=500, seed=0)
    ll = res["logloss"]
    assert ll.diff < 0 and ll.upper < 0 and ll.p_value < 0.05 and ll.verdict == "significant at 5 %"
    assert res["gauc"].diff > 0 and res["gauc"].p_value < 0.05
    same = paired_bootstrap(a, a, n_boot=200, seed=0)["logloss"]
    assert same.diff == 0 and same.p_value == 1.0 and same.verdict == "not significant at 5 %"


def test_paired_replicates_share_the_resample_counts():
    p, y, m, noise = _sample(5, r=80)
    a, b = calibration_stats(p, y, mask=m), calibration_stats(_noisy(p, noise, 0.7), y, mask=m)
    res = paired_bootstrap(a, b, n_boot=300, seed=11, alpha=0.1)["logloss"]
    va, _ = bootstrap_replicates(a, n_boot=300, seed=11)["logloss"]
    vb, _ = bootstrap_replicates(b, n_boot=300, seed=11)["logloss"]
    lo, hi = np.quantile(va - vb, [0.05, 0.95])
    assert (res.lower, res.upper) == pytest.approx((lo, hi))
    tail = min((va - vb <= 0).sum(), (va - vb >= 0).sum())
    assert res.p_value == pytest.approx(min(1.0, 2 * (tail + 1) / 301))
    assert res.diff == pytest.approx(a.point()["logloss"] - b.point()["logloss"])


def test_compare_bootstrap_equals_single_and_paired_calls():
    p, y, m, noise = _sample(6, r=60)
    runs = {n: calibration_stats(_noisy(p, noise, sd), y, mask=m) for n, sd in (("a", 0.0), ("b", 0.5), ("c", 1.0))}
    iv, pr = compare_bootstrap(runs, baseline="b", n_boot=150, seed=2, metrics=["logloss", "pcoc", "logloss"])
    assert set(pr) == {"a", "c"} and list(iv["a"]) == ["logloss", "pcoc"]
    for n in runs:
        assert iv[n] == bootstrap(runs[n], n_boot=150, seed=2, metrics=["logloss", "pcoc"])
    assert pr["c"] == paired_bootstrap(runs["c"], runs["b"], n_boot=150, seed=2, metrics=["logloss", "pcoc"])
    assert bootstrap(runs["a"], n_boot=150, seed=2, metrics=["pcoc", "pcoc"])["pcoc"] == iv["a"]["pcoc"]
    with pytest.raises(ValueError, match="baseline 'z'"):
        compare_bootstrap(runs, baseline="z")
    with pytest.raises(ValueError, match="run 'short' vs baseline 'a'"):
        compare_bootstrap({"a": runs["a"], "short": calibration_stats(p[:50], y[:50], mask=m[:50])})


@pytest.mark.slow
def test_paired_test_holds_its_level_on_equal_quality_models():
    """Two independent noisy versions of the truth: flagged in about 5 % of 200 seeds, not more."""
    flagged, n_seeds = 0, 200
    for seed in range(n_seeds):
        p, y, m, noise = _sample(10_000 + seed, r=200, ctr=0.1)
        other = torch.randn(noise.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        a = calibration_stats(_noisy(p, noise, 0.5), y, mask=m)
        b = calibration_stats(_noisy(p, other, 0.5), y, mask=m)
        flagged += paired_bootstrap(a, b, n_boot=300, seed=seed, metrics=["logloss"])["logloss"].p_value < 0.05
    # Binomial(200, 0.05): mean 10, sd 3.1; more than 20 has probability < 0.2 %
    assert flagged <= 20, flagged


# --- undefined values, mismatched requests, formatting ------------------------------------------


def test_zero_positives_are_reported_not_nan():
    p = torch.full((5, 3), 0.1, dtype=torch.float64)
    y, m = torch.zeros(5, 3), torch.ones(5, 3, dtype=torch.bool)
    st_ = ranking_stats(p, y, mask=m).merge(calibration_stats(p, y, mask=m))
    res = bootstrap(st_, n_boot=100)
    for name in ("ndcg@10", "gauc", "pcoc", "ne"):
        assert res[name].estimate is None and res[name].lower is None
        assert format_interval(res[name]).startswith("n/a (undefined:")
    assert "positive" in res["ndcg@10"].note
    assert res["logloss"].estimate is not None and res["logloss"].lower is not None
    for iv in res.values():
        assert not any(isinstance(v, float) and math.isnan(v) for v in iv.__dict__.values())
    paired = paired_bootstrap(st_, st_, n_boot=50)
    assert paired["ndcg@10"].p_value is None and paired["ndcg@10"].verdict.startswith("no comparison")


def test_rare_positives_give_no_interval():
    """1 positive request out of 40: most resamples have none; the interval is refused, not NaN."""
    p = torch.full((40, 2), 0.1, dtype=torch.float64)
    y = torch.zeros(40, 2)
    y[0, 0] = 1.0
    m = torch.ones(40, 2, dtype=torch.bool)
    iv = bootstrap(ranking_stats(p, y, mask=m), n_boot=200, seed=0)["ndcg@10"]
    assert iv.estimate is not None and iv.lower is None and iv.upper is None
    assert iv.note.startswith("no interval:") and iv.n_undefined > 5
    assert format_interval(iv).endswith("[no interval]")


def test_mismatched_requests_say_what_differs():
    p, y, m, _ = _sample(4, r=20)
    a = calibration_stats(p, y, mask=m, request_key=np.arange(20))
    with pytest.raises(ValueError, match="20 vs 19 requests"):
        paired_bootstrap(a, calibration_stats(p[:19], y[:19], mask=m[:19]))
    with pytest.raises(ValueError, match=r"request ids differ at 1 request\(s\), first at index 3"):
        check_same_requests(a, calibration_stats(p, y, mask=m, request_key=np.r_[0:3, 99, 4:20]))
    i = int(np.flatnonzero(m.sum(1).numpy() >= 2)[0])
    m2 = m.clone()
    m2[i, 0] = False
    with pytest.raises(ValueError, match=f"impressions per request differ.*index {i}"):
        check_same_requests(a, calibration_stats(p, y, mask=m2))
    y2 = y.clone()
    y2[6, 0] = 1 - y2[6, 0]
    with pytest.raises(ValueError, match="positive labels per request differ.*index 6"):
        check_same_requests(a, calibration_stats(p, y2, mask=m))
    with pytest.raises(ValueError, match="unknown metric"):
        bootstrap(a, metrics=["ndcg@5"])
    with pytest.raises(ValueError, match="both statistics define"):
        a.merge(a)


def test_bad_arguments():
    st_ = ratio_stats(np.ones(3), np.ones(3))
    for kw, match in ((dict(alpha=0.0), "alpha"), (dict(n_boot=0), "n_boot"),
                      (dict(scheme="jackknife"), "scheme")):
        with pytest.raises(ValueError, match=match):
            bootstrap(st_, **kw)
    with pytest.raises(ValueError, match="NaN or infinite"):
        ratio_stats(np.array([1.0, np.nan]), np.ones(2))
    with pytest.raises(ValueError, match="p contains NaN"):
        calibration_stats(torch.tensor([[np.nan]]), torch.zeros(1, 1), mask=torch.ones(1, 1, dtype=torch.bool))
    with pytest.raises(ValueError, match="separate runs"):
        request_offsets(np.array(["a", "b", "a"]))
    with pytest.raises(ValueError, match="shape"):
        RequestStats({"x": np.ones(2)}, {}, np.ones(3))


def test_frame_stats_and_format():
    frame = pl.DataFrame({"request_id": ["q1", "q1", "q2", "q2", "q2"],
                          "pctr": [0.9, 0.2, 0.1, 0.3, 0.8], "label": [1, 0, 0, 0, 1]})
    st_ = frame_stats(frame, ks=(2,))
    assert st_.request_key.tolist() == ["q1", "q2"] and st_.n_positives == 2
    assert st_.point()["ndcg@2"] == pytest.approx(1.0)
    iv = Interval("x", 0.51612, 0.50931, 0.52284, 0.05, 10, 3, 100, 0)
    assert format_interval(iv) == "0.516 [0.509, 0.523]"
    assert format_interval(iv, None) == "0.5161 [0.5093, 0.5228]"
    assert format_interval(iv, 1, scale=100, suffix=" %") == "51.6 % [50.9, 52.3]"
    flat = Interval("x", 1.0, 1.0, 1.0, 0.05, 10, None, 100, 0)
    assert format_interval(flat, None, scale=100) == "100.0 [100.0, 100.0]"
