"""The built-in click-log simulator, with a known true click probability.

Users run sessions of several requests; every request shows a slate of ``min_slate..max_slate``
items at positions ``1..k``. Each impression's true click probability comes from a known logit::

    logit = intercept
            + affinity(user, item)        # latent user vector . (category vector + item vector)
            + user_effect(user)           # some users click more than others
            + item_effect(item)           # some items are more attractive
            - position_decay * log(position)
            + hour_amplitude * sin(2 pi (hour - 14) / 24)   # context: time of day

and ``click ~ Bernoulli(sigmoid(logit))``. The intercept is solved (bisection) so that the mean
true probability equals ``base_ctr``.

What a model can observe, and what it cannot:

- ``user_id``, ``item_id``, ``item_category`` (categoricals) carry the affinity: it can only be
  learned through embeddings of these ids.
- ``item_pop`` and ``item_price`` are noisy observations of the item effect; ``user_activity`` is
  a noisy observation of the user effect; ``hour`` and ``position`` are observed exactly.
- The noise in the observed signals and the finite number of impressions per id keep any model
  above the Bayes log loss (the log loss of ``p_true`` itself), which is the reference to beat.

Everything is vectorised numpy driven by ``np.random.default_rng(seed)``: the same arguments give
the same frame, bit for bit.

Logs larger than memory: :func:`clicklog_chunks` draws the log in blocks of ``chunk_users`` users,
each block a frame of its own, so memory depends on the block and not on ``n_users``. The first
block is drawn exactly as :func:`simulate_clicklog` draws a log of ``chunk_users`` users (so a log
of at most ``chunk_users`` users is the same log either way, bit for bit); every later block ``k``
draws its users, sessions, slates and clicks from ``default_rng([seed, k])`` and shares the first
block's item catalogue and intercept. Its ids continue the previous blocks' (requests stay in time
order within a block, not across blocks), and its mean true probability is ``base_ctr`` up to the
sampling noise of the first block's users.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import polars as pl

from hybridrank.data.simulators.common import (
    DAY,
    draw_requests,
    draw_sessions,
    fill_slates,
    sigmoid,
    solve_intercept,
)

__all__ = ["simulate_clicklog", "clicklog_chunks", "SIM_COLUMNS", "CHUNK_USERS"]

#: Columns of the frame :func:`simulate_clicklog` returns, in order.
SIM_COLUMNS = (
    "request_id", "session_id", "user_id", "time", "position", "item_id", "item_category",
    "item_price", "item_pop", "hour", "user_activity", "bid", "p_true", "p_true_ref", "click",
)

#: Users per block of :func:`clicklog_chunks` (about 1.1M impressions at the default sizes).
CHUNK_USERS = 10_000


@dataclass(frozen=True)
class _Args:
    """The simulator's arguments (checked)."""

    n_users: int
    n_items: int
    n_categories: int
    sessions_per_user: float
    requests_per_session: float
    min_slate: int
    max_slate: int
    base_ctr: float
    latent_dim: int
    affinity_scale: float
    position_decay: float
    days: int
    seed: int

    def __post_init__(self) -> None:
        if not (1 <= self.min_slate <= self.max_slate):
            raise ValueError(f"need 1 <= min_slate <= max_slate, got {self.min_slate}, "
                             f"{self.max_slate}")
        if self.max_slate > self.n_items:
            raise ValueError(f"max_slate={self.max_slate} exceeds n_items={self.n_items}: "
                             "slates hold distinct items")
        if not (0.0 < self.base_ctr < 1.0):
            raise ValueError(f"base_ctr must be in (0, 1), got {self.base_ctr}")
        if (min(self.n_users, self.n_items, self.n_categories) < 1 or self.sessions_per_user < 1
                or self.requests_per_session < 1):
            raise ValueError("n_users, n_items, n_categories, sessions_per_user and "
                             "requests_per_session must be >= 1")


@dataclass(frozen=True)
class _Catalogue:
    """The items, shared by every block: category, latent vector, effect, exposure, signals."""

    item_cat: np.ndarray
    item_vec: np.ndarray
    item_eff: np.ndarray
    item_p: np.ndarray
    item_pop: np.ndarray
    item_price: np.ndarray
    cat_bid: np.ndarray


def _draw_world(rng: np.random.Generator, n_users: int, a: _Args
                ) -> tuple[np.ndarray, np.ndarray, _Catalogue]:
    """The first block's users (latent vectors, effects) and the item catalogue, interleaved in
    the order the simulator has always drawn them."""
    d, n_items, n_categories = a.latent_dim, a.n_items, a.n_categories
    user_vec = rng.normal(size=(n_users, d))
    cat_vec = rng.normal(size=(n_categories, d))
    item_cat = rng.integers(0, n_categories, size=n_items)
    item_vec = 0.8 * cat_vec[item_cat] + 0.6 * rng.normal(size=(n_items, d))
    user_eff = rng.normal(0.0, 0.4, size=n_users)
    item_eff = rng.normal(0.0, 0.5, size=n_items)
    # popularity: a Zipf-like exposure distribution over a random permutation of the items
    pop_rank = rng.permutation(n_items) + 1
    item_p = pop_rank ** -0.8
    item_p /= item_p.sum()
    # observable, noisy signals
    item_pop = np.log(item_p * n_items) + 0.8 * item_eff + rng.normal(0.0, 0.5, size=n_items)
    item_price = np.exp(3.0 + 0.5 * rng.normal(size=n_items) - 0.6 * item_eff)
    cat_bid = np.exp(rng.normal(0.0, 0.4, size=n_categories))
    return user_vec, user_eff, _Catalogue(item_cat, item_vec, item_eff, item_p, item_pop,
                                          item_price, cat_bid)


