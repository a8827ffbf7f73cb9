"""L2 penalties on the embedding rows a training batch uses (``HybridRanker(embedding_l2=...)``).

Pure functions of a scorer's per-column tables (:func:`~hybridrank.models.scorers.column_tables`)
and a batch's codes: :func:`embedding_penalty` counts every use of a row (a row is shrunk in
proportion to its data), :func:`frequency_penalty` weighs a row by one over its training count
(a Gaussian prior of the same strength on every row, so rare ids shrink most), with the weights
of :func:`row_weights`. The objective each one adds: docs/CONVENTIONS.md §10.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from hybridrank.models.optim import SPARSE_MIN_ELEMENTS
from hybridrank.models.scorers import column_tables

__all__ = ["EMBEDDING_L2_MODES", "embedding_penalty", "frequency_penalty", "row_weights", "weighted_square_norms"]

#: How ``HybridRanker(embedding_l2_mode=...)`` weighs the L2 of an embedding row: every use of it
#: (``per_impression``, :func:`embedding_penalty`) or once per training occurrence divided by its
#: training count (``frequency``, :func:`frequency_penalty`).
EMBEDDING_L2_MODES = ("per_impression", "frequency")


def embedding_penalty(scorer: nn.Module, cat: torch.Tensor) -> torch.Tensor:
    """L2 of the embedding rows a batch uses: ``(1/B) Σ_i Σ_tables Σ_j ||T_j[cat[i, j]]||²``.

    Each occurrence of a row counts (as factorization machines are usually trained, Rendle 2012):
    a row is shrunk in proportion to how often it is used, and rows a batch does not touch are
    left alone (unlike weight decay on the whole table, which shrinks rare ids every step).

    >>> from hybridrank.models.scorers import MLPScorer
    >>> s = MLPScorer(0, [3], hidden=(), emb_dim=2)
    >>> with torch.no_grad():
    ...     _ = s.embeddings.tables[0].weight.fill_(1.0)
    >>> embedding_penalty(s, torch.tensor([[1], [2]])).item()    # two rows of [1, 1]
    2.0
    """
    total = cat.new_zeros((), dtype=torch.float32)
    if cat.shape[0] == 0:
        return total
    ones = torch.ones(cat.shape[0], device=cat.device)
    for tables in column_tables(scorer):
        for j, t in enumerate(tables):
            total = total + weighted_square_norms(t, cat[:, j], ones)
    return total / cat.shape[0]


def weighted_square_norms(table: nn.Embedding, codes: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``Σ_i weights[i] · ||table[codes[i]]||²``, differentiable in the table.

    Two forms of the same sum. A table with dense gradients under :data:`SPARSE_MIN_ELEMENTS`
    weights (every table ``sparse_tables: auto`` leaves dense) sums per row, ``Σ_c W[c] ||T[c]||²``
    with ``W[c]`` the weight its codes add up to (``index_add_``, deterministic on every device):
    its backward is an elementwise ``2 W[c] T[c]``, where a lookup's backward scatters every code
    into a zeroed copy of the table, which costs more as soon as the batch holds more codes than
    a few table rows (measured on this project's 2-core machine, 4,096 codes: 9,201 x 16 rows
    0.34-0.49 ms against 0.66-0.78 ms a step, forward and backward; 22 x 13 rows 0.07-0.11 ms
    against 0.61-0.67 ms). Larger or sparse tables look the batch's rows up, so that only those
    rows get a gradient.

    >>> t = nn.Embedding(3, 2)
    >>> with torch.no_grad():
    ...     _ = t.weight.copy_(torch.tensor([[1.0, 0.0], [1.0, 1.0], [2.0, 0.0]]))
    >>> weighted_square_norms(t, torch.tensor([1, 1, 2]), torch.tensor([1.0, 0.5, 0.25])).item()
    4.0
    >>> t.sparse = True                                     # the same sum, by lookup
    >>> weighted_square_norms(t, torch.tensor([1, 1, 2]), torch.tensor([1.0, 0.5, 0.25])).item()
    4.0
    """
    w = table.weight
    if table.sparse or w.numel() >= SPARSE_MIN_ELEMENTS:
        return (table(codes).float().pow(2).sum(dim=1) * weights).sum()
    per_row = torch.zeros(w.shape[0], dtype=weights.dtype, device=w.device).index_add_(0, codes, weights)
    return (per_row[:, None] * w.float().pow(2)).sum()


