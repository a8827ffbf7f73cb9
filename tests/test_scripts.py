"""The benchmark scripts: docs/BENCHMARKS.md is rewritten only when asked and only from complete
runs; a missing optional dependency is an error; the one way the scripts train is ``train(cfg)``."""

from __future__ import annotations

import hashlib
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
DOCS = ROOT / "docs" / "BENCHMARKS.md"


@pytest.fixture(scope="module")
def script(cli_server):
    """``script(name, *args, env_code=..., timeout=...)``: run ``scripts/<name>`` in a subprocess
    (``env_code`` runs first, e.g. to hide a module), served by the test fork server (the imports
    paid once; tests/cli_server.py) where there is one; the commands it starts are served too."""

    def run(name: str, *args: str, env_code: str = "pass", timeout: float = 1200):
        code = (f"import sys, runpy; sys.path.insert(0, {str(SCRIPTS)!r}); {env_code}; "
                f"sys.argv = [{name!r}, *{list(args)!r}]; "
                f"runpy.run_path({str(SCRIPTS / name)!r}, run_name='__main__')")
        python = cli_server.python if cli_server is not None else sys.executable
        env = cli_server.env() if cli_server is not None else None
        return subprocess.run([python, "-c", code], cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout, env=env)

    return run


def _digest() -> str:
    return hashlib.sha256(DOCS.read_bytes()).hexdigest()


@pytest.mark.parametrize("name, args", [
    ("bench_letor.py", ["--folds", "1"]),
    ("bench_letor.py", ["--models", "bce_softmax"]),
    ("bench_letor.py", ["--quick"]),
    ("bench_real.py", ["--datasets", "mslr"]),
    ("bench_real.py", ["--quick"]),
    ("pareto.py", ["--quick"]),
    ("bench_losses.py", ["--quick"]),
    ("bench_convergence.py", ["--quick"]),
    ("bench_auction.py", ["--quick"]),
    ("bench_all.py", ["--only", "reader"]),
])
@pytest.mark.slow
def test_partial_runs_refuse_to_write_docs_before_any_work(script, name, args):
    before = _digest()
    p = script(name, *args, "--write-docs", timeout=300)
    assert p.returncode != 0, p.stdout[-2000:]
    assert "--write-docs: a partial run does not replace the published tables" in p.stderr, p.stderr[-2000:]
    assert _digest() == before


@pytest.mark.parametrize("name, args", [("bench_letor.py", ["--models", "lgbm_binary", "bce"]),
                                        ("bench_real.py", ["--models", "mlp", "lgbm_binary"])])
@pytest.mark.slow
def test_missing_lightgbm_is_an_error(script, name, args):
    before = _digest()
    p = script(name, *args, env_code="sys.modules['lightgbm'] = None", timeout=300)
    assert p.returncode != 0
    assert "LightGBM is not installed" in p.stderr and "lgbm_binary" in p.stderr, p.stderr[-2000:]
    assert _digest() == before


