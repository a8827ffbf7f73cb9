"""The data model shared by every part of hybridrank: splits as flat tensors, batches as padded lists.

Glossary (used by every docstring in the package):

- ``N`` impressions of a split are stored flat and **sorted by request**; request ``r`` owns rows
  ``offsets[r]:offsets[r + 1]``.
- A **list** is a padded row of a ``[G, L]`` tensor: ``G`` lists of at most ``L`` impressions.
  ``mask[g, i]`` is True where a real impression sits; padding is never marked by a label value.
- **Request lists** are what metrics rank (NDCG, GAUC, ...). **Rank lists** are what the ranking
  term of the loss sees: the request lists themselves (scope ``request``) or impressions of several
  requests of one session / user pooled into one list (pseudo-pairs, docs/CONVENTIONS.md §1.2).
- ``index[g, i]`` points into the flat impressions of a batch; padding slots point at row 0 and are
  masked, so a gather ``flat[index]`` is always in range.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import numpy as np
import torch

__all__ = ["ListData", "Batch", "pad_index", "lengths_to_offsets", "gather_lists", "pack",
           "slice_requests"]


@dataclass
class ListData:
    """One split of impressions as flat tensors, sorted by request.

    Attributes:
        num: ``[N, F]`` float32 numeric features (already normalised with the train statistics).
        cat: ``[N, C]`` int64 categorical codes; 0 is the out-of-vocabulary bucket.
        label: ``[N]`` float32 graded label (clicks are 0/1).
        offsets: ``[R + 1]`` int64 request boundaries.
        scope: name -> ``[R]`` int64 dense ids of each request's pooling scope
            (e.g. ``{"session": ..., "user": ...}``); absent scopes are simply missing.
        position: ``[N]`` int64 1-based display position, or None.
        bid: ``[N]`` float32 bid, or None.
        true_p: ``[N]`` float32 true click probability (simulated data only), or None.
        explore: ``[N]`` bool, impressions of exploration (random-order) requests, or None.
        propensity: ``[N]`` float32 logging propensity of the item in its slot, or None.
        request_key: ``[R]`` original request ids as a Python/polars sequence (for exports).
        item_key: ``[N]`` original item ids, or None.
        time: ``[R]`` int64 request time (seconds or any monotone unit), or None.
    """

    num: torch.Tensor
    cat: torch.Tensor
    label: torch.Tensor
    offsets: torch.Tensor
    scope: dict[str, torch.Tensor] = field(default_factory=dict)
    position: torch.Tensor | None = None
    bid: torch.Tensor | None = None
    true_p: torch.Tensor | None = None
    explore: torch.Tensor | None = None
    propensity: torch.Tensor | None = None
    request_key: object | None = None
    item_key: object | None = None
    time: torch.Tensor | None = None

    @property
    def n_impressions(self) -> int:
        return int(self.label.shape[0])

    @property
    def n_requests(self) -> int:
        return int(self.offsets.shape[0]) - 1

    @property
    def lengths(self) -> torch.Tensor:
        """``[R]`` impressions per request."""
        return self.offsets[1:] - self.offsets[:-1]

    def request_of_row(self) -> torch.Tensor:
        """``[N]`` request index of every impression."""
        return torch.repeat_interleave(torch.arange(self.n_requests), self.lengths)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor of the split by field name (``scope`` ones as ``scope.<name>``)."""
        out = {f.name: v for f in fields(self) for v in [getattr(self, f.name)]
               if isinstance(v, torch.Tensor)}
        out.update({f"scope.{k}": v for k, v in self.scope.items()})
        return out

    @property
    def nbytes(self) -> int:
        """Bytes of its tensors: what a copy of the split on a device costs (keys left out)."""
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    @property
    def device(self) -> torch.device:
        """Where its impressions live (the device of ``label``)."""
        return self.label.device

    def _map(self, fn) -> ListData:
        moved = {f.name: fn(v) for f in fields(self) for v in [getattr(self, f.name)]
                 if isinstance(v, torch.Tensor)}
        return replace(self, **moved, scope={k: fn(v) for k, v in self.scope.items()})

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> ListData:
        """The split with every tensor on ``device`` (a tensor already there is kept, not copied;
        the request / item keys stay where they are).

        >>> d = ListData(num=torch.zeros(3, 1), cat=torch.zeros(3, 0, dtype=torch.long),
        ...              label=torch.ones(3), offsets=torch.tensor([0, 3]))
        >>> d.to("cpu").num is d.num, d.to("meta").label.device.type
        (True, 'meta')
        """
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> ListData:
        """The split with its tensors in page-locked host memory, so that ``to(cuda,
        non_blocking=True)`` copies run asynchronously (needs CUDA)."""
        return self._map(lambda t: t.pin_memory())

    def chunks(self, max_rows: int):
        """Yield consecutive pieces of whole requests of at most ``max_rows`` impressions each
        (a longer request is a piece of its own), as :func:`slice_requests` views."""
        bounds = pack(self.lengths.numpy(), max_rows)
        for r0, r1 in zip(bounds[:-1], bounds[1:]):
            yield slice_requests(self, int(r0), int(r1))


