"""``hybridrank-export`` and ``hybridrank-eval``: score exports and calibration reports.

Importable ``export(cfg) -> dict`` and ``evaluate(cfg) -> dict`` (tests call them in-process) and
two thin ``@hydra.main`` wrappers (``conf/export.yaml``, ``conf/eval.yaml``). The work is done by
the pieces they share with training:

- the model: ``HybridRanker.load_from_checkpoint`` (it carries its data schema, value policies
  included) and its one scoring path :meth:`~hybridrank.models.ranker.HybridRanker.predict_split`;
- the data: the checkpoint's training data config (or ``data=<option>``) read **with the
  checkpoint's schema**, split by split in chunks of whole requests; or ``input=<files>`` read by
  :class:`~hybridrank.data.scanner.ClickLogScanner` and :meth:`~hybridrank.data.schema.Schema.read` (cast,
  validate under the training-time policies, encode);
- the negative-downsampling correction (``correction: auto|always|never``), the level trend
  (``level_trend``: a one-way drift of the click level, tested on the training and validation
  rows and followed to each scored row's time, :mod:`hybridrank.serving.level_trend`) and the
  calibrator, fitted on the validation split of the training data;
- :func:`~hybridrank.serving.export.score_frame` and :class:`~hybridrank.serving.export.ScoreWriter`.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import hydra
import polars as pl
import torch
from omegaconf import DictConfig, OmegaConf

from hybridrank.atomic import check_writable
from hybridrank.cli._app import cli_errors, hydra_job, quiet_third_party
from hybridrank.cli.train import CONF_DIR
from hybridrank.data.fingerprint import check_fingerprint
from hybridrank.data.source import Source
from hybridrank.evaluation.figures import calibration_report, score_split
from hybridrank.evaluation.tables import format_calibration_report, level_sentence, summary_row
from hybridrank.lists import ListData
from hybridrank.metrics.report import calibration_summary, write_report
from hybridrank.models.ranker import HybridRanker
from hybridrank.serving.calibration import (
    AutoCalibrator,
    Calibrator,
    IdentityCalibrator,
    correction_shift,
    resolve_correction,
)
from hybridrank.serving.checkpoint import load_model, resolve_checkpoint
from hybridrank.serving.export import (
    ScoreWriter,
    build_metadata,
    export_onnx,
    export_torchscript,
    score_frame,
    sha256_file,
)
from hybridrank.serving.level_trend import LevelTrend, model_level_trend

__all__ = ["export", "evaluate", "export_main", "eval_main", "prepare", "input_chunks"]

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
_OPTIONAL_ROLES = ("session", "user", "time", "position", "item", "bid", "true_p", "explore",
                   "propensity")


# ----------------------------------------------------------------------------------------------
# Shared preparation
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Prepared:
    """Everything an export or an evaluation needs, built once from the config."""

    model: HybridRanker
    checkpoint_path: str
    checkpoint_sha256: str
    calibrator: Calibrator
    shift: float
    correction: dict
    calibration_fit: dict | None
    data_cfg: dict | None
    level_trend: LevelTrend = dataclasses.field(default_factory=LevelTrend)
    _source: Any = None
    training_data: bool = True  # data_cfg is the checkpoint's own (not data=<option>)

    @property
    def config(self) -> dict:
        return dict(self.model.hparams.get("config") or {})

    def source(self) -> Source:
        """The data source of ``data_cfg`` built with the model's schema (built once). The
        checkpoint's own training data must still be what it was trained on (its fingerprint)."""
        if self._source is None:
            if not self.data_cfg:
                raise ValueError("the checkpoint's config holds no data node; pass data=<option>")
            node = self.data_cfg.get("source", self.data_cfg)
            # a partial, then the schema: objects never go through OmegaConf
            src = hydra.utils.instantiate(node, _partial_=True)(schema=self.model.schema)
            if not isinstance(src, Source):
                raise ValueError(f"the data config's source must build a hybridrank Source, "
                                 f"got {type(src).__name__}")
            if self.training_data and not check_fingerprint(
                    self.model.data_info.get("fingerprint"), src.fingerprint(),
                    where=f"the training data of {self.checkpoint_path}"):
                log.warning("%s records no fingerprint of files it was trained on (written before "
                            "fingerprints, or trained on splits given in memory): the training "
                            "data is re-read unchecked", self.checkpoint_path)
            self._source = src
        return self._source

    def chunks(self, split: str, chunk_rows: int) -> Iterator[ListData]:
        """The requests of a split of the data, in chunks of at most ``chunk_rows`` impressions
        of whole requests."""
        yield from self.source().chunks(split, max_rows=chunk_rows)

    def row_shift(self, data: ListData) -> torch.Tensor:
        """The logit shift of every impression of ``data``: the downsampling correction plus the
        level trend at its request's time (at the end of the training log when it has none)."""
        time = None if data.time is None else data.time[data.request_of_row()]
        return self.shift_at(time, data.n_impressions)

    def shift_at(self, time: torch.Tensor | None, n: int) -> torch.Tensor:
        """The logit shift of ``n`` impressions whose requests were at ``time`` (``[n]`` seconds;
        None: at the end of the training log): the correction plus the level trend."""
        return self.shift + self.level_trend.shift(time, n=n)


