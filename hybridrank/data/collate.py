"""A batch's tensors, built in two steps: a **plan** on the host and a **gather** where the split lives.

:func:`plan_batch` works on the host from per-request offsets and labels only: the batch's rows,
list lengths, rank-list (pooling unit) lengths, and for units over ``max_unit_size`` the kept
negatives (random draws from a CPU generator) and their weights ``1 / keep rate``
(docs/CONVENTIONS.md §2). :func:`gather_batch` runs where the split's features live: one
asynchronous copy of the plan's index, feature gathers and padded lists sized by host ints, no
value read back. The same host code plans every batch, so a split held on a GPU gives exactly the
batches of the CPU, built on the GPU. :func:`collate` is the two in one call; :class:`ListDataset`
turns a sampler's request indices into batches (:mod:`hybridrank.data.sampler` chooses them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from hybridrank.data.sampler import capped_sizes, unit_ids
from hybridrank.lists import Batch, ListData, lengths_to_offsets, pad_index

__all__ = ["ListDataset", "BatchPlan", "plan_batch", "gather_batch", "collate"]


class ListDataset(torch.utils.data.Dataset):
    """Turns an array of request indices into a :class:`Batch` (vectorised, no per-row access).

    Used with ``DataLoader(dataset, sampler=GroupBatchSampler(...), batch_size=None)``: the sampler
    yields whole batches of requests and ``__getitem__`` builds the tensors of one batch at once,
    in two steps: :meth:`plan` (on the host, from ``data``'s offsets and labels) and
    :func:`gather_batch` (where ``features`` lives: the same split, or its copy on a device).

    Args:
        data: the split on the host: the plan reads its ``offsets`` and ``label``, the unit ids
            its ``scope`` and ``time``.
        features: the same split where batches are gathered from (default ``data``), e.g.
            ``data.to("cuda")``: batches are then built on that device, the host only plans them.
        scope, window, max_unit_size, seed, reweight_negatives: as :class:`GroupBatchSampler` and
            :func:`collate`.
    """

    def __init__(self, data: ListData, *, scope: str = "request", window: float | None = None,
                 max_unit_size: int | None = None, seed: int = 0, reweight_negatives: bool = True,
                 features: ListData | None = None):
        _check_host(data, "ListDataset")
        if features is not None and (features.n_impressions != data.n_impressions
                                     or features.n_requests != data.n_requests):
            raise ValueError(
                f"ListDataset: features hold {features.n_impressions} impressions in "
                f"{features.n_requests} requests, the split {data.n_impressions} in "
                f"{data.n_requests}: they must be the same split")
        self.data = data
        self.features = data if features is None else features
        self.units = torch.from_numpy(unit_ids(data, scope, window))
        self.max_unit_size = max_unit_size
        self.seed = seed
        self.reweight_negatives = reweight_negatives
        self.calls = 0

    def __len__(self) -> int:
        return self.data.n_requests

    def plan(self, requests: np.ndarray | torch.Tensor) -> BatchPlan:
        """The host part of a batch of ``requests`` (:func:`plan_batch`); negatives of capped
        units are drawn with a generator seeded by the seed and the batch's requests."""
        req = torch.as_tensor(requests, dtype=torch.long)
        gen = None
        if self.max_unit_size is not None:
            # a generator per batch, derived from the seed and the batch content: deterministic
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + int(req[:8].sum()) + len(req))
        return plan_batch(self.data.offsets, self.data.label, req, self.units[req],
                          max_unit_size=self.max_unit_size, generator=gen,
                          reweight_negatives=self.reweight_negatives)

    def __getitem__(self, requests: np.ndarray | torch.Tensor) -> Batch:
        return gather_batch(self.features, self.plan(requests))


