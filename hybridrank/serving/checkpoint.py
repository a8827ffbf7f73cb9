"""Checkpoints: crash-safe writes, and loading a trained model back with errors that say what is wrong.

- Writing: Lightning's checkpoint IO through :func:`hybridrank.atomic.atomic_path`. A reader (or
  a resumed run) never sees half a checkpoint, and a crash while writing leaves the previous file
  intact. Used by the trainer configs through ``plugins``.
- Loading: :func:`load_model` (a checkpoint file or a ``hybridrank-train`` run folder, through
  :func:`resolve_checkpoint`) is ``HybridRanker.load_from_checkpoint`` on CPU in eval mode, after
  refusing files that are not hybridrank checkpoints with a message naming what they are;
  :func:`checkpoint_state` reads a checkpoint's plain state (epoch, step, callbacks).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from pytorch_lightning.plugins.io import TorchCheckpointIO

from hybridrank.atomic import atomic_path
from hybridrank.models.ranker import HybridRanker

__all__ = ["AtomicCheckpointIO", "atomic_torch_save", "load_model", "resolve_checkpoint",
           "checkpoint_state"]


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` to ``path`` atomically (temp file in the same folder, fsync, ``os.replace``)."""
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning checkpoint IO whose saves are atomic on the local file system."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options=None) -> None:
        if storage_options is not None:
            raise TypeError(f"AtomicCheckpointIO takes no storage_options, got {storage_options}")
        atomic_torch_save(checkpoint, path)


def checkpoint_state(path: str | Path) -> dict[str, Any]:
    """A Lightning checkpoint's contents on CPU (``epoch``, ``global_step``, ``callbacks``,
    ``state_dict``, ...), read with ``weights_only=True`` (no arbitrary Python objects)."""
    return torch.load(path, map_location="cpu", weights_only=True)


def load_model(path: str | Path) -> HybridRanker:
    """``HybridRanker.load_from_checkpoint`` on CPU in eval mode, with errors that say what is wrong.

    ``path`` is a checkpoint file, or a ``hybridrank-train`` output folder (its best checkpoint,
    as named in its ``metrics.json``).

    Raises:
        FileNotFoundError: no such file. ValueError: not a checkpoint (another kind of file, named),
        or not one written by ``hybridrank-train`` (hyper-parameters missing).
    """
    path = resolve_checkpoint(path)
    _check_checkpoint_file(path)
    try:
        head = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a damaged file or a checkpoint holding arbitrary Python objects
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{path} is not a readable hybridrank checkpoint ({type(e).__name__}: "
                         f"{first[:200]})") from e
    if not isinstance(head, dict):
        raise ValueError(f"{path} is not a hybridrank checkpoint: it holds a "
                         f"{type(head).__name__}, not a Lightning checkpoint")
    hp = head.get("hyper_parameters") or {}
    missing = [k for k in ("scorer", "loss", "data") if not hp.get(k)]
    if missing or "state_dict" not in head:
        raise ValueError(f"{path} is not a hybridrank checkpoint: hyper-parameters {missing} "
                         f"missing (it must be written by hybridrank-train / HybridRanker built "
                         f"from configs)")
    del head
    model = HybridRanker.load_from_checkpoint(path, map_location="cpu", weights_only=True)
    return model.eval()


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint file as given, or the best checkpoint of a ``hybridrank-train`` run folder."""
    path = Path(path)
    if path.is_dir():
        metrics = path / "metrics.json"
        if not metrics.is_file():
            raise FileNotFoundError(f"checkpoint={path} is a folder without metrics.json: give a "
                                    f"checkpoint file or a finished hybridrank-train run folder")
        best = json.loads(metrics.read_text()).get("best_checkpoint")
        if not best:
            raise ValueError(f"{metrics} names no best checkpoint (a run with callbacks=none "
                             f"keeps none)")
        # the run folder may have moved since: look in its own checkpoints/ too
        candidates = [Path(best), path / "checkpoints" / Path(best).name]
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            raise FileNotFoundError(f"the best checkpoint of {path} ({Path(best).name}) is missing")
        return found
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    return path


#: leading bytes of files that get passed as checkpoints by mistake
_MAGIC = {b"PAR1": "a parquet file", b"\x89PNG": "a PNG image", b"\x7fELF": "an executable",
          b"\x1f\x8b": "a gzip file", b"{": "a JSON file", b"ONNX": "an ONNX model"}


def _check_checkpoint_file(path: Path) -> None:
    """Refuse files that cannot be a torch checkpoint before ``torch.load`` reads them (its
    error on such files suggests ``weights_only=False``: advice that does not apply here)."""
    with open(path, "rb") as f:
        head = f.read(8)
    if head.startswith(b"PK\x03\x04") or head[:1] == b"\x80":  # torch's zip / legacy pickle
        return
    kind = next((what for magic, what in _MAGIC.items() if head.startswith(magic)), None)
    if kind is None:
        kind = "an empty file" if not head else (
            "a text file" if all(32 <= b < 127 or b in (9, 10, 13) for b in head) else
            "not a torch file")
    raise ValueError(f"{path} is not a checkpoint ({kind}); give a .ckpt file written by "
                     f"hybridrank-train (RUN_DIR/checkpoints/epochNN.ckpt) or its run folder")
