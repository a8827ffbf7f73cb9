"""The data sources behind one interface (:class:`~hybridrank.data.source.Source`, in
:mod:`hybridrank.data.source`), one path from files to ``ListData``.

A source reads its data as **chunks of whole requests** (``layout()``): one chunk for the
in-memory sources (:class:`SimulatedSource`, :class:`LetorSource`, :class:`ClickLogSource`), many
for a log larger than memory (:class:`ClickLogSource` with ``chunk_rows``, i.e.
:class:`~hybridrank.data.streaming.StreamingClickLogSource`). Everything after the read is
written once, here and in the modules it calls, whatever the number of chunks:

- the split: the one split rule (:mod:`hybridrank.data.splits`) of each chunk's validated frame (a
  hash split is the same per chunk as over the whole log; a time split needs the log in one chunk);
- the schema fit: :class:`~hybridrank.data.schema.SchemaFit` over the training rows of every chunk
  (or the first ``fit_rows``), in one pass (:meth:`Source.scan`) that also hands each chunk's
  training requests to the data module (negative counts: :func:`~hybridrank.data.sampler.
  negative_counts`);
- the transform: :meth:`~hybridrank.data.schema.Schema.transform` of a chunk's split
  (:meth:`Source.read_chunk`; a one-chunk source keeps the result), in pieces of at most
  ``max_rows`` impressions when asked (:meth:`Source.chunks`);
- what the data was: :meth:`Source.fingerprint` (:mod:`hybridrank.data.fingerprint`).

A source knows nothing of batching: :class:`~hybridrank.data.stream.BatchStream` reads its chunks
(``BatchStream(source, split=..., budget=...)``) through the three members of
:class:`~hybridrank.data.chunked.ChunkedSource`, which every :class:`Source` has.

The interface (``Source``, ``Splits``) lives in :mod:`hybridrank.data.source` and is re-exported
here. ``load()`` returns ``Splits(train, val, test, schema)`` of :class:`~hybridrank.lists.ListData`
(docs/ARCHITECTURE.md) for a one-chunk source. The readers, the column map and value validation
live in :mod:`hybridrank.data.readers`, the split rule (``SPLITS``, ``split_frame``) in
:mod:`hybridrank.data.splits`; both are re-exported here.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from hybridrank.data.fingerprint import IN_MEMORY, files_fingerprint
from hybridrank.data.libsvm import read_libsvm
from hybridrank.data.readers import (
    MAX_REQUEST_SPAN,
    SOURCE_FILE,
    ColumnMap,
    expand_files,
    read_clicklog,
)
from hybridrank.data.scanner import Chunk, ClickLogScanner
from hybridrank.data.schema import Schema
from hybridrank.data.simulate import simulate_clicklog
from hybridrank.data.source import Source, Splits, given_schema
from hybridrank.data.splits import SPLITS, split_frame, split_parts, split_spec
from hybridrank.data.validate import validate_frame
from hybridrank.data.vocab import VocabPolicy, vocab_policies

__all__ = [
    "ColumnMap", "Schema", "Splits", "Source", "SplitsSource", "SimulatedSource", "LetorSource",
    "ClickLogSource", "read_libsvm", "read_clicklog", "validate_frame", "split_frame",
    "SIM_COLUMNS_MAP", "VocabPolicy", "SPLITS",
]

log = logging.getLogger(__name__)

#: The column map of :func:`hybridrank.data.simulate.simulate_clicklog` frames. ``position`` is both
#: copied (``ListData.position``) and a numeric feature (``SimulatedSource(position_feature=False)``
#: drops it from the features, for position-bias towers); ``p_true`` is carried, never a feature.
SIM_COLUMNS_MAP = ColumnMap(
    request="request_id", label="click", session="session_id", user="user_id", time="time",
    position="position", item="item_id", bid="bid", true_p="p_true",
    numeric=["item_price", "item_pop", "hour", "user_activity", "position"],
    categorical=["user_id", "item_id", "item_category"],
)



class SplitsSource(Source):
    """Splits already in memory as a one-chunk source (``ListDataModule(splits=...)``): nothing to
    read or fit. Its fingerprint says so: data given in memory cannot be re-read for checks."""

    def __init__(self, splits: Splits):
        if not isinstance(splits, Splits):
            raise TypeError(f"splits must be hybridrank.data.sources.Splits, got {type(splits).__name__}")
        self._setup(name="splits in memory", columns=None, label_max=splits.schema.label_max,
                    schema=splits.schema)
        self.columns = splits.schema.columns
        self.split = {"given": "in memory"}
        n = sum(d.n_impressions for d in splits[:3])
        self._layout = [Chunk(0, n, sum(d.n_requests for d in splits[:3]), 0)]
        for s in SPLITS:
            d = getattr(splits, s)
            self._data[(0, s)] = d if d.n_impressions else None

    def layout(self) -> list[Chunk]:
        return self._layout

    def _read_parts(self, chunk):  # pragma: no cover - every split is given
        raise AssertionError("SplitsSource holds its splits: nothing to read")

    def fingerprint(self) -> dict[str, Any]:
        return dict(IN_MEMORY)


# ----------------------------------------------------------------------------------------------
# The sources
# ----------------------------------------------------------------------------------------------
class SimulatedSource(Source):
    """Data from :func:`hybridrank.data.simulate.simulate_clicklog` (no files), with ``true_p``.

    Args:
        split: ``{"by": "time"|"hash", "val": 0.1, "test": 0.2, "key": "session"}`` (default).
        label_max: 1 (clicks are binary; present so every source config states it).
        position_feature: whether the display position is a numeric feature (default). A model
            with a position-bias tower learns the position effect apart from relevance and must
            not see position as a feature (``HybridRanker`` refuses it).
        schema: a trained model's schema (or its dict) to read the data with instead of fitting
            one on train (exports and evaluations of a checkpoint).
        **simulator: keyword arguments of :func:`~hybridrank.data.simulate.simulate_clicklog`.

    The fingerprint is the simulator's arguments with its defaults filled in, and the split.
    """

    def __init__(self, *, split: Mapping | None = None, schema: Schema | Mapping | None = None,
                 label_max: float = 1.0, position_feature: bool = True, **simulator):
        if float(label_max) != 1.0:
            raise ValueError(f"SimulatedSource: simulated clicks are binary, label_max must be 1, "
                             f"got {label_max}")
        self.split = split_spec(split)
        columns = SIM_COLUMNS_MAP if position_feature else dataclasses.replace(
            SIM_COLUMNS_MAP, numeric=[c for c in SIM_COLUMNS_MAP.numeric if c != "position"])
        self.simulator = dict(simulator)
        try:  # fail at construction on a misspelled simulator argument, not at load time
            bound = inspect.signature(simulate_clicklog).bind(**self.simulator)
        except TypeError as e:
            raise TypeError(f"SimulatedSource: {e}") from None
        bound.apply_defaults()
        self._parameters = dict(bound.arguments)
        self._setup(name="simulated", columns=columns, label_max=1.0, schema=schema)

    def layout(self) -> list[Chunk]:
        return self._one_chunk_layout()

    def _read_parts(self, chunk) -> dict[str, pl.DataFrame]:
        frame = simulate_clicklog(**self.simulator)
        frame = validate_frame(frame, self.columns, label_max=self.label_max, name=self.name,
                               **self.policies)
        return split_parts(frame, self.columns, self.split)

    def fingerprint(self) -> dict[str, Any]:
        return {"kind": "simulated", "simulator": dict(self._parameters), "split": dict(self.split)}


def _feature_names(frame: pl.DataFrame) -> list[str]:
    return [c for c in frame.columns if c.startswith("f") and c[1:].isdigit()]


class LetorSource(Source):
    """LETOR / MSLR LibSVM files: request = qid, numeric features only, graded labels.

    Args:
        train, test: a file path, or a list of paths read one after the other (e.g. the parts
            ``[S1.txt, S2.txt, S3.txt]`` of an MQ2008 fold).
        val: the same, or None to hold out ``val_fraction`` of the train qids (stable hash of
            the qid with ``seed``) as validation.
        label_max: 2 for MQ2008, 4 for MSLR.
        n_features: dense width; default the largest index over all files (files with fewer
            features are padded with zero columns: absent LibSVM features are 0).
        normalize: standardise features with train mean / std (MSLR needs it; MQ2008 is already
            query-level normalised to [0, 1], standardising does no harm).
        numeric_bins: 0, or each feature encoded piecewise-linearly over this many training
            quantile bins (:func:`~hybridrank.data.schema.piecewise_linear`; a model's schema
            keeps the edges).
        schema: a trained model's schema (or its dict): its width, scaler and label range are
            used instead of fitting on train.

    The fingerprint lists the files of each split with their sizes and content hashes, and the
    validation rule (a file, or ``val_fraction`` and ``seed``).
    """

    def __init__(self, train: str | Path | Sequence[str | Path],
                 val: str | Path | Sequence[str | Path] | None,
                 test: str | Path | Sequence[str | Path], label_max: float,
                 n_features: int | None = None, normalize: bool = True,
                 val_fraction: float = 0.2, seed: int = 0,
                 schema: Schema | Mapping | None = None, numeric_bins: int = 0):
        given = Schema.coerce(schema)
        if given is not None:
            n_features, label_max = len(given.numeric), given.label_max

        def as_list(p):
            if p is None:
                return None
            return [p] if isinstance(p, str | Path) else list(p)

        self.paths = {"train": as_list(train), "val": as_list(val), "test": as_list(test)}
        self.n_features = n_features
        self.val_fraction = val_fraction
        self.seed = seed
        self.split = ({"val": "file"} if val is not None else
                      {"by": "hash", "val": float(val_fraction), "test": 0.0, "key": "request",
                       "seed": int(seed)})
        name = f"letor({Path(str(self.paths['train'][0])).parent.name})"
        self._given = given
        self._setup(name=name, columns=None, label_max=label_max, normalize=normalize,
                    schema=given, numeric_bins=numeric_bins)

    def layout(self) -> list[Chunk]:
        return self._one_chunk_layout()

    def _read_parts(self, chunk) -> dict[str, pl.DataFrame]:
        files = {k: [(str(p), read_libsvm(p, n_features=self.n_features)) for p in ps]
                 for k, ps in self.paths.items() if ps is not None}
        width = max(len(_feature_names(f)) for fs in files.values() for _, f in fs)
        names = [f"f{i}" for i in range(1, width + 1)]
        columns = ColumnMap(request="qid", label="label", numeric=names)
        if self.columns is None:
            self.columns = columns
            if self._given is not None:
                self._schema = given_schema(self._given, columns, self.name)
        frames = {}
        for k, fs in files.items():
            parts = []
            for path, f in fs:
                have = len(_feature_names(f))
                f = f.with_columns([pl.lit(0.0).alias(n) for n in names[have:]],
                                   pl.lit(path).cast(pl.Categorical).alias(SOURCE_FILE))
                f = f.select("label", "qid", *names, "comment", "line", SOURCE_FILE)
                parts.append(validate_frame(f, columns, label_max=self.label_max, name=path,
                                            **self.policies))
            frames[k] = pl.concat(parts)
        if self.paths["val"] is None:
            tr, va, _ = split_frame(frames["train"], columns, by="hash", val=self.val_fraction,
                                    test=0.0, key="request", seed=self.seed)
            frames["train"], frames["val"] = tr, va
        return {k: frames[k] for k in SPLITS}

    def fingerprint(self) -> dict[str, Any]:
        files = {k: files_fingerprint([str(p) for p in ps]) for k, ps in self.paths.items()
                 if ps is not None}
        return {"kind": "letor", "files": files, "split": dict(self.split)}


class ClickLogSource(Source):
    """A parquet / CSV click log described by a column map and a split rule.

    Read whole (``chunk_rows: null``, the default: requests may be stored anywhere in the files)
    or in chunks of about ``chunk_rows`` impressions of whole requests
    (:class:`~hybridrank.data.scanner.ClickLogScanner`: each request's rows adjacent, a request may
    continue into the next file; ``data=clicklog_stream``,
    :class:`~hybridrank.data.streaming.StreamingClickLogSource`). Both go through the same split,
    schema fit, transform and batches (module docstring).

    Args:
        path: a file, a glob (``data/clicks/*.parquet``) or a list of files.
        columns: the :class:`ColumnMap` as a mapping (the ``columns:`` config node).
        split: ``{"by": "time"|"hash", "val": .1, "test": .2, "key": "session"|"request"|"user",
            "seed": 0}`` (default by time, key session). A hash split is applied chunk by chunk
            (a key's rows land in one split whatever chunk they are in); a time split needs the
            whole log in one chunk (``chunk_rows: null``, or a log within ``chunk_rows``).
        label_max: largest label (1 for clicks).
        nan_policy: missing / NaN / inf numeric features: ``"error"`` (default), ``"fill"``
            them with ``fill_value``, or ``"indicator"``: the training mean plus a 0/1
            missing-value feature per column that has them in training (counts are logged).
        duplicates: repeated (request, item) rows: ``"error"`` (default), ``"drop"`` (keep the
            first) or ``"keep"`` (:func:`~hybridrank.data.validate.validate_frame`).
        max_request_span: seconds; a request id whose rows lie further apart in time is an error
            (a reused id); None keeps them as one request.
        vocab: how categoricals become codes: ``{min_count: 1, max_size: null, hash_buckets:
            {column: n}, columns: {column: {min_count, max_size}}}`` (:mod:`hybridrank.data.vocab`;
            None: every train value of every column).
        schema: a trained model's schema (or its dict): read with its scaler, vocabularies, label
            range and value and vocabulary policies (which then replace those above) instead of
            fitting.
        chunk_rows: impressions per chunk (the memory knob); null reads the log whole.
        fit_rows: fit the schema on the first ``fit_rows`` training rows (whole chunks) instead of
            all: faster; ids first seen later go to the OOV bucket 0.
        normalize: standardise numeric features with the training mean / std.
        numeric_bins: 0, or each numeric feature encoded piecewise-linearly over this many
            training quantile bins (:func:`~hybridrank.data.schema.piecewise_linear`; for dense
            features a neural scorer reads poorly as single values; the edges come from a
            uniform sample of training rows and travel in the model's schema).
        eval_cache_mb: a log read in several chunks keeps the validation and test parts it has
            read (transformed) up to this many MB, so that later validation passes and the test
            evaluation do not read every chunk again (each chunk holds a share of every split);
            0: keep nothing. A one-chunk log keeps every split anyway.

    The value policies are recorded in the fitted :class:`Schema`, so they travel with a trained
    model and apply again when it scores new files. The fingerprint is the resolved file list
    (path, size, content hash, parquet row count) and the split spec.
    """

    def __init__(self, path: str | Path | Sequence[str | Path], columns: Mapping,
                 split: Mapping | None = None, label_max: float = 1, nan_policy: str = "error",
                 fill_value: float = 0.0, duplicates: str = "error",
                 max_request_span: float | None = MAX_REQUEST_SPAN,
                 vocab: Mapping | None = None, schema: Schema | Mapping | None = None,
                 chunk_rows: int | None = None, fit_rows: int | None = None,
                 normalize: bool = True, eval_cache_mb: float = 256.0, numeric_bins: int = 0):
        self.path = path if isinstance(path, str | Path) else [str(p) for p in path]
        self.pattern = str(path) if isinstance(path, str | Path) else str(self.path)
        cm = columns if isinstance(columns, ColumnMap) else ColumnMap.from_dict(columns)
        self.split = split_spec(split)
        if chunk_rows is not None and int(chunk_rows) < 1:
            raise ValueError(f"chunk_rows must be >= 1 or null, got {chunk_rows}")
        self.chunk_rows = None if chunk_rows is None else int(chunk_rows)
        policies = {"nan_policy": nan_policy, "fill_value": float(fill_value),
                    "duplicates": duplicates, "max_request_span": max_request_span}
        self._setup(name=self.pattern, columns=cm, label_max=label_max, schema=schema,
                    policies=policies, vocab=vocab, normalize=normalize, fit_rows=fit_rows,
                    numeric_bins=numeric_bins)
        if not float(eval_cache_mb) >= 0:
            raise ValueError(f"eval_cache_mb must be >= 0, got {eval_cache_mb}")
        self.eval_cache_bytes = int(float(eval_cache_mb) * 2**20)
        if self._schema is not None and vocab is not None and \
                dict(self._schema.vocab_policy) != vocab_policies(vocab, cm.categorical):
            log.info("%s: reading with the model's vocabulary policies", self.pattern)
        self.scanner = None
        if self.chunk_rows is not None:
            self.scanner = ClickLogScanner(self.path, cm, chunk_rows=self.chunk_rows)
            self.scanner.pattern = self.pattern

    @property
    def files(self) -> list[str]:
        """The files the path names (a glob is expanded, sorted)."""
        return self.scanner.files if self.scanner is not None else expand_files(self.path)

    def layout(self) -> list[Chunk]:
        if self.scanner is None:
            return self._one_chunk_layout()
        if self._layout is None:
            chunks = self.scanner.layout()
            if len(chunks) > 1 and self.split is not None and self.split.get("by", "time") == "time":
                raise ValueError(
                    f"{self.pattern}: split by='time' needs every key's start time, i.e. the whole "
                    f"log in one chunk, but it reads {len(chunks)} chunks of chunk_rows="
                    f"{self.chunk_rows}; split by='hash' (a stable hash of the key, per chunk) or "
                    f"read the log whole (chunk_rows: null)")
            self._layout = chunks
        return self._layout

    def _read_parts(self, chunk: Chunk | None) -> dict[str, pl.DataFrame]:
        if chunk is None or self.scanner is None:
            frame = read_clicklog(self.path, self.columns)
        else:
            frame = self.scanner.read(chunk)
        frame = validate_frame(frame, self.columns, label_max=self.label_max, name=self.pattern,
                               **self.policies)
        return split_parts(frame, self.columns, self.split)

    def fingerprint(self) -> dict[str, Any]:
        return {"kind": "clicklog", "files": files_fingerprint(self.files),
                "split": None if self.split is None else dict(self.split)}
