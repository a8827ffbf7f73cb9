"""The position-bias tower: a logit offset per display slot, zero at the reference slot."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["PositionBias"]


class PositionBias(nn.Module):
    """A shallow position-bias tower: a learned logit offset per display position.

    Training uses ``logit = relevance(x) + bias(position)``; serving, where candidates are scored
    before positions exist, uses the relevance part alone, which *is* the logit at the reference
    position: ``bias(reference_position) = 0`` by construction (``bias(p) = w[p] - w[ref]``),
    so the constant the two parts could trade is pinned. Additive on the logit scale, as the
    examination models of position-bias estimation (Craswell et al. 2008; the shallow tower of
    Zhao et al. 2019, YouTube) and as the simulator's own ``- 0.5 · log(position)``.

    Args:
        max_position: positions above it share its offset (the tail of a long list is rare).
        reference_position: the position whose click probability the serving pCTR is (1: the
            top slot). Per-position factors for an auction are :meth:`offsets`.
        scale: the offsets are ``scale × weight``. Adam moves every parameter by about the
            learning rate per step whatever its gradient's size, so a few hundred steps at
            ``lr = 2e-3`` move a plain offset by well under the ``~1.5`` a position effect spans;
            the scale gives the tower's handful of parameters a proportionally larger step.

    >>> b = PositionBias(max_position=5)
    >>> b(torch.tensor([1, 3, 9])).tolist()    # zero-initialised: no effect until trained
    [0.0, 0.0, 0.0]
    """

    def __init__(self, max_position: int = 20, reference_position: int = 1, scale: float = 50.0):
        super().__init__()
        if not 1 <= int(reference_position) <= int(max_position):
            raise ValueError(f"reference_position={reference_position} must lie in "
                             f"[1, max_position={max_position}]")
        if not float(scale) > 0:
            raise ValueError(f"scale must be > 0, got {scale}")
        self.max_position, self.reference_position = int(max_position), int(reference_position)
        self.scale = float(scale)
        self.weight = nn.Parameter(torch.zeros(self.max_position))

    def _table(self) -> torch.Tensor:
        return self.scale * (self.weight - self.weight[self.reference_position - 1])

    def forward(self, position: torch.Tensor) -> torch.Tensor:
        """``[B]`` logit offsets of 1-based positions ``[B]`` (relative to the reference)."""
        idx = position.long().clamp(1, self.max_position) - 1
        return self._table()[idx]

    @torch.no_grad()
    def offsets(self) -> list[float]:
        """Logit offset of positions ``1..max_position`` (0 at the reference): an auction's expected
        CTR in slot ``j`` is ``σ(logit(pctr) + offsets[j - 1])``."""
        return self._table().double().tolist()
