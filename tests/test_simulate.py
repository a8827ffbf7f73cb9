"""The click-log simulator: determinism, statistics of the generated log, the console script."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
import scipy.special

from hybridrank.cli.simulate import main
from hybridrank.data.simulate import SIM_COLUMNS, simulate_clicklog


@pytest.fixture(scope="module")
def log() -> pl.DataFrame:
    return simulate_clicklog(seed=3)


def test_same_seed_same_frame_different_seed_different():
    a = simulate_clicklog(n_users=300, seed=7)
    b = simulate_clicklog(n_users=300, seed=7)
    c = simulate_clicklog(n_users=300, seed=8)
    assert a.equals(b)
    assert not a.equals(c)


def test_columns_and_types(log):
    assert tuple(log.columns) == SIM_COLUMNS
    for c in ("request_id", "session_id", "user_id", "time", "position", "item_id",
              "item_category"):
        assert log[c].dtype == pl.Int64, c
    for c in ("item_price", "item_pop", "hour", "user_activity", "bid", "p_true", "p_true_ref"):
        assert log[c].dtype == pl.Float64, c
    assert set(log["click"].unique().to_list()) <= {0, 1}


def test_default_size():
    """The default log's size, from the simulator's own parameters: sessions per user and requests
    per session are ``1 + Poisson(mean - 1)``, slate sizes uniform on ``min_slate..max_slate``.
    Each level's count is within 4 standard deviations of its expectation (compound sums:
    ``Var[Σ_{i<=M} X_i] = E[M] Var[X] + E[X]^2 Var[M]``), and the rows are the slates' sum."""
    import inspect

    par = {k: v.default for k, v in inspect.signature(simulate_clicklog).parameters.items()}
    df = simulate_clicklog()
    lam_s, lam_r = par["sessions_per_user"] - 1.0, par["requests_per_session"] - 1.0
    lo, hi = par["min_slate"], par["max_slate"]
    slate_mean, slate_var = (lo + hi) / 2, ((hi - lo + 1) ** 2 - 1) / 12
    sessions = (par["n_users"] * par["sessions_per_user"], par["n_users"] * lam_s)  # (mean, var)
    requests = (sessions[0] * par["requests_per_session"],
                sessions[0] * lam_r + par["requests_per_session"] ** 2 * sessions[1])
    rows = (requests[0] * slate_mean, requests[0] * slate_var + slate_mean ** 2 * requests[1])
    assert rows[0] == 270_000  # 2,500 users x 3 sessions x 3 requests x 12 items on average
    per_request = df.group_by("request_id").len()["len"]
    observed = {"sessions": df["session_id"].n_unique(), "requests": df["request_id"].n_unique(),
                "rows": df.height}
    for name, (mean, var) in {"sessions": sessions, "requests": requests, "rows": rows}.items():
        assert abs(observed[name] - mean) <= 4 * math.sqrt(var), (name, observed[name], mean, var)
    assert df["user_id"].n_unique() <= par["n_users"]
    assert per_request.min() >= lo and per_request.max() <= hi
    assert per_request.sum() == df.height


def test_ctr_and_sparse_clicks(log):
    ctr = log["click"].mean()
    assert 0.02 <= ctr <= 0.05
    no_click = log.group_by("request_id").agg(pl.col("click").max())["click"]
    assert (no_click == 0).mean() >= 0.60


def test_base_ctr_is_respected():
    for target in (0.02, 0.05):
        df = simulate_clicklog(n_users=800, base_ctr=target, seed=1)
        assert df["p_true"].mean() == pytest.approx(target, rel=1e-3)


def test_slates_are_contiguous_positions_of_distinct_items(log):
    per = log.group_by("request_id").agg(
        n=pl.len(), pmin=pl.col("position").min(), pmax=pl.col("position").max(),
        npos=pl.col("position").n_unique(), nitem=pl.col("item_id").n_unique(),
        nsess=pl.col("session_id").n_unique(), nuser=pl.col("user_id").n_unique(),
        ntime=pl.col("time").n_unique(),
    )
    assert per["n"].min() >= 4 and per["n"].max() <= 20
    assert (per["pmin"] == 1).all() and (per["pmax"] == per["n"]).all()
    assert (per["npos"] == per["n"]).all() and (per["nitem"] == per["n"]).all()
    assert (per["nsess"] == 1).all() and (per["nuser"] == 1).all() and (per["ntime"] == 1).all()
    # rows are stored request after request, positions ascending
    rid = log["request_id"].to_numpy()
    assert np.all(np.diff(rid) >= 0)
    pos = log["position"].to_numpy()
    same = np.diff(rid) == 0
    assert np.all(np.diff(pos)[same] == 1)


