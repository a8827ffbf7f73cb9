"""Training the out-of-vocabulary row: unseen-value dropout.

A categorical value never seen in training gets code 0 (:mod:`hybridrank.data.vocab`). Under the
default vocabulary policy (``min_count: 1``) no training row has code 0 unless its value is
missing, so row 0 of an embedding table would keep its random initial value and every new item,
user or ad at serving time would get an arbitrary score. Ads logs are full of them (new campaigns,
new users); the item column of a time-split log holds values unseen in training in a share of its
test rows that grows with the gap.

The rule, per vocabulary column, during training only. The unit counted is an *occurrence*: a
request whose rows hold the value (a value repeated within a request counts once, so a user
column, which repeats on every row of its request, counts requests, and an item column counts
impressions, near enough).

- **How many**: the share of occurrences given code 0 is the Good-Turing estimate of the
  probability that the next occurrence is of a value never seen before, ``n1 / N`` (``n1`` values
  seen in exactly one request, ``N`` occurrences; Good 1953). Occurrences already at code 0
  (missing values, values dropped by ``min_count`` / ``max_size``) count toward it: where they
  reach it nothing more is dropped.
- **Which**: a value seen ``c`` times is replaced by code 0 with probability ``a / (c + a)``
  (word dropout, Kiperwasser & Goldberg 2016), so rare values are dropped most, as a value never
  seen resembles the rare ones more than the frequent ones. ``a`` is the one root of
  ``sum_v c_v a / (c_v + a) = extra occurrences`` (increasing in ``a``), found by bisection.
- **Where**: one draw per request and column, so a dropped value is dropped on every row of its
  request, as a new user or item would be.

Hashed columns need none of it: an unseen value hashes to a bucket that training values share.
Evaluation, exports and the position tower's refit pass see the codes as they are.

References: I. J. Good 1953, "The population frequencies of species and the estimation of
population parameters"; E. Kiperwasser & Y. Goldberg 2016, "Simple and Accurate Dependency Parsing
Using Bidirectional LSTM Feature Representations" (word dropout ``a / (#(w) + a)``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from hybridrank._device import to_device

__all__ = ["UNSEEN_DROPOUT", "good_turing_unseen", "drop_probabilities", "drop_unseen",
           "probability_tables"]

#: The values of ``HybridRanker(unseen_dropout=...)``.
UNSEEN_DROPOUT = ("good_turing", "off")


def _counts(counts) -> np.ndarray:
    c = np.asarray(counts)
    if c.ndim != 1 or c.size < 1 or not np.issubdtype(c.dtype, np.integer) or (c < 0).any():
        raise ValueError("value counts must be a 1-d array of non-negative integers, one per code "
                         f"(code 0 first); got shape {c.shape} dtype {c.dtype}")
    return c.astype(np.int64)


def good_turing_unseen(counts) -> float:
    """``n1 / N``: the Good-Turing probability that the next row's value was never seen.

    Args:
        counts: training occurrences per code, ``[V + 1]``; code 0 (missing or out of
            vocabulary) is not a value and is not counted in ``n1`` (it is in ``N``).

    >>> good_turing_unseen([0, 1, 1, 3, 5])   # two values seen once in 10 rows
    0.2
    """
    c = _counts(counts)
    n = int(c.sum())
    return float((c[1:] == 1).sum()) / n if n else 0.0


def _alpha(c: np.ndarray, rows: float) -> float:
    """The ``a`` with ``sum c a / (c + a) = rows`` (``0 < rows < sum c``), by bisection on log a."""
    values, mult = np.unique(c[c > 0], return_counts=True)
    v, m = values.astype(np.float64), mult.astype(np.float64)
    if rows >= (1 - 1e-9) * float((m * v).sum()):  # every value a singleton: drop them all
        return float("inf")

    def dropped(a: float) -> float:
        return float((m * v * a / (v + a)).sum())

    lo, hi = 1e-12, 1.0
    while dropped(hi) < rows:  # the sum tends to sum(c) > rows as a grows
        hi *= 2.0
    for _ in range(200):
        mid = np.sqrt(lo * hi)
        lo, hi = (mid, hi) if dropped(mid) < rows else (lo, mid)
        if hi / lo < 1 + 1e-10:
            break
    return float(np.sqrt(lo * hi))


def drop_probabilities(counts) -> tuple[np.ndarray, dict[str, float]]:
    """The per-code probability of being replaced by code 0 in training, and its evidence.

    Args:
        counts: training occurrences per code, ``[V + 1]`` (code 0 first).

    Returns:
        ``(p, info)``: ``p [V + 1]`` float64 (``p[0] = 0``; ``a / (c + a)`` for a value seen ``c``
        times); ``info`` holds ``good_turing`` (the target share of code 0), ``already`` (the share
        at code 0 before dropout), ``dropped`` (the expected share dropped, so
        ``already + dropped = max(already, good_turing)``) and ``alpha`` (0 when nothing drops,
        None when every value is a singleton and all are dropped).

    >>> p, info = drop_probabilities([0, 1, 1, 1, 1, 6])
    >>> round(info["good_turing"], 2), round(float((p * [0, 1, 1, 1, 1, 6]).sum()) / 10, 2)
    (0.4, 0.4)
    """
    c = _counts(counts)
    n = int(c.sum())
    target = good_turing_unseen(c)
    already = float(c[0]) / n if n else 0.0
    p = np.zeros(c.size, dtype=np.float64)
    info = {"good_turing": target, "already": already, "dropped": 0.0, "alpha": 0.0}
    extra = (target - already) * n  # occurrences to move to code 0
    if extra <= 0:
        return p, info
    a = _alpha(c[1:], extra)  # extra <= n1 <= sum(c[1:]), equal when every value is a singleton
    p[1:] = 1.0 if np.isinf(a) else a / (c[1:] + a)
    info["alpha"] = None if np.isinf(a) else a  # None: every value dropped (JSON has no inf)
    info["dropped"] = float((p * c).sum()) / n
    return p, info


def drop_unseen(cat: torch.Tensor, probabilities: Sequence[torch.Tensor | None],
                request: torch.Tensor | None = None,
                generator: torch.Generator | None = None,
                n_requests: int | None = None) -> torch.Tensor:
    """``cat`` with each code replaced by 0 with its column's probability for that code.

    Args:
        cat: ``[N, C]`` int64 codes.
        probabilities: per column a ``[V + 1]`` float tensor on ``cat``'s device, or None (the
            column is left as it is: a hashed column, or one with nothing to drop).
        request: ``[N]`` non-negative request index of each row: one draw per request and column
            (a value is dropped on all its request's rows or none); None: one draw per row.
        generator: random generator (default: torch's global one, seeded by ``seed_everything``).
            A CPU generator's draws are the same on every device; they reach ``cat``'s device
            through pinned memory, without the host waiting.
        n_requests: the number of requests (``request.max() + 1``); given, nothing is read back
            from ``request`` (on an accelerator that read would wait for the device).

    Returns:
        a new tensor (``cat`` itself when no column drops anything).
    """
    if len(probabilities) != cat.shape[1]:
        raise ValueError(f"drop_unseen: {len(probabilities)} probability tables for "
                         f"{cat.shape[1]} categorical columns")
    cols = [j for j, p in enumerate(probabilities) if p is not None]
    if not cols or cat.shape[0] == 0:
        return cat
    out = cat.clone()
    if request is None:
        units = cat.shape[0]
    else:
        units = int(request.max()) + 1 if n_requests is None else int(n_requests)
    where = cat.device if generator is None else generator.device  # drawn where the generator is
    u = to_device(torch.rand((units, len(cols)), generator=generator, device=where), cat.device)
    if request is not None:
        u = u[request]
    for k, j in enumerate(cols):
        p = probabilities[j][cat[:, j]]
        out[:, j] = torch.where(u[:, k] < p, torch.zeros_like(cat[:, j]), cat[:, j])
    return out


def probability_tables(counts: Mapping[str, np.ndarray], categorical: Sequence[str]
                       ) -> tuple[list[torch.Tensor | None], dict[str, dict[str, float]]]:
    """Per categorical column (in order) its drop probabilities (None where nothing drops or
    the column has no counts: hashed) and per counted column its ``info``."""
    tables: list[torch.Tensor | None] = []
    report: dict[str, dict[str, float]] = {}
    for c in categorical:
        if c not in counts:
            tables.append(None)
            continue
        p, info = drop_probabilities(counts[c])
        report[c] = info
        tables.append(torch.as_tensor(p, dtype=torch.float32) if info["dropped"] > 0 else None)
    return tables, report
