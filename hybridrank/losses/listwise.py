"""Listwise ranking losses: softmax CE, ListMLE, position-aware ListMLE, ApproxNDCG, NeuralNDCG.

All are pure ranking losses (invariant to a per-list constant shift of the logits). A list enters
the mean only when it has something to order: two real impressions with different labels.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hybridrank.losses._core import (
    check_inputs,
    discount,
    gains,
    has_pair,
    ideal_dcg,
    neg_fill,
    prepare,
    reduce_lists,
    safe_div,
    tie_keys,
)

__all__ = [
    "softmax_loss",
    "listmle_loss",
    "position_aware_listmle_loss",
    "approx_ndcg_loss",
    "neural_ndcg_loss",
]


def _masked_log_softmax(s: Tensor, mask: Tensor) -> Tensor:
    return torch.log_softmax(s.masked_fill(~mask, neg_fill(s.dtype)), dim=-1)


def softmax_loss(
    logits: Tensor,
    labels: Tensor,
    *,
    mask: Tensor,
    weights: Tensor | None = None,
    reduction: str = "mean",
) -> Tensor:
    """Softmax cross-entropy, ListNet top-one (Cao et al. 2007).

    ``loss_g = -Σ_i (y_i / Σ_j y_j) log softmax(s)_i`` over real impressions; with weights the
    target is ``w_i y_i``. Mean over lists with a positive and two different labels.

    Args:
        logits: ``[G, L]`` scores.
        labels: ``[G, L]`` graded labels.
        mask: ``[G, L]`` bool, True on real impressions.
        weights: optional ``[G, L]`` impression weights.
        reduction: ``"mean"``, ``"sum"`` or ``"none"`` (``[G]``).

    Returns:
        Scalar, or ``[G]`` for ``reduction="none"``.

    >>> s = torch.zeros(1, 4); y = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    >>> round(softmax_loss(s, y, mask=torch.ones(1, 4, dtype=torch.bool)).item(), 4)  # log 4
    1.3863
    """
    check_inputs(logits, labels, mask, weights, reduction)
    s, y, w = prepare(logits, labels, mask, weights)
    t = w * y
    per_list = safe_div(-(t * _masked_log_softmax(s, mask)).sum(dim=1), t.sum(dim=1))
    valid = has_pair(y, mask) & (t.sum(dim=1) > 0)
    return reduce_lists(per_list, valid, reduction)


def _plackett_luce_terms(
    logits: Tensor, labels: Tensor, mask: Tensor, weights: Tensor | None, seed: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-position ListMLE terms ``logsumexp(s_π[k:]) - s_π[k]`` in label order.

    Returns ``(terms, w_sorted, mask_sorted, y)``: ``[G, L]`` tensors in the order π that sorts
    labels descending, label ties in a fixed-seed pseudo-random order, padding last.
    """
    s, y, w = prepare(logits, labels, mask, weights)
    # Tie order first (a random permutation), then a stable sort by label keeps it within ties.
    keys = tie_keys(tuple(y.shape), seed, y.device)
    order = torch.argsort(keys, dim=1)
    y_key = torch.where(mask, y, torch.full_like(y, float("-inf"))).gather(1, order)
    by_label = torch.sort(y_key, dim=1, descending=True, stable=True).indices
    perm = order.gather(1, by_label)
    m_s = mask.gather(1, perm)
    s_s = s.gather(1, perm).masked_fill(~m_s, neg_fill(s.dtype))
    tail_lse = torch.logcumsumexp(s_s.flip(1), dim=1).flip(1)
    terms = torch.where(m_s, tail_lse - s_s, torch.zeros_like(s_s))
    return terms, w.gather(1, perm), m_s, y


