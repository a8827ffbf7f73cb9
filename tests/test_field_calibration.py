"""Field-level calibration: F-ECE and PCOC per value of a field, streaming, bootstrap, intervals.

References are brute-force loops over the values and known-truth simulations: a model that is
calibrated overall but wrong per category must show it in F-ECE and not in the global numbers.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from hybridrank.metrics.calibration import ece, field_ece, pcoc, pcoc_interval
from hybridrank.metrics.list_metrics import ListMetrics
from hybridrank.metrics.request_stats import field_stats
from hybridrank.metrics.uncertainty import bootstrap


def _brute_field_ece(p, y, codes) -> float:
    total, n = 0.0, len(p)
    for v in set(codes.tolist()):
        sel = [i for i in range(n) if codes[i] == v]
        total += abs(sum(float(p[i]) for i in sel) - sum(float(y[i] > 0) for i in sel))
    return total / n


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 60), n_values=st.integers(1, 6), seed=st.integers(0, 10_000))
def test_field_ece_matches_a_loop_over_values(n, n_values, seed):
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(n, generator=g, dtype=torch.float64)
    y = (torch.rand(n, generator=g) < 0.3).double()
    codes = torch.randint(0, n_values, (n,), generator=g)
    assert float(field_ece(p, y, codes)) == pytest.approx(_brute_field_ece(p, y, codes), abs=1e-12)


def test_field_ece_of_one_value_is_the_global_calibration_gap():
    g = torch.Generator().manual_seed(0)
    p = torch.rand(500, generator=g, dtype=torch.float64) * 0.2
    y = (torch.rand(500, generator=g) < 0.1).double()
    one = torch.zeros(500, dtype=torch.long)
    assert float(field_ece(p, y, one)) == pytest.approx(abs(float(p.sum() - y.sum())) / 500)
    # with one value per impression it is the mean absolute error |p - y|
    each = torch.arange(500)
    assert float(field_ece(p, y, each)) == pytest.approx(float((p - y).abs().mean()))


def test_miscalibrated_per_category_shows_in_f_ece_not_in_global_numbers():
    """Known truth: two categories with true CTR 2 % and 8 %; the model predicts 5 % for both. It is
    calibrated overall (PCOC 1, global ECE ~0: one bin) but F-ECE by category is ~3 %."""
    rng = np.random.default_rng(0)
    n = 200_000
    cat = rng.integers(0, 2, n)
    true = np.where(cat == 0, 0.02, 0.08)
    y = torch.from_numpy((rng.random(n) < true).astype(np.float64))
    flat = torch.full((n,), 0.05, dtype=torch.float64)
    truth = torch.from_numpy(true)
    c = torch.from_numpy(cat)
    assert float(pcoc(flat, y)) == pytest.approx(1.0, abs=0.03)
    assert float(ece(flat, y)) < 0.002
    assert float(field_ece(flat, y, c)) == pytest.approx(0.03, abs=0.002)
    assert float(field_ece(truth, y, c)) < 0.002


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n_chunks=st.integers(1, 4))
def test_streaming_fields_equal_one_shot_and_the_loop(seed, n_chunks):
    g = torch.Generator().manual_seed(seed)
    G, L, V = 12, 7, 5
    z = torch.randn(G, L, generator=g)
    y = (torch.rand(G, L, generator=g) < 0.3).float()
    mask = torch.rand(G, L, generator=g) < 0.8
    codes = torch.randint(0, V, (G, L), generator=g)
    pos = torch.arange(1, L + 1).expand(G, L)
    m = ListMetrics(positions=4, fields={"cat": V})
    bounds = sorted(torch.randint(0, G + 1, (n_chunks - 1,), generator=g).tolist())
    for a, b in zip([0, *bounds], [*bounds, G]):
        m.update(z[a:b], y[a:b], mask=mask[a:b], positions=pos[a:b], fields={"cat": codes[a:b]})
    out = m.compute()
    p = torch.sigmoid(z.double())
    assert float(out["f_ece@cat"]) == pytest.approx(
        _brute_field_ece(p[mask], y[mask], codes[mask]), abs=1e-9)
    in_pos = mask & (pos <= 4)
    if bool(in_pos.any()):
        assert float(out["f_ece@position"]) == pytest.approx(
            _brute_field_ece(p[in_pos], y[in_pos], pos[in_pos]), abs=1e-9)
    t = m.field_table("cat")
    for v, cnt, sp, npos in zip(t.position.tolist(), t.count.tolist(), t.sum_p.tolist(),
                                t.positives.tolist()):
        sel = mask & (codes == v)
        assert cnt == int(sel.sum()) and sp == pytest.approx(float(p[sel].sum()))
        assert npos == float(y[sel].sum())


def test_list_metrics_field_errors_say_what_and_where():
    m = ListMetrics(fields={"device": 3})
    z, y, mask = torch.zeros(1, 2), torch.tensor([[1.0, 0.0]]), torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="missing \\['device'\\]"):
        m.update(z, y, mask=mask)
    with pytest.raises(ValueError, match="code 3 outside 0..2"):
        m.update(z, y, mask=mask, fields={"device": torch.tensor([[0, 3]])})
    with pytest.raises(ValueError, match="int tensor of shape"):
        m.update(z, y, mask=mask, fields={"device": torch.tensor([[0.0, 1.0]])})
    with pytest.raises(ValueError, match="number of values"):
        ListMetrics(fields={"device": 0})
    with pytest.raises(ValueError, match="unknown field"):
        m.field_table("category")


def test_pcoc_interval_is_the_garwood_interval():
    sum_p = torch.tensor([7.5, 40.0, 3.0])
    k = torch.tensor([5.0, 50.0, 0.0])
    lo, hi = pcoc_interval(sum_p, k, alpha=0.1)
    for s, kk, a, b in zip(sum_p.tolist(), k.tolist(), lo.tolist(), hi.tolist()):
        mu_hi = s / a  # P(X <= k | mu_hi) = alpha / 2
        assert sps.poisson.cdf(kk, mu_hi) == pytest.approx(0.05, rel=1e-6)
        if kk > 0:
            mu_lo = s / b  # P(X >= k | mu_lo) = alpha / 2
            assert sps.poisson.sf(kk - 1, mu_lo) == pytest.approx(0.05, rel=1e-6)
        else:
            assert math.isinf(b)


def test_pcoc_interval_covers_a_calibrated_model_at_least_nominally():
    """Known truth: a calibrated model (clicks ~ Bernoulli(p)); the 95 % interval of each of 400
    slices must cover PCOC = 1 in at least ~95 % of them (conservative by construction)."""
    rng = np.random.default_rng(1)
    covered = 0
    for _ in range(400):
        p = rng.uniform(0.01, 0.2, 300)
        clicks = (rng.random(300) < p).sum()
        lo, hi = pcoc_interval(torch.tensor([p.sum()]), torch.tensor([float(clicks)]))
        covered += float(lo) <= 1.0 <= float(hi)
    assert covered / 400 >= 0.93


def test_field_stats_bootstrap_matches_the_point_and_brackets_it():
    g = torch.Generator().manual_seed(3)
    G, L = 300, 8
    p = torch.rand(G, L, generator=g, dtype=torch.float64) * 0.3
    y = (torch.rand(G, L, generator=g, dtype=torch.float64) < p * 1.5).double()
    mask = torch.rand(G, L, generator=g) < 0.9
    codes = torch.randint(0, 4, (G, L), generator=g)
    st_ = field_stats(p, y, mask=mask, fields={"cat": codes})
    point = st_.point()["f_ece@cat"]
    assert point == pytest.approx(float(field_ece(p[mask], y[mask], codes[mask])), abs=1e-12)
    iv = bootstrap(st_, n_boot=300, seed=0)["f_ece@cat"]
    assert iv.lower <= point <= iv.upper and iv.upper - iv.lower > 0


@pytest.mark.slow
def test_model_reports_field_calibration_and_rejects_unknown_fields(compose_cfg, small_run, tmp_path):
    """A run with metrics.fields logs f_ece@field that equals the brute force on its scores."""
    import hydra

    from hybridrank.cli.train import build_model

    cfg, result = small_run["cfg"], small_run["result"]  # fields=[item_category]
    value = result["test"]["test/f_ece@item_category"]
    from hybridrank.evaluation import evaluate_model
    from hybridrank.models.ranker import HybridRanker

    model = HybridRanker.load_from_checkpoint(result["best_checkpoint"], weights_only=True)
    splits = hydra.utils.instantiate(cfg.data.source).load()
    test = splits.test
    z = model.predict_split(test, at_logged_position=True)[0].double()
    j = model.schema.categorical.index("item_category")
    expect = _brute_field_ece(torch.sigmoid(z), test.label, test.cat[:, j])
    assert value == pytest.approx(expect, abs=1e-5)  # logged as float32
    assert evaluate_model(model, test)["f_ece@item_category"] == pytest.approx(expect, abs=1e-9)
    cells = result["intervals"]["rows"]["this model"]["f_ece@item_category"]
    assert cells[0] == value  # the interval's point is the logged figure

    bad = compose_cfg("config", f"paths.output_dir={tmp_path}", "data.source.n_users=50",
                      "model.metrics.fields=[colour]")
    datamodule = hydra.utils.instantiate(bad.data)
    datamodule.setup("fit")
    with pytest.raises(ValueError, match="'colour' is not a categorical feature"):
        build_model(bad, datamodule)