def _container(node) -> Any:
    if isinstance(node, DictConfig):
        return OmegaConf.to_container(node, resolve=True)
    return node


def prepare(cfg: DictConfig) -> Prepared:
    """Load the checkpoint, decide the correction, fit the calibrator on ``calibration_split``."""
    path = resolve_checkpoint(cfg.checkpoint)  # a run folder: its best checkpoint
    model = load_model(path)
    info = model.data_info
    own = not _container(cfg.get("data"))
    data_cfg = _container(cfg.get("data")) or (model.hparams.get("config") or {}).get("data")
    w = float(info.get("neg_keep_rate", 1.0))
    reweighted = bool(info.get("reweight_negatives", True))
    mode = str(cfg.get("correction", "auto"))
    applied = resolve_correction(mode, w, reweighted)
    shift = correction_shift(w) if applied else 0.0
    correction = {"mode": mode, "neg_keep_rate": w, "reweight_negatives": reweighted,
                  "applied": applied, "logit_shift": shift}
    log.info("negative keep rate %.4g, negatives re-weighted %s, correction %s -> %s", w,
             reweighted, mode, "applied" if applied else "not applied")
    cal_node = cfg.get("calibrator")
    calibrator = hydra.utils.instantiate(cal_node) if cal_node else IdentityCalibrator()
    if not isinstance(calibrator, Calibrator):
        raise ValueError(f"calibrator config must build a hybridrank Calibrator: {calibrator!r}")
    prep = Prepared(model, str(path.resolve()), sha256_file(path), calibrator, shift, correction,
                    None, data_cfg, training_data=own)
    chunk_rows = int(cfg.get("chunk_rows", 200_000))
    prep.level_trend = fit_trend(prep, cfg.get("level_trend"), chunk_rows)
    log.info(prep.level_trend.describe())
    if not isinstance(calibrator, IdentityCalibrator):
        split = str(cfg.get("calibration_split", "val"))
        if split not in SPLITS:
            raise ValueError(f"calibration_split must be one of {SPLITS}, got {split!r}")
        z, y, groups, order, serving = _logits_labels(prep, split, chunk_rows)
        # the calibrator maps the logits the export will score: after the correction and the trend
        # (the resemblance check compares the model's own serving scores, before the trend, on
        # both sides)
        moved = shift + prep.level_trend.shift(order, n=z.numel())
        z, serving = z + moved, serving + shift
        if isinstance(calibrator, AutoCalibrator):
            reference, n_ref = scored_sample(prep, cfg, chunk_rows)
            calibrator.fit(z, y, groups=groups, order=order, serving=serving,
                           reference=None if reference is None else reference + shift,
                           reference_requests=n_ref, moved=moved - shift)
            log.info(calibrator.describe())
        else:
            calibrator.fit(z, y)
        bins = int(cfg.get("bins", 15))
        before = calibration_summary(torch.sigmoid(z), y, bins=bins)
        after = calibration_summary(calibrator.predict_proba(z), y, bins=bins)
        keys = ("n", "positives", "logloss", "ece", "pcoc")
        prep.calibration_fit = {"split": split, "before": {k: before[k] for k in keys},
                                "after": {k: after[k] for k in keys}}
        if isinstance(calibrator, AutoCalibrator):
            prep.calibration_fit["decision"] = calibrator.decision
        log.info("calibrator %s fitted on %s: ECE %.5f -> %.5f, log loss %.5f -> %.5f",
                 calibrator.name, split, before["ece"], after["ece"], before["logloss"],
                 after["logloss"])
    return prep


