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
- the negative-downsampling correction (``correction: auto|always|never``) and the calibrator,
  fitted on the validation split of the training data;
- :func:`~hybridrank.serving.export.score_frame` and :class:`~hybridrank.serving.export.ScoreWriter`.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
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
from hybridrank.cli.train import CONF_DIR, ONE_SIDED_MARK, OUTSIDE_MARK, interval_cell
from hybridrank.lists import ListData
from hybridrank.metrics.report import calibration_summary, write_report
from hybridrank.metrics.uncertainty import split_intervals
from hybridrank.models.ranker import HybridRanker, evaluate_chunks
from hybridrank.serving.calibration import (
    AutoCalibrator,
    Calibrator,
    IdentityCalibrator,
    correction_shift,
    resolve_correction,
)
from hybridrank.serving.export import (
    ScoreWriter,
    build_metadata,
    export_onnx,
    export_torchscript,
    score_frame,
    sha256_file,
)

__all__ = ["export", "evaluate", "export_main", "eval_main", "prepare", "load_model",
           "resolve_checkpoint", "input_chunks"]

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
_OPTIONAL_ROLES = ("session", "user", "time", "position", "item", "bid", "true_p")


def load_model(path: str | Path) -> HybridRanker:
    """``HybridRanker.load_from_checkpoint`` on CPU in eval mode, with errors that say what is wrong.

    ``path`` is a checkpoint file, or a ``hybridrank-train`` output folder (its best checkpoint,
    as named in its ``metrics.json``).

    Raises:
        FileNotFoundError: no such file. ValueError: not a checkpoint (another kind of file, named),
        or not one written by ``hybridrank-train`` (hyper-parameters missing).
    """
    path = resolve_checkpoint(path)
    _check_checkpoint_file(path)
    try:
        head = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a damaged file or a checkpoint holding arbitrary Python objects
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{path} is not a readable hybridrank checkpoint ({type(e).__name__}: "
                         f"{first[:200]})") from e
    if not isinstance(head, dict):
        raise ValueError(f"{path} is not a hybridrank checkpoint: it holds a "
                         f"{type(head).__name__}, not a Lightning checkpoint")
    hp = head.get("hyper_parameters") or {}
    missing = [k for k in ("scorer", "loss", "data") if not hp.get(k)]
    if missing or "state_dict" not in head:
        raise ValueError(f"{path} is not a hybridrank checkpoint: hyper-parameters {missing} "
                         f"missing (it must be written by hybridrank-train / HybridRanker built "
                         f"from configs)")
    del head
    model = HybridRanker.load_from_checkpoint(path, map_location="cpu", weights_only=True)
    return model.eval()


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint file as given, or the best checkpoint of a ``hybridrank-train`` run folder."""
    path = Path(path)
    if path.is_dir():
        metrics = path / "metrics.json"
        if not metrics.is_file():
            raise FileNotFoundError(f"checkpoint={path} is a folder without metrics.json: give a "
                                    f"checkpoint file or a finished hybridrank-train run folder")
        best = json.loads(metrics.read_text()).get("best_checkpoint")
        if not best:
            raise ValueError(f"{metrics} names no best checkpoint (a run with callbacks=none "
                             f"keeps none)")
        # the run folder may have moved since: look in its own checkpoints/ too
        candidates = [Path(best), path / "checkpoints" / Path(best).name]
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            raise FileNotFoundError(f"the best checkpoint of {path} ({Path(best).name}) is missing")
        return found
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    return path


#: leading bytes of files that get passed as checkpoints by mistake
_MAGIC = {b"PAR1": "a parquet file", b"\x89PNG": "a PNG image", b"\x7fELF": "an executable",
          b"\x1f\x8b": "a gzip file", b"{": "a JSON file", b"ONNX": "an ONNX model"}


def _check_checkpoint_file(path: Path) -> None:
    """Refuse files that cannot be a torch checkpoint before ``torch.load`` reads them (its
    error on such files suggests ``weights_only=False``: advice that does not apply here)."""
    with open(path, "rb") as f:
        head = f.read(8)
    if head.startswith(b"PK\x03\x04") or head[:1] == b"\x80":  # torch's zip / legacy pickle
        return
    kind = next((what for magic, what in _MAGIC.items() if head.startswith(magic)), None)
    if kind is None:
        kind = "an empty file" if not head else (
            "a text file" if all(32 <= b < 127 or b in (9, 10, 13) for b in head) else
            "not a torch file")
    raise ValueError(f"{path} is not a checkpoint ({kind}); give a .ckpt file written by "
                     f"hybridrank-train (RUN_DIR/checkpoints/epochNN.ckpt) or its run folder")


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
    _source: Any = None

    @property
    def config(self) -> dict:
        return dict(self.model.hparams.get("config") or {})

    def source(self):
        """The data source of ``data_cfg`` built with the model's schema (loaded once)."""
        if self._source is None:
            if not self.data_cfg:
                raise ValueError("the checkpoint's config holds no data node; pass data=<option>")
            node = self.data_cfg.get("source", self.data_cfg)
            # a partial, then the schema: objects never go through OmegaConf
            src = hydra.utils.instantiate(node, _partial_=True)(schema=self.model.schema)
            self._source = src.load() if hasattr(src, "load") else src
        return self._source

    def chunks(self, split: str, chunk_rows: int) -> Iterator[ListData]:
        """The requests of a split of the data, in chunks of whole requests."""
        src = self.source()
        if hasattr(src, "train"):  # in-memory Splits
            yield from getattr(src, split).chunks(chunk_rows)
        else:                      # a streamed source: its own chunks
            yield from src.chunks(split)


