"""``hybridrank-export`` and ``hybridrank-eval``: score exports and calibration reports.

Importable ``export(cfg) -> dict`` and ``evaluate(cfg) -> dict`` (tests call them in-process) and
two thin ``@hydra.main`` wrappers (``conf/export.yaml``, ``conf/eval.yaml``).

Both rebuild the model from a checkpoint (:func:`hybridrank.export.load_ranker`), decide the
negative-downsampling correction (``correction: auto|always|never``), fit the calibrator on the
validation split of the training data, and report log loss / ECE / PCOC before and after it.
The data are the training data config stored in the checkpoint unless a ``data`` node is given;
``input`` scores a new click-log file (or glob) with the checkpoint's schema, streamed in chunks
of whole requests.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import polars as pl
import torch
from omegaconf import DictConfig, OmegaConf

from .calibration import Calibrator, IdentityCalibrator, correction_shift, resolve_correction
from .export import (
    ScoreWriter,
    build_metadata,
    check_bids,
    check_schema,
    check_writable,
    click_logits,
    export_onnx,
    export_torchscript,
    load_ranker,
    request_chunks,
    score_data,
    slice_requests,
)
from .module import evaluate_logits
from .report import calibration_summary, write_report

__all__ = ["export", "evaluate", "export_main", "eval_main", "prepare", "iter_clicklog_chunks"]

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
#: The project's ``conf/`` folder (the same one ``hybridrank-train`` reads).
CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")


# ----------------------------------------------------------------------------------------------
# Shared preparation
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Prepared:
    """Everything an export or an evaluation needs, built once from the config."""

    module: Any
    config: dict
    schema: dict
    calibrator: Calibrator
    shift: float
    neg_keep_rate: float
    correction: dict
    calibration_fit: dict | None
    _splits: Any = None
    _data_cfg: Any = None

    def splits(self):
        """The data source's splits (loaded once; schema checked against the checkpoint)."""
        if self._splits is None:
            source = self._data_cfg["source"]
            splits = hydra.utils.instantiate(source).load()
            check_schema(self.schema, splits.schema.to_dict(),
                         where=f"the data of source {source.get('_target_', '?')}")
            self._splits = splits
        return self._splits


def _container(node) -> Any:
    if node is None:
        return None
    if isinstance(node, DictConfig):
        return OmegaConf.to_container(node, resolve=True)
    return node


def prepare(cfg: DictConfig) -> Prepared:
    """Load the checkpoint, decide the correction, fit the calibrator on ``calibration_split``."""
    module, config, schema = load_ranker(cfg.checkpoint)
    data_cfg = _container(cfg.get("data")) or config.get("data")
    if cfg.get("data") is None and not data_cfg:
        raise ValueError("the checkpoint's config holds no data node; pass data=<option>")
    w = float(module.hparams.get("neg_keep_rate", 1.0))
    mode = str(cfg.get("correction", "auto"))
    applied = resolve_correction(mode, w, module.loss_reweighted)
    shift = correction_shift(w) if applied else 0.0
    correction = {"mode": mode, "neg_keep_rate": w, "loss_reweighted": module.loss_reweighted,
                  "applied": applied, "logit_shift": shift}
    log.info("negative keep rate %.4g, loss re-weighted %s, correction %s -> %s", w,
             module.loss_reweighted, mode, "applied" if applied else "not applied")
    cal_node = cfg.get("calibrator")
    calibrator = hydra.utils.instantiate(cal_node) if cal_node else IdentityCalibrator()
    if not isinstance(calibrator, Calibrator):
        raise ValueError(f"calibrator config must build a hybridrank Calibrator: {calibrator!r}")
    prep = Prepared(module, config, schema, calibrator, shift, w, correction, None,
                    _data_cfg=data_cfg)
    if not isinstance(calibrator, IdentityCalibrator):
        split = str(cfg.get("calibration_split", "val"))
        if split not in SPLITS:
            raise ValueError(f"calibration_split must be one of {SPLITS}, got {split!r}")
        data = getattr(prep.splits(), split)
        z = click_logits(module.scorer, data).double() + shift
        calibrator.fit(z, data.label)
        before = calibration_summary(torch.sigmoid(z), data.label, bins=_bins(cfg))
        after = calibration_summary(calibrator.predict_proba(z), data.label, bins=_bins(cfg))
        keys = ("n", "positives", "logloss", "ece", "pcoc")
        prep.calibration_fit = {"split": split, "before": {k: before[k] for k in keys},
                                "after": {k: after[k] for k in keys}}
        log.info("calibrator %s fitted on %s: ECE %.5f -> %.5f, log loss %.5f -> %.5f",
                 calibrator.name, split, before["ece"], after["ece"], before["logloss"],
                 after["logloss"])
    return prep


