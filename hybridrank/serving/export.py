"""Score export for ad auctions, atomic writes, portable (TorchScript / ONNX) models, checkpoints.

The score file format (columns, metadata keys, how to read it) is documented in
``docs/EXPORT.md``. In short: one row per impression with ``request_id``, ``item_id``,
``position``, ``label``, ``logit`` (raw model click logit; ``logit0`` / ``logit1`` for two-output
JRC models), ``pctr`` (corrected and calibrated), ``rank`` (1-based within the request by pCTR,
ties in storage order), ``bid`` and ``ecpm = bid × pctr``; file-level key-value metadata (parquet
schema metadata, or a ``<output>.meta.json`` sidecar for CSV) with the model version, the
checkpoint hash, the resolved config, the calibrator and the negative-sampling correction.

Every file is written to a temporary file in the destination directory and moved into place with
``os.replace``, so a reader never sees a partial file and a failure leaves the previous file
untouched and no temporary file behind.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import hashlib
import json
import logging
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch
from torch import nn

from hybridrank.atomic import atomic_path, check_writable
from hybridrank.lists import ListData
from hybridrank.serving.calibration import Calibrator, IdentityCalibrator

__all__ = [
    "META_KEYS", "sha256_file", "PortableRanker", "export_torchscript", "export_onnx",
    "score_frame", "ranks_within_requests", "ScoreWriter", "read_scores", "build_metadata",
]

log = logging.getLogger(__name__)

#: File-level metadata keys every export carries (values are strings; JSON where structured).
META_KEYS = ("hybridrank_version", "checkpoint_sha256", "checkpoint_path", "config", "calibrator",
             "neg_keep_rate", "correction_applied", "created_at")
_JSON_KEYS = ("config", "calibrator", "correction", "scored", "calibration_fit", "columns",
              "n_rows", "export_config", "position_bias", "level_trend")


def sha256_file(path: str | Path, block: int = 1 << 20) -> str:
    """Hex SHA-256 of a file, read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------------------------------
# Portable models
# ----------------------------------------------------------------------------------------------
class PortableRanker(nn.Module):
    """The serving path of a trained model + downsampling shift + calibrator, nothing else.

    ``forward(num [B, F] float32, cat [B, C] int64[, request [B] int64]) -> pctr [B]``: the
    model's serving path
    (:func:`hybridrank.models.ranker.serve`: scorer, then the loss's click logit, exactly what
    :meth:`~hybridrank.models.ranker.HybridRanker.predict` runs), plus ``shift``, through the
    calibrator. Holds no optimizer, metric or Lightning state: it is what an auction server runs.

    Args:
        model: the trained :class:`~hybridrank.models.ranker.HybridRanker` (its scorer and loss are
            copied).
        calibrator: a fitted :class:`~hybridrank.serving.calibration.Calibrator` (default: none).
        shift: logit shift of the downsampling correction (``log w``, or 0).

    A list-aware scorer (``scorer.list_aware``) scores an impression in the context of its
    request: the portable model then takes a third input, ``request`` (the request index of every
    row, rows of one request adjacent); other models take ``num`` and ``cat`` only.
    """

    def __init__(self, model: nn.Module, calibrator: Calibrator | None = None, shift: float = 0.0):
        super().__init__()
        self.scorer = copy.deepcopy(model.scorer).float().eval()
        self.loss = copy.deepcopy(model.loss)
        self.calibrator = (calibrator or IdentityCalibrator()).module().float()
        self.register_buffer("shift", torch.tensor(float(shift)))
        self.requires_grad_(False)  # inference only

    @property
    def list_aware(self) -> bool:
        return bool(getattr(self.scorer, "list_aware", False))

    def forward(self, num: torch.Tensor, cat: torch.Tensor,
                request: torch.Tensor | None = None) -> torch.Tensor:
        from hybridrank.models.ranker import serve

        return self.calibrator(serve(self.scorer, self.loss, num, cat, request)[0] + self.shift)