def frequency_penalty(scorer: nn.Module, cat: torch.Tensor, request: torch.Tensor | None,
                      weights: Sequence[torch.Tensor | None]) -> torch.Tensor:
    """Frequency-aware L2 of the embedding rows a batch uses: a Gaussian prior on every row.

    ``(1/B) Σ_j Σ_{(r, c) in batch} w_j[c] Σ_tables ||T_j[c]||²``, the inner sum over the distinct
    (request ``r``, code ``c``) pairs of column ``j`` (a code repeated within a request counts
    once) and ``w_j[c] = 1 / n_j[c]``, ``n_j[c]`` the number of training requests holding ``c``
    (:func:`row_weights`). Over an epoch each training (request, code) pair enters once, so a row
    collects ``||T_j[c]||²`` in total whatever its frequency, and the penalty's mean per step is
    ``(1/N) Σ_j Σ_c ||T_j[c]||²`` (``N`` training impressions): with strength ``λ`` the training
    objective is ``Σ_i loss_i + λ Σ_rows ||row||²``, a prior worth ``λ`` impressions on each row.
    Rare rows are shrunk most (few impressions against the same prior); frequent rows are left
    to their data. Only rows in the batch get a gradient (as in the mini-batch aware regulariser
    of Zhou et al. 2018, "Deep Interest Network", which weighs a row once per batch by ``1 /
    n``; here once per request, the unit of the counts). Columns whose weights are ``None``
    (hashed columns: no counts; a bucket holds many ids, where the prior is negligible) are
    not penalised.

    Args:
        scorer: a scorer with per-column tables (:func:`column_tables`).
        cat: ``[B, C]`` codes of the batch (after any unseen-value dropout).
        request: ``[B]`` request index of each row, or None (every row its own request).
        weights: per column ``[V_j + 1]`` weights (``1 / count``), or None.

    Returns:
        The penalty, a scalar.

    >>> from hybridrank.models.scorers import MLPScorer
    >>> s = MLPScorer(0, [3], hidden=(), emb_dim=2)
    >>> with torch.no_grad():
    ...     _ = s.embeddings.tables[0].weight.fill_(1.0)
    >>> w = [torch.tensor([1.0, 0.5, 0.25, 1.0])]         # codes 1 and 2 seen in 2 and 4 requests
    >>> frequency_penalty(s, torch.tensor([[1], [1], [2]]), torch.tensor([0, 0, 1]), w).item()
    0.5
    """
    total = cat.new_zeros((), dtype=torch.float32)
    n = cat.shape[0]
    if n == 0:
        return total
    if len(weights) != cat.shape[1]:
        raise ValueError(f"frequency_penalty: {len(weights)} weight tables for {cat.shape[1]} "
                         "categorical columns")
    rows = torch.arange(n, device=cat.device) if request is None else request.to(cat.device)
    tables = column_tables(scorer)
    for j, w in enumerate(weights):
        if w is None:
            continue
        size = w.shape[0]
        # one term per distinct (request, code) pair: sort the pair keys and keep the first of
        # each run (a sort has a fixed output size, so the device never reports a count to the
        # host, as torch.unique would)
        keys = torch.sort(rows * size + cat[:, j]).values
        first = torch.ones_like(keys, dtype=torch.bool)
        first[1:] = keys[1:] != keys[:-1]
        codes = keys % size
        wc = w.to(cat.device)[codes] * first
        for group in tables:
            total = total + weighted_square_norms(group[j], codes, wc)
    return total / n


def row_weights(counts: Mapping[str, Any], categorical: Sequence[str],
                sizes: Sequence[int]) -> list[torch.Tensor | None]:
    """Per categorical column the weights of :func:`frequency_penalty`: ``1 / max(n[c], 1)``.

    Args:
        counts: ``{column: [V + 1] counts}``, training requests holding each code
            (``ListDataModule.value_counts``); columns left out (hashed ones) get None.
        categorical: the categorical column names, in the order of ``cat``'s columns.
        sizes: the vocabulary size ``V`` of each column (the tables have ``V + 1`` rows).

    Returns:
        ``[V_j + 1]`` float32 tensors (None for columns without counts). A code never seen in
        training (code 0 of a vocabulary without missing values, which unseen-value dropout
        may still fill) counts as seen once.

    >>> row_weights({"item": [0, 4, 1]}, ["item", "hashed"], [2, 8])
    [tensor([1.0000, 0.2500, 1.0000]), None]
    """
    names = list(categorical)
    unknown = sorted(set(counts) - set(names))
    if unknown:
        raise ValueError(f"value counts for {unknown}, which are not categorical features {names}")
    out: list[torch.Tensor | None] = []
    for name, size in zip(names, sizes, strict=True):
        if name not in counts:
            out.append(None)
            continue
        c = torch.as_tensor(np.asarray(counts[name]), dtype=torch.float64)
        if c.ndim != 1 or c.shape[0] != int(size) + 1 or bool((c < 0).any()):
            raise ValueError(f"value counts of {name!r}: need {int(size) + 1} non-negative counts "
                             f"(code 0 and {int(size)} values), got shape {tuple(c.shape)}")
        out.append((1.0 / c.clamp(min=1.0)).float())
    return out