def _bins(cfg) -> int:
    return int(cfg.get("bins", 15))


# ----------------------------------------------------------------------------------------------
# Click-log files, streamed in chunks of whole requests
# ----------------------------------------------------------------------------------------------
_OPTIONAL_ROLES = ("session", "user", "time", "position", "item", "bid", "true_p")


def _files(pattern: str) -> list[str]:
    from .readers import expand_files

    return expand_files(pattern)


def _scan(files: list[str], columns) -> pl.LazyFrame:
    from .readers import SOURCE_FILE

    kinds = {"parquet" if f.lower().endswith((".parquet", ".pq")) else
             "csv" if f.lower().endswith((".csv", ".csv.gz")) else "?" for f in files}
    if len(kinds) != 1 or "?" in kinds:
        raise ValueError(f"input files must be all .parquet or all .csv: {files[:3]}...")
    if kinds == {"parquet"}:
        return pl.scan_parquet(files, include_file_paths=SOURCE_FILE)
    text = [*columns.numeric, columns.label, columns.position, columns.bid, columns.true_p,
            columns.time]
    return pl.scan_csv(files, include_file_paths=SOURCE_FILE, infer_schema_length=10_000,
                       schema_overrides={c: pl.String for c in text if c is not None})


def input_columns(schema, pattern: str, overrides: Mapping | None = None):
    """The checkpoint's column map adapted to an input file; refuses missing model inputs.

    Feature and request columns are required (a missing one is named with its role); optional
    roles absent from the file are dropped (a missing label makes the export unlabeled, a
    missing bid drops ``ecpm``). Returns ``(schema with that map, has_label, files)``.
    """
    from .readers import ColumnMap

    cm = dict(schema.columns.to_dict())
    unknown = sorted(set(overrides or {}) - set(cm))
    if unknown:
        raise ValueError(f"unknown column-map keys {unknown}; valid: {sorted(cm)}")
    cm.update(dict(overrides or {}))
    cm = ColumnMap.from_dict(cm)
    if list(cm.numeric) != list(schema.numeric) or list(cm.categorical) != list(schema.categorical):
        raise ValueError("columns overrides cannot change the model's features (numeric / "
                         "categorical); map renamed columns in the file instead")
    files = _files(pattern)
    have = set(_scan(files, cm).collect_schema().names())
    roles = {c: "request id" for c in cm.request_columns}
    roles.update({c: "numeric feature" for c in cm.numeric})
    roles.update({c: "categorical feature" for c in cm.categorical})
    if cm.request_time_bucket is not None:
        roles[cm.time] = "time (request_time_bucket)"
    missing = [f"{c!r} ({r})" for c, r in roles.items() if c not in have]
    if missing:
        raise ValueError(f"{pattern}: the model needs column(s) {', '.join(missing)} which the "
                         f"file does not have; it has {sorted(have)}")
    drop = {}
    for role in _OPTIONAL_ROLES:
        col = getattr(cm, role)
        if col is not None and col not in have and col not in roles:
            drop[role] = None
            log.warning("%s: no %r column (%s): exported without it", pattern, col, role)
    has_label = cm.label in have
    cm = dataclasses.replace(cm, **drop)
    return dataclasses.replace(schema, columns=cm), has_label, files


def _check_file_bids(lf: pl.LazyFrame, cm, pattern: str, starts: dict) -> None:
    from .readers import SOURCE_FILE

    if cm.bid is None:
        return
    b = pl.col(cm.bid).cast(pl.Float64, strict=False)
    bad = (b.is_null() | b.is_nan() | b.is_infinite() | (b < 0)).fill_null(True)
    res = lf.select(bad.sum().alias("n"), pl.col("__row").filter(bad).first().alias("row"),
                    pl.col(SOURCE_FILE).filter(bad).first().alias("file"),
                    pl.col(cm.bid).filter(bad).first().cast(pl.String).alias("value")).collect()
    n = int(res["n"][0])
    if n:
        f, r = res["file"][0], int(res["row"][0])
        raise ValueError(f"{pattern}: {n} bid(s) in column {cm.bid!r} negative, NaN, infinite or "
                         f"missing; first {res['value'][0]!r} at {f} row {r - starts[f] + 1}")