def listmle_loss(
    logits: Tensor,
    labels: Tensor,
    *,
    mask: Tensor,
    weights: Tensor | None = None,
    reduction: str = "mean",
    seed: int = 0,
) -> Tensor:
    """ListMLE (Xia et al. 2008): negative Plackett–Luce log-likelihood of the label order.

    ``loss_g = Σ_k w_π(k) [log Σ_{m >= k} exp(s_π(m)) - s_π(k)]`` where π sorts labels descending.
    Label ties are ordered by a fixed-seed pseudo-random hash of (row, slot), so the result is
    deterministic, does not favour storage order systematically, and ignores extra padding; a
    list with ties is therefore not exactly invariant to permuting its items. Per list a sum over
    positions (the log-likelihood), then a mean over lists with two different labels.

    Args:
        logits: ``[G, L]`` scores.
        labels: ``[G, L]`` graded labels.
        mask: ``[G, L]`` bool, True on real impressions.
        weights: optional ``[G, L]`` impression weights (scale the term of each item).
        reduction: ``"mean"``, ``"sum"`` or ``"none"`` (``[G]``).
        seed: seed of the tie order.

    Returns:
        Scalar, or ``[G]`` for ``reduction="none"``.

    >>> s = torch.zeros(1, 2); y = torch.tensor([[1.0, 0.0]])
    >>> round(listmle_loss(s, y, mask=torch.ones(1, 2, dtype=torch.bool)).item(), 4)  # log 2
    0.6931
    """
    check_inputs(logits, labels, mask, weights, reduction)
    terms, w_s, _, y = _plackett_luce_terms(logits, labels, mask, weights, seed)
    return reduce_lists((w_s * terms).sum(dim=1), has_pair(y, mask), reduction)


def position_aware_listmle_loss(
    logits: Tensor,
    labels: Tensor,
    *,
    mask: Tensor,
    weights: Tensor | None = None,
    reduction: str = "mean",
    seed: int = 0,
) -> Tensor:
    """Position-aware ListMLE (Lan et al. 2014): ListMLE terms weighted by position.

    Position k (1-based) of n real items weighs ``2^(n - k + 1) - 1``, normalised to sum to 1 per
    list: ``a_k = 2^-k (1 - 2^-(n-k+1)) / (1 - (n + 2) 2^-(n+1))`` (the same ratio, written so it
    never overflows for long lists). Ties and reduction as :func:`listmle_loss`.

    Args:
        logits, labels, mask, weights, reduction, seed: as :func:`listmle_loss`.

    Returns:
        Scalar, or ``[G]`` for ``reduction="none"``.
    """
    check_inputs(logits, labels, mask, weights, reduction)
    terms, w_s, m_s, y = _plackett_luce_terms(logits, labels, mask, weights, seed)
    n = mask.sum(dim=1, keepdim=True).to(terms.dtype)
    k = torch.arange(1, terms.shape[1] + 1, device=terms.device, dtype=terms.dtype).unsqueeze(0)
    a = torch.exp2(-k) * -torch.expm1((k - n - 1).clamp_max(0) * 0.6931471805599453)
    a = safe_div(a, -torch.expm1(torch.log(n + 2.0) - (n + 1.0) * 0.6931471805599453))
    a = torch.where(m_s, a, torch.zeros_like(a))
    return reduce_lists((a * w_s * terms).sum(dim=1), has_pair(y, mask), reduction)


def approx_ndcg_loss(
    logits: Tensor,
    labels: Tensor,
    *,
    mask: Tensor,
    weights: Tensor | None = None,
    reduction: str = "mean",
    temperature: float = 0.1,
    gain: str = "exp",
) -> Tensor:
    """ApproxNDCG (Qin et al. 2010): one minus NDCG with a smooth rank.

    ``π̂_i = 1 + Σ_{j != i} σ((s_j - s_i) / T)``,
    ``loss_g = 1 - Σ_i w_i g_i / log2(1 + π̂_i) / IDCG_g``. Mean over lists with two different
    labels (which implies a positive, so IDCG > 0).

    Args:
        logits: ``[G, L]`` scores.
        labels: ``[G, L]`` graded labels.
        mask: ``[G, L]`` bool, True on real impressions.
        weights: optional ``[G, L]`` impression weights (scale each item's gain in the DCG).
        reduction: ``"mean"``, ``"sum"`` or ``"none"`` (``[G]``).
        temperature: T of the sigmoid; smaller is closer to the true rank.
        gain: ``"exp"`` (``2^y - 1``) or ``"linear"``.

    Returns:
        Scalar, or ``[G]`` for ``reduction="none"``.
    """
    check_inputs(logits, labels, mask, weights, reduction)
    s, y, w = prepare(logits, labels, mask, weights)
    g = gains(y, gain)
    pair_real = mask.unsqueeze(1) & mask.unsqueeze(2)
    pair_real = pair_real & ~torch.eye(s.shape[1], dtype=torch.bool, device=s.device)
    soft = torch.sigmoid((s.unsqueeze(1) - s.unsqueeze(2)) / temperature)  # [g, i, j]: s_j - s_i
    approx_rank = 1.0 + torch.where(pair_real, soft, torch.zeros_like(soft)).sum(dim=2)
    dcg = (w * g * discount(approx_rank)).sum(dim=1)
    per_list = 1.0 - safe_div(dcg, ideal_dcg(g, mask))
    return reduce_lists(per_list, has_pair(y, mask), reduction)


