"""Shared plumbing of the loss catalogue: input checks, padding fills, reductions, gains and ranks.

Nothing here is public API; see the package docstring of :mod:`hybridrank.losses` for the
shape/mask glossary and the degenerate-case contract these helpers implement.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

REDUCTIONS = ("mean", "sum", "none")


def _shape(t: Tensor) -> str:
    return "[" + ", ".join(str(d) for d in t.shape) + "]"


def check_inputs(
    logits: Tensor,
    labels: Tensor,
    mask: Tensor,
    weights: Tensor | None,
    reduction: str,
    *,
    n_outputs: int = 1,
) -> None:
    """Raise a ``ValueError`` naming the argument when shapes or dtypes do not fit.

    Only Python-level attribute checks: no device sync, cheap enough for every call.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    for name, t in (("logits", logits), ("labels", labels), ("mask", mask)):
        if not isinstance(t, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if labels.dim() != 2:
        raise ValueError(f"labels must be [G, L], got shape {_shape(labels)}")
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor (True = real impression), got {mask.dtype}")
    if not labels.is_floating_point():
        raise ValueError(f"labels must be a floating tensor (graded labels), got {labels.dtype}")
    if not logits.is_floating_point():
        raise ValueError(f"logits must be a floating tensor, got {logits.dtype}")
    if mask.shape != labels.shape:
        raise ValueError(
            f"mask shape {_shape(mask)} does not match labels shape {_shape(labels)}"
        )
    want = tuple(labels.shape) if n_outputs == 1 else (*labels.shape, n_outputs)
    if tuple(logits.shape) != want:
        extra = " (JRC needs two logits per impression, [G, L, 2])" if n_outputs == 2 else ""
        raise ValueError(
            f"logits shape {_shape(logits)} does not match labels shape {_shape(labels)}: "
            f"expected [{', '.join(map(str, want))}]{extra}"
        )
    if weights is not None:
        if not isinstance(weights, Tensor) or not weights.is_floating_point():
            raise ValueError("weights must be a floating tensor [G, L] or None")
        if weights.shape != labels.shape:
            raise ValueError(
                f"weights shape {_shape(weights)} does not match labels shape {_shape(labels)}"
            )


def neg_fill(dtype: torch.dtype) -> float:
    """A large negative *finite* logit for padding, safe in fp16/bf16/fp32/fp64.

    A quarter of the most negative finite value: ``exp(fill - max)`` underflows to 0, a row made
    only of fills stays finite (``fill - fill = 0``), and ``fill + fill`` does not overflow.
    """
    return torch.finfo(dtype).min / 4


def prepare(
    logits: Tensor, labels: Tensor, mask: Tensor, weights: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """Upcast to at least float32 and make padding content irrelevant.

    Returns ``(s, y, w)``: logits, labels and weights with padding set to 0 (``w`` is 0 on
    padding and 1 or the given weight on real impressions). ``torch.where`` keeps NaN/inf sitting
    in padding out of both the values and the gradients.
    """
    dtype = torch.promote_types(logits.dtype, torch.float32)
    zero = torch.zeros((), dtype=dtype, device=logits.device)
    s = torch.where(_expand(mask, logits), logits.to(dtype), zero)
    y = torch.where(mask, labels.to(dtype), zero)
    w = mask.to(dtype) if weights is None else torch.where(mask, weights.to(dtype), zero)
    return s, y, w


def _expand(mask: Tensor, like: Tensor) -> Tensor:
    return mask.reshape(mask.shape + (1,) * (like.dim() - mask.dim()))


def safe_div(num: Tensor, den: Tensor) -> Tensor:
    """``num / den`` where ``den > 0``, else 0; finite values and gradients either way."""
    pos = den > 0
    safe_den = torch.where(pos, den, torch.ones_like(den))
    return torch.where(pos, num / safe_den, torch.zeros_like(num))


def reduce_lists(
    per_list: Tensor, valid: Tensor, reduction: str, denom: Tensor | None = None
) -> Tensor:
    """Apply the contract: invalid lists give exactly 0; mean is over valid lists (or ``denom``).

    Args:
        per_list: ``[G]`` loss of each list (anything finite where ``valid`` is False).
        valid: ``[G]`` bool, True where the list has something to learn.
        reduction: ``"mean"`` (sum / number of valid lists, or / ``denom``), ``"sum"``, ``"none"``.
        denom: optional scalar denominator for ``"mean"`` (BCE uses the impression count).

    Returns:
        ``[G]`` for ``"none"``, else a scalar; 0 when nothing is valid.
    """
    per_list = torch.where(valid, per_list, torch.zeros_like(per_list))
    if reduction == "none":
        return per_list
    total = per_list.sum()
    if reduction == "sum":
        return total
    if denom is None:
        denom = valid.sum().to(per_list.dtype)
    return safe_div(total, denom)


def has_pair(labels: Tensor, mask: Tensor) -> Tensor:
    """``[G]`` True where a list holds two real impressions with different labels.

    Equivalent to "some valid pair ``y_i > y_j`` exists" but O(L): max != min over real items.
    """
    big = torch.finfo(labels.dtype).max
    hi = torch.where(mask, labels, torch.full_like(labels, -big)).amax(dim=1)
    lo = torch.where(mask, labels, torch.full_like(labels, big)).amin(dim=1)
    return mask.any(dim=1) & (hi > lo)


def gains(labels: Tensor, gain: str) -> Tensor:
    """NDCG gain of graded labels: ``2^y - 1`` (``"exp"``, default) or ``y`` (``"linear"``)."""
    if gain == "exp":
        return torch.expm1(labels * math.log(2.0))
    if gain == "linear":
        return labels
    raise ValueError(f"gain must be 'exp' or 'linear', got {gain!r}")


def discount(rank: Tensor) -> Tensor:
    """``1 / log2(1 + rank)`` for 1-based (possibly fractional) ranks."""
    return 1.0 / torch.log2(1.0 + rank)


def ideal_dcg(g: Tensor, mask: Tensor) -> Tensor:
    """``[G]`` DCG of the ideal order: gains sorted descending (padding has gain 0)."""
    g = torch.where(mask, g, torch.zeros_like(g))
    top = torch.sort(g, dim=1, descending=True).values
    ranks = torch.arange(1, g.shape[1] + 1, device=g.device, dtype=g.dtype)
    return (top * discount(ranks)).sum(dim=1)


def average_ranks(scores: Tensor, mask: Tensor) -> Tensor:
    """``[G, L]`` 1-based rank by descending score among real items; ties share their mean rank.

    Tie-averaging keeps rank-based weights independent of storage order (CONVENTIONS.md §2).
    Costs one ``[G, L, L]`` comparison, the same order as the pairwise losses that use it.
    """
    si, sj = scores.unsqueeze(2), scores.unsqueeze(1)
    real_j = mask.unsqueeze(1)
    above = ((sj > si) & real_j).sum(dim=2)
    tied = ((sj == si) & real_j).sum(dim=2)  # includes the item itself
    return 1.0 + above.to(scores.dtype) + 0.5 * (tied.to(scores.dtype) - 1.0)


def tie_keys(shape: tuple[int, int], seed: int, device: torch.device) -> Tensor:
    """``[G, L]`` pseudo-random int64 keys from a fixed-seed hash of (row, column).

    Used to order label ties in ListMLE. The key of slot ``(g, i)`` depends only on ``g``, ``i``
    and ``seed`` (Park–Miller steps), not on ``L``, so adding padding columns changes nothing.
    """
    modulus = 2_147_483_647
    g = torch.arange(shape[0], device=device, dtype=torch.int64).unsqueeze(1)
    i = torch.arange(shape[1], device=device, dtype=torch.int64).unsqueeze(0)
    h = (g * 1_000_003 + i * 7_919 + seed * 104_729 + 1) % modulus
    for _ in range(3):
        h = (h * 48_271) % modulus
    return h
