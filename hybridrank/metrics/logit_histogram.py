"""The streaming metrics' logit histogram: adaptive dyadic fine bins that merge exactly.

A fine histogram of ``B`` bins of width ``2^e`` aligned at multiples of ``2^e``: bin ``h`` covers
``[(o + h) 2^e, (o + h + 1) 2^e)``. Per bin it keeps the impressions, summed p, positives, and
the smallest and largest logit (so that a bin holding one distinct logit is known to be exact).
Everything is packed into one float64 tensor ``[e, o, count[B], sum_p[B], positives[B],
min_z[B], max_z[B]]`` so that one reduction function sees the layout. ``e`` is the smallest
exponent (>= HIST_MIN_EXP) at which all logits seen so far fit into ``B`` bins; when new logits
fall outside, the histogram is coarsened to a larger ``e``, which merges aligned bins exactly (a
bin of width ``2^e`` lies inside one bin of width ``2^(e+1)``). The exponent and the offset are
therefore functions of the set of logits seen, not of the order of updates, and two histograms
(two ranks, two streams) merge exactly: the fine bins always span the data's own range, wherever
the scale of the logits puts it.

:class:`~hybridrank.metrics.list_metrics.ListMetrics` keeps one such histogram as a state (its own
DDP reduction is :func:`hist_reduce`) for the streaming global AUC and quantile-bin ECE; the exact
figures of a whole split come from the metric engine (:mod:`hybridrank.metrics.request_stats`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["HIST_MIN_EXP", "HIST_MAX_LOGIT", "hist_empty", "hist_parts", "hist_merge", "hist_reduce",
           "hist_of", "quantile_sums_from_hist"]

HIST_MIN_EXP = -30
"""Finest fine-bin width ``2^-30``: finer than float32 logits resolve near 1."""

HIST_MAX_LOGIT = float(2**20)
"""Logits are clamped to ``±2^20`` for the histogram (``σ`` is exactly 0 or 1 there)."""

_PARTS = 5  # count, sum_p, positives (added), min_z (min), max_z (max)


def hist_empty(n_bins: int, device=None) -> Tensor:
    """A packed histogram with no impression (``[2 + 5 n_bins]`` float64)."""
    out = torch.zeros(2 + _PARTS * n_bins, dtype=torch.float64, device=device)
    out[2 + 3 * n_bins:2 + 4 * n_bins] = math.inf
    out[2 + 4 * n_bins:] = -math.inf
    return out


def hist_parts(packed: Tensor) -> tuple[int, int, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(e, o, count, sum_p, positives, min_z, max_z)`` of a packed histogram (views)."""
    n_bins = (packed.shape[-1] - 2) // _PARTS
    parts = [packed[2 + k * n_bins:2 + (k + 1) * n_bins] for k in range(_PARTS)]
    return int(packed[0]), int(packed[1]), *parts


def _span(packed: Tensor) -> tuple[int, int] | None:
    """Absolute indices ``(lo, hi)`` of the first and last occupied bin, or None when empty."""
    _, o, count, *_ = hist_parts(packed)
    occupied = torch.nonzero(count > 0)
    if occupied.numel() == 0:
        return None
    return o + int(occupied[0]), o + int(occupied[-1])


def _rebin(packed: Tensor, e_new: int, o_new: int, out: Tensor) -> None:
    """Add ``packed`` into ``out`` (layout at ``e_new, o_new``), merging aligned bins."""
    e, o, count, *parts = hist_parts(packed)
    keep = count > 0
    idx = torch.div(torch.nonzero(keep).squeeze(1) + o, 2 ** (e_new - e),
                    rounding_mode="floor") - o_new
    _, _, *dest = hist_parts(out)
    for k, (src, dst) in enumerate(zip((count, *parts), dest)):
        if k < 3:
            dst.index_add_(0, idx, src[keep])
        else:
            # scatter_reduce_: the same as index_reduce_ (include_self) without its beta warning
            dst.scatter_reduce_(0, idx, src[keep], "amin" if k == 3 else "amax")


