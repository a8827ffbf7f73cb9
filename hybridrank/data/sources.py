"""The data sources: one interface (:class:`Source`), one path from files to ``ListData``.

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

``load()`` returns ``Splits(train, val, test, schema)`` of :class:`~hybridrank.lists.ListData`
(docs/ARCHITECTURE.md) for a one-chunk source. The readers, the column map and value validation
live in :mod:`hybridrank.data.readers`, the split rule (``SPLITS``, ``split_frame``) in
:mod:`hybridrank.data.splits`; both are re-exported here.
"""

from __future__ import annotations

import abc
import dataclasses
import inspect
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import polars as pl

from hybridrank.data.fingerprint import IN_MEMORY, files_fingerprint
from hybridrank.data.libsvm import read_libsvm
from hybridrank.data.readers import (
    MAX_REQUEST_SPAN,
    SOURCE_FILE,
    ColumnMap,
    expand_files,
    read_clicklog,
    request_key_expr,
    validate_frame,
)
from hybridrank.data.scanner import Chunk, ClickLogScanner
from hybridrank.data.schema import POLICY_DEFAULTS, Schema, SchemaFit, request_lists
from hybridrank.data.simulate import simulate_clicklog
from hybridrank.data.splits import SPLITS, split_frame, split_parts, split_spec
from hybridrank.data.vocab import VocabPolicy, vocab_policies
from hybridrank.lists import ListData

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



class Splits(NamedTuple):
    """What a source's ``load()`` returns."""

    train: ListData
    val: ListData
    test: ListData
    schema: Schema


# ----------------------------------------------------------------------------------------------
# The source interface
# ----------------------------------------------------------------------------------------------
def _given_schema(schema: Schema | Mapping | None, columns: ColumnMap, where: str) -> Schema | None:
    """A trained model's schema for a source that scores data with it (features must match).

    The source reads with its own column map (files may name roles differently), but the model's
    features, vocabularies, scaler, label range and value policies are the schema's.
    """
    schema = Schema.coerce(schema)
    if schema is None:
        return None
    if list(columns.numeric) != list(schema.numeric) or \
            list(columns.categorical) != list(schema.categorical):
        raise ValueError(f"{where}: the data's features differ from the model's: numeric "
                         f"{list(columns.numeric)} vs {list(schema.numeric)}, categorical "
                         f"{list(columns.categorical)} vs {list(schema.categorical)}")
    return dataclasses.replace(schema, columns=columns)


def _count_split(stats: dict, frame: pl.DataFrame | None, data: ListData | None,
                 columns: ColumnMap | None) -> None:
    """Add a split part's rows, requests, positives and label counts to ``stats``."""
    if data is not None:
        label = data.label.numpy()
        stats["rows"] += data.n_impressions
        stats["requests"] += data.n_requests
    elif frame is not None and frame.height:
        label = frame[columns.label].cast(pl.Float64).to_numpy()
        stats["rows"] += frame.height
        stats["requests"] += frame.select(request_key_expr(columns).n_unique()).item()
    else:
        return
    stats["positives"] += float((label > 0).sum())
    stats["label_sum"] += float(label.sum())
    values, counts = np.unique(label, return_counts=True)
    for v, c in zip(values.tolist(), counts.tolist()):
        stats["labels"][v] = stats["labels"].get(v, 0) + c


