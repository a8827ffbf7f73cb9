"""What an export or an evaluation builds once before it scores anything.

:func:`prepare` loads the checkpoint (:func:`~hybridrank.serving.checkpoint.load_model`: the model
carries its data schema and value policies), decides the negative-downsampling correction
(``correction: auto|always|never``), tests the level trend on the training and validation rows
(``level_trend``: a one-way drift of the click level, :mod:`hybridrank.serving.level_trend`) and
fits the calibrator on the calibration split, all held in a :class:`Prepared`. Its
:meth:`Prepared.source` re-reads the checkpoint's training data (or ``data=<option>``) with the
checkpoint's schema. ``hybridrank-export`` and ``hybridrank-eval`` (:mod:`hybridrank.cli.export`)
are thin shells around it.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Iterator
from typing import Any

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from hybridrank.data.fingerprint import check_fingerprint
from hybridrank.data.source import Source
from hybridrank.lists import ListData
from hybridrank.metrics.report import calibration_summary
from hybridrank.models.ranker import HybridRanker
from hybridrank.serving.calibration import (
    AutoCalibrator,
    Calibrator,
    IdentityCalibrator,
    correction_shift,
    resolve_correction,
)
from hybridrank.serving.checkpoint import load_model, resolve_checkpoint
from hybridrank.serving.export import sha256_file
from hybridrank.serving.inputs import input_chunks
from hybridrank.serving.level_trend import LevelTrend, model_level_trend

__all__ = ["Prepared", "prepare", "fit_trend", "scored_sample", "LEVEL_TREND_DEFAULTS", "SPLITS",
           "container"]

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")


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


def container(node) -> Any:
    """A config node as plain data (resolved); other values as they are."""
    if isinstance(node, DictConfig):
        return OmegaConf.to_container(node, resolve=True)
    return node


def prepare(cfg: DictConfig) -> Prepared:
    """Load the checkpoint, decide the correction, fit the calibrator on ``calibration_split``."""
    path = resolve_checkpoint(cfg.checkpoint)  # a run folder: its best checkpoint
    model = load_model(path)
    info = model.data_info
    own = not container(cfg.get("data"))
    data_cfg = container(cfg.get("data")) or (model.hparams.get("config") or {}).get("data")
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
    opts = {**LEVEL_TREND_DEFAULTS, **(container(node) or {})}
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
        chunks, _ = input_chunks(prep.model, str(pattern), chunk_rows, container(cfg.get("columns")))
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
