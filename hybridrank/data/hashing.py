"""``stable_hash``: a deterministic 64-bit hash of values' string forms, the same on every machine.

Hash splits, hashed vocabularies (``hash_buckets``) and the scanner's key partitions all use it.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

__all__ = ["stable_hash"]


def _mix64(h: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser (uint64 arithmetic wraps, as intended)."""
    h = h.astype(np.uint64)
    with np.errstate(over="ignore"):
        h ^= h >> np.uint64(30)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(27)
        h *= np.uint64(0x94D049BB133111EB)
        h ^= h >> np.uint64(31)
    return h


def stable_hash(values: pl.Series, seed: int = 0) -> np.ndarray:
    """A deterministic 64-bit hash of each value's string form (same on every machine/version).

    Vectorised: the UTF-8 bytes of all strings are hashed at once (polynomial hash via a cumulative
    sum over the byte buffer, then a splitmix64 finaliser). ``1`` and ``"1"`` hash alike.
    """
    arr = values.cast(pl.String).fill_null("\x00<null>").to_arrow(
        compat_level=pl.CompatLevel.oldest())
    arr = pa.concat_arrays(arr.chunks) if isinstance(arr, pa.ChunkedArray) else arr
    arr = arr.cast(pa.large_string())
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset: arr.offset + len(arr) + 1]
    buf = arr.buffers()[2]
    data = np.frombuffer(buf, dtype=np.uint8) if buf is not None else np.zeros(0, np.uint8)
    start = offsets[0]
    data = data[start: offsets[-1]].astype(np.uint64)
    off = offsets - start
    pos = np.arange(data.size, dtype=np.int64) - np.repeat(off[:-1], np.diff(off))
    with np.errstate(over="ignore"):
        powers = np.cumprod(np.full(max(int(pos.max()) + 1 if pos.size else 1, 1),
                                    np.uint64(1099511628211), dtype=np.uint64), dtype=np.uint64)
        terms = (data + np.uint64(1)) * powers[pos]
        csum = np.concatenate([[np.uint64(0)], np.cumsum(terms, dtype=np.uint64)])
        h = csum[off[1:]] - csum[off[:-1]] + np.diff(off).astype(np.uint64)
        h += np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)
    return _mix64(h)
