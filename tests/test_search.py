"""Hyper-parameter searches (``hybridrank-train hparams_search=<name>``, hybridrank/cli/search.py):
the shipped search configs, a 2-trial search end to end, the summary against the trials' own
files, and one clear message for each bad input (an unknown search key, a missing sweeper plugin,
a test metric to select on, a direction that contradicts the metric)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import test_cli
import yaml
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from hybridrank.cli.search import SUMMARY_FILE, check_sweep, format_summary, metric_direction, summarize_sweep

# the console scripts in-process, and one-message errors, as tests/test_cli.py runs and checks them
restore_logging = test_cli.restore_logging
run_cli = test_cli.run_cli
_one_message = test_cli._one_message

SEARCHES = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "conf" / "hparams_search").glob("*.yaml"))
#: the tiny settings of a search that runs in the tests: a small simulated log, one epoch
TINY = ("data.source.n_users=150", "debug=fast", "intervals.n_boot=20")


def _plugin():
    return pytest.importorskip("hydra_plugins.hydra_optuna_sweeper",
                               reason="the Optuna sweeper plugin (pip install 'hybridrank[search]')")


def _compose_with_hydra(*overrides: str):
    with initialize_config_module("hybridrank.conf", version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=True)


# ----------------------------------------------------------------------------------------------
# the shipped search configs
# ----------------------------------------------------------------------------------------------
def test_there_are_searches_for_the_default_model_and_fm():
    assert {"default", "fm"} <= set(SEARCHES), SEARCHES


#: the data a search is composed with in the tests (the dense search's key
#: data.source.numeric_bins is a key of the file sources, not of the built-in simulator)
SEARCH_DATA = {"dense": ("data=letor_mq2008",)}


@pytest.mark.parametrize("name", SEARCHES)
def test_shipped_search_is_sound(name):
    """Every search key is a key of the composed config, the metric is a validation one whose
    direction the sweeper follows, the sampler is seeded, at most 30 trials, the learning rate on
    a log scale, and the settings each search is for: for the id-based searches (default, fm)
    embedding L2 on a log scale, embedding size and the loss mix (pure BCE among the choices);
    for the dense-feature search the scorer (mlp, deepfm) and the numeric encoding (0: none)."""
    _plugin()
    cfg = _compose_with_hydra(f"hparams_search={name}", *SEARCH_DATA.get(name, ()))
    sweeper = cfg.hydra.sweeper
    assert cfg.optimized_metric.startswith("val/")
    assert str(sweeper.direction) == metric_direction(cfg.optimized_metric)
    assert 2 <= sweeper.n_trials <= 30
    assert sweeper.sampler.seed is not None
    params = {str(k): str(v) for k, v in sweeper.params.items()}
    groups = cfg.hydra.runtime.choices
    for key in params:
        assert key in groups or OmegaConf.select(cfg, key, default="<absent>") != "<absent>", key
    assert params["model.optimizer.lr"].startswith("tag(log")
    if name == "dense":
        assert params["model"] == "choice(mlp, deepfm)"
        assert params["data.source.numeric_bins"].startswith("choice(0,")
    else:
        assert params["model.embedding_l2"].startswith("tag(log")
        low = float(params["model.embedding_l2"].split("interval(")[1].split(",")[0])
        assert low <= 1e-4  # small values are in reach (0.0 is the shipped default)
        assert "model.scorer.emb_dim" in params
        mix = [k for k in params if k.startswith("model.loss.")]
        assert mix and "0.0" in params[mix[0]]  # pure BCE, the shipped loss, is one of the choices
    check_sweep(cfg)  # raises on any of the bad inputs below


def test_fm_search_trains_the_fm():
    _plugin()
    cfg = _compose_with_hydra("hparams_search=fm")
    assert cfg.model.scorer._target_.endswith("FMScorer")


def test_metric_direction():
    assert metric_direction("val/logloss") == metric_direction("val/ece") == "minimize"
    assert metric_direction("val/ndcg@10") == metric_direction("val/gauc") == "maximize"
    assert metric_direction("val/pcoc") is None and metric_direction("val/n_lists") is None


# ----------------------------------------------------------------------------------------------
# bad input: one message naming the fix, no folder
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, needles", [
    (["hparams_search=default", "model.embeding_l2=tag(log, interval(0.1, 1.0))"],
     ["'model.embeding_l2'", "not a key of the config", "did you mean model.embedding_l2?"]),
    (["hparams_search=fm", "model.lr=tag(log, interval(0.001, 0.01))"],
     ["'model.lr'", "did you mean model.optimizer.lr?"]),
    (["hparams_search=default", "loss=choice(bce, bce_softmaxx)"],
     ["'bce_softmaxx'", "config group 'loss'", "bce_softmax"]),
    (["hparams_search=default", "optimized_metric=test/logloss"],
     ["optimized_metric=test/logloss", "never select on the test split", "optimized_metric=val/logloss"]),
    (["-m", "seed=0,1", "optimized_metric=test/ndcg@10"],  # a grid too: its summary names a best
     ["optimized_metric=test/ndcg@10", "optimized_metric=val/ndcg@10"]),
    (["hparams_search=default", "optimized_metric=val/ndcg@10"],
     ["hydra.sweeper.direction=maximize"]),
    (["hparams_search=fm", "optimized_metric=val/pcoc"], ["best at 1"]),
    (["-m", "model.optimizer.lrr=0.001,0.002"], ["'model.optimizer.lrr'", "did you mean model.optimizer.lr?"]),
])
@pytest.mark.slow
def test_bad_search_is_one_message(run_cli, tmp_path, args, needles):
    if "hparams_search" in " ".join(args):
        _plugin()
    code, out, err = run_cli("hybridrank-train", *args, *TINY)
    _one_message("hybridrank-train", code, err, *needles)
    assert "[trial" not in out  # refused before the first trial
    assert not (tmp_path / "multirun").exists()


def test_unknown_key_in_a_search_config_file(run_cli, tmp_path):
    """A search space written in a config file (hydra.sweeper.params), as users add their own."""
    _plugin()
    own = tmp_path / "my_conf" / "hparams_search"
    own.mkdir(parents=True)
    (own / "mine.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /hydra/sweeper: optuna\n"
        "optimized_metric: val/logloss\nhydra:\n  mode: MULTIRUN\n  sweeper:\n    n_trials: 2\n"
        "    params:\n      model.optimizer.lr: tag(log, interval(0.001, 0.01))\n"
        "      model.scorer.emb_dimm: choice(8, 16)\n")
    code, out, err = run_cli("hybridrank-train", "--config-dir", str(tmp_path / "my_conf"),
                             "hparams_search=mine", *TINY)
    _one_message("hybridrank-train", code, err, "'model.scorer.emb_dimm'", "hydra.sweeper.params",
                 "did you mean model.scorer.emb_dim?")
    assert not (tmp_path / "multirun").exists()


@pytest.mark.slow
def test_missing_sweeper_plugin_names_the_install(run_cli, tmp_path, monkeypatch):
    """Without hydra-optuna-sweeper hydra cannot find hydra/sweeper/optuna (the config the plugin
    registers when hydra scans it): here that config is taken out of hydra's store, as if the
    plugin were not installed (checked by hand with the plugin uninstalled: the same message)."""
    from hydra.core.config_store import ConfigStore
    from hydra.core.plugins import Plugins

    Plugins.instance()  # the plugin scan, which registers the plugins' configs
    sweepers = ConfigStore.instance().repo["hydra"]["sweeper"]
    if "optuna.yaml" in sweepers:
        monkeypatch.delitem(sweepers, "optuna.yaml")
    for name in SEARCHES:
        code, _, err = run_cli("hybridrank-train", f"hparams_search={name}", *SEARCH_DATA.get(name, ()))
        _one_message("hybridrank-train", code, err, "optuna sweeper", "not installed",
                     "pip install 'hybridrank[search]'")
    assert not (tmp_path / "multirun").exists()


def test_missing_sweeper_message_classifies():
    from hydra.errors import MissingConfigException

    from hybridrank.cli._app import user_message

    exc = MissingConfigException("In 'hydra/config': Could not find 'hydra/sweeper/ax'\n\n"
                                 "Available options in 'hydra/sweeper':\n\tbasic", missing_cfg_file=None)
    assert user_message(exc).endswith("pip install hydra-ax-sweeper")
    other = MissingConfigException("In 'config': Could not find 'loss/nope'", missing_cfg_file=None)
    assert "pip install" not in user_message(other)


# ----------------------------------------------------------------------------------------------
# the summary of a sweep folder
# ----------------------------------------------------------------------------------------------
def _fake_trial(sweep: Path, num: int, overrides: list[str], val: float | None, test_logloss: float,
                direction: str | None = "minimize", searched: bool = True) -> None:
    folder = sweep / str(num)
    (folder / ".hydra").mkdir(parents=True)
    sweeper = {"params": {"model.optimizer.lr": "tag(log, interval(0.001, 0.01))"} if searched else None}
    if direction:
        sweeper["direction"] = direction
    (folder / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(
        {"hydra": {"job": {"num": num}, "sweeper": sweeper}}))
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"optimized_metric": "val/logloss"}))
    if val is not None:
        (folder / "metrics.json").write_text(json.dumps({
            "val": {"val/logloss": val}, "optimized_metric": val, "val_epoch": 2,
            "best_checkpoint": str(folder / "checkpoints" / "epoch02.ckpt"),
            "test": {"test/logloss": test_logloss, "test/ndcg@10": 0.5},
            "reference": {"base rate": {"logloss": 0.2, "ndcg@10": 0.3}}}))


def test_summary_picks_the_best_validation_value_not_the_best_test(tmp_path):
    sweep = tmp_path / "sweep"
    vals = {0: 0.131, 1: 0.129, 2: float("nan"), 3: None, 4: 0.130}
    tests = {0: 0.120, 1: 0.140, 2: 0.100, 3: 0.1, 4: 0.119}  # the best test is never the pick
    for num, v in vals.items():
        _fake_trial(sweep, num, [f"model.optimizer.lr=0.00{num + 1}", "debug=fast", "seed=0"], v, tests[num])
    s = summarize_sweep(sweep)
    finite = {n: v for n, v in vals.items() if v is not None and math.isfinite(v)}
    assert s["best"]["trial"] == min(finite, key=finite.get) == 1
    assert s["best"]["test"]["test/logloss"] == tests[1]
    assert s["n_trials"] == 5 and s["n_finished"] == 3
    assert s["best"]["params"] == {"model.optimizer.lr": 0.002}  # not the overrides all trials share
    assert s["best"]["run_dir"] == str((sweep / "1").resolve())
    assert [t["status"] for t in s["trials"]].count("finished") == 4  # the NaN one finished too
    assert json.loads((sweep / SUMMARY_FILE).read_text())["best"]["trial"] == 1
    text = format_summary(s)
    assert "best trial: 1" in text and "0.002" in text and str(sweep / "1") in text
    # best first by validation value; the unfinished trial last
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and not ln.startswith("| trial")]
    assert [r.split("|")[1].strip() for r in rows] == ["1 *", "4", "0", "2", "3"]
    # maximize: the largest value
    assert summarize_sweep(sweep, direction="maximize", write=False)["best"]["trial"] == 0


def test_summary_of_a_grid_names_what_varies(tmp_path):
    sweep = tmp_path / "grid"
    for num, (loss, seed) in enumerate([("bce", 0), ("bce", 1), ("bce_softmax", 0), ("bce_softmax", 1)]):
        _fake_trial(sweep, num, [f"loss={loss}", f"seed={seed}", "debug=fast"], 0.13 - 0.001 * num, 0.12,
                    direction=None, searched=False)
    s = summarize_sweep(sweep, write=False)
    assert s["direction"] == "minimize"  # from the metric: log loss
    assert s["best"]["trial"] == 3
    assert s["best"]["params"] == {"loss": "bce_softmax", "seed": 1}  # debug=fast: the same in all
    # a search key named by the caller is listed even where every trial has the same value
    assert summarize_sweep(sweep, keys=["debug"], write=False)["best"]["params"] == {
        "debug": "fast", "loss": "bce_softmax", "seed": 1}


def test_summary_refuses_a_folder_without_trials(tmp_path):
    with pytest.raises(ValueError, match="not a hydra sweep folder"):
        summarize_sweep(tmp_path)
    with pytest.raises(FileNotFoundError):
        summarize_sweep(tmp_path / "nope")


# ----------------------------------------------------------------------------------------------
# a search, end to end
# ----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_two_trial_search_end_to_end(run_cli, tmp_path):
    """``hybridrank-train hparams_search=default`` with 2 trials on a tiny simulated log: a
    progress line per trial, and a summary naming the trial with the best validation log loss
    (read back from each trial's own metrics.json) with its settings, folder and test figures."""
    _plugin()
    sweep = tmp_path / "sweep"
    code, out, err = run_cli("hybridrank-train", "hparams_search=default", "hydra.sweeper.n_trials=2",
                             *TINY, f"hydra.sweep.dir={sweep}")
    assert code == 0, err[-3000:]
    runs = {int(p.parent.name): json.loads(p.read_text()) for p in sweep.glob("*/metrics.json")}
    assert sorted(runs) == [0, 1]
    val = {n: r["val"]["val/logloss"] for n, r in runs.items()}
    best = min(val, key=val.get)
    # one progress line per trial: its number, its settings, its validation value
    lines = [ln for ln in out.splitlines() if ln.startswith("[trial ")]
    assert len(lines) == 2
    for n, line in enumerate(lines):
        assert line.startswith(f"[trial {n} of 2] ")
        assert "model.optimizer.lr=" in line and "model.embedding_l2=" in line
        assert f"val/logloss {val[n]:.6g}" in line
    # the summary file and the printed summary
    s = json.loads((sweep / SUMMARY_FILE).read_text())
    assert s["optimized_metric"] == "val/logloss" and s["direction"] == "minimize"
    assert s["best"]["trial"] == best and s["best"]["value"] == val[best]
    assert s["best"]["test"] == runs[best]["test"]
    assert s["best"]["run_dir"] == str((sweep / str(best)).resolve())
    overrides = yaml.safe_load((sweep / str(best) / ".hydra" / "overrides.yaml").read_text())
    given = dict(o.split("=", 1) for o in overrides)
    assert set(s["best"]["params"]) == {"model.optimizer.lr", "model.embedding_l2", "model.scorer.emb_dim",
                                        "model.loss.terms.softmax.weight"}
    for k, v in s["best"]["params"].items():
        assert float(given[k]) == pytest.approx(float(v))
    # the sampled settings reached the trained model
    resolved = yaml.safe_load((sweep / str(best) / "config_resolved.yaml").read_text())
    assert resolved["model"]["scorer"]["emb_dim"] == s["best"]["params"]["model.scorer.emb_dim"]
    assert resolved["model"]["embedding_l2"] == pytest.approx(s["best"]["params"]["model.embedding_l2"])
    # Optuna's own record of the study agrees on the best value
    optuna_best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())["best_value"]
    assert optuna_best == pytest.approx(val[best])
    assert f"best trial: {best} " in out
    assert f"logloss {runs[best]['test']['test/logloss']:.4f}" in out.split("best trial:")[1]