def test_write_docs_refuses_failed_rows(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import _common as C

    target = tmp_path / "B.md"
    target.write_text("# Benchmarks\n")
    monkeypatch.setattr(C, "DOCS", target)
    args = type("Args", (), {"write_docs": True})()
    with pytest.raises(SystemExit, match="1 row\\(s\\) failed: fold1 jrc"):
        C.write_docs(args, {"s": "table"}, failures=["fold1 jrc"])
    assert target.read_text() == "# Benchmarks\n"
    C.write_docs(args, {"s": "table"})
    assert "<!-- BEGIN s -->\ntable\n<!-- END s -->" in target.read_text()
    args.write_docs = False
    C.write_docs(args, {"s": "other"})
    assert "other" not in target.read_text()


def test_scripts_train_one_way():
    """No script builds its own Lightning trainer for a model it reports (bench_train.py times the
    training machinery itself), and one LightGBM fitter: _common.fit_lightgbm."""
    for path in SCRIPTS.glob("*.py"):
        text = path.read_text()
        if path.name != "bench_train.py":
            assert "pl.Trainer(" not in text and "build_trainer(" not in text, path.name
        if path.name not in ("_common.py", "bench_train.py"):
            assert "from hybridrank.cli.train import" not in text or "CONF_MODULE" in text, path.name
            assert "lgb.train(" not in text, path.name
    common = (SCRIPTS / "_common.py").read_text()
    assert common.count("lgb.train(") == 1 and "train(cfg, splits=splits)" in common


@pytest.mark.slow
@pytest.mark.real_data
def test_quick_letor_run_leaves_the_docs_alone(script, real_data, tmp_path):
    before = _digest()
    p = script("bench_letor.py", "--quick", "--out", str(tmp_path / "letor.json"))
    assert p.returncode == 0, p.stderr[-4000:]
    assert "docs/BENCHMARKS.md not touched" in p.stdout
    assert "hybridrank bce_softmax" in p.stdout and "LightGBM binary" in p.stdout
    assert _digest() == before
    assert (tmp_path / "letor.json").is_file()


@pytest.mark.slow
def test_generalization_bench_on_a_small_random_world(script, tmp_path):
    """scripts/bench_generalization.py end to end on one tiny world shown in random order (seed
    4000: ~8k impressions, true offsets -1.09 log(slot)): it trains through the command line,
    exports, and the row it reports is judged against the world's truth. A random-order log must
    not be flagged, the stopping rule must act, and the offsets' intervals must hold the truth in
    most slots (the world is small: the offsets themselves are loose)."""
    out = tmp_path / "gen.json"
    p = script("bench_generalization.py", "--worlds", "1", "--seed0", "4000", "--size", "tiny",
                "--variants", "tower", "--no-reference", "--pin", "logging=random",
                "--out", str(out), timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    import json

    result = json.loads(out.read_text())["results"][0]
    assert result["spec"]["logging"] == "random" and result["spec"]["size"] == "tiny"
    row = result["rows"][0]
    assert row["variant"] == "tower" and row["stop"] == "criterion"
    assert row["identified"] is True and abs(row["rank_corr"]) < 0.05, row
    covered, slots = map(int, row["offsets_covered"].split("/"))
    assert slots >= 3 and covered >= slots - 1, row
    assert 0.8 < row["pcoc_ref"] < 1.25, row
    assert row["excess"] > 0 and 0 < row["welfare"] <= 1.0 + 1e-9, row
    assert 0 <= row["slot_err"] < 1.0, row
    assert "| 4000 | tower |" in p.stdout  # the per-world table is printed
    # the export's serving-level interval, and whether it held the truth (its own rule)
    assert row["level_lo"] < row["level_hi"], row
    assert row["level_covered"] == (-row["level_hi"] <= math.log(row["pcoc_ref_none"]) <= -row["level_lo"])
    # the seen / unseen items split the test rows: the whole PCOC lies between the two parts'
    assert 0 <= row["new_share"] <= 1
    if row["pcoc_new"] is not None:
        lo, hi = sorted((row["pcoc_new"], row["pcoc_seen"]))
        assert lo - 1e-9 <= row["pcoc_ref"] <= hi + 1e-9, row


def test_slot_error_reads_offsets_as_an_auction_does(monkeypatch):
    """bench_generalization's ``slot_err`` (brute-force loop as the reference), and the reason for
    it: a model that cannot tell two kinds of item apart (true logits -3 and 0, half each; it
    scores both at their average CTR) is calibrated in every slot only with offsets flatter than
    the truth's, so its offsets miss the truth by more than 0.1 logit while the slot CTRs they
    imply are exact."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import bench_generalization as BG
    import numpy as np

    z_true = np.repeat([-3.0, 0.0], 500)
    true = np.array([0.0, -0.5, -1.0, -1.4])
    z_model = np.full(z_true.size, BG._logit(np.array([BG._sigmoid(z_true).mean()]))[0])
    fitted = BG._logit(np.array([BG._sigmoid(z_true + b).mean() for b in true])) - z_model[0]
    assert np.max(np.abs(fitted - true)) > 0.1                  # offsets "wrong" ...
    assert BG.slot_ctr_error(z_model, z_true, fitted, true) < 1e-9   # ... slot CTRs right
    # against a loop, on arbitrary values
    rng = np.random.default_rng(2)
    zm, zt = rng.normal(-2, 1, 300), rng.normal(-2, 1.3, 300)
    off, tru = np.array([0.0, -0.2, -0.7]), np.array([0.0, -0.3, -0.5])
    ratios = []
    for j in range(3):
        num = sum(1 / (1 + math.exp(-(a + off[j]))) for a in zm)
        den = sum(1 / (1 + math.exp(-(b + tru[j]))) for b in zt)
        ratios.append(num / den)
    want = max(abs(math.log(r / ratios[0])) for r in ratios[1:])
    assert BG.slot_ctr_error(zm, zt, off, tru) == pytest.approx(want, rel=1e-9)


def test_generalization_bench_splits_pcoc_by_items_unseen_in_training(monkeypatch):
    """``_unseen_rows`` against a hand count: item ids absent from training (compared as strings,
    whatever their dtype) form ``new_share``; PCOC on those and on the rest."""
    import types

    import numpy as np
    import polars as pl

    monkeypatch.syspath_prepend(str(SCRIPTS))
    import bench_generalization as BG

    w = {"world": types.SimpleNamespace(columns={"item": "ad"}),
         "train": pl.DataFrame({"ad": [1, 2, 2, 5]})}
    items = pl.Series(["1", "3", "5", "7", "2"])
    pctr = np.array([0.1, 0.2, 0.3, 0.4, 0.5])
    p_ref = np.array([0.1, 0.1, 0.3, 0.2, 0.25])
    out = BG._unseen_rows(w, items, pctr, p_ref)
    assert out["new_share"] == pytest.approx(2 / 5)
    assert out["pcoc_new"] == pytest.approx((0.2 + 0.4) / (0.1 + 0.2))
    assert out["pcoc_seen"] == pytest.approx((0.1 + 0.3 + 0.5) / (0.1 + 0.3 + 0.25))
    assert BG._unseen_rows(w, pl.Series(["1", "2"]), pctr[:2], p_ref[:2])["pcoc_new"] is None


def test_loss_mix_bench_measures_the_one_over_ctr_pull(monkeypatch):
    """The softmax term's pull on the logits over BCE's is about 1 / CTR (the docstring's
    arithmetic), measured by autograd on a small world's batches."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import bench_loss_mix as B

    row = B.world_row(1143, budget=2048, n_batches=4, size="tiny")
    assert 0.5 < row["ratio"] * row["ctr"] < 1.2, row
    assert 1.0 < row["softmax"] < 2.0 and row["bce"] < 4 * row["ctr"], row


def test_bench_commits_matches_tables_cell_by_cell(monkeypatch):
    """The side-by-side runner pairs cells by (table, row, column): a title's own timing does not
    split a table, repeated titles and row labels are numbered, text cells name the row."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import bench_commits as BC

    def run(load: str, ms: tuple[str, str]) -> str:
        return (f"chatter\nsimulated log: 1,000 rows (load: {load} s)\n\n| n | method | ms | NDCG |\n"
                f"|---|---|---|---|\n| 20,000 | ours | {ms[0]} | 0.5 |\n| 20,000 | torchmetrics | "
                f"{ms[1]} | 0.5 |\n\nsimulated log: 1,000 rows (load: 9 s)\n| n | ms |\n|--|--|\n"
                "| 1 | 2.0 ms |\n| 1 | 4.0 ms |\n")

    base = [BC.parse_tables(run("0.6", ("10", "1,000"))), BC.parse_tables(run("0.7", ("12", "1,100")))]
    here = [BC.parse_tables(run("0.8", ("5", "1,000"))), BC.parse_tables(run("0.5", ("6", "1,100")))]
    t = "simulated log: # rows (load: # s)"
    assert base[0][(t, "20,000 / ours", "ms")] == "10"
    assert base[0][(f"{t} #2", "1 #2", "ms")] == "4.0 ms"
    rows = {(r[1], r[2]): r[3:] for r in BC.compare(base, here)}
    assert rows[("20,000 / ours", "ms")] == pytest.approx((11.0, 5.5, 0.5, 5 / 10, 6 / 12))
    assert rows[("20,000 / torchmetrics", "ms")] == pytest.approx((1050.0, 1050.0, 1.0, 1.0, 1.0))
    assert rows[("20,000 / ours", "NDCG")][2] == 1.0
    assert BC.number("**251x**") == 251 and BC.number("0.45 ± 0.01") == 0.45 and BC.number("n/a") is None


def test_offsets_bench_recovers_known_offsets_and_its_floor_solves_the_click_equation(monkeypatch):
    """bench_offsets: the level shift solves sum sigmoid(logit + c) = clicks (checked against
    scipy's root finder); given the true relevance of a random-order log with many clicks, the
    shipped tower recovers the offsets and the level; a tiny world's row has every estimator."""
    from scipy.optimize import brentq

    monkeypatch.syspath_prepend(str(SCRIPTS))
    import bench_offsets as BO
    import numpy as np

    rng = np.random.default_rng(0)
    z = rng.normal(-3.0, 1.0, 5000)
    c = BO.level_shift(z, 400.0)
    assert c == pytest.approx(brentq(lambda s: float(BO._sigmoid(z + s).sum()) - 400.0, -10, 10), abs=1e-9)
    with pytest.raises(ValueError, match="clicks"):
        BO.level_shift(z, 0.0)

    true = np.array([0.0, -0.3, -0.5, -0.65, -0.75, -0.8])
    n_req, slots = 40_000, true.size
    pos = np.tile(np.arange(1, slots + 1), n_req)
    req = np.repeat(np.arange(n_req), slots)
    rel = rng.normal(-2.0, 0.8, pos.size)
    click = (rng.random(pos.size) < BO._sigmoid(rel + true[pos - 1] + 0.2)).astype(np.float64)
    off, shift, level = BO.fit_offsets(pos, rel, click, req)
    assert np.max(np.abs(off[:slots] - true)) < 0.06, off[:slots]
    assert shift == pytest.approx(0.2, abs=0.04)
    assert level is None  # no bootstrap asked for

    row = BO.world_row(4000, size="tiny")
    assert 0.8 < row["floor"] < 1.25 and row["clicks"] > 0
    # bench_generalization's floor (drift removed, then the same level fit) agrees without drift
    import bench_generalization as BG

    from hybridrank.data.readers import ColumnMap
    from hybridrank.data.sources import split_frame
    from hybridrank.data.worlds import draw_world, simulate_world

    world = simulate_world(draw_world(4000, size="tiny", logging="random", drift="none"))
    train, _, test = split_frame(world.frame, ColumnMap(**world.columns), **BG.SPLIT)
    assert BG.floor(world, train, test) == pytest.approx(BO.world_row(4000, size="tiny", drift="none")["floor"])
    assert set(BO.ESTIMATORS) <= set(row) and all(r["offset_err"] >= 0 for k, r in row.items() if k in BO.ESTIMATORS)
    # the shipped rows carry the serving level's interval and whether it holds the true level
    lo, hi = row["shipped"]["level_lo"], row["shipped"]["level_hi"]
    shift = np.log(row["shipped"]["pcoc"])  # about the level's error at a small click rate
    assert lo < hi and isinstance(row["shipped"]["level_covered"], bool)
    assert "level_lo" not in row["no_pool"]
    if abs(shift) < 0.5 * min(-lo, hi):
        assert row["shipped"]["level_covered"]


def test_offsets_ceiling_matches_a_brute_force_per_slot_estimator(monkeypatch):
    """bench_offsets' ceiling without a shape assumption against the estimator it describes,
    simulated: clicks drawn again and again for fixed rows, each slot's logit estimated from its
    own clicks (exploration rows only, when marked), the offsets against slot 1, the level slot
    1's own (unmarked) or every click's given the offsets (marked, solved by the bench's own
    level fit). The shares of draws meeting each target agree within Monte Carlo error."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import bench_offsets as BO
    import numpy as np

    rng = np.random.default_rng(5)
    true = np.array([0.0, -0.35, -0.6])                   # offsets of slots 1-3
    level, per_slot = -2.6, 9000
    pos = np.repeat(np.arange(1, 4), per_slot)
    p = BO._sigmoid(level + true[pos - 1])
    rel_test = np.full(500, level)
    reps = 1500
    for marked in (False, True):
        fit = (np.arange(pos.size) % 3 == 0) if marked else np.ones(pos.size, dtype=bool)
        got = BO.information_ceiling(pos, p, fit, rel_test, marked=marked, top=3, seed=1)
        hits = {name: 0 for name, _, _ in BO.TARGETS} | {"pcoc_band": 0}
        for _ in range(reps):
            y = (rng.random(pos.size) < p).astype(np.float64)
            rate = np.array([y[fit & (pos == j)].mean() for j in (1, 2, 3)])
            theta = np.log(rate / (1 - rate))
            off = theta - theta[0]
            if marked:   # the level from every click given the estimated offsets
                c = BO.level_shift(off[pos - 1], y.sum())
            else:
                c = theta[0]
            pcoc = float(BO._sigmoid(rel_test - level + c).sum() / BO._sigmoid(rel_test).sum())
            worst = float(np.max(np.abs(off[1:] - true[1:])))
            for name, band, tol in BO.TARGETS:
                hits[name] += abs(pcoc - 1) <= band and worst <= tol
            hits["pcoc_band"] += abs(pcoc - 1) <= 0.05
        for name, count in hits.items():
            assert got[name] == pytest.approx(count / reps, abs=0.05), (marked, name, got, hits)
        assert 0.05 < got["pcoc_band"] < 0.95  # the check is not trivially at an end
    # a slot the fitted rows never reach cannot be estimated without a shape assumption
    none = BO.information_ceiling(pos, p, pos != 2, rel_test, marked=True, top=3)
    assert all(v == 0.0 for v in none.values())


def test_level_trend_bench_follows_a_linear_drift_and_leaves_a_flat_level(monkeypatch):
    """bench_level_trend on tiny worlds: without drift the perfect time-blind model is left as it
    is (no trend applied, every rule equal); with a strong linear drift pinned, the shipped rule
    finds it and brings PCOC at slot 1 on the period after the log closer to 1; the aggregate
    table counts every world once per rule."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import bench_level_trend as BL

    pins = {"n_impressions": 60_000, "ctr": 0.08, "drift_amplitude": 0.5, "days": 21}
    flat = BL.world_row(4001, "none", size="tiny", **{k: v for k, v in pins.items() if k != "drift_amplitude"})
    assert not flat["applied"] and flat["static"] == flat["trend"] == flat["plain_line"]
    lin = BL.world_row(4001, "linear", size="tiny", **pins)
    assert lin["applied"], lin["verdict"]
    assert abs(lin["static"] - 1) > 0.15                         # the drift's miss
    assert abs(lin["trend"] - 1) < 0.5 * abs(lin["static"] - 1)  # mostly corrected
    table = BL.aggregate([flat, lin])
    assert "| none | 1 | static | 1/1 |" in table                 # 0.982
    # static 0.636; the trend 0.952 (0.92 when a day's gap was the ratio of mean rates)
    assert "| linear | 1 | static | 0/1 |" in table and "| linear | 1 | trend | 1/1 | 1/1 |" in table
    assert "| linear | 1 | (trend applied in) | 1/1 |" in table
