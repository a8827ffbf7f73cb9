"""Where a tensor lives, as the hot paths need to know it: can the host read it for free?

On an accelerator every read of a tensor's value into Python (``.item()``, ``bool(t)``, a
boolean-mask index, ``nonzero``, a copy from pageable host memory ...) waits for the device to
finish the work queued before it: one such read per training step keeps a GPU idle while the host
catches up. The training step's code asks :func:`free_to_read` before it reads; tests switch it off
to run the accelerator's path on the CPU (``tests/host_reads.py``).
"""

from __future__ import annotations

import torch

__all__ = ["free_to_read", "to_device"]


def free_to_read(t: torch.Tensor) -> bool:
    """Can the host read ``t`` without waiting for a device? (A CPU tensor.)

    >>> free_to_read(torch.zeros(1))
    True
    """
    return t.device.type == "cpu"


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A host tensor on ``device`` without the host waiting for the copy: through pinned memory,
    ``non_blocking`` (a copy from pageable memory would wait for the device's queue). On the CPU,
    ``t`` itself.

    >>> to_device(torch.arange(3), "cpu").tolist()
    [0, 1, 2]
    """
    device = torch.device(device)
    if device.type == "cpu" or t.device == device:
        return t
    if t.device.type == "cpu" and device.type == "cuda":
        t = t.pin_memory()
    return t.to(device, non_blocking=True)
