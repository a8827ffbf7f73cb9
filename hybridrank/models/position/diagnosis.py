"""Is the position effect identified? The traffic the offsets are fitted on, and the diagnosis of
a logging policy that sorts by relevance.

Under random-order logging slot and relevance are independent within a request; a policy that
sorts by relevance puts the model's most relevant items in the top slots. The tower measures it
as the mean Spearman correlation of ``-position`` and the model's relevance over requests of
three or more impressions (outside exploration traffic), summed per epoch in a
:class:`RankDiagnosis`.
"""

from __future__ import annotations

import enum
import math
from typing import NamedTuple

import torch

__all__ = ["SORTED_CORRELATION", "RankDiagnosis", "RankEvidence", "Traffic", "rank_evidence",
           "within_request_rank_correlation"]

#: mean within-request rank correlation of slot and relevance above which in absolute value (and
#: 3 SE from 0) the logging policy is taken to sort by relevance. Measured on randomly built logs
#: (python -m benchmarks.worlds): random-order logs gave -0.01 to +0.02; relevance-sorted ones
#: 0.14 to 0.54 with a trained model, but 0.09 when the kept checkpoint was the first epoch's (a
#: model that has learnt little relevance sees little of the sort), hence 0.05, not 0.1; on a
#: 6k-impression sorted log it came out -0.10 (offsets too steep, relevance compensating)
SORTED_CORRELATION = 0.05


class Traffic(enum.IntEnum):
    """The traffic the offsets are fitted on (a checkpoint stores its code).

    ``ALL``: every impression; ``EXPLORATION``: the requests marked as shown in random order;
    ``PROPENSITY``: every impression, inverse-propensity weighted.
    """

    ALL = 0
    EXPLORATION = 1
    PROPENSITY = 2

    @property
    def label(self) -> str:
        """The name a report uses: ``all``, ``exploration``, ``propensity``."""
        return self.name.lower()


class RankDiagnosis(NamedTuple):
    """Sums of the within-request rank correlations of some batches.

    The tower stores them stacked in this order (``[5]`` float64: one addition per batch, one
    all-reduce per update); :meth:`read` gives them back by name.
    """

    sum_rho: torch.Tensor | float       # Σ ρ over the requests measured
    sum_rho_sq: torch.Tensor | float    # Σ ρ²
    measured: torch.Tensor | float      # requests measured: 3+ impressions, not tied, not exploration
    exploration: torch.Tensor | float   # exploration requests
    requests: torch.Tensor | float      # every request

    @classmethod
    def read(cls, stacked: torch.Tensor) -> RankDiagnosis:
        """The stacked ``[5]`` sums as Python floats (reads the device)."""
        return cls(*stacked.tolist())

    def stacked(self) -> torch.Tensor:
        """The ``[5]`` float64 tensor the tower stores (the fields are 0-d tensors)."""
        return torch.stack([torch.as_tensor(v).to(torch.float64) for v in self])


class RankEvidence(NamedTuple):
    """What a :class:`RankDiagnosis` says about the logging policy."""

    correlation: float | None   # mean ρ over the requests measured (None: none measured)
    se: float | None            # its standard error (None: fewer than two requests)
    requests: float             # requests measured
    sorted_policy: bool         # beyond SORTED_CORRELATION in absolute value and 3 SE from 0


def rank_evidence(d: RankDiagnosis) -> RankEvidence:
    """The mean rank correlation, its standard error and the verdict on the logging policy.

    ``ρ̄ = Σρ / n``, ``se = sqrt(max(Σρ² / n - ρ̄², 0) / n)``; the policy sorts when
    ``|ρ̄| > SORTED_CORRELATION`` and ``|ρ̄| > 3 se``. Either sign counts: a tower that has
    absorbed relevance makes the relevance model compensate in the lower slots, and the
    correlation can come out negative on a sorted log.

    Args:
        d: sums with float fields (:meth:`RankDiagnosis.read`).

    Returns:
        :class:`RankEvidence`.

    >>> ev = rank_evidence(RankDiagnosis(40.0, 20.0, 100.0, 0.0, 100.0))  # se = sqrt((0.2 - 0.4²) / 100)
    >>> ev.correlation, round(ev.se, 4), ev.sorted_policy
    (0.4, 0.02, True)
    >>> rank_evidence(RankDiagnosis(0.0, 0.0, 0.0, 0.0, 7.0)).correlation is None
    True
    """
    n = d.measured
    corr = d.sum_rho / n if n else None
    se = math.sqrt(max(d.sum_rho_sq / n - corr * corr, 0.0) / n) if n > 1 else None
    sorted_policy = (corr is not None and abs(corr) > SORTED_CORRELATION
                     and (se is None or abs(corr) > 3 * se))
    return RankEvidence(corr, se, n, sorted_policy)


def _average_ranks(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """0-based ranks of ``x [G, L]`` within each row, ties given their average rank; padding
    (``~mask``) ranks last."""
    big = torch.finfo(torch.float64).max
    v = torch.where(mask, x.double(), torch.full_like(x, big, dtype=torch.float64))
    order = torch.argsort(v, dim=1, stable=True)
    sorted_v = torch.gather(v, 1, order)
    pos = torch.arange(v.shape[1], dtype=torch.float64, device=v.device).expand_as(v)
    # average rank of tied blocks: mean of the first and last index of each block
    new_block = torch.ones_like(sorted_v, dtype=torch.bool)
    new_block[:, 1:] = sorted_v[:, 1:] != sorted_v[:, :-1]
    block = torch.cumsum(new_block.long(), dim=1) - 1
    first = torch.zeros_like(sorted_v).scatter_reduce(1, block, pos, reduce="amin", include_self=False)
    last = torch.zeros_like(sorted_v).scatter_reduce(1, block, pos, reduce="amax", include_self=False)
    avg = (torch.gather(first, 1, block) + torch.gather(last, 1, block)) / 2
    out = torch.empty_like(avg)
    out.scatter_(1, order, avg)
    return out


def within_request_rank_correlation(position: torch.Tensor, relevance: torch.Tensor,
                                    mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Spearman correlation of ``-position`` and ``relevance`` within each request list.

    ``ρ_g = Σ (a - ā)(b - b̄) / sqrt(Σ (a - ā)² Σ (b - b̄)²)`` over the list's impressions, ``a``
    and ``b`` the average ranks of ``-position`` and ``relevance``.

    Args:
        position, relevance, mask: ``[G, L]`` request lists (padding masked out).

    Returns:
        ``(rho [G], valid [G])``: ``rho > 0`` when the top slots hold the higher relevance; valid
        for lists of three or more impressions whose positions and relevances are not all tied
        (``rho`` is 0 elsewhere).

    >>> pos = torch.tensor([[1, 2, 3, 4]]); m = torch.ones(1, 4, dtype=torch.bool)
    >>> within_request_rank_correlation(pos, torch.tensor([[4.0, 3.0, 2.0, 1.0]]), m)[0].tolist()
    [1.0]
    """
    a, b = _average_ranks(-position.double(), mask), _average_ranks(relevance.double(), mask)
    m = mask.double()
    n = m.sum(1)
    ma, mb = (a * m).sum(1) / n.clamp(min=1), (b * m).sum(1) / n.clamp(min=1)
    da, db = (a - ma[:, None]) * m, (b - mb[:, None]) * m
    cov, va, vb = (da * db).sum(1), (da * da).sum(1), (db * db).sum(1)
    valid = (n >= 3) & (va > 0) & (vb > 0)
    rho = torch.where(valid, cov / torch.sqrt(va * vb).clamp(min=1e-300), torch.zeros_like(cov))
    return rho, valid
