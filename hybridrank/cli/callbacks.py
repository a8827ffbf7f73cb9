"""Lightning callbacks and the logger of hybridrank's own (the rest come from Lightning through
``conf/callbacks`` and ``conf/logger``).

- :class:`EpochLog` writes one line per epoch through Python logging (hydra sends it to the console
  and to the run's log file): the readable record of a run whose output is not a terminal, where a
  progress bar would write thousands of carriage returns (``trainer.enable_progress_bar: auto``
  turns the bar off there).
- :class:`EpochCheckpoint`: Lightning's ``ModelCheckpoint`` with 1-based epochs in file names
  (``epoch01.ckpt`` is the first epoch, as in the log lines).
- :class:`LastCheckpoint`: ``last.ckpt`` by the clock, without a collective per step under DDP.
- :class:`EpochProgressBar`: Lightning's progress bar, counting epochs from 1.
- :class:`RunClock`: seconds in training batches and in validation.
- :class:`ValHistory`: every epoch's validation metrics, kept in the checkpoints, so that
  ``metrics.json`` reports the epoch of the checkpoint the run keeps, across resumes too.
- :class:`CSVHistoryLogger`: Lightning's ``CSVLogger`` whose ``metrics.csv`` survives a resume.
"""

from __future__ import annotations

import csv
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import ModelCheckpoint, TQDMProgressBar
from pytorch_lightning.loggers import CSVLogger
from pytorch_lightning.loggers.csv_logs import ExperimentWriter
from pytorch_lightning.loggers.logger import rank_zero_experiment

__all__ = ["EpochLog", "EpochCheckpoint", "LastCheckpoint", "RunClock", "EpochProgressBar", "ValHistory",
           "CSVHistoryLogger"]

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


class EpochCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` whose ``{epoch}`` in file names counts from 1: ``epoch01.ckpt`` holds
    the first epoch, as the log lines and ``metrics.json`` count (Lightning counts from 0)."""

    def format_checkpoint_name(self, metrics: dict[str, Any], filename: str | None = None,
                               ver: int | None = None, prefix: str | None = None) -> str:
        if "epoch" in metrics:
            metrics = {**metrics, "epoch": metrics["epoch"] + 1}
        return super().format_checkpoint_name(metrics, filename, ver, prefix)


class LastCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` for ``last.ckpt`` (crash-safe resume) that reads the clock only every
    ``check_every_n_steps`` optimizer steps.

    With ``train_time_interval`` Lightning's own callback reads the clock after every batch and,
    under DDP, broadcasts rank 0's decision: a collective per step. Here the clock is read (and the
    decision broadcast) at every ``check_every_n_steps``-th step only; a checkpoint is then at most
    ``train_time_interval`` plus that many steps old. Step-based saving (``every_n_train_steps``)
    and the saves at the end of an epoch are Lightning's, unchanged.

    Args:
        check_every_n_steps: steps between two looks at the clock (used with
            ``train_time_interval`` only).
        **kwargs: as :class:`~pytorch_lightning.callbacks.ModelCheckpoint`.
    """

    def __init__(self, *, check_every_n_steps: int = 20, **kwargs: Any):
        if check_every_n_steps < 1:
            raise ValueError(f"check_every_n_steps must be >= 1, got {check_every_n_steps}")
        super().__init__(**kwargs)
        self.check_every_n_steps = int(check_every_n_steps)
        self.timed = kwargs.get("train_time_interval") is not None

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        if self.timed and trainer.global_step % self.check_every_n_steps:
            return
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)


class RunClock(pl.Callback):
    """Seconds a fit spends in training batches and in validation (``train_seconds``,
    ``val_seconds``): Lightning runs an epoch's validation inside the training epoch, so the
    training time is each epoch's span less its validation. What ``hybridrank-train``'s time line
    and ``metrics.json`` (``time``) report."""

    def __init__(self):
        self.train_seconds = self.val_seconds = 0.0
        self._epoch_t0 = self._val_t0 = None

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_t0 = time.perf_counter()
        self._val_in_epoch = 0.0

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._val_t0 = time.perf_counter()

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._val_t0 is not None:
            spent = time.perf_counter() - self._val_t0
            self.val_seconds += spent
            if self._epoch_t0 is not None:
                self._val_in_epoch += spent
            self._val_t0 = None

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._epoch_t0 is not None:
            self.train_seconds += time.perf_counter() - self._epoch_t0 - self._val_in_epoch
            self._epoch_t0 = None


class ValHistory(pl.Callback):
    """Every epoch's ``val/`` metrics, ``{epoch (0-based): {name: value}}``.

    Its state travels in every checkpoint (``last.ckpt`` included), so a resumed run still knows
    the epochs before the crash. ``hybridrank-train`` adds it to every trainer: ``metrics.json``
    reports the validation figures of the epoch whose checkpoint it keeps.
    """

    def __init__(self) -> None:
        self.history: dict[int, dict[str, float]] = {}

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        self.history[int(trainer.current_epoch)] = {
            k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}

    def state_dict(self) -> dict[str, Any]:
        return {"history": {str(k): dict(v) for k, v in self.history.items()}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = {int(k): dict(v) for k, v in (state_dict.get("history") or {}).items()}


class _AppendingWriter(ExperimentWriter):
    """Lightning's CSV writer that appends to an existing ``metrics.csv`` (instead of deleting it)."""

    def _check_log_dir_exists(self) -> None:
        if os.path.isfile(self.metrics_file_path):
            with open(self.metrics_file_path, newline="") as f:
                self.metrics_keys = list(csv.DictReader(f).fieldnames or [])


