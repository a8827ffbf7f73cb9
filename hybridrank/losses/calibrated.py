"""Calibration-compatible ranking losses: calibrated softmax, RCR (ListCE with sigmoid), JRC.

Unlike the losses of :mod:`hybridrank.losses.listwise` these are *not* invariant to a per-list
shift of the logits: an anchor (calibrated softmax), the sigmoid link (RCR) or the per-label logit
competition (JRC) pins the score scale, so they can share a logit with BCE without pulling it
apart (CONVENTIONS.md §3).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from hybridrank.losses._core import (
    check_inputs,
    has_pair,
    neg_fill,
    prepare,
    reduce_lists,
    safe_div,
)

__all__ = ["calibrated_softmax_loss", "rcr_loss", "jrc_loss"]


def calibrated_softmax_loss(
    logits: Tensor,
    labels: Tensor,
    *,
    mask: Tensor,
    weights: Tensor | None = None,
    reduction: str = "mean",
    anchor_label: float = 1.0,
    anchor_logit: float = 0.0,
) -> Tensor:
    """Softmax CE over the list plus a virtual anchor item (Yan et al. 2022, scale calibration).

    The list is extended by one item with fixed logit ``s_0`` (``anchor_logit``, 0) and label
    ``y_0`` (``anchor_label``); with ``q = softmax(s_0, s_1, ..., s_n)``:
    ``loss_g = -(y_0 log q_0 + Σ_i y_i log q_i)``. Setting the gradient's expectation to zero
    gives ``q_i = E[y_i] / (y_0 + Σ_j E[y_j])``, solved by ``exp(s_i - s_0) = E[y_i] / y_0``:
    the anchor fixes the scale that a plain softmax leaves free (Yan et al. 2022, "Scale
    Calibration of Deep Ranking Models").

    Choices: the default ``y_0 = 1`` with ``s_0 = 0`` makes the optimum ``s_i = log p_i`` for
    clicks, which is within ``-log(1 - p)`` of ``logit p_i`` (0.05 at p = 5 %), so the term
    agrees with BCE on the same logit at ad base rates; and a list without any click still
    teaches the scale (all its mass sits on the anchor). The per-list value is *not* divided by
    the realised label mass ``y_0 + Σ y``: that mass is larger exactly when ``y_i = 1``, which
    biases the optimum to about ``p_i / 2`` for clicks (measured: PCOC 0.59 in the calibration
    test with it, ~1 without). With ``y_0 > 0`` every non-empty list enters the mean (the one
    exception to "lists without a positive contribute nothing"); with ``y_0 = 0`` only lists
    with a positive do.

    Args:
        logits: ``[G, L]`` scores.
        labels: ``[G, L]`` graded labels.
        mask: ``[G, L]`` bool, True on real impressions.
        weights: optional ``[G, L]`` impression weights (target ``w_i y_i``).
        reduction: ``"mean"`` over non-empty lists, ``"sum"`` or ``"none"`` (``[G]``).
        anchor_label: ``y_0 >= 0``.
        anchor_logit: ``s_0``.

    Returns:
        Scalar, or ``[G]`` for ``reduction="none"``.

    >>> s = torch.zeros(1, 1); y = torch.zeros(1, 1)
    >>> m = torch.ones(1, 1, dtype=torch.bool)
    >>> round(calibrated_softmax_loss(s, y, mask=m).item(), 4)  # -y_0 log(1 / 2)
    0.6931
    """
    check_inputs(logits, labels, mask, weights, reduction)
    if anchor_label < 0:
        raise ValueError(f"anchor_label must be >= 0, got {anchor_label}")
    s, y, w = prepare(logits, labels, mask, weights)
    t = w * y
    s = s.masked_fill(~mask, neg_fill(s.dtype))
    s0 = torch.full_like(s[:, :1], anchor_logit)
    logp = torch.log_softmax(torch.cat([s0, s], dim=1), dim=1)
    per_list = -(t * logp[:, 1:]).sum(dim=1) - anchor_label * logp[:, 0]
    valid = mask.any(dim=1) & (t.sum(dim=1) + anchor_label > 0)
    return reduce_lists(per_list, valid, reduction)


def rcr_loss(
    logits: Tensor,
    labels: Tensor,
    *,
    mask: Tensor,
    weights: Tensor | None = None,
    reduction: str = "mean",
) -> Tensor:
    """Regression-compatible ListCE with a sigmoid link (Bai et al. 2023, "RCR").

    ``loss_g = -(1 / C) Σ_i y_i log(σ(s_i) / Σ_j σ(s_j))`` with ``C = Σ_i y_i`` (the number of
    positives for clicks). Computed in log space: ``log σ(s) = -softplus(-s)``. Meant to be added
    to sigmoid BCE on the same logit (``HybridLoss``): σ(s_i) = E[y_i] is then an optimum of
    both terms. Mean over lists with two different labels.

    Args:
        logits: ``[G, L]`` scores.
        labels: ``[G, L]`` graded labels.
        mask: ``[G, L]`` bool, True on real impressions.
        weights: optional ``[G, L]`` impression weights (target ``w_i y_i``).
        reduction: ``"mean"``, ``"sum"`` or ``"none"`` (``[G]``).

    Returns:
        Scalar, or ``[G]`` for ``reduction="none"``.

    >>> s = torch.zeros(1, 2); y = torch.tensor([[1.0, 0.0]])
    >>> round(rcr_loss(s, y, mask=torch.ones(1, 2, dtype=torch.bool)).item(), 4)  # log 2
    0.6931
    """
    check_inputs(logits, labels, mask, weights, reduction)
    s, y, w = prepare(logits, labels, mask, weights)
    t = w * y
    log_sig = (-F.softplus(-s)).masked_fill(~mask, neg_fill(s.dtype))
    log_share = log_sig - torch.logsumexp(log_sig, dim=1, keepdim=True)
    per_list = safe_div(-(t * log_share).sum(dim=1), t.sum(dim=1))
    valid = has_pair(y, mask) & (t.sum(dim=1) > 0)
    return reduce_lists(per_list, valid, reduction)


def jrc_loss(
    logits: Tensor,
    labels: Tensor,
    *,
    mask: Tensor,
    weights: Tensor | None = None,
    reduction: str = "mean",
    opposite_only: bool = False,
) -> Tensor:
    """JRC's generative listwise term L_gen over two logits per impression (Sheng et al. 2023).

    Reference: Sheng et al. 2023, "Joint Optimization of Ranking and Calibration with
    Contextualized Hybrid Model" (KDD).
    Two logits per impression, ``z_0`` (no click) and ``z_1`` (click); pCTR is ``σ(z_1 - z_0)``.
    With the click label ``c_i = [y_i > 0]``:
    ``L_gen_i = -log( exp(z_{c_i}(i)) / Σ_{j ∈ S} exp(z_{c_i}(j)) )``: each impression competes
    within its list on the logit of its own label. ``opposite_only=True`` keeps in the denominator
    only i itself and the impressions of the opposite label. Per list a (weighted) mean over its
    impressions, then a mean over lists holding both a click and a non-click (a one-label list
    has no ranking information; with ``opposite_only`` it is exactly 0 anyway).
    ``HybridLoss`` adds the paper's BCE on ``z_1 - z_0`` (α = 0.5 in the paper).

    Args:
        logits: ``[G, L, 2]`` the two logits ``(z_0, z_1)`` of each impression.
        labels: ``[G, L]`` graded labels (clicked = label > 0).
        mask: ``[G, L]`` bool, True on real impressions.
        weights: optional ``[G, L]`` impression weights.
        reduction: ``"mean"``, ``"sum"`` or ``"none"`` (``[G]``).
        opposite_only: compare only against the impressions of the opposite label.

    Returns:
        Scalar, or ``[G]`` for ``reduction="none"``.

    >>> z = torch.zeros(1, 2, 2); y = torch.tensor([[1.0, 0.0]])
    >>> round(jrc_loss(z, y, mask=torch.ones(1, 2, dtype=torch.bool)).item(), 4)  # log 2
    0.6931
    """
    check_inputs(logits, labels, mask, weights, reduction, n_outputs=2)
    z, y, w = prepare(logits, labels, mask, weights)
    click = (y > 0) & mask
    fill = neg_fill(z.dtype)
    z = z.masked_fill(~mask.unsqueeze(2), fill)
    own = torch.where(click, z[..., 1], z[..., 0])  # z_{c_i}(i)
    if opposite_only:
        # For label c, logsumexp of z_c over the impressions whose label is not c.
        lse_for_click = torch.logsumexp(z[..., 1].masked_fill(~(mask & ~click), fill), dim=1)
        lse_for_noclick = torch.logsumexp(z[..., 0].masked_fill(~click, fill), dim=1)
        opp = torch.where(click, lse_for_click.unsqueeze(1), lse_for_noclick.unsqueeze(1))
        log_den = torch.logaddexp(own, opp)
    else:
        lse = torch.logsumexp(z, dim=1)  # [G, 2]
        log_den = torch.where(click, lse[:, 1:2], lse[:, 0:1])
    per_item = torch.where(mask, log_den - own, torch.zeros_like(own))
    per_list = safe_div((w * per_item).sum(dim=1), w.sum(dim=1))
    valid = click.any(dim=1) & (mask & ~click).any(dim=1)
    return reduce_lists(per_list, valid, reduction)
