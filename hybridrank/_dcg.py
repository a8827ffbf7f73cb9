"""NDCG gains and discounts, ideal DCG, and tied-score blocks: one implementation for losses and metrics.

Not public API. :mod:`hybridrank.metrics` (NDCG with ``ties="average"``, MAP, MRR, AUC) and
:mod:`hybridrank.losses` (LambdaRank / LambdaLoss pair weights, ApproxNDCG, NeuralNDCG) both use
these, so a metric and the loss that optimises it agree on what a gain, a discount and a tie are
(docs/CONVENTIONS.md §4.1): gain ``2^y - 1`` (``"exp"``) or ``y`` (``"linear"``), discount
``1 / log2(1 + rank)`` for 1-based ranks, and a block of tied scores spread evenly over the ranks
it occupies.

Shapes follow the glossary of :mod:`hybridrank.losses`: ``[G, L]`` padded lists with a bool
``mask``; padding always sorts after every real item.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

GAINS = ("exp", "linear")


def gains(labels: Tensor, gain: str = "exp") -> Tensor:
    """NDCG gain of graded labels: ``2^y - 1`` (``"exp"``, default) or ``y`` (``"linear"``).

    >>> gains(torch.tensor([0.0, 1.0, 2.0])).tolist()
    [0.0, 1.0, 3.0]
    """
    if gain == "exp":
        return torch.expm1(labels * math.log(2.0))
    if gain == "linear":
        return labels
    raise ValueError(f"gain must be one of {GAINS}, got {gain!r}")


def discount(rank: Tensor) -> Tensor:
    """``1 / log2(1 + rank)`` for 1-based (possibly fractional) ranks."""
    return 1.0 / torch.log2(1.0 + rank)


def position_discounts(
    n: int, ks: tuple[int | None, ...] | None = None, *, dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    """Discounts of the positions ``1..n``: ``[n]``, or ``[K, n]`` with zeros beyond each cut-off.

    ``ks`` holds NDCG cut-offs (``None`` = the whole list); without ``ks`` the result is ``[n]``.

    >>> position_discounts(3, (1, None)).tolist()[0]
    [1.0, 0.0, 0.0]
    """
    disc = discount(torch.arange(1, n + 1, dtype=dtype, device=device))
    if ks is None:
        return disc
    cut = torch.tensor([n if k is None else min(k, n) for k in ks], device=disc.device)
    return disc * (torch.arange(n, device=disc.device) < cut[:, None])


def ideal_dcg(g: Tensor, mask: Tensor | None, disc: Tensor | None = None) -> Tensor:
    """DCG of the ideal order: gains sorted descending (padding has gain 0) times ``disc``.

    Args:
        g: ``[G, L]`` gains (anything on padding, unless ``mask`` is None: then 0 there).
        mask: ``[G, L]`` bool, True on real impressions, or None when ``g`` is 0 on padding.
        disc: ``[L]`` discount per position (default: :func:`position_discounts`), or ``[K, L]``
            for several cut-offs at once.

    Returns:
        ``[G]``, or ``[G, K]`` for a ``[K, L]`` ``disc``.
    """
    if mask is not None:
        g = torch.where(mask, g, torch.zeros((), dtype=g.dtype, device=g.device))
    top = torch.sort(g, dim=1, descending=True).values
    if disc is None:
        disc = position_discounts(g.shape[1], dtype=g.dtype, device=g.device)
    if disc.dim() == 1:
        return top @ disc.to(top.dtype)
    return top @ disc.to(top.dtype).T


def tie_blocks(scores: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Sort each list by descending score, padding last, and find the tied block of every slot.

    Returns ``(order, first, last)``, all ``[G, L]`` int64: ``order`` the sorting permutation,
    ``first`` / ``last`` the 0-based sorted positions bounding the tied block of the item at each
    sorted position. Real scores of ``±inf`` stay ordered and above padding, which forms its own
    block at the end. One sort and O(L) work per list.

    >>> order, first, last = tie_blocks(torch.tensor([[1.0, 3.0, 1.0]]), torch.ones(1, 3) > 0)
    >>> order[0, 0].item(), first.tolist(), last.tolist()
    (1, [[0, 1, 1]], [[0, 2, 2]])
    """
    s = scores if scores.is_floating_point() else scores.double()
    fin = torch.finfo(s.dtype)
    key = s.clamp(fin.min, fin.max).masked_fill(~mask, float("-inf"))
    sk, order = torch.sort(key, dim=1, descending=True)
    g, n = sk.shape
    new = torch.ones_like(sk, dtype=torch.bool)
    new[:, 1:] = sk[:, 1:] != sk[:, :-1]
    block = new.cumsum(1) - 1  # block id within the row, non-decreasing
    flat = block + n * torch.arange(g, device=sk.device)[:, None]
    size = torch.bincount(flat.reshape(-1), minlength=g * n).view(g, n)  # rows of block sizes
    start = size.cumsum(1) - size
    first = start.gather(1, block)
    return order, first, first + size.gather(1, block) - 1


def block_means(per_position: Tensor, first: Tensor, last: Tensor) -> Tensor:
    """Mean of a per-position quantity over each slot's tied block (the tie-averaged value).

    ``out[..., g, p] = mean(per_position[..., first[g, p] : last[g, p] + 1])``, e.g. the expected
    discount of an item of a tied block under a uniformly random order of the block.

    Args:
        per_position: ``[L]`` or ``[K, L]`` values of the sorted positions.
        first, last: ``[G, L]`` from :func:`tie_blocks`.

    Returns:
        ``[G, L]`` (or ``[K, G, L]``).
    """
    lead = per_position.shape[:-1]
    flat = per_position.reshape(math.prod(lead), per_position.shape[-1])
    cum = F.pad(flat.cumsum(-1), (1, 0))
    span = cum.index_select(1, (last + 1).reshape(-1)) - cum.index_select(1, first.reshape(-1))
    out = span.view(cum.shape[0], *last.shape) / (last - first + 1).to(cum.dtype)
    return out.reshape(*lead, *last.shape)


def average_ranks(scores: Tensor, mask: Tensor) -> Tensor:
    """``[G, L]`` 1-based rank by descending score among real items; ties share their mean rank.

    Tie-averaging keeps rank-based quantities independent of storage order (docs/CONVENTIONS.md §3).
    Values on padding slots are meaningless.

    >>> average_ranks(torch.tensor([[1.0, 3.0, 1.0]]), torch.ones(1, 3) > 0).tolist()
    [[2.5, 1.0, 2.5]]
    """
    order, first, last = tie_blocks(scores, mask)
    dtype = scores.dtype if scores.is_floating_point() else torch.float64
    mean_rank = (first + last).to(dtype) * 0.5 + 1.0
    return torch.empty_like(mean_rank).scatter_(1, order, mean_rank)
