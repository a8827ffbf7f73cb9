"""``Schema``: everything a model needs to read data as it was trained.

Features, vocabularies, scaler, label range, column map and value policies; it is fitted on the
training split (:meth:`Schema.fit`), stored with the model, and turns frames into
:class:`~hybridrank.lists.ListData` (:meth:`Schema.transform`, :meth:`Schema.read`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import polars as pl
import torch

from hybridrank.data.readers import MAX_REQUEST_SPAN, ColumnMap, normalize_types, request_key_expr, validate_frame
from hybridrank.data.vocab import VocabIndex, VocabPolicy, hash_codes, select_vocab, table_report, vocab_policies
from hybridrank.lists import ListData, lengths_to_offsets

__all__ = ["Schema", "POLICY_DEFAULTS"]

log = logging.getLogger(__name__)

_REQ = "__request"
_ROW = "__row"

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
            :func:`~hybridrank.data.readers.validate_frame` the data was read under; :meth:`validate`
            applies them to new data (a model trained with ``nan_policy="fill"`` fills NaN
            features of the files it scores with the same ``fill_value``).
        vocab_policy: per categorical, its :class:`~hybridrank.data.vocab.VocabPolicy` (minimum
            count, size cap, or ``hash_buckets``: code ``1 + stable_hash(value) mod n``, 0 when
            missing; :mod:`hybridrank.data.vocab`). Columns left out get the default (keep every
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
        """The column's :class:`~hybridrank.data.vocab.VocabIndex`, built once per schema (a cache
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

        ``vocab`` is the ``vocab:`` config node (:func:`~hybridrank.data.vocab.vocab_policies`) or
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


