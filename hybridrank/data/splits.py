"""The split rule: train / val / test of a click-log frame, never cutting a request.

One rule for every source, in memory or streamed (:mod:`hybridrank.data.sources` applies it to
each chunk's validated frame). Keys are whole sessions, requests or users; fractions count keys,
not rows.

- ``by="time"``: keys ordered by their start time (first appearance breaks ties); the last
  ``test`` fraction is test and the ``val`` fraction before it val (or, with ``val_by="hash"``,
  ``val`` of the earlier keys drawn by hash). It needs every key's start time, so a streamed log
  is split by time only when it is read in one chunk.
- ``by="hash"``: a stable hash of the key (:func:`~hybridrank.data.hashing.stable_hash`, the same
  on every machine and polars version) into 10,000 buckets. A key lands in the same split
  whatever chunk its rows are read in, so a hash split per chunk is the split of the whole log.

LETOR files come split by file; without a validation file, :class:`~hybridrank.data.sources.
LetorSource` holds out a hash share of the training qids with the same rule.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import polars as pl

from hybridrank.data.hashing import stable_hash
from hybridrank.data.readers import ColumnMap, request_key_expr
from hybridrank.data.schema import _REQ, _ROW

__all__ = ["SPLITS", "DEFAULT_SPLIT", "split_spec", "split_frame", "split_parts"]

#: The three splits, in order.
SPLITS = ("train", "val", "test")

#: The split of a source given no ``split:`` (click logs, the simulator).
DEFAULT_SPLIT = {"by": "time", "val": 0.1, "test": 0.2, "key": "session"}

_SPLIT_KEYS = ("by", "val", "test", "key", "seed", "val_by")


def split_spec(split: Mapping | None) -> dict:
    """A source's split spec as a dict (:data:`DEFAULT_SPLIT` when None); unknown keys are an
    error naming them (the values are checked by :func:`split_frame`).

    >>> split_spec({"by": "hash", "key": "request"})
    {'by': 'hash', 'key': 'request'}
    """
    d = dict(DEFAULT_SPLIT if split is None else split)
    unknown = sorted(set(d) - set(_SPLIT_KEYS))
    if unknown:
        raise ValueError(f"unknown split options {unknown}; valid: {', '.join(_SPLIT_KEYS)}")
    return d


def split_frame(frame: pl.DataFrame, columns: ColumnMap, *, by: str = "time", val: float = 0.1,
                test: float = 0.2, key: str = "session", seed: int = 0, val_by: str | None = None,
                ) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Split a click-log frame into train / val / test without cutting any request.

    Args:
        frame: a validated click-log frame (rows in storage order; each part keeps that order).
        columns: its column map (request, and the session / user / time columns the rule needs).
        by: ``"time"``: keys ordered by start time (first appearance breaks ties), the last
            ``test`` fraction of keys is test, the ``val`` fraction before it val. ``"hash"``:
            :func:`~hybridrank.data.hashing.stable_hash` of the key into 10,000 buckets, bucket
            ``b`` test when ``b / 10,000 < test``, val when ``< test + val``.
        val, test: fractions of keys (not rows); ``round(fraction x keys)`` keys under ``by="time"``.
        key: ``"request"``, ``"session"`` or ``"user"``; session / user must be mapped, and every
            request must sit in one key (checked).
        seed: hash seed (``by="hash"``, ``val_by="hash"``).
        val_by: how the validation keys are drawn from the keys that are not test (default: as
            ``by``). With ``by="time"``, ``val_by="hash"`` keeps the latest keys as test and draws
            validation at random over the whole earlier time range, instead of the block just
            before test: validation (early stopping, and the calibration split of exports) then
            looks like the training period on average rather than like its last days.

    Returns:
        ``(train, val, test)`` frames with the columns of ``frame``.
    """
    if by not in ("time", "hash"):
        raise ValueError(f"split.by must be 'time' or 'hash', got {by!r}")
    val_by = by if val_by is None else val_by
    if val_by not in ("time", "hash"):
        raise ValueError(f"split.val_by must be 'time' or 'hash', got {val_by!r}")
    if by == "hash" and val_by == "time":
        raise ValueError("split.val_by='time' needs by='time' (a time block of validation keys "
                         "before a hashed test split would not be 'the latest before test')")
    if not (0 <= val and 0 <= test and val + test < 1):
        raise ValueError(f"split fractions need val, test >= 0 and val + test < 1, "
                         f"got {val}, {test}")
    if key == "request":
        key_expr = request_key_expr(columns)
    elif key in ("session", "user"):
        col = getattr(columns, key)
        if col is None:
            raise ValueError(f"split key {key!r} needs a {key!r} column in the column map")
        key_expr = pl.col(col)
    else:
        raise ValueError(f"split.key must be 'request', 'session' or 'user', got {key!r}")
    df = frame.with_columns(key_expr.alias("__key"), request_key_expr(columns).alias(_REQ))
    if key != "request":
        multi = df.group_by(_REQ).agg(pl.col("__key").n_unique()).filter(pl.col("__key") > 1)
        if multi.height:
            raise ValueError(f"{multi.height} request(s) span several {key} values (e.g. "
                             f"{multi[_REQ][0]!r}); splitting by {key} would cut them")
    keys = df.with_row_index(_ROW).group_by("__key").agg(
        pl.col(_ROW).min().alias("first"),
        *([pl.col(columns.time).min().alias("t")] if by == "time" and columns.time else []))
    if by == "time":
        if columns.time is None:
            raise ValueError("split by='time' needs a time column in the column map "
                             "(or use by='hash')")
        keys = keys.sort(["t", "first"])
        k = keys.height
        n_test, n_val = int(round(test * k)), int(round(val * k))
        part = np.zeros(k, dtype=np.int8)
        part[k - n_test:] = 2
        if val_by == "time":
            part[k - n_test - n_val: k - n_test] = 1
        elif n_val:
            # the n_val non-test keys with the smallest hash: a stable random draw over time
            h = stable_hash(keys["__key"][: k - n_test], seed)
            part[np.argsort(h, kind="stable")[:n_val]] = 1
    else:
        u = (stable_hash(keys["__key"], seed) % np.uint64(10_000)).astype(np.float64) / 10_000
        part = np.where(u < test, 2, np.where(u < test + val, 1, 0)).astype(np.int8)
    keys = keys.select("__key", pl.Series("__part", part))
    df = df.join(keys, on="__key", how="left", maintain_order="left")
    out = tuple(df.filter(pl.col("__part") == i).drop("__key", _REQ, "__part") for i in range(3))
    return out  # type: ignore[return-value]


def split_parts(frame: pl.DataFrame, columns: ColumnMap, spec: Mapping | None
                ) -> dict[str, pl.DataFrame]:
    """A validated frame cut by a source's split spec: ``{"train", "val", "test"}`` frames (every
    row training data when ``spec`` is None: a source without a split)."""
    if spec is None:
        return {"train": frame, "val": frame.head(0), "test": frame.head(0)}
    return dict(zip(SPLITS, split_frame(frame, columns, **spec), strict=True))
