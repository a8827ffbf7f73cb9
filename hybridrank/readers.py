"""Readers for LibSVM/LETOR text and parquet/CSV click logs, the column map, and validation.

Both readers return a polars frame; :func:`validate_frame` (the one place where values are
checked) and :class:`hybridrank.data.Schema` turn it into ``ListData``. Every reader is vectorised
(polars expressions and numpy scatter), never a Python loop per line or per row, and every error
says what is wrong and where: file, 1-based line / row, the offending text.
"""

from __future__ import annotations

import glob as _glob
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import polars as pl

__all__ = ["ColumnMap", "read_libsvm", "read_clicklog", "scan_clicklog", "validate_frame",
           "request_key_expr", "normalize_types", "expand_files", "file_kind", "SOURCE_FILE",
           "SOURCE_ROW"]

log = logging.getLogger(__name__)

#: Columns :func:`read_clicklog` adds so that errors can name the file and 1-based data row.
SOURCE_FILE = "_source_file"
SOURCE_ROW = "_source_row"

_NUMERIC_KINDS = ("label", "bid", "true_p")

#: read_libsvm without n_features refuses a dense matrix larger than this (2 GiB of float64):
#: a stray huge index (a typo) would otherwise allocate rows x index values.
MAX_DENSE_CELLS = 1 << 28

#: Default of ``max_request_span`` (seconds): one request id's rows further apart in time than
#: this are a recycled id, not one page.
MAX_REQUEST_SPAN = 3600


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
        numeric: numeric feature columns (standardised with train statistics).
        categorical: categorical feature columns (vocabulary from train, 0 = out of vocabulary).
        request_time_bucket: seconds; when set, the request id is ``request`` x ``floor(time /
            request_time_bucket)`` (needs ``time``), e.g. 86400 for "same user features, same day".
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
    numeric: list[str] = field(default_factory=list)
    categorical: list[str] = field(default_factory=list)
    request_time_bucket: int | None = None

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
        overlap = set(self.numeric) & set(self.categorical)
        if overlap:
            raise ValueError(f"columns both numeric and categorical: {sorted(overlap)}")

    @property
    def request_columns(self) -> list[str]:
        return [self.request] if isinstance(self.request, str) else list(self.request)

    def source_columns(self) -> list[str]:
        """Every mapped column name, each once, in a stable order."""
        names = [*self.request_columns, self.label, self.session, self.user, self.time,
                 self.position, self.item, self.bid, self.true_p, *self.numeric, *self.categorical]
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


# ----------------------------------------------------------------------------------------------
# LibSVM / LETOR
# ----------------------------------------------------------------------------------------------
def _clip(text: str | None, n: int = 120) -> str:
    text = "" if text is None else text
    return text if len(text) <= n else text[: n - 3] + "..."


def _raise_libsvm_error(path: Path, frame: pl.DataFrame, feats: pl.DataFrame,
                        n_features: int | None) -> None:
    """Raise the ValueError for the first malformed line (only called when one exists)."""
    errors: list[tuple[int, str]] = []
    feats = feats.join(frame.select("row", "line", "text"), on="row", how="left")

    def first(df: pl.DataFrame, mask: pl.Expr, what: str, token: str) -> None:
        bad = df.filter(mask)
        if bad.height:
            r = bad.row(0, named=True)
            errors.append((r["line"], f"{what} {r[token]!r} (in {_clip(r['text'])!r})"))

    first(frame, pl.col("label").is_null(), "bad label", "label_s")
    first(frame, pl.col("qid").is_null() | (pl.col("qid") == ""), "missing or empty qid:, got",
          "qid_s")
    no_colon = pl.col("field_1").is_null()
    first(feats, no_colon, "feature token without ':'", "feat")
    first(feats, ~no_colon & pl.col("idx").is_null(), "non-integer feature index in", "feat")
    first(feats, ~no_colon & pl.col("val").is_null(), "non-numeric feature value in", "feat")
    first(feats, pl.col("idx") < 1, "feature index < 1 in", "feat")
    if n_features is not None:
        first(feats, pl.col("idx") > n_features, f"feature index > n_features={n_features} in",
              "feat")
    first(feats, pl.col("dup"), "duplicate feature index in", "feat")
    line, msg = min(errors)
    raise ValueError(f"{path}: line {line}: {msg}")


