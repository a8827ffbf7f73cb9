"""``hybridrank-export`` and ``hybridrank-eval``: argument handling and printing.

Importable ``export(cfg) -> dict`` and ``evaluate(cfg) -> dict`` (tests call them in-process) and
two thin ``@hydra.main`` wrappers (``conf/export.yaml``, ``conf/eval.yaml``). The work is done
elsewhere:

- :func:`hybridrank.serving.prepare.prepare`: the checkpoint (the model carries its data schema,
  value policies included), the negative-downsampling correction, the level trend and the
  calibrator fitted on the calibration split; the training data re-read with the checkpoint's
  schema, split by split in chunks of whole requests;
- :func:`hybridrank.serving.inputs.input_chunks`: ``input=<files>`` read as the model was trained;
- :func:`~hybridrank.serving.export.score_frame` and :class:`~hybridrank.serving.export.ScoreWriter`
  for the scores; :mod:`hybridrank.evaluation.figures` for the report's figures.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import hydra
import polars as pl
from omegaconf import DictConfig, OmegaConf

from hybridrank.atomic import check_writable
from hybridrank.cli._app import cli_errors, hydra_job, quiet_third_party
from hybridrank.cli.train import CONF_DIR
from hybridrank.evaluation.figures import calibration_report, score_split
from hybridrank.evaluation.tables import format_calibration_report, level_sentence, summary_row
from hybridrank.metrics.report import write_report
from hybridrank.models.ranker import HybridRanker
from hybridrank.serving.export import ScoreWriter, build_metadata, export_onnx, export_torchscript, score_frame
from hybridrank.serving.inputs import input_chunks
from hybridrank.serving.prepare import SPLITS, container, prepare

__all__ = ["export", "evaluate", "export_main", "eval_main"]

log = logging.getLogger(__name__)


def position_bias_info(model: HybridRanker) -> dict | None:
    """The export metadata of a position-bias tower: the reference position, per-slot offsets with
    their intervals and the data behind them (:meth:`PositionBias.report`)."""
    tower = model.position_bias
    if tower is None:
        return None
    report = tower.report()
    note = ("pctr is the click probability at reference_position; at slot j an auction's expected "
            "CTR is sigmoid(logit(pctr) + logit_offsets[j - 1]) (positions above max_position share "
            "its offset)")
    if report.get("serving_level"):
        note += "; " + level_sentence(report["serving_level"])
    ident = report.get("identifiability") or {}
    if ident.get("identified") is False:
        note += ("; WARNING: the position effect is NOT identified by the training log, so this "
                 "position-free pctr rests on an assumption: " + ident["verdict"])
        log.warning("position effect %s", ident["verdict"])
    elif ident.get("precise") is False:
        note += "; the offsets are imprecise: " + ident["verdict"]
        log.warning("position effect %s", ident["verdict"])
    return {**report, "note": note}



# ----------------------------------------------------------------------------------------------
# export
# ----------------------------------------------------------------------------------------------
def export(cfg: DictConfig) -> dict[str, Any]:
    """Score impressions and write the auction export (see ``docs/EXPORT.md``).

    Returns a dict with ``output``, ``n_rows``, ``metadata`` (decoded), ``calibration_fit`` (ECE /
    log loss / PCOC before and after the calibrator on the validation split), ``correction`` and
    ``portable`` (paths of the TorchScript / ONNX files when ``portable: true``).
    """
    output = check_writable(cfg.output)  # fail before any work
    chunk_rows = int(cfg.get("chunk_rows", 200_000))
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    split = str(cfg.get("split", "test"))
    pattern = cfg.get("input")
    if pattern is None and split not in (*SPLITS, "all"):
        raise ValueError(f"split must be one of {(*SPLITS, 'all')} (or set input=<file>), "
                         f"got {split!r}")
    prep = prepare(cfg)
    model = prep.model

    if pattern is not None:
        chunks, info = input_chunks(model, str(pattern), chunk_rows, container(cfg.get("columns")))
        first = next(chunks)  # surfaces value / request-id errors before the output is opened
        scored = {"input": str(pattern), "files": info["files"]}
        columns = info["columns"]

        def frames():
            for data in itertools.chain([first], chunks):
                yield score_frame(model, data, prep.calibrator, shift=prep.row_shift(data),
                                  labels=info["has_label"])
    else:
        prep.source()  # before any output: the training data must match the checkpoint's fingerprint
        names = list(SPLITS) if split == "all" else [split]
        node = (prep.data_cfg or {}).get("source", {})
        scored = {"split": split, "data": node.get("_target_")}
        columns = model.schema.columns.to_dict()

        def frames():
            for name in names:
                for data in prep.chunks(name, chunk_rows):
                    f = score_frame(model, data, prep.calibrator, shift=prep.row_shift(data))
                    yield f.with_columns(pl.lit(name).alias("split")) if split == "all" else f

    meta = build_metadata(
        checkpoint_path=prep.checkpoint_path, checkpoint_sha256=prep.checkpoint_sha256,
        config=prep.config, calibrator=prep.calibrator,
        neg_keep_rate=prep.correction["neg_keep_rate"],
        correction_applied=prep.correction["applied"], correction=prep.correction, scored=scored,
        level_trend=prep.level_trend.to_dict(),
        calibration_fit=prep.calibration_fit, columns=columns, export_config=_export_cfg(cfg),
        **({"position_bias": position_bias_info(model)} if model.position_bias is not None else {}),
    )
    with ScoreWriter(output, meta, fmt=cfg.get("format")) as writer:
        for f in frames():
            writer.write(f)
    log.info("wrote %d rows to %s", writer.n_rows, output)
    result: dict[str, Any] = {"output": str(output), "n_rows": writer.n_rows,
                              "metadata": dict(writer.metadata), "correction": prep.correction,
                              "calibration_fit": prep.calibration_fit, "portable": {}}
    if cfg.get("portable", False):
        # a portable model sees no time: the level trend at the end of the training log
        portable_shift = prep.shift + float(prep.level_trend.shift(None))
        base = output.with_suffix("")
        result["portable"] = {
            "torchscript": str(export_torchscript(model, prep.calibrator, base.with_suffix(".pt"),
                                                  shift=portable_shift)),
            "onnx": str(export_onnx(model, prep.calibrator, base.with_suffix(".onnx"),
                                    shift=portable_shift)),
        }
    return result


def _export_cfg(cfg: DictConfig) -> dict:
    d = OmegaConf.to_container(cfg, resolve=False)
    d.pop("hydra", None)
    return d


# ----------------------------------------------------------------------------------------------
# evaluate
# ----------------------------------------------------------------------------------------------
def evaluate(cfg: DictConfig) -> dict[str, Any]:
    """Calibration report of a checkpoint on a split, before and after the calibrator.

    Writes ``calibration.json``, ``reliability.png``, ``pcoc_by_position.png`` and one
    ``field_calibration_{field}.png`` per calibration field (``cfg.fields``, default the model's
    ``metrics.fields``) to ``cfg.output_dir`` and returns the numbers: ``summaries`` (``before``: the model's pCTR after
    the downsampling correction; ``after``: calibrated; ``oracle``: the true pCTR on simulated
    data), ``ranking`` (NDCG / GAUC ... of both) and the calibrator's parameters. Every figure of a
    row, and its bootstrap interval (``n_boot``), derives from one set of per-request statistics of
    that row (:func:`hybridrank.evaluation.figures.calibration_report`).
    """
    split = str(cfg.get("split", "test"))
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    out_dir = Path(cfg.output_dir)
    check_writable(out_dir / "calibration.json")
    prep = prepare(cfg)
    columns, field_labels = _report_fields(prep.model, cfg.get("fields"))
    # scored where the labels were drawn (logged positions, for a tower)
    scored = score_split(prep.model, prep.chunks(split, int(cfg.get("chunk_rows", 200_000))),
                         fields=columns)
    moved = prep.shift_at(scored.time, scored.n_impressions) - prep.shift  # the level trend
    report = calibration_report(
        scored, prep.calibrator, shift=prep.shift, moved=moved,
        conventions={**prep.model.metric_conventions, "bins": int(cfg.get("bins", 15))},
        field_labels=field_labels, n_boot=int(cfg.get("n_boot", 1000)), seed=int(cfg.get("seed", 0)))
    extra = {"checkpoint": prep.checkpoint_path, "checkpoint_sha256": prep.checkpoint_sha256,
             "split": split, "calibrator": prep.calibrator.to_dict(),
             "correction": prep.correction, "level_trend": prep.level_trend.to_dict(),
             "calibration_fit": prep.calibration_fit, "ranking": report["ranking"]}
    if "intervals" in report:
        extra["intervals"] = report["intervals"]
    summaries = report["summaries"]
    files = write_report(out_dir, summaries, extra=extra, figures=bool(cfg.get("figures", True)))
    return {**extra, "summaries": summaries, "files": files}


def _report_fields(model: HybridRanker, names) -> tuple[dict[str, int], dict[str, Any] | None]:
    """``({field: column of ListData.cat}, {field: code -> name})`` of the report's calibration
    fields: ``names`` (None: the model's ``metrics.fields``), categorical features of the model's
    schema; ``({}, None)`` when there are none."""
    resolved = model.metric_fields if names is None else model._resolve_fields(list(names))
    if not resolved:
        return {}, None
    schema = model.schema

    def namer(column: str):
        if schema.vocab_policy[column].hashed:
            return lambda code: "missing" if code == 0 else f"hash bucket {code}"
        vocab = schema.vocab[column]
        return lambda code: "out of vocabulary / missing" if code == 0 else vocab[code - 1]

    return {n: j for n, (j, _) in resolved.items()}, {n: namer(n) for n in resolved}


def correction_line(c: Mapping[str, Any]) -> str:
    """The negative-downsampling correction in words."""
    how = "applied" if c.get("applied") else "not applied"
    return (f"negative-downsampling correction ({c.get('mode')}): {how}; keep rate "
            f"{c.get('neg_keep_rate'):.4g}, negatives re-weighted in training: "
            f"{'yes' if c.get('reweight_negatives') else 'no'}")


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="export")
@hydra_job
def _export_hydra(cfg: DictConfig) -> None:
    with quiet_third_party():
        result = export(cfg)  # logs "wrote N rows to PATH"
    fit = result["calibration_fit"]
    if fit:
        print(f"calibrator fitted on the {fit['split']} split:")
        print("| | logloss | ECE | PCOC |\n|---|---|---|---|")
        print(summary_row("before", fit["before"]))
        print(summary_row("after", fit["after"]))
    print(correction_line(result["correction"]))
    for kind, path in result["portable"].items():
        print(f"{kind}: {path}")


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="eval")
@hydra_job
def _eval_hydra(cfg: DictConfig) -> None:
    with quiet_third_party():
        result = evaluate(cfg)
    print(format_calibration_report(result))
    for kind, path in result["files"].items():
        print(f"{kind}: {path}")


@cli_errors("hybridrank-export")
def export_main() -> None:
    """Console script ``hybridrank-export``."""
    _export_hydra()


@cli_errors("hybridrank-eval")
def eval_main() -> None:
    """Console script ``hybridrank-eval``."""
    _eval_hydra()
