"""Command-line entry points: ``train(cfg) -> dict`` and the ``hybridrank-train`` hydra app."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import hydra
import pytorch_lightning as pl
import torch
from omegaconf import DictConfig, OmegaConf

from hybridrank.atomic import write_json, write_text
from hybridrank.cli._app import cli_errors, drop_adverts, hydra_job, quiet_third_party, take_process_start
from hybridrank.cli.callbacks import CSVHistoryLogger, EpochProgressBar, RunClock, ValHistory
from hybridrank.evaluation.figures import CHUNK_ROWS, TABLE_COLUMNS, final_figures
from hybridrank.evaluation.tables import format_offsets, format_table
from hybridrank.models.ranker import HybridRanker
from hybridrank.serving.checkpoint import atomic_torch_save, checkpoint_state

__all__ = ["train", "train_main", "resume_main", "build_model", "build_trainer", "build_datamodule"]

log = logging.getLogger(__name__)

#: The configs: the repository's ``conf/`` folder, installed inside the package as
#: ``hybridrank.conf`` (pyproject.toml), so editable and regular installs find the same files.
#: Another folder can be given with hydra's ``--config-dir``.
CONF_MODULE = "hybridrank.conf"
CONF_DIR = f"pkg://{CONF_MODULE}"


def build_model(cfg: DictConfig, datamodule) -> HybridRanker:
    """The ``HybridRanker`` of ``cfg.model`` for the data of ``datamodule``.

    The model node is instantiated non-recursively (its ``scorer``, ``loss``, ``optimizer``,
    ``scheduler`` and ``metrics`` configs are built by the model itself and stored in its
    hyper-parameters); ``data`` (schema, base rate, negative keep rate) is passed as plain Python,
    never through OmegaConf, so large vocabularies stay cheap.
    """
    node = OmegaConf.to_container(cfg.model, resolve=True)
    target = hydra.utils.get_class(node.pop("_target_"))
    node.pop("_recursive_", None)
    return target(**node, data=datamodule.model_data(), config=OmegaConf.to_container(cfg, resolve=True))


def build_trainer(cfg: DictConfig) -> pl.Trainer:
    """The Lightning trainer with the configured callbacks and logger.

    ``trainer.enable_progress_bar: auto`` shows the bar only on a terminal; a log file gets the
    one line per epoch of :class:`hybridrank.cli.callbacks.EpochLog` instead of carriage returns.
    A :class:`~hybridrank.cli.callbacks.ValHistory` is always added (``metrics.json`` reports the
    validation figures of the kept checkpoint's epoch).
    """
    drop_adverts()  # Lightning's "💡 Tip" lines on every Trainer
    callbacks = [hydra.utils.instantiate(c) for c in (cfg.get("callbacks") or {}).values()]
    callbacks.append(ValHistory())
    callbacks.append(RunClock())
    logger = hydra.utils.instantiate(cfg.logger) if cfg.get("logger") else False
    extra = {}
    bar = cfg.trainer.get("enable_progress_bar", True)
    if bar == "auto":
        bar = extra["enable_progress_bar"] = sys.stderr.isatty()
    if bar and not any(isinstance(c, pl.callbacks.ProgressBar) for c in callbacks):
        # epochs counted from 1, as everywhere else; the bar reads the logged losses (a device
        # read each) when it refreshes: as often as they are logged, not every step
        every = max(int(cfg.trainer.get("log_every_n_steps") or 1), 1)
        callbacks.append(EpochProgressBar(refresh_rate=every))
    return hydra.utils.instantiate(cfg.trainer, callbacks=callbacks, logger=logger, **extra)


def build_datamodule(cfg: DictConfig, splits=None):
    """The data module of ``cfg.data``; with ``splits`` (already loaded ``Splits``), those data
    with the config's batching keys (several runs then share one load)."""
    if splits is None:
        return hydra.utils.instantiate(cfg.data)
    node = OmegaConf.to_container(cfg.data, resolve=True)
    node.pop("source", None)
    return hydra.utils.get_class(node.pop("_target_"))(splits=splits, **node)


@quiet_third_party()
def train(cfg: DictConfig, *, splits=None) -> dict[str, Any]:
    """Train, evaluate on the test split, write ``metrics.json``; return the metrics.

    Returns a dict with ``val`` metrics (those of the epoch whose checkpoint the run keeps,
    ``val_epoch``, 1-based) and ``test`` metrics (``test/ndcg@10``, ``test/logloss``, ... of that
    checkpoint), reference rows (``oracle`` when the data carries the true click probability,
    ``base_rate``), the best checkpoint path, ``optimized_metric`` (the value of
    ``cfg.optimized_metric``, for sweeps), ``fit_seconds`` (``trainer.fit``), ``unseen_dropout``
    (per vocabulary column the Good-Turing share of unseen values, the share already at code 0
    and the share dropped in training; ``{}`` when off) and the wall time.

    ``splits``: already loaded data (``Splits``) to train on instead of loading ``cfg.data``'s
    source (its batching keys still apply): what benchmarks that train several models on one
    data set pass. ``resume=auto`` on a finished run (``metrics.json`` present) returns its
    metrics without training (``already_finished: True``).
    """
    t0 = time.perf_counter()
    clock: dict[str, float] = {}  # where the time went: start, read, fit, evaluate, intervals
    started = take_process_start()  # a console script's: imports and config before this call
    if started is not None:
        clock["start"] = t0 - started
    check_devices(cfg.trainer)
    out_dir = Path(cfg.paths.output_dir)
    ckpt_path = resume_checkpoint(cfg, out_dir)
    if cfg.get("resume") and (done := finished_result(out_dir)) is not None:
        log.info("%s already finished (metrics.json): nothing to resume", out_dir)
        return done
    pl.seed_everything(int(cfg.seed), workers=True, verbose=False)
    datamodule = build_datamodule(cfg, splits)
    model = build_model(cfg, datamodule)  # loads the data: bad data fails before any output
    clock["read"] = time.perf_counter() - t0
    out_dir.mkdir(parents=True, exist_ok=True)
    if ckpt_path is None:
        # the config that `hybridrank-resume RUN_DIR` reads back (interpolations kept)
        write_text(out_dir / RESUME_CONFIG, OmegaConf.to_yaml(cfg, resolve=False))
    trainer = build_trainer(cfg)
    if ckpt_path is not None:
        log.info("resuming from %s", ckpt_path)
        prepare_resume(trainer, ckpt_path)
    t_fit = time.perf_counter()
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    fit_seconds = time.perf_counter() - t_fit

    ckpt = trainer.checkpoint_callback
    best = ckpt.best_model_path if ckpt is not None and ckpt.best_model_path else None
    # the kept checkpoint, read once for its epoch and the refit: this run's own file, just
    # written (a weights-only read of the same file took ~7x longer, and it was read three times)
    best_state = torch.load(best, map_location="cpu", weights_only=False) if best else None
    best_epoch = int(best_state["epoch"]) if best_state is not None else None
    val_epoch, val = kept_val_metrics(trainer, best_epoch)
    result: dict[str, Any] = {
        "val": val,
        "val_epoch": val_epoch,
        "best_checkpoint": best,
        "output_dir": str(out_dir),
        "training": training_summary(trainer, best_epoch),  # the fit's, before any other trainer call
        "fit_seconds": fit_seconds,
        "unseen_dropout": model.unseen_report or {},
    }
    run_clock = next(c for c in trainer.callbacks if isinstance(c, RunClock))
    clock.update(fit=fit_seconds, training=run_clock.train_seconds, validation=run_clock.val_seconds)
    t_eval = time.perf_counter()
    refitted = refit_position_bias(trainer, model, datamodule, best, best_state)
    if cfg.get("test_after_fit", True):
        if trainer.world_size > 1:
            # every rank reports streaming test metrics (rank 0's are replaced by the final
            # figures below); trainer.test restores the kept weights on every rank
            tested = trainer.test(model, datamodule=datamodule, ckpt_path=best, verbose=False)
            result["test"] = {k: float(v) for k, v in tested[0].items()}
        elif best is not None and not refitted:
            # one process: the final figures below are the test figures; a trainer.test pass
            # would score the test split a second time only to be replaced by them (after a
            # refit the model already holds the kept weights and the refitted offsets)
            model.load_state_dict(best_state["state_dict"])
        best_state = None  # freed before the test evaluation
        if trainer.is_global_zero:
            # the final figures and their intervals come from one set of per-request
            # statistics of the test split
            result.update(final_figures(model, datamodule.eval_chunks("test", CHUNK_ROWS),
                                        clock=clock, **(cfg.get("intervals") or {})))
            result["level_trend"] = training_level_trend(model, datamodule)
    clock["evaluate"] = time.perf_counter() - t_eval - clock.get("intervals", 0.0)
    if model.position_bias is not None:  # the best checkpoint's offsets (restored above)
        if best is not None and not cfg.get("test_after_fit", True):
            model = HybridRanker.load_from_checkpoint(best, weights_only=True)
        result["position_bias"] = model.position_bias.report()
    name = cfg.get("optimized_metric")
    if name:
        stage = "test" if name.startswith("test/") else "val"
        if name not in result.get(stage, {}):
            raise ValueError(f"optimized_metric={name!r} was not computed; {stage} metrics are "
                             f"{sorted(result.get(stage, {}))}")
        result["optimized_metric"] = result[stage][name]
    result["seconds"] = time.perf_counter() - (t0 if started is None else started)
    result["time"] = {k: clock[k] for k in ("start", "read", "fit", "training", "validation", "evaluate",
                                            "intervals") if k in clock}
    result["is_global_zero"] = trainer.is_global_zero
    if trainer.is_global_zero:
        write_json(out_dir / "metrics.json", result)
        write_text(out_dir / "config_resolved.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    return result


RESUME_CONFIG = "resume_config.yaml"


def time_line(result: Mapping[str, Any]) -> str:
    """Where a run's wall time went, in one line: starting (a console script's imports and
    config, from the process's start), reading the data (and fitting the schema), the fit
    (training batches, validation, the rest: setup, checkpoints), evaluating the kept model on the
    test split (with the position tower's refit and the level trend), and the bootstrap intervals.

    >>> time_line({"seconds": 14.0, "time": {"start": 4.0, "read": 1.0, "fit": 7.0, "training": 5.5,
    ...            "validation": 1.0, "evaluate": 1.5, "intervals": 0.5}})
    'wall time: 14.0 s = start 4.0 + read 1.0 + fit 7.0 (training 5.5, validation 1.0) + evaluate 1.5 + intervals 0.5 s'
    """
    t = result.get("time") or {}
    if not t:
        return f"wall time: {result['seconds']:.1f} s"
    fit = f"fit {t['fit']:.1f}"
    if "training" in t:
        fit += f" (training {t['training']:.1f}, validation {t.get('validation', 0.0):.1f})"
    parts = [f"start {t['start']:.1f}"] if "start" in t else []
    parts += [f"read {t['read']:.1f}", fit] + [f"{k} {t[k]:.1f}" for k in ("evaluate", "intervals")
                                                if k in t]
    return f"wall time: {result['seconds']:.1f} s = " + " + ".join(parts) + " s"


def machine_devices() -> str:
    """What this machine offers for training, in words (for error messages)."""
    import os

    if torch.cuda.is_available():
        names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
        gpus = f"{torch.cuda.device_count()} CUDA GPU(s): {', '.join(names)}"
    elif torch.version.cuda is None:
        gpus = f"no CUDA GPU (torch {torch.__version__} is a CPU-only build)"
    else:
        gpus = f"no CUDA GPU visible (torch {torch.__version__} built with CUDA {torch.version.cuda})"
    return f"{gpus}; {os.cpu_count()} CPU core(s)"


def check_devices(node: Any) -> None:
    """One line naming what the machine has and the fix when the trainer asks for GPUs it does
    not have, before anything is read or written (Lightning's own error is a long traceback,
    after the run folder exists)."""
    accelerator = str(node.get("accelerator", "auto")).lower()
    if accelerator not in ("gpu", "cuda"):
        return
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have == 0:
        raise ValueError(f"trainer.accelerator={accelerator} asks for a CUDA GPU, but this machine has "
                         f"{machine_devices()}: train on the CPU (trainer=cpu, the default) or run "
                         f"on a machine with a GPU")
    devices = node.get("devices", "auto")
    if isinstance(devices, int) and not isinstance(devices, bool):
        want = have if devices == -1 else devices
    elif isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
        want = have if int(devices) == -1 else int(devices)
    elif isinstance(devices, (list, tuple)) or type(devices).__name__ == "ListConfig":
        ids = [int(i) for i in devices]
        if any(i >= have or i < 0 for i in ids):
            raise ValueError(f"trainer.devices={ids} names GPU ids this machine does not have "
                             f"({machine_devices()}): use ids 0..{have - 1}")
        return
    else:
        return  # "auto": Lightning takes what there is
    if want > have:
        raise ValueError(f"trainer.devices={devices} asks for {want} GPUs, but this machine has "
                         f"{machine_devices()}: set trainer.devices={have} (or fewer)")


def refit_position_bias(trainer: pl.Trainer, model: HybridRanker, datamodule, best: str | None,
                        state: dict[str, Any] | None = None) -> bool:
    """One more exact update of the position tower's offsets from the kept checkpoint's logits.

    Loads the best checkpoint's weights (``state``: its contents, already read) into ``model``,
    refits the offsets on the whole training split (:meth:`HybridRanker.refit_offsets`, as many
    batches as training reads) and writes the weights back into the best checkpoint (and into
    ``state``), which test, export and eval then read. The validation
    figures in the report stay those of the kept epoch. Skipped (False) without a tower, with
    ``refit: false``, without a best checkpoint, or when negatives were dropped without
    re-weighting (the logits are then at the sampled rate and the full split would move their
    level).
    """
    tower = model.position_bias
    if tower is None or not getattr(tower, "refit", False) or best is None:
        return False
    info = model.data_info
    if float(info.get("neg_keep_rate", 1.0)) < 1.0 and not info.get("reweight_negatives", True):
        log.info("position tower: no refit on the kept checkpoint (negatives sampled without "
                 "re-weighting)")
        return False
    # the kept weights, loaded by hand: validate(ckpt_path=...) would also restore the callbacks'
    # state (the stopping rule's) to the kept epoch's
    if state is None:
        state = torch.load(best, map_location="cpu", weights_only=False)
    model.load_state_dict(state["state_dict"])
    model.refit_offsets(trainer, datamodule.eval_dataloader("train"),
                        limit_batches=trainer.limit_train_batches)  # the data the model was fitted on
    if trainer.is_global_zero:
        state["state_dict"] = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        atomic_torch_save(state, best)
    trainer.strategy.barrier("refit_position_bias")
    if trainer.is_global_zero:
        log.info("position tower: refit on the kept checkpoint moved the offsets by at most "
                 "%.4f logit", float(tower.last_change))
    return True


def training_summary(trainer: pl.Trainer, best_epoch: int | None) -> dict[str, Any]:
    """How many epochs ran, which one the kept (best) checkpoint holds (both 1-based; ``best_epoch``
    is the checkpoint's own 0-based ``epoch``, None without one) and why training stopped."""
    from pytorch_lightning.callbacks.early_stopping import EarlyStopping, EarlyStoppingReason

    epochs = int(trainer.current_epoch)  # epochs completed
    reason = None
    for c in trainer.callbacks:
        if isinstance(c, EarlyStopping) and c.stopping_reason != EarlyStoppingReason.NOT_STOPPED:
            reason = f"early stopping on {c.monitor}: {(c.stopping_reason_message or '').strip()}"
            break
    if reason is None:
        if trainer.max_epochs is not None and 0 < trainer.max_epochs <= epochs:
            reason = f"max_epochs={trainer.max_epochs} reached (the stopping rule had not acted)"
        elif trainer.interrupted:
            reason = "interrupted"
        else:
            reason = "another limit (max_steps, max_time)"
    return {"epochs": epochs, "best_epoch": None if best_epoch is None else best_epoch + 1,
            "stopped_because": reason,
            "max_epochs": trainer.max_epochs}


def resume_checkpoint(cfg: DictConfig, out_dir: Path) -> str | None:
    """The checkpoint to resume from: ``resume=auto`` takes ``checkpoints/last.ckpt`` if present."""
    resume = cfg.get("resume")
    if not resume:
        return None
    if resume == "auto":
        last = out_dir / "checkpoints" / "last.ckpt"
        return str(last) if last.exists() else None
    if not Path(resume).is_file():
        raise FileNotFoundError(f"resume={resume}: no such checkpoint file")
    return str(resume)


# ----------------------------------------------------------------------------------------------
# what a run keeps and reports (metrics.json, resume)
# ----------------------------------------------------------------------------------------------
def finished_result(out_dir: Path) -> dict[str, Any] | None:
    """The ``metrics.json`` of a run that finished in ``out_dir`` (``already_finished: True``
    added), or None: a resumed run that already finished has nothing to do."""
    path = Path(out_dir) / "metrics.json"
    if not path.is_file():
        return None
    result = json.loads(path.read_text())
    result["already_finished"] = True
    return result


def kept_val_metrics(trainer: pl.Trainer, best_epoch: int | None) -> tuple[int | None, dict[str, float]]:
    """``(epoch, val metrics)`` of the checkpoint the run keeps, epoch 1-based.

    ``best_epoch`` is the (0-based) epoch stored in the best checkpoint; its validation metrics come from
    :class:`~hybridrank.cli.callbacks.ValHistory` (kept across resumes). Without a best
    checkpoint (``callbacks=none``) the model kept is the last epoch's.
    """
    history = next((c.history for c in trainer.callbacks if isinstance(c, ValHistory)), {})
    epoch = best_epoch
    if epoch is not None and epoch in history:
        return epoch + 1, dict(history[epoch])
    if epoch is not None and history:  # validation ran, but not at the kept checkpoint's epoch
        log.warning("no validation record of epoch %d (the kept checkpoint's); metrics.json "
                    "reports the last epoch's validation metrics", epoch + 1)
    last = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
    return (max(history) + 1 if history else None), last


def prepare_resume(trainer: pl.Trainer, ckpt_path: str) -> None:
    """Before a resumed fit: the run's history continues where the checkpoint left it.

    - ``logs/metrics.csv`` (:class:`~hybridrank.cli.callbacks.CSVHistoryLogger`) keeps the rows
      logged before the checkpoint's step and the resumed run appends to it;
    - epoch checkpoints written after ``ckpt_path`` by the interrupted run (the epochs are trained
      again) are removed, so the new ones keep their names (Lightning would write
      ``epoch01-v1.ckpt`` beside a stale ``epoch01.ckpt``).
    """
    state = checkpoint_state(ckpt_path)
    step = int(state.get("global_step", 0))
    for logger in trainer.loggers:
        if isinstance(logger, CSVHistoryLogger):
            kept = logger.resume_at(step)
            log.info("logs/metrics.csv: %d row(s) before step %d kept, the resumed run appends",
                     kept, step)
    known = {Path(ckpt_path).resolve()}
    for cb_state in (state.get("callbacks") or {}).values():
        if isinstance(cb_state, dict):
            for key in ("best_model_path", "last_model_path", "kth_best_model_path"):
                if cb_state.get(key):
                    known.add(Path(cb_state[key]).resolve())
            known.update(Path(p).resolve() for p in (cb_state.get("best_k_models") or {}))
    dirs = {Path(cb.dirpath) for cb in trainer.checkpoint_callbacks if getattr(cb, "dirpath", None)}
    for d in dirs:
        for f in d.glob("*.ckpt"):
            if f.name != "last.ckpt" and f.resolve() not in known:
                log.info("removing %s: written after the resumed checkpoint, trained again", f.name)
                f.unlink()


#: the training-time level trend scores at most about this many training + validation impressions
LEVEL_TREND_ROWS = 1 << 20
#: ... in pieces of whole requests of at most this many impressions, every k-th piece
LEVEL_TREND_PIECE = 1 << 14


def training_level_trend(model: HybridRanker, datamodule, max_rows: int = LEVEL_TREND_ROWS,
                         piece: int = LEVEL_TREND_PIECE) -> dict[str, Any]:
    """The kept model's level trend over the training and validation rows, as ``hybridrank-export``
    tests it with its defaults (:func:`~hybridrank.serving.level_trend.model_level_trend`; the
    export repeats the test on every row, with its own options and after any downsampling
    correction). Reported here so that a drifting click level shows at training time.

    On logs of more than ``max_rows`` training + validation impressions it scores every k-th piece
    of whole requests (pieces of at most ``piece`` impressions, spread evenly over the
    splits' order, the choice blind to labels), about ``max_rows`` in all; a log of at least
    ``2k`` chunks (streamed) gives every k-th chunk whole instead, so the rest is not read again.
    A report, not a correction: scoring every row cost a large log as much as a training epoch."""
    import itertools

    from hybridrank.serving.level_trend import model_level_trend

    rows = getattr(datamodule, "split_rows", None)
    total = rows["train"] + rows["val"] if rows else 0
    stride = max(1, -(-total // max_rows))
    source = getattr(datamodule, "source", None)
    layout = source.layout() if stride > 1 and source is not None else []
    if len(layout) >= 2 * stride:
        # a log of many chunks (streamed): every k-th chunk whole, so that the others are not
        # read from disk a second time
        chunks = (d for c in layout[::stride] for split in ("train", "val")
                  for d in [source.read_chunk(c, split)] if d is not None)
    else:
        chunks = itertools.chain(datamodule.eval_chunks("train", 1 << 20), datamodule.eval_chunks("val", 1 << 20))
        if stride > 1:
            pieces = (p for chunk in chunks for p in chunk.chunks(piece))
            chunks = itertools.islice(pieces, 0, None, stride)
    return model_level_trend(model, chunks).to_dict()


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
@hydra_job
def _hydra_main(cfg: DictConfig) -> float | None:
    torch.set_float32_matmul_precision("high")
    result = train(cfg)
    if not result.get("is_global_zero", True):  # under DDP only rank 0 reports
        return result.get("optimized_metric")
    if result.get("already_finished"):
        print(f"{result['output_dir']} already finished: nothing to resume (its metrics.json is "
              f"unchanged; best checkpoint {result.get('best_checkpoint')})")
        return result.get("optimized_metric")
    print()
    fields = tuple(k.removeprefix("test/") for k in result.get("test", {})
                   if k.startswith("test/f_ece@") and k != "test/f_ece@position")
    print(format_table(result, TABLE_COLUMNS + fields))
    print(f"\noutputs: {result['output_dir']} (metrics.json, config_resolved.yaml, checkpoints/, logs/)")
    tr = result.get("training") or {}
    print(f"best checkpoint: {result['best_checkpoint']} (epoch {tr.get('best_epoch')} of "
          f"{tr.get('epochs')}; stopped: {tr.get('stopped_because')})")
    if result.get("position_bias"):
        print(format_offsets(result["position_bias"]))
    dropped = {c: i for c, i in (result.get("unseen_dropout") or {}).items() if i.get("dropped")}
    if dropped:
        print("unseen-value dropout (code 0 trained for values serving meets first): " + ", ".join(
            f"{c} {100 * i['dropped']:.1f} %" for c, i in dropped.items()))
    if result.get("level_trend"):
        from hybridrank.serving.level_trend import LevelTrend

        trend = LevelTrend.from_dict(result["level_trend"])
        print(("the click level drifts over the log; hybridrank-export follows it: " if trend.applied
               else "click level over time: ") + trend.describe().removeprefix("level trend: "))
    print(time_line(result))
    # multirun sweepers (e.g. Optuna) minimise / maximise this value: cfg.optimized_metric
    return result.get("optimized_metric")


@cli_errors("hybridrank-train")
def train_main() -> None:
    """Console script ``hybridrank-train``."""
    _hydra_main()


@cli_errors("hybridrank-resume")
def resume_main(argv: list[str] | None = None) -> None:
    """Console script ``hybridrank-resume RUN_DIR [overrides...]``: finish an interrupted run.

    Reads the run's own config back from ``RUN_DIR/resume_config.yaml``, writes into the same
    folder and continues from ``RUN_DIR/checkpoints/last.ckpt`` (mid-epoch checkpoints included).
    A run that already finished (``RUN_DIR/metrics.json``) is left as it is.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print("usage: hybridrank-resume RUN_DIR [hydra overrides...]\n\nFinish an interrupted "
              "hybridrank-train run from RUN_DIR/checkpoints/last.ckpt, in the same folder.")
        if not args:
            raise SystemExit(2)
        return
    if args[0].startswith("-"):
        raise ValueError(f"the first argument must be the run folder, got {args[0]!r} "
                         "(usage: hybridrank-resume RUN_DIR [hydra overrides...])")
    run_dir = Path(args[0]).resolve()
    if not run_dir.is_dir():
        raise FileNotFoundError(f"no such run folder: {run_dir}")
    if not (run_dir / RESUME_CONFIG).is_file():
        raise ValueError(f"{run_dir} holds no {RESUME_CONFIG}: not a hybridrank-train output folder")
    done = finished_result(run_dir)
    if done is not None:
        print(f"{run_dir} already finished: nothing to resume (its metrics.json is unchanged; "
              f"best checkpoint {done.get('best_checkpoint')})")
        return
    sys.argv = [sys.argv[0], "--config-dir", str(run_dir), "--config-name", RESUME_CONFIG[:-5],
                f"hydra.run.dir={run_dir}", "resume=auto", *args[1:]]
    _hydra_main()


if __name__ == "__main__":  # `python -m hybridrank.cli.train ...` (e.g. under torchrun)
    train_main()
