"""Data fingerprints: what a model was trained on, so that re-reading its training data can be checked.

A source's ``fingerprint()`` is plain data stored in the checkpoint (``data["fingerprint"]``):

- file sources (click logs, LETOR files): the resolved file list, in the order read, each with its
  size in bytes, a content hash and, for parquet, its row count; plus the split spec;
- the simulator: its parameters with the defaults filled in, and the split spec.

**Content hashes.** Files up to :data:`FULL_HASH_BYTES` (256 MiB), and every text file (CSV,
LibSVM) whatever its size, are hashed whole with SHA-256: hashing runs at ~1.4 GB/s here (CPU SHA
instructions), faster than parsing, so it costs less than the read that follows. Larger parquet
files get a *cheap* hash instead: SHA-256 of the size, the parquet footer (the file metadata:
schema, row groups with their byte offsets, sizes and min / max statistics) and the first and
last MiB of the file. It
catches a rewritten, appended, truncated or replaced file (sizes, offsets or statistics move), not
an in-place edit of a few bytes that leaves every size and statistic unchanged; whole-file hashing
of multi-GB logs at every export would cost seconds per GB, the same order as re-reading them.
The method is part of the hash string (``sha256:`` or ``parquet-meta:``), so a fingerprint is
only compared with one made the same way.

:func:`check_fingerprint` compares a stored fingerprint with the current one and raises a
:class:`DataChangedError` naming each changed, added or missing file (or the changed parameter).
``hybridrank-export split=...`` / ``hybridrank-eval`` call it before they re-read and re-split the
training data of a checkpoint; scoring new files (``input=``) reads no training data.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["FULL_HASH_BYTES", "IN_MEMORY", "file_fingerprint", "files_fingerprint",
           "fingerprint_diff", "check_fingerprint", "DataChangedError"]

#: Files up to this size (and every text file) are hashed whole; larger parquet files get the
#: cheap footer + edges hash (module docstring).
FULL_HASH_BYTES = 256 << 20

_BLOCK = 1 << 20
_EDGE = 1 << 20


class DataChangedError(ValueError):
    """The data a checkpoint was trained on no longer matches what its source reads now."""


def _full_hash(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
    return "sha256:" + h.hexdigest()


def _parquet_meta_hash(path: Path, size: int) -> tuple[str, int]:
    """The cheap hash of a large parquet file (size, footer, first and last MiB) and its rows."""
    import pyarrow.parquet as pq

    h = hashlib.sha256()
    h.update(struct.pack("<q", size))
    with open(path, "rb") as f:
        f.seek(size - 8)
        tail = f.read(8)
        if tail[4:] != b"PAR1":
            raise ValueError(f"{path}: not a parquet file (no PAR1 footer)")
        footer_len = struct.unpack("<i", tail[:4])[0]
        f.seek(max(size - 8 - footer_len, 0))
        h.update(f.read(footer_len + 8))
        f.seek(0)
        h.update(f.read(_EDGE))
        f.seek(max(size - _EDGE, 0))
        h.update(f.read(_EDGE))
    rows = pq.ParquetFile(path).metadata.num_rows
    return "parquet-meta:" + h.hexdigest(), int(rows)


def file_fingerprint(path: str | Path, *, full_hash_bytes: int = FULL_HASH_BYTES) -> dict[str, Any]:
    """``{"path", "bytes", "hash"}`` (+ ``"rows"`` for parquet) of one file (module docstring).

    ``path`` is kept as given (the configured path or glob match), so a checkpoint compares the
    files its config names wherever it is run from.
    """
    p = Path(path)
    size = p.stat().st_size
    parquet = p.name.lower().endswith((".parquet", ".pq"))
    out: dict[str, Any] = {"path": str(path), "bytes": int(size)}
    if parquet and size > full_hash_bytes:
        out["hash"], out["rows"] = _parquet_meta_hash(p, size)
    else:
        out["hash"] = _full_hash(p)
        if parquet:
            import pyarrow.parquet as pq

            out["rows"] = int(pq.ParquetFile(p).metadata.num_rows)
    return out


def files_fingerprint(files: Sequence[str | Path], **kwargs) -> list[dict[str, Any]]:
    """:func:`file_fingerprint` of each file, in order; a file that does not exist is left out
    (compared with a stored fingerprint, it is then reported as a missing file)."""
    return [file_fingerprint(f, **kwargs) for f in files if Path(f).is_file()]


def _file_diff(what: str, old: Sequence[Mapping], new: Sequence[Mapping]) -> list[str]:
    prefix = f"{what}: " if what else ""
    a = {str(f["path"]): f for f in old}
    b = {str(f["path"]): f for f in new}
    out = []
    for path, f in a.items():
        if path not in b:
            out.append(f"{prefix}missing file {path} (trained on it; the source no longer reads it)")
            continue
        g = b[path]
        if f.get("hash") != g.get("hash") or f.get("bytes") != g.get("bytes"):
            detail = [f"{f.get('bytes')} -> {g.get('bytes')} bytes"]
            if f.get("rows") is not None and f.get("rows") != g.get("rows"):
                detail.append(f"{f.get('rows')} -> {g.get('rows')} rows")
            if str(f.get("hash", "")).split(":")[0] != str(g.get("hash", "")).split(":")[0]:
                detail.append("hashed another way")
            else:
                detail.append("content hash differs")
            out.append(f"{prefix}changed file {path} ({', '.join(detail)})")
    out += [f"{prefix}added file {path} (the source reads it now; it was not part of training)"
            for path in b if path not in a]
    if not out and list(a) != list(b):
        out.append(f"{prefix}the files are read in another order: {list(a)} -> {list(b)}")
    return out


def _value_diff(what: str, old: Any, new: Any) -> list[str]:
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        out = []
        for k in sorted(set(old) | set(new), key=str):
            out += _value_diff(f"{what}.{k}" if what else str(k), old.get(k, "<absent>"),
                               new.get(k, "<absent>"))
        return out
    return [] if old == new else [f"{what} changed: {old!r} -> {new!r}"]


def fingerprint_diff(stored: Mapping, current: Mapping) -> list[str]:
    """Human-readable differences between two fingerprints (empty when they match).

    File lists are compared by path: a path only in ``stored`` is *missing*, only in ``current``
    *added*, in both with another size or hash *changed*. Every other entry (the split spec, the
    simulator's parameters, the kind of source) is compared value by value.
    """
    out: list[str] = []
    for key in sorted(set(stored) | set(current), key=str):
        a, b = stored.get(key), current.get(key)
        if key == "files":
            if isinstance(a, Mapping) or isinstance(b, Mapping):  # files per role (LETOR)
                a, b = dict(a or {}), dict(b or {})
                for role in sorted(set(a) | set(b)):
                    out += _file_diff(f"{role} files", a.get(role) or [], b.get(role) or [])
            else:
                out += _file_diff("", a or [], b or [])
        else:
            out += _value_diff(str(key), a if key in stored else "<absent>",
                               b if key in current else "<absent>")
    return out


#: The fingerprint of splits handed to a data module in memory: nothing says where they came from.
IN_MEMORY = {"kind": "splits in memory"}


def check_fingerprint(stored: Mapping | None, current: Mapping, where: str = "the training data"
                      ) -> bool:
    """Raise :class:`DataChangedError` when ``current`` differs from the ``stored`` fingerprint.

    Args:
        stored: the checkpoint's ``data["fingerprint"]``.
        current: the source's ``fingerprint()`` now.
        where: what is being re-read, for the message.

    Returns:
        True when the data was checked and matches; False when there is nothing to check against
        (a checkpoint written before fingerprints, or one trained on splits given in memory): the
        caller says so.
    """
    if stored is None or dict(stored) == IN_MEMORY:
        return False
    diff = fingerprint_diff(stored, current)
    if diff:
        raise DataChangedError(
            f"{where} no longer matches what the checkpoint was trained on: " + "; ".join(diff)
            + ". Re-reading and re-splitting it would not give the training split (rows could move "
              "between train, val and test). Restore the files, score new files with input=... "
              "calibrator=none level_trend.mode=off (which read no training data), or pass "
              "data=<option> to read other data explicitly.")
    return True
