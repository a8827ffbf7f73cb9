"""Run by tests/test_resume.py in a subprocess: train through the hydra config, maybe SIGKILL itself.

Usage: python resume_worker.py OUT_DIR [KILL_AT_STEP]
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytorch_lightning as pl
from hydra import compose, initialize_config_module

from hybridrank.cli.train import CONF_MODULE, train

# the kill step (tests/test_resume.py) falls mid-epoch at exactly this budget (min_batches off)
OVERRIDES = ["data.source.n_users=300", "trainer.max_epochs=3", "data.budget=1024", "data.min_batches=0",
             "trainer.enable_progress_bar=false", "callbacks.last_checkpoint.train_time_interval=null",
             "+callbacks.last_checkpoint.every_n_train_steps=4"]


class KillAtStep(pl.Callback):
    """SIGKILL the process (no clean-up, like an OOM kill or a lost node) at a given global step."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step >= self.step:
            os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    out = Path(sys.argv[1])
    extra = ["+callbacks.killer._target_=resume_worker.KillAtStep",
             f"+callbacks.killer.step={sys.argv[2]}"] if len(sys.argv) > 2 else []
    with initialize_config_module(CONF_MODULE, version_base="1.3"):
        cfg = compose("config", overrides=[f"paths.output_dir={out}", *OVERRIDES, *extra])
    train(cfg)
