"""Scorers: map the features of each impression to one logit (or two, for JRC).

A scorer takes the flat tensors of a batch, ``num [B, F]`` and ``cat [B, C]``, and returns
``[B, n_outputs]``. It holds no training-only code, so it can be exported as it is.

The scorer contract (every scorer in this file, and any a user plugs in):

- built as ``cls(n_numeric=F, vocab_sizes=[V_1..V_C], n_outputs=1|2, base_rate=p|None, **options)``:
  the sizes come from the data schema and the loss at run time, the options from ``conf/model``;
- ``forward(num [B, F] float32, cat [B, C] int64, request [B] int64 | None = None) -> [B, n_outputs]``.
  ``request`` is the list (request) index of each impression, rows of one request adjacent; scorers
  that do not look at the list ignore it, list-aware scorers need it;
- attributes ``n_numeric``, ``vocab_sizes``, ``n_outputs`` (the export builds example inputs from them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["MLPScorer", "LinearScorer", "embedding_dim"]


def embedding_dim(vocab_size: int, cap: int) -> int:
    """A common rule of thumb, ``6 * V^(1/4)``, capped at ``cap`` and at least 2."""
    return int(max(2, min(cap, round(6 * vocab_size**0.25))))


class _Embeddings(nn.Module):
    """One embedding table per categorical column, concatenated. Code 0 is the OOV bucket."""

    def __init__(self, vocab_sizes: Sequence[int], max_dim: int):
        super().__init__()
        self.tables = nn.ModuleList(
            nn.Embedding(int(v) + 1, embedding_dim(int(v) + 1, max_dim)) for v in vocab_sizes
        )
        for t in self.tables:
            nn.init.normal_(t.weight, std=0.05)
        self.out_dim = sum(t.embedding_dim for t in self.tables)

    def forward(self, cat: torch.Tensor) -> torch.Tensor:
        if not self.tables:
            return cat.new_zeros((cat.shape[0], 0), dtype=torch.float32)
        return torch.cat([t(cat[:, j]) for j, t in enumerate(self.tables)], dim=1)


class MLPScorer(nn.Module):
    """Embeddings of the categorical features + numeric features -> MLP -> ``n_outputs`` logits.

    Args:
        n_numeric: number of numeric features ``F``.
        vocab_sizes: vocabulary size of each categorical feature (without the OOV bucket).
        n_outputs: 1 (one click logit) or 2 (JRC: no-click and click logits).
        hidden: widths of the hidden layers.
        emb_dim: the largest embedding width.
        dropout: dropout after each hidden layer.
        base_rate: if given, the output bias starts at ``logit(base_rate)`` so the first steps do
            not spend themselves learning the click rate.
    """

    def __init__(
        self,
        n_numeric: int,
        vocab_sizes: Sequence[int] = (),
        n_outputs: int = 1,
        hidden: Sequence[int] = (128, 64),
        emb_dim: int = 16,
        dropout: float = 0.0,
        base_rate: float | None = None,
    ):
        super().__init__()
        if n_outputs not in (1, 2):
            raise ValueError(f"n_outputs must be 1 or 2, got {n_outputs}")
        self.n_numeric = int(n_numeric)
        self.vocab_sizes = tuple(int(v) for v in vocab_sizes)
        self.n_outputs = n_outputs
        self.embeddings = _Embeddings(self.vocab_sizes, emb_dim)
        layers: list[nn.Module] = []
        width = self.n_numeric + self.embeddings.out_dim
        if width == 0:
            raise ValueError("the scorer has no input: no numeric and no categorical feature")
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            width = h
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, n_outputs)
        init_output_bias(self.head, base_rate)

    def forward(self, num: torch.Tensor, cat: torch.Tensor,
                request: torch.Tensor | None = None) -> torch.Tensor:
        x = torch.cat([num, self.embeddings(cat)], dim=1)
        return self.head(self.body(x))


class LinearScorer(MLPScorer):
    """Logistic regression on numeric features and categorical embeddings (no hidden layer)."""

    def __init__(self, n_numeric: int, vocab_sizes: Sequence[int] = (), n_outputs: int = 1,
                 emb_dim: int = 1, base_rate: float | None = None):
        super().__init__(n_numeric, vocab_sizes, n_outputs, hidden=(), emb_dim=emb_dim,
                         base_rate=base_rate)


def init_output_bias(head: nn.Linear, base_rate: float | None) -> None:
    """Start the click logit at ``logit(base_rate)`` (for two outputs: ``z1 - z0``)."""
    if base_rate is None:
        return
    p = min(max(float(base_rate), 1e-4), 1 - 1e-4)
    with torch.no_grad():
        head.bias.zero_()
        head.bias[-1] = math.log(p / (1 - p))
