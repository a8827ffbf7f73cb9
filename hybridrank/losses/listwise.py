"""Listwise ranking losses: softmax CE, ListMLE, position-aware ListMLE, ApproxNDCG, NeuralNDCG.

All are pure ranking losses (invariant to a per-list constant shift of the logits). A list enters
the mean only when it has something to order: two real impressions with different labels.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from hybridrank._dcg import discount, gains, ideal_dcg, position_discounts
from hybridrank.losses._core import (
    INT_OF,
    big,
    bit_masks,
    check_inputs,
    float_bits,
    fused_reduce,
    has_pair,
    label_keys,
    neg_fill,
    prepare,
    reduce_lists,
    safe_div,
    select_bits,
)

__all__ = [
    "softmax_loss",
    "listmle_loss",
    "position_aware_listmle_loss",
    "approx_ndcg_loss",
    "neural_ndcg_loss",
]


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
    return _SoftmaxCE.apply(logits, labels, mask, weights, reduction)


class _SoftmaxCE(torch.autograd.Function):
    """Softmax CE ``-Σ t_i log softmax(s)_i / Σ t`` per list, reduced as ``reduction`` says.

    One fused function with the analytic backward ``∂/∂s_i = (softmax(s)_i - t_i / Σ t) g``:
    a few kernels instead of autograd's chain through the masking, ``log_softmax``, the product
    and the sums (the loss is tiny per element, so fixed per-kernel costs dominate on CPU).
    Padding gets ``neg_fill`` logits (softmax weight 0) and target 0, hence exactly zero gradient.
    Weights receive no gradient.
    """

    @staticmethod
    def forward(ctx, logits, labels, mask, weights, reduction):
        dtype = torch.promote_types(logits.dtype, torch.float32)
        itype = INT_OF[dtype]
        keep = mask.view(torch.uint8).to(itype).neg_()  # all bits set on real slots
        drop = ~keep
        s = (logits.to(dtype).view(itype) & keep).bitwise_or_(drop & float_bits(neg_fill(dtype),
                                                                                dtype))
        y_bits = labels.to(dtype).view(itype) & keep
        s, y = s.view(dtype), y_bits.view(dtype)
        t = y if weights is None else (weights.to(dtype).view(itype) & keep).view(dtype) * y
        mass = t.sum(dim=1)
        safe_mass = mass + (mass <= 0)  # 1 where a list has no target mass
        per_list = (t * torch.log_softmax(s, dim=1)).sum(dim=1).div_(safe_mass).neg_()
        # two different real labels: the real labels' bit patterns are not all equal (integer
        # max / min, several times faster than float ones on short rows; -0.0 vs 0.0 only
        # differ where the target mass is 0, which is invalid anyway)
        info = torch.iinfo(itype)
        hi = (y_bits | (drop & info.min)).amax(dim=1)
        lo = (y_bits | (drop & info.max)).amin(dim=1)
        valid = (hi != lo) & (mass > 0)
        out, d_list = fused_reduce(per_list, valid, reduction)
        ctx.save_for_backward(s, t, mass, safe_mass, d_list)
        ctx.in_dtype = logits.dtype
        return out

    @staticmethod
    def backward(ctx, grad):
        s, t, mass, safe_mass, d_list = ctx.saved_tensors
        scale = (grad * d_list / safe_mass).unsqueeze(1)
        # softmax(s), not exp(log_softmax(s)): exp of the huge negative padding fill is slow
        ds = torch.addcmul(torch.softmax(s, dim=1) * (mass.unsqueeze(1) * scale), t, scale,
                           value=-1.0)
        return ds.to(ctx.in_dtype), None, None, None, None


def _pa_formula(n: Tensor, length: int, dtype: torch.dtype) -> Tensor:
    """Position-aware weights of the ascending slots ``0..L-1`` for each list length in ``n``."""
    k = (length - torch.arange(length, device=n.device, dtype=dtype)).unsqueeze(0)
    nn = n.to(dtype).unsqueeze(1)
    a = torch.exp2(-k) * -torch.expm1((k - nn - 1).clamp_max(0) * 0.6931471805599453)
    a = safe_div(a, -torch.expm1(torch.log(nn + 2.0) - (nn + 1.0) * 0.6931471805599453))
    return a * (k <= nn)


@functools.lru_cache(maxsize=16)
def _pa_table(length: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``[L + 1, L]``: the weights for every list length 0..L (cached per shape)."""
    return _pa_formula(torch.arange(length + 1, device=device), length, dtype)


