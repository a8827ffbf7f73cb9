"""DDP on CPU with two gloo processes: disjoint shards cover every impression once; metrics sync."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("ddp_worker.py")


def run_workers(*runs: tuple[Path, int], server=None) -> None:
    """The workers side by side (mostly interpreter start-up; one thread each), forked from the
    test server where there is one (rank 0; Lightning starts rank 1 as a real process)."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    python = sys.executable
    if server is not None:
        env, python = server.env(env), server.python
    procs = []
    for out, devices in runs:
        out.mkdir(parents=True, exist_ok=True)
        procs.append(subprocess.Popen([python, str(WORKER), str(out), str(devices)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env=env, cwd=out))
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stdout[-2000:] + stderr[-4000:]


@pytest.mark.slow
def test_ddp_two_processes_see_each_impression_once_and_metrics_match(tmp_path, cli_server):
    run_workers((tmp_path / "ddp", 2), (tmp_path / "single", 1), server=cli_server)
    n = json.loads((tmp_path / "ddp" / "n_impressions.json").read_text())
    for epoch in (0, 1):
        shards = [torch.load(tmp_path / "ddp" / f"rows_rank{r}_epoch{epoch}.pt") for r in (0, 1)]
        assert len(set(shards[0].tolist()) & set(shards[1].tolist())) == 0, "ranks overlap"
        both = torch.cat(shards)
        assert both.numel() == n and torch.equal(both.sort().values, torch.arange(n))
        single = torch.load(tmp_path / "single" / f"rows_rank0_epoch{epoch}.pt")
        assert torch.equal(single.sort().values, torch.arange(n))
    ddp_val = json.loads((tmp_path / "ddp" / "val.json").read_text())
    one_val = json.loads((tmp_path / "single" / "val.json").read_text())
    assert set(ddp_val) == set(one_val) and ddp_val
    for k in one_val:
        assert ddp_val[k] == pytest.approx(one_val[k], rel=1e-6, abs=1e-6), k
