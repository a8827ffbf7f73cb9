"""A model's figures on a split, and the figures of score files: one engine, one set of rows.

Every report of the package (``hybridrank-train``'s table and ``metrics.json``,
``hybridrank-eval``'s calibration report, ``hybridrank-compare``) goes through the same steps:

1. **gather** a model's click logits on a split given as chunks of whole requests
   (:func:`score_split`; scored where the labels were drawn: at the logged positions for a model
   with a position-bias tower), or read score files (:func:`compare_figures`);
2. **split statistics**: per-request sums of the metric engine for every row
   (:meth:`ScoredSplit.statistics`, :func:`~hybridrank.metrics.request_stats.flat_stats`), the
   model's and those of the **reference rows** (:func:`reference_rows`: the true pCTR when the data
   carries it, the base rate);
3. **points and intervals** from those statistics: point estimates (:func:`points`) and seeded
   bootstrap intervals over requests, every row resampled with the same counts and paired against
   the first (:func:`~hybridrank.metrics.uncertainty.interval_table`).

So a row that two reports share (the model on the test split, the true pCTR) has the same figures
in both, to the last digit, for the same seed and number of resamples. The text of the tables is
in :mod:`hybridrank.evaluation.tables`.

The validation metrics of training are the streaming :class:`~hybridrank.metrics.ListMetrics`
(sum states, a logit histogram for AUC and quantile ECE); :func:`evaluate_chunks`,
:func:`evaluate_logits` and :func:`evaluate_model` give those figures for any scores (the
benchmarks' LETOR tables use them).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from hybridrank.lists import ListData, gather_lists, pad_index
from hybridrank.metrics.list_metrics import ListMetrics
from hybridrank.metrics.report import stats_summary
from hybridrank.metrics.request_stats import RequestStats, flat_stats, frame_stats
from hybridrank.metrics.uncertainty import Interval, PairedResult, compare_bootstrap, interval_table
from hybridrank.models.ranker import HybridRanker
from hybridrank.serving.export import require_columns

__all__ = ["TABLE_COLUMNS", "EVAL_COLUMNS", "COMPARE_METRICS", "ScoredSplit", "score_split",
           "reference_rows", "model_statistics", "points", "final_figures", "calibration_report",
           "Comparison", "score_file_statistics", "compare_figures", "evaluate_chunks",
           "evaluate_logits", "evaluate_model"]

#: the columns of ``hybridrank-train``'s result table (and of its intervals in ``metrics.json``)
TABLE_COLUMNS = ("ndcg@10", "gauc", "logloss", "ece", "pcoc")
#: the columns of ``hybridrank-eval``'s table (calibration first)
EVAL_COLUMNS = ("logloss", "ece", "pcoc", "ndcg@10", "gauc")
#: the metrics ``hybridrank-compare`` reports for each score file
COMPARE_METRICS = ("ndcg@10", "gauc", "map", "logloss", "ece", "pcoc")

#: impressions per chunk when a report reads a split (whole requests)
CHUNK_ROWS = 1 << 20


# ----------------------------------------------------------------------------------------------
# gather: a model's scores on a split
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ScoredSplit:
    """A model's click logits on a split and what its statistics need, flat in storage order.

    Attributes:
        logit: ``[N]`` float32 click logits where the labels were drawn (at the logged
            positions for a model with a position-bias tower).
        label: ``[N]`` labels. lengths: ``[R]`` impressions per request.
        position: ``[N]`` logged display positions (None when the data has none).
        true_p: ``[N]`` true click probabilities (simulated data; None otherwise).
        time: ``[N]`` the request time of each impression (None when the data has none).
        fields: ``{name: [N] codes}`` of the calibration fields.
    """

    logit: Tensor
    label: Tensor
    lengths: Tensor
    position: Tensor | None
    true_p: Tensor | None
    time: Tensor | None
    fields: dict[str, Tensor]

    @property
    def n_impressions(self) -> int:
        return int(self.logit.numel())

    def statistics(self, scores: Tensor, p: Tensor | None = None, **conventions) -> RequestStats:
        """The engine's per-request statistics of one row on this split: ``scores [N]`` rank
        within requests, ``p [N]`` are the probabilities the calibration metrics read (default
        ``σ(scores)``), with the split's labels, positions and field codes. ``conventions`` as
        :func:`~hybridrank.metrics.request_stats.flat_stats` (a model's ``metric_conventions``)."""
        return flat_stats(scores, self.label, self.lengths, p=p, position=self.position,
                          fields=self.fields, **conventions)


def score_split(model: HybridRanker, chunks: Iterable[ListData], *,
                fields: Mapping[str, int] | None = None) -> ScoredSplit:
    """Gather a model's click logits on a split given as chunks of whole requests.

    Each chunk is scored by :meth:`~hybridrank.models.ranker.HybridRanker.predict_split` at the
    logged positions (where its labels were drawn); only the logits, labels, request lengths,
    positions, true pCTR, request times and field codes are kept, never the features.

    Args:
        model: the trained model. chunks: ``ListData`` pieces of whole requests of one split.
        fields: ``{name: column of ListData.cat}`` of the calibration fields (default the model's
            ``metrics.fields``, :attr:`HybridRanker.field_columns`).

    Returns:
        The :class:`ScoredSplit`. Raises ValueError when the split holds no request.
    """
    columns = model.field_columns if fields is None else dict(fields)
    parts: dict[str, list] = {k: [] for k in ("logit", "label", "lengths", "position", "true_p", "time")}
    codes: dict[str, list] = {n: [] for n in columns}
    for data in chunks:
        parts["logit"].append(model.predict_split(data, at_logged_position=True)[0])
        parts["label"].append(data.label)
        parts["lengths"].append(data.lengths)
        parts["position"].append(data.position)
        parts["true_p"].append(data.true_p)
        parts["time"].append(None if data.time is None else data.time[data.request_of_row()])
        for n, j in columns.items():
            codes[n].append(data.cat[:, j])
    cat = {k: None if not v or any(t is None for t in v) else torch.cat(v) for k, v in parts.items()}
    if cat["logit"] is None:
        raise ValueError("the split holds no request to evaluate")
    return ScoredSplit(**cat, fields={n: torch.cat(c) for n, c in codes.items()})


# ----------------------------------------------------------------------------------------------
# statistics, reference rows, points and intervals
# ----------------------------------------------------------------------------------------------
def reference_rows(label: Tensor, true_p: Tensor | None) -> dict[str, Tensor]:
    """Probabilities of the reference predictors on a split: the true pCTR when known, and the
    base rate (the split's own click rate, clipped to ``[1e-7, 1 - 1e-7]``: a constant score,
    which with ``ties="average"`` is also the expected NDCG of a random order).

    >>> rows = reference_rows(torch.tensor([0., 1., 0., 0.]), None)
    >>> list(rows), rows["base rate"].tolist()
    (['base rate'], [0.25, 0.25, 0.25, 0.25])
    """
    rate = min(max(float((label > 0).double().mean()) if label.numel() else 0.0, 1e-7), 1 - 1e-7)
    rows = {} if true_p is None else {"oracle (true pCTR)": true_p.double()}
    rows["base rate"] = torch.full((label.numel(),), rate, dtype=torch.float64)
    return rows


def model_statistics(model: HybridRanker, chunks: Iterable[ListData]) -> dict[str, RequestStats]:
    """Per-request statistics of ``"this model"`` and the reference rows (:func:`reference_rows`)
    on a split given as chunks of whole requests, with the model's metric conventions and fields.

    A reference row ranks by its probability and is calibrated as that probability; the model's
    row ranks by its click logit and is calibrated as ``σ(logit)``.
    """
    scored = score_split(model, chunks)
    conventions = model.metric_conventions
    out = {"this model": scored.statistics(scored.logit, **conventions)}
    for name, p in reference_rows(scored.label, scored.true_p).items():
        out[name] = scored.statistics(p, p, **conventions)
    return out


def points(stats: Mapping[str, RequestStats]) -> dict[str, dict[str, float]]:
    """``{row: {metric: point estimate}}`` of every row, undefined metrics left out."""
    return {name: {k: v for k, v in st.point().items() if v is not None} for name, st in stats.items()}


def final_figures(model: HybridRanker, chunks: Iterable[ListData], *, n_boot: int = 0,
                  alpha: float = 0.05, seed: int = 0,
                  clock: dict[str, float] | None = None) -> dict[str, Any]:
    """The figures of ``hybridrank-train``'s result table and ``metrics.json`` on a split.

    Returns:
        ``test`` (this model, keys ``test/...``), ``reference`` (the oracle and base-rate rows)
        and, with ``n_boot``, ``intervals``: bootstrap intervals over the split's requests of
        :data:`TABLE_COLUMNS` and ``f_ece@{field}`` (:func:`interval_table`, every row paired
        against this model). Points and intervals derive from the same statistics
        (:func:`model_statistics`). ``clock``: given, its ``"intervals"`` gets the seconds the
        bootstrap took.
    """
    stats = model_statistics(model, chunks)
    pts = points(stats)
    out: dict[str, Any] = {"test": {f"test/{k}": v for k, v in pts.pop("this model").items()},
                           "reference": pts}
    if n_boot:
        t0 = time.perf_counter()
        metrics = TABLE_COLUMNS + tuple(f"f_ece@{n}" for n in model.field_columns)
        out["intervals"] = interval_table(stats, metrics=metrics, n_boot=n_boot, alpha=alpha,
                                          seed=seed)
        if clock is not None:
            clock["intervals"] = time.perf_counter() - t0
    return out


def calibration_report(scored: ScoredSplit, calibrator, *, shift: float = 0.0,
                       moved: Tensor | None = None, conventions: Mapping[str, Any] | None = None,
                       field_labels: Mapping[str, Any] | None = None, n_boot: int = 1000,
                       seed: int = 0) -> dict[str, Any]:
    """The figures of ``hybridrank-eval``: the model's pCTR before and after a calibrator.

    Rows: ``before`` ranks by ``z = logit + shift`` (the downsampling correction) and is
    calibrated as ``σ(z)``; ``after`` is ``calibrator.predict_proba(z + moved)`` (``moved``: the
    level trend at each row's time, what an export writes), ranking and calibration alike;
    ``oracle (true pCTR)`` when the data carries it. One set of per-request statistics per row
    gives its summary, its ranking metrics and its intervals.

    Args:
        scored: the model's scores on the split (:func:`score_split`).
        calibrator: a fitted :class:`~hybridrank.serving.calibration.Calibrator`.
        shift: the logit shift of the downsampling correction. moved: ``[N]`` float64 logit
            shifts of the level trend (default none).
        conventions: metric conventions (:func:`~hybridrank.metrics.request_stats.flat_stats`).
        field_labels: ``{field: code -> name}`` for the summaries' per-value tables.
        n_boot, seed: bootstrap intervals over requests (``n_boot=0``: none) of
            :data:`EVAL_COLUMNS` and ``f_ece@{field}``, ``after`` and the oracle paired
            against ``before``.

    Returns:
        ``{"stats", "summaries", "ranking": {"before", "after"}, "intervals"}`` (``intervals``
        only with ``n_boot``).
    """
    conventions = dict(conventions or {})
    z = scored.logit.double() + shift
    p_after = calibrator.predict_proba(z if moved is None else z + moved)  # what the export writes
    stats = {"before": scored.statistics(z, torch.sigmoid(z), **conventions),
             "after": scored.statistics(p_after, p_after, **conventions)}
    if scored.true_p is not None:
        true_p = scored.true_p.double()
        stats["oracle (true pCTR)"] = scored.statistics(true_p, true_p, **conventions)
    pts = points(stats)
    out: dict[str, Any] = {
        "stats": stats,
        "summaries": {name: stats_summary(st, field_labels=field_labels) for name, st in stats.items()},
        "ranking": {"before": pts["before"], "after": pts["after"]},
    }
    if n_boot:
        metrics = (*EVAL_COLUMNS, *(f"f_ece@{n}" for n in scored.fields))
        out["intervals"] = interval_table(stats, metrics=metrics, n_boot=n_boot, seed=seed)
    return out


# ----------------------------------------------------------------------------------------------
# score files (hybridrank-compare)
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Comparison:
    """Score files on the same requests: each one's intervals, and paired differences with the
    first (:func:`compare_figures`)."""

    names: list[str]
    metrics: list[str]
    stats: dict[str, RequestStats]
    intervals: dict[str, dict[str, Interval]]
    paired: dict[str, dict[str, PairedResult]]
    n_impressions: int
    n_boot: int
    alpha: float
    seed: int


def score_file_statistics(frames: Mapping[str, Any], *, score: str = "pctr", label: str = "label",
                          request: str = "request_id", empty: str = "skip") -> dict[str, RequestStats]:
    """Per-request statistics of score frames that score the same impressions.

    Every frame must hold the same rows (request ids and labels equal row by row; the first row
    that differs is named); ``score`` is the probability the calibration metrics read and the
    ranking score (:func:`~hybridrank.metrics.request_stats.frame_stats`).
    """
    require_columns(frames, (request, label, score))
    names = list(frames)
    first = frames[names[0]]
    for name, f in frames.items():
        if f.height != first.height:
            raise ValueError(f"{name}: {f.height} rows vs {first.height} in {names[0]}; the files "
                             "must score the same impressions")
        for col in (request, label):
            diff = np.flatnonzero(f[col].to_numpy() != first[col].to_numpy())
            if diff.size:
                i = int(diff[0])
                raise ValueError(f"{name}: column {col!r} differs from {names[0]} at {diff.size} "
                                 f"row(s), first row {i + 1}: {f[col][i]!r} vs {first[col][i]!r}")
    return {n: frame_stats(frames[n], score=score, label=label, request=request, empty=empty)
            for n in names}


def compare_figures(frames: Mapping[str, Any], *, score: str = "pctr", label: str = "label",
                    request: str = "request_id", metrics: Sequence[str] = COMPARE_METRICS,
                    n_boot: int = 1000, alpha: float = 0.05, seed: int = 0,
                    empty: str = "skip") -> Comparison:
    """Each score frame's metrics with percentile bootstrap intervals over requests, and every
    frame after the first paired with the first on the same resamples.

    Args:
        frames: name -> score frame (request id, label, score columns; the same requests and
            labels in every frame, rows sorted by request).
        score: the probability column (``pctr``); it is also the ranking score.
        metrics: which to report (those the first frame's statistics have); n_boot, alpha, seed:
            the bootstrap; empty: NDCG's policy for requests without a positive label.
    """
    stats = score_file_statistics(frames, score=score, label=label, request=request, empty=empty)
    names = list(stats)
    have = [m for m in metrics if m in stats[names[0]].metrics]
    ivs, paired = compare_bootstrap(stats, n_boot=n_boot, alpha=alpha, seed=seed, metrics=have)
    return Comparison(names, have, stats, ivs, paired, frames[names[0]].height, n_boot, alpha, seed)


# ----------------------------------------------------------------------------------------------
# the streaming (validation) metrics of any scores
# ----------------------------------------------------------------------------------------------
def evaluate_chunks(pairs: Iterable[tuple[ListData, Tensor]], metrics: ListMetrics,
                    field_columns: Mapping[str, int] | None = None) -> dict[str, float]:
    """Metrics of flat logits over chunks of whole requests: ``pairs`` of ``(data, logits [N])``.

    Requests are ranked within themselves (one-shot over all chunks; the states are sums, so the
    result equals one update over the whole split). Values are floats; undefined metrics are left
    out (see :class:`ListMetrics`). ``field_columns``: ``{field: column of data.cat}`` for the
    metrics' calibration fields (:attr:`HybridRanker.field_columns`).
    """
    for data, logits in pairs:
        index, mask = pad_index(data.lengths)
        positions = None if data.position is None else gather_lists(data.position, index, mask)
        fields = None
        if field_columns:
            fields = {n: gather_lists(data.cat[:, j], index, mask) for n, j in field_columns.items()}
        metrics.update(gather_lists(logits.float(), index, mask),
                       gather_lists(data.label, index, mask), mask=mask, positions=positions,
                       fields=fields)
    return {k: float(v) for k, v in metrics.compute().items()
            if isinstance(v, torch.Tensor) and v.numel() == 1}


def evaluate_logits(data: ListData, logits: Tensor, **metric_kwargs) -> dict[str, float]:
    """Metrics of flat ``[N]`` logits on a split, ranking within requests (any model's scores:
    reference rows, LightGBM in the benchmarks). ``metric_kwargs`` as :class:`ListMetrics`."""
    return evaluate_chunks([(data, logits)], ListMetrics(**metric_kwargs))


def evaluate_model(model: HybridRanker, data: ListData | Iterable[ListData]) -> dict[str, float]:
    """The validation metrics of a model on a split (or on chunks of whole requests of one),
    scored as validation does (at the logged positions for a model with a position-bias tower),
    with the model's metric conventions and fields."""
    chunks = [data] if isinstance(data, ListData) else data
    pairs = ((c, model.predict_split(c, at_logged_position=True)[0]) for c in chunks)
    return evaluate_chunks(pairs, model.new_metrics(), model.field_columns)