def _pa_weights(n: Tensor, length: int, dtype: torch.dtype) -> Tensor:
    """``[G, L]`` position-aware ListMLE weights of the ascending slots of lists of ``n`` items.

    Descending position ``k = L - i`` of ascending slot ``i`` weighs ``2^(n - k + 1) - 1``,
    normalised to sum to 1 over the list: ``a_k = 2^-k (1 - 2^-(n-k+1)) / (1 - (n + 2) 2^-(n+1))``
    (the same ratio, written so it never overflows). Padding slots (``k > n``) get 0. Looked up in
    a cached ``[L + 1, L]`` table for lists up to 1024 long.
    """
    if length > 1024:
        return _pa_formula(n, length, dtype)
    return _pa_table(length, dtype, n.device).index_select(0, n)


class _ListMLE(torch.autograd.Function):
    """(Position-aware) ListMLE in one function, reduced as ``reduction`` says.

    Forward, for each list: shuffle the columns by ``perm`` and sort by label *ascending*
    (padding first, as integer keys that order like the labels). In ascending order the items
    ranked after position k of the label order (its Plackett–Luce tail) are the prefix
    ``m <= k``, so all tail sums are one cumulative sum of ``e = exp(s - shift)``, many times
    faster than ``logcumsumexp``. The origin sits ~80 below the list's best score (``L e^80``
    stays finite in float32), so every tail within ~180 of the list's best score is exact (~1400
    for float64 logits), twice the range of TF-Ranking's and allRank's single shift. A tail lying
    entirely further below underflows; its term then uses the tail's largest score instead
    (``max_{m <= k} s_m - s_k + log L + 1``, within ``log L + 1`` of the exact value, with the
    gradient of that max), so values stay close and gradients point the right way at any scale.
    ``loss_g = Σ_k c_k [log T_k - (s_k - shift)]`` with ``T`` the prefix sums and ``c`` the
    weight of each position's term.

    Backward (analytic): ``∂/∂s_m = e_m Σ_{k >= m} c_k / T_k - c_m``, then the gradient is sent
    back through the sort and the column shuffle. Weights receive no gradient.
    """

    @staticmethod
    def forward(ctx, logits, labels, mask, weights, perm, position_aware: bool, reduction: str):
        dtype = torch.promote_types(logits.dtype, torch.float32)
        length = labels.shape[1]
        bits = bit_masks(mask, dtype)
        shuffle = perm.expand(labels.shape[0], length)
        keys, order = torch.sort(label_keys(labels.to(dtype), mask, bits).gather(1, shuffle), dim=1)
        idx = shuffle.gather(1, order)  # sorted slot k holds storage slot idx[g, k]
        n = mask.sum(dim=1)
        first_real = length - n  # ascending: padding fills slots [0, L - n)
        m_s = (torch.arange(length, device=labels.device) >= first_real.unsqueeze(1)).to(dtype)
        # the largest real label sits last, the smallest at L - n
        low = keys.gather(1, first_real.clamp(max=max(length - 1, 0)).unsqueeze(1)).squeeze(1)
        valid = keys[:, -1] > low if length else n > 0
        c = m_s
        if weights is not None:
            c = select_bits(weights.to(dtype), mask, 0.0, bits).gather(1, idx)
        if position_aware:
            c = c * _pa_weights(n, length, dtype)
        # padding gets -big: exp(s - shift) is exactly 0 there, no mask needed below
        s = select_bits(logits.to(dtype), mask, -big(dtype), bits).gather(1, idx)
        # the origin ``margin`` below each list's best score: exp covers about margin + 100 below
        # the best (float32; margin + 740 in float64) and L e^margin stays finite
        fin = torch.finfo(dtype)
        margin = min(80.0 if dtype == torch.float32 else 700.0,
                     math.log(fin.max) - math.log(max(length, 1)) - 1.0)
        rel = s - (s.amax(dim=1, keepdim=True) - margin)
        # exp is ~30x slower where its result is subnormal (x86): keep it normal, zero padding;
        # an item that far below the best adds at most ``floor`` to a tail
        floor_log = math.log(fin.tiny) + 1.0
        e = torch.exp(rel.clamp_min(floor_log)) * m_s
        tail = e.cumsum(dim=1).clamp_min_(fin.tiny)  # padding (first): tiny, its c is 0
        term = torch.log(tail) - rel
        # Far tails: where a prefix sum underflowed, use its largest score instead (log-sum-exp
        # lies within log L of the max): the prefix max plus log L + 1 bounds every exact term,
        # so the minimum keeps exact terms and caps clamped ones. Only computed when some real
        # tail underflowed on CPU (that check costs a device sync elsewhere: always there).
        far = ci = None
        smallest = tail.gather(1, first_real.clamp(max=max(length - 1, 0)).unsqueeze(1))
        floor = math.exp(floor_log) * (length + 1)  # a tail made of clamped items only
        if length and (s.device.type != "cpu" or bool(((smallest <= floor) & (n > 0)
                                                        .unsqueeze(1)).any())):
            cm, ci = torch.cummax(s, dim=1)
            bound = cm - s + (math.log(length) + 1.0)
            far = term > bound
            term = torch.minimum(term, bound)
        out, d_list = fused_reduce((c * term).sum(dim=1), valid, reduction)
        ctx.save_for_backward(e, tail, c, idx, far, ci, d_list)
        ctx.in_dtype = logits.dtype
        ctx.bound = fin.max / (2.0 * (length + 1))
        return out

    @staticmethod
    def backward(ctx, grad):
        e, tail, c, idx, far, ci, d_list = ctx.saved_tensors
        # c / T, bounded so that the sums below stay finite where a tail underflowed
        ratio = (c / tail).clamp_max_(ctx.bound)  # padding: c = 0
        if far is not None:
            ratio = ratio * ~far
        # Σ_{k >= m} c_k / T_k, summed from the end: the small late terms must not be lost in
        # the large early ones (total - cumsum would cancel catastrophically)
        after = ratio.flip(1).cumsum(dim=1).flip(1)
        ds = torch.addcmul(c, e, after, value=-1.0).neg_()  # e_m after_m - c_m
        if far is not None:  # capped terms: d(max_{m <= k} s_m - s_k) puts +c_k on the argmax
            ds.scatter_add_(1, ci, c * far)
        ds.mul_((grad * d_list).unsqueeze(1))
        # undo the shuffle and the sort: sorted slot k came from storage slot idx[g, k]
        return (torch.empty_like(ds).scatter_(1, idx, ds).to(ctx.in_dtype), None, None, None,
                None, None, None)


