"""Auction replay: what a pCTR model is worth in money, against the oracle that knows the true CTR.

Every request of a log (or an export) is replayed as a sealed-bid position auction for ``k`` ad
slots. The candidates are the request's impressions, each with a ``bid`` (value per click) and a
model ``pctr``. Vectorised over all impressions at once (one sort, no Python loop per request).

**Click model.** Separable CTR (Edelman, Ostrovsky & Schwarz 2007; Varian 2007): candidate ``i``
shown in slot ``j`` gets ``p_i * f_j`` expected clicks, ``p_i`` its click probability in the top
slot and ``f_1 >= f_2 >= ... >= f_k >= 0`` the slot (examination) factors, default all 1. GSP's
equilibrium theory holds under this model. ``p`` for expected quantities is the **true** pCTR when
given (the simulator's ``p_true``); without it every expected quantity is the model's own estimate
of itself (``AuctionResult.estimated`` is True and a warning is raised): such numbers are not
comparable across models.

**Allocation.** eCPM ``= bid * pctr``. A candidate is eligible iff ``bid >= reserve`` (a per-click
floor), ``ecpm >= reserve_ecpm`` (an eCPM floor) and ``ecpm > 0`` (a candidate the model values at
nothing is never shown; its GSP price would be 0/0). The eligible candidates are sorted by
decreasing eCPM, **ties broken by storage order** (the earlier row wins; the export's ``rank``
rule); the first ``min(k, eligible)`` fill slots ``1..``; a request with fewer eligible candidates
than ``k`` fills what it can.

**Prices per click.** ``"gsp"``: the winner of slot ``j`` pays
``max(max(ecpm_(j+1), reserve_ecpm) / pctr_j, reserve)``, ``ecpm_(j+1)`` the next eligible eCPM (0
if none), so the last winner pays ``max(next, reserve_ecpm) / pctr``. It never exceeds the bid.
``"first_price"``: the own bid. Revenue = price x expected clicks; advertiser value = bid x expected
clicks (**bids are taken as the advertisers' true values per click**); surplus = value - revenue;
welfare = value (revenue is a transfer from advertisers to the seller). An eCPM reserve is also
read as the value of what an empty slot shows instead (organic content, a house ad): ``outside =
reserve_ecpm * sum_{empty slots j} f_j`` and ``total_welfare = value + outside``.

**Oracle.** The same mechanism and reserves with the true pCTR as the score: the efficient
allocation, ``bid * p_true`` assigned in decreasing order to decreasing slot factors (the
rearrangement inequality), with the prices that the true CTRs would set. No allocation of the same
candidates gets more ``total_welfare``: an ad earns ``(bid p - reserve_ecpm) f_j`` over the outside
option, and the oracle shows exactly the ads for which that is >= 0, best first. Plain ``welfare``
(ads only) of a model that over-predicts can exceed the oracle's under an eCPM reserve: it shows
ads worth less than the outside option.

**What calibration changes** (the story for an ads team):

- A **uniform scale** ``c * pctr`` cancels: eCPM order is unchanged and the GSP price
  ``c ecpm_(j+1) / (c pctr_j)`` too. A model that over-predicts every CTR by 2x loses nothing in a
  closed GSP auction without eCPM reserve.
- It does **not** cancel (1) with an **eCPM reserve**: ``c > 1`` admits candidates whose true
  eCPM is below the floor and lowers the floor's price per click ``reserve_ecpm / (c pctr)``: more
  slots are sold (revenue can even rise) but each extra ad is worth less than what the slot would
  show otherwise, so ``total_welfare`` falls; ``c < 1`` rejects good candidates; (2) when the
  candidates compete with others **priced on another scale** (another model's ads, organic or
  house items with their own value estimates, a per-click floor converted from an eCPM target):
  the mis-scaled side wins too often or too rarely; (3) for anything that reads pCTR as a
  probability (budget pacing, auto-bidding to a CPA target).
- A **non-uniform distortion** such as ``sigmoid(3 logit(p) + 1)`` keeps the CTR order, but eCPM
  multiplies pCTR by a bid: whenever ``pctr' / pctr`` differs between two candidates their eCPM
  order can flip, so the allocation loses welfare, and the GSP price ``ecpm'_(j+1) / pctr'_j`` is
  off in a direction that depends on where the two candidates sit on the curve. A pure ranking loss
  identifies the score only up to such a monotone transform (an arbitrary shift, and often scale,
  of the logit), so its pCTR mis-prices by construction.

**Limits of a replay.** Bids are held fixed: bidders do not react to the mechanism (GSP bids are
not truthful in equilibrium, and first-price bidders shade, so first-price revenue = welfare here
is an upper bound), and the candidates are the logged slate, not the full ad inventory.

Reference: Edelman, Ostrovsky & Schwarz 2007, "Internet Advertising and the Generalized
Second-Price Auction"; Varian 2007, "Position Auctions".
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from hybridrank.metrics.request_stats import RequestStats, ratio, request_offsets

__all__ = ["MECHANISMS", "AuctionOutcome", "AuctionResult", "run_auction", "replay_auctions",
           "replay_frame", "auction_stats", "position_factors"]

MECHANISMS = ("gsp", "first_price")


@dataclass(frozen=True)
class AuctionOutcome:
    """Per-request results of one allocation (``R`` requests, ``k`` slots).

    Attributes:
        clicks, revenue, value: ``[R]`` expected clicks, revenue (price x clicks), advertiser value
            (bid x clicks). filled: ``[R]`` int64 slots filled.
        outside: ``[R]`` value of the outside option in the empty slots,
            ``reserve_ecpm * sum_{empty j} f_j`` (0 without an eCPM reserve).
        winner: ``[R, k]`` int64 row (into the flat input) in each slot, -1 where empty.
        price: ``[R, k]`` price per click, 0 where empty.
    """

    clicks: np.ndarray
    revenue: np.ndarray
    value: np.ndarray
    filled: np.ndarray
    outside: np.ndarray
    winner: np.ndarray
    price: np.ndarray

    @property
    def surplus(self) -> np.ndarray:
        """``[R]`` advertiser surplus, value - revenue."""
        return self.value - self.revenue

    @property
    def welfare(self) -> np.ndarray:
        """``[R]`` welfare = advertiser value (revenue is a transfer)."""
        return self.value

    @property
    def total_welfare(self) -> np.ndarray:
        """``[R]`` welfare counting the outside option of empty slots: ``value + outside``."""
        return self.value + self.outside

    def totals(self) -> dict[str, float]:
        """Sums over requests."""
        return {"clicks": float(self.clicks.sum()), "revenue": float(self.revenue.sum()),
                "value": float(self.value.sum()), "surplus": float(self.surplus.sum()),
                "welfare": float(self.welfare.sum()), "total_welfare": float(self.total_welfare.sum()),
                "filled": int(self.filled.sum())}


@dataclass(frozen=True)
class AuctionResult:
    """The model's auction and the oracle's on the same requests.

    Attributes:
        model: outcome of allocating and pricing with the model's pCTR.
        oracle: outcome with the true pCTR as the score, or None without it.
        estimated: True when expected clicks use the model's own pCTR (no true pCTR given).
        mechanism, slots, slot_factors, reserve, reserve_ecpm: the auction's settings.
        lengths: ``[R]`` candidates per request. request_key: ``[R]`` request ids, or None.
    """

    model: AuctionOutcome
    oracle: AuctionOutcome | None
    estimated: bool
    mechanism: str
    slots: int
    slot_factors: np.ndarray
    reserve: float
    reserve_ecpm: float
    lengths: np.ndarray
    request_key: np.ndarray | None = None

    @property
    def n_requests(self) -> int:
        return int(self.model.clicks.shape[0])

    def summary(self) -> dict[str, float | int | bool | None]:
        """Totals of the model and the oracle, and the model's shares of the oracle's totals."""
        out: dict[str, float | int | bool | None] = {"n_requests": self.n_requests,
                                                     "estimated": self.estimated}
        out.update(self.model.totals())
        if self.oracle is not None:
            o = self.oracle.totals()
            out.update({f"oracle_{k}": v for k, v in o.items()})
            for k in ("welfare", "total_welfare", "revenue", "clicks"):
                out[f"{k}_share"] = out[k] / o[k] if o[k] > 0 else None
        return out

    def per_request(self):
        """A polars frame, one row per request: the model's and the oracle's quantities."""
        import polars as pl

        cols: dict[str, object] = {}
        if self.request_key is not None:
            cols["request_id"] = self.request_key
        for prefix, oc in (("", self.model), ("oracle_", self.oracle)):
            if oc is None:
                continue
            for k in ("clicks", "revenue", "value", "surplus", "total_welfare", "filled"):
                cols[prefix + k] = getattr(oc, k)
        return pl.DataFrame(cols)


def position_factors(slots: int, kind: str = "log2") -> np.ndarray:
    """Slot factors ``f_j``, ``j = 1..slots``: ``"log2"`` ``1 / log2(1 + j)``, ``"none"`` all 1,
    or ``"power:a"`` ``j ** -a`` (``"power:0.5"`` matches the simulator's default position decay).

    >>> position_factors(3).round(4).tolist()
    [1.0, 0.6309, 0.5]
    """
    j = np.arange(1, slots + 1, dtype=np.float64)
    if kind == "log2":
        return 1.0 / np.log2(1.0 + j)
    if kind == "none":
        return np.ones(slots)
    if kind.startswith("power:"):
        return j ** -float(kind.split(":", 1)[1])
    raise ValueError(f"slot factor kind must be 'log2', 'none' or 'power:a', got {kind!r}")


# --- validation --------------------------------------------------------------------------------


def _vec(x, name: str, n: int | None) -> np.ndarray:
    a = np.asarray(x.to_numpy() if hasattr(x, "to_numpy") else x, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-d [N], got shape {a.shape}")
    if n is not None and a.shape[0] != n:
        raise ValueError(f"{name} has {a.shape[0]} rows, expected {n} (one per impression)")
    bad = ~np.isfinite(a) | (a < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name}: {int(bad.sum())} value(s) negative, NaN or infinite; first {a[i]!r} "
                         f"at row {i}")
    return a


def _settings(slots, slot_factors, mechanism, reserve, reserve_ecpm) -> np.ndarray:
    if isinstance(slots, bool) or not isinstance(slots, int | np.integer) or slots < 1:
        raise ValueError(f"slots must be an int >= 1, got {slots!r}")
    if mechanism not in MECHANISMS:
        raise ValueError(f"mechanism must be one of {MECHANISMS}, got {mechanism!r}")
    for name, v in (("reserve", reserve), ("reserve_ecpm", reserve_ecpm)):
        if not (np.isfinite(v) and v >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
    f = np.ones(slots) if slot_factors is None else np.asarray(slot_factors, dtype=np.float64)
    if f.shape != (slots,):
        raise ValueError(f"slot_factors must have one entry per slot ({slots}), got shape {f.shape}")
    if not np.isfinite(f).all() or (f < 0).any() or (np.diff(f) > 0).any():
        raise ValueError(f"slot_factors must be finite, >= 0 and non-increasing (slot 1 gets the most "
                         f"attention; GSP assigns it the highest eCPM), got {f.tolist()}")
    return f


def _grouping(offsets, request_ids, n: int) -> tuple[np.ndarray, np.ndarray | None]:
    if (offsets is None) == (request_ids is None):
        raise ValueError("give exactly one of offsets (R + 1 boundaries) or request_ids (one per row)")
    if request_ids is not None:
        if len(request_ids) != n:
            raise ValueError(f"request_ids has {len(request_ids)} rows, expected {n}")
        return request_offsets(request_ids)
    off = np.asarray(offsets)
    if off.ndim != 1 or off.shape[0] < 1 or not np.issubdtype(off.dtype, np.integer):
        raise ValueError(f"offsets must be a 1-d integer array of R + 1 boundaries, got {off.dtype} {off.shape}")
    if off[0] != 0 or off[-1] != n or (np.diff(off) < 0).any():
        raise ValueError(f"offsets must start at 0, be non-decreasing and end at {n} (the number of rows); "
                         f"got start {off[0]}, end {off[-1]}")
    return off.astype(np.int64), None


# --- the kernel --------------------------------------------------------------------------------


def _allocate(off, bid, p_rank, p_eval, k, f, mechanism, reserve, reserve_ecpm) -> AuctionOutcome:
    n, r = bid.shape[0], off.shape[0] - 1
    req = np.repeat(np.arange(r), np.diff(off))
    ecpm = bid * p_rank
    eligible = (bid >= reserve) & (ecpm >= reserve_ecpm) & (ecpm > 0)
    key = np.where(eligible, ecpm, -np.inf)
    order = np.lexsort((np.arange(n), -key, req))  # by request, eCPM down, earlier row first
    s_req, s_key, s_ok = req[order], key[order], eligible[order]
    rank = np.arange(n) - off[s_req]  # 0-based place within the request
    win = s_ok & (rank < k)
    nxt = np.zeros(n)
    if n > 1:
        same = (s_req[1:] == s_req[:-1]) & s_ok[1:]
        nxt[:-1] = np.where(same, s_key[1:], 0.0)
    rows, wreq, slot = order[win], s_req[win], rank[win]
    if mechanism == "gsp":
        price = np.maximum(np.maximum(nxt[win], reserve_ecpm) / p_rank[rows], reserve)
    else:
        price = bid[rows]
    clicks = p_eval[rows] * f[slot]

    def per_req(w):
        return np.bincount(wreq, w, minlength=r)

    winner = np.full((r, k), -1, dtype=np.int64)
    winner[wreq, slot] = rows
    pmat = np.zeros((r, k))
    pmat[wreq, slot] = price
    filled = np.bincount(wreq, minlength=r).astype(np.int64)
    outside = reserve_ecpm * (f.sum() - np.concatenate([[0.0], np.cumsum(f)])[filled])
    return AuctionOutcome(per_req(clicks), per_req(price * clicks), per_req(bid[rows] * clicks), filled,
                          outside, winner, pmat)


def run_auction(bid, pctr, *, offsets=None, request_ids=None, eval_pctr=None, slots: int = 1,
                slot_factors=None, mechanism: str = "gsp", reserve: float = 0.0,
                reserve_ecpm: float = 0.0) -> AuctionOutcome:
    """Allocate and price every request with ``pctr``; expected clicks from ``eval_pctr``.

    See the module docstring for the rules. No oracle, no warning: the building block of
    :func:`replay_auctions`.

    Args:
        bid: ``[N]`` value per click >= 0. pctr: ``[N]`` score >= 0 used to rank and price (a
            probability, or any positive pCTR-like score).
        offsets: ``[R + 1]`` boundaries of contiguous requests, or request_ids: ``[N]`` ids
            (contiguous runs). eval_pctr: ``[N]`` click probabilities for expected clicks (default
            ``pctr``, which must then lie in [0, 1]).
        slots: ``k >= 1``. slot_factors: ``[k]`` non-increasing, >= 0 (default ones).
        mechanism: ``"gsp"`` or ``"first_price"``. reserve, reserve_ecpm: floors >= 0.

    Returns:
        :class:`AuctionOutcome`.

    >>> o = run_auction([2.0, 1.0, 4.0], [0.1, 0.3, 0.1], offsets=[0, 3], slots=2)
    >>> o.winner.tolist(), o.price.round(6).tolist()   # eCPM .2 .3 .4: row 2, then row 1
    ([[2, 1]], [[3.0, 0.666667]])
    """
    bid = _vec(bid, "bid", None)
    n = bid.shape[0]
    p = _vec(pctr, "pctr", n)
    f = _settings(slots, slot_factors, mechanism, reserve, reserve_ecpm)
    off, _ = _grouping(offsets, request_ids, n)
    if eval_pctr is None:
        if (p > 1).any():
            raise ValueError("pctr > 1 cannot serve as a click probability: give eval_pctr")
        q = p
    else:
        q = _vec(eval_pctr, "eval_pctr", n)
        if (q > 1).any():
            raise ValueError("eval_pctr must lie in [0, 1]")
    return _allocate(off, bid, p, q, int(slots), f, mechanism, float(reserve), float(reserve_ecpm))


def replay_auctions(bid, score_pctr, *, offsets=None, request_ids=None, true_pctr=None,
                    slots: int = 1, slot_factors=None, mechanism: str = "gsp", reserve: float = 0.0,
                    reserve_ecpm: float = 0.0) -> AuctionResult:
    """Replay every request as a ``k``-slot auction with the model's pCTR, and with the oracle's.

    Expected clicks of candidate ``i`` in slot ``j``: ``p_i f_j`` with ``p = true_pctr`` when
    given, else the model's own ``score_pctr`` (``estimated=True``, a ``UserWarning``, no oracle).

    Args:
        bid: ``[N]`` value per click. score_pctr: ``[N]`` the model's pCTR (>= 0).
        offsets / request_ids, slots, slot_factors, mechanism, reserve, reserve_ecpm: as in
            :func:`run_auction`. true_pctr: ``[N]`` true click probabilities in [0, 1].

    Returns:
        :class:`AuctionResult`; ``summary()`` gives totals and shares of the oracle.

    >>> r = replay_auctions([1.0, 1.0], [0.2, 0.1], offsets=[0, 2], true_pctr=[0.1, 0.3])
    >>> r.model.winner.tolist(), r.oracle.winner.tolist(), round(r.summary()["welfare_share"], 6)
    ([[0]], [[1]], 0.333333)
    """
    bid = _vec(bid, "bid", None)
    n = bid.shape[0]
    off, key = _grouping(offsets, request_ids, n)
    common = dict(offsets=off, slots=slots, slot_factors=slot_factors, mechanism=mechanism,
                  reserve=reserve, reserve_ecpm=reserve_ecpm)
    if true_pctr is None:
        warnings.warn("no true pCTR: expected clicks, revenue and welfare are the model's own "
                      "estimates (not comparable across models) and there is no oracle", stacklevel=2)
        model = run_auction(bid, score_pctr, **common)
        oracle = None
    else:
        model = run_auction(bid, score_pctr, eval_pctr=true_pctr, **common)
        oracle = run_auction(bid, true_pctr, eval_pctr=true_pctr, **common)
    f = _settings(slots, slot_factors, mechanism, reserve, reserve_ecpm)
    return AuctionResult(model, oracle, true_pctr is None, mechanism, int(slots), f, float(reserve),
                         float(reserve_ecpm), np.diff(off), key)


def replay_frame(frame, *, score: str = "pctr", true: str | None = "p_true", bid: str = "bid",
                 request: str = "request_id", **options) -> AuctionResult:
    """:func:`replay_auctions` on a polars frame in the export format (rows sorted by request).

    Args:
        frame: columns ``request``, ``bid``, ``score`` and, when present, ``true``.
        true: the true-pCTR column; used when the frame has it (None: never).
        options: ``slots``, ``slot_factors``, ``mechanism``, ``reserve``, ``reserve_ecpm``.
    """
    for c in (request, bid, score):
        if c not in frame.columns:
            raise ValueError(f"column {c!r} not in the frame (columns: {frame.columns})")
    for c in (bid, score) + ((true,) if true and true in frame.columns else ()):
        if frame[c].null_count():
            raise ValueError(f"column {c!r} holds {frame[c].null_count()} missing value(s)")
    t = frame[true] if true is not None and true in frame.columns else None
    return replay_auctions(frame[bid], frame[score], request_ids=frame[request], true_pctr=t, **options)


def auction_stats(result: AuctionResult, *, which: str = "model", per: float = 1000.0) -> RequestStats:
    """Per-request statistics of an auction replay, for :mod:`hybridrank.metrics.uncertainty`.

    Metrics: ``clicks``, ``revenue``, ``welfare``, ``total_welfare``, ``surplus``, ``filled`` per
    ``per`` requests, and with an oracle ``welfare_share``, ``total_welfare_share``,
    ``revenue_share``, ``clicks_share`` (sum over requests of the outcome's quantity over the
    oracle's, as fractions).

    Args:
        result: from :func:`replay_auctions`. which: ``"model"`` or ``"oracle"``.
    """
    if which not in ("model", "oracle"):
        raise ValueError(f"which must be 'model' or 'oracle', got {which!r}")
    oc = result.model if which == "model" else result.oracle
    if oc is None:
        raise ValueError("this result has no oracle (no true pCTR was given)")
    r = result.n_requests
    names = ("clicks", "revenue", "welfare", "total_welfare", "surplus", "filled")
    cols = {"auction:requests": np.ones(r)}
    cols.update({f"auction:{k}": getattr(oc, k).astype(np.float64) for k in names})
    mets = {k: ratio(f"auction:{k}", "auction:requests", scale=per, undefined="no request") for k in names}
    if result.oracle is not None:
        for k in ("welfare", "total_welfare", "revenue", "clicks"):
            cols[f"oracle:{k}"] = getattr(result.oracle, k)
            mets[f"{k}_share"] = ratio(f"auction:{k}", f"oracle:{k}", undefined=f"oracle {k} is 0")
    return RequestStats(cols, mets, result.lengths.astype(np.float64), None, result.request_key)