def _decode_utf8(path: Path, raw: bytes, what: str) -> str:
    """``raw`` as text, or a ValueError naming the file, line and byte offset of the first bad byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        bad = raw[e.start:e.start + 4]
        raise ValueError(f"{path}: line {line}: bytes that are not UTF-8 ({bad!r} at byte offset "
                         f"{e.start}); {what} must be UTF-8 or ASCII text") from None


def read_libsvm(path: str | Path, *, n_features: int | None = None) -> pl.DataFrame:
    """Read a LibSVM / LETOR / SVMrank file: ``label qid:Q i:v i:v ... # comment``.

    Sparse indices are allowed (absent features are 0), as are CRLF line endings, tabs or several
    spaces between tokens, and blank lines or lines holding only a ``#`` comment (both skipped,
    they carry no row). Everything after the first ``#`` is kept in the ``comment`` column
    (MQ2008 stores the document id there).

    A qid that reappears after another qid's rows (two non-adjacent blocks) is kept as one
    request: :meth:`hybridrank.data.Schema.transform` groups rows by qid in order of first
    appearance. A warning with the count is logged, since files written by LETOR tools never do it.

    Vectorised: the file is split into lines once, tokens are parsed with polars expressions, and
    the dense matrix is filled by one numpy scatter.

    Args:
        path: the text file (UTF-8 / ASCII).
        n_features: width of the dense matrix; default the largest index in the file. An index
            larger than ``n_features`` is an error (nothing is dropped silently).

    Returns:
        Frame with ``label`` (float64), ``qid`` (string, the text after ``qid:``), ``f1..fK``
        (float64), ``comment`` (string, null where absent) and ``line`` (1-based line number).

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: empty file, non-UTF-8 bytes, or a malformed line (bad label, missing qid,
            token without ``:``, bad index, non-numeric value, index < 1 or > n_features,
            duplicate index in a line), naming the file, the line number and the offending text.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"LibSVM file not found: {path}")
    text = _decode_utf8(path, path.read_bytes(), "LibSVM files")
    lines = text.split("\n")
    irregular = "\t" in text or "  " in text
    parsed = _libsvm_fast(lines, n_features, irregular)
    if parsed is None:  # something is off: the step-by-step parser finds and names the line
        parsed = _libsvm_careful(path, lines, n_features)
    return _libsvm_frame(path, *parsed, n_features)


def _libsvm_fast(lines: list[str], n_features: int | None, irregular: bool):
    """One fused lazy polars query for well-formed files.

    Returns ``(head, row, idx, val)`` — per-line ``label, qid, comment, line`` and the
    ``(row, index, value)`` triple of every feature token — or None when any line is malformed
    (then :func:`_libsvm_careful` reports it) or the file has no row.
    """
    body = pl.col("field_0").str.strip_chars()
    if irregular:  # tabs, runs of spaces, stray CR: normalise first (rare, slower)
        body = body.str.replace_all(r"\s+", " ")
    lf = (
        pl.LazyFrame({"text": lines}).with_row_index("line", offset=1)
        .with_columns(pl.col("text").str.strip_chars())
        .filter((pl.col("text") != "") & ~pl.col("text").str.starts_with("#"))
        .with_columns(pl.col("text").str.splitn("#", 2).alias("_p")).unnest("_p")
        .with_columns(body.str.split(" ").alias("tok"),
                      pl.col("field_1").str.strip_chars().alias("comment"))
        .with_row_index("row")
    )
    qid = pl.col("tok").list.get(1, null_on_oob=True)
    head = lf.select(
        pl.col("tok").list.get(0, null_on_oob=True).cast(pl.Float64, strict=False).alias("label"),
        pl.when(qid.str.starts_with("qid:")).then(qid.str.slice(4)).alias("qid"),
        "comment", pl.col("line").cast(pl.Int64))
    feats = (
        lf.select("row", pl.col("tok").list.slice(2).alias("feat")).explode("feat")
        .drop_nulls("feat")
        .select("row", pl.col("feat").str.splitn(":", 2).alias("kv")).unnest("kv")
        .select("row", pl.col("field_1").is_null().alias("no_colon"),
                pl.col("field_0").cast(pl.Int64, strict=False).alias("idx"),
                pl.col("field_1").cast(pl.Float64, strict=False).alias("val"))
    )
    head, feats = pl.collect_all([head, feats])
    if head.height == 0 or head["label"].null_count() or head["qid"].null_count():
        return None
    if (head["qid"] == "").any() or feats["no_colon"].any():
        return None
    if feats["idx"].null_count() or feats["val"].null_count():
        return None
    row = feats["row"].to_numpy().astype(np.int64)
    idx = feats["idx"].to_numpy()
    if idx.size and (idx.min() < 1 or (n_features is not None and idx.max() > n_features)):
        return None
    if _has_duplicate_index(row, idx).any():
        return None
    return head, row, idx, feats["val"].to_numpy()


