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

from hybridrank.losses._core import (
    average_ranks,
    check_inputs,
    discount,
    gains,
    ideal_dcg,
    prepare,
    reduce_lists,
    safe_div,
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


def valid_pairs(labels: Tensor, mask: Tensor) -> Tensor:
    """``[G, L, L]`` bool: ``mask_i & mask_j & (y_i > y_j)``, the only definition of a pair."""
    return mask.unsqueeze(2) & mask.unsqueeze(1) & (labels.unsqueeze(2) > labels.unsqueeze(1))


def logistic_kernel(d: Tensor) -> Tensor:
    """RankNet / pairwise logistic: ``log(1 + exp(-d)) = softplus(-d)``."""
    return F.softplus(-d)


def hinge_kernel(d: Tensor, margin: float = 1.0) -> Tensor:
    """Pairwise hinge: ``max(0, margin - d)``."""
    return F.relu(margin - d)


def _pair_weights(scheme: str, s: Tensor, y: Tensor, mask: Tensor, mu: float, gain: str) -> Tensor:
    """``[G, L, L]`` detached LambdaRank-style weights of each pair (Burges 2006; Wang et al. 2018).

    - ``"gain"``: ``|g_i - g_j|``.
    - ``"ndcg"``: ``|ΔNDCG|`` of swapping i and j, ``|G_i - G_j| |1/D(r_i) - 1/D(r_j)|``.
    - ``"ndcg2"``: ``|G_i - G_j| |1/D(|r_i - r_j|) - 1/D(|r_i - r_j| + 1)|`` (NDCG-Loss2).
    - ``"ndcg2pp"``: ``ndcg + mu * ndcg2`` (NDCG-Loss2++).

    ``G = g / IDCG``, ``D(r) = log2(1 + r)``, ranks r by the current (detached) scores with ties
    averaged; ``|r_i - r_j|`` is clamped to >= 1 in NDCG-Loss2 so tied scores stay finite.
    """
    with torch.no_grad():
        g = gains(y, gain)
        if scheme == "gain":
            return (g.unsqueeze(2) - g.unsqueeze(1)).abs()
        big_g = safe_div(g, ideal_dcg(g, mask).unsqueeze(1))
        dg = (big_g.unsqueeze(2) - big_g.unsqueeze(1)).abs()
        r = average_ranks(s.detach(), mask)
        out = torch.zeros_like(dg)
        if scheme in ("ndcg", "ndcg2pp"):
            disc = discount(r)
            out = out + dg * (disc.unsqueeze(2) - disc.unsqueeze(1)).abs()
        if scheme in ("ndcg2", "ndcg2pp"):
            gap = (r.unsqueeze(2) - r.unsqueeze(1)).abs().clamp_min(1.0)
            delta = dg * (discount(gap) - discount(gap + 1.0)).abs()
            out = out + (mu * delta if scheme == "ndcg2pp" else delta)
        return out


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

    Args:
        kernel: elementwise function of the ``[G, L, L]`` score differences ``s_i - s_j``.
        logits: ``[G, L]`` scores.
        labels: ``[G, L]`` graded labels.
        mask: ``[G, L]`` bool, True on real impressions.
        weights: optional ``[G, L]`` impression weights; a pair weighs ``w_i w_j``.
        reduction: ``"mean"`` over lists with a pair, ``"sum"``, or ``"none"`` (``[G]``).
        pair_weight: None, ``"gain"``, ``"ndcg"`` (LambdaRank), ``"ndcg2"`` or ``"ndcg2pp"``.
        mu: weight of the NDCG-Loss2 term in ``"ndcg2pp"``.
        gain: ``"exp"`` (``2^y - 1``) or ``"linear"`` gains for the pair weights.

    Returns:
        Scalar, or ``[G]`` for ``reduction="none"``. Memory and time grow as ``G * L^2``.
    """
    check_inputs(logits, labels, mask, weights, reduction)
    if pair_weight not in PAIR_WEIGHTS:
        raise ValueError(f"pair_weight must be one of {PAIR_WEIGHTS}, got {pair_weight!r}")
    s, y, w = prepare(logits, labels, mask, weights)
    pairs = valid_pairs(y, mask)
    pw = torch.where(pairs, w.unsqueeze(2) * w.unsqueeze(1), torch.zeros((), dtype=s.dtype))
    losses = kernel(s.unsqueeze(2) - s.unsqueeze(1))
    lam = pw if pair_weight is None else pw * _pair_weights(pair_weight, s, y, mask, mu, gain)
    per_list = safe_div((lam * losses).sum(dim=(1, 2)), pw.sum(dim=(1, 2)))
    return reduce_lists(per_list, pairs.any(dim=2).any(dim=1), reduction)


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
    current scores (ties averaged). Reduction as :func:`pairwise_loss`.

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
    ``D(r) = log2(1 + r)``, ranks by the detached current scores. The paper sums over pairs; here
    the pairs of a list are averaged like every pairwise loss (the sum divided by the pair count).

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
    inv_ln2 = 1.0 / math.log(2.0)
    return pairwise_loss(lambda d: inv_ln2 * F.softplus(-d), logits, labels, mask=mask,
                         weights=weights, reduction=reduction, pair_weight=scheme, mu=mu,
                         gain=gain)