def iter_clicklog_chunks(schema, files: list[str], chunk_rows: int, *, pattern: str = "",
                         has_label: bool = True) -> Iterator[pl.DataFrame]:
    """Validated frames of whole requests, each about ``chunk_rows`` rows, from click-log files.

    A first pass reads only the request key (and counts rows per file). Requests stored
    contiguously are cut into row slices at request boundaries; otherwise each chunk is a
    semi-join on its request keys. Bids are checked over the whole input before the first chunk.
    """
    from .readers import (
        SOURCE_FILE,
        SOURCE_ROW,
        normalize_types,
        request_key_expr,
        validate_frame,
    )

    cm = schema.columns
    lf = _scan(files, cm)
    if not has_label:
        lf = lf.with_columns(pl.lit(0.0).alias(cm.label))
    lf = lf.select(*cm.source_columns(), SOURCE_FILE).with_row_index("__row")
    starts = dict(lf.group_by(SOURCE_FILE).agg(pl.col("__row").min()).collect().iter_rows())
    _check_file_bids(lf, cm, pattern, starts)
    keys = lf.select(request_key_expr(cm).alias("__req")).collect()["__req"]
    if keys.null_count():
        i = int(keys.is_null().arg_true()[0])
        raise ValueError(f"{pattern}: request id missing in {keys.null_count()} row(s), first at "
                         f"global row {i + 1}")
    change = np.ones(len(keys), dtype=bool)
    change[1:] = (keys[1:] != keys[:-1]).fill_null(True).to_numpy()
    run_starts = np.flatnonzero(change)
    contiguous = run_starts.size == keys.n_unique()
    if contiguous:
        lengths = np.diff(np.append(run_starts, len(keys)))
        parts = [lf.slice(int(run_starts[a]), int(lengths[a:b].sum()))
                 for a, b in request_chunks(lengths, chunk_rows)]
    else:
        counts = pl.DataFrame({"__req": keys}).group_by("__req", maintain_order=True).len()
        keyed = lf.with_columns(request_key_expr(cm).alias("__req"))
        parts = [keyed.join(counts.slice(a, b - a).select("__req").lazy(), on="__req", how="semi")
                 .drop("__req") for a, b in request_chunks(counts["len"].to_numpy(), chunk_rows)]
    del keys
    starts_df = pl.DataFrame({SOURCE_FILE: list(starts), "__start": list(starts.values())})
    for part in parts:
        frame = part.collect()
        frame = (frame.with_columns(pl.col(SOURCE_FILE).cast(pl.String))
                 .join(starts_df, on=SOURCE_FILE, how="left", maintain_order="left")
                 .with_columns((pl.col("__row") - pl.col("__start") + 1).alias(SOURCE_ROW))
                 .drop("__row", "__start"))
        frame = normalize_types(frame, cm)
        yield validate_frame(frame, cm, label_max=schema.label_max, name=pattern)


