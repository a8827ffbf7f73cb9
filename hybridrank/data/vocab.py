"""How a categorical column becomes integer codes: a vocabulary (minimum count, size cap) or hashed
buckets, and what either costs in embedding memory.

The ``vocab:`` node of a click-log source (``conf/data/clicklog.yaml``) sets a policy per column::

    vocab:
      min_count: 1        # every column: values seen fewer times in training go to code 0
      max_size: null      # every column: keep the max_size most frequent values (null: all)
      hash_buckets: {}    # {column: n}: no vocabulary, code = 1 + stable_hash(value) mod n
      columns: {}         # per-column overrides: {user_id: {min_count: 5, max_size: 1000000}}

**Vocabulary columns** keep the training values that pass the policy as a sorted tuple of strings;
value ``vocab[k]`` has code ``k + 1`` and code 0 is out-of-vocabulary (unseen, dropped by the
policy, or missing). With ``max_size`` the most frequent values are kept; among values with equal
counts the smaller string (code-point order, which is UTF-8 byte order) is kept, so the choice is
deterministic and the same for an in-memory and a streamed fit. ``min_count`` is applied first
(the two commute). The defaults keep every training value: the codes of earlier versions.

**Hashed columns** store no vocabulary: code = ``1 + (stable_hash(str(value)) mod n)`` with
:func:`hybridrank.data.hashing.stable_hash` (seed 0; the same on every machine), 0 for a missing value.
Memory is O(n) whatever the number of distinct values, and a value never seen in training still
gets a trained row, shared with the training values of its bucket. Collisions are the price: with
``D`` distinct values in ``n`` buckets, a value shares its bucket with another with probability
``1 - (1 - 1/n)^(D - 1)`` (~ ``D / n`` when small; :func:`collision_share`). The fit records which
buckets the training values use (``n + 1`` booleans, no per-value state) and logs the used count,
the distinct count it implies (:func:`distinct_from_buckets`) and that share.

**Memory of an embedding table**: ``rows x dim x 4`` bytes in float32, ``rows = V + 1`` (``n + 1``
for a hashed column); Adam keeps two moment buffers of the same shape, so training holds ``3x``
that. :func:`table_report` logs the rows of every table when a schema is fitted.

References: the hashing trick, Weinberger et al. 2009, "Feature Hashing for Large Scale Multitask
Learning"; linear counting, Whang, Vander-Zanden & Taylor 1990, "A Linear-Time Probabilistic
Counting Algorithm for Database Applications" (the distinct count from the used buckets).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from hybridrank.data.hashing import stable_hash

__all__ = ["VocabPolicy", "vocab_policies", "select_vocab", "ValueCounter", "VocabIndex",
           "hash_codes", "collision_share", "distinct_from_buckets", "table_bytes", "table_report"]

log = logging.getLogger(__name__)

#: The keys of the ``vocab:`` config node, and those a per-column override may set.
VOCAB_KEYS = ("min_count", "max_size", "hash_buckets", "columns")
COLUMN_KEYS = ("min_count", "max_size")

#: Values hashed at a time (``stable_hash`` needs ~40 bytes of scratch per byte of string data).
_HASH_BLOCK = 1 << 20


def _count(value, what: str, *, optional: bool = False) -> int | None:
    """A positive int (or None when optional), else a ValueError naming ``what``."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{what} must be a positive integer{' or null' if optional else ''}, "
                         f"got {value!r}")
    return int(value)


@dataclass(frozen=True)
class VocabPolicy:
    """The policy of one categorical column.

    Args:
        min_count: values seen fewer times in training get code 0.
        max_size: keep at most this many values, the most frequent (ties: the smaller string).
        hash_buckets: hash into this many buckets instead (then no vocabulary; the other two
            must stay at their defaults).

    >>> VocabPolicy(hash_buckets=8).hashed, VocabPolicy().hashed
    (True, False)
    """

    min_count: int = 1
    max_size: int | None = None
    hash_buckets: int | None = None

    def __post_init__(self):
        _count(self.min_count, "vocab min_count")
        _count(self.max_size, "vocab max_size", optional=True)
        _count(self.hash_buckets, "vocab hash_buckets", optional=True)
        if self.hashed and (self.min_count != 1 or self.max_size is not None):
            raise ValueError("a hashed column has no vocabulary: min_count / max_size do not "
                             f"apply (got {self})")

    @property
    def hashed(self) -> bool:
        return self.hash_buckets is not None

    @property
    def keeps_all(self) -> bool:
        """True when every training value is kept (no counts needed)."""
        return not self.hashed and self.min_count == 1 and self.max_size is None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> VocabPolicy:
        unknown = sorted(set(d) - {"min_count", "max_size", "hash_buckets"})
        if unknown:
            raise ValueError(f"vocab policy: unknown keys {unknown}")
        return cls(**dict(d))


