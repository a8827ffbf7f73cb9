"""``Schema``: everything a model needs to read data as it was trained.

Features, vocabularies, scaler, label range, column map and value policies; it is fitted on the
training split by :class:`SchemaFit` (the one fit: chunk by chunk for a streamed log, one chunk for
an in-memory one; :meth:`Schema.fit` is that fit over one frame), stored with the model, and turns
frames into :class:`~hybridrank.lists.ListData` (:meth:`Schema.transform`, :meth:`Schema.read`).
The request layout of a frame (which rows form which request, in which order, with which session /
user / time) is :func:`request_lists`, shared by the transform and by the sampler's counts.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import polars as pl
import torch

from hybridrank.data.readers import MAX_REQUEST_SPAN, ColumnMap, normalize_types, request_key_expr
from hybridrank.data.validate import validate_frame
from hybridrank.data.vocab import (
    ValueCounter,
    VocabIndex,
    VocabPolicy,
    hash_codes,
    select_vocab,
    table_report,
    vocab_policies,
)
from hybridrank.lists import ListData, lengths_to_offsets

__all__ = ["Schema", "SchemaFit", "POLICY_DEFAULTS", "request_lists", "numeric_values", "piecewise_linear"]

log = logging.getLogger(__name__)

_REQ = "__request"
_ROW = "__row"

#: At most this many training rows (a uniform sample) give the quantile edges of
#: ``SchemaFit(numeric_bins=T)``.
BIN_SAMPLE_ROWS = 65_536

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
            a std of 0 (or undefined, or under 1e-12 of the mean: a constant column's rounding
            noise) is stored as 1. ``normalize=False`` stores 0 / 1.
        label_max: the largest label value (1 for clicks, 2 for MQ2008, 4 for MSLR).
        columns: the :class:`ColumnMap` that was used.
        nan_policy, fill_value, duplicates, max_request_span: the value policies of
            :func:`~hybridrank.data.validate.validate_frame` the data was read under; :meth:`validate`
            applies them to new data (a model trained with ``nan_policy="fill"`` fills NaN
            features of the files it scores with the same ``fill_value``).
        vocab_policy: per categorical, its :class:`~hybridrank.data.vocab.VocabPolicy` (minimum
            count, size cap, or ``hash_buckets``: code ``1 + stable_hash(value) mod n``, 0 when
            missing; :mod:`hybridrank.data.vocab`). Columns left out get the default (keep every
            train value).
        missing: under ``nan_policy="indicator"``, the numeric features with missing values in
            the training rows: each gets a 0/1 missing-value feature after the numeric ones
            (:attr:`feature_names`); a missing value reads as the training mean (0 once
            standardised; 0 under ``normalize=False``), in every numeric column.
        bins: per numeric feature, the (standardised) edges of its piecewise-linear encoding
            (:func:`piecewise_linear`; ``SchemaFit(numeric_bins=T)``: the training quantiles at
            ``0, 1/T, ..., 1``, repeated values merged), or ``()``: each feature is one column.
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
    missing: tuple[str, ...] = ()
    bins: tuple[tuple[float, ...], ...] = ()

    def __post_init__(self):
        if self.bins and len(self.bins) != len(self.numeric):
            raise ValueError(f"Schema: {len(self.bins)} bin-edge lists for {len(self.numeric)} "
                             "numeric features")
        stray = [c for c in self.missing if c not in self.numeric]
        if stray:
            raise ValueError(f"Schema: missing-value features for {stray}, which are not numeric "
                             f"features {list(self.numeric)}")
        if self.missing and self.nan_policy != "indicator":
            raise ValueError(f"Schema: missing-value features {list(self.missing)} need "
                             f"nan_policy='indicator', got {self.nan_policy!r}")
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

    def codes(self, column: str, values: pl.Series) -> np.ndarray:
        """The vocabulary codes of ``values`` of the non-hashed categorical ``column`` (0: not in
        the vocabulary), as :meth:`transform` encodes them."""
        return self._vocab_index(column).codes(values)

    @property
    def feature_names(self) -> tuple[str, ...]:
        """The columns of ``ListData.num``: the numeric features (under :attr:`bins`, one column
        ``"<column>:bin<t>"`` per bin of each, or the feature itself where it has under two
        edges), then one missing-value feature ``"<column>:missing"`` per column of
        :attr:`missing`."""
        if self.bins:
            num = tuple(name for c, e in zip(self.numeric, self.bins)
                        for name in ([f"{c}:bin{t}" for t in range(len(e) - 1)] if len(e) > 1 else [c]))
        else:
            num = self.numeric
        return (*num, *(f"{c}:missing" for c in self.missing))

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
            normalize: bool = True, numeric_bins: int = 0, vocab: Mapping | None = None,
            **policies) -> Schema:
        """Fit vocabularies and the scaler (and the bins of ``numeric_bins``) on the (validated)
        train frame; record the policies.

        :class:`SchemaFit` over one frame (the fit a streamed source runs chunk by chunk).
        ``vocab`` is the ``vocab:`` config node (:func:`~hybridrank.data.vocab.vocab_policies`) or
        ``{column: VocabPolicy}``; None keeps every train value of every column. The embedding
        rows of each column (and a hashed column's bucket use) are logged.
        """
        fit = SchemaFit(columns, label_max, normalize=normalize, numeric_bins=numeric_bins,
                        vocab=vocab, **policies)
        if train.height == 0:
            raise ValueError("Schema.fit: the train frame is empty")
        fit.update(train)
        return fit.finish()

    def to_dict(self) -> dict:
        """JSON-serialisable form (stored in checkpoints)."""
        return {
            "numeric": list(self.numeric), "categorical": list(self.categorical),
            "vocab": {c: list(v) for c, v in self.vocab.items()},
            "mean": list(self.mean), "std": list(self.std), "label_max": self.label_max,
            "columns": self.columns.to_dict(), "policies": self.policies,
            "vocab_policy": {c: p.to_dict() for c, p in self.vocab_policy.items()},
            "missing": list(self.missing),
            "bins": [list(e) for e in self.bins],
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
            label_max=float(d["label_max"]),
            # schemas stored before position_transform existed read positions as they are
            columns=ColumnMap.from_dict({"position_transform": "identity", **dict(d["columns"])}),
            **policies,
            vocab_policy={str(c): VocabPolicy.from_dict(p)
                          for c, p in (d.get("vocab_policy") or {}).items()},
            missing=tuple(d.get("missing") or ()),
            bins=tuple(tuple(float(x) for x in e) for e in d.get("bins") or ()),
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

    def _mark_missing(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Standardised numerics ``x`` (NaN where missing) under ``nan_policy="indicator"``:
        ``(x with every missing value at the training mean (0), the 0/1 missing-value feature of
        each column of`` :attr:`missing` ``)``. A column that had no missing training values gets
        no feature: its missing values at scoring time are filled and counted in the log."""
        gone = np.isnan(x)
        if not gone.any():
            return x, np.zeros((x.shape[0], len(self.missing)))
        new = [c for c, k in zip(self.numeric, gone.sum(axis=0)) if k and c not in self.missing]
        if new:
            log.warning("missing values in numeric %s, which had none in training: read as the "
                        "training mean, without a missing-value feature", new)
        cols = [self.numeric.index(c) for c in self.missing]
        return np.where(gone, 0.0, x), gone[:, cols].astype(np.float64)

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
        df, skeleton = _request_layout(frame, cm)
        n = df.height

        if self.numeric:
            x = (numeric_values(df, cm) - np.asarray(self.mean)) / np.asarray(self.std)
            marks = np.zeros((n, 0))
            if self.nan_policy == "indicator":
                x, marks = self._mark_missing(x)
            elif not np.isfinite(x).all():
                bad = [c for c, ok in zip(self.numeric, np.isfinite(x).all(axis=0)) if not ok]
                raise ValueError(f"Schema.transform: missing/NaN/inf values in numeric {bad}; "
                                 "run validate_frame (nan_policy='fill' to fill them) first")
            if self.bins:
                x = np.concatenate([piecewise_linear(x[:, j], e) for j, e in enumerate(self.bins)], axis=1)
            if marks.shape[1]:
                x = np.concatenate([x, marks], axis=1)
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
            code = self.codes(c, df[c])
            oov[c] = int((code == 0).sum())
            codes.append(code)
        cat = np.stack(codes, axis=1) if codes else np.zeros((n, 0), dtype=np.int64)

        data = dataclasses.replace(
            skeleton,
            num=torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)),
            cat=torch.from_numpy(np.ascontiguousarray(cat, dtype=np.int64)),
            bid=_rows_tensor(df, cm.bid, torch.float32),
            true_p=_rows_tensor(df, cm.true_p, torch.float32),
            explore=None if cm.explore is None else _rows_tensor(df, cm.explore, torch.float32) > 0,
            propensity=_rows_tensor(df, cm.propensity, torch.float32),
            item_key=df[cm.item] if cm.item is not None else None,
        )
        return data, {"oov": oov}




