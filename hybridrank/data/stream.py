"""The one batch builder: a source's chunks -> sampler -> collate, sharded over ranks and workers.

:class:`BatchStream` makes the batches of every source (docs/ARCHITECTURE.md), in memory (one
chunk) or streamed (many chunks of whole requests, one in memory at a time). It sits above both
things it joins: what it reads of a source is :class:`~hybridrank.data.chunked.ChunkedSource`
(``layout()``, ``read_chunk``, ``schema``), and each chunk is batched by the sampler
(:class:`~hybridrank.data.sampler.GroupBatchSampler`, :class:`~hybridrank.data.collate.ListDataset`).
Neither the sources nor the sampler import it.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from hybridrank.data.chunked import ChunkedSource
from hybridrank.data.collate import ListDataset
from hybridrank.data.sampler import GroupBatchSampler
from hybridrank.lists import Batch, ListData

__all__ = ["BatchStream", "chunk_seed", "PREFETCH_THREAD"]

log = logging.getLogger(__name__)

#: The name of the thread that reads a streamed source's next chunk (tests look for it).
PREFETCH_THREAD = "hybridrank-chunk-prefetch"

# One chunk read at a time in this process: a prefetch still in flight when Lightning stops the
# training epoch early must not overlap the validation reads of the same source (a source keeps
# counters, e.g. its out-of-vocabulary counts, that a concurrent read could garble).
_READS = threading.Lock()


def _fresh_lock_after_fork() -> None:  # a loader worker forked while a read held the lock
    global _READS
    _READS = threading.Lock()


os.register_at_fork(after_in_child=_fresh_lock_after_fork)


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

    Where batches are built (``device``): by default on the host, where the source's chunks are
    read (Lightning then copies each batch to the training device). With ``device`` set, each chunk
    is copied to that device once (a one-chunk source once for every epoch, kept in ``resident``)
    and its batches are gathered there (:func:`~hybridrank.data.collate.gather_batch`); the host
    only plans them (:func:`~hybridrank.data.collate.plan_batch`), from the chunk's offsets and
    labels, so the batches are exactly those of the host path. A chunk on the device costs its
    features' size there (:attr:`ListData.nbytes`), two chunks while the next is prefetched.

    ``prefetch``: a several-chunk source reads chunk ``k + 1`` (and copies it to ``device``: from
    page-locked memory on a side CUDA stream, so the copy overlaps training) in a background
    thread while the batches of chunk ``k`` are served. The batches and their order do not
    change; an error of the reader is raised where the next chunk is taken, with its own type and
    message; an epoch stopped early waits for the read in flight, so no thread outlives it.

    ``start`` batches of the rank's epoch are skipped once (a run resumed from a mid-epoch
    checkpoint: :class:`~hybridrank.data.datamodule.ResumableLoader`); skipped batches are planned
    but not collated. ``set_epoch`` pins the epoch every iteration uses (the data module builds a
    stream per epoch); a stream never pinned advances by one at every ``__iter__`` in this
    process.

    Args:
        source: a :class:`~hybridrank.data.chunked.ChunkedSource` (every
            :class:`~hybridrank.data.source.Source` is one): its ``layout()``, ``read_chunk``
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
        device: where batches are built (None: on the host, where chunks are read). Loader
            workers (``num_workers > 0``) need it on the host or the CPU.
        prefetch: read the next chunk of a several-chunk source in a background thread.
        resident: a dict keeping the device copy of a one-chunk source's split across streams
            (the data module's, so a split is copied once per run, not once per epoch); default:
            this stream's own.
    """

    def __init__(self, source: ChunkedSource, *, split: str = "train", budget: int = 4096,
                 scope: str = "request", window: float | None = None,
                 max_unit_size: int | None = None, reweight_negatives: bool = True,
                 shuffle: bool = True, seed: int = 0, fit_longest: bool = False,
                 num_replicas: int | None = None, rank: int | None = None,
                 equal_batches: bool = True, device: torch.device | str | None = None,
                 prefetch: bool = True, resident: dict | None = None):
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
        self.device = None if device is None else torch.device(device)
        self.prefetch = bool(prefetch)
        self.resident = {} if resident is None else resident
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
        if self.device is not None and self.device.type != "cpu" and info is not None:
            raise ValueError(f"batches built on {self.device} cannot come from loader workers "
                             f"(num_workers={workers}): use num_workers=0, or build them on the "
                             f"host (data.device_batches=false)")
        one = len(self.source.layout()) == 1
        # one chunk: this worker builds the rank's batches i >= start with (i - start) % K == wid;
        # several: the worker's own batches past its share of the first `start` of the rank
        skip = start if one else max(0, -(-(start - wid) // workers))
        done = 0
        reader = _ChunkReader(self._loader(one), chunks, ahead=self.prefetch and not one)
        chunk_iter = iter(reader)
        try:
            for chunk, loaded in chunk_iter:
                if loaded is None:
                    continue
                data, features = _adopt(*loaded)
                sampler = self.sampler(data, chunk, replicas, rank, epoch)
                ds = ListDataset(data, scope=self.scope, window=self.window,
                                 max_unit_size=self.max_unit_size,
                                 seed=chunk_seed(self.seed, chunk.index),
                                 reweight_negatives=self.reweight_negatives, features=features)
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
                del data, features, loaded, sampler, ds
                if not one:
                    self._sampler_cache = None
        finally:
            chunk_iter.close()

    def _loader(self, one: bool) -> Callable[[Any], tuple | None]:
        """``chunk -> (host split, its features where batches are built, ready event) | None``:
        the read of one chunk, and its copy to ``device`` (kept in ``resident`` for a one-chunk
        source). Runs in the prefetch thread for the chunks after the first."""
        device, split, side = self.device, self.split, []

        def load(chunk) -> tuple | None:
            with _READS:
                data = self.source.read_chunk(chunk, split)
            if data is None:
                return None
            if device is None:
                return data, data, None
            if one:
                return (data, *self._resident_copy(chunk, data))
            features, ready = _to_device(_batch_fields(data), device, side)
            return _plan_fields(data), features, ready

        return load

    def _resident_copy(self, chunk, data: ListData) -> tuple[ListData, None]:
        """The device copy of a one-chunk source's split, made once and kept in ``resident``
        (on the CPU the split itself: nothing to copy)."""
        if self.device.type == "cpu":
            return _batch_fields(data), None
        key = (chunk.index, self.split, str(self.device))
        held = self.resident.get(key)
        if held is None or held[0] is not data:
            features = _batch_fields(data).to(self.device)
            log.info("%s split on %s: %.1f MB, copied once", self.split, self.device,
                     features.nbytes / 2**20)
            held = self.resident[key] = (data, features)
        return held[1], None


def _batch_fields(data: ListData) -> ListData:
    """What batches gather of a split (keys, bids and true probabilities left out)."""
    return replace(data, bid=None, true_p=None, request_key=None, item_key=None)


def _plan_fields(data: ListData) -> ListData:
    """What the host keeps of a chunk whose features moved to a device: offsets, labels, scopes
    and times (the sampler's and the plan's inputs); its features become ``[N, 0]``."""
    n = data.n_impressions
    return ListData(num=torch.empty(n, 0), cat=torch.empty(n, 0, dtype=torch.long),
                    label=data.label, offsets=data.offsets, scope=data.scope, time=data.time)


def _to_device(data: ListData, device: torch.device, side: list) -> tuple[ListData, Any]:
    """``data`` copied to ``device``; on CUDA from page-locked memory on a side stream (made once,
    kept in ``side``), with the event that marks the copy done."""
    if device.type != "cuda":
        return data.to(device), None
    with torch.cuda.device(device):
        if not side:
            side.append(torch.cuda.Stream(device))
        with torch.cuda.stream(side[0]):
            moved = data.pin_memory().to(device, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(side[0])
    return moved, ready


def _adopt(data: ListData, features: ListData, ready) -> tuple[ListData, ListData]:
    """Hand a chunk copied on the side stream to the current stream: wait for the copy, and tell
    the allocator its tensors are used here (so their memory is not reused before that work)."""
    if ready is not None:
        current = torch.cuda.current_stream(features.device)
        current.wait_event(ready)
        for t in features.tensors().values():
            t.record_stream(current)
    return data, features


class _Background:
    """One call run in a thread; :meth:`wait` returns its result or raises its error."""

    def __init__(self, fn: Callable, arg: Any):
        self._result: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn, arg), name=PREFETCH_THREAD,
                                        daemon=True)
        self._thread.start()

    def _run(self, fn: Callable, arg: Any) -> None:
        try:
            self._result = fn(arg)
        except BaseException as e:  # handed to the main thread by wait()
            self._error = e

    def wait(self) -> Any:
        self._thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        result, self._result = self._result, None
        return result


class _ChunkReader:
    """Yields ``(chunk, load(chunk))`` in order; with ``ahead``, ``load`` of the next chunk runs in
    a background thread while the current one is used. Closing the iterator early waits for the
    load in flight (its result and any error are dropped)."""

    def __init__(self, load: Callable, chunks: list, *, ahead: bool):
        self.load, self.chunks, self.ahead = load, list(chunks), ahead

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        pending: _Background | None = None
        try:
            for i, chunk in enumerate(self.chunks):
                if pending is None:
                    loaded = self.load(chunk)
                else:
                    task, pending = pending, None
                    loaded = task.wait()
                if self.ahead and i + 1 < len(self.chunks):
                    pending = _Background(self.load, self.chunks[i + 1])
                yield chunk, loaded
                del loaded
        finally:
            if pending is not None:
                try:
                    pending.wait()
                except BaseException as e:  # the epoch ended before this chunk was needed
                    log.debug("prefetched chunk dropped with its error: %r", e)