def neural_ndcg_loss(
    logits: Tensor,
    labels: Tensor,
    *,
    mask: Tensor,
    weights: Tensor | None = None,
    reduction: str = "mean",
    temperature: float = 1.0,
    sinkhorn_iters: int = 30,
    k: int | None = None,
    gain: str = "exp",
) -> Tensor:
    """NeuralNDCG (Pobrotyn & Białobrzeski 2021): NDCG under a NeuralSort relaxed permutation.

    NeuralSort (Grover et al. 2019) gives the row-stochastic ``P̂[r, i] = softmax_i(((n + 1 - 2r)
    s_i - Σ_j |s_i - s_j|) / T)`` for rank r of the n real items; Sinkhorn scaling (a fixed number
    of alternating row/column normalisations) makes it close to doubly stochastic. Then
    ``loss_g = 1 - Σ_{r <= k} (P̂ g)_r / log2(1 + r) / IDCG@k``. Mean over lists with two
    different labels.

    Args:
        logits: ``[G, L]`` scores.
        labels: ``[G, L]`` graded labels.
        mask: ``[G, L]`` bool, True on real impressions.
        weights: optional ``[G, L]`` impression weights (scale each item's gain).
        reduction: ``"mean"``, ``"sum"`` or ``"none"`` (``[G]``).
        temperature: T of NeuralSort.
        sinkhorn_iters: number of Sinkhorn normalisation rounds (no data-dependent stopping, so
            no device sync).
        k: NDCG cut-off, or None for the whole list.
        gain: ``"exp"`` (``2^y - 1``) or ``"linear"``.

    Returns:
        Scalar, or ``[G]`` for ``reduction="none"``. Memory grows as ``G * L^2``.
    """
    check_inputs(logits, labels, mask, weights, reduction)
    s, y, w = prepare(logits, labels, mask, weights)
    length = s.shape[1]
    n = mask.sum(dim=1, keepdim=True).to(s.dtype)  # [G, 1]
    r = torch.arange(1, length + 1, device=s.device, dtype=s.dtype)
    real_r = r.unsqueeze(0) <= n  # [G, L] rank r exists in list g
    abs_sum = (torch.where(mask.unsqueeze(1), (s.unsqueeze(2) - s.unsqueeze(1)).abs(),
                           torch.zeros((), dtype=s.dtype))).sum(dim=2)  # [G, L]
    scale = (n + 1.0 - 2.0 * r.unsqueeze(0)).unsqueeze(2)  # [G, R, 1]
    p_logits = (scale * s.unsqueeze(1) - abs_sum.unsqueeze(1)) / temperature  # [G, R, L]
    p_logits = p_logits.masked_fill(~mask.unsqueeze(1), neg_fill(s.dtype))
    square = real_r.unsqueeze(2) & mask.unsqueeze(1)
    p = torch.where(square, torch.softmax(p_logits, dim=2), torch.zeros((), dtype=s.dtype))
    # p >= 0, so a zero sum means an all-zero (padding) row or column: dividing it by 1 instead
    # is exact, and keeps the backward finite through every round.
    for _ in range(sinkhorn_iters):
        col = p.sum(dim=1, keepdim=True)
        p = p / col.masked_fill(col == 0, 1.0)  # columns (items)
        row = p.sum(dim=2, keepdim=True)
        p = p / row.masked_fill(row == 0, 1.0)  # rows (ranks)
    g = gains(y, gain)
    soft_gain = (p * (w * g).unsqueeze(1)).sum(dim=2)  # [G, R]
    disc = discount(r).unsqueeze(0)
    if k is not None:
        disc = torch.where(r.unsqueeze(0) <= k, disc, torch.zeros_like(disc))
    dcg = (soft_gain * disc).sum(dim=1)
    top = torch.sort(torch.where(mask, g, torch.zeros_like(g)), dim=1, descending=True).values
    idcg = (top * disc).sum(dim=1)
    per_list = 1.0 - safe_div(dcg, idcg)
    return reduce_lists(per_list, has_pair(y, mask), reduction)
