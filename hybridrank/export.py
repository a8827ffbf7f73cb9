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
import os
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch
from torch import nn

from .calibration import Calibrator, IdentityCalibrator
from .lists import ListData

__all__ = [
    "META_KEYS", "sha256_file", "atomic_path", "check_writable", "load_ranker", "check_schema",
    "PortableRanker", "export_torchscript", "export_onnx", "score_data", "predict_outputs",
    "click_logits", "ranks_within_requests",
    "slice_requests", "request_chunks", "check_bids", "ScoreWriter", "read_scores",
    "build_metadata",
]

log = logging.getLogger(__name__)

#: File-level metadata keys every export carries (values are strings; JSON where structured).
META_KEYS = ("hybridrank_version", "checkpoint_sha256", "checkpoint_path", "config", "calibrator",
             "neg_keep_rate", "correction_applied", "created_at")
_JSON_KEYS = ("config", "calibrator", "correction", "scored", "calibration_fit", "columns",
              "n_rows")


# ----------------------------------------------------------------------------------------------
# Files
# ----------------------------------------------------------------------------------------------
def sha256_file(path: str | Path, block: int = 1 << 20) -> str:
    """Hex SHA-256 of a file, read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def check_writable(path: str | Path) -> Path:
    """Create the parent directory if needed and check a file can be written at ``path``.

    Raises:
        ValueError: ``path`` is a directory, or its directory cannot be created or written.
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"output path {str(path)!r} is a directory; give a file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"output path {str(path)!r} is not writable: cannot create its directory "
                         f"({e.strerror})") from None
    denied = path.exists() and not os.access(path, os.W_OK)
    if denied or not os.access(path.parent, os.W_OK | os.X_OK):
        raise ValueError(f"output path {str(path)!r} is not writable (no write permission on "
                         f"{str(path.parent)!r})")
    return path


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success move it onto ``path`` atomically.

    The temporary file sits in the same directory (``os.replace`` is atomic only within one file
    system), is flushed to disk before the move, and is removed if the body raises, in which case
    an existing ``path`` is left exactly as it was.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> with atomic_path(d / "x.txt") as tmp:
    ...     _ = tmp.write_text("hello")
    >>> (d / "x.txt").read_text(), sorted(p.name for p in d.iterdir())
    ('hello', ['x.txt'])
    """
    path = check_writable(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp files are private; exports are meant to be read
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


# ----------------------------------------------------------------------------------------------
# Checkpoints
# ----------------------------------------------------------------------------------------------
def _load_checkpoint(path: Path) -> dict:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - older Lightning checkpoints pickle more than tensors
        log.debug("weights_only load of %s failed; loading the full pickle (trusted file)", path)
        return torch.load(path, map_location="cpu", weights_only=False)


def load_ranker(ckpt_path: str | Path):
    """Rebuild a trained :class:`~hybridrank.module.HybridRanker` from a Lightning checkpoint.

    The checkpoint's hyper-parameters hold ``config`` (the resolved run config) and ``schema``
    (:meth:`hybridrank.data.Schema.to_dict`); scorer and loss are rebuilt with
    ``hydra.utils.instantiate`` from ``config["model"]`` / ``config["loss"]`` with the sizes the
    schema implies (as ``hybridrank.cli.build`` does), then the state dict is loaded strictly.

    Returns:
        ``(module, config, schema)``: the module in eval mode on CPU, and the two dicts. The
        module also gets ``checkpoint_path`` and ``checkpoint_sha256`` attributes.

    Raises:
        FileNotFoundError: no such file. ValueError: not a hybridrank checkpoint, or weights that
        do not fit the rebuilt scorer.
    """
    import hydra

    from .module import HybridRanker

    path = Path(ckpt_path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    ckpt = _load_checkpoint(path)
    hp = dict(ckpt.get("hyper_parameters") or {})
    missing = [k for k in ("config", "schema") if not hp.get(k)]
    if missing or "state_dict" not in ckpt:
        raise ValueError(f"{path} is not a hybridrank checkpoint: hyper-parameters {missing} "
                         f"missing (it must be written by HybridRanker via ModelCheckpoint)")
    config, schema = dict(hp["config"]), dict(hp["schema"])
    loss = hydra.utils.instantiate(config["loss"])
    scorer = hydra.utils.instantiate(
        config["model"], n_numeric=len(schema["numeric"]),
        vocab_sizes=[len(schema["vocab"][c]) for c in schema["categorical"]],
        n_outputs=loss.n_outputs, base_rate=None,
    )
    if not isinstance(scorer, nn.Module) and callable(scorer):  # `_partial_: true` model nodes
        scorer = scorer()
    module = HybridRanker(scorer, loss, metrics=hp.get("metrics"), schema=schema, config=config,
                          neg_keep_rate=float(hp.get("neg_keep_rate", 1.0)))
    try:
        module.load_state_dict(ckpt["state_dict"], strict=True)
    except RuntimeError as e:
        raise ValueError(f"{path}: the weights do not fit the scorer rebuilt from the checkpoint's "
                         f"config and schema: {e}") from None
    module.eval()
    module.checkpoint_path = str(path.resolve())
    module.checkpoint_sha256 = sha256_file(path)
    module.loss_reweighted = bool(hp.get("neg_weighted", True))
    return module, config, schema


def check_schema(expected: Mapping[str, Any], actual: Mapping[str, Any], *,
                 where: str = "the data") -> None:
    """Refuse data whose feature schema differs from the checkpoint's.

    Compares numeric and categorical feature names (and order), vocabulary sizes and contents
    (codes are positions in the vocabulary, so equal sizes with other contents are just as wrong)
    and the numeric scaler.

    Raises:
        ValueError: listing every difference.
    """
    problems = []
    for kind in ("numeric", "categorical"):
        a, b = list(expected[kind]), list(actual[kind])
        if a != b:
            problems.append(f"{kind} features differ: checkpoint {a} vs {where} {b}")
    for c in expected["categorical"]:
        if c not in actual["vocab"]:
            continue
        va, vb = list(expected["vocab"][c]), list(actual["vocab"][c])
        if len(va) != len(vb):
            problems.append(f"vocabulary size of {c!r}: {len(va)} in the checkpoint vs {len(vb)} "
                            f"in {where}")
        elif va != vb:
            i = next(i for i, (x, y) in enumerate(zip(va, vb)) if x != y)
            problems.append(f"vocabulary of {c!r} differs at code {i + 1}: {va[i]!r} vs {vb[i]!r}")
    if list(expected["numeric"]) == list(actual["numeric"]):
        for key in ("mean", "std"):
            a, b = np.asarray(expected[key], float), np.asarray(actual[key], float)
            if a.shape != b.shape or not np.allclose(a, b, rtol=1e-6, atol=1e-9):
                problems.append(f"numeric scaler ({key}) differs from the checkpoint's")
    if problems:
        raise ValueError(f"the checkpoint was trained on a different feature schema than {where}: "
                         + "; ".join(problems))


# ----------------------------------------------------------------------------------------------
# Portable models
# ----------------------------------------------------------------------------------------------
class PortableRanker(nn.Module):
    """Scorer + click logit + downsampling shift + calibrator + sigmoid, nothing else.

    ``forward(num [B, F] float32, cat [B, C] int64) -> pctr [B]``. Holds no loss, optimizer or
    Lightning state: it is what an auction server runs.

    Args:
        scorer: the trained scorer (or a ``HybridRanker``, whose ``.scorer`` is taken); copied.
        calibrator: a fitted :class:`~hybridrank.calibration.Calibrator` (default: none).
        shift: logit shift of the downsampling correction (``log w``, or 0).
    """

    def __init__(self, scorer: nn.Module, calibrator: Calibrator | None = None, shift: float = 0.0):
        super().__init__()
        scorer = getattr(scorer, "scorer", scorer)
        self.scorer = copy.deepcopy(scorer).float().eval()
        self.n_outputs = int(getattr(scorer, "n_outputs", 1))
        self.calibrator = (calibrator or IdentityCalibrator()).module().float()
        self.register_buffer("shift", torch.tensor(float(shift)))
        self.requires_grad_(False)  # inference only

    def forward(self, num: torch.Tensor, cat: torch.Tensor) -> torch.Tensor:
        out = self.scorer(num, cat)
        z = out[:, 1] - out[:, 0] if self.n_outputs == 2 else out[:, 0]
        return self.calibrator(z + self.shift)


def _example_inputs(model: PortableRanker, batch: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    scorer = model.scorer
    n_num = int(getattr(scorer, "n_numeric", 0))
    n_cat = len(getattr(scorer, "vocab_sizes", ()))
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(batch, n_num, generator=gen),
            torch.zeros(batch, n_cat, dtype=torch.long))


def export_torchscript(module: nn.Module, calibrator: Calibrator | None, path: str | Path, *,
                       shift: float = 0.0, example: tuple | None = None) -> Path:
    """Trace a :class:`PortableRanker` to TorchScript and save it atomically.

    Load with ``torch.jit.load(path)(num, cat) -> pctr``. Tracing records the scorer's tensor
    operations; the batch size stays free (no shape-dependent control flow in the scorers).
    """
    model = PortableRanker(module, calibrator, shift).eval()
    example = example or _example_inputs(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit deprecation notices
        traced = torch.jit.trace(model, example, check_trace=False)
        with atomic_path(path) as tmp:
            torch.jit.save(traced, str(tmp))
    return Path(path)


def export_onnx(module: nn.Module, calibrator: Calibrator | None, path: str | Path, *,
                shift: float = 0.0, example: tuple | None = None, opset: int = 17) -> Path:
    """Export a :class:`PortableRanker` to ONNX (inputs ``num``, ``cat``; output ``pctr``).

    The batch axis is dynamic. Uses the TorchScript-based exporter (``dynamo=False``), which needs
    no extra package; isotonic calibrators export their knot lookup as comparisons.
    """
    model = PortableRanker(module, calibrator, shift).eval()
    example = example or _example_inputs(model)
    axes = {"num": {0: "batch"}, "cat": {0: "batch"}, "pctr": {0: "batch"}}
    with warnings.catch_warnings(), atomic_path(path) as tmp:
        warnings.simplefilter("ignore")  # legacy-exporter deprecation notice
        torch.onnx.export(model, example, str(tmp), input_names=["num", "cat"],
                          output_names=["pctr"], dynamic_axes=axes, opset_version=opset,
                          dynamo=False)
    return Path(path)


# ----------------------------------------------------------------------------------------------
# Scoring
# ----------------------------------------------------------------------------------------------
def request_chunks(lengths: np.ndarray, chunk_rows: int) -> list[tuple[int, int]]:
    """Consecutive request ranges ``[r0, r1)`` of at most ``chunk_rows`` impressions each.

    A request longer than ``chunk_rows`` gets a chunk of its own (requests are never cut).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    cum = np.concatenate([[0], np.cumsum(lengths)])
    out, r = [], 0
    while r < lengths.size:
        e = int(np.searchsorted(cum, cum[r] + chunk_rows, side="right")) - 1
        e = max(e, r + 1)
        out.append((r, e))
        r = e
    return out