def _draw_block(rng: np.random.Generator, user_vec: np.ndarray, user_eff: np.ndarray,
                items: _Catalogue, a: _Args, intercept: float | None
                ) -> tuple[dict[str, np.ndarray], float]:
    """One block's impressions: sessions, requests, slates, the true click model, clicks, bids.

    Args:
        user_vec, user_eff: ``[U, d]`` / ``[U]`` the block's users.
        intercept: the intercept to use (None: solve it for ``a.base_ctr`` on this block).

    Returns:
        The columns of :data:`SIM_COLUMNS` with ids local to the block, and the intercept.
    """
    n_users = user_eff.size
    # --- users -> sessions -> requests ----------------------------------------------------------
    n_sess_u = 1 + rng.poisson(a.sessions_per_user - 1.0, size=n_users)
    sess_user, sess_start = draw_sessions(rng, n_sess_u, a.days * DAY)
    user_activity = np.log1p(n_sess_u + rng.poisson(np.exp(1.5 + user_eff)))  # observed proxy
    req_sess, req_time = draw_requests(rng, sess_start, a.requests_per_session)
    n_req = req_sess.size
    req_user = sess_user[req_sess]

    sizes = rng.integers(a.min_slate, a.max_slate + 1, size=n_req)
    slate = np.full((n_req, a.max_slate), -1, dtype=np.int64)
    fill_slates(rng, slate, np.arange(n_req), sizes, items.item_p, n_cand=3 * a.max_slate)
    imp_req = np.repeat(np.arange(n_req), sizes)
    imp_item = slate[slate >= 0]  # row-major: request after request, positions in order
    del slate
    starts = np.cumsum(sizes) - sizes
    imp_pos = np.arange(imp_req.size) - starts[imp_req] + 1
    imp_user = req_user[imp_req]
    imp_time = req_time[imp_req]
    hour = (imp_time // 3600) % 24

    # --- true click model ----------------------------------------------------------------------
    d = a.latent_dim
    aff = np.einsum("nd,nd->n", user_vec[imp_user], items.item_vec[imp_item])
    aff *= a.affinity_scale / np.sqrt(d * (0.64 + 0.36))
    logit_wo = (aff + user_eff[imp_user] + items.item_eff[imp_item]
                - a.position_decay * np.log(imp_pos) + 0.3 * np.sin(2 * np.pi * (hour - 14) / 24))
    del aff
    if intercept is None:
        intercept = solve_intercept(logit_wo, a.base_ctr)
    p_true = sigmoid(logit_wo + intercept)
    # the same impression shown at the reference position 1 (log 1 = 0): what an auction that
    # scores candidates before positions exist should predict
    p_true_ref = sigmoid(logit_wo + a.position_decay * np.log(imp_pos) + intercept)
    del logit_wo
    click = (rng.random(p_true.size) < p_true).astype(np.int8)
    item_cat = items.item_cat[imp_item]
    bid = items.cat_bid[item_cat] * np.exp(rng.normal(0.0, 0.3, size=p_true.size))
    cols = {
        "request_id": imp_req.astype(np.int64),
        "session_id": req_sess[imp_req].astype(np.int64),
        "user_id": imp_user.astype(np.int64),
        "time": imp_time.astype(np.int64),
        "position": imp_pos.astype(np.int64),
        "item_id": imp_item.astype(np.int64),
        "item_category": item_cat.astype(np.int64),
        "item_price": np.round(items.item_price[imp_item], 2),
        "item_pop": items.item_pop[imp_item],
        "hour": hour.astype(np.float64),
        "user_activity": user_activity[imp_user],
        "bid": bid,
        "p_true": p_true,
        "p_true_ref": p_true_ref,
        "click": click,
    }
    return cols, intercept


def simulate_clicklog(
    *,
    n_users: int = 2500,
    n_items: int = 1000,
    n_categories: int = 20,
    sessions_per_user: float = 3.0,
    requests_per_session: float = 3.0,
    min_slate: int = 4,
    max_slate: int = 20,
    base_ctr: float = 0.03,
    latent_dim: int = 8,
    affinity_scale: float = 1.0,
    position_decay: float = 0.5,
    days: int = 30,
    seed: int = 0,
) -> pl.DataFrame:
    """Simulate a click log with known true click probabilities, in memory.

    Args:
        n_users, n_items, n_categories: population sizes (items belong to one category each).
        sessions_per_user: mean sessions per user (at least 1; ``1 + Poisson(mean - 1)``).
        requests_per_session: mean requests per session (at least 1; ``1 + Poisson(mean - 1)``).
        min_slate, max_slate: slate size range, uniform per request; positions are ``1..k``.
        base_ctr: target mean true click probability (the intercept is solved for it).
        latent_dim: dimension of the latent user / category / item vectors.
        affinity_scale: standard deviation of the user-item affinity term on the logit scale.
        position_decay: the logit falls by ``position_decay * log(position)``.
        days: sessions start uniformly over this many days.
        seed: seed of ``np.random.default_rng``.

    Returns:
        A polars frame, one row per impression, sorted by request (requests in time order,
        positions ascending), with the columns of :data:`SIM_COLUMNS`: ``request_id``,
        ``session_id``, ``user_id`` (int64), ``time`` (int64 seconds, increasing within a session),
        ``position`` (1-based), ``item_id``, ``item_category`` (int64), ``item_price``,
        ``item_pop``, ``hour``, ``user_activity`` (float64, observable signals), ``bid`` (> 0),
        ``p_true`` (in (0, 1)), ``p_true_ref`` (the true click probability of the same impression
        at the reference position 1: the position effect ``- position_decay * log(position)``
        removed), ``click`` (int8, Bernoulli(p_true)).

    >>> df = simulate_clicklog(n_users=50, seed=1)
    >>> bool(df["position"].min() == 1 and df["position"].max() <= 20)
    True
    """
    a = _Args(n_users, n_items, n_categories, sessions_per_user, requests_per_session, min_slate,
              max_slate, base_ctr, latent_dim, affinity_scale, position_decay, days, seed)
    rng = np.random.default_rng(seed)
    user_vec, user_eff, items = _draw_world(rng, n_users, a)
    cols, _ = _draw_block(rng, user_vec, user_eff, items, a, None)
    return pl.DataFrame(cols)


def clicklog_chunks(*, chunk_users: int = CHUNK_USERS, **simulator) -> Iterator[pl.DataFrame]:
    """The simulated log in blocks of ``chunk_users`` users (module docstring), one frame each.

    Memory holds one block (and the item catalogue), whatever ``n_users`` is. With ``n_users <=
    chunk_users`` the one block is :func:`simulate_clicklog`'s frame, bit for bit; with more, the
    first block is the log of ``chunk_users`` users and the next blocks draw their own users.

    Args:
        chunk_users: users per block (>= 1).
        **simulator: the keyword arguments of :func:`simulate_clicklog`.

    Returns:
        An iterator of frames with the columns of :data:`SIM_COLUMNS` (the arguments are checked
        here, before any draw); each block's ``request_id``, ``session_id`` and ``user_id``
        continue the previous block's, and rows are sorted by ``request_id``, so the
        concatenation is one log with every request's rows adjacent.

    Raises:
        ValueError, TypeError: a bad or unknown argument.

    >>> blocks = list(clicklog_chunks(n_users=5, chunk_users=2, seed=1))
    >>> [b["user_id"].unique().sort().to_list() for b in blocks]
    [[0, 1], [2, 3], [4]]
    """
    if int(chunk_users) < 1:
        raise ValueError(f"chunk_users must be >= 1, got {chunk_users}")
    try:
        a = _Args(**{**_defaults(), **simulator})
    except TypeError as e:
        raise TypeError(f"clicklog_chunks: {e}") from None
    return _blocks(a, int(chunk_users))


def _blocks(a: _Args, chunk_users: int) -> Iterator[pl.DataFrame]:
    """The blocks of :func:`clicklog_chunks` (arguments checked)."""
    rng = np.random.default_rng(a.seed)
    user_vec, user_eff, items = _draw_world(rng, min(a.n_users, chunk_users), a)
    intercept = None
    users = requests = sessions = 0
    k = 0
    while users < a.n_users:
        if k:
            rng = np.random.default_rng([a.seed, k])
            n = min(chunk_users, a.n_users - users)
            user_vec = rng.normal(size=(n, a.latent_dim))
            user_eff = rng.normal(0.0, 0.4, size=n)
        cols, intercept = _draw_block(rng, user_vec, user_eff, items, a, intercept)
        n_req, n_sess = int(cols["request_id"][-1]) + 1, int(cols["session_id"].max()) + 1
        cols["request_id"] += requests
        cols["session_id"] += sessions
        cols["user_id"] += users
        requests, sessions, users = requests + n_req, sessions + n_sess, users + user_eff.size
        k += 1
        frame = pl.DataFrame(cols)
        del cols  # hold one block: nothing of this one stays while the next is drawn
        yield frame
        del frame


def _defaults() -> dict[str, object]:
    """:func:`simulate_clicklog`'s keyword defaults."""
    return {name: p.default for name, p in inspect.signature(simulate_clicklog).parameters.items()}
