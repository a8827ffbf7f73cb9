"""Click-log reading (parquet / CSV), the column map and types (values are checked in
:mod:`hybridrank.data.validate`).

:func:`scan_clicklog` is the one scanner of click-log files (the in-memory reader
:func:`read_clicklog`, :class:`hybridrank.data.scanner.ClickLogScanner` for streaming and exports use
it); :func:`validate_frame` is the one place where values are checked, for every source (the
LibSVM reader in :mod:`hybridrank.data.libsvm` included). Vectorised polars expressions, never a
Python loop per row, and every error says what is wrong and where: file, 1-based line / row, the
offending value.
"""

from __future__ import annotations

import glob as _glob
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import polars as pl

__all__ = ["ColumnMap", "read_clicklog", "scan_clicklog", "row_location",
           "request_key_expr", "normalize_types", "expand_files", "file_kind", "SOURCE_FILE",
           "SOURCE_ROW"]

log = logging.getLogger(__name__)

#: Columns :func:`read_clicklog` adds so that errors can name the file and 1-based data row.
SOURCE_FILE = "_source_file"
SOURCE_ROW = "_source_row"

_NUMERIC_KINDS = ("label", "bid", "true_p", "explore", "propensity")

#: Default of ``max_request_span`` (seconds): one request id's rows further apart in time than
#: this are a recycled id, not one page.
MAX_REQUEST_SPAN = 3600

