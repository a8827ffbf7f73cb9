"""Scorers: map the features of each impression to one logit (or two, for JRC).

A scorer takes the flat tensors of a batch, ``num [B, F]`` and ``cat [B, C]``, and returns
``[B, n_outputs]``. It holds no training-only code, so it can be exported as it is.

The scorer contract (every scorer in this file, and any a user plugs in):

- built as ``cls(n_numeric=F, vocab_sizes=[V_1..V_C], n_outputs=1|2, base_rate=p|None, **options)``:
  the sizes come from the data schema and the loss at run time, the options from ``conf/model``;
- ``forward(num [B, F] float32, cat [B, C] int64, request [B] int64 | None = None) -> [B, n_outputs]``.
  ``request`` is the list (request) index of each impression, rows of one request adjacent; scorers
  that do not look at the list ignore it, list-aware scorers need it;
- attributes ``n_numeric``, ``vocab_sizes``, ``n_outputs`` (the export builds example inputs from them),
  and ``list_aware`` (True when the output of an impression depends on the other impressions of
  its request: the export then needs a ``request`` input, and batches must hold whole requests).

Categorical code 0 is the out-of-vocabulary bucket, so a table has ``V + 1`` rows. With two
outputs the click logit is ``z1 - z0``; ``base_rate`` sets the starting click logit.

The scorers:

- :class:`MLPScorer` / :class:`LinearScorer`: an MLP (or a logistic regression) over the
  concatenated embeddings and numeric features;
- :class:`FMScorer` / :class:`DeepFMScorer`: factorization machine (Rendle 2010), plus an MLP on the
  shared embeddings (Guo et al. 2017);
- :class:`DCNv2Scorer`: cross network (Wang et al. 2021), stacked or parallel with an MLP;
- :class:`ListAwareScorer`: self-attention over the impressions of each request (Pobrotyn et al.
  2020), so a score depends on its list.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from hybridrank.models.attention import ListAttentionBlock, check_request, list_layout
from hybridrank.models.optim import SPARSE_MIN_ELEMENTS

__all__ = ["MLPScorer", "LinearScorer", "FMScorer", "DeepFMScorer", "DCNv2Scorer", "ListAwareScorer",
           "embedding_dim", "init_output_bias", "column_tables", "clip_numeric", "shift_click_logit"]


def embedding_dim(vocab_size: int, cap: int) -> int:
    """A common rule of thumb, ``6 * V^(1/4)``, capped at ``cap`` and at least 2."""
    return int(max(2, min(cap, round(6 * vocab_size**0.25))))


class _RowLookup(torch.autograd.Function):
    """``weight[codes]`` whose backward adds each code's gradient into a zeroed copy of the table
    with ``index_add_``. The same gradient as ``nn.Embedding``'s; under the deterministic mode the
    shipped trainer runs in, the embedding's own CPU backward orders the codes first, which cost
    0.21-0.27 ms against 0.12-0.17 ms for the whole lookup, forward and backward, of 4,096 codes
    (this project's 2-core machine; tables of 22-9,201 rows). The incoming gradient is made
    contiguous first: a scorer concatenates its tables' rows, so each table gets a strided slice,
    which ``index_add_`` reads slowly (the MLP scorer's step gained nothing without it)."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(codes)
        ctx.rows = weight.shape[0]
        return weight.index_select(0, codes)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (codes,) = ctx.saved_tensors
        return grad.new_zeros((ctx.rows, *grad.shape[1:])).index_add_(0, codes, grad.contiguous()), None


def lookup_rows(table: nn.Embedding, codes: torch.Tensor) -> torch.Tensor:
    """``table(codes)`` for ``[B]`` codes: through :class:`_RowLookup` when a training step needs
    the gradient of a plain table with dense gradients (none of ``padding_idx``, ``max_norm``,
    ``scale_grad_by_freq``; under :data:`~hybridrank.models.optim.SPARSE_MIN_ELEMENTS` weights, the
    size from which ``sparse_tables: auto`` makes a table sparse; on the CPU, where it was measured:
    an accelerator keeps its own embedding backward until measured there); through the embedding
    itself otherwise (sparse tables, inference, a TorchScript trace or an ONNX export, which record
    the plain lookup).

    >>> t = nn.Embedding(4, 2)
    >>> codes = torch.tensor([1, 3, 1])
    >>> torch.equal(lookup_rows(t, codes), t(codes))
    True
    >>> lookup_rows(t, codes).sum().backward()
    >>> t.weight.grad[:, 0].tolist()                          # row 1 used twice, row 3 once
    [0.0, 2.0, 0.0, 1.0]
    """
    w = table.weight
    if (table.sparse or not (torch.is_grad_enabled() and w.requires_grad)
            or table.padding_idx is not None or table.max_norm is not None or table.scale_grad_by_freq
            or w.numel() >= SPARSE_MIN_ELEMENTS or w.device.type != "cpu"
            or torch.jit.is_tracing() or torch.jit.is_scripting()
            or torch.onnx.is_in_onnx_export() or codes.dim() != 1):
        return table(codes)
    return _RowLookup.apply(w, codes)


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
        return torch.cat([lookup_rows(t, cat[:, j]) for j, t in enumerate(self.tables)], dim=1)


class _FieldEmbeddings(nn.Module):
    """Every feature as a field vector of one width ``k``: ``[B, F + C, k]``.

    A categorical field is its table row (code 0 = OOV); a numeric field ``j`` is ``x_j * v_j``
    with a learned ``v_j``, as in Rendle's factorization machine over real-valued features.
    Initial values ``N(0, 0.01^2)`` keep the starting pairwise term small even with many fields.
    """

    def __init__(self, n_numeric: int, vocab_sizes: Sequence[int], dim: int):
        super().__init__()
        self.numeric = nn.Parameter(0.01 * torch.randn(n_numeric, dim))
        self.tables = nn.ModuleList(nn.Embedding(int(v) + 1, dim) for v in vocab_sizes)
        for t in self.tables:
            nn.init.normal_(t.weight, std=0.01)
        self.n_fields, self.dim = n_numeric + len(self.tables), dim

    def forward(self, num: torch.Tensor, cat: torch.Tensor) -> torch.Tensor:
        parts = [num[:, :, None] * self.numeric] if self.numeric.shape[0] else []
        if self.tables:
            parts.append(torch.stack([lookup_rows(t, cat[:, j]) for j, t in enumerate(self.tables)], dim=1))
        return torch.cat(parts, dim=1)


def _check_sizes(n_outputs: int, width: int) -> None:
    if n_outputs not in (1, 2):
        raise ValueError(f"n_outputs must be 1 or 2, got {n_outputs}")
    if width == 0:
        raise ValueError("the scorer has no input: no numeric and no categorical feature")


def _check_clip(bound: float | None) -> float | None:
    if bound is None:
        return None
    if not float(bound) > 0:
        raise ValueError(f"numeric_clip must be > 0 or None, got {bound}")
    return float(bound)


def clip_numeric(num: torch.Tensor, bound: float | None) -> torch.Tensor:
    """Standardised numeric features limited to ``[-bound, bound]`` (None: as they are).

    A value many training standard deviations out (a heavy-tailed feature at serving time) is
    read as the edge of the training range instead of being extrapolated: polynomial scorers
    (the FM's products of numeric fields, DCN-v2's cross layers: degree ``n_cross + 1``) would
    otherwise turn it into an extreme logit.

    >>> clip_numeric(torch.tensor([[-9.0, 0.5, 40.0]]), 5.0)
    tensor([[-5.0000,  0.5000,  5.0000]])
    """
    return num if bound is None else num.clamp(-bound, bound)


def _mlp(width: int, hidden: Sequence[int], dropout: float) -> tuple[nn.Sequential, int]:
    """``Linear -> ReLU [-> Dropout]`` per hidden width; returns the tower and its output width."""
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(width, int(h)), nn.ReLU()]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        width = int(h)
    return nn.Sequential(*layers), width


def _zero_head(width: int, n_outputs: int, base_rate: float | None, bias: bool = True) -> nn.Linear:
    """Output layer with zero weights: the click logit starts at exactly ``logit(base_rate)``."""
    head = nn.Linear(width, n_outputs, bias=bias)
    nn.init.zeros_(head.weight)
    if bias:
        nn.init.zeros_(head.bias)
        init_output_bias(head, base_rate)
    return head


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
        numeric_clip: numeric inputs limited to ``[-numeric_clip, numeric_clip]`` standard
            deviations (:func:`clip_numeric`; None: as they are). Every scorer takes it.
    """

    list_aware = False

    def __init__(
        self,
        n_numeric: int,
        vocab_sizes: Sequence[int] = (),
        n_outputs: int = 1,
        hidden: Sequence[int] = (128, 64),
        emb_dim: int = 16,
        dropout: float = 0.0,
        base_rate: float | None = None,
        numeric_clip: float | None = None,
    ):
        super().__init__()
        self.numeric_clip = _check_clip(numeric_clip)
        if n_outputs not in (1, 2):
            raise ValueError(f"n_outputs must be 1 or 2, got {n_outputs}")
        self.n_numeric = int(n_numeric)
        self.vocab_sizes = tuple(int(v) for v in vocab_sizes)
        self.n_outputs = n_outputs
        self.embeddings = _Embeddings(self.vocab_sizes, emb_dim)
        width = self.n_numeric + self.embeddings.out_dim
        _check_sizes(n_outputs, width)
        self.body, width = _mlp(width, hidden, dropout)
        self.head = nn.Linear(width, n_outputs)
        init_output_bias(self.head, base_rate)

    def forward(self, num: torch.Tensor, cat: torch.Tensor,
                request: torch.Tensor | None = None) -> torch.Tensor:
        x = torch.cat([clip_numeric(num, self.numeric_clip), self.embeddings(cat)], dim=1)
        return self.head(self.body(x))


class LinearScorer(MLPScorer):
    """Logistic regression on numeric features and categorical embeddings (no hidden layer)."""

    def __init__(self, n_numeric: int, vocab_sizes: Sequence[int] = (), n_outputs: int = 1,
                 emb_dim: int = 1, base_rate: float | None = None, numeric_clip: float | None = None):
        super().__init__(n_numeric, vocab_sizes, n_outputs, hidden=(), emb_dim=emb_dim,
                         base_rate=base_rate, numeric_clip=numeric_clip)


class DeepFMScorer(nn.Module):
    """Factorization machine over all fields, plus an MLP on the shared embeddings (DeepFM).

    With field vectors ``e_f`` (:class:`_FieldEmbeddings`: categorical rows, numeric ``x_j v_j``),

        z_o = b_o + sum_f w_o(f) + a_o . p + u_o . MLP([num, e_cat])
        p   = 1/2 * ((sum_f e_f)^2 - sum_f e_f^2)         (elementwise, [k]; O(fields * k))

    so ``1 . p = sum_{f < f'} <e_f, e_f'>`` is the FM's pairwise term (Rendle 2010). ``w_o(f)`` are
    the first-order weights (a 1-wide table per categorical, a linear map of the numerics). The
    interaction weights ``a_o`` start at 1 for the click output and 0 for the no-click output of
    JRC, so the click logit starts as the classic FM; the MLP output weights ``u_o`` and the
    first-order weights start at 0. The MLP (Guo et al. 2017) reads the numeric features and the
    categorical field embeddings, shared with the FM; ``hidden=()`` leaves a plain FM.

    Args:
        n_numeric: number of numeric features ``F``.
        vocab_sizes: vocabulary size of each categorical feature (without the OOV bucket).
        n_outputs: 1 or 2 (JRC).
        emb_dim: width ``k`` of every field embedding.
        hidden: hidden widths of the MLP; ``()`` for a plain FM.
        dropout: dropout after each hidden layer.
        base_rate: starting click rate (the click logit starts at ``logit(base_rate)`` up to the
            small pairwise term of the random embeddings).
        numeric_clip: numeric inputs limited to ``[-numeric_clip, numeric_clip]`` (None: as they
            are): the pairwise term is quadratic in them.

    >>> s = DeepFMScorer(2, [10, 5], n_outputs=2, emb_dim=4, hidden=(8,))
    >>> s(torch.randn(3, 2), torch.tensor([[1, 0], [10, 5], [3, 2]])).shape
    torch.Size([3, 2])
    """

    list_aware = False

    def __init__(self, n_numeric: int, vocab_sizes: Sequence[int] = (), n_outputs: int = 1,
                 emb_dim: int = 16, hidden: Sequence[int] = (128, 64), dropout: float = 0.0,
                 base_rate: float | None = None, numeric_clip: float | None = None):
        super().__init__()
        self.numeric_clip = _check_clip(numeric_clip)
        self.n_numeric = int(n_numeric)
        self.vocab_sizes = tuple(int(v) for v in vocab_sizes)
        self.n_outputs = n_outputs
        _check_sizes(n_outputs, self.n_numeric + len(self.vocab_sizes))
        self.fields = _FieldEmbeddings(self.n_numeric, self.vocab_sizes, int(emb_dim))
        self.first_num = _zero_head(self.n_numeric, n_outputs, None, bias=False) if self.n_numeric else None
        self.first_cat = nn.ModuleList(nn.Embedding(v + 1, n_outputs) for v in self.vocab_sizes)
        for t in self.first_cat:
            nn.init.zeros_(t.weight)
        self.fm_head = nn.Linear(int(emb_dim), n_outputs)  # a_o and the global bias b_o
        with torch.no_grad():
            self.fm_head.weight.zero_()
            self.fm_head.weight[-1] = 1.0
            self.fm_head.bias.zero_()
        init_output_bias(self.fm_head, base_rate)
        self.deep: nn.Sequential | None = None
        self.deep_head: nn.Linear | None = None
        if len(hidden):
            self.deep, width = _mlp(self.n_numeric + len(self.vocab_sizes) * int(emb_dim), hidden, dropout)
            self.deep_head = _zero_head(width, n_outputs, None, bias=False)

    def forward(self, num: torch.Tensor, cat: torch.Tensor,
                request: torch.Tensor | None = None) -> torch.Tensor:
        num = clip_numeric(num, self.numeric_clip)
        e = self.fields(num, cat)
        s = e.sum(dim=1)
        z = self.fm_head(0.5 * (s * s - (e * e).sum(dim=1)))
        if self.first_num is not None:
            z = z + self.first_num(num)
        for j, t in enumerate(self.first_cat):
            z = z + lookup_rows(t, cat[:, j])
        if self.deep is not None and self.deep_head is not None:
            x = torch.cat([num, e[:, self.n_numeric:].flatten(1)], dim=1)
            z = z + self.deep_head(self.deep(x))
        return z


class FMScorer(DeepFMScorer):
    """Factorization machine (Rendle 2010): :class:`DeepFMScorer` without the MLP.

    >>> FMScorer(3, [4], emb_dim=2, base_rate=0.5)(torch.zeros(2, 3), torch.zeros(2, 1, dtype=torch.long))
    tensor([[0.],
            [0.]], grad_fn=<AddBackward0>)
    """

    def __init__(self, n_numeric: int, vocab_sizes: Sequence[int] = (), n_outputs: int = 1,
                 emb_dim: int = 16, base_rate: float | None = None, numeric_clip: float | None = None):
        super().__init__(n_numeric, vocab_sizes, n_outputs, emb_dim=emb_dim, hidden=(),
                         base_rate=base_rate, numeric_clip=numeric_clip)


class _CrossLayer(nn.Module):
    """``x_{l+1} = x0 * (W x_l + b) + x_l``, ``W`` full (``[d, d]``) or low-rank ``U V^T``."""

    def __init__(self, width: int, low_rank: int | None):
        super().__init__()
        if low_rank is None:
            self.w: nn.Module = nn.Linear(width, width)
        else:
            self.w = nn.Sequential(nn.Linear(width, int(low_rank), bias=False), nn.Linear(int(low_rank), width))
        nn.init.zeros_(self.w.bias if low_rank is None else self.w[1].bias)

    def forward(self, x0: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return x0 * self.w(x) + x


class DCNv2Scorer(nn.Module):
    """Deep & Cross Network v2: a cross network and an MLP on the concatenated features.

    With ``x0 = [num, emb(cat)]`` (width ``d``), each cross layer computes

        x_{l+1} = x0 * (W_l x_l + b_l) + x_l

    (``*`` elementwise; ``W_l`` is ``d x d``, or ``U_l V_l^T`` of rank ``low_rank``), so ``n_cross``
    layers hold every feature cross up to degree ``n_cross + 1``. ``structure="parallel"``: the
    head reads ``[cross(x0), MLP(x0)]``; ``"stacked"``: the head reads ``MLP(cross(x0))``;
    ``hidden=()`` leaves the cross network alone. The output weights start at 0, so the click
    logit starts at ``logit(base_rate)``. Reference: Wang et al. 2021, "DCN V2: Improved Deep &
    Cross Network and Practical Lessons for Web-scale Learning to Rank Systems".

    Args:
        n_numeric: number of numeric features ``F``.
        vocab_sizes: vocabulary size of each categorical feature (without the OOV bucket).
        n_outputs: 1 or 2 (JRC).
        n_cross: number of cross layers.
        low_rank: rank of ``W_l`` (``None``: full rank).
        structure: ``"parallel"`` or ``"stacked"``.
        hidden: hidden widths of the MLP.
        emb_dim: the largest embedding width (``6 V^(1/4)`` rule, capped).
        dropout: dropout after each hidden layer.
        base_rate: starting click rate.
        numeric_clip: numeric inputs limited to ``[-numeric_clip, numeric_clip]`` (None: as they
            are): the cross network is a polynomial of degree ``n_cross + 1`` in them.

    >>> DCNv2Scorer(2, [10], n_outputs=2, hidden=(8,))(torch.randn(4, 2), torch.ones(4, 1, dtype=torch.long)).shape
    torch.Size([4, 2])
    """

    list_aware = False

    def __init__(self, n_numeric: int, vocab_sizes: Sequence[int] = (), n_outputs: int = 1,
                 n_cross: int = 3, low_rank: int | None = None, structure: str = "parallel",
                 hidden: Sequence[int] = (128, 64), emb_dim: int = 16, dropout: float = 0.0,
                 base_rate: float | None = None, numeric_clip: float | None = None):
        super().__init__()
        self.numeric_clip = _check_clip(numeric_clip)
        if structure not in ("parallel", "stacked"):
            raise ValueError(f"structure must be 'parallel' or 'stacked', got {structure!r}")
        if n_cross < 0 or (low_rank is not None and low_rank < 1):
            raise ValueError(f"need n_cross >= 0 and low_rank >= 1 or None, got {n_cross}, {low_rank}")
        self.n_numeric = int(n_numeric)
        self.vocab_sizes = tuple(int(v) for v in vocab_sizes)
        self.n_outputs = n_outputs
        self.structure = structure
        self.embeddings = _Embeddings(self.vocab_sizes, emb_dim)
        width = self.n_numeric + self.embeddings.out_dim
        _check_sizes(n_outputs, width)
        self.cross = nn.ModuleList(_CrossLayer(width, low_rank) for _ in range(n_cross))
        self.deep, deep_width = _mlp(width, hidden, dropout)
        head_width = deep_width if structure == "stacked" or not len(hidden) else width + deep_width
        self.head = _zero_head(head_width, n_outputs, base_rate)

    def forward(self, num: torch.Tensor, cat: torch.Tensor,
                request: torch.Tensor | None = None) -> torch.Tensor:
        x0 = torch.cat([clip_numeric(num, self.numeric_clip), self.embeddings(cat)], dim=1)
        x = x0
        for layer in self.cross:
            x = layer(x0, x)
        if self.structure == "stacked" or not len(self.deep):
            return self.head(self.deep(x))
        return self.head(torch.cat([x, self.deep(x0)], dim=1))


class ListAwareScorer(nn.Module):
    """Self-attention over the impressions of each request: an impression's score depends on its list.

    Each impression is encoded on its own (``[num, emb(cat)] -> MLP -> d_model``), then
    ``n_layers`` pre-norm Transformer blocks let it attend to the impressions of its request
    (:class:`~hybridrank.models.attention.ListAttentionBlock`; never to other requests of the batch nor
    to padding), then ``LayerNorm -> Linear`` gives the logits. No positional encoding: permuting
    a request's impressions permutes their outputs (give the display position as a feature if it
    matters). The output weights start at 0, so the click logit starts at ``logit(base_rate)``.
    This is the context-aware ranker of Pobrotyn et al. 2020 ("Context-Aware Learning to Rank with
    Self-Attention", allRank).

    ``request`` is required (a ValueError otherwise): the rows of one request must be adjacent,
    and batches must hold whole requests, since a request cut in two is scored as two lists.
    Attention runs on padded blocks of lists of similar lengths, computed from ``request`` with
    tensor operations only (:func:`~hybridrank.models.attention.list_layout`, which also gives the
    memory), so a ``torch.jit.trace`` (TorchScript) or ONNX export serves any batch size, number
    of lists and list lengths, and computes what eager PyTorch does.

    Args:
        n_numeric: number of numeric features ``F``.
        vocab_sizes: vocabulary size of each categorical feature (without the OOV bucket).
        n_outputs: 1 or 2 (JRC).
        d_model: width of the attention layers.
        n_heads: attention heads (divides ``d_model``).
        n_layers: attention blocks.
        ffn_dim: hidden width of each block's feed-forward part.
        hidden: hidden widths of the per-impression encoder before the projection to ``d_model``.
        emb_dim: the largest embedding width.
        dropout: dropout in the encoder MLP and on the blocks' residual branches.
        length_bounds: list lengths that separate the blocks of the attention layout (``()``: one
            block padded to the longest list of the batch).
        base_rate: starting click rate.
        numeric_clip: numeric inputs limited to ``[-numeric_clip, numeric_clip]`` (None: as they are).

    >>> s = ListAwareScorer(2, [5], d_model=8, n_heads=2, ffn_dim=8, hidden=())
    >>> s(torch.randn(5, 2), torch.ones(5, 1, dtype=torch.long), torch.tensor([0, 0, 0, 1, 1])).shape
    torch.Size([5, 1])
    """

    list_aware = True

    def __init__(self, n_numeric: int, vocab_sizes: Sequence[int] = (), n_outputs: int = 1,
                 d_model: int = 32, n_heads: int = 2, n_layers: int = 2, ffn_dim: int = 64,
                 hidden: Sequence[int] = (128,), emb_dim: int = 16, dropout: float = 0.0,
                 length_bounds: Sequence[int] = (8, 32, 128, 512), base_rate: float | None = None,
                 numeric_clip: float | None = None):
        super().__init__()
        self.numeric_clip = _check_clip(numeric_clip)
        self.n_numeric = int(n_numeric)
        self.vocab_sizes = tuple(int(v) for v in vocab_sizes)
        self.n_outputs = n_outputs
        self.length_bounds = tuple(int(n) for n in length_bounds)
        if any(n < 1 for n in self.length_bounds) or list(self.length_bounds) != sorted(set(self.length_bounds)):
            raise ValueError(f"length_bounds must be increasing positive lengths, got {length_bounds}")
        self.embeddings = _Embeddings(self.vocab_sizes, emb_dim)
        width = self.n_numeric + self.embeddings.out_dim
        _check_sizes(n_outputs, width)
        body, width = _mlp(width, hidden, dropout)
        self.encoder = nn.Sequential(*body, nn.Linear(width, int(d_model)))
        self.blocks = nn.ModuleList(ListAttentionBlock(int(d_model), int(n_heads), int(ffn_dim), dropout)
                                    for _ in range(n_layers))
        self.norm = nn.LayerNorm(int(d_model))
        self.head = _zero_head(int(d_model), n_outputs, base_rate)

    def forward(self, num: torch.Tensor, cat: torch.Tensor,
                request: torch.Tensor | None = None) -> torch.Tensor:
        exporting = torch.jit.is_tracing() or torch.jit.is_scripting() or torch.compiler.is_compiling()
        if not exporting:
            check_request(request, num.shape[0], type(self).__name__)
        assert request is not None  # checked above; for TorchScript's type refinement
        h = self.encoder(torch.cat([clip_numeric(num, self.numeric_clip), self.embeddings(cat)], dim=1))
        if not exporting and num.shape[0] == 0:
            return self.head(self.norm(h))
        layout = list_layout(request, self.length_bounds, skip_empty=not exporting)
        for block in self.blocks:
            h = block(h, layout)
        return self.head(self.norm(h))


def init_output_bias(head: nn.Linear, base_rate: float | None) -> None:
    """Start the click logit at ``logit(base_rate)`` (for two outputs: ``z1 - z0``)."""
    if base_rate is None:
        return
    p = min(max(float(base_rate), 1e-4), 1 - 1e-4)
    with torch.no_grad():
        head.bias.zero_()
        head.bias[-1] = torch.logit(torch.tensor(p, dtype=torch.float64)).item()


def column_tables(scorer: nn.Module) -> list[nn.ModuleList]:
    """The scorer's embedding tables indexed by the categorical columns: every ``nn.ModuleList`` of
    ``nn.Embedding`` with one table per column of ``cat`` (``V_j + 1`` rows each). The scorers of
    this module follow that layout (and so may a user's scorer)."""
    sizes = tuple(int(v) + 1 for v in getattr(scorer, "vocab_sizes", ()))
    if not sizes:
        return []
    return [m for m in scorer.modules()
            if isinstance(m, nn.ModuleList) and len(m) == len(sizes)
            and all(isinstance(t, nn.Embedding) and t.num_embeddings == v for t, v in zip(m, sizes))]


def _click_head(scorer: nn.Module) -> nn.Linear | None:
    """The linear layer whose last output's bias is the click logit's intercept (``head`` or, for
    the factorization machines, ``fm_head``), or None."""
    for name in ("head", "fm_head"):
        head = getattr(scorer, name, None)
        if isinstance(head, nn.Linear) and head.bias is not None:
            return head
    return None


@torch.no_grad()
def shift_click_logit(scorer: nn.Module, delta: float) -> bool:
    """Add ``delta`` to the scorer's click logit (the bias of its last output: for two-output JRC
    heads the click logit ``z1 - z0`` moves by ``delta``); False when the scorer has no such bias.

    >>> s = MLPScorer(1, hidden=(), base_rate=0.5)
    >>> shift_click_logit(s, 0.25), s(torch.zeros(1, 1), torch.zeros(1, 0, dtype=torch.long)).item()
    (True, 0.25)
    """
    head = _click_head(scorer)
    if head is None:
        return False
    head.bias[-1] += float(delta)
    return True

