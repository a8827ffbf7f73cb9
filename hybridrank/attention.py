"""Self-attention within the lists of a flat batch, for list-aware scorers.

A scorer sees a flat batch ``[B, ...]`` whose rows are grouped into lists (requests) by
``request [B]``: the rows of one list are adjacent, and a new list starts wherever the id changes.
Attention must mix rows of one list only. It runs on a padded layout built from ``request``:

- ``src [G, L]`` (int64): row of the flat batch at slot ``(g, l)`` of list ``g``; padding slots
  repeat the list's first row, so every index is valid;
- ``mask [G, L]`` (bool): True where the slot holds a real row of the list;
- ``back [B]`` (int64): where each row's result sits in the flattened ``[G * L]`` output.

``G`` is the number of lists and ``L`` the longest list. Padding slots are never attended to
(keys masked), and their own results are dropped by ``back``, so padding and the other lists of
the batch never change a list's outputs.

Two layouts give the same values:

- :func:`list_layout`, one padded block ``[G, L]``, in tensor operations only, so a traced or
  ONNX-exported scorer computes it from the ``request`` input at run time: the export works for
  any number of lists and any list lengths. Memory per attention layer: ``G * L * 3 * d_model``
  floats for queries, keys and values, plus the scores ``G * n_heads * L * L`` floats where the
  kernel materializes them (ONNX Runtime does; PyTorch's fused CPU kernel does not).
- :func:`bucketed_layout`, eager PyTorch only: lists grouped by length into powers of two, one
  padded block per group, so one long list does not pad thousands of short ones to its length
  (``sum_g L_g^2`` instead of ``G * L_max^2``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["list_layout", "bucketed_layout", "check_request", "ListAttentionBlock"]

Layout = tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]


def _runs(request: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``starts [G]`` (first row of each run of equal ids), ``counts [G]``, ``group [B]``."""
    new = torch.cat([request[:1] == request[:1], request[1:] != request[:-1]])
    starts = torch.nonzero(new).squeeze(1)
    group = torch.cumsum(new.long(), 0) - 1
    ends = torch.cat([starts[1:], torch.full_like(starts[:1], request.shape[0])])
    return starts, ends - starts, group


