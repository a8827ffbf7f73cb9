"""Group-aware batching: whole requests per batch, pooled rank lists, budgets, DDP shards.

The sampler works on **units**: the requests whose impressions the ranking term pools into one
list (docs/CONVENTIONS.md §1.2). With scope ``request`` a unit is one request; with ``session`` / ``user``
it is every request of that session / user; with ``user_window`` it is a user's requests within one
time window. A unit is never split across batches, so pseudo-pairs between its requests exist, and
a request is never split, so metrics rank whole requests.

Per epoch, units are shuffled with a generator seeded by ``(seed, epoch)`` and packed greedily into
batches of at most ``budget`` impressions. Units longer than ``max_unit_size`` keep all their
positives and a random subset of negatives; the kept negatives carry weight ``1 / keep_rate`` so the
pointwise loss stays an unbiased estimate of the full-data loss (docs/CONVENTIONS.md §2), and the overall
keep rate is recorded (:func:`negative_counts`: the one count, used by the sampler and by the data
module's pass over a streamed log). Under DDP every rank gets a disjoint set of whole batches and
the same number of batches, so no rank waits for a batch that never comes.

A batch is built in two steps: a **plan** on the host (:func:`plan_batch`: rows, list lengths,
the capping draws and weights, from per-request offsets and labels only) and a **gather** where the
split's features live (:func:`gather_batch`: one asynchronous copy of the plan's index, feature
gathers and padded lists sized by host ints, no read back). The same host code plans every batch,
so a split held on a GPU gives exactly the batches of the CPU, built on the GPU.

The sampler works on one :class:`~hybridrank.lists.ListData` at a time and knows nothing of
sources: :class:`~hybridrank.data.stream.BatchStream` (the one batch builder of every source) runs
it on each chunk of a source.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from hybridrank.lists import Batch, ListData, lengths_to_offsets, pack, pad_index

__all__ = ["POOLING_SCOPES", "unit_ids", "GroupBatchSampler", "ListDataset", "collate", "EpochPlan",
           "capped_sizes", "UnitTable", "negative_counts", "BatchPlan", "plan_batch", "gather_batch"]

#: The pooling scopes of the ranking term (``data.scope``): which requests form one rank list.
POOLING_SCOPES = ("request", "session", "user", "user_window")


def unit_ids(data: ListData, scope: str = "request", window: float | None = None) -> np.ndarray:
    """``[R]`` dense id of the pooling unit of each request: the one definition of a unit.

    Args:
        data: the split (or a chunk of it, or :func:`~hybridrank.data.schema.request_lists` of a
            frame: only ``n_requests``, ``scope`` and ``time`` are read).
        scope: ``"request"``, ``"session"``, ``"user"`` or ``"user_window"`` (a user's requests whose
            request time, the first time of the request, falls in the same window of ``window``
            time units: a request is never cut by a window boundary).
        window: window length for ``"user_window"``, in the unit of the data's time column.
    """
    if scope not in POOLING_SCOPES:
        raise ValueError(f"unknown sampler scope {scope!r}; choose one of {POOLING_SCOPES}")
    if scope == "request":
        return np.arange(data.n_requests, dtype=np.int64)
    key = "user" if scope == "user_window" else scope
    if key not in data.scope:
        have = ["request", *sorted(data.scope)]
        raise ValueError(
            f"sampler scope {scope!r} needs a {key!r} column mapped in the data config, "
            f"but this split only knows the scopes {have}"
        )
    ids = data.scope[key].cpu().numpy().astype(np.int64)
    if ids.shape[0] != data.n_requests:
        raise ValueError(f"scope {key!r} has {ids.shape[0]} ids for {data.n_requests} requests")
    if (ids < 0).any():
        bad = int(np.flatnonzero(ids < 0)[0])
        raise ValueError(f"scope {key!r} id is missing for request #{bad} "
                         f"({int((ids < 0).sum())} requests without one)")
    if scope == "user_window":
        if window is None or window <= 0:
            raise ValueError("scope 'user_window' needs a positive data.window")
        if data.time is None:
            raise ValueError("scope 'user_window' needs a time column mapped in the data config")
        bucket = np.floor_divide(data.time.cpu().numpy(), window).astype(np.int64)
        if bucket.size:
            bucket = bucket - bucket.min()
            ids = ids * (int(bucket.max()) + 1) + bucket
    _, dense = np.unique(ids, return_inverse=True)
    return dense.astype(np.int64)


def capped_sizes(sizes, positives, max_unit_size: int | None) -> np.ndarray:
    """Impressions a unit keeps under the cap: all of a unit up to ``max_unit_size``, beyond it
    every positive and negatives up to the cap (``max(positives, cap)``).

    >>> capped_sizes([3, 10, 10], [1, 2, 9], 5).tolist()
    [3, 5, 9]
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    if max_unit_size is None:
        return sizes.copy()
    positives = np.asarray(positives, dtype=np.int64)
    return np.where(sizes > max_unit_size, np.maximum(positives, max_unit_size), sizes)