#: ``level_trend`` settings when the config has none (conf/export.yaml's)
LEVEL_TREND_DEFAULTS = {"mode": "auto", "block_seconds": 86_400.0, "alpha": 0.01, "fit_alpha": 0.05,
                        "min_blocks": 4, "max_horizon": 0.25}


def fit_trend(prep: Prepared, node: Any, chunk_rows: int) -> LevelTrend:
    """The level trend of ``level_trend: {mode: auto | off, ...}``: tested on the training and
    validation rows (the model's click logits where the clicks were drawn, after the downsampling
    correction) by :func:`~hybridrank.serving.level_trend.model_level_trend`."""
    opts = {**LEVEL_TREND_DEFAULTS, **(_container(node) or {})}
    unknown = sorted(set(opts) - set(LEVEL_TREND_DEFAULTS))
    if unknown:
        raise ValueError(f"level_trend: unknown keys {unknown}; known: {sorted(LEVEL_TREND_DEFAULTS)}")
    mode = opts.pop("mode")
    if mode is False or mode == "off":
        return LevelTrend(verdict="off (level_trend.mode=off)", max_horizon=float(opts["max_horizon"]))
    if mode != "auto":
        raise ValueError(f"level_trend.mode must be 'auto' or 'off', got {mode!r}")
    chunks = itertools.chain(prep.chunks("train", chunk_rows), prep.chunks("val", chunk_rows))
    return model_level_trend(prep.model, chunks, prep.shift, **opts)