#: Calendar features a column map can derive from its time column (``time_features``), each a
#: categorical named ``<time>_<feature>``: the value from int64 epoch seconds, in UTC.
TIME_FEATURES = {
    "hour": lambda t: (t // 3600) % 24,                 # 0..23
    "weekday": lambda t: (t // 86400 + 3) % 7,         # 0 = Monday (1970-01-01 was a Thursday)
}


#: How the mapped position column enters the features when it is a numeric feature
#: (``ColumnMap.position_transform``): ``log`` or ``identity``.
POSITION_TRANSFORMS = ("log", "identity")


# ----------------------------------------------------------------------------------------------
# Column map
# ----------------------------------------------------------------------------------------------
@dataclass
class ColumnMap:
    """Which column of a click log plays which role (built from the ``columns:`` config node).

    Attributes:
        request: the request id column, or a list of columns whose combination is the request id
            (a pseudo-request, e.g. hashed user features for logs without request ids).
        label: the label column (clicks 0/1 or graded relevance).
        session, user: optional scope ids (pooling scopes for pseudo-pairs).
        time: optional timestamp (int/float seconds, datetime, or an ISO datetime string; read as
            int64 epoch seconds, fractions of a second floored).
        position: optional 1-based display position.
        item: optional item id (kept as ``item_key`` for exports).
        bid: optional bid (for eCPM = bid x pCTR).
        true_p: optional true click probability (simulated data).
        explore: optional 0/1 (or boolean) column marking impressions of exploration requests,
            shown in random order (constant within a request): a position-bias tower estimates
            its offsets from them (docs/EXPORT.md, "Position bias").
        propensity: optional probability, in ``(0, 1]``, that the logging policy put the item in
            its slot: a position-bias tower weights its offsets' sums by its inverse.
        numeric: numeric feature columns (standardised with train statistics).
        categorical: categorical feature columns (vocabulary from train, 0 = out of vocabulary).
        request_time_bucket: seconds; when set, the request id is ``request`` x ``floor(time /
            request_time_bucket)`` (needs ``time``), e.g. 86400 for "same user features, same day".
        time_features: calendar features derived from ``time`` (:data:`TIME_FEATURES`:
            ``hour``, ``weekday``; UTC), each a categorical feature named ``<time>_<feature>``
            that is appended to ``categorical`` (and computed again when a model scores a new
            file). A weekly or daily cycle in the click rate is then something the model can
            learn instead of a level it averages over (docs/BENCHMARKS.md, "Time features").
            The names are reserved: a file column of the same name is not read.
        position_transform: how the ``position`` column enters the features when it is also
            listed in ``numeric`` (position as a feature): ``"log"`` (the default) reads it as
            ``log(position)`` before standardising, ``"identity"`` as it is. Click rates fall
            steeply over the first slots and flatten deep in a list: standardised raw positions
            of long lists put slots 1 and 2 a few hundredths of a standard deviation apart, and
            a scorer smooths the top slots' effect away (docs/BENCHMARKS.md, "Position modes").
            Schemas stored without the key read ``"identity"`` (how they were trained).
    """

    request: str | list[str]
    label: str
    session: str | None = None
    user: str | None = None
    time: str | None = None
    position: str | None = None
    item: str | None = None
    bid: str | None = None
    true_p: str | None = None
    explore: str | None = None
    propensity: str | None = None
    numeric: list[str] = field(default_factory=list)
    categorical: list[str] = field(default_factory=list)
    request_time_bucket: int | None = None
    time_features: list[str] = field(default_factory=list)
    position_transform: str = "log"

    def __post_init__(self) -> None:
        if not isinstance(self.request, str):
            self.request = [str(c) for c in self.request]
            if not self.request:
                raise ValueError("ColumnMap.request: an empty list of columns")
        self.numeric = [str(c) for c in self.numeric]
        self.categorical = [str(c) for c in self.categorical]
        if self.request_time_bucket is not None:
            if self.time is None:
                raise ValueError("ColumnMap.request_time_bucket needs a `time` column")
            if int(self.request_time_bucket) <= 0:
                raise ValueError(f"request_time_bucket must be > 0 seconds, got "
                                 f"{self.request_time_bucket}")
            self.request_time_bucket = int(self.request_time_bucket)
        self.time_features = [str(c) for c in (self.time_features or [])]
        unknown = [c for c in self.time_features if c not in TIME_FEATURES]
        if unknown:
            raise ValueError(f"time_features {unknown} unknown; choose from {sorted(TIME_FEATURES)}")
        if len(set(self.time_features)) != len(self.time_features):
            raise ValueError(f"time_features lists a feature twice: {self.time_features}")
        if self.time_features and self.time is None:
            raise ValueError(f"time_features {self.time_features} need a `time` column")
        if self.position_transform not in POSITION_TRANSFORMS:
            raise ValueError(f"ColumnMap.position_transform={self.position_transform!r}; choose "
                             f"from {list(POSITION_TRANSFORMS)}")
        # derived categoricals join the features (once: a stored map already lists them)
        self.categorical += [c for c in self.derived_columns() if c not in self.categorical]
        overlap = set(self.numeric) & set(self.categorical)
        if overlap:
            raise ValueError(f"columns both numeric and categorical: {sorted(overlap)}")

    @property
    def request_columns(self) -> list[str]:
        return [self.request] if isinstance(self.request, str) else list(self.request)

    def derived_columns(self) -> dict[str, str]:
        """``{column name: time feature}`` of the categoricals computed from ``time``."""
        return {f"{self.time}_{f}": f for f in self.time_features}

    def source_columns(self) -> list[str]:
        """Every mapped column name the files must hold, each once, in a stable order (derived
        time features are computed, not read)."""
        derived = self.derived_columns()
        names = [*self.request_columns, self.label, self.session, self.user, self.time,
                 self.position, self.item, self.bid, self.true_p, self.explore, self.propensity,
                 *self.numeric, *(c for c in self.categorical if c not in derived)]
        return list(dict.fromkeys(n for n in names if n is not None))

    def to_dict(self) -> dict:
        d = asdict(self)
        if not isinstance(d["request"], str):
            d["request"] = list(d["request"])
        return d

    @classmethod
    def from_dict(cls, mapping: Mapping) -> ColumnMap:
        """Build from a dict / ``DictConfig``; unknown keys are an error (typos are not ignored)."""
        valid = {f.name for f in fields(cls)}
        d = {str(k): v for k, v in dict(mapping).items()}
        unknown = sorted(set(d) - valid)
        if unknown:
            raise ValueError(f"unknown ColumnMap keys {unknown}; valid keys: {sorted(valid)}")
        for k in ("numeric", "categorical"):
            if d.get(k) is not None:
                d[k] = list(d[k])
            else:
                d.pop(k, None)
        if d.get("request") is not None and not isinstance(d["request"], str):
            d["request"] = list(d["request"])
        missing = [k for k in ("request", "label") if d.get(k) is None]
        if missing:
            raise ValueError(f"ColumnMap needs {missing}")
        return cls(**d)


def request_key_expr(columns: ColumnMap) -> pl.Expr:
    """The request id as one polars expression (a column, or a composite string key)."""
    cols = columns.request_columns
    if len(cols) == 1 and columns.request_time_bucket is None:
        return pl.col(cols[0])
    parts = [pl.col(c).cast(pl.String) for c in cols]
    if columns.request_time_bucket is not None:
        parts.append((pl.col(columns.time) // columns.request_time_bucket).cast(pl.String))
    return pl.concat_str(parts, separator="|")


def _decode_utf8(path: Path, raw: bytes, what: str) -> str:
    """``raw`` as text, or a ValueError naming the file, line and byte offset of the first bad byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        bad = raw[e.start:e.start + 4]
        raise ValueError(f"{path}: line {line}: bytes that are not UTF-8 ({bad!r} at byte offset "
                         f"{e.start}); {what} must be UTF-8 or ASCII text") from None


# ----------------------------------------------------------------------------------------------
# Click logs
# ----------------------------------------------------------------------------------------------
def row_location(frame: pl.DataFrame, i: int) -> str:
    """Human location of row ``i`` of a frame from one of the readers."""
    cols = frame.columns
    if SOURCE_FILE in cols and "line" in cols:
        return f"{frame[SOURCE_FILE][i]} line {frame['line'][i]}"
    if SOURCE_FILE in cols and SOURCE_ROW in cols:
        return f"{frame[SOURCE_FILE][i]} row {frame[SOURCE_ROW][i]}"
    if "line" in cols:
        return f"line {frame['line'][i]}"
    return f"row {i + 1}"


def _cast_checked(frame: pl.DataFrame, col: str, dtype: pl.DataType, what: str) -> pl.Expr:
    """A cast of ``col`` to ``dtype`` that raises a ValueError naming column, count and row."""
    s = frame[col]
    if s.dtype == dtype:
        return pl.col(col)
    if not (s.dtype.is_numeric() or s.dtype == pl.Boolean or s.dtype == pl.String):
        raise ValueError(f"{what} column {col!r} has type {s.dtype}, cannot be read as {dtype}")
    cast = s.cast(dtype, strict=False)
    bad = cast.is_null() & s.is_not_null()
    if dtype == pl.Int64 and s.dtype.is_float():
        bad = bad | (s.is_not_null() & ~s.is_nan() & (s != s.floor()))
    n_bad = int(bad.sum())
    if n_bad:
        i = int(bad.arg_true()[0])
        raise ValueError(f"{what} column {col!r} ({s.dtype}) cannot be read as {dtype}: {n_bad} "
                         f"value(s), first {s[i]!r} at {row_location(frame, i)}")
    return pl.col(col).cast(dtype)


def _time_expr(frame: pl.DataFrame, col: str) -> pl.Expr:
    """Timestamp column -> int64 epoch seconds (datetime, date, numbers, or datetime strings)."""
    s = frame[col]
    if s.dtype == pl.Datetime or isinstance(s.dtype, pl.Datetime):
        return pl.col(col).dt.epoch("s")
    if s.dtype == pl.Date:
        return pl.col(col).cast(pl.Datetime("ms")).dt.epoch("s")
    if s.dtype.is_integer():
        return pl.col(col).cast(pl.Int64)
    if s.dtype.is_float():
        return pl.col(col).floor().cast(pl.Int64)
    if s.dtype == pl.String:
        as_num = s.cast(pl.Float64, strict=False)
        if as_num.null_count() == s.null_count():
            return pl.col(col).cast(pl.Float64).floor().cast(pl.Int64)
        parsed = s.str.to_datetime(strict=False, time_zone="UTC")
        bad = parsed.is_null() & s.is_not_null()
        if bad.any():
            i = int(bad.arg_true()[0])
            raise ValueError(f"time column {col!r}: {int(bad.sum())} value(s) are neither numbers "
                             f"nor datetimes, first {s[i]!r} at {row_location(frame, i)}")
        return pl.col(col).str.to_datetime(strict=False, time_zone="UTC").dt.epoch("s")
    raise ValueError(f"time column {col!r} has type {s.dtype}; expected numbers or datetimes")


def expand_files(path_or_glob: str | Path | list | tuple) -> list[str]:
    """The click-log files named by a path, a glob (``*``, ``?``, ``[``; sorted) or a list of paths.

    Raises:
        FileNotFoundError: a glob matches nothing, or a named file does not exist.
    """
    if isinstance(path_or_glob, list | tuple):
        files = [str(p) for p in path_or_glob]
    elif any(ch in str(path_or_glob) for ch in "*?["):
        files = sorted(_glob.glob(str(path_or_glob), recursive=True))
        if not files:
            raise FileNotFoundError(f"no click-log files match the glob {str(path_or_glob)!r}")
    else:
        files = [str(path_or_glob)]
    for f in files:
        if not Path(f).is_file():
            raise FileNotFoundError(f"click-log file not found: {f}")
    return files


def file_kind(files: list[str], pattern: str = "") -> str:
    """``"parquet"`` or ``"csv"`` for a list of click-log files (all of one kind, by suffix)."""
    kinds = {"parquet" if f.lower().endswith((".parquet", ".pq")) else
             "csv" if f.lower().endswith((".csv", ".csv.gz")) else f for f in files}
    unknown = kinds - {"parquet", "csv"}
    if unknown or len(kinds) != 1:
        raise ValueError(f"{pattern or files[0]}: click logs must be all .parquet or all .csv, got "
                         f"{sorted(unknown) or sorted(kinds)}")
    return kinds.pop()


def scan_clicklog(files: list[str], columns: ColumnMap, *, pattern: str = "",
                  require: list[str] | None = None) -> pl.LazyFrame:
    """The one click-log scanner: a lazy frame of the mapped columns of parquet or CSV files.

    Adds ``_source_file`` (the file of each row) so later errors can name it. CSV columns of
    numeric roles are read as text and cast by :func:`normalize_types`, whose errors name the
    bad value; the other CSV columns are inferred from the first 10,000 rows.

    Args:
        files: the files (:func:`expand_files`), all parquet or all CSV.
        columns: the column map; every mapped column is selected.
        pattern: the user's path or glob, for messages.
        require: the columns that must exist (default: every mapped column).

    Raises:
        ValueError: mixed or unknown file kinds; a required column missing (the message lists
            the columns the file has).
    """
    kind = file_kind(files, pattern)
    if kind == "parquet":
        lf = pl.scan_parquet(files, include_file_paths=SOURCE_FILE)
    else:
        text_roles = [*columns.numeric, columns.label, columns.position, columns.bid,
                      columns.true_p, columns.explore, columns.propensity, columns.time]
        lf = pl.scan_csv(files, include_file_paths=SOURCE_FILE, infer_schema_length=10_000,
                         schema_overrides={c: pl.String for c in text_roles if c is not None})
    existing = [c for c in lf.collect_schema().names() if c != SOURCE_FILE]
    wanted = columns.source_columns() if require is None else require
    missing = [c for c in wanted if c not in existing]
    if missing:
        raise ValueError(f"{pattern or files[0]}: mapped column(s) {missing} not found; the file "
                         f"has columns {existing}")
    return lf.select(*[c for c in columns.source_columns() if c in existing], SOURCE_FILE)


def read_clicklog(path_or_glob: str | Path | list, columns: ColumnMap) -> pl.DataFrame:
    """Read a click log (parquet or CSV by suffix; one file or a glob) selecting mapped columns.

    Types are normalised: label, numeric features, bid and true_p to float64, position to int64,
    time to int64 epoch seconds; ids and categoricals keep their type. Two bookkeeping columns,
    ``_source_file`` and ``_source_row`` (1-based data row in that file), let later errors say
    where a value came from. Values are checked by :func:`validate_frame`, not here.

    Raises:
        FileNotFoundError: no such file / no file matches the glob.
        ValueError: unsupported suffix; mapped columns missing (the message lists the missing
            names and the columns that exist); a column that cannot be cast to its role's type
            (naming column, count, first value and where).
    """
    pattern = str(path_or_glob)
    files = expand_files(path_or_glob)
    try:
        frame = (
            scan_clicklog(files, columns, pattern=pattern)
            .with_columns((pl.int_range(pl.len()).over(SOURCE_FILE) + 1).alias(SOURCE_ROW),
                          pl.col(SOURCE_FILE).cast(pl.Categorical))
            .collect()
        )
    except pl.exceptions.PolarsError as e:
        _raise_read_error(files, pattern, e)
    return normalize_types(frame, columns)


def _raise_read_error(files: list[str], pattern: str, e: Exception):
    """Re-raise a polars read error as a ValueError naming the file (and line, for bad UTF-8)."""
    if file_kind(files, pattern) == "csv" and "utf-8" in str(e).lower():
        import gzip

        for f in files:  # only on this error path: find the file and line to name
            raw = Path(f).read_bytes()
            _decode_utf8(Path(f), gzip.decompress(raw) if f.lower().endswith(".gz") else raw,
                         "CSV click logs")
    raise ValueError(f"{pattern}: cannot read click log: {e}") from e


def normalize_types(frame: pl.DataFrame, columns: ColumnMap) -> pl.DataFrame:
    """Cast mapped columns to their types, with an error naming a column that cannot be cast.

    One cast per column; a role's type wins over "numeric feature" (e.g. position stays int64,
    the schema turns numeric features into float at transform time); time becomes epoch seconds.
    Mapped columns the frame does not have are left alone (the readers refuse missing required
    columns before this point; exports of unlabeled files have no label column).
    """
    have = set(frame.columns)
    casts = {c: _cast_checked(frame, c, pl.Float64, "numeric feature")
             for c in columns.numeric if c in have}
    for role in _NUMERIC_KINDS:
        col = getattr(columns, role)
        if col is not None and col in have:
            casts[col] = _cast_checked(frame, col, pl.Float64, role)
    if columns.position is not None and columns.position in have:
        casts[columns.position] = _cast_checked(frame, columns.position, pl.Int64, "position")
    if columns.time is not None and columns.time in have:
        casts[columns.time] = _time_expr(frame, columns.time)
    out = frame.with_columns(e.alias(c) for c, e in casts.items()) if casts else frame
    derived = columns.derived_columns()
    if derived and columns.time in have:
        t = pl.col(columns.time)
        out = out.with_columns(TIME_FEATURES[f](t).alias(c) for c, f in derived.items())
    return out