@dataclass(frozen=True)
class UnitTable:
    """The pooling units of a split: requests grouped by unit, and each unit's size, positives and
    size after the negative cap.

    Attributes:
        order: ``[R]`` request indices grouped by unit (stable within a unit).
        offsets: ``[U + 1]`` unit boundaries in ``order``.
        size, positives, kept: ``[U]`` impressions, positive impressions, and impressions kept
            under the cap (:func:`capped_sizes`).
    """

    order: np.ndarray
    offsets: np.ndarray
    size: np.ndarray
    positives: np.ndarray
    kept: np.ndarray

    @classmethod
    def of(cls, data: ListData, scope: str = "request", window: float | None = None,
           max_unit_size: int | None = None) -> UnitTable:
        units = unit_ids(data, scope, window)
        n_units = int(units.max()) + 1 if units.size else 0
        lengths = data.lengths.numpy()
        offsets = np.zeros(n_units + 1, dtype=np.int64)
        np.cumsum(np.bincount(units, minlength=n_units), out=offsets[1:])
        size = np.bincount(units, weights=lengths, minlength=n_units).astype(np.int64)
        pos = np.bincount(np.repeat(units, lengths), weights=(data.label.numpy() > 0),
                          minlength=n_units).astype(np.int64)
        return cls(np.argsort(units, kind="stable"), offsets, size, pos,
                   capped_sizes(size, pos, max_unit_size))

    @property
    def n_units(self) -> int:
        return int(self.size.shape[0])

    def check_budget(self, budget: int, scope: str) -> None:
        """ValueError naming the first unit that does not fit a batch of ``budget`` impressions."""
        too_big = self.kept > budget
        if too_big.any():
            u = int(np.flatnonzero(too_big)[0])
            raise ValueError(
                f"{int(too_big.sum())} {scope} unit(s) do not fit the batch budget of {budget} "
                f"impressions (the first holds {int(self.size[u])} impressions, "
                f"{int(self.positives[u])} positive); raise data.budget or set "
                f"data.max_unit_size to cap them by dropping negatives"
            )

    def negatives(self) -> tuple[int, int]:
        """``(negatives, negatives kept under the cap)``."""
        return int((self.size - self.positives).sum()), int((self.kept - self.positives).sum())


def negative_counts(data: ListData, scope: str = "request", window: float | None = None,
                    max_unit_size: int | None = None, budget: int | None = None) -> tuple[int, int]:
    """``(negatives, negatives kept)`` of a split (or chunk) under the cap: the one count behind the
    recorded keep rate (``kept / negatives``, summed over chunks by the data module).

    With ``budget`` it also checks that every capped unit fits a batch (the sampler's error).

    >>> from hybridrank.lists import lengths_to_offsets
    >>> d = ListData(num=torch.zeros(12, 0), cat=torch.zeros(12, 0, dtype=torch.long),
    ...              label=torch.tensor([1.] + [0.] * 9 + [0., 1.]),
    ...              offsets=lengths_to_offsets(torch.tensor([10, 2])))
    >>> negative_counts(d, max_unit_size=4)  # request 0 keeps its positive and 3 of 9 negatives
    (10, 4)
    """
    table = UnitTable.of(data, scope, window, max_unit_size)
    if budget is not None:
        table.check_budget(budget, scope)
    return table.negatives()


@dataclass(frozen=True)
class EpochPlan:
    """The batches of one epoch for one rank: request indices, grouped by unit inside a batch."""

    batches: list[np.ndarray]
    n_impressions: int


