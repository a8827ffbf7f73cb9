"""Builders of the metric engine: :class:`~hybridrank.metrics.per_request.RequestStats` from scores.

:func:`flat_stats` is the one builder of scored requests (flat ``[N]`` scores of requests stored
one after another); the others adapt their input to it: padded lists (:func:`list_stats`, and
:func:`ranking_stats`, :func:`calibration_stats`, :func:`field_stats` for one family of metrics),
a split (:func:`split_stats`), an export frame (:func:`frame_stats`). :func:`ratio_stats` wraps any
per-request ratio (auction money metrics, a CTR). Padded inputs take ``mask`` keyword-only, as
every metric and loss does.

Conventions (``ks``, ``gain``, ``empty``, ``ties``, ``bins``, ``binning``, ``positions``) are those
of :mod:`hybridrank.metrics.ranking` and :class:`~hybridrank.metrics.list_metrics.ListMetrics`, and
the point estimates equal the pure functions of :mod:`hybridrank.metrics` on the same conventions.
All-padding rows of ``[G, L]`` inputs (and zero-length requests of flat inputs) are not requests
and are dropped (``R <= G``).

**Quantile-bin ECE and global AUC** need the whole sample: the bins are the quantile rule of
:func:`~hybridrank.metrics.calibration.bin_index` applied once to the full sample's p, and the AUC
buckets are the full sample's distinct scores. Both are part of the statistic's definition: each
request keeps its sums per bin (per bucket) and a replicate re-weights them. A replicate's ECE is
therefore the ECE of the resample **over the full sample's bins** (it does not draw new quantile
edges, as a histogram keeps its cut-offs), and its AUC is the exact AUC of the resample. The point
estimates equal :func:`~hybridrank.metrics.calibration.ece` and
:func:`~hybridrank.metrics.ranking.auc` exactly. ``ListMetrics`` never holds the whole sample: it
approximates the same quantile bins and the AUC from its logit histogram (with stated bounds), for
training-time validation only; the final figures of a run come from here.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from hybridrank.lists import pad_index
from hybridrank.metrics.calibration import bin_index, check_binning
from hybridrank.metrics.list_kernels import check_options, resolve_ks
from hybridrank.metrics.per_request import RequestStats, as_float64
from hybridrank.metrics.ranking import score_buckets
from hybridrank.metrics.request_sums import impression_sums, ranking_sums
from hybridrank.metrics.statistics import RANKING, metric_statistics, ratio

__all__ = ["flat_stats", "list_stats", "ranking_stats", "calibration_stats", "field_stats",
           "split_stats", "frame_stats", "ratio_stats", "request_offsets"]

_RANK_CHUNK = 1 << 20  # padded [g, L] cells per chunk of the ranking kernel


def _check_flat(labels: Tensor, p: Tensor | None) -> None:
    if labels.is_floating_point() and bool(torch.isnan(labels).any()):
        raise ValueError("labels contains NaN at a real impression")
    if bool((labels < 0).any()):
        raise ValueError("labels must be >= 0")
    if p is not None:
        if bool(torch.isnan(p).any()):
            raise ValueError("p contains NaN at a real impression")
        if bool(((p < 0) | (p > 1)).any()):
            raise ValueError("p must lie in [0, 1] at real impressions")


def _positions(positions: bool | int) -> int:
    if positions is True:
        return 10
    if positions is False or positions is None:
        return 0
    if not isinstance(positions, int) or positions < 0:
        raise ValueError(f"positions must be False, True or a number of positions, got {positions!r}")
    return positions


def _rank_chunks(scores: Tensor, labels: Tensor, lengths: Tensor) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
    """Padded ``[g, L]`` chunks of whole requests, at most ~``_RANK_CHUNK`` cells each."""
    r = lengths.numel()
    if r == 0:
        return
    step = max(1, _RANK_CHUNK // max(1, int(lengths.max())))
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    for a in range(0, r, step):
        b = min(r, a + step)
        index, mask = pad_index(lengths[a:b])
        lo = int(offsets[a])
        index = index + lo
        yield scores[index].masked_fill(~mask, 0), labels[index].masked_fill(~mask, 0), mask


def flat_stats(scores: Tensor, labels: Tensor, lengths: Tensor, *, p: Tensor | None = None,
               position: Tensor | None = None, fields: Mapping[str, Tensor] | None = None,
               request_key=None, ks: int | Sequence[int | None] | None = (1, 3, 5, 10),
               gain: str = "exp", empty: str = "skip", ties: str = "average", bins: int = 15,
               binning: str = "quantile", positions: bool | int = False,
               include: Sequence[str] = RANKING, calibration: bool = True, auc: bool = True,
               hist_bins: int | None = None, auc_tolerance: float | None = None) -> RequestStats:
    """The per-request statistics of flat scores of requests stored one after another.

    Args:
        scores: ``[N]`` ranking scores (logits). labels: ``[N]`` graded labels >= 0 (clicks:
            ``label > 0``). lengths: ``[R]`` impressions per request, in storage order.
        p: ``[N]`` probabilities for the calibration metrics (default ``σ(scores)``).
        position: ``[N]`` 1-based display positions (``pcoc@pos{i}``, ``f_ece@position`` over
            positions 1..``positions``). fields: ``{name: [N] int codes}`` (``f_ece@{name}``).
        request_key: ``[R]`` request ids.
        ks, gain, empty, ties, bins, binning, positions: the metric conventions
            (:class:`~hybridrank.metrics.list_metrics.ListMetrics`; the keyword arguments of a
            metrics config; ``hist_bins`` and ``auc_tolerance`` concern streaming only and are
            ignored).
        include: which ranking metrics (a subset of ``ndcg``, ``map``, ``mrr``, ``gauc``; empty:
            no ranking columns). calibration: log loss, NE, ECE, PCOC, CTR. auc: global AUC.

    Returns:
        :class:`RequestStats` over the requests with at least one impression.

    >>> st = flat_stats(torch.tensor([2., 1., 0.]), torch.tensor([0., 1., 1.]),
    ...                 torch.tensor([2, 1]), ks=(None,))
    >>> round(st.point()["ndcg"], 6), st.point()["auc"]   # 2nd request: one item, NDCG 1; AUC: both clicks below
    (0.815465, 0.0)
    """
    del hist_bins, auc_tolerance  # streaming-only options of a metrics config
    kk, _ = resolve_ks(tuple(ks) if ks is not None and not isinstance(ks, int) else ks)
    check_options(empty=empty, gain=gain, ties=ties)
    check_binning(bins, binning)
    unknown = sorted(set(include) - set(RANKING))
    if unknown:
        raise ValueError(f"unknown ranking metrics {unknown}; choose from {RANKING}")
    n_positions = _positions(positions)
    scores, labels = torch.as_tensor(scores).detach(), torch.as_tensor(labels).detach()
    lengths = torch.as_tensor(lengths).detach().long().reshape(-1).cpu()
    n = scores.shape[0] if scores.dim() else -1
    if scores.dim() != 1 or labels.shape != scores.shape:
        raise ValueError(f"scores and labels must be [N] of one shape, got {tuple(scores.shape)} "
                         f"and {tuple(labels.shape)}")
    if bool((lengths < 0).any()) or int(lengths.sum()) != n:
        raise ValueError(f"lengths must be >= 0 and sum to the {n} impressions, got sum "
                         f"{int(lengths.sum())}")
    if request_key is not None:
        request_key = np.asarray(request_key)
        if request_key.shape[0] != lengths.shape[0]:
            raise ValueError(f"request_key has {request_key.shape[0]} entries for "
                             f"{lengths.shape[0]} requests")
        request_key = request_key[(lengths > 0).numpy()]
    lengths = lengths[lengths > 0]  # a request without an impression is not a request
    r = lengths.numel()
    scores, labels = scores.cpu(), labels.cpu()
    if p is not None:
        p = torch.as_tensor(p).detach().cpu().double().reshape(-1)
        if p.shape != scores.shape:
            raise ValueError(f"p has shape {tuple(p.shape)}, expected [{n}]")
    needs_p = calibration or bool(fields) or (n_positions and position is not None)
    _check_flat(labels, p if needs_p else None)
    if scores.is_floating_point() and bool(torch.isnan(scores).any()):
        raise ValueError("scores contains NaN at a real impression")
    if needs_p and p is None:
        p = torch.sigmoid(scores.double())
    row = torch.repeat_interleave(torch.arange(r), lengths)
    y = (labels > 0).double()
    # the final figures are computed in float64 (order and ties of float32 scores are kept)
    scores, labels = scores.double(), labels.double()

    cols: dict[str, Tensor] = {}
    if include:
        parts = [ranking_sums(s, lab, mask=m, ks=kk, gain=gain, empty=empty, ties=ties, include=include)
                 for s, lab, m in _rank_chunks(scores, labels, lengths)]
        if not parts:  # no request: the (empty) columns of an empty chunk
            parts = [ranking_sums(torch.zeros(0, 0), torch.zeros(0, 0),
                                  mask=torch.zeros(0, 0, dtype=torch.bool), ks=kk, include=include)]
        cols.update({name: torch.cat([q[name] for q in parts]) for name in parts[0]})
    cell_fields: dict[str, tuple[Tensor, int]] = {}
    values: dict[str, Tensor] = {}
    for name, codes in (fields or {}).items():
        codes = torch.as_tensor(codes).detach().cpu().reshape(-1)
        if codes.shape != scores.shape or codes.is_floating_point() or codes.dtype == torch.bool:
            raise ValueError(f"field {name!r}: codes must be an int tensor of shape [{n}], got "
                             f"{codes.dtype} {tuple(codes.shape)}")
        uniq, inv = torch.unique(codes, return_inverse=True)
        values[name] = uniq
        cell_fields[name] = (inv.reshape(-1), int(uniq.numel()))
    use_pos = bool(n_positions) and position is not None
    if use_pos:
        position = torch.as_tensor(position).detach().cpu().reshape(-1)
        if position.shape != scores.shape:
            raise ValueError(f"position has shape {tuple(position.shape)}, expected [{n}]")
        values["position"] = torch.arange(1, n_positions + 1)
    cols.update(impression_sums(
        p if p is not None else y, y, row, r, bins=bins,
        bin_idx=bin_index(p, bins, binning) if calibration else None,
        position=position if use_pos else None, n_positions=n_positions if use_pos else 0,
        fields=cell_fields, auc_bucket=score_buckets(scores) if auc else None,
        calibration=calibration))
    mets = metric_statistics(ks=kk, empty=empty, include=include, calibration=calibration,
                             auc=auc, n_positions=n_positions if use_pos else 0, fields=list(cell_fields))
    conv = dict(ks=list(kk), gain=gain, empty=empty, ties=ties, bins=bins, binning=binning,
                positions=n_positions)
    return RequestStats(cols, mets, lengths.double().numpy(),
                        torch.bincount(row, y, minlength=r).numpy(), request_key, values, conv)


def list_stats(scores: Tensor, labels: Tensor, *, mask: Tensor, p: Tensor | None = None,
               position: Tensor | None = None, fields: Mapping[str, Tensor] | None = None,
               request_key=None, **options) -> RequestStats:
    """:func:`flat_stats` of padded lists: ``scores``, ``labels``, ``mask`` (and ``p``,
    ``position``, field codes) all ``[G, L]``; all-padding rows are not requests.

    >>> s = torch.tensor([[2., 1.], [1., 1.]]); y = torch.tensor([[0., 1.], [0., 0.]])
    >>> st = list_stats(s, y, mask=torch.ones(2, 2, dtype=torch.bool), ks=None)
    >>> round(st.point()["ndcg"], 6), st.n_requests, st.point()["gauc"]   # 2nd list: skipped
    (0.63093, 2, 0.0)
    """
    for name, t in (("scores", scores), ("labels", labels), ("mask", mask)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch tensor, got {type(t).__name__}")
    if scores.dim() != 2 or scores.shape != labels.shape or scores.shape != mask.shape:
        raise ValueError("scores, labels and mask must share one [G, L] shape, got "
                         f"{tuple(scores.shape)}, {tuple(labels.shape)}, {tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor, got {mask.dtype}")

    def flat(t, name):
        if t is None:
            return None
        t = torch.as_tensor(t)
        if t.shape != mask.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(mask.shape)}")
        return t[mask]

    return flat_stats(scores[mask], labels[mask], mask.sum(1), p=flat(p, "p"),
                      position=flat(position, "position"),
                      fields={n: flat(c, f"field {n!r}") for n, c in (fields or {}).items()},
                      request_key=request_key, **options)


def ranking_stats(scores, labels, *, mask, ks: int | Sequence[int | None] | None = 10,
                  gain: str = "exp", empty: str = "skip", ties: str = "average",
                  request_key=None, include: Sequence[str] = RANKING) -> RequestStats:
    """Per-request ranking statistics only: ``ndcg@k`` per k, ``map``, ``mrr``, ``gauc`` (and the
    list counts) of padded ``[G, L]`` scores (any monotone score, not only probabilities)."""
    return list_stats(scores, labels, mask=mask, request_key=request_key, ks=ks, gain=gain, empty=empty,
                      ties=ties, include=include, calibration=False, auc=False)


def calibration_stats(p, labels, *, mask, bins: int = 15, binning: str = "quantile",
                      request_key=None) -> RequestStats:
    """Per-request calibration statistics only: ``logloss``, ``ne``, ``ece``, ``pcoc``, ``ctr``
    of padded ``[G, L]`` probabilities.

    >>> p = torch.tensor([[0.2, 0.4], [0.6, 0.0]]); y = torch.tensor([[0., 1.], [0., 0.]])
    >>> m = torch.tensor([[True, True], [True, False]])
    >>> round(calibration_stats(p, y, mask=m).point()["pcoc"], 6)
    1.2
    """
    return list_stats(p, labels, mask=mask, p=p, request_key=request_key, bins=bins, binning=binning,
                      include=(), auc=False)


def field_stats(p, labels, *, mask, fields: Mapping[str, Any], request_key=None) -> RequestStats:
    """Per-request statistics of the field-level ECE ``f_ece@{field}`` of each field only.

    >>> p = torch.tensor([[0.2, 0.2], [0.3, 0.3]]); y = torch.tensor([[1., 0.], [0., 0.]])
    >>> m = torch.ones(2, 2, dtype=torch.bool)
    >>> round(field_stats(p, y, mask=m, fields={"c": torch.tensor([[0, 0], [1, 1]])}).point()["f_ece@c"], 6)
    0.3
    """
    return list_stats(p, labels, mask=mask, p=p, fields=fields, request_key=request_key, include=(),
                      calibration=False, auc=False)


def split_stats(data, logits: Tensor, *, p: Tensor | None = None,
                fields: Mapping[str, Tensor] | None = None, **conventions) -> RequestStats:
    """:func:`flat_stats` of flat ``[N]`` logits on a split (``ListData``): its requests in
    storage order, its labels and display positions. ``conventions`` as :func:`flat_stats`
    (a model's ``metric_conventions``); ``fields``: ``{name: [N] int codes}``."""
    return flat_stats(logits, data.label, data.lengths, p=p, position=data.position, fields=fields,
                      **conventions)


def frame_stats(frame, *, score: str = "pctr", label: str = "label", request: str = "request_id",
                ks: Sequence[int | None] = (10,), empty: str = "skip", bins: int = 15,
                binning: str = "quantile") -> RequestStats:
    """Ranking + calibration statistics of an export frame (rows sorted by request).

    ``score`` is the probability for calibration and the ranking score.
    """
    for c in (score, label, request):
        if c not in frame.columns:
            raise ValueError(f"column {c!r} not in the frame (columns: {frame.columns})")
    for c in (score, label):
        if frame[c].null_count():
            raise ValueError(f"column {c!r} holds {frame[c].null_count()} missing value(s)")
    offsets, keys = request_offsets(frame[request])
    p = torch.from_numpy(frame[score].to_numpy().astype(np.float64))
    y = torch.from_numpy(frame[label].to_numpy().astype(np.float64))
    return flat_stats(p, y, torch.from_numpy(np.diff(offsets)), p=p, request_key=keys, ks=ks,
                      empty=empty, bins=bins, binning=binning)


def ratio_stats(num, den, *, name: str = "mean", sizes=None, positives=None, request_key=None,
                scale: float = 1.0) -> RequestStats:
    """Statistics of one ratio of per-request sums, ``scale * sum_r num_r / sum_r den_r``.

    A per-request mean is ``ratio_stats(values, ones)``; a CTR ``ratio_stats(clicks, impressions)``.

    Args:
        num, den: ``[R]`` per-request sums. sizes: ``[R]`` impressions (default ``den``).
        positives, request_key: optional ``[R]`` (see :class:`RequestStats`).

    >>> ratio_stats(np.array([1.0, 0.0, 2.0]), np.array([2.0, 2.0, 4.0]), name="ctr").point()
    {'ctr': 0.375}
    """
    num, den = as_float64(num), as_float64(den)
    if num.shape != den.shape or num.ndim != 1:
        raise ValueError(f"num and den must be [R] of one shape, got {num.shape} and {den.shape}")
    sz = den if sizes is None else as_float64(sizes)
    pos = None if positives is None else as_float64(positives)
    return RequestStats({f"{name}:num": num, f"{name}:den": den},
                        {name: ratio(f"{name}:num", f"{name}:den", scale=scale)}, sz, pos,
                        None if request_key is None else np.asarray(request_key))


def request_offsets(request_ids) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets [R + 1], keys [R])`` of contiguous runs of request ids (storage order).

    Raises ``ValueError`` when an id appears in two separate runs (the rows are not sorted by
    request) or when an id is missing.

    >>> off, key = request_offsets(np.array([7, 7, 3, 5, 5]))
    >>> off.tolist(), key.tolist()
    ([0, 2, 3, 5], [7, 3, 5])
    """
    if hasattr(request_ids, "to_numpy"):
        if hasattr(request_ids, "null_count") and request_ids.null_count():
            raise ValueError(f"request ids hold {request_ids.null_count()} missing value(s)")
        request_ids = request_ids.to_numpy()
    ids = np.asarray(request_ids)
    if ids.ndim != 1:
        raise ValueError(f"request ids must be 1-d, got shape {ids.shape}")
    n = ids.shape[0]
    new = np.ones(n, dtype=bool)
    if n > 1:
        new[1:] = ids[1:] != ids[:-1]
    starts = np.flatnonzero(new)
    keys = ids[starts]
    uniq, first, counts = np.unique(keys, return_index=True, return_counts=True)
    if uniq.shape[0] != keys.shape[0]:
        bad = uniq[counts > 1][0]
        rows = starts[np.flatnonzero(keys == bad)][:2]
        raise ValueError(f"request id {bad!r} appears in separate runs (rows {rows[0]} and {rows[1]}): "
                         "rows must be sorted by request, as exports are")
    return np.append(starts, n).astype(np.int64), keys
