"""The online Poisson bootstrap of the position tower (Chamandy et al. 2012).

Every request of a batch gets ``K`` independent Poisson(1) weights; the replicate sums
``Σ_i v_i · c[request_i, k]`` accumulate beside the main ones, so each replicate is the same
estimator on a resample of the requests, without storing the data.
"""

from __future__ import annotations

import torch

__all__ = ["poisson_one", "replicate_sums", "request_weights"]

#: Poisson(1)'s distribution function at 0..17; past 17 the mass is below 1e-16, under the float64
#: resolution of the uniforms it inverts
_POISSON_ONE_CDF = torch.cumsum(torch.exp(-1.0 - torch.lgamma(torch.arange(18, dtype=torch.float64) + 1)), 0)


def poisson_one(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Poisson(1) draws (float64) by inverting its distribution function ``F(k) = Σ_{i<=k} e⁻¹/i!``.

    Exact to float64 rounding, and about twice as fast as ``torch.poisson`` on a tensor of ones
    (the bootstrap draws one per request and replicate, every training step).

    Args:
        shape: the shape of the draws.
        generator: a CPU generator (the draws are the same whatever device trains).

    Returns:
        ``shape`` float64 counts 0, 1, 2, ... on the CPU.

    >>> x = poisson_one((200_000,), torch.Generator().manual_seed(0))
    >>> round(float(x.mean()), 2), round(float(x.var()), 2), float(x.min())
    (1.0, 1.0, 0.0)
    """
    u = torch.rand(shape, generator=generator, dtype=torch.float64)
    return torch.bucketize(u, _POISSON_ONE_CDF, right=True).to(torch.float64)


def request_weights(n_requests: int, n_boot: int, seed: int, device: torch.device) -> torch.Tensor:
    """``[R, K]`` Poisson(1) weights of a batch's requests, drawn from ``seed`` on the CPU.

    The draws do not depend on the device (a run repeats them on CPU and GPU, and after a
    mid-epoch resume). On a CUDA device they travel through pinned memory without blocking, so
    a training step does not wait for the copy.

    Args:
        n_requests: ``R``, the batch's requests. n_boot: ``K``, the replicates.
        seed: the generator's seed. device: where the weights are used.

    Returns:
        ``[R, K]`` float64 on ``device``.

    >>> request_weights(2, 3, 0, torch.device("cpu")).shape
    torch.Size([2, 3])
    """
    counts = poisson_one((n_requests, n_boot), torch.Generator().manual_seed(seed))
    if device.type == "cuda":
        return counts.pin_memory().to(device, non_blocking=True)
    return counts.to(device)


def replicate_sums(vals: torch.Tensor, cell: torch.Tensor, counts: torch.Tensor,
                   n_slots: int) -> torch.Tensor:
    """Replicate sums per slot: ``out[q, k, s] = Σ_{i in slot s} vals[q, i] · counts[request_i, k]``.

    The values are first summed per (request, slot), then weighted by one matrix product over
    requests (not an ``[B, Q, K]`` product per impression).

    Args:
        vals: ``[Q, B]`` values of each impression (the tower's ``Q = 3`` sums).
        cell: ``[B]`` ``request * n_slots + slot`` of each impression.
        counts: ``[R, K]`` bootstrap weights of the requests.
        n_slots: ``S``.

    Returns:
        ``[Q, K, S]`` sums.

    >>> v = torch.tensor([[1.0, 2.0, 4.0]])     # request 0 in slot 0; request 1 in slots 0, 1
    >>> replicate_sums(v, torch.tensor([0, 2, 3]), torch.tensor([[1.0], [3.0]]), 2).tolist()
    [[[7.0, 12.0]]]
    """
    n_req, k = counts.shape
    q = vals.shape[0]
    per = torch.zeros(n_req * n_slots, q, dtype=vals.dtype, device=vals.device)
    per.index_add_(0, cell, vals.T)
    return (counts.T @ per.view(n_req, n_slots * q)).view(k, n_slots, q).permute(2, 0, 1)