def slice_requests(data: ListData, r0: int, r1: int) -> ListData:
    """Requests ``r0:r1`` of a split as their own :class:`ListData` (views, no copies)."""
    s, e = int(data.offsets[r0]), int(data.offsets[r1])

    def rows(t):
        return None if t is None else t[s:e]

    def keys(k, a, b):
        if k is None:
            return None
        return k.slice(a, b - a) if isinstance(k, pl.Series) else k[a:b]

    return ListData(
        num=data.num[s:e], cat=data.cat[s:e], label=data.label[s:e],
        offsets=data.offsets[r0:r1 + 1] - s,
        scope={k: v[r0:r1] for k, v in data.scope.items()},
        position=rows(data.position), bid=rows(data.bid), true_p=rows(data.true_p),
        request_key=keys(data.request_key, r0, r1), item_key=keys(data.item_key, s, e),
        time=None if data.time is None else data.time[r0:r1],
    )


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


def check_bids(bid: torch.Tensor | np.ndarray | None, *, where: str = "the data") -> None:
    """Refuse negative, NaN or infinite bids, naming the count and the first offending row."""
    if bid is None:
        return
    b = np.asarray(bid, dtype=np.float64)
    bad = ~np.isfinite(b) | (b < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{where}: {int(bad.sum())} bid(s) negative, NaN or infinite; first "
                         f"{b[i]!r} at row {i + 1}")


