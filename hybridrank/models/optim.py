"""Lazy Adam: embedding rows move only in the steps whose batch uses them.

A click log's id tables are large (one row per user, ad, query: 10^5-10^7 rows) and a batch uses a
few thousand rows. Dense Adam reads and writes every row of every table each step (its moments
keep moving rows the batch did not touch), and the embedding's dense gradient is a zero-filled
table of the same size: measured on this project's 2-core machine, a 1M x 16 table cost ~85 ms of
Adam and ~24 ms of backward per step against ~12 ms for the rest of a default training step.

:class:`LazyAdam` is ``torch.optim.Adam`` (``decoupled_weight_decay=True``: AdamW) for dense
gradients, and for the sparse gradients of ``nn.Embedding(sparse=True)`` the same update restricted
to the rows the gradient holds ("lazy" Adam, as TensorFlow Addons' ``LazyAdam`` and PyTorch's
``SparseAdam``): each held row's moments and value take one Adam step, with the parameter's step
count for the bias corrections; every other row, and its moments, stay as they are.
:class:`~hybridrank.models.ranker.HybridRanker` switches its scorer's id tables to sparse gradients
when its optimizer is a ``LazyAdam`` (one device, no gradient clipping, tables of at least
:data:`SPARSE_MIN_ELEMENTS` weights: ``sparse_tables``), so only the rows a batch uses are read and
written. With every row in every batch the two are the
same update (tested against ``torch.optim.Adam`` / ``AdamW``), and on random batches it is
``SparseAdam``'s rule (tested; ``SparseAdam`` adds ``eps`` before the bias correction, Adam and
this class after it).

Dense parameters take torch's fused Adam kernel (one kernel for every tensor) where the torch
build has one for their device (CPU since torch 2.4, CUDA; :func:`fused_adam_runs_on`), unless the
caller names ``fused`` or ``foreach``: on this project's 2-core machine the default MLP scorer's
Adam step took 0.13-0.17 ms against 0.49-0.51 ms for torch's per-tensor loop (its CPU default).

Adam: Kingma & Ba 2015, "Adam: A Method for Stochastic Optimization" (the bias-corrected moments
used here); AdamW's decoupled decay: Loshchilov & Hutter 2019. On the CPU the lazy step coalesces
the gradient (one read and one write per distinct row). On an accelerator the update has a fixed
shape given the batch (a sort, a segment sum and indexed writes): no count travels to the host,
so a CUDA step does not wait; a row used several times in a batch gets its summed gradient once
(every duplicate writes the same bits). The accelerator path is tested on the CPU (forced), not
yet on a GPU.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import torch

from hybridrank._device import free_to_read

__all__ = ["LazyAdam", "fused_adam_runs_on", "lazy_adam_rows", "SPARSE_MIN_ELEMENTS"]

#: the smallest table (rows x dim) that ``model.sparse_tables: auto`` makes sparse. Measured on this
#: project's 2-core machine, one table, 4,096 lookups a step, dense Adam against the lazy step: at
#: dim 16, 8,000 rows 0.83 vs 1.00 ms, 16,000 rows 2.06 vs 1.26 ms, 256,000 rows 26.3 vs 1.3 ms;
#: at dim 8 the cross-over sits near 32,000 rows. Below it a small table's whole dense step costs
#: less than coalescing the batch's rows.
SPARSE_MIN_ELEMENTS = 1 << 18


@torch.no_grad()
def lazy_adam_rows(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor,
                   exp_avg_sq: torch.Tensor, step: int | torch.Tensor, *, lr: float, beta1: float, beta2: float,
                   eps: float, weight_decay: float = 0.0, decoupled: bool = False) -> None:
    """One lazy Adam step, in place, of the rows a sparse gradient holds.

    Args:
        param: ``[V, ...]`` the table. grad: its sparse COO gradient (``[V, ...]``, one sparse
            dimension; coalesced or not: the values of a repeated row are summed).
        exp_avg, exp_avg_sq: ``[V, ...]`` Adam's moments of ``param``.
        step: the step count of this update (1 on the first), for the bias corrections: a number
            or a CPU tensor (read by the kernels as a scalar: nothing waits for a device).
        lr, beta1, beta2, eps, weight_decay: Adam's hyper-parameters. decoupled: AdamW's decay
            (``param *= 1 - lr * weight_decay``) instead of an L2 term added to the gradient;
            either acts on the held rows only.
    """
    if grad.sparse_dim() != 1:
        raise ValueError(f"lazy_adam_rows: a gradient with one sparse dimension (the rows), got "
                         f"{grad.sparse_dim()}")
    host = free_to_read(param)
    if host:
        # the host sees the rows for free (a CPU table): coalesce, then one read and one write
        # per distinct row
        grad = grad.coalesce()
        rows, g = grad._indices()[0], grad._values().to(param.dtype)
    else:
        # an accelerator's table: a fixed shape given the batch, so that no count of distinct
        # rows travels to the host; each occurrence takes its row's summed gradient and computes
        # its row's update, duplicates writing the same bits
        idx, val = grad._indices()[0], grad._values()
        order = torch.argsort(idx, stable=True)
        rows, val = idx[order], val[order].to(param.dtype)
        first = torch.ones_like(rows, dtype=torch.bool)
        first[1:] = rows[1:] != rows[:-1]
        seg = torch.cumsum(first, 0) - 1
        g = torch.zeros_like(val).index_add_(0, seg, val)[seg]
    if rows.numel() == 0:
        return
    w = param.index_select(0, rows)
    if weight_decay and not decoupled:
        g = g.add(w, alpha=weight_decay)
    m = exp_avg.index_select(0, rows).mul_(beta1).add_(g, alpha=1 - beta1)
    v = exp_avg_sq.index_select(0, rows).mul_(beta2).addcmul_(g, g, value=1 - beta2)
    step = torch.as_tensor(step, dtype=torch.float64)
    denom = (v.sqrt() / (1 - beta2 ** step).sqrt()).add_(eps)
    if weight_decay and decoupled:
        w.mul_(1 - lr * weight_decay)
    w.sub_((lr / (1 - beta1 ** step)) * (m / denom))
    for table, new in ((exp_avg, m), (exp_avg_sq, v), (param, w)):
        if host:
            table.index_copy_(0, rows, new)   # distinct rows
        else:
            table[rows] = new                 # repeated rows write equal values


def fused_adam_runs_on(params: Iterable[Any]) -> bool:
    """Whether torch's fused Adam kernel takes every parameter in ``params`` (tensors or param
    group dicts): floating point, on device types where this torch build has the kernel (found by
    one step of a one-element Adam on each device type, once).

    >>> fused_adam_runs_on([torch.zeros(2, requires_grad=True)]) in (True, False)
    True
    >>> fused_adam_runs_on([torch.zeros(2, dtype=torch.int64)])
    False
    """
    tensors = [t for p in params for t in (p["params"] if isinstance(p, dict) else [p])]
    return bool(tensors) and all(t.is_floating_point() for t in tensors) \
        and all(_fused_adam_on(d) for d in {t.device.type for t in tensors})


@functools.cache
def _fused_adam_on(device_type: str) -> bool:
    try:
        p = torch.zeros(1, device=device_type, requires_grad=True)
        p.grad = torch.ones_like(p)
        torch.optim.Adam([p], fused=True).step()
    except (RuntimeError, TypeError, ValueError, NotImplementedError):
        return False
    return True


class LazyAdam(torch.optim.Adam):
    """``torch.optim.Adam`` whose sparse gradients update only the rows they hold (module
    docstring). Takes Adam's arguments (``decoupled_weight_decay=True``: AdamW's decay); dense
    gradients get Adam's own step, unchanged. ``amsgrad`` and ``maximize`` have no lazy form here:
    a sparse gradient under either is an error.

    >>> table = torch.nn.Embedding(5, 2, sparse=True)
    >>> opt = LazyAdam(table.parameters(), lr=0.1)
    >>> before = table.weight.detach().clone()
    >>> table(torch.tensor([1, 1, 3])).sum().backward()
    >>> opt.step()
    >>> sorted((table.weight != before).any(1).nonzero().flatten().tolist())   # rows 1 and 3 only
    [1, 3]
    """

    #: what :class:`~hybridrank.models.ranker.HybridRanker` reads to give its tables sparse gradients
    sparse_rows = True

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False, *,
                 decoupled_weight_decay: bool = False, fused: bool | None = None, **kwargs: Any):
        params = list(params)
        if fused is None and not any(kwargs.get(k) for k in ("foreach", "capturable", "differentiable")):
            fused = fused_adam_runs_on(params) or None
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad, decoupled_weight_decay=decoupled_weight_decay, fused=fused,
                         **kwargs)
        # a fused Adam takes the loss scale of fp16 training into its own step; the lazy rows do
        # not, so the scaler unscales every gradient before the step, as for the unfused one
        self._step_supports_amp_scaling = False

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        hidden: list[tuple[torch.Tensor, torch.Tensor]] = []
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None and p.grad.is_sparse:
                    hidden.append((p, p.grad))
                    p.grad = None   # Adam's own step refuses sparse gradients: it skips these
        try:
            super().step()
            for group in self.param_groups:
                sparse = [(p, g) for p, g in hidden if any(p is q for q in group["params"])]
                if not sparse:
                    continue
                if group["amsgrad"] or group["maximize"]:
                    raise ValueError("LazyAdam: amsgrad and maximize have no lazy form; use dense "
                                     "gradients (model.sparse_tables: false) or torch.optim.Adam")
                beta1, beta2 = (float(b) for b in group["betas"])
                for p, g in sparse:
                    state = self.state[p]
                    if not state:
                        state["step"] = torch.tensor(0.0, dtype=torch.float32)
                        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["step"] += 1
                    lazy_adam_rows(p, g, state["exp_avg"], state["exp_avg_sq"], state["step"],
                                   lr=float(group["lr"]), beta1=beta1, beta2=beta2,
                                   eps=float(group["eps"]), weight_decay=float(group["weight_decay"]),
                                   decoupled=bool(group["decoupled_weight_decay"]))
        finally:
            for p, g in hidden:
                p.grad = g
        return loss
