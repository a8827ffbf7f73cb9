"""Bootstrap confidence intervals over requests, and paired comparisons of two score sets.

The resampling unit is the **request**: impressions of one request share a user, a context and a
slate, so they are not independent and resampling impressions would give intervals that are too
narrow. Every metric here is a function of **sums of per-request statistics**, computed once:

- a :class:`RequestStats` holds ``columns`` (name -> ``[R]`` or ``[R, m]`` float64 per-request
  sums) and ``metrics`` (name -> :class:`Statistic`, a function of the column totals);
- a bootstrap replicate draws resample counts ``c [R]`` (how often each request is drawn), forms
  the totals ``c @ X`` for all replicates of a block in **one matrix product**, and evaluates the
  metric functions on them, vectorised over replicates.

Metrics and their per-request statistics (point estimates equal the one-shot functions of
:mod:`hybridrank.metrics` with the same conventions):

- ``ndcg@k``, ``map``, ``mrr``: sum of the per-list value over valid lists / number of valid lists
  (``empty`` and ``ties`` as in :mod:`hybridrank.metrics`; under ``empty="skip"`` lists without a
  positive are not valid, so the denominator is itself resampled).
- ``gauc``: ``sum_g n_g AUC_g / sum_g n_g`` over lists with both classes.
- ``logloss`` (clipped as :func:`hybridrank.metrics.log_loss`), ``ne``, ``pcoc``, ``ctr``: ratios
  of per-request sums (log-loss sum, count, sum p, sum y).
- ``ece``: per-request, per-bin sums of p and y. **Approximation**: the bin of every impression
  is fixed once from the full sample (quantile edges of the full sample's p, the rule of
  :func:`hybridrank.metrics.bin_index`); a replicate does not recompute its own quantiles. The
  point estimate is exact; replicate ECEs differ from "recompute the bins" by the few impressions
  whose bin would move, which is negligible next to the sampling spread at realistic sizes.
- global ``auc`` is not a sum over requests and is not offered here.

A replicate where a metric is undefined (no valid list, no positive, a single class) is left out;
if more than ``alpha / 2`` of the replicates are undefined the interval is reported as not
computable, with the reason, and never as NaN.

Reference: Efron & Tibshirani 1993, *An Introduction to the Bootstrap*, ch. 13 (percentile
intervals) and ch. 16 (bootstrap tests); Hanley & MacGibbon 2006 for the Poisson bootstrap.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from .calibration_metrics import EPS, bin_index
from .metrics import (
    _check_binning,
    _check_options,
    _resolve_ks,
    auc_per_list,
    average_precision_per_list,
    ndcg_per_list,
    reciprocal_rank_per_list,
)

__all__ = [
    "Statistic", "RequestStats", "Interval", "PairedResult", "ratio", "ratio_stats",
    "ranking_stats", "calibration_stats", "frame_stats", "request_offsets", "resample_counts",
    "bootstrap_replicates", "bootstrap", "paired_bootstrap", "compare_bootstrap", "check_same_requests",
    "format_interval",
]

Totals = Mapping[str, np.ndarray]
_SCHEMES = ("multinomial", "poisson")
_BLOCK_ELEMS = 1 << 22  # resample counts held at once: replicates per block x requests
_EINSUM_MAX = 1 << 24  # multiply-adds below which the totals avoid BLAS


# --- per-request statistics ------------------------------------------------------------------


@dataclass(frozen=True)
class Statistic:
    """A metric as a function of column totals: ``fn(totals) -> (value [B], defined [B])``.

    ``totals`` maps every column to its ``[B]`` (or ``[B, m]``) weighted sums over requests, one
    row per replicate. ``undefined`` says why a value can be undefined (reported with it).
    """

    fn: Callable[[Totals], tuple[np.ndarray, np.ndarray]]
    undefined: str = "undefined"


def ratio(num: str, den: str, *, scale: float = 1.0, undefined: str = "zero denominator") -> Statistic:
    """``scale * sum(num) / sum(den)``, defined where ``sum(den) > 0``.

    >>> s = ratio("clicks", "n")
    >>> s.fn({"clicks": np.array([3.0]), "n": np.array([4.0])})
    (array([0.75]), array([ True]))
    """

    def fn(t: Totals) -> tuple[np.ndarray, np.ndarray]:
        d = t[den]
        ok = d > 0
        return np.where(ok, t[num] / np.where(ok, d, 1.0), 0.0) * scale, ok

    return Statistic(fn, undefined)


def _f64(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        x = x.double() if x.is_floating_point() or x.dtype == torch.bool else x
    return np.asarray(x, dtype=np.float64)


@dataclass(frozen=True)
class RequestStats:
    """Per-request sufficient statistics of one score set, and the metrics built on them.

    Attributes:
        columns: name -> ``[R]`` or ``[R, m]`` float64 per-request sums.
        metrics: name -> :class:`Statistic` over the column totals.
        sizes: ``[R]`` impressions per request (checked by the paired test).
        positives: ``[R]`` positive labels per request, or None (unlabelled statistics).
        request_key: ``[R]`` request ids, or None.
    """

    columns: Mapping[str, np.ndarray]
    metrics: Mapping[str, Statistic]
    sizes: np.ndarray
    positives: np.ndarray | None = None
    request_key: np.ndarray | None = field(default=None)

    def __post_init__(self) -> None:
        r = self.sizes.shape[0]
        for name, col in self.columns.items():
            if col.shape[:1] != (r,) or col.ndim > 2:
                raise ValueError(f"column {name!r} has shape {col.shape}, expected [{r}] or [{r}, m]")
            if not np.isfinite(col).all():
                raise ValueError(f"column {name!r} holds NaN or infinite values")
        for name, arr in (("positives", self.positives), ("request_key", self.request_key)):
            if arr is not None and len(arr) != r:
                raise ValueError(f"{name} has length {len(arr)}, expected {r} requests")

    @property
    def n_requests(self) -> int:
        return int(self.sizes.shape[0])

    @property
    def n_positives(self) -> int | None:
        return None if self.positives is None else int(self.positives.sum())

    def totals(self, weights: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Column totals: plain sums (a ``[1]`` row) or ``weights [B, R] @ column``."""
        w = np.ones((1, self.n_requests)) if weights is None else weights
        if not self.columns:
            return {}
        names = list(self.columns)
        x = np.concatenate([self.columns[n].reshape(self.n_requests, -1) for n in names], axis=1)
        if w.shape[0] * x.size <= _EINSUM_MAX:
            # small products without BLAS threads: their busy-waiting stalls torch's thread pool
            # when bootstraps and torch ops alternate (measured 10-25x slower on 2 busy cores)
            t = np.einsum("br,rd->bd", w, x, optimize=False)
        else:
            t = w @ x
        out, j = {}, 0
        for n in names:
            m = 1 if self.columns[n].ndim == 1 else self.columns[n].shape[1]
            out[n] = t[:, j] if self.columns[n].ndim == 1 else t[:, j:j + m]
            j += m
        return out

    def point(self) -> dict[str, float | None]:
        """Each metric on the full sample; None where undefined."""
        t = self.totals()
        out = {}
        for name, s in self.metrics.items():
            v, ok = s.fn(t)
            out[name] = float(v[0]) if bool(ok[0]) else None
        return out

    def merge(self, other: RequestStats) -> RequestStats:
        """The union of two statistics of the same requests (e.g. ranking + calibration)."""
        check_same_requests(self, other)
        clash = set(self.metrics) & set(other.metrics)
        if clash:
            raise ValueError(f"both statistics define the metrics {sorted(clash)}")
        cols = dict(self.columns)
        for n, c in other.columns.items():
            if n in cols and not np.array_equal(cols[n], c):
                raise ValueError(f"column {n!r} differs between the two statistics")
            cols[n] = c
        pos = self.positives if self.positives is not None else other.positives
        key = self.request_key if self.request_key is not None else other.request_key
        return RequestStats(cols, {**self.metrics, **other.metrics}, self.sizes, pos, key)


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
    num, den = _f64(num), _f64(den)
    if num.shape != den.shape or num.ndim != 1:
        raise ValueError(f"num and den must be [R] of one shape, got {num.shape} and {den.shape}")
    sz = den if sizes is None else _f64(sizes)
    pos = None if positives is None else _f64(positives)
    return RequestStats({f"{name}:num": num, f"{name}:den": den},
                        {name: ratio(f"{name}:num", f"{name}:den", scale=scale)}, sz, pos,
                        None if request_key is None else np.asarray(request_key))