@torch.no_grad()
def predict_outputs(scorer: nn.Module, data: ListData, *, batch: int = 65536) -> torch.Tensor:
    """``[N, n_outputs]`` float32 raw scorer outputs of a split, in storage order, in eval mode."""
    scorer = getattr(scorer, "scorer", scorer)
    was_training = scorer.training
    scorer.eval()
    try:
        device = next(scorer.parameters()).device
        outs = [scorer(data.num[s:s + batch].to(device), data.cat[s:s + batch].to(device))
                .float().cpu() for s in range(0, data.n_impressions, batch)]
    finally:
        scorer.train(was_training)
    n_out = int(getattr(scorer, "n_outputs", 1))
    return torch.cat(outs) if outs else torch.zeros(0, n_out)


def click_logits(scorer: nn.Module, data: ListData, *, batch: int = 65536) -> torch.Tensor:
    """``[N]`` click logits (``z1 - z0`` for two outputs) of a split, in storage order."""
    out = predict_outputs(scorer, data, batch=batch)
    return out[:, 1] - out[:, 0] if out.shape[1] == 2 else out[:, 0]


@torch.no_grad()
def score_data(scorer: nn.Module, data: ListData, calibrator: Calibrator | None = None, *,
               shift: float = 0.0, labels: bool = True, batch: int = 65536) -> pl.DataFrame:
    """Score a split (or a chunk of whole requests) into the export's rows.

    Args:
        scorer: the scorer (or a ``HybridRanker``); run in eval mode, in batches of ``batch``.
        data: whole requests.
        calibrator: applied to ``logit + shift``; default none.
        shift: downsampling-correction logit shift (``log w``) or 0.
        labels: include the ``label`` column.

    Returns:
        One row per impression in storage order (see ``docs/EXPORT.md`` for the columns).
    """
    calibrator = calibrator or IdentityCalibrator()
    out = predict_outputs(scorer, data, batch=batch)
    n_out = out.shape[1]
    logit = out[:, 1] - out[:, 0] if n_out == 2 else out[:, 0]
    pctr = calibrator.predict_proba(logit.double() + shift).numpy()
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
    cols["logit"] = logit.numpy()
    if n_out == 2:
        cols["logit0"], cols["logit1"] = out[:, 0].numpy(), out[:, 1].numpy()
    cols["pctr"] = pctr
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
    from . import __version__

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
