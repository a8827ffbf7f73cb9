"""Pairwise losses: one builder for the valid-pair mask, one-line kernels on score differences.

Every pairwise loss is ``pairwise_loss(kernel, ...)`` with ``kernel(d_ij)`` applied to
``d_ij = s_i - s_j`` for the pairs ``y_i > y_j`` of one list. The valid-pair mask is built in
:func:`valid_pairs` and nowhere else. Reduction: a (weighted) mean over the pairs of a list, then a
mean over the lists that have at least one pair.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from hybridrank._dcg import block_means, discount, gains, ideal_dcg, position_discounts, tie_blocks
from hybridrank.losses._core import (
    check_inputs,
    prepare,
    reduce_lists,
    safe_div,
    valid_pairs,
)

__all__ = [
    "PAIR_WEIGHTS",
    "valid_pairs",
    "pairwise_loss",
    "logistic_kernel",
    "hinge_kernel",
    "ranknet_loss",
    "hinge_loss",
    "lambdarank_loss",
    "lambda_loss",
]

PAIR_WEIGHTS = (None, "gain", "ndcg", "ndcg2", "ndcg2pp")
_RANKED = ("ndcg", "ndcg2", "ndcg2pp")


def logistic_kernel(d: Tensor) -> Tensor:
    """RankNet / pairwise logistic: ``log(1 + exp(-d)) = softplus(-d)``."""
    return F.softplus(-d)


def hinge_kernel(d: Tensor, margin: float = 1.0) -> Tensor:
    """Pairwise hinge: ``max(0, margin - d)``."""
    return F.relu(margin - d)


def _rank_weights(scheme: str, y: Tensor, m: Tensor, first: Tensor, last: Tensor, mu: float,
                  gain: str) -> Tensor:
    """``[G, L, L]`` LambdaRank-style weights of items already sorted by descending score.

    Slot p of a row holds the item at 0-based sorted position p; ``first`` / ``last`` bound its
    block of tied scores (:func:`hybridrank._dcg.tie_blocks`). With ``G = g / IDCG`` and
    ``d(r) = 1 / log2(1 + r)``:

    - ``"ndcg"``: ``|G_i - G_j| E|d(r_i) - d(r_j)|``, the expected |ΔNDCG| of swapping i and j
      when tied scores are ordered uniformly at random (Burges 2006; without ties exactly
      ``|G_i - G_j| |d(r_i) - d(r_j)|``). Across blocks the expectation is ``|d̄_A - d̄_B|`` with
      ``d̄`` a block's mean discount; inside a block of ranks a..b it is the mean of
      ``|d(p) - d(q)|`` over distinct p, q: ``2 ((a + b) d̄ - 2 mean(r d)) / (n - 1)`` (0-based
      positions). Tied scores therefore still get a gradient, like rax's sorted ranks, without
      depending on storage order.
    - ``"ndcg2"``: ``|G_i - G_j| |d(|r_i - r_j|) - d(|r_i - r_j| + 1)|`` (NDCG-Loss2, Wang et al.
      2018) with tie-averaged ranks, ``|r_i - r_j|`` clamped to >= 1 so tied scores stay finite.
    - ``"ndcg2pp"``: ``ndcg + mu * ndcg2`` (NDCG-Loss2++).
    """
    length = y.shape[1]
    g = gains(y, gain)  # 0 on padding
    big_g = safe_div(g, ideal_dcg(g, None).unsqueeze(1))
    dg = (big_g.unsqueeze(2) - big_g.unsqueeze(1)).abs_()
    out = None
    if scheme in ("ndcg", "ndcg2pp"):
        disc = position_discounts(length, dtype=y.dtype, device=y.device)  # d(1..L)
        pos = torch.arange(length, dtype=y.dtype, device=y.device)
        means = block_means(torch.stack([disc, pos * disc]), first, last)  # [2, G, L]
        mean_d, mean_pd = means[0], means[1]
        ends = (first + last).to(y.dtype)
        within = 2.0 * (ends * mean_d - 2.0 * mean_pd) / (last - first).clamp_min(1).to(y.dtype)
        rho = (mean_d.unsqueeze(2) - mean_d.unsqueeze(1)).abs_()
        same = (first.unsqueeze(2) == first.unsqueeze(1)).view(torch.uint8).to(y.dtype)
        out = rho.addcmul_(same, within.unsqueeze(2))
    if scheme in ("ndcg2", "ndcg2pp"):
        # twice the tie-averaged rank is first + last + 2, an integer: |Δ| indexes a table
        twice = first + last
        gap2 = (twice.unsqueeze(2) - twice.unsqueeze(1)).abs_().clamp_min_(2)
        half = torch.arange(2 * length + 2, dtype=y.dtype, device=y.device).clamp_min(2) * 0.5
        table = (discount(half) - discount(half + 1.0)).abs_()  # f(gap) at gap = k / 2
        delta = table[gap2]
        out = delta if out is None else out.add_(delta, alpha=mu)
    return out.mul_(dg)


def pairwise_loss(
    kernel: Callable[[Tensor], Tensor],
    logits: Tensor,
    labels: Tensor,
    *,
    mask: Tensor,
    weights: Tensor | None = None,
    reduction: str = "mean",
    pair_weight: str | None = None,
    mu: float = 10.0,
    gain: str = "exp",
) -> Tensor:
    """Generic pairwise loss: ``kernel(s_i - s_j)`` averaged over the valid pairs of each list.

    ``loss_g = Σ_{(i,j) ∈ P_g} λ_ij w_i w_j k(s_i - s_j) / Σ_{(i,j) ∈ P_g} w_i w_j`` with
    ``P_g = {(i, j): mask_i, mask_j, y_i > y_j}``, λ the optional detached pair weight
    (see ``PAIR_WEIGHTS``), then the mean of ``loss_g`` over lists with ``P_g`` non-empty.
    Rank-based weights are computed with the items of each list sorted by score (one sort), so
    ranks are positions and tied scores are blocks (:func:`hybridrank._dcg.tie_blocks`).

    Args:
        kernel: elementwise function of the ``[G, L, L]`` score differences ``s_i - s_j``.
        logits: ``[G, L]`` scores.
        labels: ``[G, L]`` graded labels.
        mask: ``[G, L]`` bool, True on real impressions.
        weights: optional ``[G, L]`` impression weights; a pair weighs ``w_i w_j``.
        reduction: ``"mean"`` over lists with a pair, ``"sum"``, or ``"none"`` (``[G]``).
        pair_weight: None, ``"gain"`` (``|g_i - g_j|``), ``"ndcg"`` (LambdaRank's expected
            ``|ΔNDCG|``), ``"ndcg2"`` or ``"ndcg2pp"`` (LambdaLoss); see :func:`_rank_weights`.
        mu: weight of the NDCG-Loss2 term in ``"ndcg2pp"``.
        gain: ``"exp"`` (``2^y - 1``) or ``"linear"`` gains for the pair weights.

    Returns:
        Scalar, or ``[G]`` for ``reduction="none"``. Memory and time grow as ``G * L^2``.
    """
    check_inputs(logits, labels, mask, weights, reduction)
    if pair_weight not in PAIR_WEIGHTS:
        raise ValueError(f"pair_weight must be one of {PAIR_WEIGHTS}, got {pair_weight!r}")
    s, y, w, m = prepare(logits, labels, mask, weights)
    if pair_weight in _RANKED:
        order, first, last = tie_blocks(s.detach(), mask)
        s, y, w, m = (t.gather(1, order) for t in (s, y, w, m))
    pf = valid_pairs(y, m).view(torch.uint8).to(s.dtype)  # [G, L, L] 0/1
    n_pairs = pf.sum(dim=(1, 2))
    pw = pf if weights is None else pf * (w.unsqueeze(2) * w.unsqueeze(1))
    den = n_pairs if weights is None else pw.sum(dim=(1, 2))
    losses = kernel(s.unsqueeze(2) - s.unsqueeze(1))
    if pair_weight is not None:
        with torch.no_grad():
            if pair_weight == "gain":
                g = gains(y, gain)
                lam = (g.unsqueeze(2) - g.unsqueeze(1)).abs_()
            else:
                lam = _rank_weights(pair_weight, y, m, first, last, mu, gain)
            pw = lam.mul_(pw)
    per_list = safe_div((pw * losses).sum(dim=(1, 2)), den)
    return reduce_lists(per_list, n_pairs > 0, reduction)


def ranknet_loss(
    logits: Tensor,
    labels: Tensor,
    *,
    mask: Tensor,
    weights: Tensor | None = None,
    reduction: str = "mean",
    pair_weight: str | None = None,
) -> Tensor:
    """RankNet / pairwise logistic loss (Burges et al. 2005): ``softplus(-(s_i - s_j))``.

    Mean over pairs ``y_i > y_j`` within a list, then over lists with a pair; see
    :func:`pairwise_loss` for ``weights`` and ``pair_weight``.

    >>> s = torch.tensor([[2.0, 0.0]]); y = torch.tensor([[1.0, 0.0]])
    >>> m = torch.ones(1, 2, dtype=torch.bool)
    >>> round(ranknet_loss(s, y, mask=m).item(), 4)  # log(1 + e^-2)
    0.1269
    """
    return pairwise_loss(logistic_kernel, logits, labels, mask=mask, weights=weights,
                         reduction=reduction, pair_weight=pair_weight)


def hinge_loss(
    logits: Tensor,
    labels: Tensor,
    *,
    mask: Tensor,
    weights: Tensor | None = None,
    reduction: str = "mean",
    margin: float = 1.0,
    pair_weight: str | None = None,
) -> Tensor:
    """Pairwise hinge loss (RankSVM, Herbrich et al. 2000): ``max(0, margin - (s_i - s_j))``.

    Same reduction and options as :func:`pairwise_loss`.

    >>> s = torch.tensor([[0.25, 0.0]]); y = torch.tensor([[1.0, 0.0]])
    >>> hinge_loss(s, y, mask=torch.ones(1, 2, dtype=torch.bool)).item()
    0.75
    """
    return pairwise_loss(lambda d: hinge_kernel(d, margin), logits, labels, mask=mask,
                         weights=weights, reduction=reduction, pair_weight=pair_weight)


def lambdarank_loss(
    logits: Tensor,
    labels: Tensor,
    *,
    mask: Tensor,
    weights: Tensor | None = None,
    reduction: str = "mean",
    gain: str = "exp",
) -> Tensor:
    """LambdaRank as a loss (Burges 2006): RankNet pairs weighted by the detached ``|ΔNDCG|``.

    ``|ΔNDCG_ij| = |g_i - g_j| / IDCG * |1/log2(1 + r_i) - 1/log2(1 + r_j)|`` with ranks r by the
    current scores; tied scores take the expectation over their random orders, so a constant
    score (e.g. at initialisation) still gets a gradient. Reduction as :func:`pairwise_loss`.

    Args:
        logits, labels, mask, weights, reduction: as :func:`pairwise_loss` (``[G, L]``).
        gain: ``"exp"`` or ``"linear"``.

    Returns:
        Scalar, or ``[G]`` for ``reduction="none"``.
    """
    return pairwise_loss(logistic_kernel, logits, labels, mask=mask, weights=weights,
                         reduction=reduction, pair_weight="ndcg", gain=gain)


def lambda_loss(
    logits: Tensor,
    labels: Tensor,
    *,
    mask: Tensor,
    weights: Tensor | None = None,
    reduction: str = "mean",
    scheme: str = "ndcg2pp",
    mu: float = 10.0,
    gain: str = "exp",
) -> Tensor:
    """LambdaLoss, NDCG-Loss2++ by default (Wang et al. 2018, "The LambdaLoss Framework").

    ``l_ij = (ρ_ij + μ δ_ij) log2(1 + exp(-(s_i - s_j)))`` over pairs ``y_i > y_j``, with
    ``ρ_ij = |G_i - G_j| |1/D(r_i) - 1/D(r_j)|`` (the LambdaRank |ΔNDCG|) and
    ``δ_ij = |G_i - G_j| |1/D(|r_i - r_j|) - 1/D(|r_i - r_j| + 1)|`` (NDCG-Loss2), ``G = g/IDCG``,
    ``D(r) = log2(1 + r)``, ranks by the detached current scores (ties: see
    :func:`pairwise_loss`). The paper (and allRank) sum over pairs; here the pairs of a list are
    averaged like every pairwise loss (the sum divided by the pair count).

    Args:
        logits, labels, mask, weights, reduction: as :func:`pairwise_loss` (``[G, L]``).
        scheme: ``"ndcg2pp"`` (NDCG-Loss2++), ``"ndcg2"`` (NDCG-Loss2) or ``"ndcg"``.
        mu: the weight μ of δ in NDCG-Loss2++ (10 as in allRank's default).
        gain: ``"exp"`` or ``"linear"``.

    Returns:
        Scalar, or ``[G]`` for ``reduction="none"``.
    """
    if scheme not in ("ndcg", "ndcg2", "ndcg2pp"):
        raise ValueError(f"scheme must be 'ndcg', 'ndcg2' or 'ndcg2pp', got {scheme!r}")
    natural = pairwise_loss(logistic_kernel, logits, labels, mask=mask, weights=weights,
                            reduction=reduction, pair_weight=scheme, mu=mu, gain=gain)
    return natural / math.log(2.0)  # log2(1 + e^-d) = softplus(-d) / ln 2