class Source(abc.ABC):
    """What every data source is: validated frames of whole requests, chunk by chunk, split into
    train / val / test by the source's one split rule, read with one schema (module docstring).

    A subclass defines three things: :meth:`layout` (its chunks), :meth:`_read_parts` (a chunk's
    validated train / val / test frames) and :meth:`fingerprint` (what its data is). Everything
    else (the schema fit, the transform, the caching of a one-chunk source, pieces of
    ``max_rows``) is shared. Its ``layout()``, ``read_chunk`` and ``schema`` are what the batch
    builder reads (:class:`~hybridrank.data.chunked.ChunkedSource`).

    Attributes (set by :meth:`_setup`): ``name`` (for messages), ``columns``, ``label_max``,
    ``policies`` (value policies), ``vocab`` (vocabulary policies), ``normalize``, ``fit_rows``
    (fit the schema on the first ``fit_rows`` training rows only), ``split`` (the split spec, or
    None: every row is training data); after :meth:`scan`, ``stats`` (rows, requests, positives
    and label counts per split) and ``train_stats`` (training rows and positives seen by the
    fit); ``oov`` (code-0 rows per categorical over every transform so far).
    """

    name: str
    columns: ColumnMap | None
    label_max: float
    split: dict | None

    def _setup(self, *, name: str, columns: ColumnMap | None, label_max: float,
               schema: Schema | Mapping | None = None, policies: Mapping | None = None,
               vocab: Mapping | None = None, normalize: bool = True,
               fit_rows: int | None = None) -> None:
        self.name = name
        self.columns = columns
        self.label_max = float(label_max)
        self.policies = {**POLICY_DEFAULTS, **dict(policies or {})}
        self.normalize = bool(normalize)
        if fit_rows is not None and int(fit_rows) < 1:
            raise ValueError(f"{name}: fit_rows must be a positive number of rows or null, got {fit_rows}")
        self.fit_rows = None if fit_rows is None else int(fit_rows)
        self.vocab = vocab_policies(vocab, columns.categorical, f"{name}: vocab") if columns else {}
        self._schema = _given_schema(schema, columns, name) if columns is not None else \
            Schema.coerce(schema)
        if self._schema is not None:
            if self._schema.policies != self.policies and policies is not None:
                log.info("%s: reading with the model's value policies %s", name,
                         self._schema.policies)
            self.policies, self.label_max = self._schema.policies, self._schema.label_max
            self.vocab = dict(self._schema.vocab_policy)
        self._layout: list[Chunk] | None = None
        self._parts: dict[int, dict[str, pl.DataFrame]] = {}   # one-chunk source: frames not yet transformed
        self._data: dict[tuple[int, str], ListData | None] = {}  # one-chunk source: transformed splits
        self.oov: dict[str, int] = {}
        self.stats: dict[str, dict] | None = None
        self.train_stats: dict[str, float] = {}

    # --- what a source defines ------------------------------------------------------------------
    @abc.abstractmethod
    def layout(self) -> list[Chunk]:
        """The chunks of whole requests (cached; a one-chunk source reads its data here)."""

    @abc.abstractmethod
    def _read_parts(self, chunk: Chunk | None) -> dict[str, pl.DataFrame]:
        """The validated ``{"train", "val", "test"}`` frames of a chunk (``None``: the only chunk of
        a one-chunk source, read before its layout exists)."""

    @abc.abstractmethod
    def fingerprint(self) -> dict[str, Any]:
        """Plain data saying what this source reads (files and hashes, or parameters) and how it
        splits it (:mod:`hybridrank.data.fingerprint`)."""

    # --- shared ---------------------------------------------------------------------------------
    def _one_chunk_layout(self) -> list[Chunk]:
        """The layout of a one-chunk source: its data read once and kept until transformed."""
        if self._layout is None:
            parts = self._read_parts(None)
            self._parts[0] = parts
            n = sum(f.height for f in parts.values())
            req = sum(f.select(request_key_expr(self.columns).n_unique()).item()
                      for f in parts.values() if f.height)
            self._layout = [Chunk(0, n, req, 0)]
        return self._layout

    @property
    def one_chunk(self) -> bool:
        return len(self.layout()) == 1

    def read_parts(self, chunk: Chunk) -> dict[str, pl.DataFrame]:
        """A chunk's validated train / val / test frames (a one-chunk source's are kept until
        each split is transformed)."""
        if chunk.index in self._parts:
            return self._parts[chunk.index]
        parts = self._read_parts(chunk)
        if self.one_chunk:
            self._parts[chunk.index] = parts
        return parts

    def read_chunk(self, chunk: Chunk, split: str) -> ListData | None:
        """One split of a chunk as ``ListData`` with the schema; None when it has no rows.

        A one-chunk source keeps the result (and drops the frame); code-0 counts are added to
        ``self.oov`` and logged.
        """
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        key = (chunk.index, split)
        if key in self._data:
            return self._data[key]
        schema = self.schema
        frame = self.read_parts(chunk)[split]
        data = None
        if frame.height:
            data, stats = schema.transform_with_stats(frame)
            for c, n in stats["oov"].items():
                self.oov[c] = self.oov.get(c, 0) + n
            if any(stats["oov"].values()):
                log.log(logging.INFO if self.one_chunk else logging.DEBUG,
                        "%s %s: out-of-vocabulary rows per categorical %s", self.name, split,
                        stats["oov"])
        if self.one_chunk:  # keep the ListData, drop the frame
            self._data[key] = data
            parts = self._parts.get(chunk.index)
            if parts is not None:
                parts.pop(split, None)
                if not parts:
                    del self._parts[chunk.index]
        return data

    def chunks(self, split: str = "train", max_rows: int | None = None) -> Iterator[ListData]:
        """The requests of a split as ``ListData``, chunk by chunk, each cut into pieces of whole
        requests of at most ``max_rows`` impressions (None: each chunk whole)."""
        if max_rows is not None and int(max_rows) < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        for chunk in self.layout():
            data = self.read_chunk(chunk, split)
            if data is None:
                continue
            if max_rows is None:
                yield data
            else:
                yield from data.chunks(int(max_rows))

    @property
    def n_impressions(self) -> int:
        """Impressions in all chunks (every split)."""
        return sum(c.n_rows for c in self.layout())

    # --- the pass over the training rows -------------------------------------------------------
    @property
    def schema(self) -> Schema:
        """The given schema, or the one :meth:`scan` fits (a pass over the training rows)."""
        if self._schema is None:
            self.scan()
        return self._schema

    def fit_schema(self) -> Schema:
        """Fit the schema now (one pass; errors in the data surface here)."""
        self._schema = None
        self.scan()
        return self._schema

    def scan(self, on_train: Callable[[ListData], None] | None = None) -> dict[str, dict]:
        """One pass over the chunks: validate and split each, fit the schema on the training rows
        (unless given) and hand each chunk's training requests to ``on_train`` (a
        :class:`ListData`; without features when the chunk is not transformed yet:
        :func:`~hybridrank.data.schema.request_lists`).

        With ``fit_rows`` the pass stops after the chunk that reaches that many training rows
        (``stats["complete"]`` is then False). Logs the rows, requests, mean label and label counts
        of each split after a complete pass.

        Returns:
            ``stats``: per split ``{"rows", "requests", "positives", "label_sum", "labels"}``, and
            ``"complete"``.
        """
        fit = None
        if self._schema is None:
            fit = SchemaFit(self.columns_for_fit(), self.label_max, normalize=self.normalize,
                            vocab=self.vocab, **self.policies)
        stats: dict[str, Any] = {s: {"rows": 0, "requests": 0, "positives": 0.0, "label_sum": 0.0,
                                     "labels": {}} for s in SPLITS}
        complete = True
        for chunk in self.layout():
            if self.fit_rows is not None and stats["train"]["rows"] >= self.fit_rows:
                complete = False
                break
            # a one-chunk source keeps the splits it has transformed: their ListData hold the rows
            have = {s: self._data[(chunk.index, s)] for s in SPLITS if (chunk.index, s) in self._data}
            parts = self.read_parts(chunk) if len(have) < len(SPLITS) else {}
            for s in SPLITS:
                _count_split(stats[s], parts.get(s), have.get(s), self.columns)
            requests = have.get("train")
            if "train" not in have and parts["train"].height:
                if fit is not None:
                    fit.update(parts["train"])
                if self.one_chunk:  # the only chunk: the fit is complete, and the transform the
                    if fit is not None:  # epochs use holds the requests (no second ordering)
                        self._schema, fit = self._finish_fit(fit), None
                    requests = self.read_chunk(chunk, "train")
                elif on_train is not None:
                    requests = request_lists(parts["train"], self.columns)
            if on_train is not None and requests is not None:
                on_train(requests)
        if stats["train"]["rows"] == 0:
            raise ValueError(f"{self.name}: no training rows (check the split fractions or the "
                             "files)")
        if fit is not None:
            self._schema = self._finish_fit(fit)
        stats["complete"] = complete
        if complete:
            for s in SPLITS:
                st = stats[s]
                if st["rows"]:
                    log.info("%s %s: %d impressions, %d requests, mean label %.4f, label counts %s",
                             self.name, s, st["rows"], st["requests"], st["label_sum"] / st["rows"],
                             dict(sorted(st["labels"].items())))
        self.stats = stats
        self.train_stats = {"rows": stats["train"]["rows"],
                            "positives": stats["train"]["positives"]}
        return stats

    def _finish_fit(self, fit: SchemaFit) -> Schema:
        schema = fit.finish()
        log.info("%s: schema fitted on %d training rows", self.name, fit.rows)
        return schema

    def columns_for_fit(self) -> ColumnMap:
        """The column map the schema is fitted with (after the layout: LETOR's width is read)."""
        self.layout()
        return self.columns

    def check_splits(self, needed: Sequence[str] = SPLITS) -> None:
        """ValueError when a needed split has no rows (after a complete :meth:`scan`)."""
        if self.stats is None:
            self.scan()
        if not self.stats.get("complete", True):
            return
        for s in needed:
            if self.stats[s]["rows"] == 0:
                why = ("the source has no split: every row is training data; give it split: "
                       "{by: hash, val: 0.1, test: 0.2, key: session}" if self.split is None
                       else "check its fractions or file")
                raise ValueError(f"{self.name}: the {s} split is empty ({why})")

    def load(self) -> Splits:
        """Every split whole, with the schema (a one-chunk source; a streamed one is iterated with
        :meth:`chunks`, or batched by :class:`~hybridrank.data.stream.BatchStream`, instead)."""
        if not self.one_chunk:
            raise ValueError(f"{self.name}: load() holds every split in memory, but this source "
                             f"reads {len(self.layout())} chunks; iterate source.chunks(split) or "
                             f"set chunk_rows: null to read it whole")
        self.check_splits()
        chunk = self.layout()[0]
        data = {s: self.read_chunk(chunk, s) for s in SPLITS}
        return Splits(data["train"], data["val"], data["test"], self.schema)


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
                 schema: Schema | Mapping | None = None):
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
                    schema=given)

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
                self._schema = _given_schema(self._given, columns, self.name)
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
        nan_policy: ``"error"`` (default) or ``"fill"`` missing / NaN / inf numeric features with
            ``fill_value`` (counts are logged).
        duplicates: repeated (request, item) rows: ``"error"`` (default), ``"drop"`` (keep the
            first) or ``"keep"`` (:func:`~hybridrank.data.readers.validate_frame`).
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
                 normalize: bool = True):
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
                    policies=policies, vocab=vocab, normalize=normalize, fit_rows=fit_rows)
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
