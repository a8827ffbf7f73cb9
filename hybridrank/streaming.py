"""Larger-than-memory click logs: stream parquet files in chunks of whole requests.

:class:`StreamingClickLogSource` reads a glob of parquet files lazily (``pl.scan_parquet`` with a
row slice per chunk, so polars decodes only the row groups a chunk touches) and never holds more
than one chunk of impressions. :class:`StreamingListDataset` is the ``IterableDataset`` that turns
each chunk into :class:`~hybridrank.lists.Batch` es with the same packing
(:class:`~hybridrank.sampler.GroupBatchSampler`) and collation (:func:`~hybridrank.sampler.collate`)
as the in-memory path.

Passes over the data, each with bounded memory:

1. **Layout** (:meth:`StreamingClickLogSource.layout`): reads only the request-key column, one file
   at a time. Every request must be **contiguous within one file** (the order the logging system
   writes pages in); a request whose rows are split inside a file, or that reappears in another
   file, is a ``ValueError`` naming the request and the files/rows. Chunk boundaries are then cut
   at request boundaries (about ``chunk_rows`` impressions each; a request longer than
   ``chunk_rows`` becomes a chunk of its own). Memory: one file's key column, plus one 64-bit hash
   per request for the cross-file check.
2. **Schema** (:meth:`StreamingClickLogSource.fit_schema`): a first pass over the chunks (or over the
   first ``fit_rows`` rows only: faster, and ids first seen later go to the OOV bucket 0) that
   validates values (:func:`~hybridrank.readers.validate_frame`: errors name the file and row) and
   accumulates the scaler (count / mean / M2 merged per chunk, population std as in
   :meth:`~hybridrank.data.Schema.fit`) and the categorical vocabularies. Memory: one chunk plus
   the vocabularies. A ``Schema`` can also be given (e.g. from a checkpoint) and no pass is made.
3. **Epochs**: every chunk is read again, validated, transformed with the schema into a small
   ``ListData``, packed into batches of at most ``budget`` impressions, and dropped.

Peak memory is bounded by the chunk size (and the parquet row-group size: a chunk decodes the row
groups it overlaps; write files with row groups no larger than a chunk), not by the data size.

Shuffling is two-level: the order of chunks is a permutation seeded by ``(seed, epoch)``, and the
pooling units inside a chunk are shuffled by the sampler. Pooling scopes (``session``, ``user``)
pool requests **within a chunk**: a session cut by a chunk boundary forms two rank lists.

Sharding: shard ``s`` of ``S = world_size x num_workers`` takes every ``S``-th chunk of the
epoch's order. With ``S > 1`` every shard stops after the same number of batches (the smallest
shard's lower bound ``sum ceil(chunk_impressions / budget)``), so no DDP rank waits for a batch
that never comes; the few batches past that bound are skipped for this epoch (a different set each
epoch, since the chunk order changes). The next step up for logs too large for one reader is
sharded files per rank: each rank scans only its own files, pre-partitioned by a stable hash of the
session or user (docs/ROBUSTNESS.md).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import torch
from torch.utils.data import IterableDataset, get_worker_info

from .data import Schema, stable_hash
from .lists import Batch, ListData
from .readers import (
    SOURCE_FILE,
    SOURCE_ROW,
    ColumnMap,
    expand_files,
    normalize_types,
    request_key_expr,
    validate_frame,
)
from .sampler import GroupBatchSampler, collate, unit_ids

__all__ = ["Chunk", "StreamingClickLogSource", "StreamingListDataset"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Chunk:
    """Rows ``start:start + n_rows`` of one file, holding ``n_requests`` whole requests.

    ``base`` is the number of impressions in all earlier chunks (layout order), so
    ``base + row`` is a global impression id in ``[0, N)``.
    """

    index: int
    file: str
    start: int
    n_rows: int
    n_requests: int
    base: int


def _parquet_files(path_or_glob: str | Path | list) -> list[str]:
    files = expand_files(path_or_glob)
    for f in files:
        if not f.lower().endswith((".parquet", ".pq")):
            raise ValueError(f"{f}: streaming reads parquet files only (.parquet / .pq); convert "
                             "CSV logs first (e.g. polars sink_parquet)")
    return files


def _runs(keys: pl.Series) -> np.ndarray:
    """Start row of every run of equal consecutive keys."""
    change = np.ones(len(keys), dtype=bool)
    if len(keys) > 1:
        change[1:] = (keys.slice(1) != keys.slice(0, len(keys) - 1)).fill_null(True).to_numpy()
    return np.flatnonzero(change)


def _cut(lengths: np.ndarray, chunk_rows: int) -> list[tuple[int, int]]:
    """Consecutive request ranges ``[a, b)`` of about ``chunk_rows`` impressions each."""
    ends = np.cumsum(lengths)
    out, a, done = [], 0, 0
    while a < len(lengths):
        b = int(np.searchsorted(ends, done + chunk_rows, side="right"))
        b = max(b, a + 1)
        out.append((a, b))
        done = int(ends[b - 1])
        a = b
    return out


class StreamingClickLogSource:
    """A parquet click log read in chunks of whole requests (module docstring).

    Args:
        path: a parquet file, a glob (``logs/day=*/part-*.parquet``) or a list of files.
        columns: the :class:`~hybridrank.readers.ColumnMap` (or its mapping, the ``columns:``
            config node).
        label_max: largest label (1 for clicks).
        chunk_rows: impressions per chunk (whole requests; the memory knob).
        nan_policy, fill_value: as :func:`~hybridrank.readers.validate_frame`.
        schema: a fitted schema to use as is (no schema pass).
        fit_rows: fit the schema on the first ``fit_rows`` rows (whole chunks) instead of all.
        normalize: standardise numeric features (as :meth:`Schema.fit`).
    """

    def __init__(self, path: str | Path | list, columns: ColumnMap | Mapping, *,
                 label_max: float = 1.0, chunk_rows: int = 100_000, nan_policy: str = "error",
                 fill_value: float = 0.0, schema: Schema | None = None, fit_rows: int | None = None,
                 normalize: bool = True):
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
        self.files = _parquet_files(path)
        self.columns = columns if isinstance(columns, ColumnMap) else ColumnMap.from_dict(columns)
        self.label_max = float(label_max)
        self.chunk_rows = int(chunk_rows)
        self.nan_policy, self.fill_value = nan_policy, float(fill_value)
        self.fit_rows, self.normalize = fit_rows, normalize
        self._schema = schema
        self._chunks: list[Chunk] | None = None
        self.oov: dict[str, int] = {}
        self._check_columns()

    # --- layout ---------------------------------------------------------------------------------
    def _check_columns(self) -> None:
        wanted = self.columns.source_columns()
        for f in self.files:
            have = pl.scan_parquet(f).collect_schema().names()
            missing = [c for c in wanted if c not in have]
            if missing:
                raise ValueError(f"{f}: mapped column(s) {missing} not found; the file has "
                                 f"columns {have}")

    def layout(self) -> list[Chunk]:
        """Check that requests are contiguous within one file and cut the chunks (cached).

        Raises:
            ValueError: a missing request id; a request whose rows are not adjacent in its file;
                a request present in two files. The message names the request, file(s) and rows.
        """
        if self._chunks is not None:
            return self._chunks
        cm = self.columns
        chunks: list[Chunk] = []
        hashes, owner = [], []
        base = 0
        for fi, f in enumerate(self.files):
            keys = pl.scan_parquet(f).select(request_key_expr(cm).alias("k")).collect()["k"]
            if keys.null_count():
                row = int(keys.is_null().arg_true()[0]) + 1
                raise ValueError(f"{f}: request id missing in {keys.null_count()} row(s), first "
                                 f"at row {row}")
            if len(keys) == 0:
                log.warning("%s: no rows", f)
                continue
            starts = _runs(keys)
            n_unique = keys.n_unique()
            if starts.size != n_unique:
                run_keys = keys.gather(starts)
                again = run_keys.is_duplicated() & ~run_keys.is_first_distinct()
                j = int(again.arg_true()[0])
                k = run_keys[j]
                first = int(starts[int((run_keys == k).arg_true()[0])]) + 1
                raise ValueError(
                    f"{f}: request {k!r} is not contiguous: its rows start at row {first} and again "
                    f"at row {int(starts[j]) + 1} after other requests; streaming needs every "
                    f"request's rows adjacent in one file (sort the file by request, or use "
                    f"ClickLogSource, which loads the whole log)")
            lengths = np.diff(np.append(starts, len(keys)))
            hashes.append(stable_hash(keys.gather(starts)))
            owner.append(np.full(starts.size, fi, dtype=np.int32))
            for a, b in _cut(lengths, self.chunk_rows):
                n = int(lengths[a:b].sum())
                chunks.append(Chunk(len(chunks), f, int(starts[a]), n, b - a, base))
                base += n
            del keys
        if not chunks:
            raise ValueError(f"{self.files[0] if len(self.files) == 1 else self.files}: empty: "
                             "no rows")
        h, o = np.concatenate(hashes), np.concatenate(owner)
        order = np.argsort(h, kind="stable")
        dup = np.flatnonzero(h[order][1:] == h[order][:-1])
        if dup.size:
            i, j = order[dup[0]], order[dup[0] + 1]
            fa, fb = self.files[o[i]], self.files[o[j]]
            ka = pl.scan_parquet(fa).select(request_key_expr(cm).alias("k")).unique().collect()
            kb = pl.scan_parquet(fb).select(request_key_expr(cm).alias("k")).unique().collect()
            both = ka.join(kb, on="k", how="semi")["k"]
            if both.len():  # (else a 64-bit hash collision: harmless, nothing to report)
                raise ValueError(f"request {both[0]!r} spans two files ({fa} and {fb}); streaming "
                                 f"needs every request inside one file ({both.len()} such "
                                 "request(s) between these two files)")
        self._chunks = chunks
        log.info("streaming layout: %d files, %d impressions, %d requests, %d chunks of ~%d rows",
                 len(self.files), base, int(h.size), len(chunks), self.chunk_rows)
        return chunks

    @property
    def n_impressions(self) -> int:
        c = self.layout()[-1]
        return c.base + c.n_rows

    # --- reading --------------------------------------------------------------------------------
    def read_frame(self, chunk: Chunk) -> pl.DataFrame:
        """The validated polars frame of one chunk (errors name the file and 1-based row)."""
        cm = self.columns
        frame = (pl.scan_parquet(chunk.file).slice(chunk.start, chunk.n_rows)
                 .select(cm.source_columns()).collect())
        if frame.height != chunk.n_rows:
            raise ValueError(f"{chunk.file}: expected {chunk.n_rows} rows from row "
                             f"{chunk.start + 1}, read {frame.height}; the file changed while "
                             "streaming")
        frame = frame.with_columns(
            pl.lit(chunk.file).alias(SOURCE_FILE),
            pl.int_range(chunk.start + 1, chunk.start + 1 + chunk.n_rows, dtype=pl.Int64)
            .alias(SOURCE_ROW))
        frame = normalize_types(frame, cm)
        return validate_frame(frame, cm, label_max=self.label_max, nan_policy=self.nan_policy,
                              fill_value=self.fill_value, name=chunk.file)

    def read_chunk(self, chunk: Chunk) -> ListData:
        """The chunk as ``ListData`` (schema applied; OOV counts added to ``self.oov``)."""
        data, stats = self.schema.transform_with_stats(self.read_frame(chunk))
        for c, n in stats["oov"].items():
            self.oov[c] = self.oov.get(c, 0) + n
        return data

    # --- schema ---------------------------------------------------------------------------------
    @property
    def schema(self) -> Schema:
        if self._schema is None:
            self._schema = self.fit_schema()
        return self._schema

    def fit_schema(self) -> Schema:
        """Validate values and fit the scaler and vocabularies in one streaming pass."""
        cm = self.columns
        num = list(cm.numeric)
        n = 0
        mean = np.zeros(len(num))
        m2 = np.zeros(len(num))
        vocab: dict[str, set[str]] = {c: set() for c in cm.categorical}
        for chunk in self.layout():
            if self.fit_rows is not None and n >= self.fit_rows:
                break
            frame = self.read_frame(chunk)
            if num:
                x = frame.select([pl.col(c).cast(pl.Float64) for c in num]).to_numpy()
                k = x.shape[0]
                mk = x.mean(axis=0)
                m2k = ((x - mk) ** 2).sum(axis=0)
                delta = mk - mean
                tot = n + k
                mean = mean + delta * (k / tot)
                m2 = m2 + m2k + delta ** 2 * (n * k / tot)
            n += frame.height
            for c in cm.categorical:
                vocab[c].update(frame[c].cast(pl.String).drop_nulls().unique().to_list())
        if num and self.normalize:
            std = np.sqrt(m2 / max(n, 1))
            means = tuple(float(v) for v in mean)
            stds = tuple(float(s) if np.isfinite(s) and s > 0 else 1.0 for s in std)
        else:
            means, stds = (0.0,) * len(num), (1.0,) * len(num)
        vocabs = {c: tuple(pl.Series(list(v), dtype=pl.String).sort().to_list())
                  for c, v in vocab.items()}
        log.info("streaming schema fitted on %d rows", n)
        return Schema(tuple(num), tuple(cm.categorical), vocabs, means, stds, self.label_max, cm)

    def dataset(self, **kwargs) -> StreamingListDataset:
        """A :class:`StreamingListDataset` over this source (keyword arguments passed on)."""
        return StreamingListDataset(self, **kwargs)


class StreamingListDataset(IterableDataset):
    """Yields :class:`~hybridrank.lists.Batch` es of whole requests, one chunk in memory at a time.

    Use with ``DataLoader(dataset, batch_size=None)``. ``Batch.rows`` are global impression ids
    (``chunk.base + row in the chunk's ListData``), unique over the whole log.

    Args:
        source: the :class:`StreamingClickLogSource`.
        budget, scope, window, max_unit_size: as :class:`~hybridrank.sampler.GroupBatchSampler`
            (scopes pool within a chunk).
        shuffle: permute the chunk order and the units inside each chunk per epoch.
        seed: base seed; the epoch's order is seeded by ``(seed, epoch)``.
        num_replicas, rank: DDP world size and rank (default: from ``torch.distributed`` when it
            is initialised, else 1 and 0).

    The epoch advances by one at every ``__iter__`` in this process (``set_epoch`` sets it);
    with ``num_workers > 0`` and non-persistent workers call ``set_epoch`` from a callback.
    """

    def __init__(self, source: StreamingClickLogSource, *, budget: int = 4096,
                 scope: str = "request", window: float | None = None,
                 max_unit_size: int | None = None, shuffle: bool = True, seed: int = 0,
                 num_replicas: int | None = None, rank: int | None = None):
        super().__init__()
        if budget < 1:
            raise ValueError(f"sampler budget must be positive, got {budget}")
        self.source = source
        self.budget, self.scope, self.window = int(budget), scope, window
        self.max_unit_size = max_unit_size
        self.shuffle, self.seed = shuffle, int(seed)
        self._replicas, self._rank = num_replicas, rank
        self.epoch = 0
        self._explicit_epoch = False
        source.layout()  # surface layout errors now, not in the first epoch
        _ = source.schema

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self._explicit_epoch = int(epoch), True

    def _world(self) -> tuple[int, int]:
        if self._replicas is not None:
            return int(self._replicas), int(self._rank or 0)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_world_size(), torch.distributed.get_rank()
        return 1, 0

    def chunk_order(self, epoch: int) -> np.ndarray:
        n = len(self.source.layout())
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, epoch]).permutation(n)

    def shard(self, epoch: int) -> tuple[list[Chunk], int | None]:
        """This process's chunks for ``epoch`` and its batch cap (None: no cap)."""
        chunks = self.source.layout()
        world, rank = self._world()
        info = get_worker_info()
        workers, wid = (info.num_workers, info.id) if info is not None else (1, 0)
        n_shards, shard = world * workers, rank * workers + wid
        order = self.chunk_order(epoch)
        if len(order) < n_shards:
            raise ValueError(f"{len(order)} chunk(s) cannot feed {n_shards} shards "
                             f"({world} rank(s) x {workers} worker(s)); lower chunk_rows")
        mine = [chunks[i] for i in order[shard::n_shards]]
        if n_shards == 1:
            return mine, None
        low = [sum(math.ceil(chunks[i].n_rows / self.budget) for i in order[s::n_shards])
               for s in range(n_shards)]
        return mine, min(low)

    def __iter__(self) -> Iterator[Batch]:
        epoch = self.epoch
        if not self._explicit_epoch:
            self.epoch += 1
        self._explicit_epoch = False
        chunks, cap = self.shard(epoch)
        done = 0
        for chunk in chunks:
            data = self.source.read_chunk(chunk)
            sampler = GroupBatchSampler(
                data, budget=self.budget, scope=self.scope, window=self.window,
                max_unit_size=self.max_unit_size, shuffle=self.shuffle,
                seed=self.seed * 1_000_003 + chunk.index)
            sampler.set_epoch(epoch)
            units = torch.from_numpy(unit_ids(data, self.scope, self.window))
            gen = None
            if self.max_unit_size is not None:
                gen = torch.Generator().manual_seed(
                    (self.seed * 1_000_003 + chunk.index) * 1_009 + epoch)
            for req in sampler:
                if cap is not None and done >= cap:
                    return
                r = torch.from_numpy(req)
                batch = collate(data, r, units[r], max_unit_size=self.max_unit_size,
                                generator=gen)
                batch.rows = batch.rows + chunk.base
                done += 1
                yield batch
            del data, sampler
