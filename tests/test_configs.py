"""Every option of every config group composes and builds what its group is named after.

Options are discovered from ``conf/``: a new option (or a new group) without coverage here fails
``test_every_group_is_covered``.
"""

from __future__ import annotations

from pathlib import Path

import hydra
import pytest
import pytorch_lightning as pl
import torch

from hybridrank.cli.train import build_model, build_trainer
from hybridrank.data.datamodule import ListDataModule
from hybridrank.data.simulate import simulate_clicklog
from hybridrank.losses import HybridLoss
from hybridrank.metrics.list_metrics import ListMetrics
from hybridrank.models.ranker import HybridRanker
from hybridrank.serving.calibration import Calibrator

CONF = Path(__file__).resolve().parents[1] / "conf"
SMALL = ["data.source.n_users=60"]
REAL = {"letor_mq2008", "mslr", "open_bandit"}
#: group -> how it is checked below (hparams_search: every option in tests/test_search.py)
GROUPS = {"data", "batching", "model", "loss", "optimizer", "scheduler", "metrics", "trainer",
          "callbacks", "logger", "calibrator", "experiment", "debug", "paths", "hydra",
          "position_bias", "hparams_search"}


@pytest.fixture(scope="module")
def compose_cfg(compose_cfg, tmp_path_factory):
    """conftest's ``compose_cfg`` writing (if at all) into a temporary folder of this module."""
    out = tmp_path_factory.mktemp("configs")

    def compose(name: str = "config", *overrides: str):
        if not any(o.startswith("paths.output_dir=") for o in overrides):
            overrides = (*overrides, f"paths.output_dir={out}")
        return compose_cfg(name, *overrides)

    return compose


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def test_every_group_is_covered():
    groups = {p.name for p in CONF.iterdir() if p.is_dir() and not p.name.startswith("_")}
    assert groups == GROUPS, f"new / removed config groups: {groups ^ GROUPS}"
    for g in GROUPS:
        assert options(g), g


