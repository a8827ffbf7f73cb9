"""Command-line entry points: ``train(cfg) -> dict`` and the ``hybridrank-train`` hydra app."""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

import hydra
import pytorch_lightning as pl
import torch
from omegaconf import DictConfig, OmegaConf

from .module import HybridRanker, evaluate_logits

__all__ = ["train", "train_main", "format_table"]

log = logging.getLogger(__name__)

TABLE_COLUMNS = ("ndcg@10", "gauc", "logloss", "ece", "pcoc")

#: The project's ``conf/`` folder (the package is installed editable from the source tree; a
#: different folder can be given with hydra's ``--config-dir``).
CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")


def build(cfg: DictConfig):
    """Instantiate data, loss, scorer and module from a config (no training)."""
    splits = hydra.utils.instantiate(cfg.data.source).load()
    datamodule = hydra.utils.instantiate(cfg.sampler, splits=splits)
    loss = hydra.utils.instantiate(cfg.loss)
    base_rate = float((splits.train.label > 0).float().mean())
    scorer = hydra.utils.instantiate(cfg.model)(  # a partial: sizes come from the data
        n_numeric=splits.train.num.shape[1],
        vocab_sizes=list(splits.schema.vocab_sizes), n_outputs=loss.n_outputs, base_rate=base_rate,
    )
    module = HybridRanker(
        scorer, loss,
        optimizer=hydra.utils.instantiate(cfg.optimizer),
        scheduler=hydra.utils.instantiate(cfg.scheduler) if cfg.get("scheduler") else None,
        metrics=OmegaConf.to_container(cfg.metrics, resolve=True),
        schema=splits.schema.to_dict(),
        config=OmegaConf.to_container(cfg, resolve=True),
        neg_keep_rate=datamodule.neg_keep_rate,
        neg_weighted=True,  # the sampler weights kept negatives by 1 / keep-rate
    )
    return splits, datamodule, module


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train, evaluate on the test split, write ``metrics.json``; return the metrics.

    Returns a dict with ``val`` and ``test`` metrics (``test/ndcg@10``, ``test/logloss``, ...),
    reference rows (``oracle`` when the data carries the true click probability, ``base_rate``),
    the best checkpoint path and the wall time.
    """
    t0 = time.perf_counter()
    out_dir = Path(cfg.paths.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = resume_checkpoint(cfg, out_dir)
    if ckpt_path is None:
        # the config that `hybridrank-resume RUN_DIR` reads back (interpolations kept)
        OmegaConf.save(cfg, out_dir / RESUME_CONFIG, resolve=False)
    pl.seed_everything(int(cfg.seed), workers=True, verbose=False)
    splits, datamodule, module = build(cfg)
    callbacks = [hydra.utils.instantiate(c) for c in (cfg.get("callbacks") or {}).values()]
    logger = hydra.utils.instantiate(cfg.logger) if cfg.get("logger") else False
    trainer: pl.Trainer = hydra.utils.instantiate(cfg.trainer, callbacks=callbacks, logger=logger)
    if ckpt_path is not None:
        log.info("resuming from %s", ckpt_path)
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)

    ckpt = trainer.checkpoint_callback
    best = ckpt.best_model_path if ckpt is not None and ckpt.best_model_path else None
    result: dict[str, Any] = {
        "val": {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")},
        "best_checkpoint": best,
        "output_dir": str(out_dir),
    }
    if cfg.get("test_after_fit", True):
        tested = trainer.test(module, datamodule=datamodule, ckpt_path=best, verbose=False)
        result["test"] = {k: float(v) for k, v in tested[0].items()}
        result["reference"] = reference_rows(splits.test, OmegaConf.to_container(cfg.metrics))
    result["seconds"] = time.perf_counter() - t0
    result["is_global_zero"] = trainer.is_global_zero
    if trainer.is_global_zero:
        (out_dir / "metrics.json").write_text(json.dumps(result, indent=2))
        OmegaConf.save(cfg, out_dir / "config_resolved.yaml", resolve=True)
    return result


RESUME_CONFIG = "resume_config.yaml"


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


def reference_rows(test, metric_kwargs: dict) -> dict[str, dict[str, float]]:
    """Metrics of reference predictors on the test split: the true pCTR when known, the base rate."""
    rows = {}
    if test.true_p is not None:
        p = test.true_p.double().clamp(1e-7, 1 - 1e-7)
        rows["oracle (true pCTR)"] = evaluate_logits(test, torch.log(p / (1 - p)), **metric_kwargs)
    rate = float((test.label > 0).float().mean().clamp(1e-7, 1 - 1e-7))
    const = torch.full((test.n_impressions,), math.log(rate / (1 - rate)))
    rows["base rate"] = evaluate_logits(test, const, **metric_kwargs)
    return rows


def format_table(result: dict[str, Any], columns=TABLE_COLUMNS) -> str:
    """A small Markdown table: the model's test metrics and the reference rows."""
    lines = ["| model | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    rows = [("this model", {k.removeprefix("test/"): v for k, v in result.get("test", {}).items()})]
    rows += list(result.get("reference", {}).items())
    for name, values in rows:
        cells = [f"{values[c]:.4f}" if c in values and not math.isnan(values[c]) else "n/a"
                 for c in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def _hydra_main(cfg: DictConfig) -> float | None:
    torch.set_float32_matmul_precision("high")
    result = train(cfg)
    if not result.get("is_global_zero", True):  # under DDP only rank 0 reports
        return result.get("test", {}).get("test/logloss")
    print()
    print(format_table(result))
    print(f"\noutputs: {result['output_dir']} (metrics.json, config_resolved.yaml, checkpoints/, logs/)")
    print(f"best checkpoint: {result['best_checkpoint']}")
    print(f"wall time: {result['seconds']:.1f} s")
    # multirun sweepers minimise/maximise this value
    return result.get("test", {}).get("test/logloss")


def train_main() -> None:
    """Console script ``hybridrank-train``."""
    _hydra_main()


def resume_main(argv: list[str] | None = None) -> None:
    """Console script ``hybridrank-resume RUN_DIR [overrides...]``: finish an interrupted run.

    Reads the run's own config back from ``RUN_DIR/resume_config.yaml``, writes into the same
    folder and continues from ``RUN_DIR/checkpoints/last.ckpt`` (mid-epoch checkpoints included).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0].startswith("-"):
        raise SystemExit("usage: hybridrank-resume RUN_DIR [hydra overrides...]")
    run_dir = Path(args[0]).resolve()
    if not (run_dir / RESUME_CONFIG).is_file():
        raise SystemExit(f"{run_dir} holds no {RESUME_CONFIG}: not a hybridrank-train output folder")
    sys.argv = [sys.argv[0], "--config-dir", str(run_dir), "--config-name", RESUME_CONFIG[:-5],
                f"hydra.run.dir={run_dir}", "resume=auto", *args[1:]]
    _hydra_main()


if __name__ == "__main__":  # `python -m hybridrank.cli ...` (e.g. under torchrun)
    train_main()