def vocab_policies(config: Mapping | None, categorical: Sequence[str],
                   where: str = "vocab") -> dict[str, VocabPolicy]:
    """Parse a ``vocab:`` config node into one :class:`VocabPolicy` per categorical column.

    Unknown keys, columns that are not categorical features, a column both hashed and overridden,
    and values that are not positive integers are errors naming what and where.

    Args:
        config: ``{min_count, max_size, hash_buckets: {column: n}, columns: {column: {min_count,
            max_size}}}`` (every key optional), None for the defaults, or already parsed
            ``{column: VocabPolicy}`` (columns left out get the default).
        categorical: the categorical feature columns of the column map.

    >>> p = vocab_policies({"min_count": 2, "hash_buckets": {"ad": 64}}, ["user", "ad"])
    >>> p["user"], p["ad"].hash_buckets
    (VocabPolicy(min_count=2, max_size=None, hash_buckets=None), 64)
    """
    cats = [str(c) for c in categorical]
    if config and all(isinstance(v, VocabPolicy) for v in config.values()):
        bad = sorted(set(config) - set(cats))
        if bad:
            raise ValueError(f"{where}: policies for {bad}, which are not categorical feature "
                             f"columns; the categorical columns are {cats}")
        return {c: config.get(c, VocabPolicy()) for c in cats}
    d = dict(config or {})
    unknown = sorted(set(d) - set(VOCAB_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; valid: {list(VOCAB_KEYS)}")

    def columns_of(node, key: str) -> dict:
        if node is None:
            return {}
        if not isinstance(node, Mapping):
            raise ValueError(f"{where}.{key} must be a mapping {{column: ...}}, got {node!r}")
        node = {str(k): v for k, v in node.items()}
        bad = sorted(set(node) - set(cats))
        if bad:
            raise ValueError(f"{where}.{key}: {bad} are not categorical feature columns; the "
                             f"categorical columns are {cats}")
        return node

    min_count = _count(d.get("min_count", 1), f"{where}.min_count")
    max_size = _count(d.get("max_size"), f"{where}.max_size", optional=True)
    hashed = {c: _count(n, f"{where}.hash_buckets.{c}")
              for c, n in columns_of(d.get("hash_buckets"), "hash_buckets").items()}
    overrides = columns_of(d.get("columns"), "columns")
    both = sorted(set(hashed) & set(overrides))
    if both:
        raise ValueError(f"{where}: {both} are hashed (hash_buckets) and also have a vocabulary "
                         "override (columns); a hashed column has no vocabulary")
    out = {}
    for c in cats:
        if c in hashed:
            out[c] = VocabPolicy(hash_buckets=hashed[c])
            continue
        o = overrides.get(c) or {}
        if not isinstance(o, Mapping):
            raise ValueError(f"{where}.columns.{c} must be a mapping, got {o!r}")
        bad = sorted(set(o) - set(COLUMN_KEYS))
        if bad:
            raise ValueError(f"{where}.columns.{c}: unknown keys {bad}; valid: {list(COLUMN_KEYS)}")
        out[c] = VocabPolicy(
            min_count=_count(o.get("min_count", min_count), f"{where}.columns.{c}.min_count"),
            max_size=_count(o.get("max_size", max_size), f"{where}.columns.{c}.max_size",
                            optional=True))
    return out


# ----------------------------------------------------------------------------------------------
# Vocabulary columns: counting and selecting
# ----------------------------------------------------------------------------------------------
def _strings(values: pl.Series) -> pl.Series:
    return values.cast(pl.String).drop_nulls()


def select_vocab(values: pl.Series | pl.DataFrame, policy: VocabPolicy) -> tuple[str, ...]:
    """The sorted vocabulary a policy keeps.

    Args:
        values: the training values of the column (any dtype; compared by their string form,
            missing values ignored), or their counts as a frame ``{"value": str, "count": int}``.
        policy: a vocabulary (not hashed) policy.

    Returns:
        The kept values in ascending string order: values with ``count >= min_count``, then, past
        ``max_size``, the most frequent first, the smaller string first among equal counts.

    >>> select_vocab(pl.Series(["b", "a", "b", "c", "c", None]), VocabPolicy(max_size=1))
    ('b',)
    """
    if policy.hashed:
        raise ValueError("select_vocab: a hashed column has no vocabulary")
    if isinstance(values, pl.Series):
        if policy.keeps_all:
            return tuple(_strings(values).unique().sort().to_list())
        counts = _strings(values).rename("value").value_counts(name="count")
    else:
        counts = values
    if "count" not in counts.columns:  # unique values only (a keep-all counter)
        kept = counts
    else:
        kept = counts.filter(pl.col("count") >= policy.min_count)
        if policy.max_size is not None and kept.height > policy.max_size:
            kept = kept.sort(["count", "value"], descending=[True, False]).head(policy.max_size)
    return tuple(kept["value"].sort().to_list())


class ValueCounter:
    """Exact counts of a column's values over chunks, held as polars columns (not Python sets).

    Each chunk's ``value_counts`` is appended; the parts are merged (``group_by`` + sum) whenever
    they hold twice the rows of the last merge, so memory stays within ~3x the distinct values
    (a string view of 16 bytes, plus the bytes of strings over 12 bytes, plus an 8-byte count,
    each) and the merge work is amortised. A keep-all policy needs no counts: then only the unique
    values are kept.

    >>> c = ValueCounter()
    >>> c.update(pl.Series(["a", "b", "a"])); c.update(pl.Series(["b", None, "c"]))
    >>> sorted(c.frame().iter_rows())
    [('a', 2), ('b', 2), ('c', 1)]
    """

    def __init__(self, counts: bool = True, min_merge: int = 1 << 16):
        self.counts = counts
        self._parts: list[pl.DataFrame] = []
        self._rows = 0
        self._merged = 0
        self._min_merge = int(min_merge)

    def update(self, values: pl.Series) -> None:
        s = _strings(values).rename("value")
        part = (s.value_counts(name="count").with_columns(pl.col("count").cast(pl.Int64))
                if self.counts else s.unique().to_frame())
        self._parts.append(part)
        self._rows += part.height
        if self._rows > 2 * max(self._merged, self._min_merge):
            self._merge()

    def _merge(self) -> None:
        df = pl.concat(self._parts)
        df = (df.group_by("value").agg(pl.col("count").sum()) if self.counts else df.unique())
        self._parts, self._rows, self._merged = [df], df.height, df.height

    def frame(self) -> pl.DataFrame:
        """``{"value", "count"}`` (or ``{"value"}`` without counts), one row per distinct value."""
        if not self._parts:
            schema = {"value": pl.String, **({"count": pl.Int64} if self.counts else {})}
            return pl.DataFrame(schema=schema)
        if len(self._parts) > 1:
            self._merge()
        return self._parts[0]


class VocabIndex:
    """Codes of a vocabulary column. A chunk at least as long as the vocabulary is mapped by a
    hash join against it (``O(B + V)``; ~3x faster than the search on millions of rows); a
    shorter one by a binary search over the vocabulary, held once as a sorted polars column
    (``O(B log V)``, so small chunks never pay for hashing a large vocabulary). Both give the
    same codes.

    >>> VocabIndex(("a", "c")).codes(pl.Series(["c", "b", None, "a"])).tolist()
    [2, 0, 0, 1]
    """

    def __init__(self, vocab: Sequence[str]):
        s = pl.Series("value", list(vocab), dtype=pl.String)
        self.perm: np.ndarray | None = None
        if not s.is_sorted():  # a hand-built vocabulary: search a sorted copy, map back
            order = s.arg_sort()
            s, self.perm = s.gather(order), order.to_numpy().astype(np.int64)
        self.values = s
        self._table: pl.DataFrame | None = None  # value -> code, for the join (built on first use)

    def __len__(self) -> int:
        return len(self.values)

    def _joined(self, q: pl.Series) -> np.ndarray:
        if self._table is None:
            k = np.arange(1, len(self.values) + 1, dtype=np.int64)
            # the sorted copy's codes, first occurrence kept (as the search's side="left")
            self._table = pl.DataFrame({"__v": self.values, "__k": k if self.perm is None else self.perm + 1}) \
                .unique(subset="__v", keep="first", maintain_order=True)
        codes = pl.DataFrame({"__v": q}).join(self._table, on="__v", how="left", maintain_order="left")["__k"]
        return codes.fill_null(0).to_numpy().astype(np.int64, copy=False)

    def codes(self, values: pl.Series) -> np.ndarray:
        """``[N]`` int64: ``k + 1`` for ``vocab[k]``, 0 for values not in it and missing ones."""
        n = len(self.values)
        if n == 0:
            return np.zeros(len(values), dtype=np.int64)
        q = values.cast(pl.String)
        if len(q) >= n:
            return self._joined(q)
        idx = self.values.search_sorted(q, side="left").cast(pl.Int64)
        hit = (self.values.gather(idx.clip(0, n - 1)) == q).fill_null(False) & (idx < n)
        pos = idx.clip(0, n - 1).to_numpy()
        k = pos if self.perm is None else self.perm[pos]
        return np.where(hit.to_numpy(), k + 1, 0).astype(np.int64)


# ----------------------------------------------------------------------------------------------
# Hashed columns
# ----------------------------------------------------------------------------------------------
def hash_codes(values: pl.Series, buckets: int) -> np.ndarray:
    """``[N]`` int64 codes of a hashed column: ``1 + stable_hash(value) mod buckets``, 0 if missing.

    Hashes ``2^20`` values at a time, so scratch memory stays bounded on long columns.

    >>> hash_codes(pl.Series([None, "a"]), 4)[0], 1 <= hash_codes(pl.Series(["a"]), 4)[0] <= 4
    (np.int64(0), np.True_)
    """

    n = len(values)
    out = np.zeros(n, dtype=np.int64)
    for start in range(0, n, _HASH_BLOCK):
        part = values.slice(start, _HASH_BLOCK)
        h = stable_hash(part) % np.uint64(buckets)
        out[start: start + len(part)] = h.astype(np.int64) + 1
    if values.null_count():
        out[values.is_null().to_numpy()] = 0
    return out


def collision_share(distinct: float, buckets: int) -> float:
    """Expected share of ``distinct`` values that share their bucket with at least one other:
    ``1 - (1 - 1/n)^(D - 1)`` for ``D`` values hashed uniformly into ``n`` buckets.

    >>> round(collision_share(1000, 1_000_000), 4), round(collision_share(2, 2), 2)
    (0.001, 0.5)
    """
    if distinct <= 1:
        return 0.0
    return float(-math.expm1((distinct - 1) * math.log1p(-1.0 / buckets))) if buckets > 1 else 1.0


def distinct_from_buckets(used: int, buckets: int) -> float:
    """Distinct values implied by ``used`` of ``buckets`` occupied buckets (linear counting, Whang
    et al. 1990): ``D = ln(1 - used / n) / ln(1 - 1 / n)``, the inverse of the expected occupancy
    ``n (1 - (1 - 1/n)^D)``. ``inf`` when every bucket is used (the count is then only known to be
    large compared with ``n``). Nearly exact while ``D`` is small compared with ``n``.

    >>> distinct_from_buckets(0, 64), round(distinct_from_buckets(10, 1_000_000), 3)
    (0.0, 10.0)
    >>> distinct_from_buckets(64, 64)
    inf
    """
    if used <= 0:
        return 0.0
    if used >= buckets:
        return math.inf
    if buckets == 1:
        return 1.0
    return float(math.log1p(-used / buckets) / math.log1p(-1.0 / buckets))


def table_bytes(rows: int, dim: int, optimizer_states: int = 2) -> int:
    """Bytes of one float32 embedding table while training: ``rows x dim x 4 x (1 + states)``
    (Adam keeps 2 moment buffers, SGD without momentum 0).

    >>> table_bytes(2**20, 16) / 2**20  # MiB of a 2^20-row table of dim 16 trained with Adam
    192.0
    """
    return int(rows) * int(dim) * 4 * (1 + int(optimizer_states))


def table_report(schema, distinct: Mapping[str, int] | None = None,
                 buckets_used: Mapping[str, int] | None = None) -> str:
    """One line per categorical column: its policy, embedding rows and what the fit saw; then the
    float32 bytes per embedding dimension over all tables (``x dim``; ``x 3`` while training with
    Adam).

    Args:
        schema: a fitted :class:`~hybridrank.data.schema.Schema`.
        distinct: ``{column: exact count}`` of distinct train values of vocabulary columns whose
            policy drops some (the fit's value counts).
        buckets_used: ``{column: buckets}`` of hashed columns: how many of the ``n`` buckets the
            training values fall in; the line adds the distinct count this implies
            (:func:`distinct_from_buckets`) and the expected share of values sharing a bucket.
    """
    distinct, used = dict(distinct or {}), dict(buckets_used or {})
    lines, rows_total = [], 0
    for c, v in zip(schema.categorical, schema.vocab_sizes):
        p = schema.vocab_policy[c]
        rows_total += v + 1
        if p.hashed:
            line = f"{c}: hashed into {v:,} buckets, {v + 1:,} rows"
            if c in used:
                k = used[c]
                d = distinct_from_buckets(k, v)
                if math.isinf(d):
                    line += (f"; training values use all {v:,} buckets: they outnumber the buckets "
                             f"(linear counting saturates), most values share a bucket")
                else:
                    line += (f"; training values use {k:,} of them, ~{d:,.0f} distinct values "
                             f"(linear counting); expected share of values sharing a bucket "
                             f"{collision_share(d, v):.1%}")
        else:
            seen = f" of {distinct[c]:,} distinct train values" if c in distinct else ""
            rule = "" if p.keeps_all else f" (min_count {p.min_count}, max_size {p.max_size})"
            line = f"{c}: vocabulary of {v:,} values{seen}{rule}, {v + 1:,} rows"
        lines.append(line)
    per_dim = rows_total * 4
    lines.append(f"embedding tables: {rows_total:,} rows in all = {per_dim / 2**20:.2f} MiB per "
                 "embedding dimension in float32 (rows x dim x 4 bytes; x3 while training with "
                 "Adam)")
    return "; ".join(lines)
