"""Larger-than-memory click logs: chunks of whole requests, one chunk in memory at a time.

:class:`ClickLogScanner` is the one click-log chunker: the streaming training source and
``hybridrank-export input=...`` both read files through it. A first pass reads only the request
key column, one file at a time, and cuts the log into chunks of about ``chunk_rows`` impressions
at request boundaries (:func:`hybridrank.lists.pack`; a longer request is a chunk of its own).
Requests are normally stored contiguously (the order logging systems write pages in; a request
may continue from the end of one file into the next): a chunk is then a few row slices, and
polars decodes only the parquet row groups it touches. A log whose requests are scattered
(rows of one request far apart, e.g. a shuffled file) is either refused with the request and rows
named (``scattered="error"``, training: every chunk would re-scan the files) or read chunk by
chunk as a semi-join on the chunk's request keys (``scattered="allow"``, exports: one pass over
the files per chunk, memory still bounded by the chunk plus one key per row).

:class:`StreamingClickLogSource` adds the data layer of the in-memory
:class:`~hybridrank.data.ClickLogSource` (same column map, same value policies through
:func:`~hybridrank.readers.validate_frame`, errors naming the file and 1-based row) and a split
of each chunk by a stable hash of the request / session / user key. Its schema (scaler,
vocabularies) is fitted in one streaming pass over the training rows (or the first ``fit_rows``),
or given (a checkpoint's). :class:`StreamingListDataset` turns each chunk into
:class:`~hybridrank.lists.Batch` es with the in-memory packing and collation, and
:class:`StreamingDataModule` is the ``LightningDataModule`` that ``conf/data/clicklog_stream.yaml``
builds.

Shuffling is two-level: the order of chunks is a permutation seeded by ``(seed, epoch)``, and the
pooling units inside a chunk are shuffled by the sampler. Pooling scopes (``session``, ``user``)
pool requests **within a chunk**: a session cut by a chunk boundary forms two rank lists.

Sharding: training shard ``s`` of ``S = world_size x num_workers`` takes every ``S``-th chunk of
the epoch's order and, with ``S > 1``, stops after the same number of batches as every other shard
(the smallest shard's lower bound ``sum ceil(chunk_impressions / budget)``), so no DDP rank waits
for a batch that never comes; the few batches past it are skipped that epoch (a different set
each epoch). Evaluation shards are never capped: evaluation loops need no equal counts and
metrics are exact sums. A run resumed from a mid-epoch checkpoint restarts that epoch.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytorch_lightning as lightning
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from .data import POLICY_DEFAULTS, Schema, split_frame, stable_hash
from .lists import Batch, ListData, pack
from .readers import (
    MAX_REQUEST_SPAN,
    SOURCE_FILE,
    SOURCE_ROW,
    ColumnMap,
    _raise_read_error,
    expand_files,
    normalize_types,
    request_key_expr,
    scan_clicklog,
)
from .sampler import GroupBatchSampler, capped_sizes, collate, unit_ids

__all__ = ["Chunk", "ClickLogScanner", "StreamingClickLogSource", "StreamingListDataset",
           "StreamingDataModule"]

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class Chunk:
    """About ``chunk_rows`` impressions of whole requests.

    ``pieces`` are ``(file index, first row, rows)`` slices (contiguous logs); ``keys`` the
    request keys of a scattered chunk (semi-join). ``base`` is the number of impressions in all
    earlier chunks, so ``base + row`` is a global impression id in ``[0, N)``.
    """

    index: int
    n_rows: int
    n_requests: int
    base: int
    pieces: tuple[tuple[int, int, int], ...] = ()
    keys: Any = None


def _runs(keys: pl.Series) -> np.ndarray:
    """Start row of every run of equal consecutive keys."""
    change = np.ones(len(keys), dtype=bool)
    if len(keys) > 1:
        change[1:] = (keys.slice(1) != keys.slice(0, len(keys) - 1)).fill_null(True).to_numpy()
    return np.flatnonzero(change)


class ClickLogScanner:
    """Reads parquet / CSV click-log files in chunks of whole requests (module docstring).

    Args:
        path: a file, a glob or a list of files.
        columns: the :class:`~hybridrank.readers.ColumnMap` (or its mapping).
        chunk_rows: impressions per chunk (the memory knob).
        scattered: ``"error"`` (default) refuses a log whose requests are not contiguous;
            ``"allow"`` reads it by request-key semi-joins.
        require: the columns that must exist (default every mapped column); others are read
            when present.
    """

    def __init__(self, path: str | Path | list, columns: ColumnMap | Mapping, *,
                 chunk_rows: int = 100_000, scattered: str = "error",
                 require: list[str] | None = None):
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
        if scattered not in ("error", "allow"):
            raise ValueError(f"scattered must be 'error' or 'allow', got {scattered!r}")
        self.pattern = str(path) if not isinstance(path, list | tuple) else str(list(path))
        self.files = expand_files(path)
        self.columns = columns if isinstance(columns, ColumnMap) else ColumnMap.from_dict(columns)
        self.chunk_rows, self.scattered = int(chunk_rows), scattered
        self.require = require
        self.present = scan_clicklog(self.files, self.columns, pattern=self.pattern,
                                     require=require).collect_schema().names()
        self._chunks: list[Chunk] | None = None

    def _scan(self, files: list[str]) -> pl.LazyFrame:
        return scan_clicklog(files, self.columns, pattern=self.pattern, require=self.require)

    # --- layout ---------------------------------------------------------------------------------
    def layout(self) -> list[Chunk]:
        """Cut the chunks (cached). Raises ValueError on missing request ids, empty input, and
        (``scattered="error"``) a request whose rows are not adjacent, naming it and its rows."""
        if self._chunks is not None:
            return self._chunks
        key = request_key_expr(self.columns).alias("k")
        runs: list[np.ndarray] = []  # per file: [file, start, rows, continues previous] per run
        hashes = []
        scattered = None
        prev_last, prev_file = None, -2
        for fi, f in enumerate(self.files):
            try:
                keys = self._scan([f]).select(key).collect()["k"]
            except pl.exceptions.PolarsError as e:
                _raise_read_error([f], f, e)
            if keys.null_count():
                row = int(keys.is_null().arg_true()[0]) + 1
                raise ValueError(f"{f}: request id missing in {keys.null_count()} row(s), first "
                                 f"at row {row}")
            if len(keys) == 0:
                log.warning("%s: no rows", f)
                continue
            starts = _runs(keys)
            lengths = np.diff(np.append(starts, len(keys)))
            run_keys = keys.gather(starts)
            if scattered is None and starts.size != keys.n_unique():
                again = run_keys.is_duplicated() & ~run_keys.is_first_distinct()
                j = int(again.arg_true()[0])
                k = run_keys[j]
                first = int(starts[int((run_keys == k).arg_true()[0])]) + 1
                scattered = (f"{f}: request {k!r} is not contiguous: its rows start at row {first} "
                             f"and again at row {int(starts[j]) + 1} after other requests")
            # a request that continues from the last rows of the previous file is one request
            cont = prev_file == fi - 1 and run_keys[0] == prev_last
            part = np.zeros((starts.size, 4), dtype=np.int64)
            part[:, 0], part[:, 1], part[:, 2] = fi, starts, lengths
            part[0, 3] = int(cont)
            runs.append(part)
            h = stable_hash(run_keys)
            hashes.append(h[1:] if cont else h)
            prev_last, prev_file = run_keys[-1], fi
            del keys
        if not runs:
            raise ValueError(f"{self.pattern}: empty: no rows")
        h = np.concatenate(hashes)
        if scattered is None and h.size:
            order = np.argsort(h, kind="stable")
            if (h[order][1:] == h[order][:-1]).any():
                scattered = self._name_cross_file_repeat()  # None: a 64-bit hash collision
        if scattered is not None:
            if self.scattered == "error":
                raise ValueError(
                    f"{scattered}; streaming needs every request's rows adjacent (sort the files by "
                    f"request, or load the log whole with ClickLogSource)")
            log.warning("%s; reading by request-key joins: one pass over the files per chunk",
                        scattered)
            self._chunks = self._scattered_layout()
        else:
            self._chunks = self._contiguous_layout(np.concatenate(runs))
        n = sum(c.n_rows for c in self._chunks)
        log.info("click-log layout: %d file(s), %d impressions, %d chunks of ~%d rows",
                 len(self.files), n, len(self._chunks), self.chunk_rows)
        return self._chunks

    def _name_cross_file_repeat(self) -> str | None:
        """The message for a request present in two non-adjacent places of two files."""
        key = request_key_expr(self.columns).alias("k")
        seen: dict[Any, str] = {}
        for f in self.files:
            for k in self._scan([f]).select(key).unique().collect()["k"].to_list():
                if k in seen and seen[k] != f:
                    return (f"request {k!r} spans two files ({seen[k]} and {f}) without continuing "
                            f"from one into the next")
                seen[k] = f
        return None

    def _contiguous_layout(self, runs: np.ndarray) -> list[Chunk]:
        """Chunks from ``[n_runs, 4]`` runs (file, start, rows, continues the previous run)."""
        request = np.cumsum(runs[:, 3] == 0) - 1          # request index of every run
        lengths = np.bincount(request, weights=runs[:, 2]).astype(np.int64)
        first_run = np.flatnonzero(runs[:, 3] == 0)
        bounds = pack(lengths, self.chunk_rows)
        chunks, base = [], 0
        for a, b in zip(bounds[:-1], bounds[1:]):
            ra = int(first_run[a])
            rb = int(first_run[b]) if b < first_run.size else runs.shape[0]
            part = runs[ra:rb]
            pieces = []  # the runs of one file in a chunk are adjacent rows: one slice per file
            for fi in np.unique(part[:, 0]):
                rows_f = part[part[:, 0] == fi]
                pieces.append((int(fi), int(rows_f[0, 1]), int(rows_f[:, 2].sum())))
            rows = int(lengths[a:b].sum())
            chunks.append(Chunk(len(chunks), rows, int(b - a), base, tuple(pieces)))
            base += rows
        return chunks

    def _scattered_layout(self) -> list[Chunk]:
        key = request_key_expr(self.columns).alias("k")
        counts = (self._scan(self.files).select(key).collect()
                  .group_by("k", maintain_order=True).len())
        bounds = pack(counts["len"].to_numpy(), self.chunk_rows)
        chunks, base = [], 0
        for a, b in zip(bounds[:-1], bounds[1:]):
            part = counts.slice(int(a), int(b - a))
            rows = int(part["len"].sum())
            chunks.append(Chunk(len(chunks), rows, int(b - a), base, keys=part["k"]))
            base += rows
        return chunks

    @property
    def n_impressions(self) -> int:
        c = self.layout()[-1]
        return c.base + c.n_rows

    # --- reading --------------------------------------------------------------------------------
    def read(self, chunk: Chunk) -> pl.DataFrame:
        """The chunk's rows: mapped columns with normalised types, ``_source_file`` and the
        1-based ``_source_row`` of each row in its file (values are not validated here)."""
        try:
            if chunk.keys is None:
                parts = [self._scan([self.files[fi]]).slice(s, n).collect()
                         .with_columns(pl.lit(self.files[fi]).alias(SOURCE_FILE),
                                       pl.int_range(s + 1, s + 1 + n, dtype=pl.Int64).alias(SOURCE_ROW))
                         for fi, s, n in chunk.pieces]
                frame = pl.concat(parts, how="vertical_relaxed") if len(parts) > 1 else parts[0]
            else:
                keys = pl.DataFrame({"__k": chunk.keys}).lazy()
                frame = (self._scan(self.files)
                         .with_columns(pl.col(SOURCE_FILE).cast(pl.String),
                                       (pl.int_range(pl.len()).over(SOURCE_FILE) + 1)
                                       .cast(pl.Int64).alias(SOURCE_ROW),
                                       request_key_expr(self.columns).alias("__k"))
                         .join(keys, on="__k", how="semi").drop("__k").collect())
        except pl.exceptions.PolarsError as e:
            _raise_read_error(self.files, self.pattern, e)
        if frame.height != chunk.n_rows:
            raise ValueError(f"{self.pattern}: expected {chunk.n_rows} rows in chunk {chunk.index}, "
                             f"read {frame.height}; the files changed while streaming")
        return normalize_types(frame, self.columns)

    def frames(self) -> Iterator[pl.DataFrame]:
        """Every chunk's frame, in layout order."""
        for chunk in self.layout():
            yield self.read(chunk)