def _lists(scores, labels, mask, request_key):
    if not (isinstance(scores, torch.Tensor) and isinstance(labels, torch.Tensor)
            and isinstance(mask, torch.Tensor)):
        raise ValueError("scores, labels and mask must be torch tensors of one [G, L] shape")
    if scores.dim() != 2 or scores.shape != labels.shape or scores.shape != mask.shape:
        raise ValueError("scores, labels and mask must share one [G, L] shape, got "
                         f"{tuple(scores.shape)}, {tuple(labels.shape)}, {tuple(mask.shape)}")
    keep = mask.any(1)  # all-padding rows are not requests (hybridrank.metrics convention)
    if request_key is not None:
        request_key = np.asarray(request_key)
        if request_key.shape[0] != mask.shape[0]:
            raise ValueError(f"request_key has {request_key.shape[0]} entries for {mask.shape[0]} lists")
        request_key = request_key[keep.cpu().numpy()]
    sizes = _f64(mask.sum(1))[keep.cpu().numpy()]
    pos = _f64(((labels > 0) & mask).sum(1))[keep.cpu().numpy()]
    return keep, sizes, pos, request_key


def ranking_stats(scores, labels, mask, *, ks: int | Sequence[int | None] | None = 10,
                  gain: str = "exp", empty: str = "skip", ties: str = "average",
                  request_key=None) -> RequestStats:
    """Per-request ranking statistics: ``ndcg@k`` per k, ``map``, ``mrr``, ``gauc``.

    Conventions (``gain``, ``empty``, ``ties``) as in :mod:`hybridrank.metrics`, whose
    ``*_per_list`` functions compute the values. All-padding rows are not requests.

    Args:
        scores, labels: ``[G, L]`` tensors. mask: ``[G, L]`` bool. ks: NDCG cut-offs.
        request_key: optional ``[G]`` request ids.

    >>> s = torch.tensor([[2., 1.], [1., 1.]]); y = torch.tensor([[0., 1.], [0., 0.]])
    >>> st = ranking_stats(s, y, torch.ones(2, 2, dtype=torch.bool), ks=None)
    >>> round(st.point()["ndcg"], 6), st.n_requests, st.point()["gauc"]   # 2nd list: skipped
    (0.63093, 2, 0.0)
    """
    kk, _ = _resolve_ks(ks)
    _check_options(empty=empty, gain=gain, ties=ties)
    keep, sizes, pos, key = _lists(scores, labels, mask, request_key)
    k_np = keep.cpu().numpy()
    nd, valid = ndcg_per_list(scores, labels, mask, k=kk, gain=gain, empty=empty, ties=ties)
    ap, _ = average_precision_per_list(scores, labels, mask, empty=empty)
    rr, _ = reciprocal_rank_per_list(scores, labels, mask, empty=empty)
    au, au_ok = auc_per_list(scores, labels, mask)
    v = _f64(valid)[k_np]
    nd = _f64(nd)[k_np]
    w = (_f64(mask.sum(1)) * _f64(au_ok))[k_np]
    cols = {"lists:valid": v, "map:sum": _f64(ap)[k_np] * v, "mrr:sum": _f64(rr)[k_np] * v,
            "gauc:num": _f64(au)[k_np] * w, "gauc:den": w}
    why = ("no valid request (every request lacks a positive label under empty='skip')"
           if empty == "skip" else "no request")
    mets = {}
    for j, k in enumerate(kk):
        name = "ndcg" if k is None else f"ndcg@{k}"
        cols[f"{name}:sum"] = nd[:, j] * v
        mets[name] = ratio(f"{name}:sum", "lists:valid", undefined=why)
    mets["map"] = ratio("map:sum", "lists:valid", undefined=why)
    mets["mrr"] = ratio("mrr:sum", "lists:valid", undefined=why)
    mets["gauc"] = ratio("gauc:num", "gauc:den", undefined="no request has both a positive and a negative")
    return RequestStats(cols, mets, sizes, pos, key)


