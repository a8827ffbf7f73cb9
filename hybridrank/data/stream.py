"""The one batch builder: a source's chunks -> sampler -> collate, sharded over ranks and workers.

:class:`BatchStream` makes the batches of every source (docs/ARCHITECTURE.md), in memory (one
chunk) or streamed (many chunks of whole requests, one in memory at a time). It sits above both
things it joins: what it reads of a source is :class:`~hybridrank.data.chunked.ChunkedSource`
(``layout()``, ``read_chunk``, ``schema``), and each chunk is batched by the sampler
(:class:`~hybridrank.data.sampler.GroupBatchSampler`, :class:`~hybridrank.data.sampler.ListDataset`).
Neither the sources nor the sampler import it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from hybridrank.data.chunked import ChunkedSource
from hybridrank.data.sampler import GroupBatchSampler, ListDataset
from hybridrank.lists import Batch, ListData

__all__ = ["BatchStream", "chunk_seed"]


def chunk_seed(seed: int, chunk: int) -> int:
    """The sampler / capping seed of chunk ``chunk``: ``seed + 1,000,003 x chunk`` (chunk 0 of an
    in-memory source gets the seed itself)."""
    return int(seed) + 1_000_003 * int(chunk)


class BatchStream(IterableDataset):
    """Yields the :class:`~hybridrank.lists.Batch` es of one split of a source, chunk by chunk.

    The batches of every source come from here (docs/ARCHITECTURE.md): an in-memory source is one
    chunk, a streamed click log many chunks of whole requests, only one of which is in memory at
    a time. Per epoch:

    - the chunk order is a permutation seeded by ``(seed, epoch)`` (``shuffle``; layout order
      otherwise);
    - inside a chunk, :class:`GroupBatchSampler` shuffles and packs its pooling units with seed
      :func:`chunk_seed` and :class:`ListDataset` collates them (negatives of capped units dropped
      with a generator derived from that seed and the batch). Units pool requests **within a
      chunk**: a session cut by a chunk boundary forms two rank lists;
    - ``Batch.rows`` are row numbers in the chunk's split part plus ``chunk.base``.

    Sharding over ``W`` DDP ranks x ``K`` loader workers: a single chunk is shared by batches (the
    sampler's rank shards: disjoint, equal counts; worker ``k`` builds every ``K``-th batch of its
    rank, so the rank's order does not depend on ``K``); several chunks are dealt to the
    ``W x K`` shards in the epoch's order, and with ``W > 1`` (training, ``equal_batches``) every
    shard stops after the same number of batches (the smallest shard's lower bound
    ``sum ceil(chunk_rows / budget)``), so no rank waits for a batch that never comes; the few
    batches past it are skipped that epoch (a different set each epoch).

    ``start`` batches of the rank's epoch are skipped once (a run resumed from a mid-epoch
    checkpoint: :class:`~hybridrank.data.datamodule.ResumableLoader`); skipped batches are planned
    but not collated. ``set_epoch`` pins the epoch every iteration uses (the data module builds a
    stream per epoch); a stream never pinned advances by one at every ``__iter__`` in this
    process.

    Args:
        source: a :class:`~hybridrank.data.chunked.ChunkedSource` (every
            :class:`~hybridrank.data.sources.Source` is one): its ``layout()``, ``read_chunk``
            and ``schema``.
        split: ``"train"``, ``"val"`` or ``"test"``.
        budget, scope, window, max_unit_size, reweight_negatives, shuffle, seed: as
            :class:`GroupBatchSampler` / :func:`collate`.
        fit_longest: grow the budget to each chunk's longest request (evaluation, scope
            ``request``, no cap); otherwise a unit over the budget is an error.
        num_replicas, rank: DDP world size and rank (default: ``torch.distributed`` when
            initialised, else 1 and 0).
        equal_batches: cap every shard of a several-chunk source at the same batch count (training
            under DDP).
    """

    def __init__(self, source: ChunkedSource, *, split: str = "train", budget: int = 4096,
                 scope: str = "request", window: float | None = None,
                 max_unit_size: int | None = None, reweight_negatives: bool = True,
                 shuffle: bool = True, seed: int = 0, fit_longest: bool = False,
                 num_replicas: int | None = None, rank: int | None = None,
                 equal_batches: bool = True):
        super().__init__()
        if budget < 1:
            raise ValueError(f"sampler budget must be positive, got {budget}")
        if max_unit_size is not None and not 1 <= max_unit_size <= budget:
            raise ValueError(f"max_unit_size={max_unit_size} must lie in [1, budget={budget}]")
        self.source, self.split = source, split
        self.budget, self.scope, self.window = int(budget), scope, window
        self.max_unit_size, self.reweight_negatives = max_unit_size, reweight_negatives
        self.shuffle, self.seed, self.fit_longest = shuffle, int(seed), fit_longest
        self.equal_batches = equal_batches
        self._replicas, self._rank = num_replicas, rank
        self.epoch = 0
        self.start = 0
        self._pinned = False
        self._sampler_cache: tuple | None = None
        source.layout()  # surface layout errors now, not in the first epoch
        _ = source.schema

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self._pinned = int(epoch), True

    def world(self) -> tuple[int, int]:
        if self._replicas is not None:
            return int(self._replicas), int(self._rank or 0)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_world_size(), torch.distributed.get_rank()
        return 1, 0

    def chunk_order(self, epoch: int) -> np.ndarray:
        n = len(self.source.layout())
        if not self.shuffle or n == 1:
            return np.arange(n)
        return np.random.default_rng([self.seed, epoch]).permutation(n)

    def shard(self, epoch: int) -> tuple[list, int, int, int | None]:
        """This process's ``(chunks, sampler replicas, sampler rank, batch cap)`` for ``epoch``."""
        chunks = self.source.layout()
        world, rank = self.world()
        info = get_worker_info()
        workers, wid = (info.num_workers, info.id) if info is not None else (1, 0)
        if len(chunks) == 1:
            return list(chunks), world, rank, None
        n_shards, shard = world * workers, rank * workers + wid
        order = self.chunk_order(epoch)
        if len(order) < n_shards:
            raise ValueError(f"{len(order)} chunk(s) cannot feed {n_shards} shards "
                             f"({world} rank(s) x {workers} worker(s)); lower chunk_rows")
        mine = [chunks[i] for i in order[shard::n_shards]]
        if world == 1 or not self.equal_batches:
            return mine, 1, 0, None
        low = [sum(math.ceil(chunks[i].n_rows / self.budget) for i in order[s::n_shards])
               for s in range(n_shards)]
        return mine, 1, 0, min(low)

    def sampler(self, data: ListData, chunk, replicas: int, rank: int, epoch: int) -> GroupBatchSampler:
        """The sampler of one chunk's data for ``epoch`` (the last one is reused when asked again
        for the same data and epoch: ``len()`` then ``iter()`` of a one-chunk source)."""
        key = (id(data), chunk.index, replicas, rank, epoch)
        if self._sampler_cache is not None and self._sampler_cache[0] == key:
            return self._sampler_cache[1]
        budget = self.budget
        if self.fit_longest and data.n_requests:
            budget = max(budget, int(data.lengths.max()))
        s = GroupBatchSampler(data, budget=budget, scope=self.scope, window=self.window,
                              max_unit_size=self.max_unit_size, shuffle=self.shuffle,
                              seed=chunk_seed(self.seed, chunk.index), num_replicas=replicas,
                              rank=rank)
        s.set_epoch(epoch)
        self._sampler_cache = (key, s, data)  # the data kept alive: its id stays its own
        return s

    def __len__(self) -> int:
        """Batches of this rank's epoch when the source is one chunk; otherwise unknown (TypeError,
        which Lightning and DataLoader read as an iterable of unknown length)."""
        chunks = self.source.layout()
        if len(chunks) != 1:
            raise TypeError("the batch count of a several-chunk source is known only as it streams")
        data = self.source.read_chunk(chunks[0], self.split)
        if data is None:
            return 0
        world, rank = self.world()
        return len(self.sampler(data, chunks[0], world, rank, self.epoch))

    def __iter__(self) -> Iterator[Batch]:
        epoch = self.epoch
        if not self._pinned:
            self.epoch += 1
        start, self.start = self.start, 0
        chunks, replicas, rank, cap = self.shard(epoch)
        info = get_worker_info()
        workers, wid = (info.num_workers, info.id) if info is not None else (1, 0)
        one = len(self.source.layout()) == 1
        # one chunk: this worker builds the rank's batches i >= start with (i - start) % K == wid;
        # several: the worker's own batches past its share of the first `start` of the rank
        skip = start if one else max(0, -(-(start - wid) // workers))
        done = 0
        for chunk in chunks:
            data = self.source.read_chunk(chunk, self.split)
            if data is None:
                continue
            sampler = self.sampler(data, chunk, replicas, rank, epoch)
            ds = ListDataset(data, scope=self.scope, window=self.window,
                             max_unit_size=self.max_unit_size,
                             seed=chunk_seed(self.seed, chunk.index),
                             reweight_negatives=self.reweight_negatives)
            for req in sampler:
                if cap is not None and done >= cap:
                    return
                i, done = done, done + 1
                if i < skip or (one and (i - skip) % workers != wid):
                    continue
                batch = ds[req]
                if chunk.base:
                    batch.rows = batch.rows + chunk.base
                yield batch
            del data, sampler, ds
            if not one:
                self._sampler_cache = None
