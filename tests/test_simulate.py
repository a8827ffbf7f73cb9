"""The click-log simulator: determinism, statistics of the generated log, the blocks of a log
larger than memory and their writer, the console script."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
import scipy.special

from hybridrank.cli.simulate import main
from hybridrank.data.simulate import SIM_COLUMNS, clicklog_chunks, simulate_clicklog, write_clicklog
from hybridrank.data.simulators import writer


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


# ----------------------------------------------------------------------------------------------
# logs larger than memory: blocks of users, written as they come
# ----------------------------------------------------------------------------------------------
def test_one_block_is_the_log_bit_for_bit():
    ref = simulate_clicklog(n_users=300, seed=7)
    blocks = list(clicklog_chunks(n_users=300, chunk_users=300, seed=7))
    assert len(blocks) == 1 and blocks[0].equals(ref)
    assert next(iter(clicklog_chunks(n_users=300, seed=7))).equals(ref)  # the default block size


def test_blocks_continue_one_log():
    blocks = list(clicklog_chunks(n_users=250, chunk_users=100, seed=7))
    assert [b["user_id"].n_unique() for b in blocks] == [100, 100, 50]
    # the first block is the log of its 100 users, as simulate_clicklog draws it
    assert blocks[0].equals(simulate_clicklog(n_users=100, seed=7))
    log = pl.concat(blocks)
    assert tuple(log.columns) == SIM_COLUMNS
    # ids continue across blocks: requests 0..R-1 stored in order (every request's rows adjacent),
    # sessions and users disjoint between blocks and numbered without gaps
    rid = log["request_id"].to_numpy()
    assert rid[0] == 0 and set(np.unique(np.diff(rid))) <= {0, 1}
    assert log["request_id"].n_unique() == rid[-1] + 1
    assert sorted(log["user_id"].unique().to_list()) == list(range(250))
    sess = [set(b["session_id"].unique().to_list()) for b in blocks]
    assert not (sess[0] & sess[1]) and not (sess[1] & sess[2])
    assert log["session_id"].n_unique() == log["session_id"].max() + 1
    # later blocks share the item catalogue: an item's category, price and popularity signal
    per_item = log.group_by("item_id").agg(pl.col("item_category", "item_price", "item_pop")
                                           .n_unique())
    assert (per_item.drop("item_id") == 1).to_numpy().all()
    # ... and draw their own users and clicks
    assert not blocks[1].drop("request_id", "session_id", "user_id").equals(
        blocks[0].head(blocks[1].height).drop("request_id", "session_id", "user_id"))
    # every block's slates and probabilities follow the same model
    for b in blocks:
        per = b.group_by("request_id").agg(pl.len(), pl.col("position").max().alias("pmax"),
                                           pl.col("item_id").n_unique().alias("nitem"))
        assert (per["pmax"] == per["len"]).all() and (per["nitem"] == per["len"]).all()
    # the first block's intercept serves every block: the mean true CTR stays near the target
    assert log["p_true"].mean() == pytest.approx(0.03, rel=0.1)
    again = pl.concat(list(clicklog_chunks(n_users=250, chunk_users=100, seed=7)))
    assert again.equals(log)


def test_block_arguments_are_checked_before_any_draw():
    with pytest.raises(ValueError, match="chunk_users"):
        clicklog_chunks(n_users=10, chunk_users=0)
    with pytest.raises(ValueError, match="base_ctr"):
        clicklog_chunks(n_users=10, base_ctr=2.0)
    with pytest.raises(TypeError, match="n_user"):
        clicklog_chunks(n_user=10)


def _read(out) -> pl.DataFrame:
    if out.suffix == ".csv":
        return pl.read_csv(out)
    return pl.read_parquet(out / "*.parquet" if out.is_dir() else out)


@pytest.mark.parametrize("name", ["log.parquet", "log.csv", "parts"])
def test_writer_writes_the_blocks_as_one_log(tmp_path, name):
    out = tmp_path / "sub" / name
    summary = write_clicklog(out, n_users=250, chunk_users=100, seed=3)
    ref = pl.concat(list(clicklog_chunks(n_users=250, chunk_users=100, seed=3)))
    back = _read(out)
    if name.endswith(".csv"):  # text: integers exact, floats to the printed precision
        ints = [c for c in SIM_COLUMNS if ref[c].dtype != pl.Float64]
        assert back.select(ints).equals(ref.select(ints).cast(back.select(ints).schema))
        for c in set(SIM_COLUMNS) - set(ints):
            np.testing.assert_allclose(back[c].to_numpy(), ref[c].to_numpy(), rtol=1e-12)
    else:
        assert back.equals(ref)
    assert summary.files == (3 if name == "parts" else 1)
    if name == "parts":
        assert sorted(p.name for p in out.iterdir()) == [f"part-0000{i}.parquet" for i in range(3)]
    # the summary against the log itself
    no_click = ref.group_by("request_id").agg(pl.col("click").max())["click"]
    assert (summary.rows, summary.requests, summary.sessions, summary.users) == (
        ref.height, ref["request_id"].n_unique(), ref["session_id"].n_unique(), 250)
    assert summary.clicks == ref["click"].sum()
    assert summary.ctr == pytest.approx(ref["click"].mean())
    assert summary.mean_p_true == pytest.approx(ref["p_true"].mean(), rel=1e-12)
    assert summary.no_click_share == pytest.approx(float((no_click == 0).mean()))
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temporary left


def test_writer_small_log_in_many_row_groups_is_the_log(tmp_path, monkeypatch):
    """A log of one block written in row groups of 1,000 rows reads back as simulate_clicklog's."""
    import pyarrow.parquet as pq

    monkeypatch.setattr(writer, "ROW_GROUP_ROWS", 1_000)
    out = tmp_path / "log.parquet"
    write_clicklog(out, n_users=120, seed=5)
    ref = simulate_clicklog(n_users=120, seed=5)
    assert pq.ParquetFile(out).metadata.num_row_groups == math.ceil(ref.height / 1_000)
    assert pl.read_parquet(out).equals(ref)


