"""Calibration-compatible ranking losses: calibrated softmax, RCR (ListCE with sigmoid), JRC.

Unlike the losses of :mod:`hybridrank.losses.listwise` these are *not* invariant to a per-list
shift of the logits: an anchor (calibrated softmax), the sigmoid link (RCR) or the per-label logit
competition (JRC) pins the score scale, so they can share a logit with BCE without pulling it
apart (docs/CONVENTIONS.md §6.5).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from hybridrank.losses._core import (
    big,
    check_inputs,
    has_pair,
    prepare,
    reduce_lists,
    safe_div,
)

__all__ = ["LINKS", "JRC_REDUCTION_SCOPES", "calibrated_softmax_loss", "rcr_loss", "jrc_loss"]


LINKS = ("sigmoid", "exp")


def calibrated_softmax_loss(
    logits: Tensor,
    labels: Tensor,
    *,
    mask: Tensor,
    weights: Tensor | None = None,
    reduction: str = "mean",
    anchor_label: float = 1.0,
    anchor_logit: float = 0.0,
    link: str = "sigmoid",
) -> Tensor:
    """Softmax CE over the list plus a virtual anchor item (Yan et al. 2022, scale calibration).

    The list is extended by one item with fixed score ``u_0`` (``anchor_logit``, 0) and label
    ``y_0`` (``anchor_label``, 1). With item scores ``u_i`` and ``q = softmax(u_0, u_1, ..., u_n)``:
    ``loss_g = -(y_0 log q_0 + Σ_i y_i log q_i)``. The expected loss is a cross-entropy against
    the unnormalised target ``(y_0, E[y_1], ..., E[y_n])``, minimised by ``q ∝`` that target,
    i.e. ``exp(u_i - u_0) = E[y_i] / y_0``: the anchor pins the scale that a plain softmax leaves
    free (Yan et al. 2022, "Scale Calibration of Deep Ranking Models").

    ``link`` says which function of the logit ``s_i`` that optimum calibrates:

    - ``"sigmoid"`` (default): ``u_i = log σ(s_i)``, so the optimum is ``σ(s_i) = E[y_i] / y_0``
      (with ``u_0 = 0``, ``y_0 = 1``: ``σ(s_i) = P(click)``), the same link and the same optimum
      as the BCE it is mixed with in ``HybridLoss``, whose exported pCTR is ``σ(s)``. ``u`` is
      increasing in ``s``, so the order of a list is unchanged. Labels above ``y_0`` cannot be
      reached (``σ < 1``): use click labels (or labels scaled into ``[0, y_0]``) for calibration.
      On the known-truth calibration test the 0.5 BCE + 0.5 mix lands at PCOC ~1.00 and ECE
      against the true p ~0.001, as close as BCE alone.
    - ``"exp"``: ``u_i = s_i``, the formulation of Yan et al. and TF-Ranking's
      ``CalibratedSoftmaxLoss`` (whose ``virtual_label`` is ``y_0``): the optimum is
      ``exp(s_i) = E[y_i] / y_0``, so ``σ(s)`` is *not* the calibrated probability (``σ(log p)
      = p / (1 + p)``): PCOC ~0.8 alone and ~0.85 in the 0.5 / 0.5 mix at a 5 % click rate.

    Choices: the per-list value is *not* divided by the realised label mass ``y_0 + Σ y``: that
    mass is larger exactly when ``y_i = 1``, which biases the optimum to about ``p_i / 2`` for
    clicks (measured: PCOC 0.59 in the calibration test with it). A list without any click still
    teaches the scale (all its mass sits on the anchor), so with ``y_0 > 0`` every non-empty list
    enters the mean (the one exception to "lists without a positive contribute nothing"); with
    ``y_0 = 0`` only lists with a positive do.

    Args:
        logits: ``[G, L]`` scores.
        labels: ``[G, L]`` graded labels.
        mask: ``[G, L]`` bool, True on real impressions.
        weights: optional ``[G, L]`` impression weights (target ``w_i y_i``).
        reduction: ``"mean"`` over counted lists, ``"sum"`` or ``"none"`` (``[G]``).
        anchor_label: ``y_0 >= 0``.
        anchor_logit: ``u_0``, the anchor's score (a log-probability under ``"sigmoid"``).
        link: ``"sigmoid"`` or ``"exp"``, see above.

    Returns:
        Scalar, or ``[G]`` for ``reduction="none"``.

    >>> s = torch.zeros(1, 1); y = torch.zeros(1, 1)
    >>> m = torch.ones(1, 1, dtype=torch.bool)
    >>> round(calibrated_softmax_loss(s, y, mask=m, link="exp").item(), 4)  # -y_0 log(1 / 2)
    0.6931
    >>> round(calibrated_softmax_loss(s, y, mask=m).item(), 4)  # -y_0 log(1 / (1 + σ(0)))
    0.4055
    """
    check_inputs(logits, labels, mask, weights, reduction)
    if anchor_label < 0:
        raise ValueError(f"anchor_label must be >= 0, got {anchor_label}")
    if link not in LINKS:
        raise ValueError(f"link must be one of {LINKS}, got {link!r}")
    s, y, w, m = prepare(logits, labels, mask, weights, neg=True)
    t = y if weights is None else w * y
    u = F.logsigmoid(s) if link == "sigmoid" else s  # padding: ~neg_fill either way
    u0 = torch.full(u.shape[:1], anchor_logit, dtype=u.dtype, device=u.device)
    # log(exp(u_0) + Σ exp(u_j)); then loss = (y_0 + Σ t) lse - Σ t u - y_0 u_0
    lse = torch.logaddexp(torch.logsumexp(u, dim=1), u0)
    mass = t.sum(dim=1)
    per_list = (mass + anchor_label) * lse - (t * u).sum(dim=1) - anchor_label * anchor_logit
    valid = (m.sum(dim=1) > 0) & (mass + anchor_label > 0)
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
    to sigmoid BCE on the same logit (``HybridLoss``), whose optimum is ``σ(s_i) = E[y_i]``.
    That point is only *approximately* an optimum of this term too: the term sees σ only through
    the shares ``σ_i / Σ_j σ_j``, and its optimal shares are ``E[y_i / C | C > 0]``, which are
    proportional to ``p_i / (1 - p_i)`` (not ``p_i``) when a list holds at most one click, and
    differ again with several clicks. Close at small click rates, so the two terms pull the scale
    apart only a little (PCOC ~0.9-0.96 on the calibration test); calibrated softmax with the
    sigmoid link has the exact shared optimum. Mean over lists with two different labels.

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
    s, y, w, m = prepare(logits, labels, mask, weights, neg=True)
    t = y if weights is None else w * y
    log_sig = F.logsigmoid(s)  # padding: ~neg_fill, no share
    log_share = log_sig - torch.logsumexp(log_sig, dim=1, keepdim=True)
    mass = t.sum(dim=1)
    per_list = safe_div(-(t * log_share).sum(dim=1), mass)
    valid = has_pair(y, m) & (mass > 0)
    return reduce_lists(per_list, valid, reduction)


#: What JRC's generative term is averaged over (``reduction_scope``); not a pooling scope.
JRC_REDUCTION_SCOPES = ("batch", "list")


def jrc_loss(
    logits: Tensor,
    labels: Tensor,
    *,
    mask: Tensor,
    weights: Tensor | None = None,
    reduction: str = "mean",
    opposite_only: bool = False,
    reduction_scope: str = "batch",
) -> Tensor:
    """JRC's generative listwise term L_gen over two logits per impression (Sheng et al. 2023).

    Reference: Sheng et al. 2023, "Joint Optimization of Ranking and Calibration with
    Contextualized Hybrid Model" (KDD).
    Two logits per impression, ``z_0`` (no click) and ``z_1`` (click); pCTR is ``σ(z_1 - z_0)``.
    With the click label ``c_i = [y_i > 0]``:
    ``L_gen_i = -log( exp(z_{c_i}(i)) / Σ_{j ∈ S} exp(z_{c_i}(j)) )``: each impression competes
    within its list on the logit of its own label. ``opposite_only=True`` keeps in the denominator
    only i itself and the impressions of the opposite label (then a one-label list gives 0).
    ``HybridLoss`` adds the paper's BCE on ``z_1 - z_0`` (α = 0.5 in the paper).

    ``reduction_scope`` says what the term is averaged over:

    - ``"batch"`` (default, the paper's averaging, as in Alibaba's EasyRec ``jrc_loss`` and
      TorchEasyRec ``JRCLoss``): the (weighted) mean of ``L_gen_i`` over *every* real impression
      of the batch, ``Σ_i w_i L_gen_i / Σ_i w_i``, like the BCE it is mixed with, so α keeps its
      meaning. Lists with one label count too: in the full variant their impressions compete
      among themselves (a click-less list still ranks its ``z_0``), with ``opposite_only`` they
      add 0 to the sum and their impressions to the count. Every non-empty list is counted;
      ``reduction="none"`` gives per-list sums ``Σ_{i ∈ g} w_i L_gen_i``.
    - ``"list"``: per list the weighted mean of ``L_gen_i``, then the mean over lists holding both
      a click and a non-click (every informative list weighs the
      same, one-label lists are left out). On sparse clicks this keeps roughly half of the
      paper's term and shifts the effective α.

    Args:
        logits: ``[G, L, 2]`` the two logits ``(z_0, z_1)`` of each impression.
        labels: ``[G, L]`` graded labels (clicked = label > 0).
        mask: ``[G, L]`` bool, True on real impressions.
        weights: optional ``[G, L]`` impression weights.
        reduction: ``"mean"``, ``"sum"`` or ``"none"`` (``[G]``).
        opposite_only: compare only against the impressions of the opposite label.
        reduction_scope: ``"batch"`` (paper, default) or ``"list"``, see above.

    Returns:
        Scalar, or ``[G]`` for ``reduction="none"``.

    >>> z = torch.zeros(1, 2, 2); y = torch.tensor([[1.0, 0.0]])
    >>> round(jrc_loss(z, y, mask=torch.ones(1, 2, dtype=torch.bool)).item(), 4)  # log 2
    0.6931
    """
    check_inputs(logits, labels, mask, weights, reduction, n_outputs=2)
    if reduction_scope not in JRC_REDUCTION_SCOPES:
        raise ValueError(f"reduction_scope must be one of {JRC_REDUCTION_SCOPES}, got {reduction_scope!r}")
    z, y, w, m = prepare(logits, labels, mask, weights, neg=True)
    c = (y > 0).to(z.dtype)  # click, 0 on padding
    z0, z1 = z[..., 0], z[..., 1]
    own = c * z1 + (1.0 - c) * z0  # z_{c_i}(i)
    if opposite_only:
        # For label c, logsumexp of z_c over the impressions whose label is not c.
        off = big(z.dtype)
        lse_for_click = torch.logsumexp(z1 + (m - c - 1.0) * off, dim=1, keepdim=True)
        lse_for_noclick = torch.logsumexp(z0 + (c - 1.0) * off, dim=1, keepdim=True)
        log_den = torch.logaddexp(own, c * lse_for_click + (1.0 - c) * lse_for_noclick)
    else:
        lse = torch.logsumexp(z, dim=1)  # [G, 2]
        log_den = c * lse[:, 1:2] + (1.0 - c) * lse[:, 0:1]
    weighted = w * (log_den - own)  # 0 on padding
    if reduction_scope == "batch":
        return reduce_lists(weighted.sum(dim=1), m.sum(dim=1) > 0, reduction, denom=w.sum())
    per_list = safe_div(weighted.sum(dim=1), w.sum(dim=1))
    n_click = c.sum(dim=1)
    valid = (n_click > 0) & (n_click < m.sum(dim=1))
    return reduce_lists(per_list, valid, reduction)