@dataclass
class Batch:
    """A batch of whole requests, flat impressions plus two padded list views.

    Attributes:
        num, cat, label: flat ``[B, F]``, ``[B, C]``, ``[B]`` impressions of the batch.
        index, mask: ``[G, L]`` request lists (what metrics rank).
        rank_index, rank_mask: ``[G', L']`` rank lists (what the ranking loss sees).
        rows: ``[B]`` row numbers in the split (for exports and tests).
        request: ``[B]`` index of each impression's request list in the batch (rows of one request
            adjacent, non-decreasing): what list-aware scorers attend within.
        weight: ``[B]`` per-impression weight (1 / keep-rate for down-sampled negatives), or None.
        position: ``[B]`` positions, or None.
        explore, propensity: ``[B]`` exploration flags / logging propensities, or None.
    """

    num: torch.Tensor
    cat: torch.Tensor
    label: torch.Tensor
    index: torch.Tensor
    mask: torch.Tensor
    rank_index: torch.Tensor
    rank_mask: torch.Tensor
    rows: torch.Tensor
    request: torch.Tensor | None = None
    weight: torch.Tensor | None = None
    position: torch.Tensor | None = None
    explore: torch.Tensor | None = None
    propensity: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> Batch:
        moved = {
            f.name: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v)
            for f in fields(self)
            for v in [getattr(self, f.name)]
        }
        return replace(self, **moved)

    def __len__(self) -> int:
        return int(self.label.shape[0])


def lengths_to_offsets(lengths: torch.Tensor) -> torch.Tensor:
    """``[R]`` lengths -> ``[R + 1]`` offsets (exclusive cumulative sum)."""
    out = torch.zeros(lengths.shape[0] + 1, dtype=torch.long, device=lengths.device)
    torch.cumsum(lengths, 0, out=out[1:])
    return out


def pad_index(lengths: torch.Tensor, max_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded ``[G, L]`` index into a flat array laid out list after list, plus its mask.

    Vectorised: no Python loop over lists. With ``max_len`` given it reads no value back from
    the device (the width is a host int), so it runs asynchronously on an accelerator.

    >>> idx, m = pad_index(torch.tensor([2, 0, 3]))
    >>> idx.tolist(), m.tolist()
    ([[0, 1, 0], [0, 0, 0], [2, 3, 4]], [[True, True, False], [False, False, False], [True, True, True]])
    """
    lengths = lengths.long()
    width = int(lengths.max()) if max_len is None and lengths.numel() else (max_len or 0)
    starts = lengths_to_offsets(lengths)[:-1]
    ar = torch.arange(width, device=lengths.device)
    mask = ar.unsqueeze(0) < lengths.unsqueeze(1)
    index = torch.where(mask, starts.unsqueeze(1) + ar.unsqueeze(0),
                        torch.zeros((), dtype=torch.long, device=lengths.device))
    return index, mask


def gather_lists(flat: torch.Tensor, index: torch.Tensor, mask: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
    """Gather a flat ``[B, ...]`` tensor into padded ``[G, L, ...]`` lists; padding gets ``fill``."""
    out = flat[index]
    m = mask.reshape(mask.shape + (1,) * (out.dim() - mask.dim()))
    return out.masked_fill(~m, fill)


def pack(sizes, budget: int) -> np.ndarray:
    """Greedy packing of consecutive items into groups of total size at most ``budget``.

    The one whole-request chunker: the sampler packs pooling units into batches, exports and
    streaming cut requests into chunks with it. An item larger than ``budget`` forms a group of
    its own (items are never cut). One binary search per group, no loop over items.

    Args:
        sizes: ``[n]`` non-negative sizes (impressions per request or unit), in order.
        budget: the largest total size of a group (``>= 1``).

    Returns:
        ``[k + 1]`` int64 group bounds: group ``j`` holds items ``bounds[j]:bounds[j + 1]``.

    >>> pack([3, 2, 4, 1, 9, 1], 5).tolist()
    [0, 2, 4, 5, 6]
    """
    if budget < 1:
        raise ValueError(f"pack: budget must be >= 1, got {budget}")
    sizes = np.asarray(sizes, dtype=np.int64)
    cum = np.concatenate([[0], np.cumsum(sizes)])
    bounds = [0]
    n = sizes.shape[0]
    while bounds[-1] < n:
        s = bounds[-1]
        e = int(np.searchsorted(cum, cum[s] + budget, side="right")) - 1
        bounds.append(max(e, s + 1))
    return np.asarray(bounds, dtype=np.int64)


def slice_requests(data: ListData, r0: int, r1: int) -> ListData:
    """Requests ``r0:r1`` of a split as their own :class:`ListData` (views, no copies)."""
    s, e = int(data.offsets[r0]), int(data.offsets[r1])

    def rows(t):
        return None if t is None else t[s:e]

    def keys(k, a, b):
        if k is None:
            return None
        return k.slice(a, b - a) if hasattr(k, "slice") else k[a:b]

    return ListData(
        num=data.num[s:e], cat=data.cat[s:e], label=data.label[s:e],
        offsets=data.offsets[r0:r1 + 1] - s,
        scope={k: v[r0:r1] for k, v in data.scope.items()},
        position=rows(data.position), bid=rows(data.bid), true_p=rows(data.true_p),
        explore=rows(data.explore), propensity=rows(data.propensity),
        request_key=keys(data.request_key, r0, r1), item_key=keys(data.item_key, s, e),
        time=None if data.time is None else data.time[r0:r1],
    )