@pytest.fixture(scope="module")
def sim_log(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("configs") / "log.parquet"
    simulate_clicklog(n_users=80, seed=3).write_parquet(path, row_group_size=1000)
    return path


def data_overrides(name: str, sim_log: Path) -> list[str]:
    if name == "sim":
        return ["data=sim", *SMALL]
    if name in ("clicklog", "clicklog_stream"):
        extra = ["data.source.chunk_rows=2000"] if name == "clicklog_stream" else []
        return [f"data={name}", f"data.source.path={sim_log}", *extra]
    return [f"data={name}"]


@pytest.mark.slow
@pytest.mark.parametrize("name", options("data"))
def test_data_options_build_their_datamodule(name, compose_cfg, sim_log, request):
    if name in REAL:
        request.getfixturevalue("real_data")
    cfg = compose_cfg("config", *data_overrides(name, sim_log))
    dm = hydra.utils.instantiate(cfg.data)
    assert isinstance(dm, ListDataModule)
    info = dm.model_data()
    schema = info["schema"]
    assert schema["label_max"] == cfg.data.source.label_max
    assert 0 < info["base_rate"] < 1 and 0 < info["neg_keep_rate"] <= 1
    test = list(dm.eval_chunks("test"))
    assert sum(d.n_requests for d in test) > 0
    if name == "mslr":
        assert len(schema["numeric"]) == 136 and float(test[0].label.max()) <= 4
    if name == "open_bandit":
        assert test[0].position is not None and int(test[0].lengths.max()) > 1


@pytest.fixture(scope="module")
def sim_dm(compose_cfg):
    return hydra.utils.instantiate(compose_cfg("config", *SMALL).data)


@pytest.mark.parametrize("name", options("batching"))
def test_batching_presets_fill_the_datamodule(name, compose_cfg):
    cfg = compose_cfg("config", f"batching={name}", *SMALL)
    dm = hydra.utils.instantiate(cfg.data)
    assert dm.scope == cfg.data.scope and dm.budget == cfg.data.budget
    batch = next(iter(dm.train_dataloader()))
    assert len(batch) <= dm.budget and batch.request is not None


# A scorer and a loss meet only through the number of outputs (one; two for JRC), so every loss
# is built with the default model and every model with a one- and a two-output loss.
MODEL_LOSS = sorted({("mlp", loss) for loss in options("loss")}
                    | {(model, loss) for model in options("model") for loss in ("bce_softmax", "jrc")})


@pytest.mark.slow
@pytest.mark.parametrize(("model", "loss"), MODEL_LOSS)
def test_every_model_and_every_loss(model, loss, compose_cfg, sim_dm):
    cfg = compose_cfg("config", f"model={model}", f"loss={loss}", *SMALL)
    m = build_model(cfg, sim_dm)
    assert isinstance(m, HybridRanker) and isinstance(m.loss, HybridLoss)
    assert m.scorer.n_outputs == m.loss.n_outputs == (2 if loss == "jrc" else 1)
    batch = next(iter(sim_dm.train_dataloader()))
    total = m.training_step(batch, 0)
    total.backward()
    assert torch.isfinite(total)
    # the stored hyper-parameters are the configs: the model rebuilds from them alone
    again = HybridRanker(**{k: v for k, v in m.hparams.items()})
    again.load_state_dict(m.state_dict())
    assert torch.equal(again(batch.num, batch.cat, batch.request), m(batch.num, batch.cat, batch.request))


@pytest.mark.slow
@pytest.mark.parametrize("opt", options("optimizer"))
@pytest.mark.parametrize("sched", options("scheduler"))
def test_optimizers_and_schedulers(opt, sched, compose_cfg, sim_dm):
    cfg = compose_cfg("config", f"optimizer={opt}", f"scheduler={sched}", *SMALL)
    out = build_model(cfg, sim_dm).configure_optimizers()
    optim = out["optimizer"] if isinstance(out, dict) else out
    assert isinstance(optim, torch.optim.Optimizer)
    assert optim.defaults["lr"] == cfg.model.optimizer.lr
    if sched == "none":
        assert not isinstance(out, dict)
    else:
        assert isinstance(out["lr_scheduler"]["scheduler"], torch.optim.lr_scheduler.LRScheduler
                          | torch.optim.lr_scheduler.ReduceLROnPlateau)


@pytest.mark.parametrize("name", options("metrics"))
def test_metrics_options(name, compose_cfg, sim_dm):
    m = build_model(compose_cfg("config", f"metrics={name}", *SMALL), sim_dm)
    assert isinstance(m.new_metrics(), ListMetrics) and m.val_metrics is not m.test_metrics


@pytest.mark.parametrize("name", options("trainer"))
def test_trainer_options(name, compose_cfg):
    # accelerator-specific options are built on the CPU here (a GPU run is checked where one is
    # lent); everything else about them (precision, strategy, plugins) is instantiated as is
    extra = [] if name in ("cpu", "ddp_cpu") else ["trainer.accelerator=cpu", "trainer.devices=1"]
    if name == "gpu":
        extra.append("trainer.precision=bf16-mixed")
    trainer = build_trainer(compose_cfg("config", f"trainer={name}", *SMALL, *extra))
    assert isinstance(trainer, pl.Trainer)


def test_trainer_presets_size_their_batches(compose_cfg):
    """trainer=gpu fills a device (data.budget >= 65,536) at the learning rate of its rule
    (conf/trainer/gpu.yaml); every other trainer keeps the CPU preset's budget and lr."""
    for name in options("trainer"):
        cfg = compose_cfg("config", f"trainer={name}")
        if name == "gpu":
            rule = cfg.lr_scaling
            power = {"none": 0.0, "sqrt": 0.5, "linear": 1.0}[rule.rule]
            assert cfg.data.budget >= 65536 and rule.reference_budget == 4096
            assert cfg.model.optimizer.lr == pytest.approx(
                rule.base_lr * (cfg.data.budget / rule.reference_budget) ** power)
            assert cfg.model.optimizer.lr > rule.base_lr
        else:
            assert (cfg.data.budget, cfg.model.optimizer.lr) == (4096, 0.002), name
            assert "lr_scaling" not in cfg, name


@pytest.mark.parametrize("name", options("callbacks"))
def test_callback_options(name, compose_cfg):
    cfg = compose_cfg("config", f"callbacks={name}", *SMALL)
    cbs = [hydra.utils.instantiate(c) for c in (cfg.get("callbacks") or {}).values()]
    assert all(isinstance(c, pl.Callback) for c in cbs)
    if name == "default":
        assert {type(c).__name__ for c in cbs} >= {"EpochCheckpoint", "LastCheckpoint", "EarlyStopping",
                                                   "EpochLog"}
        last = next(c for c in cbs if type(c).__name__ == "LastCheckpoint")
        assert last.save_last and last.timed  # last.ckpt by the clock, read every few steps


@pytest.mark.parametrize("name", options("logger"))
def test_logger_options(name, compose_cfg, tmp_path):
    if name == "tensorboard":
        pytest.importorskip("tensorboard", reason="the tensorboard logger is an optional extra "
                                                  "(pip install 'hybridrank[tensorboard]')")
    cfg = compose_cfg("config", f"logger={name}", f"paths.output_dir={tmp_path}")
    if name == "none":
        assert not cfg.get("logger")
    else:
        assert isinstance(hydra.utils.instantiate(cfg.logger), pl.loggers.Logger)


@pytest.mark.slow
@pytest.mark.parametrize("name", options("calibrator"))
@pytest.mark.parametrize("command", ["export", "eval"])
def test_calibrator_options(name, command, compose_cfg):
    cfg = compose_cfg(command, f"calibrator={name}", "checkpoint=x.ckpt")
    assert isinstance(hydra.utils.instantiate(cfg.calibrator), Calibrator)
    assert cfg.task_name == command


@pytest.mark.slow
@pytest.mark.parametrize("name", options("position_bias"))
def test_position_bias_options(name, compose_cfg):
    # the tower refuses position as a feature: the simulator's position_feature switch goes with it
    extra = ["data.source.position_feature=false"] if name != "none" else []
    cfg = compose_cfg("config", f"position_bias={name}", *SMALL, *extra)
    dm = hydra.utils.instantiate(cfg.data)
    m = build_model(cfg, dm)
    assert (m.position_bias is None) == (name == "none")
    batch = next(iter(dm.train_dataloader()))
    assert torch.isfinite(m.training_step(batch, 0))
    if name == "tower":
        with pytest.raises(ValueError, match="position column 'position' is also a numeric feature"):
            build_model(compose_cfg("config", f"position_bias={name}", *SMALL), dm_with_position(
                compose_cfg))
    if name == "auto":  # stands aside where position is a feature: the simulator's default
        assert build_model(compose_cfg("config", *SMALL), dm_with_position(compose_cfg)).position_bias is None


def dm_with_position(compose_cfg):
    return hydra.utils.instantiate(compose_cfg("config", *SMALL).data)


@pytest.mark.parametrize("name", options("experiment"))
def test_experiment_options(name, compose_cfg, request, monkeypatch):
    if name in ("letor",):
        real = request.getfixturevalue("real_data")
        monkeypatch.setenv("HYBRIDRANK_REAL_DATA", str(real))
    extra = ["data.source.n_users=60"] if name == "position_bias" else []
    cfg = compose_cfg("config", f"experiment={name}", *extra)
    dm = hydra.utils.instantiate(cfg.data)
    m = build_model(cfg, dm)
    assert m.scorer.n_numeric == len(dm.schema.numeric)


#: how a built ``pl.Trainer`` shows each trainer key a debug option may set
TRAINER_READ = {
    "max_epochs": lambda t: t.max_epochs,
    "max_steps": lambda t: t.max_steps,
    "enable_progress_bar": lambda t: t.progress_bar_callback is not None,
    "limit_train_batches": lambda t: t.limit_train_batches,
    "limit_val_batches": lambda t: t.limit_val_batches,
    "limit_test_batches": lambda t: t.limit_test_batches,
    "fast_dev_run": lambda t: t.fast_dev_run,
    "overfit_batches": lambda t: t.overfit_batches,
    "log_every_n_steps": lambda t: t.log_every_n_steps,
    "num_sanity_val_steps": lambda t: t.num_sanity_val_steps,
    "check_val_every_n_epoch": lambda t: t.check_val_every_n_epoch,
}


@pytest.mark.parametrize("name", options("debug"))
def test_debug_options(name, compose_cfg):
    """A debug option changes what it says: every value it sets reaches the composed config, every
    trainer key reaches the built Trainer, and it differs from the run without it."""
    from omegaconf import OmegaConf

    node = OmegaConf.to_container(OmegaConf.load(CONF / "debug" / f"{name}.yaml"))
    node.pop("defaults", None)
    assert node, f"debug={name} sets nothing"
    cfg = compose_cfg("config", f"debug={name}", *SMALL)
    plain = compose_cfg("config", *SMALL)

    def leaves(d, prefix=""):
        for k, v in d.items():
            yield from leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}", v)]

    set_here = dict(leaves(node))
    for key, value in set_here.items():
        assert OmegaConf.select(cfg, key) == value, (key, OmegaConf.select(cfg, key), value)
    assert any(OmegaConf.select(plain, key) != value for key, value in set_here.items()), (
        f"debug={name} changes nothing of the default config")
    trainer = build_trainer(cfg)
    assert isinstance(trainer, pl.Trainer)
    for key, value in (node.get("trainer") or {}).items():
        assert key in TRAINER_READ, f"debug={name} sets trainer.{key}: add how to read it to TRAINER_READ"
        assert TRAINER_READ[key](trainer) == value, (key, TRAINER_READ[key](trainer), value)