@pytest.mark.parametrize("name", ["log.parquet", "parts"])
def test_streamed_reader_takes_the_written_log(tmp_path, name):
    """The click-log scanner (conf/data/clicklog_stream.yaml's reader) cuts the written log into
    chunks of whole requests without calling it scattered, and reads every row once."""
    from hybridrank.data.readers import ColumnMap
    from hybridrank.data.scanner import ClickLogScanner

    out = tmp_path / name
    write_clicklog(out, n_users=250, chunk_users=100, seed=3)
    path = out / "*.parquet" if name == "parts" else out
    scanner = ClickLogScanner(path, ColumnMap(request="request_id", label="click"), chunk_rows=5_000)
    chunks = scanner.layout()
    assert len(chunks) > 3
    ref = pl.concat(list(clicklog_chunks(n_users=250, chunk_users=100, seed=3)))
    assert sum(c.n_rows for c in chunks) == ref.height
    assert sum(c.n_requests for c in chunks) == ref["request_id"].n_unique()


def test_writer_memory_does_not_grow_with_the_log(tmp_path):
    """tracemalloc's peak (numpy's arrays) while writing 2 and 8 blocks of 100 users is the same,
    and a fraction of building the 8-block-sized log in memory."""
    import tracemalloc

    def peak(fn) -> int:
        tracemalloc.start()
        try:
            fn()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    write_clicklog(tmp_path / "warm.parquet", n_users=20, chunk_users=10, seed=1)  # imports, pools
    small = peak(lambda: write_clicklog(tmp_path / "a.parquet", n_users=200, chunk_users=100, seed=1))
    large = peak(lambda: write_clicklog(tmp_path / "b.parquet", n_users=800, chunk_users=100, seed=1))
    whole = peak(lambda: simulate_clicklog(n_users=800, seed=1))
    assert large <= 1.1 * small
    assert large < 0.3 * whole


@pytest.mark.slow
def test_writer_peak_rss_is_flat(tmp_path):
    """Peak RSS growth of a process writing 1 block and 6 blocks of 2,000 users (~1.3M rows)."""
    import subprocess
    import sys

    from memprobe import PROBE

    def growth(n_users: int) -> float:
        code = PROBE + (
            "from hybridrank.data.simulate import write_clicklog\n"
            "base = reset_peak()\n"
            f"write_clicklog({str(tmp_path / f'log{n_users}.parquet')!r}, n_users={n_users}, "
            "chunk_users=2000, seed=0)\n"
            "print(peak_mb() - base)\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        return float(out.stdout.strip().splitlines()[-1])

    one, six = growth(2_000), growth(12_000)
    assert six < 1.25 * one + 20, (one, six)


def test_cli_writes_a_folder_of_blocks(tmp_path, capsys):
    out = tmp_path / "logs" / "sim"
    rc = main(["--out", str(out), "--n-users", "250", "--chunk-users", "100", "--seed", "3"])
    assert rc == 0
    assert pl.read_parquet(out / "*.parquet").equals(
        pl.concat(list(clicklog_chunks(n_users=250, chunk_users=100, seed=3))))
    assert "(3 files)" in capsys.readouterr().out
    rc = main(["--out", str(out), "--n-users", "250"])  # the folder holds files now
    assert rc == 2 and "not empty" in capsys.readouterr().err