class GroupBatchSampler:
    """Yields arrays of request indices; each batch holds whole units and at most ``budget`` rows.

    Args:
        data: the split to sample from.
        budget: largest number of impressions per batch (after capping long units).
        scope: pooling scope of the ranking term, see :func:`unit_ids`.
        window: window length for scope ``user_window``.
        max_unit_size: units with more impressions keep all positives and a random subset of
            negatives up to this size (training only). ``None`` never caps.
        shuffle: shuffle the order of units each epoch (deterministic in ``(seed, epoch)``).
        seed: base seed.
        num_replicas, rank: DDP world size and this process's rank.
    """

    def __init__(self, data: ListData, *, budget: int = 4096, scope: str = "request",
                 window: float | None = None, max_unit_size: int | None = None,
                 shuffle: bool = True, seed: int = 0, num_replicas: int = 1, rank: int = 0):
        if budget < 1:
            raise ValueError(f"sampler budget must be positive, got {budget}")
        if max_unit_size is not None and not 1 <= max_unit_size <= budget:
            raise ValueError(f"max_unit_size={max_unit_size} must lie in [1, budget={budget}]")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} outside world of {num_replicas}")
        self.budget, self.scope, self.max_unit_size = int(budget), scope, max_unit_size
        self.shuffle, self.seed = shuffle, int(seed)
        self.num_replicas, self.rank = int(num_replicas), int(rank)
        self.epoch = 0
        self.units = UnitTable.of(data, scope, window, max_unit_size)
        self.order, self.unit_offsets = self.units.order, self.units.offsets
        self.unit_size, self.unit_pos = self.units.size, self.units.positives
        self.effective_size = self.units.kept
        self.units.check_budget(self.budget, scope)
        if self.n_units < self.num_replicas:
            raise ValueError(f"{self.n_units} {scope} unit(s) cannot be shared by "
                             f"{self.num_replicas} ranks: every rank needs at least one batch")
        self._plan: EpochPlan | None = None
        self.plan()  # surface packing errors now, not in the middle of an epoch

    @property
    def neg_keep_rate(self) -> float:
        """Share of negatives an epoch keeps (1.0 when no unit is capped)."""
        total, kept = self.units.negatives()
        return kept / total if total else 1.0

    @property
    def n_units(self) -> int:
        return int(self.unit_size.shape[0])

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        self._plan = None

    def plan(self) -> EpochPlan:
        """The batches of this rank for the current epoch (computed once per epoch)."""
        if self._plan is None:
            self._plan = self._make_plan()
        return self._plan

    def _make_plan(self) -> EpochPlan:
        n = self.n_units
        if self.shuffle:
            perm = np.random.default_rng([self.seed, self.epoch]).permutation(n)
        else:
            perm = np.arange(n)
        sizes = self.effective_size[perm]
        bounds = self._divisible_bounds(pack(sizes, self.budget).tolist())
        mine = range(self.rank, len(bounds) - 1, self.num_replicas)
        batches = []
        total = 0
        for b in mine:
            units = perm[bounds[b]:bounds[b + 1]]
            batches.append(self._requests_of(units))
            total += int(sizes[bounds[b]:bounds[b + 1]].sum())
        return EpochPlan(batches, total)

    def _divisible_bounds(self, bounds: list[int]) -> list[int]:
        """Split batches of several units until the count divides by the number of replicas."""
        while (len(bounds) - 1) % self.num_replicas:
            widths = np.diff(bounds)
            b = int(np.argmax(widths))
            if widths[b] < 2:
                raise ValueError(
                    f"cannot give {self.num_replicas} ranks the same number of batches: only "
                    f"{len(bounds) - 1} single-unit batches; lower data.budget or use fewer devices"
                )
            bounds.insert(b + 1, bounds[b] + int(widths[b]) // 2)
        return bounds

    def _requests_of(self, units: np.ndarray) -> np.ndarray:
        starts, ends = self.unit_offsets[units], self.unit_offsets[units + 1]
        counts = ends - starts
        idx = np.repeat(starts - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
        return self.order[idx + np.arange(int(counts.sum()))]

    def __iter__(self) -> Iterator[np.ndarray]:
        yield from self.plan().batches

    def __len__(self) -> int:
        return len(self.plan().batches)


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
