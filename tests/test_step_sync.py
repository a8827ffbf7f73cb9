"""A training step at the shipped defaults reads nothing back from the device.

On a GPU each read of a tensor's value into Python (``.item()``, ``bool(t)``, a boolean-mask index,
``nonzero``, a copy from pageable memory ...) stalls the device until the host catches up. The
step's code takes its accelerator path when :func:`hybridrank._device.free_to_read` says no; here
that is forced on the CPU and :class:`host_reads.HostReads` records every read made inside
``HybridRanker.training_step``, the backward pass and the optimizer step (the span between
Lightning's ``on_train_batch_start`` and ``on_train_batch_end``). With CUDA present, the same
steps also run under ``torch.cuda.set_sync_debug_mode("error")``.
"""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch
from host_reads import HostReads

import hybridrank._device
from hybridrank.cli.train import build_datamodule, build_model, build_trainer

pytestmark = pytest.mark.slow

#: the shipped defaults plus the variants whose per-step code differs: a listwise term, the JRC
#: head, the position tower, session pooling with capped units
VARIANTS = {
    "defaults": (),
    "bce_softmax": ("loss=bce_softmax",),
    "jrc": ("loss=jrc",),
    "tower": ("data.source.position_feature=false", "position_bias=tower"),
    "session_cap": ("loss=bce_softmax", "batching=session", "data.max_unit_size=16"),
}


class GuardSteps(pl.Callback):
    """Guard the steps after the first (the loss checks its labels once, on the first call)."""

    def __init__(self):
        self.guard = HostReads(where="hybridrank/")
        self.guarded = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step >= 1:
            self.guard.__enter__()
            self.active = True

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if getattr(self, "active", False):
            self.guard.__exit__(None, None, None)
            self.active = False
            self.guarded += 1


def _fit(compose_cfg, tmp_path, overrides, callback):
    cfg = compose_cfg("config", f"paths.output_dir={tmp_path}", "data.source.n_users=120",
                      "+trainer.max_steps=6", "trainer.max_epochs=1", "trainer.enable_progress_bar=false",
                      "data.budget=512", "trainer.log_every_n_steps=3", "callbacks=none",
                      "logger=none", *overrides)
    pl.seed_everything(0, verbose=False)
    dm = build_datamodule(cfg)
    model = build_model(cfg, dm)
    trainer = build_trainer(cfg)
    trainer.callbacks.append(callback)
    trainer.fit(model, datamodule=dm)
    return model


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_training_step_reads_nothing_back(variant, compose_cfg, tmp_path, monkeypatch):
    monkeypatch.setattr(hybridrank._device, "free_to_read", lambda t: False)
    cb = GuardSteps()
    _fit(compose_cfg, tmp_path, VARIANTS[variant], cb)
    assert cb.guarded >= 4, cb.guarded  # the guard saw steps, logging steps among them
    assert cb.guard.reads == [], "\n".join(cb.guard.reads)


def test_the_guard_sees_the_reads_of_the_cpu_path(compose_cfg, tmp_path):
    """Without the switch the tower reads its CPU tensors freely, and the guard records it: the
    check above can fail."""
    cb = GuardSteps()
    _fit(compose_cfg, tmp_path, VARIANTS["tower"], cb)
    assert cb.guard.reads, "the guard recorded nothing on the CPU path"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cuda_steps_under_sync_debug_mode_error(variant, compose_cfg, tmp_path):
    class SyncError(GuardSteps):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step >= 1:
                torch.cuda.set_sync_debug_mode("error")
                self.active = True

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if getattr(self, "active", False):
                torch.cuda.set_sync_debug_mode("default")
                self.active = False
                self.guarded += 1

    cb = SyncError()
    try:
        _fit(compose_cfg, tmp_path, (*VARIANTS[variant], "trainer=gpu", "trainer.precision=32-true"), cb)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert cb.guarded >= 4