@dataclass(frozen=True)
class BatchPlan:
    """What a batch is, computed on the host from per-request metadata and labels only: which rows
    it gathers and how they form lists. :func:`gather_batch` turns it into a :class:`Batch`
    wherever the split's features live, reading nothing back from there.

    Attributes:
        rows: ``[B]`` int64 rows of the split, request after request (capped negatives dropped).
        lengths: ``[g]`` int64 impressions kept per request list.
        unit_lengths: ``[u]`` int64 impressions per rank list (pooling unit).
        weight: ``[B]`` float32 weights of the rows (:func:`collate`), or None.
        max_len, max_unit_len: the widths ``L`` and ``L'`` of the padded lists (``max`` of the
            lengths, 0 for an empty batch): host ints, so padding needs no read from the device.
    """

    rows: torch.Tensor
    lengths: torch.Tensor
    unit_lengths: torch.Tensor
    weight: torch.Tensor | None
    max_len: int
    max_unit_len: int

    @property
    def n_rows(self) -> int:
        return int(self.rows.shape[0])

    @property
    def n_requests(self) -> int:
        return int(self.lengths.shape[0])

    def to(self, device: torch.device | str) -> BatchPlan:
        """The plan's tensors on ``device``: on CUDA one copy of the three index tensors (and one
        of the weights) from page-locked memory, asynchronous (``non_blocking``)."""
        device = torch.device(device)
        if self.rows.device == device:
            return self
        ints = torch.cat([self.rows, self.lengths, self.unit_lengths])
        weight = self.weight
        if device.type == "cuda":
            ints = ints.pin_memory()
            weight = None if weight is None else weight.pin_memory()
        ints = ints.to(device, non_blocking=True)
        rows, lengths, unit_lengths = ints.split([self.n_rows, self.n_requests,
                                                  int(self.unit_lengths.shape[0])])
        weight = None if weight is None else weight.to(device, non_blocking=True)
        return BatchPlan(rows, lengths, unit_lengths, weight, self.max_len, self.max_unit_len)


def plan_batch(offsets: torch.Tensor, label: torch.Tensor, requests: torch.Tensor,
               units: torch.Tensor | None = None, *, max_unit_size: int | None = None,
               generator: torch.Generator | None = None,
               reweight_negatives: bool = True) -> BatchPlan:
    """The host part of :func:`collate`: the rows of a batch of requests and its list lengths,
    negatives of units over the cap drawn with ``generator`` (:func:`_cap_units`).

    A pure function of host tensors: the same plan whatever device the batch is then gathered on.

    Args:
        offsets: ``[R + 1]`` request boundaries of the split (on the host).
        label: ``[N]`` labels of the split (on the host; the cap keeps every positive).
        requests: ``[g]`` request indices, requests of one unit adjacent.
        units, max_unit_size, generator, reweight_negatives: as :func:`collate`.

    Returns:
        The :class:`BatchPlan`.
    """
    for name, t in (("offsets", offsets), ("label", label)):
        if t.device.type != "cpu":
            raise ValueError(f"plan_batch reads host tensors, but {name} is on {t.device}: plan "
                             f"from the host copy (ListDataset(data, features=data.to(device)))")
    requests = torch.as_tensor(requests, dtype=torch.long)
    starts = offsets[requests]
    lengths = offsets[requests + 1] - starts
    req_off = lengths_to_offsets(lengths)
    n = int(req_off[-1])
    rows = torch.repeat_interleave(starts - req_off[:-1], lengths) + torch.arange(n)
    req_of_row = torch.repeat_interleave(torch.arange(len(requests)), lengths)
    if units is None:
        units = torch.arange(len(requests))
    # dense, run-ordered unit index per request (units are adjacent by construction)
    new_unit = torch.ones(len(requests), dtype=torch.bool)
    new_unit[1:] = units[1:] != units[:-1]
    unit_of_req = torch.cumsum(new_unit.long(), 0) - 1
    unit_of_row = unit_of_req[req_of_row]
    weight = None
    if max_unit_size is not None:
        keep, weight = _cap_units(unit_of_row, label[rows], max_unit_size, generator)
        if weight is not None:
            rows, req_of_row, unit_of_row = rows[keep], req_of_row[keep], unit_of_row[keep]
            weight = weight[keep] if reweight_negatives else None
            lengths = torch.bincount(req_of_row, minlength=len(requests))
    n_units = int(unit_of_req[-1]) + 1 if len(requests) else 0
    unit_len = torch.bincount(unit_of_row, minlength=n_units)
    return BatchPlan(rows, lengths, unit_len, weight,
                     int(lengths.max()) if lengths.numel() else 0,
                     int(unit_len.max()) if unit_len.numel() else 0)


