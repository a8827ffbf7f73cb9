"""Hypothesis strategies for padded ``[G, L]`` lists (in the spirit of attrs' tests/strategies.py).

:func:`padded_lists` draws a batch of lists of different lengths, pads them to a common width
with garbage (large finite logits, out-of-range labels) so that any leak of padding into a loss
shows up, and returns the truncated per-list views too, for masked == truncated checks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st


@dataclass
class Lists:
    """A drawn batch: padded tensors plus the real items of every list."""

    logits: torch.Tensor  # [G, L] or [G, L, 2]
    labels: torch.Tensor  # [G, L]
    mask: torch.Tensor  # [G, L] bool
    weights: torch.Tensor  # [G, L], ones on real items unless weighted=True
    lengths: list[int]

    def pad_more(self, extra: int, fill: float = 7.0) -> Lists:
        """The same lists with ``extra`` more padding columns holding ``fill``."""
        g = self.labels.shape[0]
        tail = (g, extra) + tuple(self.logits.shape[2:])
        return Lists(
            torch.cat([self.logits, torch.full(tail, fill, dtype=self.logits.dtype)], dim=1),
            torch.cat([self.labels, torch.full((g, extra), fill)], dim=1),
            torch.cat([self.mask, torch.zeros(g, extra, dtype=torch.bool)], dim=1),
            torch.cat([self.weights, torch.full((g, extra), fill)], dim=1),
            self.lengths,
        )

    def row(self, g: int) -> Lists:
        """List g alone, truncated to its real items (no padding at all)."""
        n = self.lengths[g]
        return Lists(self.logits[g : g + 1, :n], self.labels[g : g + 1, :n],
                     self.mask[g : g + 1, :n], self.weights[g : g + 1, :n], [n])


@st.composite
def padded_lists(
    draw,
    *,
    max_lists: int = 4,
    max_len: int = 6,
    min_len: int = 0,
    label_max: int = 2,
    distinct_labels: bool = False,
    n_outputs: int = 1,
    weighted: bool = False,
    logit_scale: float = 6.0,
) -> Lists:
    """Draw ``G <= max_lists`` lists of ``min_len..max_len`` items, real items first in each row.

    Labels are integers in ``0..label_max`` (or distinct values ``0..n-1`` scaled into
    ``[0, label_max]`` with ``distinct_labels``); logits are finite floats in
    ``[-logit_scale, logit_scale]`` on a 1/64 grid (ties happen, shifts are exact); padding
    holds 1e4 logits and label ``-3`` (invalid on purpose: the loss must never read it).
    """
    g = draw(st.integers(1, max_lists))
    lengths = draw(st.lists(st.integers(min_len, max_len), min_size=g, max_size=g))
    width = max(max(lengths), 1) + draw(st.integers(0, 2))
    shape = (g, width) + ((n_outputs,) if n_outputs > 1 else ())
    logits = torch.full(shape, 1e4, dtype=torch.float64)
    labels = torch.full((g, width), -3.0, dtype=torch.float64)
    weights = torch.full((g, width), 5.0, dtype=torch.float64)
    mask = torch.zeros(g, width, dtype=torch.bool)
    score = st.floats(-logit_scale, logit_scale, allow_nan=False, width=32)
    for r, n in enumerate(lengths):
        if n == 0:
            continue
        flat = draw(st.lists(score, min_size=n * n_outputs, max_size=n * n_outputs))
        # on a grid of 1/64 so that shifts and permutations are exact in floating point
        grid = torch.round(torch.tensor(flat, dtype=torch.float64) * 64) / 64
        logits[r, :n] = grid.reshape((n,) + shape[2:])
        if distinct_labels:
            perm = draw(st.permutations(range(n)))
            labels[r, :n] = torch.tensor(perm, dtype=torch.float64) * label_max / max(n - 1, 1)
        else:
            vals = draw(st.lists(st.integers(0, label_max), min_size=n, max_size=n))
            labels[r, :n] = torch.tensor(vals, dtype=torch.float64)
        if weighted:
            ws = draw(st.lists(st.floats(0.25, 4.0), min_size=n, max_size=n))
            weights[r, :n] = torch.tensor(ws, dtype=torch.float64)
        else:
            weights[r, :n] = 1.0
        mask[r, :n] = True
    return Lists(logits, labels, mask, weights, lengths)