def test_progress_line_and_a_nan_trial(capsys):
    """One line per trial (its number, settings, value, the best so far); a trial whose value is
    NaN is never the best, and the sampler is told the worst value (Optuna 2.10 would end the
    whole search on a NaN)."""
    from hydra.core.utils import JobReturn, JobStatus
    from hydra.types import RunMode

    from hybridrank.cli.search import SweepReport

    report = SweepReport()
    report.keys, report.direction = ["model.optimizer.lr"], "minimize"
    returned = {}
    for num, value in enumerate([0.13, float("nan"), 0.12, 0.125]):
        config = OmegaConf.create({"optimized_metric": "val/logloss", "task_name": "train", "hydra": {
            "mode": RunMode.MULTIRUN, "job": {"num": num},
            "sweeper": {"direction": "minimize", "n_trials": 4}}})
        ret = JobReturn(overrides=[f"model.optimizer.lr=0.00{num + 1}", "debug=fast"],
                        status=JobStatus.COMPLETED)
        ret.return_value = value
        report.on_job_end(config, ret)
        returned[num] = ret.return_value
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "[trial 0 of 4] model.optimizer.lr=0.001 | val/logloss 0.13 | best so far: trial 0 (0.13)"
    assert lines[1].startswith("[trial 1 of 4] model.optimizer.lr=0.002 | val/logloss nan") and \
        lines[1].endswith("best so far: trial 0 (0.13)")
    assert lines[2].endswith("best so far: trial 2 (0.12)") and lines[3].endswith("best so far: trial 2 (0.12)")
    assert returned[1] == math.inf and returned[2] == 0.12