def _ne(t: Totals) -> tuple[np.ndarray, np.ndarray]:
    n, y = t["cal:n"], t["cal:sum_y"]
    ok = (y > 0) & (y < n)
    q = np.where(ok, y / np.where(n > 0, n, 1.0), 0.5)
    h = -(q * np.log(q) + (1 - q) * np.log1p(-q))
    return np.where(ok, t["cal:ll"] / np.where(n > 0, n, 1.0) / h, 0.0), ok


def _ece(t: Totals) -> tuple[np.ndarray, np.ndarray]:
    n = t["cal:n"]
    ok = n > 0
    return np.abs(t["ece:bin_p"] - t["ece:bin_y"]).sum(-1) / np.where(ok, n, 1.0), ok


def calibration_stats(p, labels, mask, *, bins: int = 15, binning: str = "quantile",
                      request_key=None) -> RequestStats:
    """Per-request calibration statistics: ``logloss``, ``ne``, ``pcoc``, ``ece``, ``ctr``.

    ``logloss = sum ll / n`` (p clipped to ``[1e-7, 1 - 1e-7]``), ``ne = logloss / H(ctr)``,
    ``pcoc = sum p / sum y``, ``ctr = sum y / n`` and ``ece = sum_b |sum_p_b - sum_y_b| / n``,
    bins fixed once from the full sample (module docstring).

    Args:
        p: ``[G, L]`` probabilities in [0, 1]. labels: ``[G, L]`` (``y = label > 0``).
        mask: ``[G, L]`` bool. bins, binning: as :func:`hybridrank.metrics.ece`.
        request_key: optional ``[G]`` request ids.

    >>> p = torch.tensor([[0.2, 0.4], [0.6, 0.0]]); y = torch.tensor([[0., 1.], [0., 0.]])
    >>> m = torch.tensor([[True, True], [True, False]])
    >>> round(calibration_stats(p, y, m).point()["pcoc"], 6)
    1.2
    """
    _check_binning(bins, binning)
    keep, sizes, pos, key = _lists(p, labels, mask, request_key)
    k_np = keep.cpu().numpy()
    m = mask.cpu().numpy()
    pf, yf = _f64(p.cpu())[m], _f64(labels.cpu())[m]
    for name, arr in (("p", pf), ("labels", yf)):
        if np.isnan(arr).any():
            raise ValueError(f"{name} contains NaN at a real impression")
    if ((pf < 0) | (pf > 1)).any():
        raise ValueError("p must lie in [0, 1] at real impressions")
    y = (yf > 0).astype(np.float64)
    g, width = m.shape
    row = np.repeat(np.arange(g), m.sum(1))  # row-major order of p[mask]
    q = np.clip(pf, EPS, 1 - EPS)
    ll = -(y * np.log(q) + (1 - y) * np.log1p(-q))
    b = bin_index(torch.from_numpy(pf), bins, binning).numpy()
    cell = row * bins + b

    def per_row(w):
        return np.bincount(row, w, minlength=g)[k_np]

    def per_cell(w):
        return np.bincount(cell, w, minlength=g * bins).reshape(g, bins)[k_np]

    cols = {"cal:ll": per_row(ll), "cal:n": per_row(np.ones_like(pf)), "cal:sum_p": per_row(pf),
            "cal:sum_y": per_row(y), "ece:bin_p": per_cell(pf), "ece:bin_y": per_cell(y)}
    mets = {"logloss": ratio("cal:ll", "cal:n", undefined="no impression"),
            "ne": Statistic(_ne, "labels have a single class"),
            "pcoc": ratio("cal:sum_p", "cal:sum_y", undefined="no positive label"),
            "ece": Statistic(_ece, "no impression"),
            "ctr": ratio("cal:sum_y", "cal:n", undefined="no impression")}
    return RequestStats(cols, mets, sizes, pos, key)


