"""Command-line entry points: ``train(cfg) -> dict`` and the ``hybridrank-train`` hydra app."""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import hydra
import pytorch_lightning as pl
import torch
from omegaconf import DictConfig, OmegaConf

from hybridrank.atomic import write_json, write_text
from hybridrank.cli._app import cli_errors, drop_adverts, hydra_job, quiet_third_party
from hybridrank.cli.callbacks import CSVHistoryLogger, EpochProgressBar, ValHistory
from hybridrank.models.ranker import HybridRanker, evaluate_chunks

__all__ = ["train", "train_main", "format_table", "build_model", "build_trainer", "reference_rows"]

log = logging.getLogger(__name__)

TABLE_COLUMNS = ("ndcg@10", "gauc", "logloss", "ece", "pcoc")

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
    logger = hydra.utils.instantiate(cfg.logger) if cfg.get("logger") else False
    extra = {}
    bar = cfg.trainer.get("enable_progress_bar", True)
    if bar == "auto":
        bar = extra["enable_progress_bar"] = sys.stderr.isatty()
    if bar and not any(isinstance(c, pl.callbacks.ProgressBar) for c in callbacks):
        callbacks.append(EpochProgressBar())  # epochs counted from 1, as everywhere else
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
    ``cfg.optimized_metric``, for sweeps), ``fit_seconds`` (``trainer.fit``) and the wall time.

    ``splits``: already loaded data (``Splits``) to train on instead of loading ``cfg.data``'s
    source (its batching keys still apply): what benchmarks that train several models on one
    data set pass. ``resume=auto`` on a finished run (``metrics.json`` present) returns its
    metrics without training (``already_finished: True``).
    """
    t0 = time.perf_counter()
    warn_deprecated_names(cfg)
    out_dir = Path(cfg.paths.output_dir)
    ckpt_path = resume_checkpoint(cfg, out_dir)
    if cfg.get("resume") and (done := finished_result(out_dir)) is not None:
        log.info("%s already finished (metrics.json): nothing to resume", out_dir)
        return done
    pl.seed_everything(int(cfg.seed), workers=True, verbose=False)
    datamodule = build_datamodule(cfg, splits)
    model = build_model(cfg, datamodule)  # loads the data: bad data fails before any output
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
    val_epoch, val = kept_val_metrics(trainer, best)
    result: dict[str, Any] = {
        "val": val,
        "val_epoch": val_epoch,
        "best_checkpoint": best,
        "output_dir": str(out_dir),
        "fit_seconds": fit_seconds,
    }
    if cfg.get("test_after_fit", True):
        tested = trainer.test(model, datamodule=datamodule, ckpt_path=best, verbose=False)
        result["test"] = {k: float(v) for k, v in tested[0].items()}
        result["reference"] = reference_rows(lambda: datamodule.eval_chunks("test", 1 << 20),
                                             model.new_metrics, model.field_columns)
        if trainer.is_global_zero and cfg.get("intervals", {}).get("n_boot", 0):
            # trainer.test restored the best weights into `model`
            result["intervals"] = test_intervals(model, datamodule, **cfg.intervals)
    name = cfg.get("optimized_metric")
    if name:
        stage = "test" if name.startswith("test/") else "val"
        if name not in result.get(stage, {}):
            raise ValueError(f"optimized_metric={name!r} was not computed; {stage} metrics are "
                             f"{sorted(result.get(stage, {}))}")
        result["optimized_metric"] = result[stage][name]
    result["seconds"] = time.perf_counter() - t0
    result["is_global_zero"] = trainer.is_global_zero
    if trainer.is_global_zero:
        write_json(out_dir / "metrics.json", result)
        write_text(out_dir / "config_resolved.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    return result


RESUME_CONFIG = "resume_config.yaml"


def warn_deprecated_names(cfg: DictConfig) -> list[str]:
    """Warn about deprecated config option names (``conf/loss/listmle.yaml`` and the other old
    names record themselves in ``deprecated_names``); returns the warnings."""
    names = cfg.get("deprecated_names") or {}
    out = [f"{old} is deprecated: use {new} (the same config under a name that says what it is)"
           for old, new in names.items()]
    for line in out:
        log.warning(line)
    return out


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


def _checkpoint_state(path: str | Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True)


def kept_val_metrics(trainer: pl.Trainer, best: str | None) -> tuple[int | None, dict[str, float]]:
    """``(epoch, val metrics)`` of the checkpoint the run keeps, epoch 1-based.

    The epoch is the one stored in the best checkpoint; its validation metrics come from
    :class:`~hybridrank.cli.callbacks.ValHistory` (kept across resumes). Without a best
    checkpoint (``callbacks=none``) the model kept is the last epoch's.
    """
    history = next((c.history for c in trainer.callbacks if isinstance(c, ValHistory)), {})
    epoch = int(_checkpoint_state(best)["epoch"]) if best else None
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
    state = _checkpoint_state(ckpt_path)
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


def reference_rows(chunks: Callable[[], Iterable], new_metrics: Callable[[], Any],
                   field_columns: Mapping[str, int] | None = None) -> dict[str, dict[str, float]]:
    """Metrics of reference predictors on a split: the true pCTR when known, the base rate.

    Args:
        chunks: returns an iterator over the split's ``ListData`` pieces (called twice: the
            base rate is the split's own click rate, a constant score, which with
            ``ties="average"`` is also the expected NDCG of a random order).
        new_metrics: a fresh :class:`~hybridrank.metrics.list_metrics.ListMetrics` with the run's conventions.
        field_columns: ``{field: column of ListData.cat}`` of its calibration fields.
    """
    clicks, n, has_truth = 0.0, 0, True
    for data in chunks():
        clicks += float((data.label > 0).sum())
        n += data.n_impressions
        has_truth &= data.true_p is not None
    rate = min(max(clicks / max(n, 1), 1e-7), 1 - 1e-7)
    rows = {}
    if has_truth:
        rows["oracle (true pCTR)"] = evaluate_chunks(
            ((d, torch.logit(d.true_p.double(), eps=1e-7)) for d in chunks()), new_metrics(),
            field_columns)
    rows["base rate"] = evaluate_chunks(
        ((d, torch.logit(torch.full((d.n_impressions,), rate, dtype=torch.float64))) for d in chunks()),
        new_metrics(), field_columns)
    return rows


def test_intervals(model: HybridRanker, datamodule, *, n_boot: int = 1000, alpha: float = 0.05,
                   seed: int = 0) -> dict[str, Any]:
    """Bootstrap intervals over test requests for the model and the reference rows
    (:func:`hybridrank.metrics.uncertainty.split_intervals`; paired against this model)."""
    from hybridrank.metrics.uncertainty import split_intervals

    datas = list(datamodule.eval_chunks("test", 1 << 20))
    data = datas[0] if len(datas) == 1 else _concat(datas)
    z = model.predict_split(data, at_logged_position=True)[0]
    rate = float((data.label > 0).double().mean().clamp(1e-7, 1 - 1e-7))
    rows = {"this model": z}
    if data.true_p is not None:
        rows["oracle (true pCTR)"] = torch.logit(data.true_p.double(), eps=1e-7)
    rows["base rate"] = torch.logit(torch.full_like(z, rate, dtype=torch.float64))
    fields = {n: data.cat[:, j] for n, j in model.field_columns.items()}
    return split_intervals(data, rows, metrics=TABLE_COLUMNS + tuple(f"f_ece@{n}" for n in fields),
                           n_boot=n_boot, alpha=alpha, seed=seed, fields=fields,
                           **model.metric_conventions)


def _concat(datas):
    """Chunks of whole requests of one split as one ``ListData`` (the fields intervals need)."""
    from hybridrank.lists import ListData, lengths_to_offsets

    true_p = None if any(d.true_p is None for d in datas) else torch.cat([d.true_p for d in datas])
    return ListData(num=torch.cat([d.num for d in datas]), cat=torch.cat([d.cat for d in datas]),
                    label=torch.cat([d.label for d in datas]),
                    offsets=lengths_to_offsets(torch.cat([d.lengths for d in datas])),
                    position=None if any(d.position is None for d in datas)
                    else torch.cat([d.position for d in datas]), true_p=true_p)


#: metrics that cannot be negative and are biased upwards on finite data (CONVENTIONS.md §2)
BOUNDED_AT_ZERO = ("ece", "f_ece@")
ONE_SIDED_MARK = "⁺"  # a one-sided interval [0, upper]
OUTSIDE_MARK = "†"    # the point lies outside its percentile interval


def interval_cell(metric: str, estimate: float | None, lower: float | None, upper: float | None,
                  note: str = "") -> tuple[str, str | None]:
    """One table cell ``estimate [lower, upper]`` and the footnote it needs (None if none).

    - no interval: ``0.1234 [no interval]`` and the reason (e.g. most resamples have no click);
    - a statistic bounded at 0 (ECE, F-ECE) whose point lies below its percentile interval (the
      resamples' values are biased upwards, the point can sit at the bound): the one-sided
      interval ``[0, upper]``, marked ``⁺``;
    - any other point outside its interval: marked ``†``.

    >>> interval_cell("ece", 0.0, 0.0009, 0.0531)
    ('0.0000 [0, 0.0531]⁺', '⁺')
    >>> interval_cell("ndcg@10", 0.5, 0.45, 0.55)
    ('0.5000 [0.4500, 0.5500]', None)
    """
    if estimate is None or math.isnan(estimate):
        return "n/a", None
    if lower is None or upper is None:
        return f"{estimate:.4f} [no interval]", note or "no interval"
    if estimate < lower and metric.startswith(BOUNDED_AT_ZERO):
        return f"{estimate:.4f} [0, {upper:.4f}]{ONE_SIDED_MARK}", ONE_SIDED_MARK
    if not lower <= estimate <= upper:
        return f"{estimate:.4f} [{lower:.4f}, {upper:.4f}]{OUTSIDE_MARK}", OUTSIDE_MARK
    return f"{estimate:.4f} [{lower:.4f}, {upper:.4f}]", None


def format_table(result: dict[str, Any], columns=TABLE_COLUMNS) -> str:
    """A small Markdown table: the model's test metrics and the reference rows.

    With ``result["intervals"]`` every cell is ``estimate [lower, upper]`` (bootstrap over test
    requests, :func:`interval_cell`), a line says how many requests and positives they rest on,
    and footnotes say why a cell has no interval or a one-sided one.
    """
    lines = ["| model | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    rows = [("this model", {k.removeprefix("test/"): v for k, v in result.get("test", {}).items()})]
    rows += list(result.get("reference", {}).items())
    iv = result.get("intervals") or {}
    missing: dict[str, list[str]] = {}  # reason -> cells
    marks: set[str] = set()
    for name, values in rows:
        cells = []
        for c in columns:
            ci = iv.get("rows", {}).get(name, {}).get(c)
            if c not in values or math.isnan(values[c]):
                cells.append("n/a")
            elif ci:
                note = iv.get("notes", {}).get(name, {}).get(c, "")
                text, foot = interval_cell(c, values[c], ci[1], ci[2], note)
                cells.append(text)
                if foot in (ONE_SIDED_MARK, OUTSIDE_MARK):
                    marks.add(foot)
                elif foot:
                    missing.setdefault(foot, []).append(f"{name} {c}")
            else:
                cells.append(f"{values[c]:.4f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if iv:
        lines.append(f"\n{100 * (1 - iv['alpha']):.0f} % bootstrap intervals over "
                     f"{iv['n_requests']:,} test requests ({iv['n_positives']:,} clicks / positive "
                     f"labels; {iv['n_boot']} resamples, seed {iv['seed']}).")
        if ONE_SIDED_MARK in marks:
            lines.append(f"{ONE_SIDED_MARK} ECE is >= 0 and biased upwards on finite data: where the "
                         "point lies below the percentile interval of its resamples, the cell shows "
                         "the one-sided interval [0, upper].")
        if OUTSIDE_MARK in marks:
            lines.append(f"{OUTSIDE_MARK} the point lies outside the percentile interval of its "
                         "resamples (a skewed statistic): read the interval as its spread only.")
        for reason, where in missing.items():
            lines.append(f"[no interval] {', '.join(where)}: {reason}.")
    return "\n".join(lines)


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
    epoch = f" (epoch {result['val_epoch']})" if result.get("val_epoch") else ""
    print(f"best checkpoint: {result['best_checkpoint']}{epoch}")
    print(f"wall time: {result['seconds']:.1f} s")
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