def _logits_labels(prep: Prepared, split: str, chunk_rows: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Click logits (float64), labels, request index, request time (or None) and serving logits
    of every impression of a split.

    Scored where the labels were drawn: at the logged positions for a model with a position-bias
    tower (a calibrator fitted on serving scores against labels from all positions would fold
    the average position effect back into the pCTR); the serving logits (the reference slot) are
    what the resemblance check compares with the scored data.
    """
    zs, ys, gs, ts, ss = [], [], [], [], []
    n_requests = 0
    for data in prep.chunks(split, chunk_rows):
        z = prep.model.predict_split(data, at_logged_position=True)[0].double()
        zs.append(z)
        ss.append(prep.model.predict_split(data)[0].double() if prep.model.position_bias is not None else z)
        ys.append(data.label)
        rows = data.request_of_row()
        gs.append(rows + n_requests)
        ts.append(None if data.time is None else data.time[rows])
        n_requests += data.n_requests
    order = None if any(t is None for t in ts) else torch.cat(ts)
    return torch.cat(zs), torch.cat(ys), torch.cat(gs), order, torch.cat(ss)


#: impressions of the scored data whose serving scores the resemblance check of ``auto`` reads
SCORED_SAMPLE_ROWS = 1_000_000


def scored_sample(prep: Prepared, cfg: DictConfig, chunk_rows: int) -> tuple[torch.Tensor | None, int]:
    """Serving logits of the data the export will score (its first ``SCORED_SAMPLE_ROWS``
    impressions, whole requests) and their number of requests, for ``auto``'s check that the
    calibration split resembles it. ``(None, 0)`` when there is nothing to read."""
    pattern = cfg.get("input")
    if pattern is not None:
        chunks, _ = input_chunks(prep.model, str(pattern), chunk_rows, _container(cfg.get("columns")))
    else:
        split = str(cfg.get("split", "test"))
        names = list(SPLITS) if split == "all" else [split]
        chunks = itertools.chain.from_iterable(prep.chunks(n, chunk_rows) for n in names)
    zs, n_rows, n_req = [], 0, 0
    for data in chunks:
        zs.append(prep.model.predict_split(data)[0].double())
        n_rows += data.n_impressions
        n_req += data.n_requests
        if n_rows >= SCORED_SAMPLE_ROWS:
            break
    return (torch.cat(zs), n_req) if zs else (None, 0)


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
# New click-log files
# ----------------------------------------------------------------------------------------------
def input_chunks(model: HybridRanker, pattern: str, chunk_rows: int,
                 overrides: Mapping | None = None) -> tuple[Iterator[ListData], dict[str, Any]]:
    """New click-log files as ``ListData`` chunks of whole requests, read as the model was trained.

    The checkpoint's column map (with ``overrides``, e.g. ``{bid: bid_usd}``) says which column
    plays which role; feature and request columns are required (a missing one is named with its
    role); optional roles absent from the files are dropped (no label column: an unlabeled
    export; no bid column: no ``ecpm``). Values are cast and checked under the model's value
    policies (:meth:`~hybridrank.data.schema.Schema.read`: a model trained with ``nan_policy: fill`` fills
    NaN features the same way). Requests need not be stored contiguously.

    Returns:
        ``(chunks, info)`` with ``info = {"has_label": bool, "columns": dict, "files": int}``.
    """
    from hybridrank.data.readers import SOURCE_FILE, ColumnMap, expand_files, scan_clicklog
    from hybridrank.data.scanner import ClickLogScanner

    schema = model.schema
    cm = dict(schema.columns.to_dict())
    unknown = sorted(set(overrides or {}) - set(cm))
    if unknown:
        raise ValueError(f"unknown column-map keys {unknown}; valid: {sorted(cm)}")
    cm.update(dict(overrides or {}))
    cm = ColumnMap.from_dict(cm)
    # the position feature is read through the position role (log(position)): not renamed apart
    moved = schema.columns.position in schema.numeric and cm.position != schema.columns.position
    if (list(cm.numeric) != list(schema.numeric) or list(cm.categorical) != list(schema.categorical)
            or cm.position_transform != schema.columns.position_transform or moved):
        raise ValueError("columns overrides cannot change the model's features (numeric / "
                         "categorical / position_transform, or the position column when it is a "
                         "feature); map renamed columns in the file instead")
    roles = {c: "request id" for c in cm.request_columns}
    roles.update({c: "numeric feature" for c in cm.numeric})
    derived = cm.derived_columns()
    roles.update({c: "categorical feature" for c in cm.categorical if c not in derived})
    if cm.request_time_bucket is not None:
        roles[cm.time] = "time (request_time_bucket)"
    elif derived:
        roles[cm.time] = f"time (time_features {cm.time_features})"
    files = expand_files(pattern)
    have = set(scan_clicklog(files, cm, pattern=pattern, require=[]).collect_schema().names())
    missing = [f"{c!r} ({r})" for c, r in roles.items() if c not in have]
    if missing:
        raise ValueError(f"{pattern}: the model needs column(s) {', '.join(missing)} which the "
                         f"file does not have; it has {sorted(have - {SOURCE_FILE})}")
    drop = {}
    for role in _OPTIONAL_ROLES:
        col = getattr(cm, role)
        if col is not None and col not in have and col not in roles:
            drop[role] = None
            log.warning("%s: no %r column (%s): exported without it", pattern, col, role)
    has_label = cm.label in have
    cm = dataclasses.replace(cm, **drop)
    scanner = ClickLogScanner(files, cm, chunk_rows=chunk_rows, scattered="allow",
                              require=list(roles))
    scanner.pattern = str(pattern)
    read_schema = dataclasses.replace(schema, columns=cm)

    def chunks() -> Iterator[ListData]:
        for frame in scanner.frames():
            if not has_label:
                frame = frame.with_columns(pl.lit(0.0).alias(cm.label))
            yield read_schema.read(frame, name=pattern)

    return chunks(), {"has_label": has_label, "columns": cm.to_dict(), "files": len(scanner.files)}


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
        chunks, info = input_chunks(model, str(pattern), chunk_rows, _container(cfg.get("columns")))
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
