"""The click model's shared pieces: what the built-in simulator and the world generator both draw.

Both simulators build a log the same way: users run sessions, sessions hold requests a minute or
two apart, a request shows a slate of distinct items drawn by popularity, and a click is a
Bernoulli draw of a true probability ``sigmoid(logit_wo + intercept)`` whose intercept is solved
for a target mean. The steps that are the same in both live here, once; each simulator keeps its
own random streams and the order in which it draws from them.
"""

from __future__ import annotations

import numpy as np

__all__ = ["DAY", "sigmoid", "repeats", "solve_intercept", "fill_slates", "draw_sessions",
           "draw_requests"]

DAY = 86_400


def sigmoid(x: np.ndarray) -> np.ndarray:
    """``1 / (1 + exp(-x))``, elementwise."""
    return 1.0 / (1.0 + np.exp(-x))


def repeats(cand: np.ndarray) -> np.ndarray:
    """``[R, C]`` bool: True where a row's value already appeared earlier in that row.

    >>> repeats(np.array([[3, 1, 3, 1, 2]])).tolist()
    [[False, False, True, True, False]]
    """
    order = np.argsort(cand, axis=1, kind="stable")
    sorted_c = np.take_along_axis(cand, order, axis=1)
    dup_sorted = np.zeros_like(sorted_c, dtype=bool)
    dup_sorted[:, 1:] = sorted_c[:, 1:] == sorted_c[:, :-1]
    dup = np.empty_like(dup_sorted)
    np.put_along_axis(dup, order, dup_sorted, axis=1)
    return dup


def solve_intercept(logit_wo: np.ndarray, target: float, *, bound: float = 20.0,
                    iterations: int = 60) -> float:
    """Intercept ``b`` in ``[-bound, bound]`` with ``mean(sigmoid(logit_wo + b)) == target``.

    Bisection: the mean is increasing in ``b``.

    Args:
        logit_wo: ``[N]`` logits without the intercept.
        target: the wanted mean probability, in (0, 1).
        bound, iterations: the search interval and the number of halvings.

    Returns:
        The midpoint of the last interval.

    >>> abs(solve_intercept(np.zeros(4), 0.5)) < 1e-12
    True
    """
    lo, hi = -bound, bound
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        if sigmoid(logit_wo + mid).mean() < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def fill_slates(rng: np.random.Generator, slate: np.ndarray, rows: np.ndarray, sizes: np.ndarray,
                p: np.ndarray, *, n_cand: int, grow: int = 1, max_rounds: int | None = None) -> None:
    """Fill ``slate[r, :sizes[r]]`` for ``r`` in ``rows`` with distinct items drawn by ``p``.

    Each round draws ``n_cand`` candidates per unfinished row with replacement, drops repeats
    inside a row (keeping the first draw) and keeps the first ``sizes[r]``; rows left short are
    drawn again together in the next round, with ``grow`` times as many candidates. A round's
    rows are drawn in batches of about :data:`_CANDIDATES` candidates, one after the other from
    the same stream: the same draws as one batch, in bounded memory.

    Args:
        rng: the slates' random stream.
        slate: ``[R, max size]`` int64, written in place (other entries untouched).
        rows: the rows to fill.
        sizes: ``[R]`` items per row (``<=`` the number of items with ``p > 0``).
        p: ``[I]`` item probabilities (summing to 1).
        n_cand, grow: candidates per row in the first round, and their growth per round.
        max_rounds: give up after this many rounds (None: draw until every row is full).

    Raises:
        RuntimeError: rows still short after ``max_rounds`` rounds.
    """
    todo, rounds = rows, 0
    while todo.size:
        if max_rounds is not None and rounds == max_rounds:
            raise RuntimeError("could not draw distinct slates (popularity too concentrated)")
        step = max(1, _CANDIDATES // n_cand)
        short = [_fill_batch(rng, slate, todo[i:i + step], sizes, p, n_cand)
                 for i in range(0, todo.size, step)]
        todo = np.concatenate(short)
        n_cand *= grow
        rounds += 1


#: candidates drawn at a time by :func:`fill_slates` (a few arrays of this many int64)
_CANDIDATES = 1 << 20


def _fill_batch(rng: np.random.Generator, slate: np.ndarray, todo: np.ndarray, sizes: np.ndarray,
                p: np.ndarray, n_cand: int) -> np.ndarray:
    """One round of :func:`fill_slates` for the rows ``todo``; returns the rows left short."""
    cand = rng.choice(p.size, size=(todo.size, n_cand), p=p)
    keep = ~repeats(cand)
    rank = np.cumsum(keep, axis=1)  # 1-based rank among the distinct draws
    take = keep & (rank <= sizes[todo][:, None])
    ok = take.sum(axis=1) == sizes[todo]
    r, c = np.nonzero(take[ok])
    slate[todo[ok][r], rank[ok][r, c] - 1] = cand[ok][r, c]
    return todo[~ok]


def draw_sessions(rng: np.random.Generator, n_sess_u: np.ndarray, span: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Sessions of every user, starting uniformly over ``[0, span)`` seconds.

    Args:
        n_sess_u: ``[U]`` sessions per user.
        span: the period in seconds.

    Returns:
        ``sess_user [S]`` (user of each session, users in order) and ``sess_start [S]`` (int64).
    """
    sess_user = np.repeat(np.arange(n_sess_u.size), n_sess_u)
    return sess_user, rng.integers(0, span, size=sess_user.size)


def draw_requests(rng: np.random.Generator, sess_start: np.ndarray, requests_per_session: float
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Requests of each session, ``1 + Poisson(requests_per_session - 1)`` of them, the first at
    the session's start, each next one ``1 + Exponential(90)`` seconds later.

    Args:
        sess_start: ``[S]`` session start times (int64 seconds).
        requests_per_session: the mean number of requests per session (>= 1).

    Returns:
        ``req_sess [R]`` and ``req_time [R]`` in time order (ties in generation order): request
        ``r`` of the log is the ``r``-th earliest.
    """
    n_req_s = 1 + rng.poisson(requests_per_session - 1.0, size=sess_start.size)
    req_sess = np.repeat(np.arange(sess_start.size), n_req_s)
    gaps = 1 + rng.exponential(90.0, size=req_sess.size).astype(np.int64)
    first = np.repeat(np.cumsum(n_req_s) - n_req_s, n_req_s)
    csum = np.cumsum(gaps)
    req_time = sess_start[req_sess] + (csum - csum[first])  # 0 for a session's first request
    order = np.lexsort((np.arange(req_sess.size), req_time))
    return req_sess[order], req_time[order]
