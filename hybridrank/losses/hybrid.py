"""``HybridLoss``: weighted pointwise BCE plus weighted ranking terms on the same logit(s).

``total = point_weight * BCE + Σ_t weight_t * term_t``, each part already a mean with the
meaning given in its docstring (impressions for BCE, lists for ranking terms), so the weights
are mixing proportions (Sculley 2010; Li et al. 2015). Built from a hydra config node::

    _target_: hybridrank.losses.HybridLoss
    point_weight: 0.5
    point_target: binary
    label_max: ${data.label_max}
    terms:
      softmax: {loss: softmax, weight: 0.5, options: {}}
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn

from hybridrank.losses._core import check_inputs
from hybridrank.losses.calibrated import calibrated_softmax_loss, jrc_loss, rcr_loss
from hybridrank.losses.listwise import (
    approx_ndcg_loss,
    listmle_loss,
    neural_ndcg_loss,
    position_aware_listmle_loss,
    softmax_loss,
)
from hybridrank.losses.pairwise import hinge_loss, lambda_loss, lambdarank_loss, ranknet_loss
from hybridrank.losses.pointwise import TARGETS, bce_loss

__all__ = ["LOSSES", "HybridLoss", "click_logit"]

#: Ranking terms by config name. A plain dict: no eval/globals dispatch.
LOSSES: dict[str, Callable[..., Tensor]] = {
    "ranknet": ranknet_loss,
    "hinge": hinge_loss,
    "lambdarank": lambdarank_loss,
    "lambdaloss": lambda_loss,
    "softmax": softmax_loss,
    "listmle": listmle_loss,
    "position_aware_listmle": position_aware_listmle_loss,
    "approx_ndcg": approx_ndcg_loss,
    "neural_ndcg": neural_ndcg_loss,
    "calibrated_softmax": calibrated_softmax_loss,
    "rcr": rcr_loss,
    "jrc": jrc_loss,
}

_RESERVED = ("point", "rank", "total")
_TERM_KEYS = ("loss", "weight", "options")
_FIXED_ARGS = ("logits", "labels", "mask", "weights", "reduction")
_CHECKS = ("first", "always", "never")
_RANK_REDUCTIONS = ("lists", "impressions")


def click_logit(out: Tensor, n_outputs: int | None = None) -> Tensor:
    """The pCTR logit of a scorer output: ``z_1 - z_0`` for two outputs, the single logit otherwise.

    Rules without ``n_outputs``: a trailing dimension of 2 on a 3-d (or higher) tensor is two
    outputs, a trailing dimension of 1 is squeezed, anything else is already the logit. Pass
    ``n_outputs`` for flat ``[B, 2]`` outputs, which cannot be told from ``[G, 2]`` lists.

    Args:
        out: ``[G, L]``, ``[G, L, 1]`` or ``[G, L, 2]`` (or flat ``[B, k]`` with ``n_outputs``).
        n_outputs: 1 or 2 to state the layout, or None to infer it.

    Returns:
        The logit, ``out`` without its output dimension.

    >>> click_logit(torch.tensor([[[0.5, 2.0]]])).tolist()
    [[1.5]]
    """
    two = out.dim() >= 3 and out.shape[-1] == 2 if n_outputs is None else n_outputs == 2
    if two:
        if out.shape[-1] != 2:
            raise ValueError(f"n_outputs=2 needs a trailing dimension of 2, got {tuple(out.shape)}")
        return out[..., 1] - out[..., 0]
    if out.dim() >= 2 and out.shape[-1] == 1 and (n_outputs == 1 or out.dim() >= 3):
        return out.squeeze(-1)
    return out


class HybridLoss(nn.Module):
    """Weighted pointwise BCE plus weighted ranking terms; ``n_outputs`` is 2 iff JRC is a term.

    ``total = point_weight * bce_loss(click_logit) + Σ_t weight_t * LOSSES[loss_t](logit_t)``
    where JRC sees the two logits ``[G, L, 2]`` and every other part sees ``z_1 - z_0`` (or the
    single logit).

    Args:
        point_weight: weight of the pointwise BCE (0 disables it; it is still logged).
        point_target: ``"binary"`` (label > 0) or ``"scaled"`` (label / label_max).
        label_max: the largest label of the data (1 clicks, 2 MQ2008, 4 MSLR); labels outside
            ``[0, label_max]`` are rejected.
        terms: name -> ``{"loss": registry name (default: the name), "weight": float (default 1),
            "options": {keyword options of that loss}}``. Names become ``parts`` keys
            (``train/loss_<name>``). Unknown keys and options raise ``ValueError``.
        check_labels: ``"first"`` (default: check label range and NaN on the first call only,
            one device sync), ``"always"`` (every call) or ``"never"``. Shape and dtype checks
            always run; they are free.
        rank_reduction: how each ranking term is reduced over the batch. ``"lists"`` (default):
            its own mean over the lists it counts (the published definitions). ``"impressions"``:
            its sum over lists divided by BCE's denominator (the impression weight), so both
            parts are per-impression quantities. A listwise term's mean over the few lists with
            a click pulls on the logits about 1 / CTR times harder than BCE
            (docs/BENCHMARKS.md "The default loss"); per impression, about (clicked lists) / (clicks)
            times, at most 1, and the weights read as proportions of the pull.

    Example:
        >>> loss = HybridLoss(0.5, terms={"softmax": {"weight": 0.5}})
        >>> s, y = torch.zeros(1, 2), torch.tensor([[1.0, 0.0]])
        >>> total, parts = loss(s, y, mask=torch.ones(1, 2, dtype=torch.bool))
        >>> sorted(parts), round(total.item(), 4)
        (['point', 'rank', 'softmax'], 0.6931)
    """

    def __init__(
        self,
        point_weight: float = 1.0,
        point_target: str = "binary",
        label_max: float = 1.0,
        terms: Mapping[str, Mapping[str, object]] | None = None,
        check_labels: str = "first",
        rank_reduction: str = "lists",
    ) -> None:
        super().__init__()
        if rank_reduction not in _RANK_REDUCTIONS:
            raise ValueError(f"rank_reduction must be one of {_RANK_REDUCTIONS}, got {rank_reduction!r}")
        self.rank_reduction = rank_reduction
        if point_target not in TARGETS:
            raise ValueError(f"point_target must be one of {TARGETS}, got {point_target!r}")
        if not float(label_max) > 0:
            raise ValueError(f"label_max must be > 0, got {label_max}")
        if check_labels not in _CHECKS:
            raise ValueError(f"check_labels must be one of {_CHECKS}, got {check_labels!r}")
        self.point_weight = float(point_weight)
        self.point_target = point_target
        self.label_max = float(label_max)
        self.check_labels = check_labels
        self._checked = False
        self.terms: dict[str, tuple[str, float, dict[str, object]]] = {}
        for name, spec in (terms or {}).items():
            self.terms[str(name)] = self._parse_term(str(name), spec)
        if self.point_weight < 0 or any(w < 0 for _, w, _ in self.terms.values()):
            raise ValueError("loss weights must be >= 0")
        self.n_outputs = 2 if any(k == "jrc" for k, _, _ in self.terms.values()) else 1

    @staticmethod
    def _parse_term(name: str, spec: Mapping[str, object]) -> tuple[str, float, dict[str, object]]:
        if name in _RESERVED:
            raise ValueError(f"term name {name!r} is reserved ({_RESERVED})")
        if not isinstance(spec, Mapping):
            raise ValueError(f"term {name!r} must be a mapping with keys {_TERM_KEYS}: {spec!r}")
        unknown = sorted(set(spec) - set(_TERM_KEYS))
        if unknown:
            raise ValueError(f"term {name!r}: unknown keys {unknown}; allowed {_TERM_KEYS}")
        kind = str(spec.get("loss", name))
        if kind not in LOSSES:
            raise ValueError(f"term {name!r}: unknown loss {kind!r}; choose from {sorted(LOSSES)}")
        options = dict(spec.get("options") or {})
        params = inspect.signature(LOSSES[kind]).parameters
        allowed = [p for p in params if p not in _FIXED_ARGS]
        bad = sorted(set(options) - set(allowed))
        if bad:
            raise ValueError(f"term {name!r}: {kind} has no option {bad}; options are {allowed}")
        return kind, float(spec.get("weight", 1.0)), options

    def click_logit(self, out: Tensor) -> Tensor:
        """The pCTR logit of raw scorer outputs under this loss: ``σ(click_logit(out))`` is the pCTR.

        The one place where a loss decides how its outputs become a click probability (``z_1 - z_0``
        for two-output JRC heads, the single logit otherwise). Every scoring path (metrics,
        exports, portable models) goes through it.

        Args:
            out: ``[..., n_outputs]`` raw scorer outputs (flat ``[B, k]`` or lists ``[G, L, k]``).
        """
        return click_logit(out, n_outputs=self.n_outputs)

    def extra_repr(self) -> str:
        terms = ", ".join(f"{n}={k}×{w:g}{o or ''}" for n, (k, w, o) in self.terms.items())
        return (f"point_weight={self.point_weight:g}, point_target={self.point_target!r}, "
                f"label_max={self.label_max:g}, terms=[{terms}], rank_reduction={self.rank_reduction!r}")

    def _check(self, logits: Tensor, labels: Tensor, mask: Tensor, weights: Tensor | None) -> None:
        if self.n_outputs == 2 and (logits.dim() != 3 or logits.shape[-1] != 2):
            raise ValueError(
                f"JRC needs two logits per impression: logits must be [G, L, 2], got "
                f"{list(logits.shape)} (build the scorer with loss.n_outputs = 2 outputs)"
            )
        if self.n_outputs == 1 and logits.dim() == 3 and logits.shape[-1] != 1:
            raise ValueError(
                f"logits {list(logits.shape)} have {logits.shape[-1]} outputs per impression but "
                f"this loss has n_outputs=1 (only JRC uses two)"
            )
        check_inputs(logits, labels, mask, weights, "mean", n_outputs=self.n_outputs)
        if self.check_labels == "never" or (self.check_labels == "first" and self._checked):
            return
        bad = mask & ~((labels >= 0) & (labels <= self.label_max))  # NaN fails both comparisons
        if bool(bad.any()):
            vals = labels[bad]
            raise ValueError(
                f"labels must lie in [0, label_max={self.label_max:g}] on real impressions: "
                f"{int(bad.sum())} of labels {list(labels.shape)} do not (e.g. "
                f"{vals[:5].tolist()}; NaN counts as bad)"
            )
        self._checked = True

    def forward(
        self,
        logits: Tensor,
        labels: Tensor,
        *,
        mask: Tensor,
        weights: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Total loss and its detached parts.

        Args:
            logits: ``[G, L]`` (or ``[G, L, 1]``), or ``[G, L, 2]`` when ``n_outputs == 2``.
            labels: ``[G, L]`` graded labels in ``[0, label_max]``.
            mask: ``[G, L]`` bool, True on real impressions (the rank lists of a batch).
            weights: optional ``[G, L]`` impression weights.

        Returns:
            ``(total, parts)``: the scalar to minimise, and detached scalars ``"point"``,
            ``"rank"`` (the weighted sum of the ranking terms) and one per term name.
        """
        if logits.dim() == 3 and logits.shape[-1] == 1:
            logits = logits.squeeze(-1)
        self._check(logits, labels, mask, weights)
        logit = logits if self.n_outputs == 1 else click_logit(logits, n_outputs=2)
        point = bce_loss(logit, labels, mask=mask, weights=weights, target=self.point_target,
                         label_max=self.label_max)
        total = self.point_weight * point if self.point_weight else torch.zeros_like(point)
        parts = {"point": point.detach()}
        rank = torch.zeros_like(point)
        per_impression = self.rank_reduction == "impressions"
        if per_impression and self.terms:  # BCE's denominator: the impression weight
            denom = (mask if weights is None else weights * mask).sum().to(point.dtype)
        for name, (kind, weight, options) in self.terms.items():
            inp = logits if kind == "jrc" else logit
            value = LOSSES[kind](inp, labels, mask=mask, weights=weights,
                                 reduction="sum" if per_impression else "mean", **options)
            if per_impression:
                value = torch.where(denom > 0, value / denom.clamp_min(1e-12), torch.zeros_like(value))
            parts[name] = value.detach()
            rank = rank + weight * value
        parts["rank"] = rank.detach()
        return total + rank, parts
