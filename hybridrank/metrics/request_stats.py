"""Per-request sufficient statistics: every metric as a function of sums over requests.

A :class:`RequestStats` holds ``columns`` (name -> ``[R]`` or ``[R, m]`` float64 per-request sums,
computed once, vectorised) and ``metrics`` (name -> :class:`Statistic`, a function of the column
totals). Summing the columns over requests gives the point estimate; weighting them with resample
counts gives a bootstrap replicate (:mod:`hybridrank.metrics.uncertainty`). Point estimates equal the
one-shot functions of :mod:`hybridrank.metrics` with the same conventions:

- ``ndcg@k``, ``map``, ``mrr``: sum of the per-list value over valid lists / number of valid lists
  (``empty`` and ``ties`` as in :mod:`hybridrank.metrics`; under ``empty="skip"`` lists without a
  positive are not valid, so the denominator is itself resampled).
- ``gauc``: ``sum_g n_g AUC_g / sum_g n_g`` over lists with both classes.
- ``logloss`` (clipped as :func:`hybridrank.metrics.calibration.log_loss`), ``ne``, ``pcoc``, ``ctr``: ratios
  of per-request sums (log-loss sum, count, sum p, sum y).
- ``ece``: per-request, per-bin sums of p and y. **Approximation**: the bin of every impression
  is fixed once from the full sample (quantile edges of the full sample's p, the rule of
  :func:`hybridrank.metrics.calibration.bin_index`); a replicate does not recompute its own quantiles. The
  point estimate is exact; replicate ECEs differ from "recompute the bins" by the few impressions
  whose bin would move.
- global ``auc`` is not a sum over requests and is not offered.

All-padding rows of ``[G, L]`` inputs are not requests and are dropped (``R <= G``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hybridrank.lists import pad_index
from hybridrank.metrics.calibration import EPS, _check_binning, bin_index
from hybridrank.metrics.ranking import (
    _check_options,
    _resolve_ks,
    auc_per_list,
    average_precision_per_list,
    ndcg_per_list,
    reciprocal_rank_per_list,
)

__all__ = ["Statistic", "RequestStats", "ratio", "ratio_stats", "ranking_stats", "calibration_stats",
           "frame_stats", "split_stats", "request_offsets", "check_same_requests"]

Totals = Mapping[str, np.ndarray]
_EINSUM_MAX = 1 << 24  # multiply-adds below which the totals avoid BLAS


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


RANKING = ("ndcg", "map", "mrr", "gauc")


def ranking_stats(scores, labels, mask, *, ks: int | Sequence[int | None] | None = 10,
                  gain: str = "exp", empty: str = "skip", ties: str = "average",
                  request_key=None, include: Sequence[str] = RANKING) -> RequestStats:
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
    unknown = sorted(set(include) - set(RANKING))
    if unknown:
        raise ValueError(f"ranking_stats: unknown metrics {unknown}; choose from {RANKING}")
    keep, sizes, pos, key = _lists(scores, labels, mask, request_key)
    k_np = keep.cpu().numpy()
    has_pos = (labels > 0) & mask
    valid = mask.any(1) & (has_pos.any(1) if empty == "skip" else torch.ones_like(mask[:, 0]))
    v = _f64(valid)[k_np]
    cols = {"lists:valid": v}
    why = ("no valid request (every request lacks a positive label under empty='skip')"
           if empty == "skip" else "no request")
    mets = {}
    if "ndcg" in include:
        nd, _ = ndcg_per_list(scores, labels, mask, k=kk, gain=gain, empty=empty, ties=ties)
        nd = _f64(nd)[k_np]
        for j, k in enumerate(kk):
            name = "ndcg" if k is None else f"ndcg@{k}"
            cols[f"{name}:sum"] = nd[:, j] * v
            mets[name] = ratio(f"{name}:sum", "lists:valid", undefined=why)
    if "map" in include:
        ap, _ = average_precision_per_list(scores, labels, mask, empty=empty)
        cols["map:sum"] = _f64(ap)[k_np] * v
        mets["map"] = ratio("map:sum", "lists:valid", undefined=why)
    if "mrr" in include:
        rr, _ = reciprocal_rank_per_list(scores, labels, mask, empty=empty)
        cols["mrr:sum"] = _f64(rr)[k_np] * v
        mets["mrr"] = ratio("mrr:sum", "lists:valid", undefined=why)
    if "gauc" in include:
        au, au_ok = auc_per_list(scores, labels, mask)
        w = (_f64(mask.sum(1)) * _f64(au_ok))[k_np]
        cols["gauc:num"], cols["gauc:den"] = _f64(au)[k_np] * w, w
        mets["gauc"] = ratio("gauc:num", "gauc:den",
                             undefined="no request has both a positive and a negative")
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
        mask: ``[G, L]`` bool. bins, binning: as :func:`hybridrank.metrics.calibration.ece`.
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


MAX_FIELD_CELLS = 50_000_000
"""``requests x field values`` above which :func:`field_stats` refuses (float64 columns)."""


def field_stats(p, labels, mask, fields: Mapping[str, Any], *, request_key=None) -> RequestStats:
    """Per-request statistics of the field-level ECE ``f_ece@{field}`` of each field.

    ``F-ECE = sum_v |sum_p_v - sum_y_v| / n`` over the values ``v`` of the field
    (:func:`hybridrank.metrics.calibration.field_ece`); the columns are each request's predicted
    and observed clicks per value present, so a bootstrap over requests resamples it exactly.

    Args:
        p, labels, mask: as :func:`calibration_stats`. fields: ``{name: [G, L] int codes}``.

    >>> p = torch.tensor([[0.2, 0.2], [0.3, 0.3]]); y = torch.tensor([[1., 0.], [0., 0.]])
    >>> m = torch.ones(2, 2, dtype=torch.bool)
    >>> round(field_stats(p, y, m, {"c": torch.tensor([[0, 0], [1, 1]])}).point()["f_ece@c"], 6)
    0.3
    """
    keep, sizes, pos, key = _lists(p, labels, mask, request_key)
    k_np = keep.cpu().numpy()
    m = mask.cpu().numpy()
    pf, y = _f64(p.cpu())[m], (_f64(labels.cpu())[m] > 0).astype(np.float64)
    g = m.shape[0]
    row = np.repeat(np.arange(g), m.sum(1))
    cols: dict[str, np.ndarray] = {"fece:n": np.bincount(row, minlength=g)[k_np].astype(np.float64)}
    mets: dict[str, Statistic] = {}
    for name, codes in fields.items():
        c = np.asarray(codes.cpu() if isinstance(codes, torch.Tensor) else codes)
        if c.shape != m.shape:
            raise ValueError(f"field {name!r}: codes have shape {c.shape}, expected {m.shape}")
        values, inv = np.unique(c[m], return_inverse=True)
        v = values.size
        if g * v > MAX_FIELD_CELLS:
            raise ValueError(f"field {name!r}: {g:,} requests x {v:,} values is too many cells for "
                             f"per-request statistics (limit {MAX_FIELD_CELLS:,}); choose a field "
                             f"of lower cardinality")
        cell = row * v + inv.reshape(-1)
        for part, w in (("p", pf), ("y", y)):
            cols[f"fece:{name}:{part}"] = np.bincount(cell, w, minlength=g * v).reshape(g, v)[k_np]

        def fn(t: Totals, name=name) -> tuple[np.ndarray, np.ndarray]:
            n = t["fece:n"]
            ok = n > 0
            diff = np.abs(t[f"fece:{name}:p"] - t[f"fece:{name}:y"]).sum(-1)
            return diff / np.where(ok, n, 1.0), ok

        mets[f"f_ece@{name}"] = Statistic(fn, "no impression")
    return RequestStats(cols, mets, sizes, pos, key)


def frame_stats(frame, *, score: str = "pctr", label: str = "label", request: str = "request_id",
                ks: Sequence[int | None] = (10,), empty: str = "skip", bins: int = 15,
                binning: str = "quantile") -> RequestStats:
    """Ranking + calibration statistics of an export frame (rows sorted by request).

    ``score`` is used as the probability for calibration and as the ranking score.
    """
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


def split_stats(data, logits: torch.Tensor, *, ks: Sequence[int | None] = (10,),
                gain: str = "exp", empty: str = "skip", ties: str = "average", bins: int = 15,
                binning: str = "quantile", include: Sequence[str] = RANKING,
                fields: Mapping[str, torch.Tensor] | None = None) -> RequestStats:
    """Ranking + calibration statistics of flat ``[N]`` logits on a split (``ListData``).

    The probability is ``σ(logit)``; requests are the split's, in storage order; conventions as
    :class:`~hybridrank.metrics.list_metrics.ListMetrics` (the keyword arguments of a metrics config).
    ``fields``: ``{name: [N] int codes}`` adds ``f_ece@{name}`` (:func:`field_stats`).
    """
    from hybridrank.lists import gather_lists

    idx, mask = pad_index(data.lengths)
    p = gather_lists(torch.sigmoid(logits.double()), idx, mask)
    y = gather_lists(data.label.double(), idx, mask)
    rank = ranking_stats(p, y, mask, ks=tuple(ks), gain=gain, empty=empty, ties=ties,
                         include=include)
    out = rank.merge(calibration_stats(p, y, mask, bins=bins, binning=binning))
    if fields:
        out = out.merge(field_stats(p, y, mask, {n: gather_lists(c, idx, mask)
                                                 for n, c in fields.items()}))
    return out


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
