"""Value validation, the one place where a frame's values are checked, for every source (click
logs, streamed chunks, the LibSVM reader of :mod:`hybridrank.data.libsvm`, new files a trained
model scores). Vectorised polars expressions, never a Python loop per row; every error says what
is wrong and where: file, 1-based line / row, the offending value.
"""

from __future__ import annotations

import logging

import polars as pl

from hybridrank.data.readers import MAX_REQUEST_SPAN, SOURCE_ROW, ColumnMap, request_key_expr, row_location

__all__ = ["NAN_POLICIES", "validate_frame"]

#: what happens to a missing / NaN / inf numeric feature value: an error naming it, replaced by
#: ``fill_value``, or kept missing for the schema's mean fill and 0/1 missing-value feature
NAN_POLICIES = ("error", "fill", "indicator")

log = logging.getLogger("hybridrank.data.readers")


def validate_frame(frame: pl.DataFrame, columns: ColumnMap, *, label_max: float,
                   nan_policy: str = "error", fill_value: float = 0.0,
                   name: str = "data", duplicates: str = "error",
                   max_request_span: float | None = MAX_REQUEST_SPAN) -> pl.DataFrame:
    """Check a frame's values; return it (with missing numerics filled under ``nan_policy="fill"``,
    or null under ``"indicator"``).

    Checks: the frame has rows; numeric features have no null / NaN / inf (``nan_policy="error"``
    raises naming column, count and first row; ``"fill"`` replaces them by ``fill_value``;
    ``"indicator"`` keeps them as missing (null), for the schema to fill with the training mean
    and mark in a 0/1 feature per column; both log the counts); labels are present and in
    ``[0, label_max]``; positions are >= 1 (1-based); bids are finite and >= 0; true_p in
    ``[0, 1]``; id columns (request, session, user) have no nulls.

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
    if nan_policy not in NAN_POLICIES:
        raise ValueError(f"nan_policy must be one of {NAN_POLICIES}, got {nan_policy!r}")
    if duplicates not in ("error", "keep", "drop"):
        raise ValueError(f"duplicates must be 'error', 'keep' or 'drop', got {duplicates!r}")
    if frame.height == 0:
        raise ValueError(f"{name}: empty: no rows")

    def fail(mask: pl.Series, msg: str, col: str) -> None:
        n = int(mask.sum())
        if n:
            i = int(mask.arg_true()[0])
            raise ValueError(f"{name}: {msg}: {n} row(s), first {frame[col][i]!r} at "
                             f"{row_location(frame, i)}")

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
                 f"numeric feature {c!r} has missing/NaN/inf values (set nan_policy='indicator' "
                 f"to fill them with the training mean and add a missing-value feature per "
                 f"column, or nan_policy='fill' to replace them by fill_value); columns "
                 f"affected: {bad_cols}", c)
        if bad_cols:
            fill = pl.lit(None, dtype=pl.Float64) if nan_policy == "indicator" else pl.lit(fill_value)
            # a hole is data under 'indicator' (INFO, as code-0 counts are); a fill changes values
            level, verb, how = ((logging.INFO, "kept", "as missing (nan_policy='indicator')")
                                if nan_policy == "indicator" else
                                (logging.WARNING, "filled", f"with {fill_value}"))
            log.log(level, "%s: %s %d missing/NaN/inf numeric value(s) %s: %s", name, verb,
                    sum(bad_cols.values()), how, bad_cols)
            frame = frame.with_columns(
                pl.when(pl.col(c).is_null() | ~pl.col(c).is_finite()).then(fill)
                .otherwise(pl.col(c)).cast(pl.Float64).alias(c) for c in bad_cols)

    lab = frame[columns.label].cast(pl.Float64)
    fail((lab.is_null() | lab.is_nan() | (lab < 0) | (lab > label_max)).fill_null(True),
         f"label {columns.label!r} missing, NaN or outside [0, label_max={label_max}] "
         f"(data.source.label_max in the data config)", columns.label)
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
    if columns.explore is not None:
        x = frame[columns.explore].cast(pl.Float64, strict=False)
        fail((x.is_null() | ~x.is_in([0.0, 1.0])).fill_null(True),
             f"explore {columns.explore!r} missing or not 0/1", columns.explore)
        mixed = (frame.with_columns(request_key_expr(columns).alias("__rk"))
                 .group_by("__rk").agg(pl.col(columns.explore).n_unique().alias("__n"))
                 .filter(pl.col("__n") > 1))
        if mixed.height:
            raise ValueError(f"{name}: explore {columns.explore!r} differs within {mixed.height} "
                             f"request(s) (e.g. {mixed['__rk'][0]!r}): it marks whole requests "
                             f"shown in random order")
    if columns.propensity is not None:
        q = frame[columns.propensity].cast(pl.Float64, strict=False)
        fail((q.is_null() | q.is_nan() | (q <= 0) | (q > 1)).fill_null(True),
             f"propensity {columns.propensity!r} missing or outside (0, 1]", columns.propensity)
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
                f"{name}: request {key[i]!r} spans {span[i]} s of time (rows at {row_location(frame, lo)} "
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
                f"request {key[i]!r} item {item[i]!r} at {row_location(frame, i)} (first seen at "
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
