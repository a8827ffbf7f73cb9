"""The position-bias tower: :class:`PositionBias`, the ``nn.Module`` that holds the offsets and
their sums, and feeds them to the estimator (:mod:`.estimators`) once per epoch.

**No host round trip in a training step.** What the tower does per training batch (the offsets'
lookup, offset dropout, adding the batch to the sums, the rank diagnosis, the bootstrap weights)
never reads a value from an accelerator: whether the effect reads NOT identified is a Python
flag set by each update (and by a checkpoint's load), the number of requests comes from the
lists' shape, and the checks of the input (1-based positions, ``tail="error"``, propensities in
``(0, 1]``) are recorded on the device and raised by the next :meth:`PositionBias.update` (or
the next checkpoint's ``state_dict``, whichever comes first).
Tensors on the CPU are read at once (that costs nothing), as is everything outside training.
The per-epoch update and the report read the device freely.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import hybridrank._device as _device
from hybridrank.models.position import report as _report
from hybridrank.models.position.bootstrap import replicate_sums, request_weights
from hybridrank.models.position.diagnosis import RankDiagnosis, Traffic, rank_evidence, within_request_rank_correlation
from hybridrank.models.position.estimators import (
    SlotSums,
    bootstrap_offsets,
    level_bounds_from_clicks,
    level_bounds_from_slot,
    level_step,
    offset_update,
)

__all__ = ["DROPOUT_WHEN", "TAILS", "PositionBias"]

TAILS = ("share", "error")
DROPOUT_WHEN = ("not_identified", "always")


def _masked_sum(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``Σ x[keep]``: on the CPU over the kept values (the summation order of a plain sum over
    them), elsewhere as ``Σ where(keep, x, 0)``, which needs no host round trip (the same up to
    float rounding)."""
    if _device.free_to_read(keep):
        return x[keep].sum()
    return torch.where(keep, x, torch.zeros_like(x)).sum()