def _plackett_luce(
    logits: Tensor, labels: Tensor, mask: Tensor, weights: Tensor | None, seed: int | None,
    position_aware: bool, reduction: str,
) -> Tensor:
    """(Position-aware) ListMLE, reduced as ``reduction`` says.

    The permutation π sorts labels descending, label ties in a uniformly random order: the
    columns are first shuffled by one random permutation (``torch.randperm``, from the global
    generator, or from a generator seeded with ``seed``), then sorted by label, so every order of
    a tied block is equally likely whatever the storage order (:class:`_ListMLE`).
    """
    gen = None
    if seed is not None:
        gen = torch.Generator(device=labels.device)
        gen.manual_seed(seed)
    perm = torch.randperm(labels.shape[1], generator=gen, device=labels.device)
    return _ListMLE.apply(logits, labels, mask, weights, perm, position_aware, reduction)


def listmle_loss(
    logits: Tensor,
    labels: Tensor,
    *,
    mask: Tensor,
    weights: Tensor | None = None,
    reduction: str = "mean",
    seed: int | None = None,
) -> Tensor:
    """ListMLE (Xia et al. 2008): negative Plackett–Luce log-likelihood of the label order.

    ``loss_g = Σ_k w_π(k) [log Σ_{m >= k} exp(s_π(m)) - s_π(k)]`` where π sorts labels descending.
    Label ties are put in a uniformly random order at every call (one random permutation of the
    columns, then a sort by label, as allRank does; TF-Ranking and rax shuffle ties too), so the
    expected gradient treats tied items alike whatever their storage order. ``seed`` fixes that
    order for reproducible values; ``None`` (default) draws it from torch's global generator, so
    ``torch.manual_seed`` / ``seed_everything`` make a run reproducible. A list with tied labels
    is therefore invariant to permuting its items only in distribution. Per list a sum over
    positions (the log-likelihood), then a mean over lists with two different labels.

    Args:
        logits: ``[G, L]`` scores.
        labels: ``[G, L]`` graded labels.
        mask: ``[G, L]`` bool, True on real impressions.
        weights: optional ``[G, L]`` impression weights (scale the term of each item).
        reduction: ``"mean"``, ``"sum"`` or ``"none"`` (``[G]``).
        seed: seed of the tie order, or None for a fresh draw from the global generator.

    Returns:
        Scalar, or ``[G]`` for ``reduction="none"``.

    >>> s = torch.zeros(1, 2); y = torch.tensor([[1.0, 0.0]])
    >>> round(listmle_loss(s, y, mask=torch.ones(1, 2, dtype=torch.bool)).item(), 4)  # log 2
    0.6931
    """
    check_inputs(logits, labels, mask, weights, reduction)
    return _plackett_luce(logits, labels, mask, weights, seed, False, reduction)


