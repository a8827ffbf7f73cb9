"""The position-bias tower: a logit offset per display slot, zero at the reference slot.

Examination model on the logit scale (CONVENTIONS.md §4b): the click logit of an impression shown
in slot ``j`` is ``relevance(x) + b_j``, with ``b_ref = 0`` at the reference slot (1: the top), so
the relevance part alone *is* the click logit at the reference slot: the position-free pCTR an
auction multiplies by a bid before slots exist.

**How the offsets are estimated.** They are not trained by gradient steps (a handful of parameters
next to thousands of embedding rows: Adam moves each by about the learning rate per step, so they
either crawl or, scaled up, random-walk). Training alternates, as regression EM does (Wang et al.
2018): the relevance model takes gradient steps with the offsets held fixed, and at the end of
every training epoch (just before validation) each offset gets an exact per-slot update from
sufficient statistics summed over that epoch's impressions in slot ``j``,

    Y_j = Σ w·y,   P_j = Σ w·σ(r + b_j),   N_j = Σ w,

    b_j ← b_j + [logit(Y_j / N_j) - logit(P_j / N_j)] - [the same for the reference slot],

a fixed-point step for the per-slot score equation ``Σ w (y - σ(r + b_j)) = 0`` (exact when the
slot's relevance logits are equal; ``log(Y_j / P_j)`` at small CTR). At the fixed point the model's
expected clicks equal the observed clicks in every slot. The sums are float64 buffers: DDP
all-reduces them before the update, checkpoints carry them (mid-epoch resume is exact).

**Intervals.** An online Poisson bootstrap over requests (Chamandy et al. 2012): every request of a
batch gets ``n_boot`` independent Poisson(1) weights, and replicate sums accumulate beside the main
ones; each replicate's offsets follow from the same update, and their percentiles are the
interval. It measures the sampling error of the offsets given the relevance model (not the
relevance model's own uncertainty).

**Slots.** Positions are 1-based (``validate_frame`` refuses 0, negatives and missing values).
Positions above ``max_position`` share its offset (``tail="share"``, the default: the tail of a
long list is rare; the report counts them) or are an error (``tail="error"``). A slot never seen
in training carries the offset of the nearest lower slot that was, and is reported as not
estimated.

**What is identifiable.** With items shown in random order (or partly randomised), slot and
relevance are independent and the offsets are per-slot CTR ratios given the features. Under a
logging policy that sorts by relevance, the offsets also absorb whatever relevance the features
do not explain: the position-free pCTR then rests on the assumption that the features explain
the logging order (docs/EXPORT.md, "Position bias").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = ["PositionBias", "slot_logit_step"]

_TAILS = ("share", "error")
_PSEUDO = 0.5  # pseudo-count of clicks and non-clicks in every logit of a ratio (no log(0))


def slot_logit_step(clicks: torch.Tensor, expected: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """Per-slot update ``logit(Y / N) - logit(P / N)`` from sums ``[..., S]`` (0 where ``N = 0``).

    ``clicks`` = Σ w·y, ``expected`` = Σ w·σ(logit), ``count`` = Σ w, each over a slot's
    impressions; half a click and half a non-click are added to both ratios.

    >>> slot_logit_step(torch.tensor([10.0]), torch.tensor([10.0]), torch.tensor([100.0])).item()
    0.0
    >>> round(slot_logit_step(torch.tensor([5.0]), torch.tensor([10.0]), torch.tensor([1000.0])).item(), 3)
    -0.674
    """
    n = count + 2 * _PSEUDO
    step = (torch.log(clicks + _PSEUDO) - torch.log(n - clicks - _PSEUDO)
            - torch.log(expected + _PSEUDO) + torch.log(n - expected - _PSEUDO))
    return torch.where(count > 0, step, torch.zeros_like(step))


class PositionBias(nn.Module):
    """A logit offset per display slot, estimated exactly given the relevance model.

    Args:
        max_position: slots ``1..max_position`` have their own offset.
        reference_position: the slot whose click probability the serving pCTR is (offset 0).
        tail: positions above ``max_position``: ``"share"`` its offset, or ``"error"``.
        n_boot: Poisson bootstrap replicates for the offsets' intervals (0: none).
        alpha: the intervals' level is ``1 - alpha``.
        seed: seed of the bootstrap weights (with the training step, so resumes repeat them).

    ``forward(position [B]) -> [B]`` offsets; training calls :meth:`accumulate` per batch and
    :meth:`update` once per epoch (``HybridRanker`` does both).

    >>> b = PositionBias(max_position=5)
    >>> b(torch.tensor([1, 3, 9])).tolist()    # no data yet: no effect
    [0.0, 0.0, 0.0]
    """

    def __init__(self, max_position: int = 50, reference_position: int = 1, tail: str = "share",
                 n_boot: int = 100, alpha: float = 0.05, seed: int = 0):
        super().__init__()
        if int(max_position) < 1 or not 1 <= int(reference_position) <= int(max_position):
            raise ValueError(f"reference_position={reference_position} must lie in "
                             f"[1, max_position={max_position}]")
        if tail not in _TAILS:
            raise ValueError(f"tail must be one of {_TAILS}, got {tail!r}")
        if int(n_boot) < 0 or not 0 < float(alpha) < 1:
            raise ValueError(f"need n_boot >= 0 and 0 < alpha < 1, got {n_boot}, {alpha}")
        self.max_position, self.reference_position = int(max_position), int(reference_position)
        self.tail, self.n_boot, self.alpha, self.seed = tail, int(n_boot), float(alpha), int(seed)
        s, k = self.max_position, self.n_boot
        f64 = torch.float64
        self.register_buffer("offset", torch.zeros(s))                   # b_j (float32 for serving)
        self.register_buffer("sums", torch.zeros(3, s, dtype=f64))        # Y, P, N of this epoch
        self.register_buffer("boot_sums", torch.zeros(3, k, s, dtype=f64))
        self.register_buffer("boot_offset", torch.zeros(k, s, dtype=f64))  # replicate offsets
        self.register_buffer("seen", torch.zeros(s, dtype=f64))           # impressions ever seen
        self.register_buffer("last", torch.zeros(3, s, dtype=f64))        # sums of the last update
        self.register_buffer("tail_count", torch.zeros(2, dtype=f64))     # tail impressions: epoch, last update
        self.register_buffer("updates", torch.zeros((), dtype=torch.long))
        self.register_buffer("last_change", torch.full((), math.nan, dtype=f64))

    # --- slots ----------------------------------------------------------------------------------
    def slot_index(self, position: torch.Tensor) -> torch.Tensor:
        """0-based slot index of 1-based positions (the tail rule applied)."""
        pos = position.long()
        if not torch.jit.is_scripting() and not torch.jit.is_tracing():
            if pos.numel() and bool((pos < 1).any()):
                raise ValueError(f"positions are 1-based; got {int(pos.min())}")
            if self.tail == "error" and pos.numel() and bool((pos > self.max_position).any()):
                raise ValueError(f"position {int(pos.max())} is past max_position={self.max_position} "
                                 f"(tail='error'); raise max_position or use tail='share'")
        return pos.clamp(1, self.max_position) - 1

    def forward(self, position: torch.Tensor) -> torch.Tensor:
        """``[B]`` logit offsets of 1-based positions ``[B]`` (0 at the reference slot)."""
        return self.offset[self.slot_index(position)]

    # --- estimation -----------------------------------------------------------------------------
    @torch.no_grad()
    def accumulate(self, position: torch.Tensor, relevance: torch.Tensor, label: torch.Tensor,
                   weight: torch.Tensor | None = None, request: torch.Tensor | None = None,
                   step: int = 0) -> None:
        """Add a batch to this epoch's per-slot sums.

        Args:
            position: ``[B]`` logged 1-based positions. relevance: ``[B]`` position-free click
            logits. label: ``[B]`` labels (click = label > 0). weight: ``[B]`` impression
            weights (negative re-weighting) or None. request: ``[B]`` request index of each
            impression within the batch (bootstrap weights are per request; None: per
            impression). step: the training step (seeds the bootstrap weights).
        """
        slot = self.slot_index(position)
        y = (label > 0).double()
        w = torch.ones_like(y) if weight is None else weight.double()
        p = torch.sigmoid(relevance.double() + self.offset[slot].double())
        vals = torch.stack([w * y, w * p, w])                                 # [3, B]
        self.sums.index_add_(1, slot, vals)
        self.seen.index_add_(0, slot, torch.ones_like(y))
        self.tail_count[0] += float((position.long() > self.max_position).sum())
        if self.n_boot:
            req = torch.arange(y.numel(), device=y.device) if request is None else request.long()
            n_req = int(req.max()) + 1 if req.numel() else 0
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + int(step))
            counts = torch.poisson(torch.ones(n_req, self.n_boot, dtype=torch.float64), g)
            rw = counts.to(y.device)[req]                                      # [B, K]
            boot = vals.T.unsqueeze(-1) * rw.unsqueeze(1)                      # [B, 3, K]
            self.boot_sums.index_add_(2, slot, boot.permute(1, 2, 0))

    @torch.no_grad()
    def update(self, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None
               ) -> tuple[float, float] | None:
        """One exact per-slot step from this epoch's sums (all-reduced by ``reduce`` under DDP).

        Returns ``(change, reference_step)``: the largest change of an estimated offset, and the
        step of the reference slot itself, which the offsets cannot take (they are relative to
        it): the caller adds it to the relevance model's intercept
        (:func:`~hybridrank.models.scorers.shift_click_logit`), so that every slot, the reference
        included, gets its exact step. None when there was nothing to fit.
        """
        sums, boot, tail = self.sums.clone(), self.boot_sums.clone(), self.tail_count[:1].clone()
        if reduce is not None:
            sums, boot, tail = reduce(sums), reduce(boot), reduce(tail)
        if float(sums[2].sum()) == 0:
            return None
        ref = self.reference_position - 1
        old = self.offset.double()
        step = slot_logit_step(*sums)
        new = old + step - step[ref]
        seen = self.seen.clone() if reduce is None else reduce(self.seen.clone())
        new = self._fill_unseen(new, seen > 0)
        if self.n_boot:
            bstep = slot_logit_step(*boot)                                     # [K, S]
            reps = new + (bstep - step) - (bstep[:, ref:ref + 1] - step[ref])
            self.boot_offset.copy_(torch.stack([self._fill_unseen(r, seen > 0) for r in reps]))
        estimated = seen > 0
        change = float((new - old)[estimated].abs().max()) if bool(estimated.any()) else 0.0
        self.offset.copy_(new.to(self.offset.dtype))
        self.last.copy_(sums)
        self.tail_count[1] = tail[0]
        self.tail_count[0] = 0
        self.sums.zero_()
        self.boot_sums.zero_()
        self.updates += 1
        self.last_change.fill_(change)
        return change, float(step[ref])

    @staticmethod
    def _fill_unseen(offsets: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        """Unseen slots take the offset of the nearest lower seen slot (0 if none)."""
        out = offsets.clone()
        carry = torch.zeros((), dtype=out.dtype, device=out.device)
        for j in range(out.numel()):
            if bool(seen[j]):
                carry = out[j]
            else:
                out[j] = carry
        return out

    # --- reporting ------------------------------------------------------------------------------
    @torch.no_grad()
    def offsets(self) -> list[float]:
        """Logit offset of positions ``1..max_position`` (0 at the reference): an auction's expected
        CTR in slot ``j`` is ``σ(logit(pctr) + offsets[j - 1])``."""
        return self.offset.double().tolist()

    @torch.no_grad()
    def report(self) -> dict[str, Any]:
        """Offsets with bootstrap intervals and the data behind each (JSON-safe), for the train
        report and the export metadata."""
        seen = (self.seen > 0).tolist()
        lo = hi = [None] * self.max_position
        if self.n_boot and int(self.updates) > 0:
            q = torch.quantile(self.boot_offset, torch.tensor([self.alpha / 2, 1 - self.alpha / 2],
                                                             dtype=torch.float64), dim=0)
            lo, hi = q[0].tolist(), q[1].tolist()
        ref = self.reference_position - 1
        return {
            "reference_position": self.reference_position, "max_position": self.max_position,
            "tail": self.tail, "estimator": "per-slot exact update each epoch (regression-EM step)",
            "logit_offsets": self.offsets(),
            "lower": [None if not s or j == ref else v for j, (s, v) in enumerate(zip(seen, lo))],
            "upper": [None if not s or j == ref else v for j, (s, v) in enumerate(zip(seen, hi))],
            "estimated": seen,
            "impressions": self.last[2].tolist(), "clicks": self.last[0].tolist(),
            "tail_impressions": float(self.tail_count[1]),
            "updates": int(self.updates),
            "last_change": None if math.isnan(float(self.last_change)) else float(self.last_change),
            "interval": {"n_boot": self.n_boot, "alpha": self.alpha,
                         "method": "online Poisson bootstrap over requests, given the relevance model"},
        }
