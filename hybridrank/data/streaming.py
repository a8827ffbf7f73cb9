"""Larger-than-memory click logs: training and evaluation one chunk of whole requests at a time.

:class:`StreamingClickLogSource` reads files through :class:`~hybridrank.data.scanner.ClickLogScanner`
(the chunker exports use too) and adds the data layer of the in-memory
:class:`~hybridrank.data.sources.ClickLogSource`: the same column map, the same value policies through
:func:`~hybridrank.data.readers.validate_frame` (errors name the file and 1-based row), and a split of
each chunk by a stable hash of the request / session / user key. Its schema (scaler,
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
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytorch_lightning as lightning
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from hybridrank.data.hashing import stable_hash
from hybridrank.data.readers import MAX_REQUEST_SPAN, ColumnMap, request_key_expr
from hybridrank.data.sampler import GroupBatchSampler, capped_sizes, collate, unit_ids
from hybridrank.data.scanner import Chunk, ClickLogScanner
from hybridrank.data.schema import POLICY_DEFAULTS, Schema
from hybridrank.data.sources import split_frame
from hybridrank.data.vocab import DistinctSketch, ValueCounter, select_vocab, table_report, vocab_policies
from hybridrank.lists import Batch, ListData

__all__ = ["StreamingClickLogSource", "StreamingListDataset", "StreamingDataModule"]

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")


_STREAM_SPLIT = {"by": "hash", "val": 0.1, "test": 0.2, "key": "request", "seed": 0}


class StreamingClickLogSource:
    """A parquet / CSV click log read in chunks of whole requests (module docstring).

    Args:
        path: a file, a glob (``logs/day=*/part-*.parquet``) or a list of files.
        columns: the :class:`~hybridrank.data.readers.ColumnMap` (or the ``columns:`` config node).
        split: ``{"by": "hash", "val": .1, "test": .2, "key": "request"|"session"|"user",
            "seed": 0}`` applied to every chunk (a stable hash of the key, so a key's rows land
            in one split whatever chunk they are in); ``None``: every row is training data.
            ``by: time`` is refused (it needs every key's start time before the first chunk).
        label_max, nan_policy, fill_value, duplicates, max_request_span: as
            :class:`~hybridrank.data.sources.ClickLogSource` (checked per chunk; chunks hold whole
            requests, so request-level checks see whole requests).
        chunk_rows: impressions per chunk (the memory knob).
        fit_rows: fit the schema on the first ``fit_rows`` training rows (whole chunks) instead
            of all: faster; ids first seen later go to the OOV bucket 0.
        normalize: standardise numeric features (as :meth:`Schema.fit`).
        vocab: vocabulary policies, as :class:`~hybridrank.data.sources.ClickLogSource`. The pass counts
            the values of vocabulary columns in polars columns merged as it goes (exact counts,
            so ``min_count`` / ``max_size`` give the in-memory fit's vocabulary; memory grows with
            the distinct values); hashed columns accumulate nothing but a 16 KiB HyperLogLog
            sketch that estimates their distinct count for the collision log line.
        schema: a fitted schema (e.g. a checkpoint's) used as is, policies included: no pass.
    """

    def __init__(self, path: str | Path | list, columns: ColumnMap | Mapping, *,
                 split: Mapping | None = None, label_max: float = 1.0,
                 nan_policy: str = "error", fill_value: float = 0.0, duplicates: str = "error",
                 max_request_span: float | None = MAX_REQUEST_SPAN, chunk_rows: int = 100_000,
                 fit_rows: int | None = None, normalize: bool = True,
                 vocab: Mapping | None = None, schema: Schema | Mapping | None = None):
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
        self.vocab = vocab_policies(vocab, self.columns.categorical, f"{self.scanner.pattern}: vocab")
        self._schema = Schema.coerce(schema)
        if self._schema is not None:
            self.policies, self.label_max = self._schema.policies, self._schema.label_max
            self.vocab = dict(self._schema.vocab_policy)
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
        from hybridrank.data.readers import validate_frame

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
        counters = {c: ValueCounter(counts=not p.keeps_all)
                    for c, p in self.vocab.items() if not p.hashed}
        sketches = {c: DistinctSketch() for c, p in self.vocab.items() if p.hashed}
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
            for c, counter in counters.items():
                counter.update(frame[c])
            for c, sketch in sketches.items():
                sketch.update(stable_hash(frame[c].drop_nulls()))
        if n == 0:
            raise ValueError(f"{self.scanner.pattern}: no training rows (check the split fractions)")
        if num and self.normalize:
            std = np.sqrt(m2 / n)
            means = tuple(float(v) for v in mean)
            stds = tuple(float(s) if np.isfinite(s) and s > 0 else 1.0 for s in std)
        else:
            means, stds = (0.0,) * len(num), (1.0,) * len(num)
        distinct = {c: (float(counter.frame().height), True) for c, counter in counters.items()
                    if not self.vocab[c].keeps_all}
        distinct |= {c: (sketch.estimate(), False) for c, sketch in sketches.items()}
        vocabs = {c: select_vocab(counter.frame(), self.vocab[c]) for c, counter in counters.items()}
        del counters
        self.train_stats = {"rows": n, "positives": positives}
        log.info("streaming schema fitted on %d training rows", n)
        schema = Schema(tuple(num), tuple(cm.categorical), vocabs, means, stds, self.label_max, cm,
                        **{k: self.policies[k] for k in POLICY_DEFAULTS}, vocab_policy=self.vocab)
        if schema.categorical:
            log.info("schema: %s", table_report(schema, distinct))
        return schema

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
            :class:`~hybridrank.data.sampler.GroupBatchSampler` / :func:`~hybridrank.data.sampler.collate`
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

    Same batching keys as :class:`~hybridrank.data.datamodule.ListDataModule`; the training rows are
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