def _example_inputs(model: PortableRanker, batch: int = 5) -> tuple[torch.Tensor, ...]:
    """Inputs to trace with: ``(num, cat)``, plus ``request`` (two lists) for list-aware models."""
    scorer = model.scorer
    n_num = int(getattr(scorer, "n_numeric", 0))
    n_cat = len(getattr(scorer, "vocab_sizes", ()))
    gen = torch.Generator().manual_seed(0)
    num = torch.randn(batch, n_num, generator=gen)
    cat = torch.zeros(batch, n_cat, dtype=torch.long)
    if model.list_aware:
        return num, cat, torch.tensor([0] * (batch // 2) + [1] * (batch - batch // 2))
    return num, cat


def export_torchscript(model: nn.Module, calibrator: Calibrator | None, path: str | Path, *,
                       shift: float = 0.0, example: tuple | None = None) -> Path:
    """Trace the :class:`PortableRanker` of a trained model to TorchScript; save it atomically.

    Load with ``torch.jit.load(path)(num, cat) -> pctr`` (``(num, cat, request)`` for list-aware
    scorers). Tracing records the scorer's tensor operations; the batch size and the list
    structure stay free (the scorers take no Python number from the data).
    """
    model = PortableRanker(model, calibrator, shift).eval()
    example = example or _example_inputs(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit deprecation notices
        traced = torch.jit.trace(model, example, check_trace=False)
        with atomic_path(path) as tmp:
            torch.jit.save(traced, str(tmp))
    return Path(path)


def export_onnx(model: nn.Module, calibrator: Calibrator | None, path: str | Path, *,
                shift: float = 0.0, example: tuple | None = None, opset: int = 17) -> Path:
    """Export the :class:`PortableRanker` of a trained model to ONNX (inputs ``num``, ``cat``
    and, for list-aware scorers, ``request``; output ``pctr``).

    The batch axis is dynamic. Uses the TorchScript-based exporter (``dynamo=False``), which needs
    no extra package; isotonic calibrators export their knot lookup as comparisons.
    """
    model = PortableRanker(model, calibrator, shift).eval()
    example = example or _example_inputs(model)
    names = ["num", "cat", "request"] if model.list_aware else ["num", "cat"]
    axes = {n: {0: "batch"} for n in (*names, "pctr")}
    with warnings.catch_warnings(), atomic_path(path) as tmp:
        warnings.simplefilter("ignore")  # legacy-exporter deprecation notice
        torch.onnx.export(model, example, str(tmp), input_names=names,
                          output_names=["pctr"], dynamic_axes=axes, opset_version=opset,
                          dynamo=False)
    return Path(path)


# ----------------------------------------------------------------------------------------------
# Scoring
# ----------------------------------------------------------------------------------------------
def ranks_within_requests(pctr: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """``[N]`` 1-based rank of each impression in its request by decreasing pCTR.

    Ties keep storage order (the earlier row gets the better rank), so ranks are a permutation of
    ``1..n`` in every request and do not depend on the sort algorithm.

    >>> ranks_within_requests(np.array([.1, .3, .3, .2, .5]), np.array([0, 3, 5])).tolist()
    [3, 1, 2, 2, 1]
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    n = int(offsets[-1])
    req = np.repeat(np.arange(offsets.size - 1), np.diff(offsets))
    order = np.lexsort((np.arange(n), -np.asarray(pctr, dtype=np.float64), req))
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n) - offsets[req[order]] + 1
    return rank


@torch.no_grad()
def score_frame(model: nn.Module, data: ListData, calibrator: Calibrator | None = None, *,
                shift: float | torch.Tensor = 0.0, labels: bool = True) -> pl.DataFrame:
    """Score whole requests into the export's rows (``docs/EXPORT.md``).

    Args:
        model: the trained :class:`~hybridrank.models.ranker.HybridRanker`; scored with
            :meth:`~hybridrank.models.ranker.HybridRanker.predict_split` (the one scoring path).
        data: whole requests (a split or a chunk of one).
        calibrator: applied to ``logit + shift``; default none.
        shift: logit shift added before the calibrator: the downsampling correction (``log w``)
            or 0, a float, or ``[N]`` per impression (the correction plus the level trend at each
            row's time, as ``hybridrank-export`` passes it).
        labels: include the ``label`` column (and ``p_true`` when the data carries it).

    Returns:
        One row per impression in storage order. For a model with a position-bias tower ``pctr``
        is the serving pCTR at the tower's reference position (``logit`` its logit) and
        ``pctr_at_position`` the pCTR at the logged position.
    """
    calibrator = calibrator or IdentityCalibrator()
    logit, out = model.predict_split(data)
    pctr = calibrator.predict_proba(logit.double() + shift).numpy()
    at_position = None
    if getattr(model, "position_bias", None) is not None and data.position is not None:
        logged = model.predict_split(data, at_logged_position=True)[0]
        at_position = calibrator.predict_proba(logged.double() + shift).numpy()
    offsets = data.offsets.numpy()
    req = np.repeat(np.arange(data.n_requests), np.diff(offsets))
    cols: dict[str, Any] = {}
    if data.request_key is not None:
        key = data.request_key
        cols["request_id"] = (key.gather(req) if isinstance(key, pl.Series)
                              else np.asarray(key)[req])
    else:
        cols["request_id"] = req
    if data.item_key is not None:
        cols["item_id"] = data.item_key
    if data.position is not None:
        cols["position"] = data.position.numpy()
    if labels:
        cols["label"] = data.label.numpy()
        if data.true_p is not None:
            cols["p_true"] = data.true_p.double().numpy()
    cols["logit"] = logit.numpy()
    if out.shape[1] == 2:
        cols["logit0"], cols["logit1"] = out[:, 0].numpy(), out[:, 1].numpy()
    cols["pctr"] = pctr
    if at_position is not None:
        cols["pctr_at_position"] = at_position
    cols["rank"] = ranks_within_requests(pctr, offsets)
    if data.bid is not None:
        bid = data.bid.double().numpy()
        cols["bid"] = bid
        cols["ecpm"] = bid * pctr
    return pl.DataFrame({k: (v.rename(k) if isinstance(v, pl.Series) else v)
                         for k, v in cols.items()})


# ----------------------------------------------------------------------------------------------
# Writing and reading score files
# ----------------------------------------------------------------------------------------------
def build_metadata(*, checkpoint_path: str, checkpoint_sha256: str, config: Mapping,
                   calibrator: Calibrator, neg_keep_rate: float, correction_applied: bool,
                   **extra: Any) -> dict[str, str]:
    """The file-level metadata of an export, as strings (structured values JSON-encoded)."""
    from hybridrank import __version__

    meta: dict[str, Any] = {
        "hybridrank_version": __version__,
        "checkpoint_sha256": checkpoint_sha256,
        "checkpoint_path": str(checkpoint_path),
        "config": config,
        "calibrator": calibrator.to_dict(),
        "neg_keep_rate": repr(float(neg_keep_rate)),
        "correction_applied": "true" if correction_applied else "false",
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        **extra,
    }
    return {k: v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)
            for k, v in meta.items()}


class ScoreWriter:
    """Streams score chunks into a temporary parquet / CSV file; ``commit()`` moves it in place.

    Use as a context manager: leaving the block by an exception discards everything written.
    Parquet carries the metadata in its schema's key-value metadata; CSV gets a sidecar
    ``<output>.meta.json`` (written atomically, moved in place just before the CSV).

    Args:
        path: destination (``.parquet`` or ``.csv``).
        metadata: string key-value metadata (:func:`build_metadata`).
        fmt: ``"parquet"`` or ``"csv"``; default from the suffix (parquet unless ``.csv``).
    """

    def __init__(self, path: str | Path, metadata: Mapping[str, str], fmt: str | None = None):
        self.path = check_writable(path)
        self.fmt = fmt or ("csv" if self.path.suffix.lower() == ".csv" else "parquet")
        if self.fmt not in ("parquet", "csv"):
            raise ValueError(f"output format must be 'parquet' or 'csv', got {self.fmt!r}")
        self.metadata = dict(metadata)
        self.n_rows = 0
        self._schema = None
        self._writer = None
        self._file = None
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> ScoreWriter:
        self._tmp = self._stack.enter_context(atomic_path(self.path))
        if self.fmt == "csv":
            self._meta_tmp = self._stack.enter_context(atomic_path(meta_path(self.path)))
        return self

    def write(self, frame: pl.DataFrame) -> None:
        if self.fmt == "csv":
            if self._file is None:
                self._file = open(self._tmp, "wb")  # noqa: SIM115 - closed in __exit__
                frame.write_csv(self._file, include_header=True)
            else:
                frame.write_csv(self._file, include_header=False)
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            table = frame.to_arrow()
            if self._writer is None:
                self._schema = table.schema
                self._writer = pq.ParquetWriter(
                    str(self._tmp), self._schema.with_metadata(self.metadata))
            else:
                table = pa.Table.from_batches(table.to_batches(), table.schema).cast(self._schema)
            self._writer.write_table(table)
        self.n_rows += frame.height

    def update_metadata(self, **extra: Any) -> None:
        """Add metadata known only at the end (e.g. ``n_rows``); parquet writes it in the footer."""
        self.metadata.update({k: v if isinstance(v, str) else json.dumps(v, default=str)
                              for k, v in extra.items()})

    def _finish(self) -> None:
        self.update_metadata(n_rows=self.n_rows)
        if self.fmt == "parquet":
            if self._writer is None:
                raise ValueError("nothing to export: zero impressions")
            self._writer.add_key_value_metadata({"n_rows": self.metadata["n_rows"]})
            self._writer.close()
        else:
            if self._file is None:
                raise ValueError("nothing to export: zero impressions")
            self._file.close()
            self._meta_tmp.write_text(json.dumps(self.metadata, indent=2))

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            try:
                self._finish()
            except BaseException as e:
                self._close_quietly()
                self._stack.__exit__(type(e), e, e.__traceback__)  # discards the temp files
                raise
        self._close_quietly()
        return bool(self._stack.__exit__(exc_type, exc, tb))

    def _close_quietly(self) -> None:
        with contextlib.suppress(Exception):
            if self._writer is not None:
                self._writer.close()
        with contextlib.suppress(Exception):
            if self._file is not None:
                self._file.close()


def meta_path(path: str | Path) -> Path:
    """The metadata sidecar of a CSV export: ``<output>.meta.json``."""
    path = Path(path)
    return path.with_name(path.name + ".meta.json")


def read_score_table(path: str | Path) -> pl.DataFrame:
    """The rows of a score file (``.parquet`` or ``.csv``), for the commands that compare them."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return pl.read_csv(path)
    if suffix == ".parquet":
        return pl.read_parquet(path)
    raise ValueError(f"{path}: expected a .parquet or .csv score file")


def require_columns(frames: Mapping[str, pl.DataFrame], columns: Sequence[str]) -> None:
    """Raise ``ValueError`` naming the file and the columns it lacks (and those it has)."""
    if not frames:
        raise ValueError("no score file given")
    for name, f in frames.items():
        missing = [c for c in columns if c not in f.columns]
        if missing:
            raise ValueError(f"{name}: missing column(s) {missing} (columns: {f.columns})")


def read_scores(path: str | Path) -> tuple[pl.DataFrame, dict[str, Any]]:
    """Read an export back: the rows and the decoded metadata (JSON values parsed).

    ``neg_keep_rate`` comes back as a float and ``correction_applied`` as a bool.
    """
    path = Path(path)
    if path.suffix.lower() == ".csv":
        frame = pl.read_csv(path)
        raw = json.loads(meta_path(path).read_text())
    else:
        import pyarrow.parquet as pq

        frame = pl.read_parquet(path)
        md = pq.read_metadata(path).metadata or {}  # file key-value metadata (footer)
        raw = {k.decode(): v.decode() for k, v in md.items() if not k.startswith(b"ARROW")}
    meta: dict[str, Any] = {}
    for k, v in raw.items():
        if k in _JSON_KEYS:
            meta[k] = json.loads(v)
        elif k == "neg_keep_rate":
            meta[k] = float(v)
        elif k == "correction_applied":
            meta[k] = v == "true"
        else:
            meta[k] = v
    return frame, meta
