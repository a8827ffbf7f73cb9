"""Pointwise loss: binary cross-entropy on logits, the calibration anchor of every hybrid."""

from __future__ import annotations

import torch  # noqa: F401 - the doctests below use it
import torch.nn.functional as F
from torch import Tensor

from hybridrank.losses._core import check_inputs, prepare, reduce_lists

__all__ = ["bce_loss", "pointwise_target"]

TARGETS = ("binary", "scaled")


def pointwise_target(labels: Tensor, target: str = "binary", label_max: float = 1.0) -> Tensor:
    """Map graded labels to a BCE target in [0, 1]: ``y > 0`` (``"binary"``) or ``y / label_max``.

    >>> pointwise_target(torch.tensor([0.0, 1.0, 2.0]), "scaled", label_max=2.0).tolist()
    [0.0, 0.5, 1.0]
    """
    if target == "binary":
        return (labels > 0).to(labels.dtype)
    if target == "scaled":
        if not label_max > 0:
            raise ValueError(f"label_max must be > 0 for target='scaled', got {label_max}")
        return labels / label_max
    raise ValueError(f"target must be one of {TARGETS}, got {target!r}")


def bce_loss(
    logits: Tensor,
    labels: Tensor,
    *,
    mask: Tensor,
    weights: Tensor | None = None,
    reduction: str = "mean",
    target: str = "binary",
    label_max: float = 1.0,
) -> Tensor:
    """Binary cross-entropy on logits, a (weighted) mean over real impressions.

    ``l_i = softplus(s_i) - t_i s_i`` (the stable form of ``-t log σ(s) - (1 - t) log(1 - σ(s))``)
    with ``t = pointwise_target(y)``; ``mean = Σ_i w_i l_i / Σ_i w_i`` over real impressions.

    Args:
        logits: ``[G, L]`` scores.
        labels: ``[G, L]`` graded labels.
        mask: ``[G, L]`` bool, True on real impressions.
        weights: optional ``[G, L]`` impression weights (e.g. 1 / keep-rate of sampled negatives).
        reduction: ``"mean"`` over impressions, ``"sum"``, or ``"none"`` (``[G]`` per-list sums).
        target: ``"binary"`` (label > 0) or ``"scaled"`` (label / label_max).
        label_max: the largest label, for ``target="scaled"``.

    Returns:
        Scalar, or ``[G]`` for ``reduction="none"``.

    >>> s = torch.tensor([[0.0, 0.0]]); y = torch.tensor([[1.0, 0.0]])
    >>> round(bce_loss(s, y, mask=torch.ones(1, 2, dtype=torch.bool)).item(), 4)  # log 2
    0.6931
    """
    check_inputs(logits, labels, mask, weights, reduction)
    s, y, w, m = prepare(logits, labels, mask, weights)
    t = pointwise_target(y, target, label_max)
    per_item = F.binary_cross_entropy_with_logits(s, t, reduction="none")
    per_list = (w * per_item).sum(dim=1)
    return reduce_lists(per_list, m.sum(dim=1) > 0, reduction, denom=w.sum())