def numeric_values(frame: pl.DataFrame, columns: ColumnMap) -> np.ndarray:
    """The numeric features of a frame, ``[rows, len(columns.numeric)]`` float64, before
    standardising: each column cast to float, the position column (when it is a feature) as
    ``log(position)`` under ``position_transform="log"``. The one reader of numeric features,
    for the scaler's fit and for every transform.

    >>> cm = ColumnMap(request="r", label="y", position="pos", numeric=["pos", "x"])
    >>> numeric_values(pl.DataFrame({"pos": [1, 4], "x": [2, 3]}), cm).round(3).tolist()
    [[0.0, 2.0], [1.386, 3.0]]
    """
    logged = columns.position if columns.position_transform == "log" else None
    return frame.select([pl.col(c).cast(pl.Float64).log() if c == logged else pl.col(c).cast(pl.Float64)
                         for c in columns.numeric]).to_numpy()


def check_numeric_bins(numeric_bins) -> int:
    """``numeric_bins`` as an int: 0 (no piecewise-linear encoding) or at least 2 bins."""
    if isinstance(numeric_bins, bool) or not float(numeric_bins).is_integer() or \
            int(numeric_bins) < 0 or int(numeric_bins) == 1:
        raise ValueError(f"numeric_bins must be 0 (off) or an integer >= 2, got {numeric_bins!r}")
    return int(numeric_bins)


