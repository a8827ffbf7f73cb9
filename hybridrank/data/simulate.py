"""A click-log simulator with a known true click probability.

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
"""

from __future__ import annotations

import numpy as np
import polars as pl

__all__ = ["simulate_clicklog", "SIM_COLUMNS"]

#: Columns of the frame :func:`simulate_clicklog` returns, in order.
SIM_COLUMNS = (
    "request_id", "session_id", "user_id", "time", "position", "item_id", "item_category",
    "item_price", "item_pop", "hour", "user_activity", "bid", "p_true", "p_true_ref", "click",
)

_DAY = 86_400


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _repeats(cand: np.ndarray) -> np.ndarray:
    """``[R, C]`` bool: True where a row's value already appeared earlier in that row."""
    order = np.argsort(cand, axis=1, kind="stable")
    sorted_c = np.take_along_axis(cand, order, axis=1)
    dup_sorted = np.zeros_like(sorted_c, dtype=bool)
    dup_sorted[:, 1:] = sorted_c[:, 1:] == sorted_c[:, :-1]
    dup = np.empty_like(dup_sorted)
    np.put_along_axis(dup, order, dup_sorted, axis=1)
    return dup


def _solve_intercept(logit_wo: np.ndarray, target: float, *, bound: float = 20.0,
                     iterations: int = 60) -> float:
    """Intercept ``b`` in ``[-bound, bound]`` with ``mean(sigmoid(logit_wo + b)) == target``
    (bisection, monotone in b; also used by :mod:`hybridrank.data.worlds`)."""
    lo, hi = -bound, bound
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        if _sigmoid(logit_wo + mid).mean() < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _unique_slates(rng: np.random.Generator, n_req: int, sizes: np.ndarray, n_items: int,
                   item_p: np.ndarray, max_slate: int) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``sizes[r]`` distinct items per request by popularity; returns flat (request, item).

    Vectorised: draw ``3 * max_slate`` candidates per request with replacement, drop repeats inside
    a row (keeping the first draw), keep the first ``sizes[r]``. Rows that end up short (very rare)
    are redrawn together until every request has its full slate.
    """
    n_cand = 3 * max_slate
    slate = np.full((n_req, max_slate), -1, dtype=np.int64)
    todo = np.arange(n_req)
    while todo.size:
        cand = rng.choice(n_items, size=(todo.size, n_cand), p=item_p)
        keep = ~_repeats(cand)
        rank = np.cumsum(keep, axis=1)  # 1-based rank among the distinct draws
        size = sizes[todo][:, None]
        take = keep & (rank <= size)
        ok = take.sum(axis=1) == sizes[todo]
        rows, cols = np.nonzero(take[ok])
        dest = todo[ok][rows]
        slate[dest, rank[ok][rows, cols] - 1] = cand[ok][rows, cols]
        todo = todo[~ok]
    req = np.repeat(np.arange(n_req), sizes)
    items = slate[slate >= 0]  # row-major: request after request, positions in order
    return req, items


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
    """Simulate a click log with known true click probabilities.

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
    if not (1 <= min_slate <= max_slate):
        raise ValueError(f"need 1 <= min_slate <= max_slate, got {min_slate}, {max_slate}")
    if max_slate > n_items:
        raise ValueError(f"max_slate={max_slate} exceeds n_items={n_items}: "
                         "slates hold distinct items")
    if not (0.0 < base_ctr < 1.0):
        raise ValueError(f"base_ctr must be in (0, 1), got {base_ctr}")
    if min(n_users, n_items, n_categories) < 1 or sessions_per_user < 1 or requests_per_session < 1:
        raise ValueError("n_users, n_items, n_categories, sessions_per_user and "
                         "requests_per_session must be >= 1")
    rng = np.random.default_rng(seed)
    d = latent_dim

    # --- latent world -------------------------------------------------------------------------
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

    # --- users -> sessions -> requests ----------------------------------------------------------
    n_sess_u = 1 + rng.poisson(sessions_per_user - 1.0, size=n_users)
    sess_user = np.repeat(np.arange(n_users), n_sess_u)
    n_sess = sess_user.size
    sess_start = rng.integers(0, days * _DAY, size=n_sess)
    user_activity = np.log1p(n_sess_u + rng.poisson(np.exp(1.5 + user_eff)))  # observed proxy

    n_req_s = 1 + rng.poisson(requests_per_session - 1.0, size=n_sess)
    req_sess = np.repeat(np.arange(n_sess), n_req_s)
    n_req = req_sess.size
    gaps = 1 + rng.exponential(90.0, size=n_req).astype(np.int64)
    first_of_sess = np.repeat(np.cumsum(n_req_s) - n_req_s, n_req_s)
    csum = np.cumsum(gaps)
    within = csum - csum[first_of_sess]  # 0 for a session's first request, then increasing
    req_time = sess_start[req_sess] + within
    # requests in time order (ties by generation order), ids 0..R-1 in that order
    order = np.lexsort((np.arange(n_req), req_time))
    req_sess, req_time = req_sess[order], req_time[order]
    req_user = sess_user[req_sess]

    sizes = rng.integers(min_slate, max_slate + 1, size=n_req)
    imp_req, imp_item = _unique_slates(rng, n_req, sizes, n_items, item_p, max_slate)
    starts = np.cumsum(sizes) - sizes
    imp_pos = np.arange(imp_req.size) - starts[imp_req] + 1
    imp_user = req_user[imp_req]
    imp_time = req_time[imp_req]
    hour = (imp_time // 3600) % 24

    # --- true click model ----------------------------------------------------------------------
    aff = np.einsum("nd,nd->n", user_vec[imp_user], item_vec[imp_item])
    aff *= affinity_scale / np.sqrt(d * (0.64 + 0.36))
    logit_wo = (aff + user_eff[imp_user] + item_eff[imp_item]
                - position_decay * np.log(imp_pos) + 0.3 * np.sin(2 * np.pi * (hour - 14) / 24))
    intercept = _solve_intercept(logit_wo, base_ctr)
    p_true = _sigmoid(logit_wo + intercept)
    # the same impression shown at the reference position 1 (log 1 = 0): what an auction that
    # scores candidates before positions exist should predict
    p_true_ref = _sigmoid(logit_wo + position_decay * np.log(imp_pos) + intercept)
    click = (rng.random(p_true.size) < p_true).astype(np.int8)
    bid = cat_bid[item_cat[imp_item]] * np.exp(rng.normal(0.0, 0.3, size=p_true.size))

    return pl.DataFrame({
        "request_id": imp_req.astype(np.int64),
        "session_id": req_sess[imp_req].astype(np.int64),
        "user_id": imp_user.astype(np.int64),
        "time": imp_time.astype(np.int64),
        "position": imp_pos.astype(np.int64),
        "item_id": imp_item.astype(np.int64),
        "item_category": item_cat[imp_item].astype(np.int64),
        "item_price": np.round(item_price[imp_item], 2),
        "item_pop": item_pop[imp_item],
        "hour": hour.astype(np.float64),
        "user_activity": user_activity[imp_user],
        "bid": bid,
        "p_true": p_true,
        "p_true_ref": p_true_ref,
        "click": click,
    })
