"""New click-log files read as a trained model reads its data: :func:`input_chunks`."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import polars as pl

from hybridrank.lists import ListData
from hybridrank.models.ranker import HybridRanker

__all__ = ["input_chunks"]

log = logging.getLogger(__name__)

#: roles a file may lack: dropped with a warning (no label column: an unlabeled export)
_OPTIONAL_ROLES = ("session", "user", "time", "position", "item", "bid", "true_p", "explore",
                   "propensity")


def input_chunks(model: HybridRanker, pattern: str, chunk_rows: int,
                 overrides: Mapping | None = None) -> tuple[Iterator[ListData], dict[str, Any]]:
    """New click-log files as ``ListData`` chunks of whole requests, read as the model was trained.

    The checkpoint's column map (with ``overrides``, e.g. ``{bid: bid_usd}``) says which column
    plays which role; feature and request columns are required (a missing one is named with its
    role); optional roles absent from the files are dropped (no label column: an unlabeled
    export; no bid column: no ``ecpm``). Values are cast and checked under the model's value
    policies (:meth:`~hybridrank.data.schema.Schema.read`: a model trained with ``nan_policy: fill`` fills
    NaN features the same way). Requests need not be stored contiguously.

    Returns:
        ``(chunks, info)`` with ``info = {"has_label": bool, "columns": dict, "files": int}``.
    """
    from hybridrank.data.readers import SOURCE_FILE, ColumnMap, expand_files, scan_clicklog
    from hybridrank.data.scanner import ClickLogScanner

    schema = model.schema
    cm = dict(schema.columns.to_dict())
    unknown = sorted(set(overrides or {}) - set(cm))
    if unknown:
        raise ValueError(f"unknown column-map keys {unknown}; valid: {sorted(cm)}")
    cm.update(dict(overrides or {}))
    cm = ColumnMap.from_dict(cm)
    # the position feature is read through the position role (log(position)): not renamed apart
    moved = schema.columns.position in schema.numeric and cm.position != schema.columns.position
    if (list(cm.numeric) != list(schema.numeric) or list(cm.categorical) != list(schema.categorical)
            or cm.position_transform != schema.columns.position_transform or moved):
        raise ValueError("columns overrides cannot change the model's features (numeric / "
                         "categorical / position_transform, or the position column when it is a "
                         "feature); map renamed columns in the file instead")
    roles = {c: "request id" for c in cm.request_columns}
    roles.update({c: "numeric feature" for c in cm.numeric})
    derived = cm.derived_columns()
    roles.update({c: "categorical feature" for c in cm.categorical if c not in derived})
    if cm.request_time_bucket is not None:
        roles[cm.time] = "time (request_time_bucket)"
    elif derived:
        roles[cm.time] = f"time (time_features {cm.time_features})"
    files = expand_files(pattern)
    have = set(scan_clicklog(files, cm, pattern=pattern, require=[]).collect_schema().names())
    missing = [f"{c!r} ({r})" for c, r in roles.items() if c not in have]
    if missing:
        raise ValueError(f"{pattern}: the model needs column(s) {', '.join(missing)} which the "
                         f"file does not have; it has {sorted(have - {SOURCE_FILE})}")
    drop = {}
    for role in _OPTIONAL_ROLES:
        col = getattr(cm, role)
        if col is not None and col not in have and col not in roles:
            drop[role] = None
            log.warning("%s: no %r column (%s): exported without it", pattern, col, role)
    has_label = cm.label in have
    cm = dataclasses.replace(cm, **drop)
    scanner = ClickLogScanner(files, cm, chunk_rows=chunk_rows, scattered="allow",
                              require=list(roles))
    scanner.pattern = str(pattern)
    read_schema = dataclasses.replace(schema, columns=cm)

    def chunks() -> Iterator[ListData]:
        for frame in scanner.frames():
            if not has_label:
                frame = frame.with_columns(pl.lit(0.0).alias(cm.label))
            yield read_schema.read(frame, name=pattern)

    return chunks(), {"has_label": has_label, "columns": cm.to_dict(), "files": len(scanner.files)}