def piecewise_linear(x: np.ndarray, edges: Sequence[float]) -> np.ndarray:
    """The piecewise-linear encoding of one feature (Gorishniy, Rubachev & Babenko 2022):
    ``[N]`` values -> ``[N, K - 1]`` for ``K`` sorted edges, column ``t`` the position of the
    value within bin ``t``: 0 below it, 1 above it, linear inside; the first bin extends below
    the first edge (negative) and the last above the last (over 1), so nothing is cut off. Under
    two edges (a constant training column) the value itself, ``[N, 1]``.

    >>> piecewise_linear(np.array([-1.0, 0.5, 1.5, 3.0]), [0.0, 1.0, 2.0]).tolist()
    [[-1.0, 0.0], [0.5, 0.0], [1.0, 0.5], [1.0, 2.0]]
    """
    e = np.asarray(edges, dtype=np.float64)
    if e.size < 2:
        return x[:, None].astype(np.float64)
    v = (x[:, None] - e[None, :-1]) / np.diff(e)[None, :]
    v[:, 1:] = np.maximum(v[:, 1:], 0.0)
    v[:, :-1] = np.minimum(v[:, :-1], 1.0)
    return v


# ----------------------------------------------------------------------------------------------
# The request layout of a frame (shared by Schema.transform and the sampler's counts)
# ----------------------------------------------------------------------------------------------
def _rows_tensor(df: pl.DataFrame, col: str | None, dtype: torch.dtype) -> torch.Tensor | None:
    if col is None:
        return None
    return torch.from_numpy(np.array(df[col].to_numpy(), copy=True)).to(dtype)


def _request_layout(frame: pl.DataFrame, cm: ColumnMap) -> tuple[pl.DataFrame, ListData]:
    """The frame's rows in request order, and the :class:`ListData` of that order without features.

    Requests are ordered by their first time when a time column is mapped, else by first
    appearance (ties keep first appearance); rows inside a request by position when mapped, else
    input order. Scope ids are dense per frame; ``time`` is each request's first time.
    """
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
    scope = {}
    for name, col in (("session", cm.session), ("user", cm.user)):
        if col is not None:
            ids = req[f"id_{col}"].rank("dense").cast(pl.Int64) - 1
            scope[name] = torch.from_numpy(ids.to_numpy().astype(np.int64))
    n = df.height
    skeleton = ListData(
        num=torch.zeros((n, 0)), cat=torch.zeros((n, 0), dtype=torch.int64),
        label=_rows_tensor(df, cm.label, torch.float32),
        offsets=lengths_to_offsets(lengths),
        scope=scope,
        position=_rows_tensor(df, cm.position, torch.int64),
        request_key=req[_REQ].rename("request"),
        time=(torch.from_numpy(np.array(req["t"].cast(pl.Int64).to_numpy(), copy=True))
              if cm.time else None),
    )
    return df, skeleton


