"""The data layer: ``Schema`` (features, vocabularies, scaler), splits, and the data *sources*.

A source's ``load()`` returns ``Splits(train, val, test, schema)`` of :class:`~hybridrank.lists.
ListData` (docs/ARCHITECTURE.md). The readers, the column map and value validation live in
:mod:`hybridrank.readers` and are re-exported here.

Splits never cut a request. LETOR data comes split by file; click logs are split
``by="time"`` (whole sessions / requests / users ordered by start time, the last ``val`` then
``test`` fractions of them) or ``by="hash"`` (a stable hash of the key into buckets, identical on
every machine and polars version). Fractions count keys (sessions, requests or users), not rows.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import polars as pl
import pyarrow as pa
import torch

from .libsvm import read_libsvm
from .lists import ListData, lengths_to_offsets
from .readers import (
    MAX_REQUEST_SPAN,
    SOURCE_FILE,
    ColumnMap,
    normalize_types,
    read_clicklog,
    request_key_expr,
    validate_frame,
)
from .simulate import simulate_clicklog
from .vocab import VocabIndex, VocabPolicy, hash_codes, select_vocab, table_report, vocab_policies

__all__ = [
    "ColumnMap", "Schema", "Splits", "SimulatedSource", "LetorSource", "ClickLogSource",
    "read_libsvm", "read_clicklog", "validate_frame", "split_frame", "stable_hash",
    "SIM_COLUMNS_MAP", "VocabPolicy",
]

log = logging.getLogger(__name__)

#: The column map of :func:`hybridrank.simulate.simulate_clicklog` frames. ``position`` is both
#: copied (``ListData.position``) and a numeric feature (``SimulatedSource(position_feature=False)``
#: drops it from the features, for position-bias towers); ``p_true`` is carried, never a feature.
SIM_COLUMNS_MAP = ColumnMap(
    request="request_id", label="click", session="session_id", user="user_id", time="time",
    position="position", item="item_id", bid="bid", true_p="p_true",
    numeric=["item_price", "item_pop", "hour", "user_activity", "position"],
    categorical=["user_id", "item_id", "item_category"],
)

_REQ = "__request"
_ROW = "__row"


class Splits(NamedTuple):
    """What a source's ``load()`` returns."""

    train: ListData
    val: ListData
    test: ListData
    schema: Schema


# ----------------------------------------------------------------------------------------------
# Schema
# ----------------------------------------------------------------------------------------------
#: The value policies a model is trained under (``validate_frame`` arguments); they travel with
#: the schema into checkpoints and apply again when the model scores new data.
POLICY_DEFAULTS = {"nan_policy": "error", "fill_value": 0.0, "duplicates": "error",
                   "max_request_span": MAX_REQUEST_SPAN}