def _tiny_letor(folder: Path, seed: int = 0) -> list[str]:
    """Three LibSVM parts (train / vali / test) of 40 / 15 / 15 queries of 8 documents, 4
    features; relevance grows with feature 1, so a scorer has something to learn."""
    import numpy as np

    rng = np.random.default_rng(seed)
    folder.mkdir()
    paths, qid = [], 0
    for part, n in (("train", 40), ("vali", 15), ("test", 15)):
        lines = []
        for _ in range(n):
            qid += 1
            for x in rng.random((8, 4)):
                label = int(rng.random() < 0.1 + 0.6 * x[0])
                lines.append(f"{label} qid:{qid} " + " ".join(f"{j + 1}:{v:.4f}" for j, v in enumerate(x)))
        (folder / f"{part}.txt").write_text("\n".join(lines) + "\n")
        paths.append(str(folder / f"{part}.txt"))
    return paths


@pytest.mark.slow
def test_dense_search_end_to_end_on_a_letor_file(run_cli, tmp_path):
    """``hparams_search=dense`` with 3 trials on a tiny LETOR log: the trials vary the scorer and
    the numeric encoding, and what a trial's settings say reached the model it trained (its
    scorer class, its schema's bin edges)."""
    _plugin()
    import torch

    train, val, test = _tiny_letor(tmp_path / "letor")
    sweep = tmp_path / "sweep"
    code, out, err = run_cli("hybridrank-train", "hparams_search=dense", "data=letor_mq2008",
                             f"data.source.train={train}", f"data.source.val={val}",
                             f"data.source.test={test}", "data.source.n_features=4",
                             "data.source.label_max=1", "hydra.sweeper.n_trials=3",
                             "trainer.max_epochs=1", "intervals.n_boot=0", f"hydra.sweep.dir={sweep}")
    assert code == 0, err[-3000:]
    assert len([ln for ln in out.splitlines() if ln.startswith("[trial ")]) == 3
    s = json.loads((sweep / SUMMARY_FILE).read_text())
    assert s["n_finished"] == 3
    assert {"model", "data.source.numeric_bins"} <= set(s["best"]["params"])
    seen_bins = set()
    for n in range(3):
        overrides = yaml.safe_load((sweep / str(n) / ".hydra" / "overrides.yaml").read_text())
        given = dict(o.split("=", 1) for o in overrides)
        seen_bins.add(int(given["data.source.numeric_bins"]) > 0)
        ckpt = next((sweep / str(n) / "checkpoints").glob("epoch*.ckpt"))
        hp = torch.load(ckpt, map_location="cpu", weights_only=False)["hyper_parameters"]
        scorer = {"mlp": "MLPScorer", "deepfm": "DeepFMScorer"}[given["model"]]
        assert hp["scorer"]["_target_"].endswith(scorer), (n, given)
        bins = hp["data"]["schema"]["bins"]
        if int(given["data.source.numeric_bins"]):
            assert len(bins) == 4 and all(len(e) >= 2 for e in bins), (n, bins)
        else:
            assert not bins, (n, bins)
    assert seen_bins == {False, True}  # the seeded sampler's first trials cover both encodings


def test_dense_search_on_the_simulator_names_the_key(run_cli, tmp_path):
    """The built-in simulator has no numeric encoding to search: one message before trial 0."""
    _plugin()
    code, _, err = run_cli("hybridrank-train", "hparams_search=dense", *TINY)
    _one_message("hybridrank-train", code, err, "'data.source.numeric_bins'", "not a key of the config")
    assert not (tmp_path / "multirun").exists()
