"""The per-request kernel of the metric engine: scored requests -> per-request sums (the columns).

Two kernels turn scored requests into **per-request sums** (torch float64, one row per request):
:func:`ranking_sums` (padded ``[G, L]`` lists) and :func:`impression_sums` (flat impressions with
their request ``row``):

==========================  ============  ==========================================================
column                      shape         per request
==========================  ============  ==========================================================
``lists:n``                 ``[R]``       1 (a request has an impression)
``lists:empty``             ``[R]``       1 if it has no positive label
``lists:valid``             ``[R]``       1 if it enters the NDCG / MAP / MRR means (``empty``)
``ndcg@k:sum``, ``map:sum``  ``[R]``       the list's value times ``lists:valid``
``mrr:sum``
``gauc:num``, ``gauc:den``  ``[R]``       ``n AUC`` and ``n`` (impressions) if it has both classes
``cal:n``, ``cal:ll``       ``[R]``       impressions, summed clipped BCE, summed p, positives
``cal:sum_p``, ``cal:sum_y``
``ece:n|p|y``               ``[R, B]``    impressions, summed p, positives per calibration bin
``field:{f}:n|p|y``         ``[R, V]``    the same per value of a field (``position``: 1..P)
``auc:pos``, ``auc:neg``    ``[R, D]``    positives / negatives per distinct-score bucket (sparse)
==========================  ============  ==========================================================

Every metric is a formula over the totals of these columns
(:mod:`hybridrank.metrics.statistics`). :class:`~hybridrank.metrics.per_request.RequestStats` keeps
one row per request (its builders, :mod:`hybridrank.metrics.builders`, call these kernels);
:class:`~hybridrank.metrics.list_metrics.ListMetrics` runs them on every batch with all requests in
one group (``n_groups=1``), so its states are the column totals. The per-list values are the
kernels of :mod:`hybridrank.metrics.list_kernels`, shared with the pure functions. Both kernels are
vectorised over lists and impressions (one ``bincount`` / ``index_add`` per column, no Python loop
over requests) and run on CPU or CUDA tensors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from hybridrank._dcg import tie_blocks
from hybridrank.metrics.calibration import bce
from hybridrank.metrics.list_kernels import (
    ap_rr_blocks,
    apply_empty,
    auc_blocks,
    check_lists,
    check_options,
    ndcg_blocks,
    resolve_ks,
    value_dtype,
)
from hybridrank.metrics.statistics import RANKING

__all__ = ["ranking_sums", "impression_sums"]


def _into(values: Tensor, group: Tensor | None, n_groups: int | None) -> Tensor:
    values = values.double()
    if group is None:
        return values
    if n_groups == 1:  # everything in one group (ListMetrics): a plain sum
        return values.sum().reshape(1)
    return torch.zeros(n_groups, dtype=torch.float64, device=values.device).index_add_(0, group, values)


def _by_row(row: Tensor, n_rows: int, w: Tensor | None = None) -> Tensor:
    """``[n_rows]`` sums of ``w`` (None: counts) per row."""
    if n_rows == 1:
        return (torch.tensor(float(row.numel()), dtype=torch.float64, device=row.device) if w is None
                else w.sum()).reshape(1)
    return torch.bincount(row, w, minlength=n_rows).double()


def ranking_sums(scores: Tensor, labels: Tensor, *, mask: Tensor, ks: Sequence[int | None] = (10,),
                 gain: str = "exp", empty: str = "skip", ties: str = "average",
                 include: Sequence[str] = RANKING, group: Tensor | None = None,
                 n_groups: int | None = None) -> dict[str, Tensor]:
    """The ranking columns (``lists:*``, ``ndcg@k:sum``, ``map:sum``, ``mrr:sum``, ``gauc:*``) of
    padded lists ``[G, L]``: one row per list, or summed into ``n_groups`` rows by ``group [G]``.

    The per-list values are the kernels of :mod:`hybridrank.metrics.list_kernels` (tie-averaged
    NDCG, pessimistic AP / RR, per-list AUC), so the means equal the pure functions of
    :mod:`hybridrank.metrics.ranking`.

    Args:
        scores: ``[G, L]`` scores. labels: ``[G, L]`` graded labels >= 0. mask: ``[G, L]`` bool.
        ks, gain, empty, ties: the conventions of :mod:`hybridrank.metrics.ranking`.
        include: which ranking metrics (a subset of :data:`~hybridrank.metrics.statistics.RANKING`).
        group: ``[G]`` int64 row (0..n_groups-1) of each list, or None: one row per list.
        n_groups: the number of rows when ``group`` is given.

    Returns:
        column name -> ``[G]`` (or ``[n_groups]``) float64 sums.

    >>> cols = ranking_sums(torch.tensor([[2., 1.]]), torch.tensor([[0., 1.]]),
    ...                     mask=torch.tensor([[True, True]]), ks=(None,), include=("ndcg",))
    >>> round(float(cols["ndcg:sum"][0]), 6), float(cols["lists:valid"][0])
    (0.63093, 1.0)
    """
    ks, _ = resolve_ks(tuple(ks) if not isinstance(ks, int) and ks is not None else ks)
    check_options(empty=empty, gain=gain, ties=ties)
    check_lists(scores, labels, mask=mask)
    blocks = tie_blocks(scores, mask)
    dt = value_dtype(scores, labels)
    nonempty = mask.any(1)
    if "ndcg" in include:  # gains > 0 exactly where labels > 0: its has-positive flags serve all
        nd, has_pos = ndcg_blocks(blocks, labels, mask=mask, ks=ks, gain=gain, dtype=dt)
    else:
        has_pos = ((labels > 0) & mask).any(1)
    valid = (nonempty & has_pos) if empty == "skip" else nonempty
    v = valid.double()
    cols = {"lists:n": nonempty.double(), "lists:empty": (nonempty & ~has_pos).double(),
            "lists:valid": v}
    if "ndcg" in include:
        nd, _ = apply_empty(nd, has_pos, mask=mask, empty=empty)
        for j, k in enumerate(ks):
            cols[("ndcg" if k is None else f"ndcg@{k}") + ":sum"] = nd[:, j].double() * v
    if "map" in include or "mrr" in include:
        ap, rr, _ = ap_rr_blocks(blocks, labels, mask=mask, dtype=dt)
        if "map" in include:
            cols["map:sum"] = apply_empty(ap, has_pos, mask=mask, empty=empty)[0].double() * v
        if "mrr" in include:
            cols["mrr:sum"] = apply_empty(rr, has_pos, mask=mask, empty=empty)[0].double() * v
    if "gauc" in include:
        au, ok = auc_blocks(blocks, labels, mask=mask)
        w = mask.sum(1).double() * ok
        cols["gauc:num"], cols["gauc:den"] = au * w, w
    return {name: _into(c, group, n_groups) for name, c in cols.items()}


def _cells(prefix: str, row: Tensor, col: Tensor, n_rows: int, width: int, dense: bool | None,
           **weights: Tensor | None) -> dict[str, Tensor]:
    """Sums per (row, cell) of each weight (None: 1 per impression), ``[n_rows, width]``: dense,
    or a coalesced sparse COO tensor when ``n_rows * width`` is large (``dense=None``)."""
    if dense is None:
        dense = n_rows * width <= max(1 << 16, 4 * row.numel())
    out = {}
    if dense:
        flat = row * width + col
        for name, w in weights.items():
            out[f"{prefix}:{name}"] = torch.bincount(
                flat, None if w is None else w, minlength=n_rows * width).double().view(n_rows, width)
        return out
    key, inv = torch.unique(row * width + col, return_inverse=True)  # sorted: coalesced order
    index = torch.stack([torch.div(key, width, rounding_mode="floor"), key % width])
    for name, w in weights.items():
        vals = torch.zeros(key.numel(), dtype=torch.float64, device=row.device).index_add_(
            0, inv, torch.ones(row.numel(), dtype=torch.float64, device=row.device) if w is None else w)
        out[f"{prefix}:{name}"] = torch.sparse_coo_tensor(index, vals, (n_rows, width),
                                                          is_coalesced=True, check_invariants=False)
    return out


def impression_sums(p: Tensor, y: Tensor, row: Tensor, n_rows: int, *, bins: int = 15,
                    bin_idx: Tensor | None = None, position: Tensor | None = None,
                    n_positions: int = 0, fields: Mapping[str, tuple[Tensor, int]] | None = None,
                    auc_bucket: tuple[Tensor, int] | None = None, calibration: bool = True,
                    dense: bool | None = None) -> dict[str, Tensor]:
    """The per-impression columns summed by request ``row``: ``cal:*``, ``ece:*`` (with
    ``bin_idx``), ``field:position:*`` (positions 1..``n_positions``), ``field:{f}:*`` and
    ``auc:*``.

    Args:
        p: ``[n]`` float64 probabilities. y: ``[n]`` float64 binary labels. row: ``[n]`` int64
            request (0..n_rows-1) of each impression.
        bin_idx: ``[n]`` calibration bin of each impression (0..bins-1), or None: no ECE columns.
        position: ``[n]`` 1-based display positions; only 1..n_positions count.
        fields: ``{name: (codes [n] in 0..width-1, width)}``.
        auc_bucket: ``(bucket [n], n_buckets)`` of :func:`~hybridrank.metrics.ranking.score_buckets`.
        dense: cell columns dense (True), sparse (False) or by size (None); calibration bins and
            positions are always dense.
        bins: the number of calibration bins. n_positions: display positions 1..P with cells.
        calibration: the ``cal:*`` columns.

    Returns:
        column name -> ``[n_rows]`` or ``[n_rows, m]`` float64 sums (cell columns may be sparse).

    >>> p = torch.tensor([.2, .4, .6], dtype=torch.float64); y = torch.tensor([0., 1., 0.]).double()
    >>> cols = impression_sums(p, y, torch.tensor([0, 0, 1]), 2)
    >>> cols["cal:sum_p"].tolist(), cols["cal:sum_y"].tolist()
    ([0.6000000000000001, 0.6], [1.0, 0.0])
    """
    cols: dict[str, Tensor] = {}
    if calibration:
        cols = {"cal:n": _by_row(row, n_rows), "cal:ll": _by_row(row, n_rows, bce(p, y)),
                "cal:sum_p": _by_row(row, n_rows, p), "cal:sum_y": _by_row(row, n_rows, y)}
    if bin_idx is not None:
        cols.update(_cells("ece", row, bin_idx, n_rows, bins, True, n=None, p=p, y=y))
    if n_positions and position is not None:
        code = position.long() - 1
        keep = (code >= 0) & (code < n_positions)
        cols.update(_cells("field:position", row[keep], code[keep], n_rows, n_positions, True,
                           n=None, p=p[keep], y=y[keep]))
    for name, (codes, width) in (fields or {}).items():
        cols.update(_cells(f"field:{name}", row, codes.long(), n_rows, width, dense, n=None, p=p, y=y))
    if auc_bucket is not None:
        bucket, width = auc_bucket
        cols.update(_cells("auc", row, bucket, n_rows, width, dense, pos=y, neg=1 - y))
    return cols
