"""The rules of calibrator=auto (hybridrank.serving.calibration.rules), one by one, each on a small
constructed case whose right decision is known, or against a loop / library reference."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from hybridrank.serving.calibration.calibrators import Calibrator, NotRankingError, PlattCalibrator
from hybridrank.serving.calibration.rules import (
    assign_folds,
    best_candidate,
    clicks_refusal,
    compare_score_distributions,
    cross_fit,
    held_out_logloss,
    log_loss_rows,
    ranking_check,
    refit,
    request_index,
    request_times,
    resemblance_overrule,
    significance,
    stability_check,
    stability_overrule,
)
from hybridrank.serving.level_trend import level_stability


# --- rule 1: cross-fitting by request ----------------------------------------------------------
def test_request_index_numbers_requests_densely_and_warns_without_them():
    request, n = request_index(torch.tensor([30, 10, 30, 20, 10]), 5)
    assert request.tolist() == [2, 0, 2, 1, 0] and n == 3
    with pytest.warns(UserWarning, match="without groups"):
        request, n = request_index(None, 4)
    assert request.tolist() == [0, 1, 2, 3] and n == 4
    with pytest.raises(ValueError, match="groups has 2 entries for 5 logits"):
        request_index(torch.tensor([0, 1]), 5)


def test_request_times_are_each_requests_earliest_time():
    g = torch.Generator().manual_seed(0)
    request = torch.randint(0, 7, (50,), generator=g)
    request[:7] = torch.arange(7)                       # every request present
    t = torch.rand(50, generator=g, dtype=torch.float64) * 100
    got = request_times(t, request, 7)
    assert got.tolist() == [min(float(t[i]) for i in range(50) if request[i] == r) for r in range(7)]
    with pytest.raises(ValueError, match="order has 3 entries for 50 logits"):
        request_times(t[:3], request, 7)


def test_time_folds_are_blocks_predicted_from_the_past():
    """Seven requests stored out of time order, three folds: request r of time rank k goes to
    block k * 3 // 7; each block is predicted by a fit on the earlier blocks only, the first never."""
    times = torch.tensor([6.0, 0.0, 5.0, 1.0, 4.0, 2.0, 3.0])     # ranks 6 0 5 1 4 2 3
    request = torch.tensor([0, 0, 1, 2, 3, 4, 5, 6, 6])
    folds = assign_folds(request, 7, 3, times=times)
    assert folds.forward and "time blocks" in folds.scheme
    assert folds.of_group.tolist() == [r * 3 // 7 for r in (6, 0, 5, 1, 4, 2, 3)]
    assert folds.of_row.tolist() == folds.of_group[request].tolist()
    assert folds.scored_rows.tolist() == (folds.of_row > 0).tolist()
    assert folds.scored_groups.tolist() == (folds.of_group > 0).tolist()
    row_time = times[request]
    seen = []
    for train, test in folds.splits():
        assert bool(test.any()) and bool(train.any())
        assert float(row_time[train].max()) < float(row_time[test].min())   # the past only
        seen.append(int(folds.of_row[test][0]))
    assert seen == [1, 2]


def test_random_folds_never_cut_a_request_and_use_every_row_once():
    request = torch.arange(103) // 3                    # 35 requests (the last holds one row)
    folds = assign_folds(request, 35, 5, seed=7)
    assert not folds.forward and "random folds" in folds.scheme
    assert sorted(torch.bincount(folds.of_group).tolist()) == [7] * 5
    assert bool(folds.scored_rows.all()) and bool(folds.scored_groups.all())
    tested = torch.zeros(103, dtype=torch.long)
    for train, test in folds.splits():
        assert not bool((train & test).any()) and bool((train | test).all())
        assert not set(request[train].tolist()) & set(request[test].tolist())
        tested += test
    assert tested.tolist() == [1] * 103
    assert torch.equal(assign_folds(request, 35, 5, seed=7).of_group, folds.of_group)
    with pytest.raises(ValueError, match="4 request\\(s\\) cannot make 5 folds"):
        assign_folds(torch.arange(4), 4, 5)


class _MeanRate(Calibrator):
    """A stub candidate: the weighted click rate of its training rows, for every logit."""

    name, n_params = "mean", 1

    def fit(self, logits, clicks, weights=None):
        self.p = float((weights * clicks).sum() / weights.sum())
        return self

    def predict_proba(self, logits):
        return torch.full((len(logits),), self.p, dtype=torch.float64)


class _Reverses(_MeanRate):
    def fit(self, logits, clicks, weights=None):
        raise NotRankingError("slope -1 reverses the order")


class _Fails(_MeanRate):
    def fit(self, logits, clicks, weights=None):
        raise ValueError("a fold without clicks")


@pytest.mark.parametrize("forward", [False, True])
def test_cross_fit_predicts_each_fold_from_its_training_folds(forward):
    g = torch.Generator().manual_seed(1)
    request = torch.arange(60) // 4
    z = torch.randn(60, generator=g, dtype=torch.float64)
    y = (torch.rand(60, generator=g) < 0.3).double()
    w = torch.rand(60, generator=g, dtype=torch.float64) + 0.5
    folds = assign_folds(request, 15, 3, times=torch.arange(15.0) if forward else None, seed=2)
    oof, failed = cross_fit(_MeanRate, z, y, w, folds)
    assert failed is None
    for i in range(60):
        k = int(folds.of_row[i])
        if forward and k == 0:                          # never predicted: the identity's σ(z)
            assert float(oof[i]) == float(torch.sigmoid(z[i]))
            continue
        train = [j for j in range(60) if (folds.of_row[j] < k if forward else folds.of_row[j] != k)]
        expected = sum(float(w[j] * y[j]) for j in train) / sum(float(w[j]) for j in train)
        assert float(oof[i]) == pytest.approx(expected, rel=1e-12)


def test_cross_fit_refuses_a_reversing_map_and_reports_a_failed_fit():
    request = torch.arange(20) // 2
    folds = assign_folds(request, 10, 2)
    z, y, w = torch.zeros(20, dtype=torch.float64), (torch.arange(20) % 3 == 0).double(), torch.ones(20)
    assert cross_fit(_Reverses, z, y, w, folds) == (None, {"refused": "refused: slope -1 reverses the order"})
    assert cross_fit(_Fails, z, y, w, folds) == (None, {"error": "a fold without clicks"})


# --- rule 2: clicks per parameter, significance, the winner ------------------------------------
def test_clicks_refusal_at_the_boundary():
    assert clicks_refusal(199.0, 2, 100.0) == "199 clicks < 200 (2 parameter(s) x 100)"
    assert clicks_refusal(200.0, 2, 100.0) is None
    assert clicks_refusal(999.4, 10, 100.0) == "999 clicks < 1000 (10 parameter(s) x 100)"
    assert clicks_refusal(0.0, 10, 0.0) is None                # min_clicks_per_param=0: no floor
    assert clicks_refusal(3.0, 1, 2.5) is None


def test_significance_by_hand():
    """Four requests of two rows, random folds (every row scored): the per-request sums of
    ``w (base - loss)`` are 0.4, 0.2, 0.3, 0.1, so the improvement is 1.0 / W and the SE is
    sd(d) · 2 / W; it passes at z = 2 and fails at z = 10."""
    request = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    folds = assign_folds(request, 4, 2)
    w = torch.tensor([1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    base = torch.full((8,), 0.5, dtype=torch.float64)
    gain_per_row = torch.tensor([0.3, 0.1, 0.05, 0.05, 0.2, 0.1, 0.0, 0.1], dtype=torch.float64)
    loss = base - gain_per_row
    W = float(w.sum())                                  # 10
    d = np.array([0.4, 0.2, 0.3, 0.1])
    rec = significance(base, loss, w, folds, 2.0)
    assert rec["improvement"] == pytest.approx(d.sum() / W, rel=1e-12)
    assert rec["se"] == pytest.approx(d.std(ddof=1) * 2 / W, rel=1e-12)
    assert rec["cv_logloss"] == pytest.approx(float((w * loss).sum()) / W, rel=1e-12)
    assert rec["passes"] is True                        # 0.1 > 2 x 0.0258
    assert significance(base, loss, w, folds, 10.0)["passes"] is False
    assert held_out_logloss(base, w, folds) == pytest.approx(0.5)


def test_significance_reads_only_the_blocks_after_the_first():
    """Forward folds: the first block's rows carry a huge (fake) gain that must not count; with a
    single scored request the SE is infinite and nothing passes."""
    request = torch.tensor([0, 0, 1, 1])
    folds = assign_folds(request, 2, 2, times=torch.tensor([0.0, 1.0]))   # request 0: block 0
    base = torch.tensor([9.0, 9.0, 0.5, 0.5], dtype=torch.float64)
    loss = torch.tensor([0.0, 0.0, 0.4, 0.3], dtype=torch.float64)
    rec = significance(base, loss, torch.ones(4, dtype=torch.float64), folds, 2.0)
    assert rec["improvement"] == pytest.approx(0.3 / 2) and rec["se"] == math.inf
    assert rec["passes"] is False
    assert rec["cv_logloss"] == pytest.approx(0.35)


def test_best_candidate_takes_the_largest_passing_gain():
    rec = lambda gain, passes: {"improvement": gain, "passes": passes}  # noqa: E731
    assert best_candidate({"none": {}, "shift": rec(0.01, True), "platt": rec(0.03, True),
                           "isotonic": rec(0.05, False)}) == "platt"
    assert best_candidate({"none": {}, "shift": rec(0.02, True), "platt": rec(0.02, True)}) == "shift"
    assert best_candidate({"none": {}, "shift": rec(-0.01, True)}) == "none"    # z < 0 cannot adopt a loss
    assert best_candidate({"none": {}, "shift": {"refused": "x"}, "platt": {"error": "y"}}) == "none"


# --- rule 3: scores that do not rank -------------------------------------------------------------
@given(st.lists(st.tuples(st.integers(-3, 3), st.booleans()), min_size=2, max_size=80))
def test_ranking_check_auc_is_sklearns_with_ties_counted_half(rows):
    from sklearn.metrics import roc_auc_score

    z = torch.tensor([float(r[0]) for r in rows], dtype=torch.float64)
    y = torch.tensor([float(r[1]) for r in rows], dtype=torch.float64)
    got = ranking_check(z, y)
    n1, n0 = int(y.sum()), int(len(y) - y.sum())
    if n1 == 0 or n0 == 0:
        assert got == {"auc": None, "verdict": "undefined (one class)"}
        return
    assert got["auc"] == pytest.approx(roc_auc_score(y.numpy(), z.numpy()), abs=1e-12)
    assert got["se_under_chance"] == pytest.approx(math.sqrt((n1 + n0 + 1) / (12 * n1 * n0)))


def test_ranking_check_flags_reversed_scores_only():
    """Clicks on the 20 lowest of 200 scores (AUC 0): not ranking. The same split with the clicks
    on the highest scores, or a constant score (AUC 1/2), is not flagged. Twenty clicks in a run
    above ``s`` non-clicks score AUC ``s / 180``; the line ``0.5 - 2 se`` (se = sqrt(201 / 43200))
    lies between s = 65 (flagged) and s = 66 (not)."""
    z = torch.arange(200, dtype=torch.float64)
    low = (torch.arange(200) < 20).double()
    assert ranking_check(z, low)["auc"] == 0.0
    assert ranking_check(z, low)["verdict"].startswith("the scores rank this split's clicks WORSE")
    assert ranking_check(z, low.flip(0))["verdict"] == "ranks better than chance"
    assert ranking_check(torch.zeros(200, dtype=torch.float64), low)["auc"] == 0.5
    assert ranking_check(torch.zeros(200, dtype=torch.float64), low)["verdict"] == "ranks better than chance"
    line = 0.5 - 2 * math.sqrt(201 / (12 * 20 * 180))
    assert 65 / 180 < line < 66 / 180
    for s, flagged in ((65, True), (66, False)):
        y = ((torch.arange(200) >= s) & (torch.arange(200) < s + 20)).double()
        got = ranking_check(z, y)
        assert got["auc"] == pytest.approx(s / 180, abs=1e-12)
        assert got["verdict"].startswith("the scores rank") is flagged


# --- rule 4: a level that moves with time --------------------------------------------------------
def _drifting(gap_late: float, seed: int = 0):
    """400 requests of 25 rows in time order; the level gap goes from 0.5 to ``gap_late``."""
    g = torch.Generator().manual_seed(seed)
    request = torch.arange(10_000) // 25
    z = torch.randn(10_000, generator=g, dtype=torch.float64) - 2.0
    gap = 0.5 + (gap_late - 0.5) * request.double() / 400
    y = (torch.rand(10_000, generator=g, dtype=torch.float64) < torch.sigmoid(z + gap)).double()
    folds = assign_folds(request, 400, 5, times=torch.arange(400.0))
    return z, y, torch.ones_like(z), folds


def test_stability_check_reads_the_gaps_before_a_shift_already_applied():
    z, y, w, folds = _drifting(-0.5)
    own = stability_check(z, y, w, folds)
    assert own["stable"] is False and own["level_trend_applied"] is False
    assert own == {**level_stability(z, y, w, folds.of_row, 5), "level_trend_applied": False}
    moved = 0.3 * (folds.of_row.double() - 2)            # a trend the export added
    seen = stability_check(z + moved, y, w, folds, moved)
    assert seen["p_value"] == pytest.approx(own["p_value"], rel=1e-9)
    assert seen["level_trend_applied"] is True
    constant = stability_check(z + 0.2, y, w, folds, torch.full_like(z, 0.2))
    assert constant["level_trend_applied"] is False      # a constant shift is no trend


def test_stability_overrule_keeps_the_identity_when_the_level_moves():
    z, y, w, folds = _drifting(0.5)                       # a constant gap: stable
    steady = stability_check(z, y, w, folds)
    assert steady["stable"] is True and stability_overrule(steady) is None
    z, y, w, folds = _drifting(-0.5)
    moving = stability_check(z, y, w, folds)
    assert stability_overrule(moving) == ("the model's miscalibration changes over time within the "
                                          f"calibration split (Cochran's Q p = {moving['p_value']:.3g})")
    assert "level trend" in stability_overrule({**steady, "level_trend_applied": True})
    assert "level trend" in stability_overrule({"stable": None, "blocks": 1, "level_trend_applied": True})
    assert stability_overrule({"stable": None, "blocks": 1, "level_trend_applied": False}) is None
    assert stability_overrule(None) is None               # random folds: no time blocks


# --- rule 5: the calibration split must resemble the scored data ---------------------------------
def test_compare_score_distributions_ks_is_scipys_and_the_limits_hold():
    from scipy.stats import ks_2samp

    g = torch.Generator().manual_seed(3)
    a = torch.randn(3000, generator=g, dtype=torch.float64) - 3
    b = torch.randn(2000, generator=g, dtype=torch.float64) - 3
    r = compare_score_distributions(a, b, calibration_requests=300, scored_requests=200)
    assert r["ks"] == pytest.approx(ks_2samp(a.numpy(), b.numpy()).statistic, abs=1e-12)
    assert r["ks_limit"] == pytest.approx(max(0.1, 1.36 * math.sqrt(1 / 300 + 1 / 200)))
    assert r["verdict"] == "resembles" and r["reasons"] == []
    higher = compare_score_distributions(a, b + 0.5, calibration_requests=300, scored_requests=200)
    ratio = float(torch.sigmoid(b + 0.5).mean() / torch.sigmoid(a).mean())
    assert ratio > 1.25 and higher["verdict"] == "differs"
    assert any("mean pCTR" in x for x in higher["reasons"])
    # the same mean pCTR with a different shape: the KS distance alone decides
    spread = compare_score_distributions(torch.full((3000,), -3.0, dtype=torch.float64), a,
                                         calibration_requests=300, scored_requests=200)
    assert spread["verdict"] == "differs" and any("KS distance" in x for x in spread["reasons"])
    with pytest.raises(ValueError, match="empty"):
        compare_score_distributions(a[:0], b, calibration_requests=1, scored_requests=1)


def test_resemblance_overrule():
    differs, resembles = {"verdict": "differs"}, {"verdict": "resembles"}
    assert resemblance_overrule(differs, "identity") == "the calibration split does not resemble the scored data"
    assert resemblance_overrule(differs, "warn") is None
    assert resemblance_overrule(resembles, "identity") is None
    assert resemblance_overrule(None, "identity") is None


# --- the winner refitted -------------------------------------------------------------------------
def test_refit_on_the_whole_split_refuses_a_reversing_map():
    g = torch.Generator().manual_seed(4)
    z = torch.randn(4000, generator=g, dtype=torch.float64) - 2
    y = (torch.rand(4000, generator=g, dtype=torch.float64) < torch.sigmoid(0.5 * z - 1)).double()
    w = torch.ones_like(z)
    fitted, refused = refit(PlattCalibrator, z, y, w)
    assert refused is None and fitted.to_dict() == PlattCalibrator().fit(z, y, w).to_dict()
    reversed_y = (torch.rand(4000, generator=g, dtype=torch.float64) < torch.sigmoid(-z - 4)).double()
    fitted, refused = refit(PlattCalibrator, z, reversed_y, w)
    assert fitted is None and refused.startswith("refused on the whole split: Platt slope")


def test_log_loss_rows_clips_probabilities():
    y = torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)
    p = torch.tensor([0.0, 1.0, 0.25], dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = log_loss_rows(p, y)
    assert got.tolist() == pytest.approx([-math.log(1e-7), -math.log(1e-7), math.log(4)], rel=1e-6)