@dataclass(frozen=True)
class Schema:
    """Everything a model needs to read data as it was trained: features, vocabularies, scaler,
    label range, column map and value policies; turns frames into ``ListData``.

    Attributes:
        numeric: numeric feature names (columns of ``ListData.num``, in order).
        categorical: categorical feature names (columns of ``ListData.cat``, in order).
        vocab: per categorical with a vocabulary, the sorted train values its policy keeps, as
            strings; value ``vocab[c][k]`` has code ``k + 1``, code 0 is out-of-vocabulary
            (unseen, dropped by the policy, or missing). Hashed columns have no entry.
        mean, std: train mean and standard deviation (population) of each numeric feature;
            a std of 0 (or undefined) is stored as 1. ``normalize=False`` stores 0 / 1.
        label_max: the largest label value (1 for clicks, 2 for MQ2008, 4 for MSLR).
        columns: the :class:`ColumnMap` that was used.
        nan_policy, fill_value, duplicates, max_request_span: the value policies of
            :func:`~hybridrank.readers.validate_frame` the data was read under; :meth:`validate`
            applies them to new data (a model trained with ``nan_policy="fill"`` fills NaN
            features of the files it scores with the same ``fill_value``).
        vocab_policy: per categorical, its :class:`~hybridrank.vocab.VocabPolicy` (minimum
            count, size cap, or ``hash_buckets``: code ``1 + stable_hash(value) mod n``, 0 when
            missing; :mod:`hybridrank.vocab`). Columns left out get the default (keep every
            train value).
    """

    numeric: tuple[str, ...]
    categorical: tuple[str, ...]
    vocab: dict[str, tuple[str, ...]]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    label_max: float
    columns: ColumnMap = field(compare=True)
    nan_policy: str = "error"
    fill_value: float = 0.0
    duplicates: str = "error"
    max_request_span: float | None = MAX_REQUEST_SPAN
    vocab_policy: Mapping[str, VocabPolicy] = field(default_factory=dict)

    def __post_init__(self):
        unknown = sorted(set(self.vocab_policy) - set(self.categorical))
        if unknown:
            raise ValueError(f"Schema: vocab_policy for {unknown}, which are not categorical "
                             f"features {list(self.categorical)}")
        pol = {c: self.vocab_policy.get(c, VocabPolicy()) for c in self.categorical}
        object.__setattr__(self, "vocab_policy", pol)
        need = [c for c in self.categorical if not pol[c].hashed and c not in self.vocab]
        extra = [c for c in self.vocab if c not in self.categorical or pol[c].hashed]
        if need or extra:
            raise ValueError(f"Schema: vocabularies missing for {need} / given for {extra} "
                             "(hashed or unknown columns have none)")

    def _vocab_index(self, column: str) -> VocabIndex:
        """The column's :class:`~hybridrank.vocab.VocabIndex`, built once per schema (a cache
        outside the dataclass fields: equality and ``to_dict`` ignore it)."""
        cache = self.__dict__.setdefault("_vocab_cache", {})
        if column not in cache:
            cache[column] = VocabIndex(self.vocab[column])
        return cache[column]

    @property
    def hashed(self) -> dict[str, int]:
        """``{column: buckets}`` of the hashed categoricals."""
        return {c: p.hash_buckets for c, p in self.vocab_policy.items() if p.hashed}

    @property
    def policies(self) -> dict:
        """The value policies as ``validate_frame`` keyword arguments."""
        return {k: getattr(self, k) for k in POLICY_DEFAULTS}

    def validate(self, frame: pl.DataFrame, name: str = "data") -> pl.DataFrame:
        """Check (and under ``nan_policy="fill"`` fill) a frame's values with this schema's policies."""
        return validate_frame(frame, self.columns, label_max=self.label_max, name=name,
                              **self.policies)

    def read(self, frame: pl.DataFrame, name: str = "data") -> ListData:
        """A raw frame of this schema's column map -> ``ListData``: cast, validate, transform."""
        return self.transform(self.validate(normalize_types(frame, self.columns), name))

    @property
    def vocab_sizes(self) -> tuple[int, ...]:
        """Vocabulary size of each categorical (the bucket count of a hashed one), without code 0
        (embedding tables have V + 1 rows)."""
        return tuple(self.vocab_policy[c].hash_buckets if self.vocab_policy[c].hashed
                     else len(self.vocab[c]) for c in self.categorical)

    @classmethod
    def fit(cls, train: pl.DataFrame, columns: ColumnMap, label_max: float, *,
            normalize: bool = True, vocab: Mapping | None = None, **policies) -> Schema:
        """Fit vocabularies and the scaler on the (validated) train frame; record the policies.

        ``vocab`` is the ``vocab:`` config node (:func:`~hybridrank.vocab.vocab_policies`) or
        ``{column: VocabPolicy}``; None keeps every train value of every column. The embedding
        rows of each column (and a hashed column's expected collision share) are logged.
        """
        unknown = sorted(set(policies) - set(POLICY_DEFAULTS))
        if unknown:
            raise ValueError(f"Schema.fit: unknown policies {unknown}; known {sorted(POLICY_DEFAULTS)}")
        if train.height == 0:
            raise ValueError("Schema.fit: the train frame is empty")
        num = list(columns.numeric)
        if num and normalize:
            stats = train.select(
                *[pl.col(c).cast(pl.Float64).mean().alias(f"m{i}") for i, c in enumerate(num)],
                *[pl.col(c).cast(pl.Float64).std(ddof=0).alias(f"s{i}") for i, c in enumerate(num)],
            ).row(0)
            mean = tuple(float(v) for v in stats[: len(num)])
            std = tuple(float(s) if s is not None and np.isfinite(s) and s > 0 else 1.0
                        for s in stats[len(num):])
        else:
            mean, std = (0.0,) * len(num), (1.0,) * len(num)
        vpol = vocab_policies(vocab, columns.categorical)
        vocabs = {c: select_vocab(train[c], p) for c, p in vpol.items() if not p.hashed}
        schema = cls(tuple(num), tuple(columns.categorical), vocabs, mean, std, float(label_max),
                     columns, **policies, vocab_policy=vpol)
        distinct = {c: (train[c].drop_nulls().cast(pl.String).n_unique(), True)
                    for c in columns.categorical if not vpol[c].keeps_all}
        if schema.categorical:
            log.info("schema: %s", table_report(schema, distinct))
        return schema

    def to_dict(self) -> dict:
        """JSON-serialisable form (stored in checkpoints)."""
        return {
            "numeric": list(self.numeric), "categorical": list(self.categorical),
            "vocab": {c: list(v) for c, v in self.vocab.items()},
            "mean": list(self.mean), "std": list(self.std), "label_max": self.label_max,
            "columns": self.columns.to_dict(), "policies": self.policies,
            "vocab_policy": {c: p.to_dict() for c, p in self.vocab_policy.items()},
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> Schema:
        """Inverse of :meth:`to_dict` (schemas saved without ``policies`` / ``vocab_policy`` get
        the defaults: every column a vocabulary of all its train values)."""
        policies = {**POLICY_DEFAULTS, **dict(d.get("policies") or {})}
        return cls(
            numeric=tuple(d["numeric"]), categorical=tuple(d["categorical"]),
            vocab={str(c): tuple(str(x) for x in v) for c, v in d["vocab"].items()},
            mean=tuple(float(x) for x in d["mean"]), std=tuple(float(x) for x in d["std"]),
            label_max=float(d["label_max"]), columns=ColumnMap.from_dict(d["columns"]),
            **policies,
            vocab_policy={str(c): VocabPolicy.from_dict(p)
                          for c, p in (d.get("vocab_policy") or {}).items()},
        )

    @classmethod
    def coerce(cls, schema: Schema | Mapping | None) -> Schema | None:
        """A :class:`Schema` from a schema, its dict form, or None."""
        if schema is None or isinstance(schema, Schema):
            return schema
        return cls.from_dict(schema)

    def transform(self, frame: pl.DataFrame) -> ListData:
        """Turn a (validated) frame into ``ListData``; see :meth:`transform_with_stats`.

        Code-0 counts (out of vocabulary, or missing in a hashed column) are logged (INFO) when
        there are any.
        """
        data, stats = self.transform_with_stats(frame)
        if any(stats["oov"].values()):
            log.info("out-of-vocabulary rows (code 0) per categorical: %s", stats["oov"])
        return data

    def transform_with_stats(self, frame: pl.DataFrame) -> tuple[ListData, dict]:
        """Sort by request, build offsets and scopes, standardise numerics, encode categoricals.

        Requests are ordered by their first time when a time column is mapped, else by first
        appearance (ties keep first appearance); rows inside a request by position when mapped,
        else input order. Rows of one request need not be adjacent in the input.

        Returns:
            ``(data, stats)`` with ``stats = {"oov": {column: count of code-0 rows}}``: values out of
            the vocabulary or missing; for a hashed column, missing values only (every present
            value has a bucket).

        Raises:
            ValueError: a mapped column is missing, or a request has rows of two sessions / users.
        """
        cm = self.columns
        need = [c for c in cm.source_columns() if c not in frame.columns]
        if need:
            raise ValueError(f"Schema.transform: columns {need} missing; frame has {frame.columns}")
        df = frame.with_columns(request_key_expr(cm).alias(_REQ)).with_row_index(_ROW)
        if df[_REQ].null_count():
            raise ValueError(f"Schema.transform: {df[_REQ].null_count()} row(s) have no request "
                             "id; run validate_frame on new data first")
        aggs = [pl.col(_ROW).min().alias("first")]
        if cm.time is not None:
            aggs.append(pl.col(cm.time).min().alias("t"))
        for s in dict.fromkeys(x for x in (cm.session, cm.user) if x is not None):
            aggs += [pl.col(s).first().alias(f"id_{s}"), pl.col(s).n_unique().alias(f"nu_{s}")]
        req = df.group_by(_REQ).agg(aggs)
        req = req.sort(["t", "first"] if cm.time is not None else ["first"])
        for s in dict.fromkeys(x for x in (cm.session, cm.user) if x is not None):
            split = req.filter(pl.col(f"nu_{s}") > 1)
            if split.height:
                raise ValueError(f"{split.height} request(s) have rows from several {s!r} values, "
                                 f"e.g. request {split[_REQ][0]!r}; a request must sit in one {s}")
        req = req.with_row_index("__r")
        order = ["__r", cm.position, _ROW] if cm.position is not None else ["__r", _ROW]
        df = df.join(req.select(_REQ, "__r"), on=_REQ, how="left").sort(order)
        lengths = torch.from_numpy(
            np.bincount(df["__r"].to_numpy(), minlength=req.height).astype(np.int64))
        n = df.height

        if self.numeric:
            x = df.select([pl.col(c).cast(pl.Float64) for c in self.numeric]).to_numpy()
            x = (x - np.asarray(self.mean)) / np.asarray(self.std)
            if not np.isfinite(x).all():
                bad = [c for c, ok in zip(self.numeric, np.isfinite(x).all(axis=0)) if not ok]
                raise ValueError(f"Schema.transform: missing/NaN/inf values in numeric {bad}; "
                                 "run validate_frame (nan_policy='fill' to fill them) first")
        else:
            x = np.zeros((n, 0))
        oov: dict[str, int] = {}
        codes = []
        for c in self.categorical:
            if self.vocab_policy[c].hashed:
                hc = hash_codes(df[c], self.vocab_policy[c].hash_buckets)
                oov[c] = int((hc == 0).sum())
                codes.append(hc)
                continue
            code = self._vocab_index(c).codes(df[c])
            oov[c] = int((code == 0).sum())
            codes.append(code)
        cat = np.stack(codes, axis=1) if codes else np.zeros((n, 0), dtype=np.int64)

        def t(col: str | None, dtype: torch.dtype) -> torch.Tensor | None:
            if col is None:
                return None
            return torch.from_numpy(np.array(df[col].to_numpy(), copy=True)).to(dtype)

        scope = {}
        for name, col in (("session", cm.session), ("user", cm.user)):
            if col is not None:
                ids = req[f"id_{col}"].rank("dense").cast(pl.Int64) - 1
                scope[name] = torch.from_numpy(ids.to_numpy().astype(np.int64))
        data = ListData(
            num=torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)),
            cat=torch.from_numpy(np.ascontiguousarray(cat, dtype=np.int64)),
            label=t(cm.label, torch.float32),
            offsets=lengths_to_offsets(lengths),
            scope=scope,
            position=t(cm.position, torch.int64),
            bid=t(cm.bid, torch.float32),
            true_p=t(cm.true_p, torch.float32),
            request_key=req[_REQ].rename("request"),
            item_key=df[cm.item] if cm.item is not None else None,
            time=(torch.from_numpy(np.array(req["t"].cast(pl.Int64).to_numpy(), copy=True))
                  if cm.time else None),
        )
        return data, {"oov": oov}


