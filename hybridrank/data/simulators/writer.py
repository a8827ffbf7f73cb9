"""Writing the built-in simulator's log block by block: memory holds one block, whatever its size.

:func:`write_clicklog` draws the log with :func:`~hybridrank.data.simulators.clicklog.clicklog_chunks`
and writes each block as it comes, to one of:

- ``<name>.parquet``: one parquet file, each block appended as row groups (pyarrow's
  ``ParquetWriter``);
- ``<name>.csv``: one CSV file, each block appended after the header;
- a folder (a path without a suffix): one parquet file per block, ``part-00000.parquet``, ... (a
  partitioned log: ``data.source.path='<folder>/*.parquet'``; a streamed source reads the request
  keys of one file at a time).

Every request's rows are adjacent (blocks hold whole users), as ``conf/data/clicklog_stream.yaml``
needs. The output appears whole or not at all: a file through :func:`hybridrank.atomic.atomic_path`,
a folder written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from hybridrank.atomic import atomic_path, check_writable
from hybridrank.data.simulators.clicklog import CHUNK_USERS, clicklog_chunks

__all__ = ["LogSummary", "write_clicklog", "output_kind", "ROW_GROUP_ROWS"]

#: Rows per parquet row group of a single-file log (polars' own default), so a streamed reader
#: decodes about this many rows to reach any slice.
ROW_GROUP_ROWS = 262_144


@dataclass
class LogSummary:
    """What was written: counts summed over the blocks."""

    rows: int = 0
    requests: int = 0
    sessions: int = 0
    users: int = 0
    clicks: int = 0
    sum_p_true: float = 0.0
    requests_without_click: int = 0
    files: int = 0

    @property
    def ctr(self) -> float:
        return self.clicks / self.rows if self.rows else float("nan")

    @property
    def mean_p_true(self) -> float:
        return self.sum_p_true / self.rows if self.rows else float("nan")

    @property
    def no_click_share(self) -> float:
        return self.requests_without_click / self.requests if self.requests else float("nan")

    def add(self, block: pl.DataFrame) -> None:
        req = block["request_id"].to_numpy()
        click = block["click"].to_numpy()
        starts = np.r_[0, np.flatnonzero(np.diff(req)) + 1] if req.size else np.zeros(0, np.int64)
        self.rows += block.height
        self.requests += starts.size
        self.sessions += block["session_id"].n_unique()
        self.users += block["user_id"].n_unique()
        self.clicks += int(click.sum(dtype=np.int64))
        self.sum_p_true += float(block["p_true"].sum())
        if starts.size:
            self.requests_without_click += int((np.maximum.reduceat(click, starts) == 0).sum())


def output_kind(out: str | os.PathLike) -> str:
    """``"parquet"``, ``"csv"`` or ``"folder"`` (a path without a suffix).

    Raises:
        ValueError: any other suffix.
    """
    suffix = Path(out).suffix.lower()
    if suffix in (".parquet", ".csv"):
        return suffix[1:]
    if suffix == "":
        return "folder"
    raise ValueError(f"--out must end in .parquet or .csv (one file), or be a folder (no suffix: "
                     f"one parquet file per block of users), got {out}")


def write_clicklog(out: str | os.PathLike, *, chunk_users: int = CHUNK_USERS,
                   **simulator) -> LogSummary:
    """Simulate a click log and write it block by block (module docstring for the formats).

    Args:
        out: ``.parquet`` or ``.csv`` file, or a folder (no suffix; must not hold files).
        chunk_users: users per block: the memory knob. A log of at most ``chunk_users`` users is
            :func:`~hybridrank.data.simulators.clicklog.simulate_clicklog`'s log, bit for bit.
        **simulator: the keyword arguments of ``simulate_clicklog``.

    Returns:
        The :class:`LogSummary`.

    Raises:
        ValueError: a bad suffix, an output that cannot be written, a folder that holds files,
            a bad simulator argument (before anything is drawn).
    """
    out = Path(out)
    kind = output_kind(out)
    blocks = clicklog_chunks(chunk_users=chunk_users, **simulator)
    summary = LogSummary()
    if kind == "folder":
        _write_folder(out, blocks, summary)
        return summary
    with atomic_path(out) as tmp:
        if kind == "parquet":
            _write_parquet(tmp, blocks, summary)
        else:
            with open(tmp, "wb") as f:
                for i, block in enumerate(blocks):
                    block.write_csv(f, include_header=i == 0)
                    summary.add(block)
                    del block  # not kept while the next block is drawn
        summary.files = 1
    return summary


def _write_parquet(path: Path, blocks: Iterator[pl.DataFrame], summary: LogSummary) -> None:
    import pyarrow.parquet as pq

    writer = None
    try:
        for block in blocks:
            table = block.to_arrow()
            if writer is None:
                writer = pq.ParquetWriter(path, table.schema, compression="zstd")
            writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
            summary.add(block)
            del block, table  # not kept while the next block is drawn
    finally:
        if writer is not None:
            writer.close()


def _write_folder(out: Path, blocks: Iterator[pl.DataFrame], summary: LogSummary) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"output folder {str(out)!r} exists and is not empty; remove it or give "
                         "another path")
    check_writable(out.parent / f".{out.name}.probe")  # creates the parent, checks permissions
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        for i, block in enumerate(blocks):
            block.write_parquet(tmp / f"part-{i:05d}.parquet")
            summary.add(block)
            summary.files += 1
            del block  # not kept while the next block is drawn
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp folders are private; a log is meant to be read
        with contextlib.suppress(FileNotFoundError):
            out.rmdir()  # the user's empty folder
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