def request_lists(frame: pl.DataFrame, columns: ColumnMap) -> ListData:
    """A frame's requests as :class:`ListData` without features: labels, offsets, positions, the
    session / user scope ids and request times, in the order :meth:`Schema.transform` gives them
    (the same function builds both). What the sampler needs to count pooling units and capped
    negatives before a schema exists (:func:`hybridrank.data.sampler.negative_counts`).

    >>> d = request_lists(pl.DataFrame({"r": [2, 1, 2], "y": [1.0, 0.0, 0.0]}),
    ...                   ColumnMap(request="r", label="y"))
    >>> d.offsets.tolist(), d.label.tolist(), d.num.shape
    ([0, 2, 3], [1.0, 0.0, 0.0], torch.Size([3, 0]))
    """
    return _request_layout(frame, columns)[1]


# ----------------------------------------------------------------------------------------------
# The one schema fit
# ----------------------------------------------------------------------------------------------
class SchemaFit:
    """Fits a :class:`Schema` on training frames given one at a time (chunks of a streamed log, or
    one whole frame: :meth:`Schema.fit`).

    Numeric features: mean and population standard deviation, merged exactly across chunks in
    the pairwise form of Chan, Golub & LeVeque (1979) (with one chunk, numpy's mean and sum of
    squared deviations; across chunks equal to a one-pass fit up to float rounding).
    Vocabulary columns: exact value counts (:class:`~hybridrank.data.vocab.ValueCounter`; only the
    distinct values when the policy keeps them all), so ``min_count`` / ``max_size`` give the same
    vocabulary however the rows are chunked. Hashed columns: which of the ``n`` buckets training
    values fall in (``n + 1`` booleans, bounded like the table itself), reported by
    :func:`~hybridrank.data.vocab.table_report`.

    Args:
        columns: the column map (its numeric and categorical features are fitted).
        label_max: the largest label.
        normalize: standardise numerics (False stores mean 0, std 1).
        numeric_bins: 0, or ``T`` bins of a piecewise-linear encoding per numeric feature
            (:attr:`Schema.bins`): edges at the quantiles of a uniform sample of up to
            :data:`BIN_SAMPLE_ROWS` training rows, the same however the rows are chunked (each
            row's sampling key is drawn in row order from one seeded generator).
        vocab: the ``vocab:`` config node or ``{column: VocabPolicy}``.
        **policies: the value policies recorded in the schema (``POLICY_DEFAULTS`` keys).
    """

    def __init__(self, columns: ColumnMap, label_max: float, *, normalize: bool = True,
                 numeric_bins: int = 0, vocab: Mapping | None = None, **policies):
        unknown = sorted(set(policies) - set(POLICY_DEFAULTS))
        if unknown:
            raise ValueError(f"Schema.fit: unknown policies {unknown}; known {sorted(POLICY_DEFAULTS)}")
        self.columns, self.label_max, self.normalize = columns, float(label_max), normalize
        self.numeric_bins = check_numeric_bins(numeric_bins) if columns.numeric else 0
        # the bins' sample: the rows of the smallest keys so far, keys drawn in row order
        self._keys, self._sample = np.zeros(0), np.zeros((0, len(columns.numeric)))
        self._key_rng = np.random.default_rng(0)
        self.policies = dict(policies)
        self.vocab = vocab_policies(vocab, columns.categorical)
        self.rows = 0
        k = len(columns.numeric)
        # per column: the count of present values, their mean and sum of squared deviations
        self._n, self._mean, self._m2 = np.zeros(k), np.zeros(k), np.zeros(k)
        self._counters = {c: ValueCounter(counts=not p.keeps_all)
                          for c, p in self.vocab.items() if not p.hashed}
        self._buckets = {c: np.zeros(p.hash_buckets + 1, dtype=bool)
                         for c, p in self.vocab.items() if p.hashed}

    def update(self, frame: pl.DataFrame) -> None:
        """Add a (validated) frame of training rows."""
        k = frame.height
        if k == 0:
            return
        num = list(self.columns.numeric)
        if num and (self.normalize or self.numeric_bins or self.policies.get("nan_policy") == "indicator"):
            x = numeric_values(frame, self.columns)
            if self.numeric_bins:
                self._add_to_sample(x)
            gone = np.isnan(x)  # missing values (validated frames have them only as 'indicator')
            if gone.any():
                present = (~gone).sum(axis=0).astype(np.float64)
                mk = np.nansum(x, axis=0) / np.maximum(present, 1.0)
                m2k = np.nansum((x - mk) ** 2, axis=0)
            else:
                present = np.full(len(num), float(k))
                mk = x.mean(axis=0)
                m2k = ((x - mk) ** 2).sum(axis=0)
            delta = mk - self._mean
            tot = self._n + present
            some = tot > 0
            self._mean = self._mean + delta * np.divide(present, tot, out=np.zeros_like(tot), where=some)
            self._m2 = self._m2 + m2k + delta ** 2 * np.divide(self._n * present, tot,
                                                                out=np.zeros_like(tot), where=some)
            self._n = tot
        else:
            self._n = self._n + k
        self.rows += k
        for c, counter in self._counters.items():
            counter.update(frame[c])
        for c, used in self._buckets.items():
            used[hash_codes(frame[c], len(used) - 1)] = True

    def _add_to_sample(self, x: np.ndarray) -> None:
        keys = np.concatenate([self._keys, self._key_rng.random(x.shape[0])])
        rows = np.concatenate([self._sample, x])
        if keys.size > BIN_SAMPLE_ROWS:
            keep = np.argpartition(keys, BIN_SAMPLE_ROWS)[:BIN_SAMPLE_ROWS]
            keys, rows = keys[keep], rows[keep]
        self._keys, self._sample = keys, rows

    def _bin_edges(self, means: Sequence[float], stds: Sequence[float]) -> tuple[tuple[float, ...], ...]:
        """The standardised quantile edges of each numeric feature (repeated values merged)."""
        if not self.numeric_bins:
            return ()
        probs = np.linspace(0.0, 1.0, self.numeric_bins + 1)
        edges = []
        for j in range(self._sample.shape[1]):
            present = self._sample[:, j][~np.isnan(self._sample[:, j])]
            raw = np.unique(np.quantile(present, probs)) if present.size else np.zeros(0)
            edges.append(tuple(float(v) for v in (raw - means[j]) / stds[j]))
        return tuple(edges)

    def finish(self) -> Schema:
        """The fitted schema (logs the embedding-table report)."""
        if self.rows == 0:
            raise ValueError("Schema.fit: no training rows (check the split fractions)")
        num = list(self.columns.numeric)
        if num and self.normalize:
            std = np.sqrt(np.divide(self._m2, self._n, out=np.zeros_like(self._m2), where=self._n > 0))
            means = tuple(float(v) for v in self._mean)
            # a constant column's std is rounding noise (a mean one ulp off the value): 1
            stds = tuple(float(s) if np.isfinite(s) and s > 1e-12 * abs(m) and s > 0 else 1.0
                         for s, m in zip(std, self._mean))
        else:
            means, stds = (0.0,) * len(num), (1.0,) * len(num)
        # the columns with missing training values (present only under nan_policy='indicator')
        missing = tuple(c for c, n in zip(num, self._n) if n < self.rows)
        distinct = {c: counter.frame().height for c, counter in self._counters.items()
                    if not self.vocab[c].keeps_all}
        vocabs = {c: select_vocab(counter.frame(), self.vocab[c])
                  for c, counter in self._counters.items()}
        used = {c: int(u[1:].sum()) for c, u in self._buckets.items()}
        cm = self.columns
        schema = Schema(tuple(num), tuple(cm.categorical), vocabs, means, stds, self.label_max, cm,
                        **self.policies, vocab_policy=self.vocab, missing=missing,
                        bins=self._bin_edges(means, stds))
        if schema.categorical:
            log.info("schema: %s", table_report(schema, distinct, used))
        return schema