def _container(node) -> Any:
    if isinstance(node, DictConfig):
        return OmegaConf.to_container(node, resolve=True)
    return node


def prepare(cfg: DictConfig) -> Prepared:
    """Load the checkpoint, decide the correction, fit the calibrator on ``calibration_split``."""
    path = resolve_checkpoint(cfg.checkpoint)  # a run folder: its best checkpoint
    model = load_model(path)
    info = model.data_info
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
                    None, data_cfg)
    if not isinstance(calibrator, IdentityCalibrator):
        split = str(cfg.get("calibration_split", "val"))
        if split not in SPLITS:
            raise ValueError(f"calibration_split must be one of {SPLITS}, got {split!r}")
        z, y, groups = _logits_labels(prep, split, int(cfg.get("chunk_rows", 200_000)))
        z = z + shift
        if isinstance(calibrator, AutoCalibrator):
            calibrator.fit(z, y, groups=groups)
            log.info("calibrator=auto: %s", decision_line(calibrator.decision))
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


def _logits_labels(prep: Prepared, split: str, chunk_rows: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Click logits (float64), labels and request index of every impression of a split.

    Scored where the labels were drawn: at the logged positions for a model with a position-bias
    tower (a calibrator fitted on serving scores against labels from all positions would fold
    the average position effect back into the pCTR).
    """
    zs, ys, gs = [], [], []
    n_requests = 0
    for data in prep.chunks(split, chunk_rows):
        zs.append(prep.model.predict_split(data, at_logged_position=True)[0].double())
        ys.append(data.label)
        gs.append(data.request_of_row() + n_requests)
        n_requests += data.n_requests
    return torch.cat(zs), torch.cat(ys), torch.cat(gs)


def position_bias_info(model: HybridRanker) -> dict | None:
    """The export metadata of a position-bias tower: reference position and per-position offsets."""
    tower = model.position_bias
    if tower is None:
        return None
    offsets = tower.offsets()
    return {"reference_position": tower.reference_position, "max_position": tower.max_position,
            "logit_offsets": offsets,
            "note": "pctr is the click probability at reference_position; at slot j an auction's "
                    "expected CTR is sigmoid(logit(pctr) + logit_offsets[j - 1]) (positions above "
                    "max_position share its offset)"}


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
    if list(cm.numeric) != list(schema.numeric) or list(cm.categorical) != list(schema.categorical):
        raise ValueError("columns overrides cannot change the model's features (numeric / "
                         "categorical); map renamed columns in the file instead")
    roles = {c: "request id" for c in cm.request_columns}
    roles.update({c: "numeric feature" for c in cm.numeric})
    roles.update({c: "categorical feature" for c in cm.categorical})
    if cm.request_time_bucket is not None:
        roles[cm.time] = "time (request_time_bucket)"
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
                yield score_frame(model, data, prep.calibrator, shift=prep.shift,
                                  labels=info["has_label"])
    else:
        names = list(SPLITS) if split == "all" else [split]
        node = (prep.data_cfg or {}).get("source", {})
        scored = {"split": split, "data": node.get("_target_")}
        columns = model.schema.columns.to_dict()

        def frames():
            for name in names:
                for data in prep.chunks(name, chunk_rows):
                    f = score_frame(model, data, prep.calibrator, shift=prep.shift)
                    yield f.with_columns(pl.lit(name).alias("split")) if split == "all" else f

    meta = build_metadata(
        checkpoint_path=prep.checkpoint_path, checkpoint_sha256=prep.checkpoint_sha256,
        config=prep.config, calibrator=prep.calibrator,
        neg_keep_rate=prep.correction["neg_keep_rate"],
        correction_applied=prep.correction["applied"], correction=prep.correction, scored=scored,
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
        base = output.with_suffix("")
        result["portable"] = {
            "torchscript": str(export_torchscript(model, prep.calibrator, base.with_suffix(".pt"),
                                                  shift=prep.shift)),
            "onnx": str(export_onnx(model, prep.calibrator, base.with_suffix(".onnx"),
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

    Writes ``calibration.json``, ``reliability.png``, ``pcoc_by_position.png`` and one
    ``field_calibration_{field}.png`` per calibration field (``cfg.fields``, default the model's
    ``metrics.fields``) to ``cfg.output_dir`` and returns the numbers: ``summaries`` (``before``: the model's pCTR after
    the downsampling correction; ``after``: calibrated; ``oracle``: the true pCTR on simulated
    data), ``ranking`` (NDCG / GAUC ... of both) and the calibrator's parameters.
    """
    split = str(cfg.get("split", "test"))
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    out_dir = Path(cfg.output_dir)
    check_writable(out_dir / "calibration.json")
    prep = prepare(cfg)
    chunk_rows = int(cfg.get("chunk_rows", 200_000))
    datas, zs = [], []
    for data in prep.chunks(split, chunk_rows):
        datas.append(data)  # scored where the labels were drawn (logged positions, for a tower)
        zs.append(prep.model.predict_split(data, at_logged_position=True)[0].double() + prep.shift)
    z = torch.cat(zs)
    label = torch.cat([d.label for d in datas])
    position = None if datas[0].position is None else torch.cat([d.position for d in datas])
    p_before = torch.sigmoid(z)
    p_after = prep.calibrator.predict_proba(z)
    fields, field_labels = _report_fields(prep.model, cfg.get("fields"), datas)

    def summary(p: torch.Tensor) -> dict[str, Any]:
        return calibration_summary(p, label, position, bins=int(cfg.get("bins", 15)),
                                   fields=fields, field_labels=field_labels)

    summaries = {"before": summary(p_before), "after": summary(p_after)}
    if datas[0].true_p is not None:
        true_p = torch.cat([d.true_p for d in datas])
        summaries["oracle (true pCTR)"] = summary(true_p)

    def ranking(logits: torch.Tensor) -> dict[str, float]:
        bounds = torch.cumsum(torch.tensor([0] + [d.n_impressions for d in datas]), 0)
        pairs = ((d, logits[bounds[i]:bounds[i + 1]]) for i, d in enumerate(datas))
        return evaluate_chunks(pairs, prep.model.new_metrics(), prep.model.field_columns)

    extra = {"checkpoint": prep.checkpoint_path, "checkpoint_sha256": prep.checkpoint_sha256,
             "split": split, "calibrator": prep.calibrator.to_dict(),
             "correction": prep.correction, "calibration_fit": prep.calibration_fit,
             "ranking": {"before": ranking(z.float()),
                         "after": ranking(torch.logit(p_after, eps=1e-12).float())}}
    n_boot = int(cfg.get("n_boot", 1000))
    if n_boot:
        # intervals over the split's requests; "after" and the oracle paired against "before"
        whole = datas[0] if len(datas) == 1 else _concat_chunks(datas)
        rows = {"before": z, "after": torch.logit(p_after, eps=1e-12)}
        if "oracle (true pCTR)" in summaries:
            rows["oracle (true pCTR)"] = torch.logit(true_p.double(), eps=1e-7)
        names = tuple(fields or ())
        extra["intervals"] = split_intervals(
            whole, rows, metrics=("logloss", "ece", "pcoc", "ndcg@10", "gauc",
                                  *(f"f_ece@{n}" for n in names)),
            n_boot=n_boot, seed=int(cfg.get("seed", 0)), fields=fields, **prep.model.metric_conventions)
    files = write_report(out_dir, summaries, extra=extra, figures=bool(cfg.get("figures", True)))
    return {**extra, "summaries": summaries, "files": files}


def _report_fields(model, names, datas: list[ListData]):
    """Codes and code names of the report's calibration fields: ``names`` (None: the model's
    ``metrics.fields``), categorical features of the model's schema."""
    resolved = model.metric_fields if names is None else model._resolve_fields(list(names))
    if not resolved:
        return None, None
    schema = model.schema
    codes = {n: torch.cat([d.cat[:, j] for d in datas]) for n, (j, _) in resolved.items()}

    def namer(column: str):
        if schema.vocab_policy[column].hashed:
            return lambda code: "missing" if code == 0 else f"hash bucket {code}"
        vocab = schema.vocab[column]
        return lambda code: "out of vocabulary / missing" if code == 0 else vocab[code - 1]

    return codes, {n: namer(n) for n in resolved}


def _concat_chunks(datas: list[ListData]) -> ListData:
    from hybridrank.cli.train import _concat

    return _concat(datas)


def _summary_line(name: str, s: Mapping[str, Any]) -> str:
    pc = "n/a" if s.get("pcoc") is None else f"{s['pcoc']:.4f}"
    return f"| {name} | {s['logloss']:.5f} | {s['ece']:.5f} | {pc} |"


def decision_line(decision: Mapping[str, Any]) -> str:
    """``calibrator=auto``'s decision as one readable line (the figures are in the metadata).

    >>> decision_line({"chosen": "none",  # doctest: +ELLIPSIS "rule": "improvement > 2 x se, 5 folds by request",
    ...                "requests": 2298, "candidates": {"none": {"cv_logloss": 0.13},
    ...                "platt": {"improvement": -1e-05, "se": 2e-05, "passes": False}}})
    'kept no calibrator (the identity): held-out log-loss improvement platt -0.00001 ± 0.00002; ...'
    """
    chosen = decision.get("chosen", "none")
    parts = []
    for name, r in (decision.get("candidates") or {}).items():
        if name == "none":
            continue
        if "error" in r:
            parts.append(f"{name} failed ({r['error']})")
        else:
            parts.append(f"{name} {r['improvement']:+.5f} ± {r['se']:.5f}"
                         + (" (passes)" if r.get("passes") else ""))
    kept = "no calibrator (the identity)" if chosen == "none" else chosen
    requests = decision.get("requests")
    return (f"kept {kept}: held-out log-loss improvement {', '.join(parts) or 'none tried'}; "
            f"rule: {decision.get('rule', '?')}"
            + (f", {requests:,} requests" if isinstance(requests, int) else ""))


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
        print(_summary_line("before", fit["before"]))
        print(_summary_line("after", fit["after"]))
    print(correction_line(result["correction"]))
    for kind, path in result["portable"].items():
        print(f"{kind}: {path}")


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="eval")
@hydra_job
def _eval_hydra(cfg: DictConfig) -> None:
    with quiet_third_party():
        result = evaluate(cfg)
    iv = result.get("intervals")
    if iv:
        cols = tuple(next(iter(iv["rows"].values())))
        print(f"| {result['split']} split | " + " | ".join(cols) + " |\n" + "|---" * (len(cols) + 1)
              + "|")
        feet: dict[str, list[str]] = {}
        for name, row in iv["rows"].items():
            cells = []
            for c in cols:
                note = iv.get("notes", {}).get(name, {}).get(c, "")
                text, foot = interval_cell(c, *row[c], note)
                cells.append(text)
                if foot:
                    feet.setdefault(foot, []).append(f"{name} {c}")
            print(f"| {name} | " + " | ".join(cells) + " |")
        for foot, where in feet.items():
            if foot == ONE_SIDED_MARK:
                print(f"{foot} ECE is >= 0 and biased upwards: a point below its percentile "
                      f"interval gets the one-sided [0, upper] ({', '.join(where)})")
            elif foot == OUTSIDE_MARK:
                print(f"{foot} point outside its percentile interval ({', '.join(where)})")
            else:
                print(f"[no interval] {', '.join(where)}: {foot}")
        for name, row in iv["paired"].items():
            d = row["logloss"]
            print(f"{name} - before, log loss: {d['diff']:+.5f} [{d['lower']:+.5f}, "
                  f"{d['upper']:+.5f}] ({d['verdict']})")
        print(f"{100 * (1 - iv['alpha']):.0f} % bootstrap intervals over {iv['n_requests']:,} "
              f"requests, {iv['n_positives']:,} positives")
    else:
        print(f"| {result['split']} split | logloss | ECE | PCOC |\n|---|---|---|---|")
        for name, s in result["summaries"].items():
            print(_summary_line(name, s))
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
