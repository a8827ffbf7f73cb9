"""The level trend (hybridrank.serving.level_trend): its pieces against brute-force references,
its decisions on logs with a known drift, and the export applying it row by row."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from scipy.optimize import brentq

from hybridrank.serving.level_trend import (
    DAY_SECONDS,
    LevelTrend,
    block_gaps,
    fit_level_trend,
    level_stability,
    weighted_line,
)


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


# --- pieces against references ---------------------------------------------------------------
@given(st.lists(st.tuples(st.integers(0, 4), st.floats(-4, 2), st.integers(0, 1), st.floats(0.2, 3)),
                min_size=1, max_size=60))
def test_block_gaps_match_a_loop(rows):
    block = torch.tensor([r[0] for r in rows])
    z = torch.tensor([r[1] for r in rows], dtype=torch.float64)
    y = torch.tensor([r[2] for r in rows], dtype=torch.float64)
    w = torch.tensor([r[3] for r in rows], dtype=torch.float64)
    seen, gaps, var = block_gaps(z, y, w, block, 5)
    expected = []
    for k in range(5):
        idx = [i for i, r in enumerate(rows) if r[0] == k]
        if not idx:
            continue
        n = sum(rows[i][3] for i in idx)
        target = (sum(rows[i][3] * rows[i][2] for i in idx) + 0.5) * n / (n + 1)

        def clicks_at(d, idx=idx):
            return sum(rows[i][3] / (1 + math.exp(-(rows[i][1] + d))) for i in idx)

        g = brentq(lambda d, target=target: clicks_at(d) - target, -60, 60, xtol=1e-13)
        info = sum(rows[i][3] * _sig(rows[i][1] + g) * (1 - _sig(rows[i][1] + g)) for i in idx)
        expected.append((k, g, 1 / info))
    assert seen.tolist() == [e[0] for e in expected]
    assert np.allclose(gaps, [e[1] for e in expected], rtol=1e-7, atol=1e-8)
    assert np.allclose(var, [e[2] for e in expected], rtol=1e-6)


def _sig(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_block_gaps_are_the_shift_of_every_logit_not_of_the_mean_rate():
    """Logits that spread (sd 1.4) at a 12 % click rate: a logit shift of the truth comes back
    as itself. The ratio of mean rates, ``logit(Y/N) - logit(P/N)``, reads about 0.8 of it."""
    g = torch.Generator().manual_seed(3)
    z = -2.6 + 1.4 * torch.randn(200_000, generator=g, dtype=torch.float64)
    block = torch.arange(200_000) % 2
    shift = torch.tensor([-0.3, 0.3], dtype=torch.float64)
    y = (torch.rand(200_000, generator=g, dtype=torch.float64) < torch.sigmoid(z + shift[block])).double()
    _, gaps, var = block_gaps(z, y, torch.ones_like(z), block, 2)
    assert np.all(np.abs(gaps - shift.numpy()) < 3 * np.sqrt(var)), (gaps, var)
    p = torch.sigmoid(z)
    one_step = [_logit(float(y[block == k].mean())) - _logit(float(p[block == k].mean())) for k in (0, 1)]
    assert one_step[1] - one_step[0] < 0.9 * 0.6   # what the one-step form would have read


@given(st.integers(3, 12), st.integers(0, 10_000))
def test_weighted_line_matches_numpy_least_squares(k, seed):
    rng = np.random.default_rng(seed)
    t = np.sort(rng.uniform(0, 30, k)) + np.arange(k)  # distinct
    g = rng.normal(0, 0.3, k) + 0.05 * t
    v = rng.uniform(0.005, 0.2, k)
    r = weighted_line(t, g, v)
    # np.polyfit minimises sum (w_i (g_i - fit_i))^2: weights 1/sd
    slope, intercept = np.polyfit(t, g, 1, w=1 / np.sqrt(v))
    assert r["slope"] == pytest.approx(slope, rel=1e-8, abs=1e-10)
    assert r["mean"] + r["slope"] * (0 - r["t_mean"]) == pytest.approx(intercept, rel=1e-8, abs=1e-8)
    resid = g - (intercept + slope * t)
    assert r["resid_q"] == pytest.approx(float(np.sum(resid ** 2 / v)), rel=1e-8, abs=1e-10)
    cov = np.linalg.inv(np.stack([np.ones(k), t], 1).T @ np.diag(1 / v) @ np.stack([np.ones(k), t], 1))
    assert r["slope_se"] == pytest.approx(math.sqrt(cov[1, 1]), rel=1e-8)
    mean = np.sum(g / v) / np.sum(1 / v)
    assert r["q"] == pytest.approx(float(np.sum((g - mean) ** 2 / v)), rel=1e-8, abs=1e-10)


def test_weighted_line_needs_two_times():
    with pytest.raises(ValueError, match="two distinct times"):
        weighted_line(np.ones(3), np.arange(3.0), np.ones(3))


# --- level_stability: the gaps over a calibration split's time blocks (auto's rule 4) ----------
def test_level_stability_trend_is_the_weighted_slope_of_the_gap_and_flags_a_drifting_level():
    """``level_stability``'s trend: the inverse-variance weighted slope of the per-block gap on
    the block's order (numpy's weighted least squares as the reference, on the gaps and variances
    the function reports), with ``1 / sqrt(Σ w (t - t̄)²)`` as its standard error. A click level
    rising 0.1 logit per block is flagged TRENDING; a level that rises and falls back (MOVING
    for Cochran's Q) is not, and a constant one neither."""
    rng = np.random.default_rng(3)
    n_blocks, per = 6, 20_000
    block = torch.arange(n_blocks * per) // per
    z = torch.full((n_blocks * per,), -3.0, dtype=torch.float64)
    for drift, trending in (([0.1 * k for k in range(n_blocks)], True),
                            ([0.0, 0.2, 0.3, 0.3, 0.2, 0.0], False),
                            ([0.0] * n_blocks, False)):
        true = z + torch.tensor(drift, dtype=torch.float64)[block]
        y = torch.from_numpy((rng.random(len(z)) < torch.sigmoid(true).numpy()).astype(np.float64))
        st = level_stability(z, y, torch.ones_like(z), block, n_blocks)
        g = np.array(st["gaps"])
        p = torch.sigmoid(z).numpy()
        yk = np.array([float(y[block == k].sum()) for k in range(n_blocks)])
        q = (yk + 0.5) / (per + 1)                 # equal logits: the gap's rate, half a count added
        var = 1 / (per * q * (1 - q))
        slope = np.polyfit(np.arange(n_blocks), g, 1, w=1 / np.sqrt(var))[0]
        assert st["trend"] == pytest.approx(slope, abs=1e-3)   # gaps are rounded to 1e-4
        t = np.arange(n_blocks) - np.sum(np.arange(n_blocks) / var) / np.sum(1 / var)
        assert st["trend_se"] == pytest.approx(1 / math.sqrt(np.sum(t * t / var)))
        assert st["trending"] is trending, st
        assert float(p[0]) == pytest.approx(float(torch.sigmoid(torch.tensor(-3.0))))
        if drift[2] == 0.3:
            assert st["stable"] is False     # Q sees the hump; the trend test does not
    assert abs(level_stability(z, y, torch.ones_like(z), block, n_blocks)["trend"]) < 0.03


def test_level_stability_measures_time_by_the_blocks_that_hold_data():
    """An empty time block is skipped by the gaps, not by the clock: a level rising 0.1 logit per
    block, with block 3 of 7 empty, still reads about 0.1 per block."""
    rng = np.random.default_rng(5)
    per = 40_000
    block = torch.tensor([0, 1, 2, 4, 5, 6]).repeat_interleave(per)
    z = torch.full((len(block),), -3.0, dtype=torch.float64)
    y = torch.from_numpy((rng.random(len(z)) < torch.sigmoid(z + 0.1 * block).numpy()).astype(np.float64))
    st = level_stability(z, y, torch.ones_like(z), block, 7)
    assert st["blocks"] == 6
    assert st["trend"] == pytest.approx(0.1, abs=0.02), st   # by position 0..5 it would read ~0.12


# --- decisions on logs with a known level -----------------------------------------------------
def _log(drift, days=28, n=60_000, base=0.03, seed=0, day_sd=0.0):
    """Rows spread evenly over ``days``; a model that knows everything but the time (its logit the
    base level plus row noise); clicks from base level + drift(t in days) + a level of each day
    drawn with sd ``day_sd`` (a trained model's day-to-day errors)."""
    g = torch.Generator().manual_seed(seed)
    t = torch.sort(torch.rand(n, generator=g, dtype=torch.float64) * days * DAY_SECONDS).values
    z = torch.full((n,), _logit(base), dtype=torch.float64) + 0.5 * torch.randn(n, generator=g, dtype=torch.float64)
    day_level = torch.randn(int(days) + 1, generator=g, dtype=torch.float64) * day_sd
    level = drift(t / DAY_SECONDS) + day_level[(t / DAY_SECONDS).long()]
    y = (torch.rand(n, generator=g, dtype=torch.float64) < torch.sigmoid(z + level)).double()
    return z, y, t


def _line_p(z, y, t) -> float:
    """The slope p-value of a plain weighted line through the day gaps (no cycle, binomial noise)."""
    block = torch.floor((t - t.min()) / DAY_SECONDS).long()
    seen, g, v = block_gaps(z, y, torch.ones_like(z), block, int(block.max()) + 1)
    tb = np.array([float(t[block == k].mean()) for k in seen])
    return weighted_line(tb, g, v)["slope_p"]


def test_a_linear_drift_is_found_and_followed():
    amp, days = 0.4, 28
    z, y, t = _log(lambda d: amp * (2 * d / days - 1), days=days)
    trend = fit_level_trend(z, y, t)
    assert trend.applied, trend.verdict
    truth = 2 * amp / days
    assert abs(trend.slope_per_day - truth) < 3 * trend.evidence["slope_se_per_day"]
    # the line meets the training level at its origin; a week after the log it is a quarter of
    # the whole drift above the end's level... but clamped at max_horizon x span
    end = float(t.max())
    assert float(trend.shift(None)) == pytest.approx(trend.slope * (end - trend.origin))
    late = torch.tensor([end + 100 * DAY_SECONDS], dtype=torch.float64)
    assert float(trend.shift(late)) == pytest.approx(trend.slope * (trend.limit - trend.origin))
    assert trend.limit == pytest.approx(end + 0.25 * (end - float(t.min())))
    early = torch.tensor([float(t.min()) - 5 * DAY_SECONDS], dtype=torch.float64)
    assert float(trend.shift(early)) == pytest.approx(trend.slope * (float(t.min()) - trend.origin))
    # the level at the period after the log: the trend corrects most of the time-blind miss
    after = torch.linspace(end, end + 3 * DAY_SECONDS, 1000, dtype=torch.float64)
    true_gap = amp * (2 * (after / DAY_SECONDS) / days - 1)
    blind_err = float((true_gap - 0.0).abs().mean())   # the model's level is the log's average (0)
    err = float((true_gap - trend.shift(after)).abs().mean())
    assert err < 0.3 * blind_err
    assert "logit/day applied" in trend.describe()


@pytest.mark.parametrize("seed", range(6))
def test_no_drift_no_trend(seed):
    z, y, t = _log(lambda d: 0.0 * d, seed=seed)
    trend = fit_level_trend(z, y, t)
    assert not trend.applied
    assert trend.slope == 0.0 and float(trend.shift(None)) == 0.0
    assert torch.equal(trend.shift(t[:5]), torch.zeros(5, dtype=torch.float64))
    assert "none applied" in trend.describe()


@pytest.mark.parametrize(("days", "phase"), [(12, 1.0), (20, 1.0), (12, 0.0)])
def test_a_weekly_cycle_is_not_extrapolated(days, phase):
    """A level that rises and falls with the week: a straight line through the days has a
    significant slope (the part of the cycle the log happens to cover), but the trend net of the
    cycle is not significant, so nothing is applied."""
    z, y, t = _log(lambda d: 0.4 * torch.sin(2 * math.pi * d / 7 + phase), days=days, n=120_000)
    assert _line_p(z, y, t) < 0.01
    trend = fit_level_trend(z, y, t)
    assert not trend.applied, trend.verdict
    assert trend.evidence["check"] == "weekly cycle" and trend.evidence["cycle_p"] < 1e-6


@pytest.mark.slow
def test_day_to_day_scatter_widens_the_slope_and_keeps_a_true_trend():
    """A trained model's errors vary from day to day (here a level of each day, sd 0.15, ~13x the
    binomial variance of a day's gap): without a trend, a plain weighted line fires on that scatter
    (p < 0.01 in one of these 12 logs), the overdispersion-widened test in none; with a trend of
    0.02 logit per day under the same scatter, it is found and estimated within 3 SE."""
    naive = widened = 0
    for seed in range(12):
        z, y, t = _log(lambda d: 0.0 * d, seed=seed, day_sd=0.15, n=200_000)
        trend = fit_level_trend(z, y, t)
        assert trend.evidence["phi"] > 2
        naive += _line_p(z, y, t) < 0.01
        widened += trend.applied
    assert naive == 1 and widened == 0
    z, y, t = _log(lambda d: 0.02 * d, seed=1, day_sd=0.15, n=200_000)
    trend = fit_level_trend(z, y, t)
    assert trend.applied and trend.evidence["phi"] > 2, trend.verdict
    assert abs(trend.slope_per_day - 0.02) < 3 * trend.evidence["slope_se_per_day"]


def test_a_short_log_fits_the_line_alone():
    """Five days leave too few degrees of freedom for the cycle: the line alone, with its lack of
    fit checked."""
    z, y, t = _log(lambda d: 0.1 * d, days=5)
    trend = fit_level_trend(z, y, t)
    assert trend.applied and trend.evidence["check"] == "lack of fit", trend.verdict
    # a one-off jump on day 3 (a campaign starting): significant, but not a line
    z, y, t = _log(lambda d: torch.where(d > 3, 0.8, 0.0), days=5, n=200_000)
    bent = fit_level_trend(z, y, t)
    assert not bent.applied and "not along a line" in bent.verdict, bent.verdict


def test_too_short_and_no_time():
    z, y, t = _log(lambda d: 0.3 * d, days=2.5)
    trend = fit_level_trend(z, y, t)
    assert not trend.applied and "too short" in trend.verdict and trend.evidence["blocks"] == 3
    assert not fit_level_trend(z, y, None).applied
    assert not fit_level_trend(z[:0], y[:0], t[:0]).applied


def test_round_trip_and_bad_input():
    z, y, t = _log(lambda d: 0.03 * d)
    trend = fit_level_trend(z, y, t)
    back = LevelTrend.from_dict(trend.to_dict())
    assert back == trend
    assert torch.allclose(back.shift(t[:50]), trend.shift(t[:50]))
    bad_t = t.clone()
    bad_t[3] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        fit_level_trend(z, y, bad_t)
    with pytest.raises(ValueError, match="differ in length"):
        fit_level_trend(z, y[:-1], t)
    with pytest.raises(ValueError, match="alpha"):
        fit_level_trend(z, y, t, alpha=0)
    with pytest.raises(ValueError, match="block_seconds"):
        fit_level_trend(z, y, t, block_seconds=0)
    with pytest.raises(ValueError, match="min_blocks"):
        fit_level_trend(z, y, t, min_blocks=2)
    with pytest.raises(ValueError, match="cycle_seconds"):
        fit_level_trend(z, y, t, cycle_seconds=0)


# --- the export ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def drifting_run(tmp_path_factory, compose_cfg):
    """A tiny world with a strong linear drift, trained once through the CLI's train()."""
    from hybridrank.cli.train import train
    from hybridrank.data.worlds import draw_world, simulate_world

    root = tmp_path_factory.mktemp("drift")
    world = simulate_world(draw_world(3, size="tiny", drift="linear", drift_amplitude=0.5,
                                      logging="random", ctr=0.08, n_impressions=30_000, days=21))
    world.write(root / "world")
    cols = world.columns
    over = ["data=clicklog", f"data.source.path={root / 'world'}/*.parquet", "trainer.max_epochs=2",
            "trainer.enable_progress_bar=false", "intervals.n_boot=0", f"paths.output_dir={root / 'run'}"]
    for key in ("request", "label", "session", "user", "time", "position", "item", "bid", "true_p"):
        over.append(f"data.source.columns.{key}={cols[key] if cols[key] is not None else 'null'}")
    over.append("data.source.columns.numeric=[" + ",".join(cols["numeric"]) + "]")
    over.append("data.source.columns.categorical=[" + ",".join(cols["categorical"]) + "]")
    result = train(compose_cfg("config", *over))
    return {"ckpt": result["best_checkpoint"], "root": root, "compose": compose_cfg,
            "sign": float(world.params["drift_sign"]), "train_trend": result["level_trend"]}


@pytest.mark.slow
def test_export_follows_the_trend_row_by_row(drifting_run, tmp_path):
    from hybridrank.cli.export import evaluate, export
    from hybridrank.serving.checkpoint import load_model
    from hybridrank.serving.export import read_scores

    compose = drifting_run["compose"]

    def run(*over):
        out = tmp_path / f"s{len(list(tmp_path.iterdir()))}.parquet"
        export(compose("export", f"checkpoint={drifting_run['ckpt']}", f"output={out}",
                       "calibrator=none", *over))
        return read_scores(out)

    frame, meta = run("split=all")
    static, meta_off = run("split=all", "level_trend.mode=off")
    trend = LevelTrend.from_dict(meta["level_trend"])
    assert trend.applied, trend.verdict
    sign = drifting_run["sign"]   # the world's drift goes from -sign x 0.5 to +sign x 0.5 logit
    assert trend.slope_per_day * sign > 0
    assert not meta_off["level_trend"]["applied"] and "off" in meta_off["level_trend"]["verdict"]
    # training reported the same test on the same rows (metrics.json["level_trend"])
    assert drifting_run["train_trend"]["applied"]
    assert drifting_run["train_trend"]["slope"] == pytest.approx(trend.slope, rel=1e-9)
    # the logit column is the model's; pctr moves by the trend at each row's request time
    assert np.allclose(frame["logit"].to_numpy(), static["logit"].to_numpy())
    model = load_model(drifting_run["ckpt"])
    import hydra

    splits = hydra.utils.instantiate(model.hparams.config["data"]["source"], _partial_=True)(
        schema=model.schema).load()
    times = torch.cat([s.time[s.request_of_row()] for s in (splits.train, splits.val, splits.test)])
    moved = np.log(frame["pctr"].to_numpy() / (1 - frame["pctr"].to_numpy())) - \
        np.log(static["pctr"].to_numpy() / (1 - static["pctr"].to_numpy()))
    assert np.allclose(moved, trend.shift(times).numpy(), atol=1e-6)
    # the test period lies after the training rows: every test row is moved the drift's way, by
    # at most the line's value at its horizon limit
    test_moved = moved[-splits.test.n_impressions:] * sign
    assert (test_moved > 0).all()
    assert test_moved.max() <= trend.slope * sign * (trend.limit - trend.origin) + 1e-9
    # and the level of the test period comes closer to its clicks
    test = frame.tail(splits.test.n_impressions)
    clicks = float(test["label"].sum())
    assert abs(float(test["pctr"].sum()) - clicks) < abs(float(static.tail(len(test))["pctr"].sum()) - clicks)
    # the evaluation report scores what the export writes
    rep = evaluate(compose("eval", f"checkpoint={drifting_run['ckpt']}", "calibrator=none", "n_boot=0",
                           "figures=false", f"output_dir={tmp_path / 'eval'}"))
    assert rep["level_trend"]["applied"]
    assert rep["summaries"]["after"]["pcoc"] != pytest.approx(rep["summaries"]["before"]["pcoc"])


def test_bad_level_trend_options_are_errors():
    from hybridrank.serving.prepare import fit_trend

    with pytest.raises(ValueError, match="level_trend.mode must be 'auto' or 'off', got 'of'"):
        fit_trend(None, {"mode": "of"}, 1000)
    with pytest.raises(ValueError, match=r"level_trend: unknown keys \['alpah'\]"):
        fit_trend(None, {"alpah": 0.05}, 1000)
    off = fit_trend(None, {"mode": "off"}, 1000)
    assert not off.applied and "off" in off.verdict
    assert not fit_trend(None, {"mode": False}, 1000).applied   # YAML 1.1 reads a bare off as false


@pytest.mark.parametrize("name", ["export", "eval"])
def test_shipped_configs_hold_the_code_defaults(compose_cfg, name):
    """conf/export.yaml and conf/eval.yaml spell out LEVEL_TREND_DEFAULTS (what a config without
    the node gets), and those are fit_level_trend's own defaults."""
    import inspect

    from omegaconf import OmegaConf

    from hybridrank.serving.prepare import LEVEL_TREND_DEFAULTS

    cfg = compose_cfg(name, "checkpoint=x")
    assert OmegaConf.to_container(cfg.level_trend) == LEVEL_TREND_DEFAULTS
    params = inspect.signature(fit_level_trend).parameters
    for key, value in LEVEL_TREND_DEFAULTS.items():
        if key != "mode":
            assert params[key].default == value, key


def test_block_gaps_converge_on_extreme_logits():
    """Logits far in either tail (a block the model thinks never clicks, one it thinks always
    does, one mixing both, one beyond float64's sigmoid): every gap is finite and matches its
    clicks to 1e-8."""
    z = torch.tensor([-40.0] * 50 + [30.0] * 50 + [-35.0, 25.0] * 25 + [-800.0] * 50, dtype=torch.float64)
    block = torch.arange(200) // 50
    y = torch.zeros(200, dtype=torch.float64)
    y[150:152] = 1     # block 3: logits where σ underflows to 0 in float64
    y[:3] = 1          # 3 clicks where the model says none
    y[50:60] = 0       # block 1: 40 of 50 clicked where the model says all
    y[60:100] = 1
    y[100:125] = 1     # block 2: 25 clicks
    seen, gaps, var = block_gaps(z, y, torch.ones_like(z), block, 4)
    assert seen.tolist() == [0, 1, 2, 3] and np.isfinite(gaps).all() and np.isfinite(var).all()
    for k, g in zip(seen, gaps):
        m = block == int(k)
        n, yk = float(m.sum()), float(y[m].sum())
        assert float(torch.sigmoid(z[m] + float(g)).sum()) == pytest.approx((yk + 0.5) * n / (n + 1), abs=1e-8)


@pytest.mark.slow
def test_training_time_trend_scores_a_spread_sample_of_a_large_log(compose_cfg, monkeypatch):
    """Past ``max_rows`` training + validation impressions the training-time report scores every
    k-th piece of whole requests, about ``max_rows`` rows spread over the whole log; below it,
    every row, the same figures as the trend of all chunks."""
    import itertools

    from hybridrank.cli.train import build_datamodule, build_model, training_level_trend
    from hybridrank.serving.level_trend import model_level_trend

    cfg = compose_cfg("config", "paths.output_dir=unused", "data.source.n_users=400")
    dm = build_datamodule(cfg)
    model = build_model(cfg, dm).eval()
    total = dm.split_rows["train"] + dm.split_rows["val"]
    everything = itertools.chain(dm.eval_chunks("train", 1 << 20), dm.eval_chunks("val", 1 << 20))
    assert training_level_trend(model, dm, max_rows=total) == model_level_trend(model, everything).to_dict()

    scored, times = [], []
    predict = type(model).predict_split

    def counting(self, data, **kw):
        scored.append(data.n_impressions)
        times.append(data.time)
        return predict(self, data, **kw)

    monkeypatch.setattr(type(model), "predict_split", counting)
    cap = total // 4
    report = training_level_trend(model, dm, max_rows=cap, piece=500)
    assert report["verdict"]
    assert cap // 2 <= sum(scored) <= cap + 1000
    assert all(n <= 500 for n in scored) and len(scored) >= 8
    # spread over the log: the pieces' request times cover most of the training period's span
    t_all = torch.cat([d.time for d in dm.eval_chunks("train", None)]).double()
    t_seen = torch.cat([t for t in times if t is not None]).double()
    assert (t_seen.max() - t_seen.min()) >= 0.8 * (t_all.max() - t_all.min())


@pytest.mark.slow
def test_training_time_trend_reads_every_kth_chunk_of_a_log_in_many_chunks(compose_cfg):
    """A log of many chunks (streamed): the sample is every k-th chunk whole, the other chunks are
    not read; the trend is fitted on the rows of the chunks read."""
    from types import SimpleNamespace

    from hybridrank.cli.train import build_datamodule, build_model, training_level_trend
    from hybridrank.serving.level_trend import model_level_trend

    cfg = compose_cfg("config", "paths.output_dir=unused", "data.source.n_users=400")
    dm = build_datamodule(cfg)
    model = build_model(cfg, dm).eval()
    whole = {s: next(dm.eval_chunks(s, None)) for s in ("train", "val")}
    parts = {s: list(d.chunks(-(-d.n_impressions // 16))) for s, d in whole.items()}  # ~16 each
    n = min(len(parts["train"]), len(parts["val"]))
    assert n >= 12
    reads = []

    class ManyChunks:
        def layout(self):
            return list(range(n))

        def read_chunk(self, c, split):
            reads.append((c, split))
            return parts[split][c]

    total = sum(p.n_impressions for s in parts for p in parts[s][:n])
    fake = SimpleNamespace(split_rows={"train": total, "val": 0}, source=ManyChunks())
    report = training_level_trend(model, fake, max_rows=-(-total // 4))  # k = 4
    assert sorted({c for c, _ in reads}) == list(range(0, n, 4))
    assert {s for _, s in reads} == {"train", "val"}
    expect = model_level_trend(model, (parts[s][c] for c in range(0, n, 4) for s in ("train", "val")))
    assert report == expect.to_dict()