def hist_merge(a: Tensor, b: Tensor) -> Tensor:
    """Exact merge of two packed histograms at the smallest exponent that holds both."""
    span_a, span_b = _span(a), _span(b)
    if span_b is None:
        return a.clone()
    if span_a is None:
        return b.clone()
    n_bins = (a.shape[-1] - 2) // _PARTS
    ea, eb = int(a[0]), int(b[0])
    e = max(ea, eb)
    while True:  # coarsening only shrinks the span: a few rounds at most
        lo = min(span_a[0] // 2 ** (e - ea), span_b[0] // 2 ** (e - eb))
        hi = max(span_a[1] // 2 ** (e - ea), span_b[1] // 2 ** (e - eb))
        if hi - lo < n_bins:
            break
        e += 1
    out = hist_empty(n_bins, device=a.device)
    out[0], out[1] = e, lo
    _rebin(a, e, lo, out)
    _rebin(b, e, lo, out)
    return out


def hist_reduce(stacked: Tensor) -> Tensor:
    """Reduction of stacked packed histograms ``[W, 2 + 5B]`` (DDP sync, ``merge_state``)."""
    out = stacked[0]
    for row in stacked[1:]:
        out = hist_merge(out, row)
    return out


def hist_of(z: Tensor, p: Tensor, y: Tensor, n_bins: int) -> Tensor:
    """Packed histogram of flat float64 logits ``z`` (with ``p``, binary ``y``) at its smallest
    exponent: the narrowest aligned power-of-two bins that hold ``[min z, max z]`` in ``n_bins``."""
    out = hist_empty(n_bins, device=z.device)
    if z.numel() == 0:
        return out
    z = z.clamp(-HIST_MAX_LOGIT, HIST_MAX_LOGIT)
    lo_z, hi_z = float(z.min()), float(z.max())
    e = HIST_MIN_EXP
    if hi_z > lo_z:  # a lower bound: n_bins bins of width 2^e span less than (n_bins + 1) 2^e
        e = max(e, math.floor(math.log2((hi_z - lo_z) / (n_bins + 1))))
    while math.floor(hi_z / 2.0**e) - math.floor(lo_z / 2.0**e) >= n_bins:
        e += 1
    o = math.floor(lo_z / 2.0**e)
    idx = (torch.floor(z / 2.0**e) - o).long()
    out[0], out[1] = e, o
    _, _, count, sum_p, pos, min_z, max_z = hist_parts(out)
    count.index_add_(0, idx, torch.ones_like(z))
    sum_p.index_add_(0, idx, p)
    pos.index_add_(0, idx, y)
    min_z.scatter_reduce_(0, idx, z, "amin")  # not index_reduce_: same result, no beta warning
    max_z.scatter_reduce_(0, idx, z, "amax")
    return out


def quantile_sums_from_hist(
    count: Tensor, sum_p: Tensor, sum_y: Tensor, bins: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Quantile-bin sums from fine-bin sums: fine bin h goes to ``floor(before_h * B / n)``.

    ``before_h`` is the count in fine bins below h: the quantile rule of :mod:`hybridrank.metrics.calibration`
    applied with each fine bin treated as one tied block. It equals the exact rule whenever no
    fine bin holds two distinct p; otherwise ECE moves by at most ``2 m / n``, with ``m`` the
    impressions in fine bins that straddle a quantile boundary.
    """
    c = count.round().long()
    n = int(c.sum())
    target = ((c.cumsum(0) - c) * bins // max(n, 1)).clamp_(max=bins - 1)  # empty tail bins
    out = [torch.zeros(bins, dtype=torch.float64, device=count.device).index_add_(0, target, s)
           for s in (count, sum_p, sum_y)]
    return out[0], out[1], out[2]
