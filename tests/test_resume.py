"""Crash-safe training: SIGKILL mid-epoch, resume with one command, same final metrics."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("resume_worker.py")


def run(args, cwd, **kw):
    env = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONPATH=str(WORKER.parent))
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600, env=env, **kw)


@pytest.mark.slow
def test_sigkill_mid_epoch_then_resume_gives_identical_metrics(tmp_path):
    full, crashed = tmp_path / "full", tmp_path / "crashed"
    p = run([sys.executable, str(WORKER), str(full)], tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    # the killed run: SIGKILL in the middle of the second epoch
    kill_step = 33
    p = run([sys.executable, str(WORKER), str(crashed), str(kill_step)], tmp_path)
    assert p.returncode == -signal.SIGKILL, (p.returncode, p.stderr[-3000:])
    assert not (crashed / "metrics.json").exists()
    last = torch.load(crashed / "checkpoints" / "last.ckpt", weights_only=False)
    epoch_loop = last["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]
    n_batches = last["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["n_batches"]
    assert last["epoch"] == 1 and 0 < epoch_loop["completed"] < n_batches, "not a mid-epoch checkpoint"
    assert not list((crashed / "checkpoints").glob("*.tmp")), "a partial checkpoint was left behind"
    # the documented command, minus the test's killer callback
    exe = Path(sys.executable).with_name("hybridrank-resume")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-c",
                                           "from hybridrank.cli.train import resume_main; resume_main()"]
    p = run([*cmd, str(crashed), "~callbacks.killer"], tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    a = json.loads((full / "metrics.json").read_text())
    b = json.loads((crashed / "metrics.json").read_text())
    assert set(a["test"]) == set(b["test"])
    for k, v in a["test"].items():
        assert b["test"][k] == pytest.approx(v, abs=1e-6), k
    for k, v in a["val"].items():
        assert b["val"][k] == pytest.approx(v, abs=1e-6), k
