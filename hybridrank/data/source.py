"""The source interface, written once: what every data source does with its chunks of whole
requests (:class:`Source`; the concrete sources are in :mod:`hybridrank.data.sources`).

A subclass says where its data is (:meth:`Source.layout`: chunks of whole requests; one chunk for
an in-memory source, many for a log larger than memory), how to read a chunk's validated train /
val / test frames (:meth:`Source._read_parts`) and what the data is (:meth:`Source.fingerprint`).
Everything after the read is here, whatever the number of chunks: the split rule
(:mod:`hybridrank.data.splits`) of each chunk's frame, the schema fit over the training rows of
every chunk in one pass (:meth:`Source.scan`), the transform of a chunk's split
(:meth:`Source.read_chunk`, :meth:`Source.chunks`), the checks that every split holds data, and
``load()`` of a one-chunk source.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import polars as pl

from hybridrank.data.readers import ColumnMap, request_key_expr
from hybridrank.data.scanner import Chunk
from hybridrank.data.schema import POLICY_DEFAULTS, Schema, SchemaFit, check_numeric_bins, request_lists
from hybridrank.data.splits import SPLITS
from hybridrank.data.vocab import vocab_policies
from hybridrank.lists import ListData

__all__ = ["Source", "Splits", "given_schema"]

log = logging.getLogger("hybridrank.data.sources")


class Splits(NamedTuple):
    """What a source's ``load()`` returns."""

    train: ListData
    val: ListData
    test: ListData
    schema: Schema


# ----------------------------------------------------------------------------------------------
# The source interface
# ----------------------------------------------------------------------------------------------
def given_schema(schema: Schema | Mapping | None, columns: ColumnMap, where: str) -> Schema | None:
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
    ``policies`` (value policies), ``vocab`` (vocabulary policies), ``normalize``,
    ``numeric_bins`` (the piecewise-linear encoding's bins per numeric feature, 0: none), ``fit_rows``
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
               fit_rows: int | None = None, numeric_bins: int = 0) -> None:
        self.name = name
        self.columns = columns
        self.label_max = float(label_max)
        self.policies = {**POLICY_DEFAULTS, **dict(policies or {})}
        self.normalize = bool(normalize)
        self.numeric_bins = check_numeric_bins(numeric_bins)
        if fit_rows is not None and int(fit_rows) < 1:
            raise ValueError(f"{name}: fit_rows must be a positive number of rows or null, got {fit_rows}")
        self.fit_rows = None if fit_rows is None else int(fit_rows)
        self.vocab = vocab_policies(vocab, columns.categorical, f"{name}: vocab") if columns else {}
        self._schema = given_schema(schema, columns, name) if columns is not None else \
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
        # several chunks: validation / test parts kept up to eval_cache_bytes (0 in this base class;
        # a source that reads chunks sets it), and the bytes they hold
        self.eval_cache_bytes = 0
        self._eval_cache: dict[tuple[int, str], ListData | None] = {}
        self._eval_cached = 0
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

        A one-chunk source keeps the result (and drops the frame); a several-chunk one keeps
        validation and test parts while they fit in ``eval_cache_bytes``. Code-0 counts are added
        to ``self.oov`` and logged.
        """
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        key = (chunk.index, split)
        if key in self._data:
            return self._data[key]
        if key in self._eval_cache:
            return self._eval_cache[key]
        if self._schema is None:
            _ = self.schema  # the fit first: a one-chunk source's fit transforms its training split
            if key in self._data:
                return self._data[key]
        parts = self.read_parts(chunk)
        data = self._transform(parts[split], split)
        if self.one_chunk:  # keep the ListData, drop the frame
            self._data[key] = data
            parts = self._parts.get(chunk.index)
            if parts is not None:
                parts.pop(split, None)
                if not parts:
                    del self._parts[chunk.index]
        elif split != "train" and self._keep(key, data):
            # the chunk's other evaluation part is in memory already: keep it too, so that the
            # test evaluation after the validation passes reads no chunk again
            other = (chunk.index, "test" if split == "val" else "val")
            if other not in self._eval_cache:
                self._keep(other, self._transform(parts[other[1]], other[1]))
        return data

    def _transform(self, frame: pl.DataFrame, split: str) -> ListData | None:
        """A split part as ``ListData`` (None without rows); its code-0 counts go to ``oov``."""
        if not frame.height:
            return None
        data, stats = self.schema.transform_with_stats(frame)
        for c, n in stats["oov"].items():
            self.oov[c] = self.oov.get(c, 0) + n
        if any(stats["oov"].values()):
            log.log(logging.INFO if self.one_chunk else logging.DEBUG,
                    "%s %s: out-of-vocabulary rows per categorical %s", self.name, split, stats["oov"])
        return data

    def _keep(self, key: tuple[int, str], data: ListData | None) -> bool:
        """Keep an evaluation part of a several-chunk source if it fits in ``eval_cache_bytes``."""
        size = 0 if data is None else data.nbytes
        if self._eval_cached + size > self.eval_cache_bytes:
            return False
        self._eval_cache[key] = data
        self._eval_cached += size
        return True

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

    def scan(self, on_train: Callable[[ListData], None] | None = None,
             on_train_frame: Callable[[pl.DataFrame], None] | None = None) -> dict[str, dict]:
        """One pass over the chunks: validate and split each, fit the schema on the training rows
        (unless given) and hand each chunk's training requests to ``on_train`` (a
        :class:`ListData`; without features when the chunk is not transformed yet:
        :func:`~hybridrank.data.schema.request_lists`) and, where the pass reads it, the chunk's
        validated training frame to ``on_train_frame``.

        With ``fit_rows`` the pass stops after the chunk that reaches that many training rows
        (``stats["complete"]`` is then False). Logs the rows, requests, mean label and label counts
        of each split after a complete pass.

        Returns:
            ``stats``: per split ``{"rows", "requests", "positives", "label_sum", "labels"}``, and
            ``"complete"``.
        """
        fit = None
        if self._schema is None:
            self._eval_cache.clear()  # read with another schema
            self._eval_cached = 0
            fit = SchemaFit(self.columns_for_fit(), self.label_max, normalize=self.normalize,
                            numeric_bins=self.numeric_bins, vocab=self.vocab, **self.policies)
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
            if on_train_frame is not None and "train" not in have and parts["train"].height:
                on_train_frame(parts["train"])
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
