"""Crash-safe training: SIGKILL mid-epoch, resume with one command, same final metrics."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

WORKER = Path(__file__).with_name("resume_worker.py")


def _env(server) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(WORKER.parent), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONPATH=path)
    return server.env(env) if server is not None else env


def run(args, cwd, server=None, **kw):
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600,
                          env=_env(server), **kw)


@pytest.mark.slow
def test_sigkill_mid_epoch_then_resume_gives_identical_metrics(tmp_path, cli_server):
    """The uninterrupted and the killed run side by side, each on one thread (both are processes
    forked from the test server where there is one, tests/cli_server.py; the resume runs the
    documented command)."""
    full, crashed = tmp_path / "full", tmp_path / "crashed"
    python = cli_server.python if cli_server is not None else sys.executable
    env = dict(_env(cli_server), OMP_NUM_THREADS="1")
    # the killed run: SIGKILL in the middle of the second epoch
    kill_step = 33
    procs = [subprocess.Popen([python, str(WORKER), str(out), *extra], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for out, extra in ((full, []), (crashed, [str(kill_step)]))]
    (_, err_full), (_, err_crashed) = (p.communicate(timeout=600) for p in procs)
    assert procs[0].returncode == 0, err_full[-3000:]
    assert procs[1].returncode == -signal.SIGKILL, (procs[1].returncode, err_crashed[-3000:])
    assert not (crashed / "metrics.json").exists()
    last = torch.load(crashed / "checkpoints" / "last.ckpt", weights_only=False)
    epoch_loop = last["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]
    n_batches = last["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["n_batches"]
    assert last["epoch"] == 1 and 0 < epoch_loop["completed"] < n_batches, "not a mid-epoch checkpoint"
    assert not list((crashed / "checkpoints").glob("*.tmp")), "a partial checkpoint was left behind"
    # the documented command, minus the test's killer callback
    exe = (cli_server.bin if cli_server is not None else Path(sys.executable).parent) / "hybridrank-resume"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-c",
                                           "from hybridrank.cli.train import resume_main; resume_main()"]
    p = subprocess.run([*cmd, str(crashed), "~callbacks.killer"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    a = json.loads((full / "metrics.json").read_text())
    b = json.loads((crashed / "metrics.json").read_text())
    assert set(a["test"]) == set(b["test"])
    for k, v in a["test"].items():
        assert b["test"][k] == pytest.approx(v, abs=1e-6), k
    for k, v in a["val"].items():
        assert b["val"][k] == pytest.approx(v, abs=1e-6), k
    assert a["val_epoch"] == b["val_epoch"]
    # one history: the resumed run's logs/metrics.csv is the uninterrupted run's, rows before the
    # crash included (Lightning's CSV logger deleted them), none logged twice
    csv_a = pl.read_csv(full / "logs" / "metrics.csv")
    csv_b = pl.read_csv(crashed / "logs" / "metrics.csv")
    assert csv_a.columns == csv_b.columns and csv_a.height == csv_b.height
    assert csv_a["step"].to_list() == csv_b["step"].to_list()
    assert csv_a["epoch"].to_list() == csv_b["epoch"].to_list()
    for c in csv_a.columns:
        x, y = csv_a[c].cast(pl.Float64).to_numpy(), csv_b[c].cast(pl.Float64).to_numpy()
        assert np.array_equal(np.isnan(x), np.isnan(y)), c
        assert np.allclose(x[~np.isnan(x)], y[~np.isnan(y)], atol=1e-6), c
    # the same checkpoints, no duplicate "-v1" of an epoch trained again after the resume
    names = sorted(f.name for f in (full / "checkpoints").glob("*.ckpt"))
    assert sorted(f.name for f in (crashed / "checkpoints").glob("*.ckpt")) == names
    assert Path(b["best_checkpoint"]).name == Path(a["best_checkpoint"]).name

    # resuming a finished run says so and does nothing
    before = (crashed / "metrics.json").read_bytes(), (crashed / "logs" / "metrics.csv").read_bytes()
    mtimes = {f.name: f.stat().st_mtime_ns for f in (crashed / "checkpoints").iterdir()}
    p = run([*cmd, str(crashed)], tmp_path, cli_server)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "already finished" in p.stdout and "nothing to resume" in p.stdout
    assert "epoch 1/" not in p.stdout + p.stderr  # nothing trained
    assert ((crashed / "metrics.json").read_bytes(), (crashed / "logs" / "metrics.csv").read_bytes()) \
        == before
    assert {f.name: f.stat().st_mtime_ns for f in (crashed / "checkpoints").iterdir()} == mtimes


@pytest.mark.slow
def test_metrics_json_reports_the_kept_checkpoint_epoch(tmp_path, compose_cfg):
    """metrics.json's val figures and optimized_metric are the best checkpoint's epoch, not the
    last epoch's (what a sweeper ranks runs by), and the checkpoint names count epochs from 1."""
    from hybridrank.cli.train import train

    # a learning rate that overfits after the first epoch: the best epoch is not the last
    cfg = compose_cfg("config", f"paths.output_dir={tmp_path}", "data.source.n_users=300",
                      "trainer.max_epochs=3", "trainer.enable_progress_bar=false",
                      "model.optimizer.lr=0.03", "model.embedding_l2=0", "callbacks.early_stopping.patience=5",
                      "intervals.n_boot=0")
    result = train(cfg)
    history = pl.read_csv(tmp_path / "logs" / "metrics.csv").filter(pl.col("val/logloss").is_not_null())
    assert history["epoch"].to_list() == [1, 2, 3]  # 1-based
    losses = dict(zip(history["epoch"].to_list(), history["val/logloss"].to_list()))
    best_epoch = min(losses, key=losses.get)
    assert best_epoch != 3, f"the setting no longer overfits: {losses}"
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["val_epoch"] == best_epoch
    assert saved["val"]["val/logloss"] == pytest.approx(losses[best_epoch], abs=1e-6)
    assert saved["optimized_metric"] == pytest.approx(losses[best_epoch], abs=1e-6)
    assert Path(result["best_checkpoint"]).name == f"epoch{best_epoch:02d}.ckpt"
    assert int(torch.load(result["best_checkpoint"], weights_only=True)["epoch"]) == best_epoch - 1


@pytest.mark.slow
def test_progress_bar_counts_epochs_from_one(tmp_path, compose_cfg, capfd):
    from hybridrank.cli.train import train

    train(compose_cfg("config", f"paths.output_dir={tmp_path}", "data.source.n_users=60",
                      "trainer.max_epochs=2", "trainer.enable_progress_bar=true", "intervals.n_boot=0"))
    out = "".join(capfd.readouterr())  # Lightning's bar writes to stdout
    assert "Epoch 1:" in out and "Epoch 2:" in out, out[-2000:]
    assert "Epoch 0:" not in out
