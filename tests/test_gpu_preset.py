"""The GPU preset (conf/trainer/gpu.yaml): its batch budget, the learning-rate rule that goes with
it (``${hybridrank.scaled_lr:...}``), and step-interval schedulers (``conf/scheduler/warmup.yaml``)."""

from __future__ import annotations

import math

import hydra
import pytest
import pytorch_lightning as pl
from hybridrank.conf import scaled_lr
from omegaconf import OmegaConf

from hybridrank.cli.train import build_model

SMALL = ("data.source.n_users=60",)
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def compose_cfg(compose_cfg, tmp_path_factory):
    """conftest's ``compose_cfg`` writing (if at all) into a temporary folder of this module."""
    out = tmp_path_factory.mktemp("gpu_preset")
    return lambda name="config", *overrides: compose_cfg(name, *overrides, f"paths.output_dir={out}")


@pytest.mark.parametrize(("budget", "rule", "expected"), [
    (4096, "sqrt", 0.002), (16384, "sqrt", 0.004), (65536, "sqrt", 0.008), (262144, "sqrt", 0.016),
    (1024, "sqrt", 0.001), (65536, "linear", 0.032), (8192, "linear", 0.004), (65536, "none", 0.002),
])
def test_scaled_lr_follows_its_rule(budget, rule, expected):
    # 0.002 * (budget / 4096) ** p, the powers of 2 written out: sqrt(16) = 4, sqrt(64) = 8, ...
    assert scaled_lr(0.002, budget, 4096, rule) == pytest.approx(expected, rel=1e-12)


def test_scaled_lr_is_the_lr_itself_at_the_reference_budget():
    for rule in ("sqrt", "linear", "none"):
        assert scaled_lr(0.0017, 4096, 4096, rule) == 0.0017  # exactly: the CPU preset's numbers


@pytest.mark.parametrize(("args", "message"), [
    ((0.002, 65536, 4096, "cubic"), "rule must be one of"),
    ((0.002, 0, 4096, "sqrt"), "budget must be a number > 0"),
    ((-1.0, 65536, 4096, "sqrt"), "lr must be a number > 0"),
    ((0.002, 65536, "4096", "sqrt"), "reference must be a number > 0"),
])
def test_scaled_lr_refuses_bad_input(args, message):
    with pytest.raises(ValueError, match=message):
        scaled_lr(*args)


def test_the_gpu_preset_sets_the_budget_and_the_scaled_lr(compose_cfg):
    cpu, gpu = compose_cfg("config"), compose_cfg("config", "trainer=gpu")
    assert (cpu.data.budget, cpu.model.optimizer.lr, cpu.model.scheduler) == (4096, 0.002, None)
    assert "lr_scaling" not in cpu
    assert gpu.data.budget == 65536 and gpu.data.budget >= 65536
    assert (gpu.trainer.accelerator, gpu.trainer.precision) == ("gpu", "bf16-mixed")
    assert gpu.model.optimizer.lr == pytest.approx(0.002 * math.sqrt(65536 / 4096))
    # the rule shows in the resolved config (config_resolved.yaml), its result beside it
    resolved = OmegaConf.to_container(gpu, resolve=True)
    assert resolved["lr_scaling"] == {"base_lr": 0.002, "reference_budget": 4096, "rule": "sqrt"}
    assert resolved["model"]["optimizer"]["lr"] == pytest.approx(0.008)
    # the rest of the trainer node is the CPU preset's (max_epochs, plugins, ...)
    rest = {k: v for k, v in OmegaConf.to_container(gpu.trainer).items()
            if k not in ("accelerator", "precision", "deterministic")}
    assert rest == {k: v for k, v in OmegaConf.to_container(cpu.trainer).items()
                    if k not in ("accelerator", "precision", "deterministic")}


@pytest.mark.parametrize(("overrides", "budget", "lr"), [
    (("trainer.devices=2",), 65536, 0.008),
    (("data.budget=16384",), 16384, 0.004),
    (("data.budget=262144", "lr_scaling.rule=linear"), 262144, 0.128),
    (("lr_scaling.base_lr=0.001",), 65536, 0.004),
    (("model.optimizer.lr=0.01",), 65536, 0.01),  # an explicit lr replaces the rule
    (("batching=session",), 65536, 0.008),
])
@pytest.mark.slow
def test_the_gpu_preset_takes_overrides(compose_cfg, overrides, budget, lr):
    cfg = compose_cfg("config", "trainer=gpu", *overrides)
    assert cfg.data.budget == budget and cfg.model.optimizer.lr == pytest.approx(lr)
    if "trainer.devices=2" in overrides:
        assert cfg.trainer.devices == 2


def test_an_experiment_after_the_gpu_preset_wins(compose_cfg):
    """experiment= comes after trainer= in the defaults list: its budget and lr are kept."""
    cfg = compose_cfg("config", "trainer=gpu", "experiment=letor")
    assert (cfg.data.budget, cfg.model.optimizer.lr) == (1024, 0.001)


class _LearningRates(pl.Callback):
    """The learning rate each training batch is trained with."""

    def __init__(self):
        self.lrs: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])


def _fit_lrs(compose_cfg, *overrides: str, batches: int, epochs: int) -> list[float]:
    cfg = compose_cfg("config", *SMALL, "data.budget=256", *overrides)
    dm = hydra.utils.instantiate(cfg.data)
    model = build_model(cfg, dm)
    seen = _LearningRates()
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=epochs, limit_train_batches=batches,
                         limit_val_batches=0, num_sanity_val_steps=0, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[seen])
    trainer.fit(model, datamodule=dm)
    return seen.lrs


def test_warmup_steps_after_every_optimizer_step(compose_cfg):
    """scheduler=warmup: lr_k = lr * (f + (1 - f) * min(k, T) / T) before the (k+1)-th step."""
    lrs = _fit_lrs(compose_cfg, "scheduler=warmup", "model.scheduler.start_factor=0.25",
                   "model.scheduler.total_iters=4", batches=3, epochs=2)
    f, t, lr = 0.25, 4, 0.002
    assert lrs == pytest.approx([lr * (f + (1 - f) * min(k, t) / t) for k in range(6)])


def test_epoch_schedulers_still_step_per_epoch(compose_cfg):
    """scheduler=cosine (no interval key): constant within an epoch, cosine-decayed across."""
    lrs = _fit_lrs(compose_cfg, "scheduler=cosine", "trainer.max_epochs=2", batches=3, epochs=2)
    lr = 0.002
    assert lrs == pytest.approx([lr] * 3 + [lr * (1 + math.cos(math.pi / 2)) / 2] * 3)
    out = build_model(compose_cfg("config", *SMALL, "scheduler=cosine"),
                      hydra.utils.instantiate(compose_cfg("config", *SMALL).data)).configure_optimizers()
    assert out["lr_scheduler"]["interval"] == "epoch"


def test_a_bad_interval_is_refused(compose_cfg):
    cfg = compose_cfg("config", *SMALL, "scheduler=warmup", "model.scheduler.interval=batch")
    model = build_model(cfg, hydra.utils.instantiate(cfg.data))
    with pytest.raises(ValueError, match="model.scheduler.interval must be 'epoch' or 'step', got 'batch'"):
        model.configure_optimizers()