# ----------------------------------------------------------------------------------------------
# Splits
# ----------------------------------------------------------------------------------------------
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


def split_frame(frame: pl.DataFrame, columns: ColumnMap, *, by: str = "time", val: float = 0.1,
                test: float = 0.2, key: str = "session", seed: int = 0,
                ) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Split a click-log frame into train / val / test without cutting any request.

    Args:
        by: ``"time"``: keys ordered by start time (first appearance breaks ties), the last
            ``test`` fraction of keys is test, the ``val`` fraction before it val. ``"hash"``:
            :func:`stable_hash` of the key into 10,000 buckets.
        val, test: fractions of keys (not rows).
        key: ``"request"``, ``"session"`` or ``"user"``; session / user must be mapped, and every
            request must sit in one key (checked).
        seed: hash seed (``by="hash"`` only).
    """
    if by not in ("time", "hash"):
        raise ValueError(f"split.by must be 'time' or 'hash', got {by!r}")
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
        part[k - n_test - n_val: k - n_test] = 1
        part[k - n_test:] = 2
    else:
        u = (stable_hash(keys["__key"], seed) % np.uint64(10_000)).astype(np.float64) / 10_000
        part = np.where(u < test, 2, np.where(u < test + val, 1, 0)).astype(np.int8)
    keys = keys.select("__key", pl.Series("__part", part))
    df = df.join(keys, on="__key", how="left", maintain_order="left")
    out = tuple(df.filter(pl.col("__part") == i).drop("__key", _REQ, "__part") for i in range(3))
    return out  # type: ignore[return-value]


# ----------------------------------------------------------------------------------------------
# Sources
# ----------------------------------------------------------------------------------------------
def _log_split(name: str, frame: pl.DataFrame, columns: ColumnMap) -> None:
    lab = frame[columns.label]
    n_req = frame.select(request_key_expr(columns).n_unique()).item()
    counts = dict(sorted(lab.value_counts().iter_rows()))
    log.info("%s: %d impressions, %d requests, mean label %.4f, label counts %s",
             name, frame.height, n_req, float(lab.mean()), counts)


def _finish(name: str, frames: dict[str, pl.DataFrame], columns: ColumnMap, label_max: float,
            normalize: bool = True, schema: Schema | None = None, policies: Mapping | None = None,
            vocab: Mapping | None = None) -> Splits:
    """Check no split is empty, fit the schema on train (or use the given one), transform all three."""
    for split, f in frames.items():
        if f.height == 0:
            raise ValueError(f"{name}: the {split} split is empty (check its fractions or file)")
        _log_split(f"{name} {split}", f, columns)
    if schema is None:
        schema = Schema.fit(frames["train"], columns, label_max, normalize=normalize,
                            vocab=vocab, **dict(policies or {}))
    out = {}
    for split, f in frames.items():
        data, stats = schema.transform_with_stats(f)
        if any(stats["oov"].values()):
            log.info("%s %s: out-of-vocabulary rows per categorical %s", name, split, stats["oov"])
        out[split] = data
    return Splits(out["train"], out["val"], out["test"], schema)


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


_DEFAULT_SPLIT = {"by": "time", "val": 0.1, "test": 0.2, "key": "session"}


def _split_args(split: Mapping | None) -> dict:
    d = dict(_DEFAULT_SPLIT if split is None else split)
    unknown = sorted(set(d) - {"by", "val", "test", "key", "seed"})
    if unknown:
        raise ValueError(f"unknown split options {unknown}; valid: by, val, test, key, seed")
    return d


class SimulatedSource:
    """Data from :func:`hybridrank.simulate.simulate_clicklog` (no files), with ``true_p``.

    Args:
        split: ``{"by": "time"|"hash", "val": 0.1, "test": 0.2, "key": "session"}`` (default).
        label_max: 1 (clicks are binary; present so every source config states it).
        position_feature: whether the display position is a numeric feature (default). A model
            with a position-bias tower learns the position effect apart from relevance and must
            not see position as a feature (``HybridRanker`` refuses it).
        schema: a trained model's schema (or its dict) to read the data with instead of fitting
            one on train (exports and evaluations of a checkpoint).
        **simulator: keyword arguments of :func:`~hybridrank.simulate.simulate_clicklog`.
    """

    def __init__(self, *, split: Mapping | None = None, schema: Schema | Mapping | None = None,
                 label_max: float = 1.0, position_feature: bool = True, **simulator):
        if float(label_max) != 1.0:
            raise ValueError(f"SimulatedSource: simulated clicks are binary, label_max must be 1, "
                             f"got {label_max}")
        self.label_max = 1.0
        self.split = _split_args(split)
        self.columns = SIM_COLUMNS_MAP if position_feature else dataclasses.replace(
            SIM_COLUMNS_MAP, numeric=[c for c in SIM_COLUMNS_MAP.numeric if c != "position"])
        self.schema = _given_schema(schema, self.columns, "SimulatedSource")
        self.simulator = dict(simulator)
        try:  # fail at construction on a misspelled simulator argument, not at load time
            inspect.signature(simulate_clicklog).bind(**self.simulator)
        except TypeError as e:
            raise TypeError(f"SimulatedSource: {e}") from None

    def load(self) -> Splits:
        frame = simulate_clicklog(**self.simulator)
        frame = (self.schema.validate(frame, "simulated") if self.schema is not None else
                 validate_frame(frame, self.columns, label_max=self.label_max, name="simulated"))
        parts = split_frame(frame, self.columns, **self.split)
        return _finish("simulated", dict(zip(("train", "val", "test"), parts)), self.columns,
                       self.label_max, schema=self.schema)


def _feature_names(frame: pl.DataFrame) -> list[str]:
    return [c for c in frame.columns if c.startswith("f") and c[1:].isdigit()]


class LetorSource:
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
    """

    def __init__(self, train: str | Path | Sequence[str | Path],
                 val: str | Path | Sequence[str | Path] | None,
                 test: str | Path | Sequence[str | Path], label_max: float,
                 n_features: int | None = None, normalize: bool = True,
                 val_fraction: float = 0.2, seed: int = 0,
                 schema: Schema | Mapping | None = None):
        self.schema = Schema.coerce(schema)
        if self.schema is not None:
            n_features, label_max = len(self.schema.numeric), self.schema.label_max
        def as_list(p):
            if p is None:
                return None
            return [p] if isinstance(p, str | Path) else list(p)

        self.paths = {"train": as_list(train), "val": as_list(val), "test": as_list(test)}
        self.label_max = float(label_max)
        self.n_features = n_features
        self.normalize = normalize
        self.val_fraction = val_fraction
        self.seed = seed

    def load(self) -> Splits:
        files = {k: [(str(p), read_libsvm(p, n_features=self.n_features)) for p in ps]
                 for k, ps in self.paths.items() if ps is not None}
        width = max(len(_feature_names(f)) for fs in files.values() for _, f in fs)
        names = [f"f{i}" for i in range(1, width + 1)]
        columns = ColumnMap(request="qid", label="label", numeric=names)
        frames = {}
        for k, fs in files.items():
            parts = []
            for path, f in fs:
                have = len(_feature_names(f))
                f = f.with_columns([pl.lit(0.0).alias(n) for n in names[have:]],
                                   pl.lit(path).cast(pl.Categorical).alias(SOURCE_FILE))
                f = f.select("label", "qid", *names, "comment", "line", SOURCE_FILE)
                parts.append(validate_frame(f, columns, label_max=self.label_max, name=path))
            frames[k] = pl.concat(parts)
        if self.paths["val"] is None:
            tr, va, _ = split_frame(frames["train"], columns, by="hash", val=self.val_fraction,
                                    test=0.0, key="request", seed=self.seed)
            frames["train"], frames["val"] = tr, va
        frames = {k: frames[k] for k in ("train", "val", "test")}
        name = f"letor({Path(str(self.paths['train'][0])).parent.name})"
        schema = _given_schema(self.schema, columns, name)
        return _finish(name, frames, columns, self.label_max, normalize=self.normalize,
                       schema=schema)