def test_sessions_hold_several_requests_in_time_order(log):
    req = log.group_by("request_id").agg(pl.col("session_id").first(), pl.col("time").first())
    per_sess = req.group_by("session_id").agg(n=pl.len())
    assert per_sess["n"].mean() >= 2.0
    assert (per_sess["n"] >= 2).mean() >= 0.5
    # time strictly increases between consecutive requests of a session
    ordered = req.sort("session_id", "request_id")
    d = ordered.with_columns(dt=pl.col("time").diff().over("session_id"))["dt"].drop_nulls()
    assert (d > 0).all()
    span_days = (log["time"].max() - log["time"].min()) / 86_400
    assert 25 <= span_days <= 31
    users = log.group_by("user_id").agg(pl.col("session_id").n_unique())
    assert users["session_id"].mean() > 1.5


def test_probabilities_and_clicks_agree(log):
    p = log["p_true"].to_numpy()
    y = log["click"].to_numpy()
    assert np.all((p > 0) & (p < 1))
    se = math.sqrt(np.sum(p * (1 - p))) / p.size
    assert abs(y.mean() - p.mean()) < 4 * se
    assert (log["bid"] > 0).all()


def test_position_effect_decreases(log):
    by_pos = log.group_by("position").agg(pl.col("p_true").mean()).sort("position")
    means = by_pos["p_true"].to_numpy()
    assert np.all(np.diff(means[:10]) < 0)  # top positions: strictly decreasing on average
    assert means[0] > 2 * means[-1]


def test_problem_is_learnable_but_not_trivial(log):
    """p_true beats the base rate clearly; the features are informative but noisy."""
    y = log["click"].to_numpy().astype(float)
    p = log["p_true"].to_numpy()
    bayes = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
    base = y.mean()
    prior = -(base * math.log(base) + (1 - base) * math.log(1 - base))
    assert bayes < 0.93 * prior
    logit = scipy.special.logit(p)
    corr = np.corrcoef(log["item_pop"].to_numpy(), logit)[0, 1]
    assert 0.05 < corr < 0.9


def test_invalid_arguments():
    with pytest.raises(ValueError, match="min_slate"):
        simulate_clicklog(min_slate=5, max_slate=4)
    with pytest.raises(ValueError, match="base_ctr"):
        simulate_clicklog(base_ctr=1.5)


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_cli_writes_a_readable_file(tmp_path, capsys, suffix):
    out = tmp_path / "sub" / f"log{suffix}"
    rc = main(["--out", str(out), "--n-users", "120", "--seed", "5", "--base-ctr", "0.04"])
    assert rc == 0
    df = pl.read_parquet(out) if suffix == ".parquet" else pl.read_csv(out)
    expected = simulate_clicklog(n_users=120, seed=5, base_ctr=0.04)
    assert df.height == expected.height
    assert df["click"].to_list() == expected["click"].to_list()
    printed = capsys.readouterr().out
    assert str(out) in printed and "CTR" in printed and "requests" in printed
    assert not [p for p in out.parent.iterdir() if p.name.endswith(".tmp")]


def test_cli_rejects_unknown_suffix(tmp_path):
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "log.txt"), "--n-users", "50"])


def test_reference_position_probability_removes_the_position_effect(log):
    """p_true_ref is the same impression's true CTR at position 1: equal at position 1, and the
    logit difference is exactly the simulator's position effect 0.5 * log(position)."""
    import numpy as np

    first = log.filter(pl.col("position") == 1)
    assert np.allclose(first["p_true"].to_numpy(), first["p_true_ref"].to_numpy())
    lt = np.log(log["p_true"].to_numpy() / (1 - log["p_true"].to_numpy()))
    lr = np.log(log["p_true_ref"].to_numpy() / (1 - log["p_true_ref"].to_numpy()))
    assert np.allclose(lr - lt, 0.5 * np.log(log["position"].to_numpy()), atol=1e-9)
