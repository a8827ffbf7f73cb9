"""The position tower's estimator, as pure functions over per-slot sums.

Glossary: ``S`` slots (index ``j - 1`` for the 1-based position ``j``), ``K`` bootstrap
replicates, ``ref`` the reference slot's index. A slot's sufficient statistics are
:class:`SlotSums` ``(Y, P, N) = (Σ w·y, Σ w·σ(r + b_j), Σ w)`` over its impressions, ``r`` the
position-free click logit and ``b_j`` the slot's current offset; a ``[..., S]`` field holds one
set of sums per slot (``[K, S]``: one per replicate). Offsets and levels are logits (float64).
Every function here is torch over tensors; :func:`monotone_fit` alone calls scipy (on the CPU).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

__all__ = ["PSEUDO", "BootstrapFit", "OffsetFit", "SlotSums", "bootstrap_offsets", "fill_unseen",
           "hull", "information", "level_bounds_from_clicks", "level_bounds_from_slot",
           "level_step", "monotone_fit", "offset_update", "percentile_interval",
           "pool_toward_curve", "slot_logit_step"]

PSEUDO = 0.5  # pseudo-count of clicks and non-clicks in every logit of a ratio (no log(0))


class SlotSums(NamedTuple):
    """Per-slot sums ``[..., S]`` of the clicks, the expected clicks and the impressions.

    The tower stores them stacked on a leading axis of 3 in this order (``[3, ..., S]``: one
    kernel adds a batch, one all-reduce sums the ranks); :meth:`of` gives them back by name.
    """

    clicks: torch.Tensor     # Y = Σ w·y
    expected: torch.Tensor   # P = Σ w·σ(r + b_j)
    count: torch.Tensor      # N = Σ w

    @classmethod
    def of(cls, stacked: torch.Tensor) -> SlotSums:
        """The named views of sums stacked as ``[3, ..., S]``."""
        return cls(*stacked.unbind(0))


def slot_logit_step(clicks: torch.Tensor, expected: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """Per-slot update ``logit(Y / N) - logit(P / N)`` from sums ``[..., S]`` (0 where ``N = 0``).

    Half a click and half a non-click are added to both ratios:
    ``log(Y + ½) - log(N - Y + ½) - log(P + ½) + log(N - P + ½)``.

    Args:
        clicks, expected, count: ``[..., S]`` sums ``Y``, ``P``, ``N`` (:class:`SlotSums`).

    Returns:
        ``[..., S]`` steps.

    >>> slot_logit_step(torch.tensor([10.0]), torch.tensor([10.0]), torch.tensor([100.0])).item()
    0.0
    >>> round(slot_logit_step(torch.tensor([5.0]), torch.tensor([10.0]), torch.tensor([1000.0])).item(), 3)
    -0.652
    """
    n = count + 2 * PSEUDO
    step = (torch.log(clicks + PSEUDO) - torch.log(n - clicks - PSEUDO)
            - torch.log(expected + PSEUDO) + torch.log(n - expected - PSEUDO))
    return torch.where(count > 0, step, torch.zeros_like(step))


def level_step(sums: SlotSums, change: torch.Tensor) -> torch.Tensor:
    """Step of the relevance intercept that matches predicted to observed clicks over all slots
    once the offsets moved by ``change``.

    Each slot's predicted clicks are scaled by ``exp(change_j)`` (the small-rate form of the
    update): ``logit(ΣY / ΣN) - logit(P' / ΣN)`` with ``P' = Σ_j P_j e^{change_j}``, half a click
    and non-click added.

    Args:
        sums: ``[..., S]`` sums. change: ``[..., S]`` the offsets' change.

    Returns:
        ``[...]`` steps.

    >>> s = SlotSums(*torch.tensor([[10.0], [10.0], [100.0]], dtype=torch.float64))
    >>> round(float(level_step(s, torch.tensor([0.0], dtype=torch.float64))), 6)
    0.0
    """
    y, n = sums.clicks.sum(-1), sums.count.sum(-1)
    p = (sums.expected * torch.exp(change)).sum(-1)
    return (torch.log((y + PSEUDO) / (n - y + PSEUDO))
            - torch.log((p + PSEUDO) / (n - p + PSEUDO).clamp(min=PSEUDO)))


def information(sums: SlotSums) -> torch.Tensor:
    """Information of each slot's logit: ``P (N - P) / N``, expected clicks x expected non-clicks
    over impressions (the inverse of the logit's sampling variance).

    Args:
        sums: ``[..., S]`` sums.

    Returns:
        ``[..., S]`` information (0 where ``N = 0``).
    """
    return sums.expected * (sums.count - sums.expected).clamp(min=0) / sums.count.clamp(min=1e-300)


def pool_toward_curve(level: torch.Tensor, info: torch.Tensor, est: torch.Tensor) -> torch.Tensor:
    """Each estimated slot's click logit shrunk toward a smooth curve in the slot, by as much as
    its own noise exceeds the slots' real spread around the curve (empirical Bayes).

    The curve is ``c + β1·log j + β2·log² j`` (weighted least squares, weights = each slot's
    information ``w``); the spread ``τ²`` of the slots around it beyond their sampling noise is
    the method-of-moments estimate of a random-effects meta-regression (DerSimonian and Laird
    1986): ``τ² = max(0, (Q - df) / (Σw - tr((XᵀWX)⁻¹ XᵀW²X)))`` with ``Q = Σ w (level - fit)²``.
    Each slot then moves to ``fit + τ² / (τ² + 1/w) · (level - fit)``: a slot with many clicks
    keeps its own estimate, a slot with few borrows from its neighbours through the curve. The
    reference slot too: the serving level then rests on every slot's clicks. Fewer than five
    estimated slots (no degree of freedom left to measure ``τ²``): unchanged.

    Args:
        level: ``[S]`` click logits. info: ``[S]`` their information. est: ``[S]`` bool, the
            estimated slots (the others keep their value).

    Returns:
        ``[S]`` pooled logits.
    """
    idx = torch.nonzero(est).reshape(-1)
    if idx.numel() < 5:
        return level
    y = level[idx].double()
    w = info[idx].double().clamp(min=1e-9)
    lj = torch.log(idx.double() + 1)
    x = torch.stack([torch.ones_like(lj), lj, lj * lj], dim=1)            # [k, 3]
    xtw = x.T * w
    gram = xtw @ x
    inv = torch.linalg.inv(gram)  # >= 5 distinct slots, positive weights: full rank
    fit = x @ (inv @ (xtw @ y))
    resid = y - fit
    q = float((w * resid * resid).sum())
    df = idx.numel() - x.shape[1]
    denom = float(w.sum()) - float(torch.trace(inv @ ((x.T * w * w) @ x)))
    tau2 = max(0.0, (q - df) / denom) if denom > 0 else math.inf
    keep = torch.ones_like(w) if math.isinf(tau2) else tau2 / (tau2 + 1.0 / w)
    out = level.clone()
    out[idx] = (fit + keep * resid).to(out.dtype)
    return out


def monotone_fit(offsets: torch.Tensor, info: torch.Tensor, est: torch.Tensor, ref: int) -> torch.Tensor:
    """The closest non-increasing sequence over the estimated slots, re-anchored at ``ref``.

    ``argmin_m Σ_j w_j (b_j - m_j)²`` subject to ``m_1 >= m_2 >= ...`` over the estimated slots
    (pool adjacent violators, weights = information; scipy on the CPU), then ``m - m_ref``.
    Fewer than two estimated slots: unchanged.

    Args:
        offsets: ``[S]`` offsets. info: ``[S]`` weights. est: ``[S]`` bool, the estimated slots.
        ref: the reference slot's index.

    Returns:
        ``[S]`` offsets, on the device of ``offsets``.
    """
    if int(est.sum()) < 2:
        return offsets
    from scipy.optimize import isotonic_regression

    idx = torch.nonzero(est).reshape(-1)
    w = info[idx].double().clamp(min=1e-9).cpu().numpy()
    fit = isotonic_regression(offsets[idx].double().cpu().numpy(), weights=w, increasing=False).x
    out = offsets.clone()
    out[idx] = torch.as_tensor(np.ascontiguousarray(fit), dtype=out.dtype, device=out.device)
    return out - out[ref]


def fill_unseen(offsets: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
    """Unseen slots take the offset of the nearest lower seen slot (0 if none).

    Args:
        offsets: ``[..., S]`` offsets. seen: ``[S]`` bool.

    Returns:
        ``[..., S]`` offsets.

    >>> fill_unseen(torch.tensor([5.0, 1.0, 2.0, 3.0]), torch.tensor([False, True, False, True])).tolist()
    [0.0, 1.0, 1.0, 3.0]
    """
    slots = torch.arange(seen.shape[-1], device=seen.device)
    last = torch.cummax(torch.where(seen, slots, -1), 0).values       # nearest seen slot <= j
    carried = offsets[..., last.clamp(min=0)]
    return torch.where(last >= 0, carried, torch.zeros((), dtype=offsets.dtype, device=offsets.device))


def percentile_interval(reps: torch.Tensor, alpha: float) -> torch.Tensor:
    """``[2, ...]`` percentile interval ``[q(α/2), q(1 - α/2)]`` of replicates ``[K, ...]``.

    >>> percentile_interval(torch.arange(101, dtype=torch.float64), 0.1).tolist()
    [5.0, 95.0]
    """
    return torch.quantile(reps, torch.tensor([alpha / 2, 1 - alpha / 2], dtype=torch.float64,
                                             device=reps.device), dim=0)


def hull(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The hull ``[min(a_lo, b_lo), max(a_hi, b_hi)]`` of two ``[2, ...]`` intervals."""
    return torch.stack([torch.minimum(a[0], b[0]), torch.maximum(a[1], b[1])])


class OffsetFit(NamedTuple):
    """One exact update of the offsets (:func:`offset_update`)."""

    offset: torch.Tensor   # [S] new offsets, 0 at the reference
    level: torch.Tensor    # [S] each slot's click logit relative to the current intercept (pooled)
    step: torch.Tensor     # [S] each slot's own step, logit(Y/N) - logit(P/N)
    info: torch.Tensor     # [S] information of each slot's logit


def _shape(offsets: torch.Tensor, info: torch.Tensor, est: torch.Tensor, ref: int,
           monotone: bool) -> torch.Tensor:
    return monotone_fit(offsets, info, est, ref) if monotone else offsets


def offset_update(old: torch.Tensor, fit: SlotSums, est: torch.Tensor, ref: int, *,
                  pool: bool, monotone: bool) -> OffsetFit:
    """The exact per-slot update of the offsets (a regression-EM step).

    ``level_j = b_j + logit(Y_j / N_j) - logit(P_j / N_j)`` (pooled toward the curve with
    ``pool``), ``b'_j = level_j - level_ref`` (projected on non-increasing sequences with
    ``monotone``); slots not estimated carry the nearest lower estimated slot's offset.

    Args:
        old: ``[S]`` current offsets (float64). fit: ``[S]`` sums of the traffic fitted on.
        est: ``[S]`` bool, the slots estimated. ref: the reference slot's index.
        pool, monotone: the tower's switches.

    Returns:
        :class:`OffsetFit`.
    """
    step = slot_logit_step(*fit)
    info = information(fit)
    level = pool_toward_curve(old + step, info, est) if pool else old + step
    offset = fill_unseen(_shape(level - level[ref], info, est, ref, monotone), est)
    return OffsetFit(offset, level, step, info)


class BootstrapFit(NamedTuple):
    """The update of every bootstrap replicate (:func:`bootstrap_offsets`)."""

    offset: torch.Tensor   # [K, S] replicate offsets
    bounds: torch.Tensor   # [2, S] the offsets' interval (lower; upper)
    level: torch.Tensor    # [K, S] replicate click logits (pooled)
    step: torch.Tensor     # [K, S] replicate per-slot steps


def bootstrap_offsets(old: torch.Tensor, boot: SlotSums, info: torch.Tensor, est: torch.Tensor,
                      ref: int, *, pool: bool, monotone: bool, alpha: float) -> BootstrapFit:
    """Each replicate's offsets by :func:`offset_update`'s rule, and their percentile interval.

    The monotone projection weighs every replicate by the estimate's information ``info``. With
    ``pool`` the interval is the hull of the pooled replicates' and the per-slot replicates'
    (``old + step_k - step_k,ref``, unpooled): pooled replicates are only as right as the curve
    (when the slots' spread around it comes out as zero a replicate is the curve alone, as
    narrow as a three-parameter fit's even where the curve is off), the per-slot interval does
    not rest on it.

    Args:
        old: ``[S]`` current offsets. boot: ``[K, S]`` replicate sums of the traffic fitted on.
        info: ``[S]`` the estimate's information. est: ``[S]`` bool. ref: the reference index.
        pool, monotone: the tower's switches. alpha: the interval's level is ``1 - alpha``.

    Returns:
        :class:`BootstrapFit`.
    """
    steps = slot_logit_step(*boot)                                         # [K, S]
    infos = information(boot)
    level = torch.stack([pool_toward_curve(old + s, i, est) if pool else old + s
                         for s, i in zip(steps, infos)])
    offset = fill_unseen(torch.stack([_shape(r - r[ref], info, est, ref, monotone) for r in level]), est)
    bounds = percentile_interval(offset, alpha)
    if pool:
        free = fill_unseen(torch.stack([_shape(r, info, est, ref, monotone)
                                        for r in old + steps - steps[:, ref:ref + 1]]), est)
        bounds = hull(bounds, percentile_interval(free, alpha))
    return BootstrapFit(offset, bounds, level, steps)


def level_bounds_from_slot(fit: OffsetFit, boot: BootstrapFit, ref: int, *, pool: bool,
                           alpha: float) -> torch.Tensor:
    """``[2]`` interval of the serving level when it is the reference slot's click logit.

    Each replicate's level minus the estimate's, ``level_k,ref - level_ref``; with ``pool`` the
    hull with the reference slot's own clicks (``step_k,ref - step_ref``), as the offsets'
    intervals.

    Args:
        fit: the estimate. boot: its replicates. ref: the reference index.
        pool: the tower's switch. alpha: the level is ``1 - alpha``.

    Returns:
        ``[2]`` (lower, upper), logit, relative to the estimate.
    """
    bounds = percentile_interval(boot.level[:, ref] - fit.level[ref], alpha)
    if pool:
        bounds = hull(bounds, percentile_interval(boot.step[:, ref] - fit.step[ref], alpha))
    return bounds


def level_bounds_from_clicks(boot: SlotSums, boot_offset: torch.Tensor, old: torch.Tensor,
                             ref_step: float, alpha: float) -> torch.Tensor:
    """``[2]`` interval of the serving level when it rests on every click given the offsets
    (offsets from identifying traffic): each replicate's :func:`level_step` minus the estimate's.

    Args:
        boot: ``[K, S]`` replicate sums of all the traffic. boot_offset: ``[K, S]`` replicate
            offsets. old: ``[S]`` the offsets before the update. ref_step: the estimate's level
            step. alpha: the level is ``1 - alpha``.

    Returns:
        ``[2]`` (lower, upper), logit, relative to the estimate.
    """
    return percentile_interval(level_step(boot, boot_offset - old) - ref_step, alpha)
