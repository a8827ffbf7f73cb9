"""The data layer: ``Schema`` (features, vocabularies, scaler), splits, and the data *sources*.

A source's ``load()`` returns ``Splits(train, val, test, schema)`` of :class:`~hybridrank.lists.
ListData` (docs/ARCHITECTURE.md). The readers, the column map and value validation live in
:mod:`hybridrank.data.readers` and are re-exported here.

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
from pathlib import Path
from typing import NamedTuple

import numpy as np
import polars as pl

from hybridrank.data.hashing import stable_hash
from hybridrank.data.libsvm import read_libsvm
from hybridrank.data.readers import (
    MAX_REQUEST_SPAN,
    SOURCE_FILE,
    ColumnMap,
    read_clicklog,
    request_key_expr,
    validate_frame,
)
from hybridrank.data.schema import _REQ, _ROW, Schema
from hybridrank.data.simulate import simulate_clicklog
from hybridrank.data.vocab import VocabPolicy, vocab_policies
from hybridrank.lists import ListData

__all__ = [
    "ColumnMap", "Schema", "Splits", "SimulatedSource", "LetorSource", "ClickLogSource",
    "read_libsvm", "read_clicklog", "validate_frame", "split_frame", "stable_hash",
    "SIM_COLUMNS_MAP", "VocabPolicy",
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
# Splits
# ----------------------------------------------------------------------------------------------
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
            first) or ``"keep"`` (:func:`~hybridrank.data.readers.validate_frame`).
        max_request_span: seconds; a request id whose rows lie further apart in time is an error
            (a reused id); None keeps them as one request.
        vocab: how categoricals become codes: ``{min_count: 1, max_size: null, hash_buckets:
            {column: n}, columns: {column: {min_count, max_size}}}`` (:mod:`hybridrank.data.vocab`;
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