def gather_batch(data: ListData, plan: BatchPlan) -> Batch:
    """The :class:`Batch` of a plan, built where ``data`` lives: the plan's index moves there (one
    asynchronous copy), features are gathered and the padded lists laid out with the plan's
    host-side sizes, so nothing is read back from the device (no synchronisation).

    Args:
        data: the split (on the host, or its copy on a device: :meth:`ListData.to`).
        plan: a :func:`plan_batch` of that split.

    Returns:
        The batch on ``data``'s device: flat rows in request order, request lists and rank lists.
    """
    p = plan.to(data.device)
    rows = p.rows
    index, mask = pad_index(p.lengths, plan.max_len)
    rank_index, rank_mask = pad_index(p.unit_lengths, plan.max_unit_len)
    request = torch.repeat_interleave(torch.arange(plan.n_requests, device=data.device), p.lengths,
                                      output_size=plan.n_rows)

    def take(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.index_select(0, rows)

    return Batch(
        num=take(data.num), cat=take(data.cat), label=take(data.label),
        index=index, mask=mask, rank_index=rank_index, rank_mask=rank_mask, rows=rows,
        request=request, weight=p.weight, position=take(data.position),
        explore=take(data.explore), propensity=take(data.propensity),
    )


def collate(data: ListData, requests: torch.Tensor, units: torch.Tensor | None = None, *,
            max_unit_size: int | None = None, generator: torch.Generator | None = None,
            reweight_negatives: bool = True) -> Batch:
    """Build the :class:`Batch` of the given requests: :func:`plan_batch` then
    :func:`gather_batch`.

    Args:
        data: the split, on the host (a split on a device: :class:`ListDataset` with
            ``features=``).
        requests: ``[g]`` request indices, requests of one unit adjacent.
        units: ``[g]`` unit id of each request (None: every request is its own unit).
        max_unit_size: cap on a unit's impressions (keeps all positives), or None.
        generator: random source for the negatives kept when capping.
        reweight_negatives: give the kept negatives of a capped unit weight ``1 / keep-rate`` so
            the pointwise loss stays unbiased (default); False keeps weight 1, and the model's odds
            are then inflated by ``1 / keep-rate`` until an export applies the correction
            (docs/EXPORT.md).

    Returns:
        The batch: flat rows in request order, request lists and rank (unit) lists.
    """
    return gather_batch(data, plan_batch(data.offsets, data.label, requests, units,
                                         max_unit_size=max_unit_size, generator=generator,
                                         reweight_negatives=reweight_negatives))


def _check_host(data: ListData, where: str) -> None:
    if data.offsets.device.type != "cpu" or data.label.device.type != "cpu":
        raise ValueError(f"{where}: the split it plans from must be on the host, got one on "
                         f"{data.label.device}; pass its device copy as features=")


def _cap_units(unit_of_row: torch.Tensor, label: torch.Tensor, cap: int,
               generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Keep all positives and random negatives so each unit has at most ``max(cap, n_pos)`` rows.

    Returns the keep mask and per-row weights (1 for positives, ``n_neg / kept_neg`` for kept
    negatives of a capped unit), or ``(all True, None)`` when nothing is dropped.
    """
    n_units = int(unit_of_row.max()) + 1 if unit_of_row.numel() else 0
    size = torch.bincount(unit_of_row, minlength=n_units)
    if not bool((size > cap).any()):
        return torch.ones_like(label, dtype=torch.bool), None
    neg = label <= 0
    n_neg = torch.bincount(unit_of_row, weights=neg.double(), minlength=n_units).long()
    n_pos = size - n_neg
    neg_budget = torch.from_numpy(capped_sizes(size.numpy(), n_pos.numpy(), cap)) - n_pos
    # rank negatives within their unit by a random priority; positives sort first
    prio = torch.rand(label.shape, generator=generator, dtype=torch.float64)
    prio = torch.where(neg, prio, torch.full_like(prio, -1.0))
    order = torch.argsort(unit_of_row.double() * 4 + prio + 1, stable=True)
    unit_start = lengths_to_offsets(size)[:-1]
    rank_in_unit = torch.empty_like(unit_of_row)
    rank_in_unit[order] = torch.arange(len(order)) - unit_start[unit_of_row[order]]
    # position among negatives = rank - n_pos of the unit
    neg_rank = rank_in_unit - n_pos[unit_of_row]
    keep = ~neg | (neg_rank < neg_budget[unit_of_row])
    kept_neg = torch.minimum(neg_budget, n_neg)
    rate = torch.where(n_neg > 0, kept_neg.double() / n_neg.clamp(min=1).double(),
                       torch.ones(n_units, dtype=torch.float64))
    w = torch.where(neg, 1.0 / rate[unit_of_row].clamp(min=1e-12), torch.ones_like(rate[unit_of_row]))
    return keep, w.float()
