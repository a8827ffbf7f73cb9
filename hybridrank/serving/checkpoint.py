"""Crash-safe checkpoints: Lightning's checkpoint IO through :func:`hybridrank.atomic.atomic_path`.

A reader (or a resumed run) never sees half a checkpoint, and a crash while writing leaves the
previous file intact. Used by the trainer configs through ``plugins``.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from pytorch_lightning.plugins.io import TorchCheckpointIO

from hybridrank.atomic import atomic_path

__all__ = ["AtomicCheckpointIO", "atomic_torch_save"]


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
