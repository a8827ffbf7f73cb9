"""A guard that records every read of a tensor's value into Python.

On an accelerator each such read waits for the device (what ``torch.cuda.set_sync_debug_mode``
reports there); on the CPU it is free and invisible. :class:`HostReads` sees the reads on any
device, so the accelerator's path of a piece of code (``hybridrank._device.free_to_read`` patched
to say no) can be checked for them on a machine without one.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable

import torch

#: the methods that hand a tensor's value to Python, and the ops whose output shape depends on
#: the values (the host must wait for them to size the output)
READS = {"item", "__bool__", "__int__", "__float__", "__index__", "tolist", "numpy", "cpu",
         "nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "bincount"}


def _bool_mask_index(name: str, args: tuple) -> bool:
    if name not in ("__getitem__", "__setitem__") or len(args) < 2:
        return False
    keys = args[1] if isinstance(args[1], tuple) else (args[1],)
    return any(isinstance(k, torch.Tensor) and k.dtype == torch.bool for k in keys)


def _repeat_without_size(name: str, kwargs: dict | None) -> bool:
    return name == "repeat_interleave" and not (kwargs or {}).get("output_size")


class HostReads(torch.overrides.TorchFunctionMode):
    """Records ``"<op> at <file>:<line>"`` for every host read made by code whose file path
    contains ``where`` (the innermost such frame is named).

    Args:
        where: a substring of the file paths whose reads count (e.g. ``"hybridrank/"``).
        only_inside: optional predicate on the stack's frames: reads count only when one frame
            satisfies it (e.g. inside ``training_step``).
    """

    def __init__(self, where: str = "hybridrank/",
                 only_inside: Callable[[traceback.FrameSummary], bool] | None = None):
        super().__init__()
        self.where, self.only_inside = where, only_inside
        self.reads: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in READS or _bool_mask_index(name, args) or _repeat_without_size(name, kwargs):
            stack = traceback.extract_stack()[:-1]
            ours = [f for f in stack if self.where in f.filename and "tests/" not in f.filename]
            # torch's own optimizers read their step counters, kept on the CPU (not capturable):
            # no device waits for that, whoever calls the optimizer (Lightning, or LazyAdam's
            # dense part)
            if stack and "torch/optim/" in stack[-1].filename.replace("\\", "/"):
                return func(*args, **(kwargs or {}))
            if ours and (self.only_inside is None or any(self.only_inside(f) for f in stack)):
                self.reads.append(f"{name} at {ours[-1].filename}:{ours[-1].lineno}")
        return func(*args, **(kwargs or {}))