class CSVHistoryLogger(CSVLogger):
    """Lightning's ``CSVLogger``, and one history per run: on a resume, ``metrics.csv`` keeps the
    rows logged before the resumed checkpoint and the resumed run appends to it (Lightning's
    logger deletes the file). A fresh run in a used folder starts a new file, as Lightning's does.
    Its ``epoch`` column counts from 1 (test rows have none).
    """

    _resume_step: int | None = None

    def resume_at(self, step: int) -> int:
        """Keep the rows of ``metrics.csv`` logged before global step ``step`` (those after it are
        trained again) and append from there. Returns the number of rows kept."""
        self._resume_step = int(step)
        path = Path(self.log_dir) / ExperimentWriter.NAME_METRICS_FILE
        if not path.is_file():
            return 0
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            fields, rows = list(reader.fieldnames or []), list(reader)
        kept = [r for r in rows if r.get("step") not in (None, "") and int(float(r["step"])) < step]
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            writer.writerows(kept)
        os.replace(tmp, path)
        return len(kept)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        # epochs 1-based, as in the log lines and checkpoint names (test rows: no epoch of theirs)
        if "epoch" in metrics and not any(k.startswith("test/") for k in metrics):
            metrics = {**metrics, "epoch": metrics["epoch"] + 1}
        elif "epoch" in metrics:
            metrics = {k: v for k, v in metrics.items() if k != "epoch"}
        super().log_metrics(metrics, step)

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None and self._resume_step is not None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return super().experiment


class EpochProgressBar(TQDMProgressBar):
    """Lightning's progress bar with the epoch counted from 1 (``Epoch 1`` is the first), as the
    log lines, checkpoint names and ``metrics.csv`` count."""

    def on_train_epoch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        # Lightning's method with the description shifted (calling it would draw "Epoch 0" once)
        if self._leave:
            self.train_progress_bar = self.init_train_tqdm()
        total = self.total_train_batches
        self.train_progress_bar.reset()
        self.train_progress_bar.total = None if total == float("inf") else total
        self.train_progress_bar.initial = 0
        self.train_progress_bar.set_description(f"Epoch {trainer.current_epoch + 1}")