def test_paths_and_hydra_are_shared(compose_cfg):
    """One paths node and one hydra node for train, export and eval."""
    from hybridrank.conf import real_data_dir

    for command in ("config", "export", "eval"):
        cfg = compose_cfg(command, "checkpoint=x.ckpt") if command != "config" else compose_cfg(command)
        assert cfg.paths.data_dir == real_data_dir()
    for group in ("paths", "hydra"):
        assert options(group) == ["default"]


def test_real_data_folder_is_found_from_anywhere(compose_cfg, monkeypatch, tmp_path):
    """Without HYBRIDRANK_REAL_DATA the shared data is ../shared/data relative to the repository,
    not to the working directory (README commands run from any folder)."""
    monkeypatch.delenv("HYBRIDRANK_REAL_DATA", raising=False)
    monkeypatch.chdir(tmp_path)
    cfg = compose_cfg("config", "data=letor_mq2008")
    expected = CONF.parent.parent / "shared" / "data" / "letor" / "MQ2008" / "Fold1" / "train.txt"
    assert Path(cfg.data.source.train) == expected
    monkeypatch.setenv("HYBRIDRANK_REAL_DATA", str(tmp_path / "elsewhere"))
    cfg = compose_cfg("config", "data=letor_mq2008")
    assert cfg.data.source.train == f"{tmp_path}/elsewhere/letor/MQ2008/Fold1/train.txt"


def test_listmle_breaks_ties_at_random_by_default(compose_cfg):
    """A fixed tie order (seed 0) ranks worse than random on click data (issue 19): the shipped
    ListMLE configs draw a new order at every call; a fixed seed is an explicit override."""
    for name in ("bce_listmle", "bce_position_aware_listmle"):
        cfg = compose_cfg("config", f"loss={name}")
        (term,) = cfg.model.loss.terms.values()
        assert term.options.seed is None, name