_STREAM_SPLIT = {"by": "hash", "val": 0.1, "test": 0.2, "key": "request", "seed": 0}


class StreamingClickLogSource:
    """A parquet / CSV click log read in chunks of whole requests (module docstring).

    Args:
        path: a file, a glob (``logs/day=*/part-*.parquet``) or a list of files.
        columns: the :class:`~hybridrank.readers.ColumnMap` (or the ``columns:`` config node).
        split: ``{"by": "hash", "val": .1, "test": .2, "key": "request"|"session"|"user",
            "seed": 0}`` applied to every chunk (a stable hash of the key, so a key's rows land
            in one split whatever chunk they are in); ``None``: every row is training data.
            ``by: time`` is refused (it needs every key's start time before the first chunk).
        label_max, nan_policy, fill_value, duplicates, max_request_span: as
            :class:`~hybridrank.data.ClickLogSource` (checked per chunk; chunks hold whole
            requests, so request-level checks see whole requests).
        chunk_rows: impressions per chunk (the memory knob).
        fit_rows: fit the schema on the first ``fit_rows`` training rows (whole chunks) instead
            of all: faster; ids first seen later go to the OOV bucket 0.
        normalize: standardise numeric features (as :meth:`Schema.fit`).
        schema: a fitted schema (e.g. a checkpoint's) used as is, policies included: no pass.
    """

    def __init__(self, path: str | Path | list, columns: ColumnMap | Mapping, *,
                 split: Mapping | None = None, label_max: float = 1.0,
                 nan_policy: str = "error", fill_value: float = 0.0, duplicates: str = "error",
                 max_request_span: float | None = MAX_REQUEST_SPAN, chunk_rows: int = 100_000,
                 fit_rows: int | None = None, normalize: bool = True,
                 schema: Schema | Mapping | None = None):
        self.columns = columns if isinstance(columns, ColumnMap) else ColumnMap.from_dict(columns)
        self.scanner = ClickLogScanner(path, self.columns, chunk_rows=chunk_rows)
        self.files = self.scanner.files
        self.split = None if split is None else {**_STREAM_SPLIT, **dict(split)}
        if self.split is not None:
            unknown = sorted(set(self.split) - set(_STREAM_SPLIT))
            if unknown:
                raise ValueError(f"unknown split options {unknown}; valid: {sorted(_STREAM_SPLIT)}")
            if self.split["by"] != "hash":
                raise ValueError("a streamed log is split by='hash' (a stable hash of the key per "
                                 "chunk); by='time' needs every key's start time before the first "
                                 f"chunk: got by={self.split['by']!r}")
        self.label_max = float(label_max)
        self.policies = {"nan_policy": nan_policy, "fill_value": float(fill_value),
                         "duplicates": duplicates, "max_request_span": max_request_span}
        self.fit_rows, self.normalize = fit_rows, normalize
        self._schema = Schema.coerce(schema)
        if self._schema is not None:
            self.policies, self.label_max = self._schema.policies, self._schema.label_max
        self.oov: dict[str, int] = {}
        self.train_stats: dict[str, float] = {}

    def layout(self) -> list[Chunk]:
        return self.scanner.layout()

    @property
    def n_impressions(self) -> int:
        return self.scanner.n_impressions

    # --- reading --------------------------------------------------------------------------------
    def read_frame(self, chunk: Chunk, split: str | None = None) -> pl.DataFrame:
        """The validated frame of a chunk (errors name the file and 1-based row), or of the rows
        of one split of it."""
        from .readers import validate_frame

        frame = validate_frame(self.scanner.read(chunk), self.columns, label_max=self.label_max,
                               name=self.scanner.pattern, **self.policies)
        if split is None or self.split is None:
            if split not in (None, "train"):
                return frame.head(0)
            return frame
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        parts = split_frame(frame, self.columns, **self.split)
        return parts[SPLITS.index(split)]

    def read_chunk(self, chunk: Chunk, split: str | None = None) -> ListData | None:
        """A chunk (or one split of it) as ``ListData`` with the schema; None when it has no rows.
        OOV counts are added to ``self.oov``."""
        frame = self.read_frame(chunk, split)
        if frame.height == 0:
            return None
        data, stats = self.schema.transform_with_stats(frame)
        for c, n in stats["oov"].items():
            self.oov[c] = self.oov.get(c, 0) + n
        return data

    def chunks(self, split: str | None = None) -> Iterator[ListData]:
        """Every chunk of a split as ``ListData``, in layout order (empty chunks skipped)."""
        for chunk in self.layout():
            data = self.read_chunk(chunk, split)
            if data is not None:
                yield data

    # --- schema ---------------------------------------------------------------------------------
    @property
    def schema(self) -> Schema:
        if self._schema is None:
            self._schema = self.fit_schema()
        return self._schema

    def fit_schema(self, on_frame: Callable[[pl.DataFrame], None] | None = None) -> Schema:
        """Validate values and fit the scaler and vocabularies on the training rows in one pass.

        ``on_frame`` sees each validated training frame (the data module counts negatives there).
        ``train_stats`` gets the rows and positives seen.
        """
        cm = self.columns
        num = list(cm.numeric)
        n, positives = 0, 0.0
        mean = np.zeros(len(num))
        m2 = np.zeros(len(num))
        vocab: dict[str, set[str]] = {c: set() for c in cm.categorical}
        for chunk in self.layout():
            if self.fit_rows is not None and n >= self.fit_rows:
                break
            frame = self.read_frame(chunk, "train")
            if frame.height == 0:
                continue
            if on_frame is not None:
                on_frame(frame)
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
            positives += float((frame[cm.label] > 0).sum())
            for c in cm.categorical:
                vocab[c].update(frame[c].cast(pl.String).drop_nulls().unique().to_list())
        if n == 0:
            raise ValueError(f"{self.scanner.pattern}: no training rows (check the split fractions)")
        if num and self.normalize:
            std = np.sqrt(m2 / n)
            means = tuple(float(v) for v in mean)
            stds = tuple(float(s) if np.isfinite(s) and s > 0 else 1.0 for s in std)
        else:
            means, stds = (0.0,) * len(num), (1.0,) * len(num)
        vocabs = {c: tuple(pl.Series(list(v), dtype=pl.String).sort().to_list())
                  for c, v in vocab.items()}
        self.train_stats = {"rows": n, "positives": positives}
        log.info("streaming schema fitted on %d training rows", n)
        return Schema(tuple(num), tuple(cm.categorical), vocabs, means, stds, self.label_max, cm,
                      **{k: self.policies[k] for k in POLICY_DEFAULTS})

    def dataset(self, **kwargs) -> StreamingListDataset:
        """A :class:`StreamingListDataset` over this source (keyword arguments passed on)."""
        return StreamingListDataset(self, **kwargs)