# ----------------------------------------------------------------------------------------------
# export
# ----------------------------------------------------------------------------------------------
def export(cfg: DictConfig) -> dict[str, Any]:
    """Score impressions and write the auction export (see ``docs/EXPORT.md``).

    Returns a dict with ``output``, ``n_rows``, ``metadata`` (decoded), ``calibration_fit`` (ECE /
    log loss / PCOC before and after the calibrator on the validation split), ``correction`` and
    ``portable`` (paths of the TorchScript / ONNX files when ``portable: true``).
    """
    from .data import Schema

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
    schema = Schema.from_dict(prep.schema)

    # --- inputs: validated before the output file is opened
    if pattern is not None:
        schema, has_label, files = input_columns(schema, str(pattern), cfg.get("columns"))
        chunks = iter_clicklog_chunks(schema, files, chunk_rows, pattern=str(pattern),
                                      has_label=has_label)
        first = next(chunks)  # surfaces bid / request-id / value errors before writing
        scored = {"input": str(pattern), "files": len(files)}

        def frames():
            for f in itertools.chain([first], chunks):
                yield score_data(prep.module, schema.transform(f), prep.calibrator,
                                 shift=prep.shift, labels=has_label)
    else:
        names = list(SPLITS) if split == "all" else [split]
        datas = {n: getattr(prep.splits(), n) for n in names}
        for n, d in datas.items():
            check_bids(d.bid, where=f"{n} split")
        scored = {"split": split, "data": prep._data_cfg.get("source", {}).get("_target_")}

        def frames():
            for n, d in datas.items():
                for r0, r1 in request_chunks(d.lengths.numpy(), chunk_rows):
                    f = score_data(prep.module, slice_requests(d, r0, r1), prep.calibrator,
                                   shift=prep.shift)
                    yield f.with_columns(pl.lit(n).alias("split")) if split == "all" else f

    meta = build_metadata(
        checkpoint_path=prep.module.checkpoint_path,
        checkpoint_sha256=prep.module.checkpoint_sha256,
        config=prep.config, calibrator=prep.calibrator, neg_keep_rate=prep.neg_keep_rate,
        correction_applied=prep.correction["applied"], correction=prep.correction, scored=scored,
        calibration_fit=prep.calibration_fit, columns=schema.columns.to_dict(),
        export_config=_export_cfg(cfg),
    )
    with ScoreWriter(output, meta, fmt=cfg.get("format")) as writer:
        for f in frames():
            writer.write(f)
    log.info("wrote %d rows to %s", writer.n_rows, output)
    result: dict[str, Any] = {"output": str(output), "n_rows": writer.n_rows,
                              "metadata": dict(writer.metadata), "correction": prep.correction,
                              "calibration_fit": prep.calibration_fit, "portable": {}}
    if cfg.get("portable", False):
        base = output.with_suffix("")
        result["portable"] = {
            "torchscript": str(export_torchscript(prep.module, prep.calibrator,
                                                  base.with_suffix(".pt"), shift=prep.shift)),
            "onnx": str(export_onnx(prep.module, prep.calibrator, base.with_suffix(".onnx"),
                                    shift=prep.shift)),
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

    Writes ``calibration.json``, ``reliability.png`` and ``pcoc_by_position.png`` to
    ``cfg.output_dir`` and returns the numbers: ``summaries`` (``before``: the model's pCTR after
    the downsampling correction; ``after``: calibrated; ``oracle``: the true pCTR on simulated
    data), ``ranking`` (NDCG / GAUC ... of both) and the calibrator's parameters.
    """
    split = str(cfg.get("split", "test"))
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    out_dir = Path(cfg.output_dir)
    check_writable(out_dir / "calibration.json")
    prep = prepare(cfg)
    data = getattr(prep.splits(), split)
    z = click_logits(prep.module.scorer, data).double() + prep.shift
    p_before = torch.sigmoid(z)
    p_after = prep.calibrator.predict_proba(z)
    bins = _bins(cfg)
    summaries = {"before": calibration_summary(p_before, data.label, data.position, bins=bins),
                 "after": calibration_summary(p_after, data.label, data.position, bins=bins)}
    if data.true_p is not None:
        summaries["oracle (true pCTR)"] = calibration_summary(data.true_p, data.label,
                                                              data.position, bins=bins)
    metric_kwargs = dict(prep.config.get("metrics") or {})

    def logit(p):
        p = p.clamp(1e-12, 1 - 1e-12)
        return torch.log(p / (1 - p)).float()

    ranking = {"before": evaluate_logits(data, z.float(), **metric_kwargs),
               "after": evaluate_logits(data, logit(p_after), **metric_kwargs)}
    extra = {"checkpoint": prep.module.checkpoint_path,
             "checkpoint_sha256": prep.module.checkpoint_sha256, "split": split,
             "calibrator": prep.calibrator.to_dict(), "correction": prep.correction,
             "calibration_fit": prep.calibration_fit,
             "ranking": {k: {m: (v if math.isfinite(v) else None) for m, v in r.items()}
                         for k, r in ranking.items()}}
    files = write_report(out_dir, summaries, extra=extra, figures=bool(cfg.get("figures", True)))
    return {**extra, "summaries": summaries, "files": files}


def _summary_line(name: str, s: Mapping[str, Any]) -> str:
    pc = "n/a" if s.get("pcoc") is None else f"{s['pcoc']:.4f}"
    return f"| {name} | {s['logloss']:.5f} | {s['ece']:.5f} | {pc} |"


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="export")
def _export_hydra(cfg: DictConfig) -> None:
    result = export(cfg)
    print(f"wrote {result['n_rows']} rows to {result['output']}")
    fit = result["calibration_fit"]
    if fit:
        print(f"calibrator fitted on the {fit['split']} split:")
        print("| | logloss | ECE | PCOC |\n|---|---|---|---|")
        print(_summary_line("before", fit["before"]))
        print(_summary_line("after", fit["after"]))
    print(f"correction: {result['correction']}")
    for kind, path in result["portable"].items():
        print(f"{kind}: {path}")


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="eval")
def _eval_hydra(cfg: DictConfig) -> None:
    result = evaluate(cfg)
    print(f"| {result['split']} split | logloss | ECE | PCOC |\n|---|---|---|---|")
    for name, s in result["summaries"].items():
        print(_summary_line(name, s))
    for kind, path in result["files"].items():
        print(f"{kind}: {path}")


def export_main() -> None:
    """Console script ``hybridrank-export``."""
    _export_hydra()


def eval_main() -> None:
    """Console script ``hybridrank-eval``."""
    _eval_hydra()