class PositionBias(nn.Module):
    """A logit offset per display slot, estimated exactly given the relevance model.

    Args:
        max_position: slots ``1..max_position`` have their own offset.
        reference_position: the slot whose click probability the serving pCTR is (offset 0).
        tail: positions above ``max_position``: ``"share"`` its offset, or ``"error"``.
        n_boot: Poisson bootstrap replicates for the offsets' intervals (0: none).
        alpha: the intervals' level is ``1 - alpha``.
        seed: seed of the bootstrap weights (with the training step, so resumes repeat them).
        max_ipw: cap of the inverse-propensity weights (with a propensity column).
        monotone: the offsets never rise with the slot (a vertical list of slots: attention falls
            with the slot): each update is projected on non-increasing sequences (weighted pool
            adjacent violators). It pools neighbouring slots whose separate estimates are noise,
            which shrinks the error of slots with few clicks a lot. ``False`` for layouts where
            a lower slot can draw more attention (grids, carousels).
        pool: shrink each slot's estimate toward a smooth curve in the slot by as much as its
            noise exceeds the slots' spread around that curve
            (:func:`~hybridrank.models.position.estimators.pool_toward_curve`; empirical Bayes).
            Slots with few clicks, and the reference slot's level, borrow strength from the
            others. ``False``: every slot from its own clicks (the per-slot maximum likelihood).
        refit: after fitting, one more exact update from the kept checkpoint's own logits over
            the whole training split (``hybridrank.cli.train.refit_position_bias``; bootstrap
            replicates and diagnosis included). The per-epoch updates use logits gathered while
            the weights still move, which spread less than the final model's: on randomly built
            logs with many clicks that left the deep slots' offsets about 0.05 logit too close to
            zero (docs/BENCHMARKS.md, "When the offsets can be trusted").
        dropout: the share of training impressions whose offset the relevance model's loss does
            not see (replaced by the batch's mean offset; :meth:`drop_offsets`), after the
            position-feature dropout of Zhao et al. (2019): on a log sorted by relevance the
            offsets absorb part of the sort, and the relevance model compensates by scoring the
            items shown low too high; impressions without their offset pull the other way. The
            offsets' own update, the validation loss and the serving score are unaffected. The
            larger the share, the closer the relevance model comes to a position-blind fit of the
            logged clicks, true position effect included; the validation loss (logged slots) then
            rises and the stopping rule can keep the first epoch, trained before any dropout. 0.5
            by default, with ``dropout_when="not_identified"`` (docs/BENCHMARKS.md, "Offset
            dropout"; 0 turns it off).
        dropout_when: ``"not_identified"``: only while the last update read the position effect
            as NOT identified (:meth:`confounded`: a sorted log, no exploration or propensities),
            so identified logs train exactly as without it; ``"always"``: every epoch after the first
            update (before it every offset is 0, so dropout can change nothing in the first epoch).
        diagnosis_requests: about how many requests per epoch enter the rank diagnosis (0: every
            request of every batch). After an update that read more, the next epoch (or refit)
            diagnoses the batches of every k-th training step only, ``k = requests read //
            diagnosis_requests`` (the ``diagnosis_stride`` buffer; the first epoch's, when the
            training requests are known before the fit, :meth:`plan_diagnosis`, which
            ``HybridRanker`` calls with its datamodule's count): the verdict's standard error at
            50,000 requests is ~0.002 against a threshold of 0.05, and the per-batch rank sorts
            cost ~10 % of a CPU training step on a large log. Small logs are diagnosed whole.

    ``forward(position [B]) -> [B]`` offsets; training calls :meth:`accumulate` per batch and
    :meth:`update` once per epoch (``HybridRanker`` does both).

    State (float64 buffers unless said; ``S = max_position``, ``K = n_boot``; sums are
    :class:`~hybridrank.models.position.estimators.SlotSums` stacked ``[3, ..., S]``, rank sums a
    :class:`~hybridrank.models.position.diagnosis.RankDiagnosis` stacked ``[5]``): ``offset``
    (float32, the serving offsets); this epoch's ``epoch_sums``, ``epoch_boot_sums`` and the same
    over the identifying traffic ``epoch_identifying_sums``, ``epoch_identifying_boot_sums``,
    ``epoch_diagnosis``, ``epoch_tail`` (impressions past ``max_position``), ``seen``
    (impressions ever seen per slot), ``identifying_traffic`` (the kind of identifying traffic
    seen, a :class:`~hybridrank.models.position.diagnosis.Traffic` code); and of the last update
    ``fitted_on`` (its traffic code), ``estimated`` (bool), ``last_sums``, ``last_fit_sums`` (of
    the traffic it fitted), ``last_diagnosis``, ``last_tail``, ``boot_offset`` ``[K, S]``,
    ``offset_lower`` / ``offset_upper`` and ``level_lower`` / ``level_upper`` (the intervals,
    NaN: none), ``updates`` (long), ``last_change`` and ``diagnosis_stride`` (long: the next
    epoch diagnoses every k-th step). DDP all-reduces the sums before the
    update; checkpoints carry them (a mid-epoch resume is exact).

    >>> b = PositionBias(max_position=5)
    >>> b(torch.tensor([1, 3, 9])).tolist()    # no data yet: no effect
    [0.0, 0.0, 0.0]
    """

    def __init__(self, max_position: int = 50, reference_position: int = 1, tail: str = "share",
                 n_boot: int = 100, alpha: float = 0.05, seed: int = 0, max_ipw: float = 100.0,
                 monotone: bool = True, pool: bool = True, refit: bool = True,
                 dropout: float = 0.5, dropout_when: str = "not_identified",
                 diagnosis_requests: int = 50_000):
        super().__init__()
        if int(max_position) < 1 or not 1 <= int(reference_position) <= int(max_position):
            raise ValueError(f"reference_position={reference_position} must lie in "
                             f"[1, max_position={max_position}]")
        if tail not in TAILS:
            raise ValueError(f"tail must be one of {TAILS}, got {tail!r}")
        if int(n_boot) < 0 or not 0 < float(alpha) < 1:
            raise ValueError(f"need n_boot >= 0 and 0 < alpha < 1, got {n_boot}, {alpha}")
        self.max_position, self.reference_position = int(max_position), int(reference_position)
        self.tail, self.n_boot, self.alpha, self.seed = tail, int(n_boot), float(alpha), int(seed)
        if not float(max_ipw) >= 1:
            raise ValueError(f"max_ipw must be >= 1, got {max_ipw}")
        self.max_ipw = float(max_ipw)
        self.monotone = bool(monotone)
        self.pool = bool(pool)
        self.refit = bool(refit)
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"position_bias.dropout must lie in [0, 1), got {dropout}")
        self.dropout = float(dropout)
        if dropout_when not in DROPOUT_WHEN:
            raise ValueError(f"position_bias.dropout_when must be one of {DROPOUT_WHEN}, got "
                             f"{dropout_when!r}")
        self.dropout_when = dropout_when
        if int(diagnosis_requests) < 0:
            raise ValueError(f"position_bias.diagnosis_requests must be >= 0, got {diagnosis_requests}")
        self.diagnosis_requests = int(diagnosis_requests)
        # diagnose the batches of every k-th step: a Python mirror of the diagnosis_stride buffer,
        # set by each update and load (a training step reads no buffer)
        self._stride = 1
        # whether the last update read the effect as NOT identified: set by each update and load
        self._confounded = False
        # input checks of accelerator training steps, raised by the next update or state_dict:
        # the running [min, max] of the positions, and whether a propensity lay outside (0, 1]
        self._position_range: torch.Tensor | None = None
        self._bad_propensity: torch.Tensor | None = None
        s, k = self.max_position, self.n_boot
        f64 = torch.float64

        def buffer(name: str, *shape: int, dtype: torch.dtype = f64, fill: float = 0.0) -> None:
            self.register_buffer(name, torch.full(shape, fill, dtype=dtype))

        buffer("offset", s, dtype=torch.float32)        # b_j (float32 for serving)
        # this epoch: all the traffic, and the identifying traffic (exploration requests, or
        # inverse-propensity weighted impressions)
        buffer("epoch_sums", 3, s)
        buffer("epoch_boot_sums", 3, k, s)
        buffer("epoch_identifying_sums", 3, s)
        buffer("epoch_identifying_boot_sums", 3, k, s)
        buffer("epoch_diagnosis", len(RankDiagnosis._fields))
        buffer("epoch_tail")
        buffer("seen", s)
        buffer("identifying_traffic", dtype=torch.long, fill=Traffic.ALL)
        # the last update
        buffer("fitted_on", dtype=torch.long, fill=Traffic.ALL)
        buffer("estimated", s, dtype=torch.bool)
        buffer("last_sums", 3, s)
        buffer("last_fit_sums", 3, s)
        buffer("last_diagnosis", len(RankDiagnosis._fields))
        buffer("last_tail")
        buffer("boot_offset", k, s)
        buffer("offset_lower", s, fill=math.nan)
        buffer("offset_upper", s, fill=math.nan)
        buffer("level_lower", fill=math.nan)
        buffer("level_upper", fill=math.nan)
        buffer("updates", dtype=torch.long)
        buffer("last_change", fill=math.nan)
        buffer("diagnosis_stride", dtype=torch.long, fill=1)

    # --- slots ----------------------------------------------------------------------------------
    def _check_positions(self, lowest: int, highest: int) -> None:
        if lowest < 1:
            raise ValueError(f"positions are 1-based; got {lowest}")
        if self.tail == "error" and highest > self.max_position:
            raise ValueError(f"position {highest} is past max_position={self.max_position} "
                             f"(tail='error'); raise max_position or use tail='share'")

    def _defers_checks(self, t: torch.Tensor) -> bool:
        """Are the checks of ``t`` left to the next update (an accelerator's training step)?"""
        return self.training and not _device.free_to_read(t)

    def slot_index(self, position: torch.Tensor) -> torch.Tensor:
        """``[B]`` 0-based slot index of 1-based positions ``[B]`` (the tail rule applied)."""
        pos = position.long()
        if not torch.jit.is_scripting() and not torch.jit.is_tracing() and pos.numel():
            lo, hi = torch.aminmax(pos)
            if not self._defers_checks(pos):
                self._check_positions(int(lo), int(hi))
            elif self._position_range is None:
                self._position_range = torch.stack([lo, hi])
            else:
                self._position_range = torch.stack([torch.minimum(lo, self._position_range[0]),
                                                    torch.maximum(hi, self._position_range[1])])
        return pos.clamp(1, self.max_position) - 1

    def _raise_deferred(self) -> None:
        """Raise what the checks of accelerator training steps found (and forget them)."""
        found, bad = self._position_range, self._bad_propensity
        self._position_range = self._bad_propensity = None
        if found is not None:
            lo, hi = found.tolist()
            self._check_positions(lo, hi)
        if bad is not None and bool(bad):
            raise ValueError("propensities must lie in (0, 1]")

    def forward(self, position: torch.Tensor) -> torch.Tensor:
        """``[B]`` logit offsets of 1-based positions ``[B]`` (0 at the reference slot)."""
        return self.offset[self.slot_index(position)]

    def drop_offsets(self, out: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """Training outputs ``out [B, n_outputs]`` (the click logit last, with each impression's
        offset added) with the offset of a random ``dropout`` share of the impressions replaced
        by the batch's mean offset; ``out`` itself when ``dropout`` is 0, and with
        ``dropout_when="not_identified"`` while the effect is not :meth:`confounded`."""
        if not self.dropout or out.shape[0] == 0:
            return out
        if self.dropout_when == "not_identified" and not self.confounded():
            return out
        bias = self(position).to(out.dtype)
        drop = torch.rand(bias.shape, device=bias.device) < self.dropout
        delta = torch.where(drop, bias.mean() - bias, torch.zeros_like(bias))
        return torch.cat([out[:, :-1], out[:, -1:] + delta.unsqueeze(-1)], dim=1)

    # --- estimation -----------------------------------------------------------------------------
    def _identifying_weights(self, explore: torch.Tensor | None,
                             propensity: torch.Tensor | None) -> torch.Tensor | None:
        """``[B]`` weights of the identifying traffic (exploration flags, capped inverse
        propensities, or their product), or None without either."""
        xw = None
        if propensity is not None:
            prop = propensity.double()
            bad = ((prop <= 0) | (prop > 1) | ~torch.isfinite(prop)).any()
            if self._defers_checks(bad):
                self._bad_propensity = bad if self._bad_propensity is None else self._bad_propensity | bad
            elif bool(bad):
                raise ValueError("propensities must lie in (0, 1]")
            xw = (1.0 / prop).clamp(max=self.max_ipw)
        if explore is not None:
            e = explore.to(torch.float64)
            xw = e if xw is None else xw * e
        return xw

    def _diagnose(self, position: torch.Tensor, relevance: torch.Tensor,
                  explore: torch.Tensor | None, index: torch.Tensor, mask: torch.Tensor) -> None:
        """Add the batch's within-request rank correlations to ``epoch_diagnosis``."""
        lpos = torch.where(mask, position[index], torch.zeros_like(index))
        lrel = torch.where(mask, relevance[index].double(), torch.zeros_like(index, dtype=torch.float64))
        rho, valid = within_request_rank_correlation(lpos, lrel, mask)
        exploration = torch.zeros((), dtype=torch.long, device=mask.device)
        if explore is not None:
            lx = explore[index[:, 0]] & mask[:, 0]
            exploration = lx.sum()
            valid = valid & ~lx
        self.epoch_diagnosis += RankDiagnosis(
            sum_rho=_masked_sum(rho, valid), sum_rho_sq=_masked_sum(rho * rho, valid),
            measured=valid.sum(), exploration=exploration, requests=mask.any(1).sum()).stacked()

    @torch.no_grad()
    def accumulate(self, position: torch.Tensor, relevance: torch.Tensor, label: torch.Tensor,
                   weight: torch.Tensor | None = None, request: torch.Tensor | None = None,
                   step: int = 0, explore: torch.Tensor | None = None,
                   propensity: torch.Tensor | None = None,
                   lists: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """Add a batch to this epoch's per-slot sums ``(Σ w·y, Σ w·σ(r + b_j), Σ w)``.

        Args:
            position: ``[B]`` logged 1-based positions. relevance: ``[B]`` position-free click
            logits. label: ``[B]`` labels (click = label > 0). weight: ``[B]`` impression
            weights (negative re-weighting) or None. request: ``[B]`` request index of each
            impression within the batch, ``0..G-1`` for the ``G`` request lists of ``lists``
            (bootstrap weights are per request; None: per impression). step: the training step
            (seeds the bootstrap weights).
            explore: ``[B]`` bool, impressions of exploration (random-order) requests, or None.
            propensity: ``[B]`` probability that the logging policy put the item in its slot
            (inverse-propensity weights, capped at ``max_ipw``), or None.
            lists: ``(index, mask)``, the batch's ``[G, L]`` request lists, for the diagnosis
            (and the number of requests: without them, ``request`` is read).
        """
        slot = self.slot_index(position)
        y = (label > 0).double()
        w = torch.ones_like(y) if weight is None else weight.double()
        p = torch.sigmoid(relevance.double() + self.offset[slot].double())
        vals = torch.stack(SlotSums(w * y, w * p, w))                        # [3, B]
        self.epoch_sums.index_add_(1, slot, vals)
        self.seen.index_add_(0, slot, torch.ones_like(y))
        self.epoch_tail += (position.long() > self.max_position).sum()
        xw = self._identifying_weights(explore, propensity)
        if xw is not None:
            self.epoch_identifying_sums.index_add_(1, slot, vals * xw)
            self.identifying_traffic.fill_(Traffic.PROPENSITY if propensity is not None
                                           else Traffic.EXPLORATION)
        if self.n_boot:
            if request is None:
                req, n_req = torch.arange(y.numel(), device=y.device), y.numel()
            else:
                req = request.long()
                n_req = (lists[0].shape[0] if lists is not None
                         else int(req.max()) + 1 if req.numel() else 0)
            counts = request_weights(n_req, self.n_boot, self.seed * 1_000_003 + int(step), y.device)
            cell = req * self.max_position + slot
            self.epoch_boot_sums += replicate_sums(vals, cell, counts, self.max_position)
            if xw is not None:
                self.epoch_identifying_boot_sums += replicate_sums(vals * xw, cell, counts,
                                                                   self.max_position)
        if lists is not None and (self._stride == 1 or int(step) % self._stride == 0):
            self._diagnose(position, relevance, explore, *lists)

    @torch.no_grad()
    def update(self, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None
               ) -> tuple[float, float] | None:
        """One exact per-slot step from this epoch's sums (all-reduced by ``reduce`` under DDP).

        Raises what the checks of accelerator training steps found (bad positions or
        propensities) first.

        Returns ``(change, reference_step)``: the largest change of an estimated offset, and the
        step of the reference slot itself, which the offsets cannot take (they are relative to
        it): the caller adds it to the relevance model's intercept
        (:func:`~hybridrank.models.scorers.shift_click_logit`), so that every slot, the reference
        included, gets its exact step. None when there was nothing to fit.
        """
        self._raise_deferred()
        sums, boot, tail = self.epoch_sums.clone(), self.epoch_boot_sums.clone(), self.epoch_tail.clone()
        sums_x, boot_x = self.epoch_identifying_sums.clone(), self.epoch_identifying_boot_sums.clone()
        diag = self.epoch_diagnosis.clone()
        if reduce is not None:
            sums, boot, tail = reduce(sums), reduce(boot), reduce(tail)
            sums_x, boot_x, diag = reduce(sums_x), reduce(boot_x), reduce(diag)
        every, identifying_sums = SlotSums.of(sums), SlotSums.of(sums_x)
        if float(every.count.sum()) == 0:
            return None
        ref = self.reference_position - 1
        old = self.offset.double()
        seen = self.seen.clone() if reduce is None else reduce(self.seen.clone())
        # identifying traffic, when there is some in the reference slot and another one
        identifying = (float(identifying_sums.count[ref]) > 0
                       and int((identifying_sums.count > 0).sum()) >= 2)
        fit_sums, fit_boot = (sums_x, boot_x) if identifying else (sums, boot)
        est = (identifying_sums.count > 0) if identifying else (seen > 0)
        fit = offset_update(old, SlotSums.of(fit_sums), est, ref, pool=self.pool,
                            monotone=self.monotone)
        new = fit.offset
        # the reference slot's own step goes to the relevance intercept; from identifying traffic
        # the intercept's step is the one that matches predicted to observed clicks over ALL
        # the data once the offsets have moved
        ref_step = float(level_step(every, new - old)) if identifying else float(fit.level[ref] - old[ref])
        if self.n_boot:
            bfit = bootstrap_offsets(old, SlotSums.of(fit_boot), fit.info, est, ref, pool=self.pool,
                                     monotone=self.monotone, alpha=self.alpha)
            self.boot_offset.copy_(bfit.offset)
            self.offset_lower.copy_(bfit.bounds[0])
            self.offset_upper.copy_(bfit.bounds[1])
            # the serving level's sampling spread: each replicate's level by the same rule
            if identifying:
                lb = level_bounds_from_clicks(SlotSums.of(boot), self.boot_offset, old, ref_step,
                                              self.alpha)
            else:
                lb = level_bounds_from_slot(fit, bfit, ref, pool=self.pool, alpha=self.alpha)
            self.level_lower.copy_(lb[0])
            self.level_upper.copy_(lb[1])
        self.fitted_on.fill_(int(self.identifying_traffic) if identifying else Traffic.ALL)
        self.last_diagnosis.copy_(diag)
        self.epoch_diagnosis.zero_()
        self._stride = self._next_stride(RankDiagnosis.read(diag).requests)
        self.diagnosis_stride.fill_(self._stride)
        self.epoch_identifying_sums.zero_()
        self.epoch_identifying_boot_sums.zero_()
        self.estimated.copy_(est)
        change = float((new - old)[est].abs().max()) if bool(est.any()) else 0.0
        self.offset.copy_(new.to(self.offset.dtype))
        self.last_sums.copy_(sums)
        self.last_fit_sums.copy_(fit_sums)
        self.last_tail.copy_(tail)
        self.epoch_tail.zero_()
        self.epoch_sums.zero_()
        self.epoch_boot_sums.zero_()
        self.updates += 1
        self.last_change.fill_(change)
        self._confounded = self._read_confounded()
        return change, ref_step

    # --- state ----------------------------------------------------------------------------------
    def plan_diagnosis(self, requests_per_epoch: int) -> int:
        """Set the first epoch's diagnosis stride from the requests an epoch will read, before
        any update: a large log then diagnoses about ``diagnosis_requests`` requests in its
        first epoch too, not all of them. A no-op once an update (or a loaded state) has set
        the stride. Returns the stride."""
        if int(self.updates) == 0 and self.diagnosis_requests and requests_per_epoch > 0:
            self._stride = max(1, int(requests_per_epoch) // self.diagnosis_requests)
            self.diagnosis_stride.fill_(self._stride)
        return self._stride

    def _next_stride(self, diagnosed: float) -> int:
        """The step stride of the next epoch's diagnosis, from the requests this one diagnosed
        (under the current stride: the epoch read about ``diagnosed * stride``)."""
        if not self.diagnosis_requests:
            return 1
        return max(1, int(diagnosed * self._stride) // self.diagnosis_requests)

    def _read_confounded(self) -> bool:
        """Read from the buffers whether the last update found the effect NOT identified."""
        return bool(int(self.updates) > 0 and Traffic(int(self.fitted_on)) is Traffic.ALL
                    and rank_evidence(RankDiagnosis.read(self.last_diagnosis)).sorted_policy)

    def confounded(self) -> bool:
        """Did the last update read the position effect as NOT identified (the offsets fitted on
        all the traffic of a log whose slots follow the model's relevance)? False before any.
        A Python flag set by each update and each load: a training step reads no buffer."""
        return self._confounded

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The module's state; raises first what the checks of accelerator training steps found
        (a checkpoint holds no batch whose check is still pending)."""
        self._raise_deferred()
        return super().state_dict(*args, **kwargs)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # a state dict without the intervals (written before they were kept) loads them unset
        for name in ("offset_lower", "offset_upper", "level_lower", "level_upper"):
            state_dict.setdefault(prefix + name, torch.full_like(getattr(self, name), math.nan))
        state_dict.setdefault(prefix + "diagnosis_stride", torch.ones_like(self.diagnosis_stride))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._confounded = self._read_confounded()
        self._stride = int(self.diagnosis_stride)

    # --- reporting ------------------------------------------------------------------------------
    @torch.no_grad()
    def offsets(self) -> list[float]:
        """Logit offset of positions ``1..max_position`` (0 at the reference): an auction's expected
        CTR in slot ``j`` is ``σ(logit(pctr) + offsets[j - 1])``."""
        return self.offset.double().tolist()

    @torch.no_grad()
    def identifiability(self) -> dict[str, Any]:
        """Is the position effect identified by this data? (:func:`.report.identifiability`)"""
        return _report.identifiability(self)

    @torch.no_grad()
    def level_interval(self) -> dict[str, Any] | None:
        """The serving level's percentile interval, or None (:func:`.report.level_interval`)."""
        return _report.level_interval(self)

    @torch.no_grad()
    def report(self) -> dict[str, Any]:
        """Offsets with intervals, the data behind them and the identifiability verdict (JSON-safe;
        :func:`.report.report`)."""
        return _report.report(self)