class ClickLogSource:
    """A parquet / CSV click log described by a column map and a split rule.

    Args:
        path: a file or a glob (``data/clicks/*.parquet``).
        columns: the :class:`ColumnMap` as a mapping (the ``columns:`` config node).
        split: ``{"by": "time"|"hash", "val": .1, "test": .2, "key": "session"|"request"|"user"}``.
        label_max: largest label (1 for clicks).
        nan_policy: ``"error"`` (default) or ``"fill"`` missing / NaN / inf numeric features with
            ``fill_value`` (counts are logged).
        duplicates: repeated (request, item) rows: ``"error"`` (default), ``"drop"`` (keep the
            first) or ``"keep"`` (:func:`~hybridrank.readers.validate_frame`).
        max_request_span: seconds; a request id whose rows lie further apart in time is an error
            (a reused id); None keeps them as one request.
        vocab: how categoricals become codes: ``{min_count: 1, max_size: null, hash_buckets:
            {column: n}, columns: {column: {min_count, max_size}}}`` (:mod:`hybridrank.vocab`;
            None: every train value of every column).
        schema: a trained model's schema (or its dict): read with its scaler, vocabularies, label
            range and value and vocabulary policies (which then replace those above) instead of
            fitting.

    The value policies are recorded in the fitted :class:`Schema`, so they travel with a trained
    model and apply again when it scores new files.
    """

    def __init__(self, path: str | Path, columns: Mapping, split: Mapping | None = None,
                 label_max: float = 1, nan_policy: str = "error", fill_value: float = 0.0,
                 duplicates: str = "error", max_request_span: float | None = MAX_REQUEST_SPAN,
                 vocab: Mapping | None = None, schema: Schema | Mapping | None = None):
        self.path = path
        self.columns = columns if isinstance(columns, ColumnMap) else ColumnMap.from_dict(columns)
        self.split = _split_args(split)
        self.label_max = float(label_max)
        self.policies = {"nan_policy": nan_policy, "fill_value": float(fill_value),
                         "duplicates": duplicates, "max_request_span": max_request_span}
        self.vocab = vocab_policies(vocab, self.columns.categorical, f"{path}: vocab")
        self.schema = _given_schema(schema, self.columns, str(path))
        if self.schema is not None:
            if self.schema.policies != self.policies:
                log.info("%s: reading with the model's value policies %s", path, self.schema.policies)
            if vocab is not None and dict(self.schema.vocab_policy) != self.vocab:
                log.info("%s: reading with the model's vocabulary policies", path)
            self.policies, self.label_max = self.schema.policies, self.schema.label_max
            self.vocab = dict(self.schema.vocab_policy)

    def load(self) -> Splits:
        frame = validate_frame(read_clicklog(self.path, self.columns), self.columns,
                               label_max=self.label_max, name=str(self.path), **self.policies)
        parts = split_frame(frame, self.columns, **self.split)
        return _finish(str(self.path), dict(zip(("train", "val", "test"), parts)), self.columns,
                       self.label_max, schema=self.schema, policies=self.policies, vocab=self.vocab)
