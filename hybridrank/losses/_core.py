"""Shared plumbing of the loss catalogue: input checks, padding fills, masks, reductions, pairs.

Nothing here is public API; see the package docstring of :mod:`hybridrank.losses` for the
shape/mask glossary and the degenerate-case contract these helpers implement. Gains, discounts,
ideal DCG and tie-averaged ranks live in :mod:`hybridrank._dcg`, shared with the metrics.

Speed note: on CPU, element-wise kernels that read ``bool`` tensors (``torch.where``,
``masked_fill``, ``bool.to(float)``) cost several times an arithmetic kernel of the same size, so
the hot paths mask with 0/1 floats (:func:`mask_float`) and :func:`select`.
"""

from __future__ import annotations

import functools

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


def big(dtype: torch.dtype) -> float:
    """A large positive finite number for masked max / min: ``y ± big`` stays finite."""
    return torch.finfo(dtype).max / 4


def mask_float(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """The bool mask as 0.0 / 1.0 of ``dtype``.

    Through a ``uint8`` view: on CPU, kernels that read ``bool`` tensors (``where``, ``to``) are
    several times slower than the same kernels on ``uint8``.
    """
    return mask.view(torch.uint8).to(dtype)


INT_OF = {torch.float32: torch.int32, torch.float64: torch.int64}
"""The integer type of each float type's width, for bit-level selection."""


@functools.lru_cache(maxsize=64)
def float_bits(value: float, dtype: torch.dtype) -> int:
    """The bit pattern of ``value`` in ``dtype`` as a Python int (a scalar for bitwise ops)."""
    return int(torch.tensor(value, dtype=dtype).view(INT_OF[dtype]))


def bit_masks(mask: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """``(keep, drop)``: integer masks of ``dtype``'s width, all bits set on real / padding slots.

    Compute once and pass to several :func:`select_bits` calls on one mask.
    """
    keep = -mask.view(torch.uint8).to(INT_OF[dtype])
    return keep, ~keep


def select_bits(x: Tensor, mask: Tensor, fill: float = 0.0,
                masks: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """``torch.where(mask, x, fill)`` without autograd, by selecting bit patterns.

    Exactly ``where``'s result (NaN on a real slot stays NaN, anything on padding becomes
    ``fill``), at the cost of one or two integer kernels instead of one slow ``bool`` kernel.
    ``masks`` is :func:`bit_masks` of ``mask`` when already at hand.
    """
    itype = INT_OF.get(x.dtype)
    if itype is None:
        return torch.where(mask, x, torch.full((), fill, dtype=x.dtype, device=x.device))
    keep, drop = bit_masks(mask, x.dtype) if masks is None else masks
    out = x.contiguous().view(itype) & keep
    if fill != 0.0:
        out |= drop & torch.full((), fill, dtype=x.dtype, device=x.device).view(itype)
    return out.view(x.dtype)


def label_keys(labels: Tensor, mask: Tensor, masks: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """Integer keys that sort like the float labels, padding below every real label.

    The IEEE bit pattern of a float, read as a signed integer, orders non-negative floats
    correctly; flipping all but the sign bit of negative ones orders those too. Integer sorts are
    ~20 % faster than float sorts on CPU. ``labels`` float32 or float64, no NaN on real slots;
    ``masks`` is :func:`bit_masks` of ``mask`` when already at hand.
    """
    itype = INT_OF[labels.dtype]
    keep, drop = bit_masks(mask, labels.dtype) if masks is None else masks
    bits = (labels + 0.0).view(itype)  # + 0.0 turns -0.0 into +0.0
    bits = bits ^ ((bits >> (torch.iinfo(itype).bits - 1)) & torch.iinfo(itype).max)
    return (bits & keep).bitwise_or_(drop & torch.iinfo(itype).min)


class _Select(torch.autograd.Function):
    """``where(mask, x, fill)`` with the cheap backward ``grad * mask``.

    Forward selects bit patterns (``x`` on real slots, ``fill`` elsewhere), so NaN or inf sitting
    in padding never reaches the output, and a NaN on a real slot stays NaN. The backward needs no
    comparison: padding gets exactly zero gradient.
    """

    @staticmethod
    def forward(ctx, x: Tensor, mask: Tensor, m: Tensor, fill: float) -> Tensor:
        ctx.save_for_backward(m)
        return select_bits(x, mask, fill)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (m,) = ctx.saved_tensors
        return grad * m, None, None, None


def select(x: Tensor, mask: Tensor, m: Tensor, fill: float = 0.0) -> Tensor:
    """``x`` on real slots, ``fill`` on padding; gradients reach real slots only.

    Args:
        x: ``[G, L]`` (or ``[G, L, k]`` with ``mask``/``m`` expanded to it) float tensor.
        mask: bool, True on real slots; ``m``: the same as 0/1 floats of ``x.dtype``.
        fill: value put on padding.
    """
    return _Select.apply(x, mask, m, fill)


def prepare(
    logits: Tensor, labels: Tensor, mask: Tensor, weights: Tensor | None, *, neg: bool = False
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Upcast to at least float32 and make padding content irrelevant.

    Returns ``(s, y, w, m)``: logits with 0 on padding (:func:`neg_fill` with ``neg=True``, for
    softmax-type losses), labels and weights with 0 on padding (``w`` is ``m`` without weights),
    and ``m`` the mask as 0/1 floats. NaN or inf sitting in padding reach neither the values nor
    the gradients; padding logits get zero gradient.
    """
    dtype = torch.promote_types(logits.dtype, torch.float32)
    fill = neg_fill(dtype) if neg else 0.0
    m = mask_float(mask, dtype)
    ms = m.reshape(m.shape + (1,) * (logits.dim() - m.dim()))
    mk = mask.reshape(ms.shape).expand(logits.shape)
    s = select(logits.to(dtype), mk, ms.expand(logits.shape), fill)
    y = select_bits(labels.to(dtype), mask)  # labels and weights never need a gradient
    if weights is None:
        w = m
    elif weights.requires_grad:
        w = select(weights.to(dtype), mask, m)
    else:
        w = select_bits(weights.to(dtype), mask)
    return s, y, w, m


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
        per_list: ``[G]`` loss of each list (anything *finite* where ``valid`` is False).
        valid: ``[G]`` bool, True where the list has something to learn.
        reduction: ``"mean"`` (sum / number of valid lists, or / ``denom``), ``"sum"``, ``"none"``.
        denom: optional scalar denominator for ``"mean"`` (BCE uses the impression weight); when
            it is 0 every list is invalid or weightless, and the mean is 0.

    Returns:
        ``[G]`` for ``"none"``, else a scalar; 0 when nothing is valid.
    """
    per_list = per_list * valid  # finite values: exactly 0 (and zero gradient) where invalid
    if reduction == "none":
        return per_list
    total = per_list.sum()
    if reduction == "sum":
        return total
    if denom is None:
        return total / valid.sum().clamp_min(1)
    return total / denom.clamp_min(torch.finfo(total.dtype).tiny)


def fused_reduce(per_list: Tensor, valid: Tensor, reduction: str) -> tuple[Tensor, Tensor]:
    """:func:`reduce_lists` inside a fused autograd function: ``(output, d output / d per_list)``.

    The second value (``[G]``: ``valid``, divided by the number of valid lists for ``"mean"``)
    is what the function's backward multiplies the incoming gradient by.
    """
    keep = valid.to(per_list.dtype)
    per_list = per_list * keep
    if reduction == "none":
        return per_list, keep
    if reduction == "sum":
        return per_list.sum(), keep
    count = keep.sum().clamp_min(1.0)
    return per_list.sum() / count, keep / count


def has_pair(y: Tensor, m: Tensor) -> Tensor:
    """``[G]`` True where a list holds two real impressions with different labels.

    Equivalent to "some valid pair ``y_i > y_j`` exists" but O(L): max != min over real items.

    Args:
        y: ``[G, L]`` labels, 0 on padding (as :func:`prepare` returns them).
        m: ``[G, L]`` the mask as 0/1 floats.
    """
    off = (m - 1.0) * big(y.dtype)  # 0 on real slots, -big on padding
    return (y + off).amax(dim=1) > (y - off).amin(dim=1)


def valid_pairs(labels: Tensor, mask: Tensor) -> Tensor:
    """``[G, L, L]`` bool: ``mask_i & mask_j & (y_i > y_j)``, the only definition of a pair.

    One comparison: padding is lowered to ``-big`` on the left-hand side and lifted to ``+big``
    on the right, so it is never part of a pair.

    Args:
        labels: ``[G, L]`` graded labels.
        mask: ``[G, L]`` bool, True on real impressions; or the 0/1 float mask that
            :func:`prepare` returns, with ``labels`` then its cleaned labels (0 on padding).
    """
    if mask.dtype == torch.bool:
        dtype = torch.promote_types(labels.dtype, torch.float32)
        y, m = select_bits(labels.to(dtype), mask), mask_float(mask, dtype)
    else:
        y, m = labels, mask
    off = (m - 1.0) * big(y.dtype)
    return (y + off).unsqueeze(2) > (y - off).unsqueeze(1)
