"""Lightning callbacks of hybridrank's own (the rest come from Lightning through ``conf/callbacks``).

:class:`EpochLog` writes one line per epoch through Python logging (hydra sends it to the console
and to the run's log file): the readable record of a run whose output is not a terminal, where a
progress bar would write thousands of carriage returns (``trainer.enable_progress_bar: auto``
turns the bar off there).
"""

from __future__ import annotations

import logging
import math
import time

import pytorch_lightning as pl

__all__ = ["EpochLog"]

log = logging.getLogger("hybridrank")


class EpochLog(pl.Callback):
    """One log line per training epoch: training loss, the epoch's validation metrics, time.

    Args:
        keys: validation metrics to show, in order (missing ones are skipped).
    """

    def __init__(self, keys: tuple[str, ...] | list[str] = ("val/logloss", "val/ndcg@10",
                                                             "val/ece", "val/pcoc")):
        self.keys = tuple(keys)
        self._t0 = time.perf_counter()

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._t0 = time.perf_counter()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # runs after the epoch's validation loop has logged its metrics
        if not trainer.is_global_zero:
            return
        m = trainer.callback_metrics
        parts = [f"epoch {trainer.current_epoch + 1}/{trainer.max_epochs}",
                 f"step {trainer.global_step}"]
        for key in ("train/loss", *self.keys):
            if key in m and math.isfinite(float(m[key])):
                parts.append(f"{key} {float(m[key]):.5f}")
        parts.append(f"{time.perf_counter() - self._t0:.1f} s")
        log.info(" | ".join(parts))