def frame_stats(frame, *, score: str = "pctr", label: str = "label", request: str = "request_id",
                ks: Sequence[int | None] = (10,), empty: str = "skip", bins: int = 15,
                binning: str = "quantile") -> RequestStats:
    """Ranking + calibration statistics of an export frame (rows sorted by request).

    ``score`` is used as the probability for calibration and as the ranking score.
    """
    from .lists import pad_index  # local: keep the module importable without the data layer

    for c in (score, label, request):
        if c not in frame.columns:
            raise ValueError(f"column {c!r} not in the frame (columns: {frame.columns})")
    offsets, keys = request_offsets(frame[request])
    idx, mask = pad_index(torch.from_numpy(np.diff(offsets)))
    p = torch.from_numpy(frame[score].to_numpy().astype(np.float64))[idx]
    y = torch.from_numpy(frame[label].to_numpy().astype(np.float64))[idx]
    p, y = p.masked_fill(~mask, 0.0), y.masked_fill(~mask, 0.0)
    rank = ranking_stats(p, y, mask, ks=tuple(ks), empty=empty, request_key=keys)
    return rank.merge(calibration_stats(p, y, mask, bins=bins, binning=binning, request_key=keys))


# --- resampling --------------------------------------------------------------------------------


def resample_counts(n_requests: int, n_boot: int, *, seed: int = 0,
                    scheme: str = "multinomial") -> Iterator[np.ndarray]:
    """Blocks of bootstrap resample counts, ``[b, R]`` int64, ``n_boot`` rows in all.

    ``"multinomial"`` (Efron's bootstrap): each replicate draws ``R`` requests uniformly with
    replacement; row ``i`` counts how often each request was drawn (rows sum to ``R``).
    ``"poisson"``: independent ``Poisson(1)`` counts (rows sum to ``R`` only on average), the
    streaming-friendly approximation. The blocks, and so the counts, depend only on
    ``(n_requests, n_boot, seed, scheme)``.

    >>> sum(int(c.sum()) for c in resample_counts(5, 3, seed=1)) == 5 * 3
    True
    """
    if scheme not in _SCHEMES:
        raise ValueError(f"scheme must be one of {_SCHEMES}, got {scheme!r}")
    if not isinstance(n_boot, int) or n_boot < 1:
        raise ValueError(f"n_boot must be a positive int, got {n_boot!r}")
    if n_requests < 1:
        raise ValueError("cannot resample zero requests")
    rng = np.random.default_rng(seed)
    block = max(1, min(n_boot, _BLOCK_ELEMS // n_requests))
    done = 0
    while done < n_boot:
        b = min(block, n_boot - done)
        if scheme == "multinomial":
            draw = rng.integers(0, n_requests, size=(b, n_requests))
            draw += n_requests * np.arange(b)[:, None]
            yield np.bincount(draw.ravel(), minlength=b * n_requests).reshape(b, n_requests)
        else:
            yield rng.poisson(1.0, size=(b, n_requests))
        done += b


def _replicates(stats_list: Sequence[RequestStats], names: Sequence[str], n_boot: int, seed: int,
                scheme: str) -> list[dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Replicate values of the named metrics of several statistics under the SAME counts."""
    r = stats_list[0].n_requests
    names = list(dict.fromkeys(names))  # a repeated name would collect its replicates twice
    acc = [{n: ([], []) for n in names} for _ in stats_list]
    for counts in resample_counts(r, n_boot, seed=seed, scheme=scheme):
        w = counts.astype(np.float64)
        for st, out in zip(stats_list, acc):
            t = st.totals(w)
            for n in names:
                v, ok = st.metrics[n].fn(t)
                out[n][0].append(v)
                out[n][1].append(ok)
    return [{n: (np.concatenate(v), np.concatenate(ok)) for n, (v, ok) in out.items()} for out in acc]


def _names(stats: RequestStats, metrics: Sequence[str] | None) -> list[str]:
    names = list(stats.metrics) if metrics is None else list(dict.fromkeys(metrics))
    unknown = [n for n in names if n not in stats.metrics]
    if unknown:
        raise ValueError(f"unknown metric(s) {unknown}; available: {list(stats.metrics)}")
    return names


def _check_alpha(alpha: float) -> None:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")


def bootstrap_replicates(stats: RequestStats, *, n_boot: int = 1000, seed: int = 0,
                         scheme: str = "multinomial", metrics: Sequence[str] | None = None,
                         ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The bootstrap distribution: metric -> ``(values [n_boot], defined [n_boot])``.

    Replicate ``i`` is the metric of the totals ``counts[i] @ columns`` with ``counts`` from
    :func:`resample_counts` (same seed, same counts).
    """
    names = _names(stats, metrics)
    return _replicates([stats], names, n_boot, seed, scheme)[0]


@dataclass(frozen=True)
class Interval:
    """A point estimate with its bootstrap percentile interval (None where not computable)."""

    metric: str
    estimate: float | None
    lower: float | None
    upper: float | None
    alpha: float
    n_requests: int
    n_positives: int | None
    n_boot: int
    n_undefined: int
    note: str = ""

    def __str__(self) -> str:
        return format_interval(self)


def _percentile(v: np.ndarray, ok: np.ndarray, alpha: float, why: str) -> tuple[float | None, float | None, str]:
    bad = int((~ok).sum())
    if bad > alpha / 2 * v.shape[0]:
        return None, None, f"no interval: {bad} of {v.shape[0]} resamples undefined ({why})"
    lo, hi = np.quantile(v[ok], [alpha / 2, 1 - alpha / 2])
    note = f"{bad} of {v.shape[0]} resamples undefined ({why}), left out" if bad else ""
    return float(lo), float(hi), note


def bootstrap(stats: RequestStats, *, n_boot: int = 1000, alpha: float = 0.05, seed: int = 0,
              scheme: str = "multinomial", metrics: Sequence[str] | None = None) -> dict[str, Interval]:
    """Seeded percentile bootstrap intervals over requests for every metric of ``stats``.

    ``[q_{alpha/2}, q_{1 - alpha/2}]`` of the replicate values (Efron & Tibshirani 1993, §13.3).
    A metric undefined on the full sample gets ``estimate=None`` and the reason in ``note``.

    Args:
        stats: per-request statistics (``R`` requests). n_boot: replicates. alpha: 1 - level.
        seed, scheme: of :func:`resample_counts`. metrics: a subset of names (default all).

    Returns:
        metric name -> :class:`Interval`.

    >>> st = ratio_stats(np.arange(100.0), np.ones(100), name="mean")
    >>> iv = bootstrap(st, n_boot=200, seed=0)["mean"]
    >>> iv.lower < iv.estimate == 49.5 < iv.upper
    True
    """
    _check_alpha(alpha)
    names = _names(stats, metrics)
    reps = _replicates([stats], names, n_boot, seed, scheme)[0]
    return _intervals(stats, names, reps, alpha, n_boot)


def _intervals(stats: RequestStats, names, reps, alpha: float, n_boot: int) -> dict[str, Interval]:
    point = stats.point()
    out = {}
    for n in names:
        v, ok = reps[n]
        why = stats.metrics[n].undefined
        base = dict(metric=n, alpha=alpha, n_requests=stats.n_requests, n_positives=stats.n_positives,
                    n_boot=n_boot, n_undefined=int((~ok).sum()))
        if point[n] is None:
            out[n] = Interval(estimate=None, lower=None, upper=None, note=f"undefined: {why}", **base)
            continue
        lo, hi, note = _percentile(v, ok, alpha, why)
        out[n] = Interval(estimate=point[n], lower=lo, upper=hi, note=note, **base)
    return out


# --- paired comparison -----------------------------------------------------------------------


def check_same_requests(a: RequestStats, b: RequestStats) -> None:
    """Raise ``ValueError`` saying what differs unless ``a`` and ``b`` cover the same requests.

    Compared in order: request counts, request ids (when both have them), impressions per
    request, positives per request (when both are labelled).
    """
    if a.n_requests != b.n_requests:
        raise ValueError(f"different requests: {a.n_requests} vs {b.n_requests} requests")

    def first_diff(x, y, what):
        diff = np.flatnonzero(np.asarray(x) != np.asarray(y))
        if diff.size:
            i = int(diff[0])
            key = "" if a.request_key is None else f" (id {a.request_key[i]!r})"
            raise ValueError(f"different requests: {what} differ at {diff.size} request(s), first at "
                             f"index {i}{key}: {x[i]!r} vs {y[i]!r}")

    if a.request_key is not None and b.request_key is not None:
        first_diff(a.request_key, b.request_key, "request ids")
    first_diff(a.sizes, b.sizes, "impressions per request")
    if a.positives is not None and b.positives is not None:
        first_diff(a.positives, b.positives, "positive labels per request")


@dataclass(frozen=True)
class PairedResult:
    """Paired bootstrap comparison of one metric, ``diff = a - b`` on the same resamples."""

    metric: str
    a: float | None
    b: float | None
    diff: float | None
    lower: float | None
    upper: float | None
    p_value: float | None
    verdict: str
    alpha: float
    n_requests: int
    n_boot: int
    note: str = ""

    def __str__(self) -> str:
        if self.diff is None:
            return f"{self.metric}: {self.verdict}"
        ci = ("[no interval]" if self.lower is None
              else f"[{self.lower:+.4g}, {self.upper:+.4g}]")
        return f"{self.metric}: {self.diff:+.4g} {ci}, p = {self.p_value:.3g} ({self.verdict})"


def paired_bootstrap(a: RequestStats, b: RequestStats, *, n_boot: int = 1000, alpha: float = 0.05,
                     seed: int = 0, scheme: str = "multinomial",
                     metrics: Sequence[str] | None = None) -> dict[str, PairedResult]:
    """Is metric(a) - metric(b) different from 0? Both score sets on the SAME requests.

    Every replicate weights the requests of ``a`` and ``b`` with the same counts, so the
    request-level noise common to both cancels in the difference ``d* = m(a*) - m(b*)``. Interval:
    percentile of ``d*``. Two-sided p-value (Efron & Tibshirani 1993, §16.4), with the
    Monte-Carlo add-one correction so it is never 0:
    ``p = min(1, 2 (min(#{d* <= 0}, #{d* >= 0}) + 1) / (n + 1))`` over the ``n`` replicates where
    both are defined. ``verdict`` is "significant at 5 %" when ``p < alpha``.

    Args:
        a, b: statistics of two score sets (see :func:`check_same_requests`).
        metrics: names present in both (default: the common ones, in ``a``'s order).

    Returns:
        metric name -> :class:`PairedResult`.
    """
    _check_alpha(alpha)
    check_same_requests(a, b)
    if metrics is None:
        names = [n for n in a.metrics if n in b.metrics]
        if not names:
            raise ValueError("the two statistics share no metric")
    else:
        names = _names(a, metrics)
        _names(b, metrics)
    ra, rb = _replicates([a, b], names, n_boot, seed, scheme)
    return _paired(a, b, names, ra, rb, alpha, n_boot)


def _paired(a, b, names, ra, rb, alpha: float, n_boot: int) -> dict[str, PairedResult]:
    pa, pb = a.point(), b.point()
    level = f"{100 * alpha:g} %"
    out = {}
    for n in names:
        base = dict(metric=n, a=pa[n], b=pb[n], alpha=alpha, n_requests=a.n_requests, n_boot=n_boot)
        if pa[n] is None or pb[n] is None:
            why = a.metrics[n].undefined if pa[n] is None else b.metrics[n].undefined
            out[n] = PairedResult(diff=None, lower=None, upper=None, p_value=None,
                                  verdict=f"no comparison: undefined ({why})", note=why, **base)
            continue
        d = ra[n][0] - rb[n][0]
        ok = ra[n][1] & rb[n][1]
        why = f"{a.metrics[n].undefined} in a resample of one of the two"
        lo, hi, note = _percentile(d, ok, alpha, why)
        m = int(ok.sum())
        if lo is None:
            out[n] = PairedResult(diff=pa[n] - pb[n], lower=None, upper=None, p_value=None,
                                  verdict="no test: " + note, note=note, **base)
            continue
        tail = min(int((d[ok] <= 0).sum()), int((d[ok] >= 0).sum()))
        p = min(1.0, 2 * (tail + 1) / (m + 1))
        verdict = f"significant at {level}" if p < alpha else f"not significant at {level}"
        out[n] = PairedResult(diff=pa[n] - pb[n], lower=lo, upper=hi, p_value=p, verdict=verdict,
                              note=note, **base)
    return out


def compare_bootstrap(stats: Mapping[str, RequestStats], *, baseline: str | None = None,
                      n_boot: int = 1000, alpha: float = 0.05, seed: int = 0, scheme: str = "multinomial",
                      metrics: Sequence[str] | None = None,
                      ) -> tuple[dict[str, dict[str, Interval]], dict[str, dict[str, PairedResult]]]:
    """Intervals for several score sets (runs) on the same requests, and paired tests vs a baseline.

    One set of resample counts serves every run (drawn once), so each run's intervals equal
    :func:`bootstrap` with the same seed and each comparison equals :func:`paired_bootstrap`: the
    building block of benchmark tables.

    Args:
        stats: run name -> statistics, all on the same requests. baseline: the run the others are
            compared with (default the first). metrics: names every run has (default: the
            baseline's that all runs have).

    Returns:
        ``(intervals, paired)``: run -> metric -> :class:`Interval`, and for every run but the
        baseline, run -> metric -> :class:`PairedResult` of ``run - baseline``.
    """
    _check_alpha(alpha)
    if not stats:
        raise ValueError("no statistics to compare")
    runs = list(stats)
    base = runs[0] if baseline is None else baseline
    if base not in stats:
        raise ValueError(f"baseline {base!r} is not one of the runs {runs}")
    for r in runs:
        try:
            check_same_requests(stats[base], stats[r])
        except ValueError as e:
            raise ValueError(f"run {r!r} vs baseline {base!r}: {e}") from None
    if metrics is None:
        names = [n for n in stats[base].metrics if all(n in stats[r].metrics for r in runs)]
    else:
        names = list(dict.fromkeys(metrics))
        for r in runs:
            _names(stats[r], names)
    reps = dict(zip(runs, _replicates([stats[r] for r in runs], names, n_boot, seed, scheme)))
    intervals = {r: _intervals(stats[r], names, reps[r], alpha, n_boot) for r in runs}
    paired = {r: _paired(stats[r], stats[base], names, reps[r], reps[base], alpha, n_boot)
              for r in runs if r != base}
    return intervals, paired


# --- formatting --------------------------------------------------------------------------------


def _decimals(half: float, digits: int | None) -> int:
    if digits is not None:
        return digits
    if half > 0:  # two significant digits of the half-width
        return int(min(6, max(0, 1 - np.floor(np.log10(half)))))
    return 3


def format_interval(iv: Interval, digits: int | None = 3, *, scale: float = 1.0, suffix: str = "") -> str:
    """``"0.516 [0.509, 0.523]"``; ``digits=None`` picks the decimals from the interval width.

    An undefined estimate prints ``"n/a (undefined: reason)"``; a missing interval prints the
    estimate and ``"[no interval]"``. ``scale`` multiplies the numbers (e.g. 100 for percent).

    >>> iv = Interval("ndcg@10", 0.5161, 0.5093, 0.5228, 0.05, 1000, 120, 1000, 0)
    >>> format_interval(iv)
    '0.516 [0.509, 0.523]'
    """
    if iv.estimate is None:
        return f"n/a ({iv.note})"
    d = _decimals(0.0 if iv.lower is None else abs(iv.upper - iv.lower) * scale / 2, digits)
    est = f"{iv.estimate * scale:.{d}f}{suffix}"
    if iv.lower is None:
        return f"{est} [no interval]"
    return f"{est} [{iv.lower * scale:.{d}f}, {iv.upper * scale:.{d}f}]"
