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

The batches' tensors are built by :mod:`hybridrank.data.collate` (a host plan, a gather where the
split lives).

The sampler works on one :class:`~hybridrank.lists.ListData` at a time and knows nothing of
sources: :class:`~hybridrank.data.stream.BatchStream` (the one batch builder of every source) runs
it on each chunk of a source.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from hybridrank.lists import ListData, pack

__all__ = ["POOLING_SCOPES", "unit_ids", "GroupBatchSampler", "EpochPlan", "capped_sizes", "UnitTable",
           "negative_counts"]

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

    >>> import torch
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


class _Indivisible(ValueError):
    """The batches of a unit order cannot be shared equally by the ranks (every batch one unit)."""


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
        self._packable: np.ndarray | None = None   # a unit order known to pack (see _make_plan)
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
        try:
            bounds = self._divisible_bounds(pack(sizes, self.budget).tolist())
        except _Indivisible:
            # with several ranks, an epoch's shuffle can pack every batch as one unit in a count
            # the ranks cannot share, although another order packs fine: the order of an epoch
            # that packed (the construction's, at the latest) keeps the run going; every rank
            # takes the same one (the same seed, epoch and record)
            if self._packable is None:
                raise
            perm = self._packable
            sizes = self.effective_size[perm]
            bounds = self._divisible_bounds(pack(sizes, self.budget).tolist())
        if self._packable is None:
            self._packable = perm
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
                raise _Indivisible(
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
