"""Self-attention within the lists of a flat batch, for list-aware scorers.

A scorer sees a flat batch ``[B, ...]`` whose rows are grouped into lists (requests) by
``request [B]``: the rows of one list are adjacent, and a new list starts wherever the id changes.
Attention must mix rows of one list only. It runs on a padded layout built from ``request`` by
:func:`list_layout`: the lists are grouped into a few blocks by length, and block ``b`` is a
padded ``[G_b, L_b]`` grid of row indices (``G_b`` lists, ``L_b`` the longest of them) with a
mask of the real slots, plus ``back [B]`` that finds each row's result again. Padding slots are
never attended to (keys masked) and their results are never read, so padding and the other
lists of the batch do not change a list's outputs.

The same layout serves training, evaluation and exports. It is made of tensor operations only,
so a traced (TorchScript) or ONNX-exported scorer recomputes it from its ``request`` input at
run time, for any batch size, number of lists and list lengths. Memory per attention layer, with
``S = sum over blocks of (G_b + 1) * L_b`` padded slots and ``Q = sum over blocks of
(G_b + 1) * L_b^2``: ``3 * d_model * S`` floats for queries, keys and values, and
``n_heads * Q`` floats of attention scores where the kernel materializes them (ONNX Runtime
does; PyTorch's fused CPU kernel does not). With the default length bounds (8, 32, 128, 512) a
list of more than 8 rows is padded to less than 4 times its length, a shorter one to 8 at most,
and one of more than 512 to the longest list of the batch; so, lists of more than 512 apart,
``Q <= 16 * sum_g max(L_g, 2)^2`` plus the dummy rows, where one block would need
``G * L_max^2``. Measured peak memory of ONNX Runtime on 200k rows in lists of 5..121 (MQ2008-like
skew), default sizes: about 1 GB, against 6 GB with a single block (``length_bounds=()``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["list_layout", "check_request", "ListAttentionBlock"]

Layout = tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]


def _runs(request: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``starts [G]`` (first row of each run of equal ids), ``counts [G]``, ``group [B]``."""
    new = torch.cat([request[:1] == request[:1], request[1:] != request[:-1]])
    starts = torch.nonzero(new).squeeze(1)
    group = torch.cumsum(new.long(), 0) - 1
    ends = torch.cat([starts[1:], torch.full_like(starts[:1], request.shape[0])])
    return starts, ends - starts, group


def list_layout(request: torch.Tensor, bounds: Sequence[int] = (8, 32, 128, 512), *,
                skip_empty: bool = False) -> Layout:
    """Padded layout of the lists of a flat batch, lists grouped into blocks by length.

    Block ``j`` holds the lists whose length lies in ``(bounds[j-1], bounds[j]]`` (the last block:
    longer than ``bounds[-1]``), padded to the longest list of the block, so a few long lists do
    not pad many short ones to their length. ``bounds=()`` gives a single block. Every block also
    holds one dummy list (row 0, length 1; no row's result is read from it), so that no tensor is
    ever empty: ONNX Runtime mishandles zero-sized reshapes.

    Only tensor operations, no Python number taken from the data (a block's width is the length of
    a ``nonzero`` result), so ``torch.jit.trace`` and the ONNX export record a computation that
    follows the ``request`` input at run time.

    Args:
        request: ``[B]`` integer list ids, ``B >= 1``; a list is a run of equal adjacent ids.
        bounds: increasing list lengths that separate the blocks.
        skip_empty: leave out blocks without a list (eager mode; a trace must keep them all).

    Returns:
        ``(srcs, masks, back)``: per block ``src [G_b + 1, L_b]`` (rows of the flat batch; padding
        repeats the list's first row) and ``mask [G_b + 1, L_b]`` (True on real rows), and
        ``back [B]``, the position of each row's result in the concatenation of the flattened
        blocks.

    >>> srcs, masks, back = list_layout(torch.tensor([7, 7, 7, 9]), bounds=())
    >>> srcs[0].tolist(), masks[0].tolist(), back.tolist()
    ([[0, 1, 2], [3, 3, 3], [0, 0, 0]], [[True, True, True], [True, False, False], [True, False, False]], [0, 1, 2, 3])
    """
    starts, counts, group = _runs(request)
    rows = torch.arange(request.shape[0], device=request.device)
    slot = torch.zeros_like(counts)  # flat position of each list's first slot
    offset = counts.new_zeros(())
    srcs, masks = [], []
    lo = 0
    for hi in [*bounds, None]:
        inside = counts > lo if hi is None else (counts > lo) & (counts <= int(hi))
        lo = 0 if hi is None else int(hi)
        gids = torch.nonzero(inside).squeeze(1)
        if skip_empty and gids.numel() == 0:
            continue
        n = torch.cat([counts[gids], counts.new_ones(1)])  # + the dummy list
        first = torch.cat([starts[gids], counts.new_zeros(1)])
        steps = torch.nonzero(rows < n.max()).squeeze(1)  # 0..L_b-1
        mask = steps[None, :] < n[:, None]
        srcs.append(torch.where(mask, first[:, None] + steps[None, :], first[:, None]))
        masks.append(mask)
        width = steps.shape[0]
        slot = slot + inside.long() * (offset + (torch.cumsum(inside.long(), 0) - 1) * width)
        offset = offset + n.shape[0] * width
    back = slot[group] + (rows - starts[group])
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