def _has_duplicate_index(row: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``[n]`` True where a (row, index) pair repeats an earlier token of the same line."""
    dup = np.zeros(row.size, dtype=bool)
    # indices usually increase inside a line (a cheap check); otherwise sort the keys
    if row.size > 1 and np.any((row[1:] == row[:-1]) & (idx[1:] <= idx[:-1])):
        key = row * (int(idx.max()) + 1) + idx
        order = np.argsort(key, kind="stable")
        d_sorted = np.zeros(row.size, dtype=bool)
        d_sorted[1:] = key[order][1:] == key[order][:-1]
        dup[order] = d_sorted
    return dup


def _libsvm_careful(path: Path, lines: list[str], n_features: int | None):
    """The step-by-step parser: same result as the fast one, and file:line errors when malformed."""
    frame = (
        pl.DataFrame({"text": lines})
        .with_row_index("line", offset=1)
        .with_columns(pl.col("line").cast(pl.Int64), pl.col("text").str.strip_chars())
        .filter((pl.col("text") != "") & ~pl.col("text").str.starts_with("#"))
    )
    if frame.height == 0:
        raise ValueError(f"{path}: empty file: no LibSVM rows (only blank or comment lines)")
    body = pl.col("body").str.strip_chars()
    if frame["text"].str.contains(r"\s\s|\t").any():  # irregular whitespace: normalise (rare)
        body = body.str.replace_all(r"\s+", " ")
    frame = (
        frame.with_columns(pl.col("text").str.splitn("#", 2).alias("_parts"))
        .unnest("_parts")
        .rename({"field_0": "body", "field_1": "comment"})
        .with_columns(pl.col("comment").str.strip_chars(), body.str.split(" ").alias("tok"))
        .with_columns(
            pl.col("tok").list.get(0, null_on_oob=True).alias("label_s"),
            pl.col("tok").list.get(1, null_on_oob=True).alias("qid_s"),
            pl.col("tok").list.slice(2).alias("feat"),
        )
        .with_columns(
            pl.col("label_s").cast(pl.Float64, strict=False).alias("label"),
            pl.when(pl.col("qid_s").str.starts_with("qid:"))
            .then(pl.col("qid_s").str.slice(4)).alias("qid"),
        )
        .with_row_index("row")
    )
    feats = (
        frame.lazy().select("row", "feat").explode("feat").drop_nulls("feat")
        .with_columns(pl.col("feat").str.splitn(":", 2).alias("_kv")).unnest("_kv")
        .with_columns(pl.col("field_0").cast(pl.Int64, strict=False).alias("idx"),
                      pl.col("field_1").cast(pl.Float64, strict=False).alias("val"))
        .collect()
    )
    row = feats["row"].to_numpy().astype(np.int64)
    idx = feats["idx"].to_numpy()
    dup = (_has_duplicate_index(row, idx) if feats["idx"].null_count() == 0
           else np.zeros(row.size, dtype=bool))
    feats = feats.with_columns(pl.Series("dup", dup))
    bad_feat = (pl.col("field_1").is_null() | pl.col("idx").is_null() | pl.col("val").is_null()
                | (pl.col("idx") < 1) | pl.col("dup"))
    if n_features is not None:
        bad_feat = bad_feat | (pl.col("idx") > n_features)
    bad_line = pl.col("label").is_null() | pl.col("qid").is_null() | (pl.col("qid") == "")
    if frame.select(bad_line.any()).item() or feats.select(bad_feat.any()).item():
        _raise_libsvm_error(path, frame, feats, n_features)

    return frame.select("label", "qid", "comment", "line"), row, idx, feats["val"].to_numpy()


def _libsvm_frame(path: Path, frame: pl.DataFrame, row: np.ndarray, idx: np.ndarray,
                  val: np.ndarray, n_features: int | None) -> pl.DataFrame:
    """Scatter the parsed ``(row, index, value)`` triples into the dense output frame."""
    n_rows = frame.height
    if n_features is None and idx.size and n_rows * int(idx.max()) > MAX_DENSE_CELLS:
        r = int(np.argmax(idx))
        raise ValueError(
            f"{path}: line {frame['line'][int(row[r])]}: feature index {int(idx[r])} would make a "
            f"dense matrix of {n_rows} x {int(idx[r])} values ({n_rows * int(idx[r]) * 8 / 2**30:.1f}"
            f" GiB); pass n_features (the true width: larger indices are then an error) or fix "
            f"the line")
    width = int(n_features) if n_features is not None else (int(idx.max()) if idx.size else 0)
    mat = np.zeros((n_rows, width), dtype=np.float64)
    mat[row, idx - 1] = val

    out = pl.concat(
        [frame.select("label", "qid"),
         pl.from_numpy(mat, schema=[f"f{i}" for i in range(1, width + 1)]),
         frame.select("comment", "line")],
        how="horizontal",
    )
    blocks = int((out["qid"] != out["qid"].shift()).sum()) + 1 if n_rows > 1 else n_rows
    n_q = out["qid"].n_unique()
    if blocks != n_q:
        log.warning("%s: %d qid(s) appear in more than one block of lines; each qid is kept as "
                    "one request (rows grouped by qid, in order of first appearance)",
                    path, blocks - n_q)
    return out


# ----------------------------------------------------------------------------------------------
# Click logs
# ----------------------------------------------------------------------------------------------
def _where(frame: pl.DataFrame, i: int) -> str:
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
                         f"value(s), first {s[i]!r} at {_where(frame, i)}")
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
                             f"nor datetimes, first {s[i]!r} at {_where(frame, i)}")
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
                      columns.true_p, columns.time]
        lf = pl.scan_csv(files, include_file_paths=SOURCE_FILE, infer_schema_length=10_000,
                         schema_overrides={c: pl.String for c in text_roles if c is not None})
    existing = [c for c in lf.collect_schema().names() if c != SOURCE_FILE]
    wanted = columns.source_columns() if require is None else require
    missing = [c for c in wanted if c not in existing]
    if missing:
        raise ValueError(f"{pattern or files[0]}: mapped column(s) {missing} not found; the file "
                         f"has columns {existing}")
    return lf.select(*[c for c in columns.source_columns() if c in existing], SOURCE_FILE)


def read_clicklog(path_or_glob: str | Path, columns: ColumnMap) -> pl.DataFrame:
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
    files = expand_files(pattern)
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
    return frame.with_columns(e.alias(c) for c, e in casts.items()) if casts else frame


# ----------------------------------------------------------------------------------------------
# Validation (shared by every source)
# ----------------------------------------------------------------------------------------------
def validate_frame(frame: pl.DataFrame, columns: ColumnMap, *, label_max: float,
                   nan_policy: str = "error", fill_value: float = 0.0,
                   name: str = "data", duplicates: str = "error",
                   max_request_span: float | None = MAX_REQUEST_SPAN) -> pl.DataFrame:
    """Check a frame's values; return it (with missing numerics filled under ``nan_policy="fill"``).

    Checks: the frame has rows; numeric features have no null / NaN / inf (``nan_policy="error"``
    raises naming column, count and first row; ``"fill"`` replaces them by ``fill_value`` and logs
    the counts); labels are present and in ``[0, label_max]``; positions are >= 1 (1-based);
    bids are finite and >= 0; true_p in ``[0, 1]``; id columns (request, session, user) have no
    nulls.

    Two request-level policies (docs/ROBUSTNESS.md):

    - ``duplicates`` (when ``item`` is mapped): a (request, item) pair on two rows is an error
      naming the first repeat and where the pair was first seen (``"error"``, default: a logging
      bug, e.g. a retried write, would double-count clicks); ``"drop"`` keeps the first row of each
      pair and logs the count; ``"keep"`` keeps all rows (pseudo-requests, pages that really show
      an item twice).
    - ``max_request_span`` (seconds, when ``time`` is mapped and ``request_time_bucket`` is not):
      one request id whose rows lie further apart in time is an error (a recycled id would merge
      two unrelated pages into one list); ``None`` keeps such rows as one request.
    """
    if nan_policy not in ("error", "fill"):
        raise ValueError(f"nan_policy must be 'error' or 'fill', got {nan_policy!r}")
    if duplicates not in ("error", "keep", "drop"):
        raise ValueError(f"duplicates must be 'error', 'keep' or 'drop', got {duplicates!r}")
    if frame.height == 0:
        raise ValueError(f"{name}: empty: no rows")

    def fail(mask: pl.Series, msg: str, col: str) -> None:
        n = int(mask.sum())
        if n:
            i = int(mask.arg_true()[0])
            raise ValueError(f"{name}: {msg}: {n} row(s), first {frame[col][i]!r} at "
                             f"{_where(frame, i)}")

    ids = [*columns.request_columns, columns.session, columns.user]
    for c in (c for c in ids if c is not None):
        fail(frame[c].is_null(), f"id column {c!r} has missing values", c)

    if columns.numeric:
        bad_exprs = [(pl.col(c).is_null() | ~pl.col(c).is_finite()).fill_null(True).sum().alias(c)
                     for c in columns.numeric]
        counts = frame.select(bad_exprs).row(0, named=True)
        bad_cols = {c: n for c, n in counts.items() if n}
        if bad_cols and nan_policy == "error":
            c = next(iter(bad_cols))
            fail((frame[c].is_null() | ~frame[c].is_finite()).fill_null(True),
                 f"numeric feature {c!r} has missing/NaN/inf values (set nan_policy='fill' to "
                 f"replace them by fill_value); columns affected: {bad_cols}", c)
        if bad_cols:
            log.warning("%s: filled %d missing/NaN/inf numeric value(s) with %s: %s", name,
                        sum(bad_cols.values()), fill_value, bad_cols)
            frame = frame.with_columns(
                pl.when(pl.col(c).is_null() | ~pl.col(c).is_finite()).then(pl.lit(fill_value))
                .otherwise(pl.col(c)).cast(pl.Float64).alias(c) for c in bad_cols)

    lab = frame[columns.label].cast(pl.Float64)
    fail((lab.is_null() | lab.is_nan() | (lab < 0) | (lab > label_max)).fill_null(True),
         f"label {columns.label!r} missing, NaN or outside [0, {label_max}]", columns.label)
    if columns.position is not None:
        pos = frame[columns.position]
        fail((pos.is_null() | (pos < 1)).fill_null(True),
             f"position {columns.position!r} missing or < 1 (positions are 1-based)",
             columns.position)
    if columns.bid is not None:
        bid = frame[columns.bid]
        fail((bid.is_null() | ~bid.is_finite() | (bid < 0)).fill_null(True),
             f"bid {columns.bid!r} missing, not finite or negative", columns.bid)
    if columns.true_p is not None:
        p = frame[columns.true_p]
        fail((p.is_null() | p.is_nan() | (p < 0) | (p > 1)).fill_null(True),
             f"true_p {columns.true_p!r} missing or outside [0, 1]", columns.true_p)
    if columns.time is not None:
        fail(frame[columns.time].is_null(), f"time {columns.time!r} has missing values",
             columns.time)
    if (max_request_span is not None and columns.time is not None
            and columns.request_time_bucket is None):
        t = pl.col(columns.time)
        span = frame.select((t.max() - t.min()).over(request_key_expr(columns)).alias("s"))["s"]
        over = span > max_request_span
        if over.any():
            i = int(over.arg_true()[0])
            key = frame.select(request_key_expr(columns)).to_series()
            same = key == key[i]
            times = frame[columns.time]
            lo = int((same & (times == times.filter(same).min())).arg_true()[0])
            hi = int((same & (times == times.filter(same).max())).arg_true()[0])
            raise ValueError(
                f"{name}: request {key[i]!r} spans {span[i]} s of time (rows at {_where(frame, lo)} "
                f"and {_row(frame, hi)}), more than max_request_span={max_request_span}: a request "
                f"id reused at another time; fix the ids, add the time to the request key "
                f"(request_time_bucket), or set max_request_span=null to keep them as one request "
                f"({int(over.sum())} row(s) in such requests)")
    if columns.item is not None and duplicates != "keep":
        pair = pl.struct(request_key_expr(columns).alias("q"), pl.col(columns.item).alias("i"))
        dup = frame.select((~pair.is_first_distinct()).alias("d"))["d"]
        n = int(dup.sum())
        if n and duplicates == "error":
            i = int(dup.arg_true()[0])
            key = frame.select(request_key_expr(columns)).to_series()
            item = frame[columns.item]
            j = int(((key == key[i]) & (item == item[i])).arg_true()[0])
            raise ValueError(
                f"{name}: duplicate (request, item) rows: {n} row(s) repeat an earlier one, first "
                f"request {key[i]!r} item {item[i]!r} at {_where(frame, i)} (first seen at "
                f"{_row(frame, j)}); set duplicates='drop' to keep the first row of each pair or "
                f"'keep' to keep them all")
        if n:
            log.warning("%s: dropped %d duplicate (request, item) row(s), kept the first of each",
                        name, n)
            frame = frame.filter(~dup)
    return frame


def _row(frame: pl.DataFrame, i: int) -> str:
    """Row ``i``'s location without the file name (for a second row of the same file)."""
    if "line" in frame.columns:
        return f"line {frame['line'][i]}"
    if SOURCE_ROW in frame.columns:
        return f"row {frame[SOURCE_ROW][i]}"
    return f"row {i + 1}"