class StreamingListDataset(IterableDataset):
    """Yields :class:`~hybridrank.lists.Batch` es of whole requests, one chunk in memory at a time.

    Use with ``DataLoader(dataset, batch_size=None)``. ``Batch.rows`` are global impression ids
    (``chunk.base + row``) for training-only sources (no split); with a split, ids within each
    chunk's split part, offset by the chunk's base.

    Args:
        source: the :class:`StreamingClickLogSource`.
        split: which split's rows (``"train"``, ``"val"``, ``"test"``).
        budget, scope, window, max_unit_size, reweight_negatives: as
            :class:`~hybridrank.sampler.GroupBatchSampler` / :func:`~hybridrank.sampler.collate`
            (scopes pool within a chunk). For evaluation splits use ``scope="request"``,
            ``max_unit_size=None`` and ``shuffle=False``; the budget then grows to the longest
            request of a chunk.
        shuffle: permute the chunk order and the units inside each chunk per epoch.
        seed: base seed; the epoch's order is seeded by ``(seed, epoch)``.
        num_replicas, rank: DDP world size and rank (default: from ``torch.distributed`` when it
            is initialised, else 1 and 0).
        equal_batches: cap every shard at the same batch count (training under DDP).

    The epoch advances by one at every ``__iter__`` in this process (``set_epoch`` sets it);
    with ``num_workers > 0`` and non-persistent workers call ``set_epoch`` from a callback.
    """

    def __init__(self, source: StreamingClickLogSource, *, split: str = "train",
                 budget: int = 4096, scope: str = "request", window: float | None = None,
                 max_unit_size: int | None = None, reweight_negatives: bool = True,
                 shuffle: bool = True, seed: int = 0, num_replicas: int | None = None,
                 rank: int | None = None, equal_batches: bool = True):
        super().__init__()
        if budget < 1:
            raise ValueError(f"sampler budget must be positive, got {budget}")
        self.source, self.split = source, split
        self.budget, self.scope, self.window = int(budget), scope, window
        self.max_unit_size, self.reweight_negatives = max_unit_size, reweight_negatives
        self.shuffle, self.seed, self.equal_batches = shuffle, int(seed), equal_batches
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
        if n_shards == 1 or not self.equal_batches:
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
            data = self.source.read_chunk(chunk, self.split)
            if data is None:
                continue
            seed = self.seed * 1_000_003 + chunk.index
            budget = self.budget
            if self.max_unit_size is None and self.scope == "request":
                budget = max(budget, int(data.lengths.max()))
            sampler = GroupBatchSampler(
                data, budget=budget, scope=self.scope, window=self.window,
                max_unit_size=self.max_unit_size, shuffle=self.shuffle, seed=seed)
            sampler.set_epoch(epoch)
            units = torch.from_numpy(unit_ids(data, self.scope, self.window))
            gen = None
            if self.max_unit_size is not None:
                gen = torch.Generator().manual_seed(seed * 1_009 + epoch)
            for req in sampler:
                if cap is not None and done >= cap:
                    return
                r = torch.from_numpy(req)
                batch = collate(data, r, units[r], max_unit_size=self.max_unit_size,
                                generator=gen, reweight_negatives=self.reweight_negatives)
                batch.rows = batch.rows + chunk.base
                done += 1
                yield batch
            del data, sampler