def position_aware_listmle_loss(
    logits: Tensor,
    labels: Tensor,
    *,
    mask: Tensor,
    weights: Tensor | None = None,
    reduction: str = "mean",
    seed: int | None = None,
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
    return _plackett_luce(logits, labels, mask, weights, seed, True, reduction)


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
    ``loss_g = 1 - Σ_i w_i g_i / log2(1 + π̂_i) / IDCG_g`` where ``IDCG_g`` is the DCG of the
    weighted gains ``w_i g_i`` in their ideal order, so constant weights change nothing and the
    loss stays in about ``[0, 1]``. Mean over lists with two different labels (which implies a
    positive, so IDCG > 0).

    Args:
        logits: ``[G, L]`` scores.
        labels: ``[G, L]`` graded labels.
        mask: ``[G, L]`` bool, True on real impressions.
        weights: optional ``[G, L]`` impression weights (scale each item's gain, in the DCG and
            in the ideal DCG).
        reduction: ``"mean"``, ``"sum"`` or ``"none"`` (``[G]``).
        temperature: T of the sigmoid; smaller is closer to the true rank.
        gain: ``"exp"`` (``2^y - 1``) or ``"linear"``.

    Returns:
        Scalar, or ``[G]`` for ``reduction="none"``.
    """
    check_inputs(logits, labels, mask, weights, reduction)
    s, y, w, m = prepare(logits, labels, mask, weights)
    wg = gains(y, gain) if weights is None else w * gains(y, gain)
    soft = torch.sigmoid((s.unsqueeze(1) - s.unsqueeze(2)) / temperature)  # [g, i, j]: s_j - s_i
    # Σ_{j real, j != i} σ((s_j - s_i) / T): the j = i term is σ(0) = 1/2 exactly.
    approx_rank = 0.5 + torch.bmm(soft, m.unsqueeze(2)).squeeze(2)
    per_list = 1.0 - safe_div((wg * discount(approx_rank)).sum(dim=1), ideal_dcg(wg, None))
    return reduce_lists(per_list, has_pair(y, m), reduction)


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
    ``loss_g = 1 - Σ_{r <= k} (P̂ g)_r / log2(1 + r) / IDCG@k`` with weighted gains ``w_i g_i``
    in both the DCG and the ideal DCG. Mean over lists with two different labels.

    Args:
        logits: ``[G, L]`` scores.
        labels: ``[G, L]`` graded labels.
        mask: ``[G, L]`` bool, True on real impressions.
        weights: optional ``[G, L]`` impression weights (scale each item's gain, in the DCG and
            in the ideal DCG).
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
    s, y, w, m = prepare(logits, labels, mask, weights)
    length = s.shape[1]
    n = m.sum(dim=1, keepdim=True)  # [G, 1]
    r = torch.arange(1, length + 1, device=s.device, dtype=s.dtype)
    real_r = (r.unsqueeze(0) <= n).to(s.dtype)  # [G, R]: rank r exists in list g
    # Σ_j |s_i - s_j| over real j (padding logits are 0 and masked out by m_j)
    abs_sum = torch.bmm((s.unsqueeze(2) - s.unsqueeze(1)).abs(), m.unsqueeze(2)).squeeze(2)
    scale = (n + 1.0 - 2.0 * r.unsqueeze(0)).unsqueeze(2)  # [G, R, 1]
    p_logits = (scale * s.unsqueeze(1) - abs_sum.unsqueeze(1)) / temperature  # [G, R, L]
    p_logits = p_logits + ((m - 1.0) * big(s.dtype)).unsqueeze(1)  # padding items: ~ -inf
    p = torch.softmax(p_logits, dim=2) * (real_r.unsqueeze(2) * m.unsqueeze(1))
    # p >= 0, so a zero sum means an all-zero (padding) row or column: dividing it by 1 instead
    # is exact, and keeps the backward finite through every round.
    for _ in range(sinkhorn_iters):
        col = p.sum(dim=1, keepdim=True)
        p = p / col.masked_fill(col == 0, 1.0)  # columns (items)
        row = p.sum(dim=2, keepdim=True)
        p = p / row.masked_fill(row == 0, 1.0)  # rows (ranks)
    wg = gains(y, gain) if weights is None else w * gains(y, gain)
    soft_gain = torch.bmm(p, wg.unsqueeze(2)).squeeze(2)  # [G, R]
    disc = position_discounts(length, None if k is None else (k,), dtype=s.dtype, device=s.device)
    disc = disc.reshape(1, length)
    dcg = (soft_gain * disc).sum(dim=1)
    per_list = 1.0 - safe_div(dcg, ideal_dcg(wg, None, disc[0]))
    return reduce_lists(per_list, has_pair(y, m), reduction)