def list_layout(request: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One padded ``[G, L]`` layout of the lists of a flat batch (export-friendly).

    Only tensor operations, no Python number taken from the data (``L`` is the length of a
    ``nonzero`` result), so ``torch.jit.trace`` and the ONNX export record a computation that
    follows the ``request`` input at run time.

    Args:
        request: ``[B]`` integer list ids; a list is a run of equal adjacent ids.

    Returns:
        ``(src [G, L], mask [G, L], back [B])`` as described in the module docstring.

    >>> src, mask, back = list_layout(torch.tensor([7, 7, 7, 9]))
    >>> src.tolist(), mask.tolist(), back.tolist()
    ([[0, 1, 2], [3, 3, 3]], [[True, True, True], [True, False, False]], [0, 1, 2, 3])
    """
    starts, counts, group = _runs(request)
    rows = torch.arange(request.shape[0], device=request.device)
    longest = torch.cat([counts, counts.new_zeros(1)]).max()
    steps = torch.nonzero(rows < longest).squeeze(1)  # 0..L-1
    mask = steps[None, :] < counts[:, None]
    src = torch.where(mask, starts[:, None] + steps[None, :], starts[:, None])
    back = group * steps.shape[0] + (rows - starts[group])
    return src, mask, back


def bucketed_layout(request: torch.Tensor, *, min_gain: float = 2.0) -> Layout:
    """Lists grouped by length (powers of two) into several padded blocks (eager only).

    Falls back to the single block of :func:`list_layout` unless bucketing divides the padded
    attention cost ``sum over blocks of G_b * L_b^2`` by at least ``min_gain``.

    Args:
        request: ``[B]`` integer list ids; a list is a run of equal adjacent ids.
        min_gain: the least cost reduction worth several blocks (``0`` always buckets).

    Returns:
        ``(srcs, masks, back)``: one ``[G_b, L_b]`` index and mask per block, and ``back [B]``
        into the concatenation of the flattened blocks.

    >>> srcs, masks, back = bucketed_layout(torch.tensor([0, 1, 1, 1, 1, 1, 2]), min_gain=0)
    >>> [s.tolist() for s in srcs], back.tolist()
    ([[[0], [6]], [[1, 2, 3, 4, 5]]], [0, 2, 3, 4, 5, 6, 1])
    """
    b = request.shape[0]
    starts, counts, group = _runs(request)
    if b == 0:
        src, mask, back = list_layout(request)
        return [src], [mask], back
    # bucket e holds the lists of length in (2^(e-1), 2^e]; frexp gives e for counts - 1 >= 1
    bucket = torch.frexp((counts - 1).double())[1]
    ids, inverse = torch.unique(bucket, return_inverse=True)
    n_per = torch.bincount(inverse, minlength=ids.numel())
    l_per = torch.zeros_like(n_per).scatter_reduce(0, inverse, counts, reduce="amax")
    single = float(counts.numel()) * float(counts.max()) ** 2
    split = float((n_per * l_per * l_per).sum())
    if ids.numel() == 1 or split * min_gain > single:
        src, mask, back = list_layout(request)
        return [src], [mask], back
    srcs, masks = [], []
    slot = torch.empty_like(counts)  # flat offset of each list's first slot
    offset = 0
    for j, n_max in enumerate(l_per.tolist()):
        gids = torch.nonzero(inverse == j).squeeze(1)
        steps = torch.arange(n_max, device=request.device)
        mask = steps[None, :] < counts[gids, None]
        srcs.append(torch.where(mask, starts[gids, None] + steps, starts[gids, None]))
        masks.append(mask)
        slot[gids] = offset + torch.arange(gids.numel(), device=request.device) * n_max
        offset += gids.numel() * n_max
    back = slot[group] + (torch.arange(b, device=request.device) - starts[group])
    return srcs, masks, back


def check_request(request: torch.Tensor | None, n_rows: int, who: str) -> None:
    """Refuse a missing or malformed ``request`` with a clear ValueError (eager mode only).

    A list must be one run of adjacent rows: an id that comes back after another id is refused,
    since the scorer would otherwise treat the two runs as two lists without a word.
    """
    if request is None:
        raise ValueError(f"{who} is list-aware: call it as scorer(num, cat, request) with request [B] "
                         "the list id of each row (rows of one list adjacent)")
    if request.dim() != 1 or request.shape[0] != n_rows:
        raise ValueError(f"{who}: request must have shape [{n_rows}] (one id per row), "
                         f"got {list(request.shape)}")
    if request.dtype.is_floating_point or request.dtype.is_complex or request.dtype == torch.bool:
        raise ValueError(f"{who}: request must hold integer list ids, got {request.dtype}")
    if n_rows > 1:
        runs = int((request[1:] != request[:-1]).sum()) + 1
        n_ids = int(torch.unique(request).numel())
        if runs != n_ids:
            raise ValueError(f"{who}: the rows of each list must be adjacent in the batch, but "
                             f"{n_ids} list ids form {runs} runs (sort the rows by request)")


class ListAttentionBlock(nn.Module):
    """A pre-norm Transformer encoder block whose attention stays within each list.

    ``h <- h + Drop(Attn(LN(h)))``, then ``h <- h + Drop(FFN(LN(h)))``, on flat rows ``[B, d]``;
    only the attention core ``softmax(q k^T / sqrt(d_head)) v`` runs on the padded layout. No
    positional encoding: the block is permutation-equivariant within a list.

    Args:
        d_model: row width.
        n_heads: attention heads (``d_model`` must be divisible by it).
        ffn_dim: hidden width of the feed-forward part.
        dropout: dropout on the two residual branches.

    Reference: Vaswani et al. 2017; Pobrotyn et al. 2020, "Context-Aware Learning to Rank with
    Self-Attention".
    """

    def __init__(self, d_model: int, n_heads: int, ffn_dim: int, dropout: float = 0.0):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.ffn = nn.Sequential(nn.Linear(d_model, ffn_dim), nn.ReLU(), nn.Linear(ffn_dim, d_model))
        self.drop = nn.Dropout(dropout)

    def attend(self, qkv: torch.Tensor, layout: Layout) -> torch.Tensor:
        """``[B, 3 d] -> [B, d]``: attention of each row over the rows of its list."""
        srcs, masks, back = layout
        d = qkv.shape[1] // 3
        outs = []
        for src, mask in zip(srcs, masks):
            g, n = src.shape[0], src.shape[1]
            x = qkv.index_select(0, src.flatten()).view(g, n, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(x[0], x[1], x[2], attn_mask=mask[:, None, None, :],
                                               scale=1.0 / math.sqrt(self.d_head))
            outs.append(a.transpose(1, 2).reshape(g * n, d))
        flat = outs[0] if len(outs) == 1 else torch.cat(outs)
        return flat.index_select(0, back)

    def forward(self, h: torch.Tensor, layout: Layout) -> torch.Tensor:
        h = h + self.drop(self.proj(self.attend(self.qkv(self.norm1(h)), layout)))
        return h + self.drop(self.ffn(self.norm2(h)))
