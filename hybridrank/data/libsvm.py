"""The LibSVM / LETOR / SVMrank text reader: ``label qid:Q i:v ... # comment``.

One lazy polars query parses the file (:func:`_parse_plan`); a well-formed file collects only the
columns the result needs. When something is off, the same query is collected again with its
diagnostic columns (the raw label, qid and feature tokens, each line's text) to name the first
malformed line (file, 1-based line, the offending text): one parser, and an error path that reads
its intermediate columns. The dense matrix is filled by one numpy scatter; no Python loop per
line.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import polars as pl

from hybridrank.data.readers import _decode_utf8

__all__ = ["read_libsvm", "MAX_DENSE_CELLS"]

log = logging.getLogger(__name__)



def _irregular(text: str) -> bool:
    """Whitespace other than single spaces between tokens: tabs, runs of spaces, vertical tab /
    form feed, or a carriage return that does not end a line (CRLF endings are stripped per line).
    Such files are normalised to single spaces first, as ``str.split()`` would split them.
    Plain substring scans (C speed; a regex over the whole text is ~10x slower)."""
    return ("\t" in text or "  " in text or "\x0b" in text or "\x0c" in text
            or text.count("\r") != text.count("\r\n"))

#: read_libsvm without n_features refuses a dense matrix larger than this (2 GiB of float64):
#: a stray huge index (a typo) would otherwise allocate rows x index values.
MAX_DENSE_CELLS = 1 << 28


def _clip(text: str | None, n: int = 120) -> str:
    text = "" if text is None else text
    return text if len(text) <= n else text[: n - 3] + "..."


def _parse_plan(lines: list[str], irregular: bool) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """The one LibSVM parse, as two lazy frames over the non-blank, non-comment lines.

    ``head``: per row ``line`` (1-based), ``text``, ``label_s`` / ``qid_s`` (the first two tokens),
    ``label`` (float, null when unparseable), ``qid`` (the text after ``qid:``, null without it),
    ``comment``. ``feats``: per feature token ``row``, ``feat`` (the token), ``no_colon``,
    ``idx`` (int, null when unparseable) and ``val`` (float, null when unparseable).
    """
    body = pl.col("field_0").str.strip_chars()
    if irregular:  # tabs, runs of spaces, stray CR: normalise first (rare, slower)
        body = body.str.replace_all(r"\s+", " ")
    lf = (
        pl.LazyFrame({"text": lines}).with_row_index("line", offset=1)
        .with_columns(pl.col("line").cast(pl.Int64), pl.col("text").str.strip_chars())
        .filter((pl.col("text") != "") & ~pl.col("text").str.starts_with("#"))
        .with_columns(pl.col("text").str.splitn("#", 2).alias("_p")).unnest("_p")
        .with_columns(body.str.split(" ").alias("tok"),
                      pl.col("field_1").str.strip_chars().alias("comment"))
        .with_row_index("row")
    )
    qid = pl.col("qid_s")
    head = (
        lf.select("row", "line", "text", "comment",
                  pl.col("tok").list.get(0, null_on_oob=True).alias("label_s"),
                  pl.col("tok").list.get(1, null_on_oob=True).alias("qid_s"))
        .with_columns(pl.col("label_s").cast(pl.Float64, strict=False).alias("label"),
                      pl.when(qid.str.starts_with("qid:")).then(qid.str.slice(4)).alias("qid"))
    )
    feats = (
        lf.select("row", pl.col("tok").list.slice(2).alias("feat")).explode("feat")
        .drop_nulls("feat")
        .with_columns(pl.col("feat").str.splitn(":", 2).alias("kv")).unnest("kv")
        .select("row", "feat", pl.col("field_1").is_null().alias("no_colon"),
                pl.col("field_0").cast(pl.Int64, strict=False).alias("idx"),
                pl.col("field_1").cast(pl.Float64, strict=False).alias("val"))
    )
    return head, feats


def _raise_libsvm_error(path: Path, head: pl.LazyFrame, feats: pl.LazyFrame,
                        n_features: int | None) -> None:
    """Raise the ValueError for the first malformed line (only called when one exists): the parse
    of :func:`_parse_plan` collected with its diagnostic columns."""
    frame, feats = pl.collect_all([head, feats])
    row = feats["row"].to_numpy().astype(np.int64)
    # duplicates among the parseable indices (an unparseable token elsewhere must not hide them)
    ok = feats["idx"].is_not_null().to_numpy()
    dup = np.zeros(row.size, dtype=bool)
    dup[ok] = _has_duplicate_index(row[ok], feats["idx"].to_numpy()[ok].astype(np.int64))
    feats = feats.with_columns(pl.Series("dup", dup)).join(
        frame.select("row", "line", "text"), on="row", how="left")
    errors: list[tuple[int, str]] = []

    def first(df: pl.DataFrame, mask: pl.Expr, what: str, token: str) -> None:
        bad = df.filter(mask)
        if bad.height:
            r = bad.row(0, named=True)
            errors.append((r["line"], f"{what} {r[token]!r} (in {_clip(r['text'])!r})"))

    first(frame, pl.col("label").is_null(), "bad label", "label_s")
    first(frame, pl.col("qid").is_null() | (pl.col("qid") == ""), "missing or empty qid:, got",
          "qid_s")
    no_colon = pl.col("no_colon")
    first(feats, no_colon, "feature token without ':'", "feat")
    first(feats, ~no_colon & pl.col("idx").is_null(), "non-integer feature index in", "feat")
    first(feats, ~no_colon & pl.col("val").is_null(), "non-numeric feature value in", "feat")
    first(feats, pl.col("idx") < 1, "feature index < 1 in", "feat")
    if n_features is not None:
        first(feats, pl.col("idx") > n_features, f"feature index > n_features={n_features} in",
              "feat")
    first(feats, pl.col("dup"), "duplicate feature index in", "feat")
    line, msg = min(errors, key=lambda e: e[0])  # the first line; on it, the first check (token order)
    raise ValueError(f"{path}: line {line}: {msg}")


def read_libsvm(path: str | Path, *, n_features: int | None = None) -> pl.DataFrame:
    """Read a LibSVM / LETOR / SVMrank file: ``label qid:Q i:v i:v ... # comment``.

    Sparse indices are allowed (absent features are 0), as are CRLF line endings, tabs or several
    spaces between tokens, and blank lines or lines holding only a ``#`` comment (both skipped,
    they carry no row). Everything after the first ``#`` is kept in the ``comment`` column
    (MQ2008 stores the document id there).

    A qid that reappears after another qid's rows (two non-adjacent blocks) is kept as one
    request: :meth:`hybridrank.data.schema.Schema.transform` groups rows by qid in order of first
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
    head, feats = _parse_plan(text.split("\n"), _irregular(text))
    h, f = pl.collect_all([head.select("label", "qid", "comment", "line"),
                           feats.select("row", "no_colon", "idx", "val")])
    if h.height == 0:
        raise ValueError(f"{path}: empty file: no LibSVM rows (only blank or comment lines)")
    row = f["row"].to_numpy().astype(np.int64)
    idx = f["idx"].to_numpy()
    malformed = (h["label"].null_count() or h["qid"].null_count() or (h["qid"] == "").any()
                 or f["no_colon"].any() or f["idx"].null_count() or f["val"].null_count())
    if not malformed and idx.size:
        malformed = (idx.min() < 1 or (n_features is not None and idx.max() > n_features)
                     or _has_duplicate_index(row, idx).any())
    if malformed:
        _raise_libsvm_error(path, head, feats, n_features)
    return _libsvm_frame(path, h, row, idx, f["val"].to_numpy(), n_features)


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
    seen = int(idx.max()) if idx.size else 0
    if n_features is not None and seen < width:
        # e.g. a 10-feature file read as MQ2008's 46: say so rather than pad in silence
        log.warning("%s: the largest feature index is %d but n_features=%d: features %d..%d appear "
                    "on no line and are read as 0 (%d zero column(s)); a file with fewer features "
                    "than the config's n_features?", path, seen, width, seen + 1, width, width - seen)
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
