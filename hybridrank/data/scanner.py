"""The one click-log chunker: parquet / CSV files in chunks of whole requests.

The streaming training source (:mod:`hybridrank.data.streaming`) and ``hybridrank-export input=...``
both read files through :class:`ClickLogScanner`. A first pass reads only the request key
column, one file at a time, and cuts the log into chunks of about ``chunk_rows`` impressions at
request boundaries (:func:`hybridrank.lists.pack`; a longer request is a chunk of its own).
Requests are normally stored contiguously (the order logging systems write pages in; a request
may continue from the end of one file into the next): a chunk is then a few row slices, and
polars decodes only the parquet row groups it touches. A log whose requests are scattered
(rows of one request far apart, e.g. a shuffled file) is either refused with the request and rows
named (``scattered="error"``, training: every chunk would re-scan the files) or read chunk by
chunk as a semi-join on the chunk's request keys (``scattered="allow"``, exports: one pass over
the files per chunk, memory still bounded by the chunk plus one key per row).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from hybridrank.data.hashing import stable_hash
from hybridrank.data.readers import (
    SOURCE_FILE,
    SOURCE_ROW,
    ColumnMap,
    _raise_read_error,
    expand_files,
    normalize_types,
    request_key_expr,
    scan_clicklog,
)
from hybridrank.lists import pack

__all__ = ["Chunk", "ClickLogScanner"]

log = logging.getLogger(__name__)


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
        columns: the :class:`~hybridrank.data.readers.ColumnMap` (or its mapping).
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
