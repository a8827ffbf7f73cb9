"""The benchmark suite (benchmarks/): docs/BENCHMARKS.md is rewritten only when asked and only from
complete runs; a missing optional dependency is an error; every hybridrank training goes through
``train(cfg)`` (benchmarks.grid); the grid runner, the world harness and the baselines against
independent references; every benchmark has a documented command."""

from __future__ import annotations

import argparse
import hashlib
import importlib
import math
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
DOCS = ROOT / "docs" / "BENCHMARKS.md"


@pytest.fixture(autouse=True)
def _importable(monkeypatch):
    """``benchmarks`` is a package of the repository root, not of the installed wheel."""
    monkeypatch.syspath_prepend(str(ROOT))


@pytest.fixture(scope="module")
def bench(cli_server):
    """``bench(name, *args, env_code=..., timeout=...)``: ``python -m benchmarks.<name>`` in a
    subprocess (``env_code`` runs first, e.g. to hide a module), served by the test fork server
    (tests/cli_server.py) where there is one."""

    def run(name: str, *args: str, env_code: str = "pass", timeout: float = 1200):
        code = (f"import sys, runpy; sys.path.insert(0, {str(ROOT)!r}); {env_code}; "
                f"sys.argv = ['benchmarks.{name}', *{list(args)!r}]; "
                f"runpy.run_module('benchmarks.{name}', run_name='__main__', alter_sys=True)")
        python = cli_server.python if cli_server is not None else sys.executable
        env = cli_server.env() if cli_server is not None else None
        return subprocess.run([python, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                              env=env)

    return run


def _digest() -> str:
    return hashlib.sha256(DOCS.read_bytes()).hexdigest()


@pytest.mark.parametrize("name, args", [
    ("letor", ["--folds", "1"]),
    ("letor", ["--models", "bce_softmax"]),
    ("letor", ["--quick"]),
    ("real", ["--datasets", "mslr"]),
    ("real", ["--quick"]),
    ("losses", ["--quick"]),
])
@pytest.mark.slow
def test_partial_runs_refuse_to_write_docs_before_any_work(bench, name, args):
    before = _digest()
    p = bench(name, *args, "--write-docs", timeout=300)
    assert p.returncode != 0, p.stdout[-2000:]
    assert "--write-docs: a partial run does not replace the published tables" in p.stderr, p.stderr[-2000:]
    assert _digest() == before


@pytest.mark.parametrize("name, args", [("letor", ["--models", "lgbm_binary", "bce"]),
                                        ("real", ["--models", "mlp", "lgbm_binary"])])
@pytest.mark.slow
def test_missing_lightgbm_is_an_error(bench, name, args):
    before = _digest()
    p = bench(name, *args, env_code="sys.modules['lightgbm'] = None", timeout=300)
    assert p.returncode != 0
    assert "LightGBM is not installed" in p.stderr and "lgbm_binary" in p.stderr, p.stderr[-2000:]
    assert _digest() == before


def test_write_docs_refuses_failed_rows(tmp_path, monkeypatch):
    from benchmarks import common as C

    target = tmp_path / "B.md"
    target.write_text("# Benchmarks\n")
    monkeypatch.setattr(C, "DOCS", target)
    args = argparse.Namespace(write_docs=True)
    with pytest.raises(SystemExit, match="1 row\\(s\\) failed: fold1 jrc"):
        C.write_docs(args, {"s": "table"}, failures=["fold1 jrc"])
    assert target.read_text() == "# Benchmarks\n"
    C.write_docs(args, {"s": "table"})
    assert "<!-- BEGIN s -->\ntable\n<!-- END s -->" in target.read_text()
    C.write_docs(args, {"s": "new"})  # a second run replaces the section, prose around it stays
    assert target.read_text().count("<!-- BEGIN s -->") == 1 and "new" in target.read_text()
    args.write_docs = False
    C.write_docs(args, {"s": "other"})
    assert "other" not in target.read_text()


def test_benchmarks_train_one_way():
    """No benchmark builds its own Lightning trainer; ``train(cfg)`` is called in one place
    (benchmarks.grid) and LightGBM is fitted in one place (benchmarks.baselines). The exception is
    the throughput bench (benchmarks.train), which times Lightning's epoch loop itself beside a
    plain loop over the same model."""
    for path in BENCH.glob("*.py"):
        text = path.read_text()
        if path.name != "train.py":
            assert "pl.Trainer(" not in text and "build_trainer(" not in text, path.name
        if path.name not in ("grid.py", "train.py"):
            assert "hybridrank.cli.train import" not in text, path.name
        if path.name != "baselines.py":
            assert "lgb.train(" not in text, path.name
    assert (BENCH / "baselines.py").read_text().count("lgb.train(") == 1
    assert "return train(compose_config(" in (BENCH / "grid.py").read_text()


def test_shared_protocol_pieces_against_references():
    """MQ2008's folds rotate the five parts; the clipped log loss and the per-request standard
    error against plain loops."""
    from benchmarks import common as C

    names = [[Path(p).name for p in (*tr, va, te)] for tr, va, te in map(C.mq2008_fold, range(1, 6))]
    assert names[0] == ["S1.txt", "S2.txt", "S3.txt", "S4.txt", "S5.txt"]
    assert names[1] == ["S2.txt", "S3.txt", "S4.txt", "S5.txt", "S1.txt"]
    assert sorted(n[4] for n in names) == [f"S{i}.txt" for i in range(1, 6)]  # each part tested once
    assert C.parse_folds("1,3-4") == [1, 3, 4] and C.parse_folds("2") == [2]
    with pytest.raises(SystemExit, match="folds are 1..5"):
        C.parse_folds("0-2")
    q, p = np.array([0.0, 0.2, 1.0]), np.array([0.0, 1.0, 1.0])
    want = [-math.log(1 - 1e-7), -math.log(0.2), -math.log(1 - 1e-7)]
    assert C.xent(q, p) == pytest.approx(want)
    rng = np.random.default_rng(0)
    values, offsets = rng.normal(size=30), np.array([0, 4, 11, 12, 30])
    sums = [values[a:b].sum() for a, b in zip(offsets[:-1], offsets[1:])]
    mean = sum(sums) / 4
    sd = math.sqrt(sum((s - mean) ** 2 for s in sums) / 3)
    assert C.per_request_se(values, offsets) == pytest.approx(sd * 2 / 30)
    assert math.isnan(C.per_request_se(values[:4], offsets[:2]))
    assert C.parse_pin("n_impressions=400000") == ("n_impressions", 400000)
    assert C.parse_pin("mark_explore=True") == ("mark_explore", True) and C.parse_pin("x=0.5") == ("x", 0.5)
    with pytest.raises(ValueError, match="a pin is FIELD=VALUE, got '\\$V'"):
        C.parse_pin("$V")  # an unexpanded shell variable in a documented command


def test_real_pools_the_folds_test_requests_into_one_table():
    """``benchmarks.real``'s table over several folds pools their test requests: each row's
    pooled log loss is the impression-weighted mean of the folds' and its request count the sum
    (the pooling once lost the positions the metric engine reads, and the 5-fold run failed)."""
    import torch

    from benchmarks import real
    from hybridrank.lists import ListData, lengths_to_offsets

    def fold(lengths, seed):
        g = torch.Generator().manual_seed(seed)
        lengths = torch.tensor(lengths)
        n = int(lengths.sum())
        data = ListData(num=torch.zeros(n, 0), cat=torch.zeros(n, 0, dtype=torch.int64),
                        label=(torch.rand(n, generator=g) < 0.3).float(), offsets=lengths_to_offsets(lengths))
        return {"test": data, "logits": {"mlp|bce": torch.randn(n, generator=g).double()},
                "fit_seconds": {"mlp|bce": 1.0}, "info": {"mlp|bce": {}}}

    folds = [fold([3, 5, 2, 4], 0), fold([6, 1, 4], 1)]
    _, summary = real.dataset_table("mq2008", folds, ["mlp|bce"], n_boot=20, seed=0)
    per_fold = [f["logloss"] for f in summary["mlp|bce"]["per_fold"]]
    pooled = summary["mlp|bce"]["test"]["logloss"]["estimate"]
    assert pooled == pytest.approx((14 * per_fold[0] + 11 * per_fold[1]) / 25, rel=1e-6)
    want = torch.nn.functional.binary_cross_entropy_with_logits(
        torch.cat([f["logits"]["mlp|bce"] for f in folds]), torch.cat([f["test"].label for f in folds]).double())
    assert pooled == pytest.approx(float(want), rel=1e-6)


def test_grid_table_sets_runs_side_by_side():
    """``grid_table``: mean ± std over a set's seeds (the sample standard deviation), missing
    figures as ``-``, each distinct reference row once."""
    from benchmarks.grid import figure, grid_table

    ref = {"oracle (true pCTR)": {"logloss": 0.2, "ndcg@10": 0.9}, "base rate": {"logloss": 0.3}}

    def row(name, seed, ll, epochs):
        return {"name": name, "seed": seed, "result": {"test": {"test/logloss": ll}, "training": {"epochs": epochs},
                                                       "reference": ref}}

    rows = [row("a", 0, 0.25, 3), row("a", 1, 0.27, 5), row("b", 0, 0.24, None)]
    assert figure(rows[0]["result"], "training.epochs") == 3.0 and figure(rows[2]["result"], "training.epochs") is None
    assert figure(rows[0]["result"], "val/logloss") is None
    table = grid_table(rows, ["test/logloss", "training.epochs"]).splitlines()
    assert table[0] == "| set | runs | test/logloss | training.epochs |"
    assert table[2] == f"| a | 2 | 0.2600 ± {math.sqrt(2 * 0.01 ** 2):.4f} | 4.0000 ± {math.sqrt(2):.4f} |"
    assert table[3] == "| b | 1 | 0.2400 | - |"
    assert table[4:] == ["| *oracle (true pCTR)* | - | 0.2000 | - |", "| *base rate* | - | 0.3000 | - |"]


@pytest.mark.slow
def test_grid_runs_every_set_with_every_seed(tmp_path):
    """``run_grid`` on the simulator: one run per set and seed, in order; each row's figures are
    its run's metrics.json; a seed changes the model, the same seed repeats it exactly."""
    import json

    from benchmarks.grid import figure, main, run_grid

    base = ["data.source.n_users=150", "trainer.max_epochs=1"]
    sets = {"bce": ["loss=bce"], "bce again": ["loss=bce"]}
    rows = run_grid(sets, [0, 1], base=base, out_dir=tmp_path)
    assert [(r["name"], r["seed"]) for r in rows] == [(n, s) for n in sets for s in (0, 1)]
    for r in rows:
        saved = json.loads((tmp_path / r["name"] / f"seed{r['seed']}" / "metrics.json").read_text())
        assert saved["test"] == r["result"]["test"] and r["overrides"][-1] == f"seed={r['seed']}"
    ll = {(r["name"], r["seed"]): figure(r["result"], "test/logloss") for r in rows}
    assert ll[("bce", 0)] != ll[("bce", 1)]
    assert ll[("bce", 0)] == ll[("bce again", 0)] and ll[("bce", 1)] == ll[("bce again", 1)]
    with pytest.raises(SystemExit, match="NAME=OVERRIDES"):
        main(["--set", "no-equals-sign"])


@pytest.mark.slow
def test_reference_fm_learns_a_tiny_world():
    """The reference FM on a tiny random-order world: test log loss below the base rate's and
    within 0.01 of the Bayes limit; scored at slot 1 it predicts more clicks than at the logged
    slots (the true position curve falls), with PCOC at slot 1 within 35 % of the truth."""
    from benchmarks.baselines import fit_reference_fm
    from benchmarks.common import xent
    from benchmarks.worlds import split_world
    from hybridrank.data.worlds import draw_world, simulate_world

    world = simulate_world(draw_world(4000, size="tiny", logging="random", drift="none"))
    train, val, test = split_world(world)
    cols = {**world.columns, "numeric": [c for c in world.columns["numeric"] if c != world.columns["position"]]}
    predict = fit_reference_fm(train, val, cols)
    y = test[cols["label"]].to_numpy().astype(float)
    logged, at1 = predict(test, slot=None), predict(test, slot=1)
    base = float(train[cols["label"]].mean())
    assert xent(logged, y).mean() < xent(np.full_like(y, base), y).mean()
    p_true = test["true_p"].to_numpy()
    assert xent(logged, p_true).mean() - xent(p_true, p_true).mean() < 0.01
    assert at1.sum() > logged.sum() and 0.65 < at1.sum() / test["true_p_ref"].to_numpy().sum() < 1.35
    assert predict.epochs >= 2


@pytest.mark.slow
@pytest.mark.real_data
def test_quick_letor_run_leaves_the_docs_alone(bench, real_data, tmp_path):
    before = _digest()
    p = bench("letor", "--quick", "--out", str(tmp_path / "letor.json"))
    assert p.returncode == 0, p.stderr[-4000:]
    assert "docs/BENCHMARKS.md not touched" in p.stdout
    assert "hybridrank bce_softmax" in p.stdout and "LightGBM binary" in p.stdout
    assert _digest() == before
    assert (tmp_path / "letor.json").is_file()


@pytest.mark.slow
def test_world_harness_on_a_small_random_world(bench, tmp_path):
    """``python -m benchmarks.worlds`` end to end on one tiny world shown in random order (seed
    4000: ~8k impressions, true offsets -1.09 log(slot)): it trains through ``train(cfg)``,
    exports, and the row it reports is judged against the world's truth. A random-order log must
    not be flagged, the stopping rule must act, and the offsets' intervals must hold the truth in
    most slots (the world is small: the offsets themselves are loose)."""
    out = tmp_path / "gen.json"
    p = bench("worlds", "--worlds", "1", "--seed0", "4000", "--size", "tiny", "--variants", "tower",
              "--no-reference", "--pin", "logging=random", "--out", str(out), timeout=900)
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


@pytest.mark.slow
def test_model_scoring_matches_the_export_and_pairs_requests(tmp_path):
    """``--score model`` on one tiny random-order world: the kept checkpoint's excess at the logged
    slots equals the one computed from ``hybridrank-export`` (no calibrator, no level trend) joined
    to the truth by key, and its per-request sums add up to it; a second variant with the same
    overrides trains the same model, so the paired table reads a ratio of 1 and no difference; the
    reference FM keeps the grid setting of lower validation log loss; LightGBM has its row; the
    unseen users' share is a count over the frames."""
    import polars as pl

    from benchmarks import worlds as W
    from benchmarks.baselines import fit_reference_fm
    from benchmarks.common import xent

    grid = [{"l2": 1e-4, "lr": 1e-3}, {"l2": 1.0, "lr": 3e-3}]
    same = (["loss=bce", "trainer.max_epochs=1"], False)
    [result] = W.run_family("base", [4000], {"mlp": same, "mlp_again": same, W.LGBM: ([], False)}, size="tiny",
                            pins={"logging": "random"}, score="model", grid=grid, work=tmp_path)
    rows = {r["variant"]: r for r in result["rows"]}
    assert set(rows) == {"mlp", "mlp_again", "lgbm", "reference FM"}
    w = W.prepare_world(4000, tmp_path / "again", size="tiny", pins={"logging": "random"})
    cols = w.world.columns
    ckpt = next((tmp_path / "world4000" / "runs" / "mlp").rglob("*.ckpt"))
    scores, _ = W.export_scores(str(ckpt), w.dir / "test.parquet", tmp_path / "s.parquet", "none",
                                "level_trend.mode=off")
    keys = w.test.select(pl.col(cols["request"]).alias("request_id"), pl.col(cols["item"]).alias("item_id"),
                         "true_p")
    joined = keys.join(scores, on=["request_id", "item_id"], how="left", maintain_order="left")
    logged = joined["pctr_at_position" if "pctr_at_position" in joined.columns else "pctr"].to_numpy()
    p_true = joined["true_p"].to_numpy()
    excess = float(np.mean(xent(logged, p_true) - xent(p_true, p_true)))
    mlp = rows["mlp"]
    assert mlp["excess"] == pytest.approx(excess, rel=1e-4)
    assert sum(mlp["req_excess"]) / mlp["n_test"] == pytest.approx(mlp["excess"], rel=1e-4)
    assert len(mlp["req_excess"]) == w.offsets.size - 1 and mlp["n_test"] == w.test.height
    new = ~w.test[cols["user"]].cast(pl.String).is_in(w.train[cols["user"]].cast(pl.String).unique())
    assert mlp["new_user_share"] == pytest.approx(float(new.mean()))
    assert "| mlp_again | 1 | 1.000 (1.000-1.000) | 0 / 0 | +0.0000 |" in W.paired_table([result])
    ref_cols = {**cols, "numeric": [c for c in cols["numeric"] if c != cols["position"]]}
    val_ll = [fit_reference_fm(w.train, w.val, ref_cols, **g).best_val_log_loss for g in grid]
    assert rows["reference FM"]["setting"] == grid[int(np.argmin(val_ll))]
    assert rows["reference FM"]["val_ll"] == pytest.approx(min(val_ll))
    lgbm = rows["lgbm"]
    assert lgbm["excess"] > 0 and lgbm["best_iteration"] >= 1 and lgbm["new_user_share"] == mlp["new_user_share"]
    assert "| lgbm | 0/1 |" in W.against_table([result]) or "| lgbm | 1/1 |" in W.against_table([result])


def test_comparison_tables_against_hand_counts():
    """``against_table``: worlds within 1.02x of the reference's excess and within 0.005 of its
    NDCG gap, the ratios' median and range; ``paired_table``: ``fm_old`` against ``fm`` with the
    standard error of the per-request differences (``sd(d) sqrt(R) / N``), worse / better by 2 SE."""
    from benchmarks.worlds import against_table, paired_table, tables

    def world(seed, fm, old, ref):
        return {"seed": seed, "spec": {"explore_share": 1.0, "mark_explore": False}, "rows": [
            {"variant": "fm", "excess": fm[0], "ndcg_gap": fm[1], "req_excess": fm[2], "n_test": 8, "epochs": 3},
            {"variant": "fm_old", "excess": old[0], "ndcg_gap": old[1], "req_excess": old[2], "n_test": 8,
             "epochs": 5},
            {"variant": "reference FM", "excess": ref[0], "ndcg_gap": ref[1]}]}

    results = [world(1, (0.010, 0.10, [0.02, 0.02, 0.02, 0.02]), (0.011, 0.101, [0.04, 0.04, 0.04, 0.0]),
                     (0.0100, 0.104)),
               world(2, (0.020, 0.20, [0.04, 0.04, 0.04, 0.04]), (0.019, 0.190, [0.04, 0.04, 0.04, 0.03]),
                     (0.0190, 0.200))]
    table = against_table(results)
    assert "| fm | 1/2 | 2/2 | 1.03 (1.00-1.05) |" in table          # 0.010 / 0.010, 0.020 / 0.019
    assert "| fm_old | 1/2 | 2/2 | 1.05 (1.00-1.10) |" in table      # 0.011 / 0.010, 0.019 / 0.019
    # world 1: d = [.02, .02, .02, -.02], 0.04 / 8 = 0.005 per impression, SE sd(d) * 2 / 8 = 0.005: < 2 SE;
    # world 2: d = [0, 0, 0, -.01], mean -0.00125, SE 0.00125: not beyond 2 SE either
    assert "| fm_old | 2 | 1.025 (0.950-1.100) | 0 / 0 | -0.0045 | 5.0 (3.0) |" in paired_table(results)
    results[0]["rows"][1]["req_excess"] = [0.05, 0.05, 0.05, 0.05]  # d = 0.03 each: SE 0, worse
    assert "| 1 / 0 |" in paired_table(results)
    # a scorer whose own name holds "_" pairs with itself, not with the part before the first "_"
    for r, k in zip(results, (2.0, 0.5), strict=True):
        r["rows"] += [{**r["rows"][0], "variant": "list_aware"},
                      {**r["rows"][0], "variant": "list_aware_old", "excess": k * r["rows"][0]["excess"]}]
    assert "| list_aware_old | 2 | 1.250 (0.500-2.000) |" in paired_table(results)
    assert "| list_aware |" not in paired_table(results)
    assert "## Against reference FM" in tables(results) and "## Paired over test requests" in tables(results)


def test_slot_error_reads_offsets_as_an_auction_does():
    """The world harness's ``slot_err`` (brute-force loop as the reference), and the reason for
    it: a model that cannot tell two kinds of item apart (true logits -3 and 0, half each; it
    scores both at their average CTR) is calibrated in every slot only with offsets flatter than
    the truth's, so its offsets miss the truth by more than 0.1 logit while the slot CTRs they
    imply are exact."""
    from benchmarks.common import logit, sigmoid
    from benchmarks.worlds import slot_ctr_error

    z_true = np.repeat([-3.0, 0.0], 500)
    true = np.array([0.0, -0.5, -1.0, -1.4])
    z_model = np.full(z_true.size, logit(np.array([sigmoid(z_true).mean()]))[0])
    fitted = logit(np.array([sigmoid(z_true + b).mean() for b in true])) - z_model[0]
    assert np.max(np.abs(fitted - true)) > 0.1                  # offsets "wrong" ...
    assert slot_ctr_error(z_model, z_true, fitted, true) < 1e-9   # ... slot CTRs right
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
    assert slot_ctr_error(zm, zt, off, tru) == pytest.approx(want, rel=1e-9)


def test_world_harness_splits_pcoc_by_items_unseen_in_training():
    """``unseen_rows`` against a hand count: item ids absent from training (compared as strings,
    whatever their dtype) form ``new_share``; PCOC on those and on the rest."""
    import polars as pl

    from benchmarks.worlds import unseen_rows

    seen = pl.Series([1, 2, 2, 5])
    items = pl.Series(["1", "3", "5", "7", "2"])
    pctr = np.array([0.1, 0.2, 0.3, 0.4, 0.5])
    p_ref = np.array([0.1, 0.1, 0.3, 0.2, 0.25])
    out = unseen_rows(seen, items, pctr, p_ref)
    assert out["new_share"] == pytest.approx(2 / 5)
    assert out["pcoc_new"] == pytest.approx((0.2 + 0.4) / (0.1 + 0.2))
    assert out["pcoc_seen"] == pytest.approx((0.1 + 0.3 + 0.5) / (0.1 + 0.3 + 0.25))
    assert unseen_rows(seen, pl.Series(["1", "2"]), pctr[:2], p_ref[:2])["pcoc_new"] is None


def test_level_shift_and_floor_against_a_root_finder():
    """``level_shift`` solves ``sum sigmoid(z + c) = clicks`` (scipy's root finder as the
    reference); the world harness's ``floor`` on a drift-free world is the truth at slot 1 shifted
    by the level that matches the training clicks, and its drift floor is 1."""
    from scipy.optimize import brentq

    from benchmarks import worlds as W
    from benchmarks.common import logit, sigmoid
    from hybridrank.data.worlds import draw_world, simulate_world

    z = np.random.default_rng(0).normal(-3.0, 1.0, 5000)
    c = W.level_shift(z, 400.0)
    assert c == pytest.approx(brentq(lambda s: float(sigmoid(z + s).sum()) - 400.0, -10, 10), abs=1e-9)
    with pytest.raises(ValueError, match="clicks"):
        W.level_shift(z, 0.0)

    world = simulate_world(draw_world(4000, size="tiny", logging="random", drift="none"))
    train, _, test = W.split_world(world)
    z_train = logit(train["true_p"].to_numpy())
    clicks = float((train[world.columns["label"]].to_numpy() > 0).sum())
    c = brentq(lambda s: float(sigmoid(z_train + s).sum()) - clicks, -10, 10)
    ref = test["true_p_ref"].to_numpy()
    assert W.floor(world, train, test) == pytest.approx(float(sigmoid(logit(ref) + c).sum() / ref.sum()), rel=1e-6)
    assert W.drift_floor(world, train, test) == pytest.approx(1.0)


# ----------------------------------------------------------------------------------------------
# every benchmark has a command in the documents, and every documented command parses
# ----------------------------------------------------------------------------------------------
_PY = re.compile(r"^python\s+(?:-m\s+benchmarks\.(\w+)|(scripts/\w+\.py))(.*)$", re.S)


def _documented() -> list[tuple[str, str | None, str | None, str]]:
    """``(where, module, script, arguments)`` of every ``python -m benchmarks.X`` / ``python
    scripts/X.py`` command in a bash fence of README.md and the documents it names (a fence that
    checks out another commit runs that commit's files: left out)."""
    import test_readme

    starts = {doc: [(start, any("git checkout" in t for _, t in body)) for start, _, _, body in test_readme.fences(doc)]
              for doc in test_readme.documents()}
    out = []
    for cmd in test_readme.ALL:
        elsewhere = max((s for s in starts[cmd.doc] if s[0] < cmd.line), default=(0, False))[1]
        if cmd.lang != "bash" or elsewhere:
            continue
        for line in cmd.text.replace("\\\n", " ").splitlines():
            m = _PY.match(line.strip())
            if m:
                out.append((cmd.id, m.group(1), m.group(2), m.group(3)))
    return out


def test_every_benchmark_has_a_documented_command_that_parses():
    """Each module of benchmarks/ with a ``main`` is run by some fenced command; each fenced
    command names an existing benchmark, and its arguments parse (placeholders such as
    ``[--extra ...]`` or ``# and 0.5`` aside)."""
    documented = _documented()
    mains = sorted(p.stem for p in BENCH.glob("*.py") if "\ndef main(" in p.read_text())
    assert {"worlds", "letor", "real", "losses", "metrics", "reader", "grid", "train"} <= set(mains)
    missing = sorted(set(mains) - {m for _, m, _, _ in documented})
    assert not missing, f"benchmarks without a command in README.md / docs/*.md fences: {missing}"
    for where, module, script, rest in documented:
        if script is not None:
            assert (ROOT / script).is_file(), f"{where}: {script} does not exist"
            continue
        assert module in mains, f"{where}: benchmarks.{module} does not exist (benchmarks: {mains})"
        args = shlex.split(rest, comments=True)
        if any(a.startswith("[") or a in ("|", "...") for a in args):
            continue  # a placeholder of alternatives, not a command to parse
        parser = importlib.import_module(f"benchmarks.{module}").parser()
        try:
            parser.parse_args(args)
        except SystemExit as exc:
            pytest.fail(f"{where}: python -m benchmarks.{module} {rest.strip()}: arguments do not parse ({exc})")


@pytest.mark.slow
def test_model_scoring_of_a_position_feature_variant_reads_slot_one(tmp_path):
    """``--score model`` of a variant with the position among the numeric features (``position=
    feature``): at the logged slots it scores what ``hybridrank-export`` scores on the test rows,
    and at the reference slot what the export scores on the same rows with every position 1."""
    import polars as pl

    from benchmarks import worlds as W
    from benchmarks.common import xent

    name, spec = W.parse_variant("mlp_f=loss=bce;trainer.max_epochs=1;position=feature")
    assert spec == (["loss=bce", "trainer.max_epochs=1"], True)
    [result] = W.run_family("base", [4001], {name: spec}, size="tiny", pins={"logging": "random"},
                            score="model", reference=False, work=tmp_path)
    row = {r["variant"]: r for r in result["rows"]}[name]
    assert row["tower"] is False
    w = W.prepare_world(4001, tmp_path / "again", size="tiny", pins={"logging": "random"})
    cols = w.world.columns
    ckpt = str(next((tmp_path / "world4001" / "runs" / name).rglob("*.ckpt")))
    keys = w.test.select(pl.col(cols["request"]).alias("request_id"), pl.col(cols["item"]).alias("item_id"),
                         "true_p", "true_p_ref")

    def exported(path, out):
        scores, _ = W.export_scores(ckpt, path, tmp_path / out, "none", "level_trend.mode=off")
        return keys.join(scores, on=["request_id", "item_id"], how="left", maintain_order="left")["pctr"].to_numpy()

    logged, at1 = exported(w.dir / "test.parquet", "s.parquet"), exported(w.dir / "test_slot1.parquet", "s1.parquet")
    assert not np.allclose(logged, at1)             # the position moves a feature model's score
    p_true = keys["true_p"].to_numpy()
    assert row["excess"] == pytest.approx(float(np.mean(xent(logged, p_true) - xent(p_true, p_true))), rel=1e-4)
    assert row["pcoc_ref"] == pytest.approx(float(at1.sum() / keys["true_p_ref"].sum()), rel=1e-4)