def _identity(batch):
    return batch


class StreamingDataModule(lightning.LightningDataModule):
    """The ``LightningDataModule`` of a streamed click log (``conf/data/clicklog_stream.yaml``).

    Same batching keys as :class:`~hybridrank.datamodule.ListDataModule`; the training rows are
    streamed chunk by chunk every epoch, validation and test likewise (one chunk at a time,
    metrics accumulate exact sums). The first use runs one pass over the training rows to fit the
    schema and count the negatives the batching cap keeps (``neg_keep_rate``).
    """

    def __init__(self, source: StreamingClickLogSource, *, budget: int = 4096,
                 scope: str = "request", window: float | None = None,
                 max_unit_size: int | None = 512, reweight_negatives: bool = True,
                 eval_budget: int = 16384, shuffle: bool = True, seed: int = 0,
                 num_workers: int = 0):
        super().__init__()
        if source.split is None:
            raise ValueError("StreamingDataModule needs a source with a split (validation and "
                             "test rows), e.g. split: {by: hash, val: 0.1, test: 0.2, key: session}")
        self.source = source
        self.budget, self.scope, self.window = int(budget), scope, window
        self.max_unit_size = None if max_unit_size is None else min(int(max_unit_size), budget)
        self.reweight_negatives = bool(reweight_negatives)
        self.eval_budget, self.shuffle, self.seed = int(eval_budget), shuffle, int(seed)
        self.num_workers = num_workers
        self._neg = [0.0, 0.0]  # negatives seen, negatives kept (training rows)
        self._model_data: dict[str, Any] | None = None

    def _unit_expr(self) -> pl.Expr:
        cm = self.source.columns
        if self.scope == "request":
            return request_key_expr(cm)
        col = cm.user if self.scope in ("user", "user_window") else cm.session
        if col is None or self.scope not in ("session", "user", "user_window"):
            raise ValueError(f"sampler scope {self.scope!r} needs its column mapped "
                             f"(session / user) in the data config")
        if self.scope == "user_window":
            if not self.window or cm.time is None:
                raise ValueError("scope 'user_window' needs data.window and a time column")
            return pl.concat_str([pl.col(col).cast(pl.String),
                                  (pl.col(cm.time) // self.window).cast(pl.String)], separator="|")
        return pl.col(col)

    def _count_negatives(self, frame: pl.DataFrame) -> None:
        units = frame.group_by(self._unit_expr().alias("__u")).agg(
            pl.len().alias("n"), (pl.col(self.source.columns.label) > 0).sum().alias("pos"))
        n, pos = units["n"].to_numpy(), units["pos"].to_numpy()
        kept = capped_sizes(n, pos, self.max_unit_size)
        self._neg[0] += float((n - pos).sum())
        self._neg[1] += float((kept - pos).sum())

    @property
    def schema(self) -> Schema:
        self.model_data()
        return self.source.schema

    def model_data(self) -> dict[str, Any]:
        """Schema, base rate and negative keep rate of the training rows (one pass, cached)."""
        if self._model_data is None:
            given = self.source._schema is not None
            if given:  # a checkpoint's schema: count the training rows anyway
                for chunk in self.source.layout():
                    frame = self.source.read_frame(chunk, "train")
                    if frame.height:
                        self._count_negatives(frame)
                        self.source.train_stats["positives"] = self.source.train_stats.get(
                            "positives", 0.0) + float((frame[self.source.columns.label] > 0).sum())
                        self.source.train_stats["rows"] = self.source.train_stats.get(
                            "rows", 0) + frame.height
            else:
                self.source._schema = self.source.fit_schema(on_frame=self._count_negatives)
            stats = self.source.train_stats
            self._model_data = {
                "schema": self.source.schema.to_dict(),
                "base_rate": stats["positives"] / stats["rows"] if stats.get("rows") else None,
                "neg_keep_rate": self._neg[1] / self._neg[0] if self._neg[0] else 1.0,
                "reweight_negatives": self.reweight_negatives,
            }
            if self.source.fit_rows is not None:
                log.info("negative keep rate estimated on the first %d training rows",
                         self.source.fit_rows)
        return self._model_data

    def eval_chunks(self, split: str, max_rows: int | None = None) -> Iterator[ListData]:
        """The split's rows chunk by chunk as ``ListData`` (``max_rows`` is the chunk size)."""
        yield from self.source.chunks(split)

    def _epoch(self) -> int:
        return self.trainer.current_epoch if self.trainer is not None else 0

    def train_dataloader(self) -> DataLoader:
        ds = StreamingListDataset(
            self.source, split="train", budget=self.budget, scope=self.scope, window=self.window,
            max_unit_size=self.max_unit_size, reweight_negatives=self.reweight_negatives,
            shuffle=self.shuffle, seed=self.seed)
        ds.set_epoch(self._epoch())
        return DataLoader(ds, batch_size=None, collate_fn=_identity, num_workers=self.num_workers)

    def _eval_loader(self, split: str) -> DataLoader:
        ds = StreamingListDataset(self.source, split=split, budget=self.eval_budget,
                                  scope="request", max_unit_size=None, shuffle=False,
                                  seed=self.seed, equal_batches=False)
        return DataLoader(ds, batch_size=None, collate_fn=_identity, num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")
