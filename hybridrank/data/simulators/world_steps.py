"""The steps of :func:`~hybridrank.data.simulators.world.simulate_world`, each drawing from its
own random stream (``default_rng([seed, k])`` for the k-th name of :data:`STREAMS`).

:func:`draw_population` (items, users, latent signals, side features) -> :func:`draw_traffic`
(users -> sessions -> requests, with the long tails' activity law and late period) ->
:func:`draw_slates` (distinct items by popularity) -> :func:`relevance` (the true scorer ``f``)
-> :func:`display_order` (the logging policy) -> :func:`observed_numeric` (the noisy numeric
columns and bids). ``simulate_world`` adds the drift, the position offsets, the intercept and the
clicks, and writes the frame.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hybridrank.data.simulators.common import (
    DAY,
    draw_requests,
    draw_sessions,
    fill_slates,
    sigmoid,
)
from hybridrank.data.simulators.world_spec import (
    NEW_ITEM_POOL,
    NEW_ITEM_START,
    SIGNALS,
    WorldSpec,
    draw_world,  # noqa: F401  (the doctests draw specs)
)

__all__ = ["STREAMS", "stream", "Population", "draw_population", "Traffic", "draw_traffic",
           "draw_slates", "Impressions", "relevance", "display_order", "missing_items", "observed_numeric",
           "standardize"]

_D = 8                       # dimension of the latent vectors
#: the simulation's random streams: ``default_rng([seed, k])`` for the k-th name
STREAMS = ("population", "truth", "requests", "slates", "observations", "order", "clicks",
           "position", "tails", "side", "missing")


def stream(spec: WorldSpec, name: str) -> np.random.Generator:
    """The world's random stream ``name`` (a fresh generator each call)."""
    return np.random.default_rng([spec.seed, STREAMS.index(name)])


def standardize(x: np.ndarray) -> np.ndarray:
    """``(x - mean) / std`` (zeros where ``x`` is constant)."""
    sd = float(x.std())
    return (x - x.mean()) / sd if sd > 0 else np.zeros_like(x)


def _draw_lengths(rng: np.random.Generator, n: int, spec: WorldSpec) -> np.ndarray:
    """Request lengths: 1 with probability ``one_item_share``, else discretised log-uniform."""
    u, v = rng.random(n), rng.random(n)
    lo, hi = spec.min_len, spec.max_len
    k = np.floor(np.exp(math.log(lo) + u * (math.log(hi + 1) - math.log(lo)))).astype(np.int64)
    return np.where(v < spec.one_item_share, 1, np.clip(k, lo, hi))


@dataclass(frozen=True)
class Population:
    """A world's latent population: what :func:`simulate_world` draws first.

    Attributes:
        pop: ``[I]`` Zipf popularity weights of the items (unnormalised).
        item_cat, item_tags, is_new: ``[I]`` category, ``[I, T]`` 0/1 tags, ``[I]`` held-back
            new items.
        cat_vec, item_vec, user_vec: ``[C, 8]``, ``[I, 8]``, ``[U, 8]`` latent vectors.
        item_bias, item_quality, item_price, user_bias, user_activity: ``[I]`` / ``[U]`` latent
            effects and signals.
        signals: the names of the latent numeric signals the world uses (:data:`SIGNALS`).
        side, side_proj: ``[I, n_side]`` the item side features and ``[8, n_side]`` the projection
            of ``item_vec`` they observe (``[I, 0]`` / ``[8, 0]`` without side features).
    """

    pop: np.ndarray
    item_cat: np.ndarray
    item_tags: np.ndarray
    is_new: np.ndarray
    cat_vec: np.ndarray
    item_vec: np.ndarray
    item_bias: np.ndarray
    item_quality: np.ndarray
    item_price: np.ndarray
    user_vec: np.ndarray
    user_bias: np.ndarray
    user_activity: np.ndarray
    signals: list[str]
    side: np.ndarray
    side_proj: np.ndarray


def draw_population(spec: WorldSpec) -> Population:
    """The latent population of ``spec``: items, users, latent signals, side features.

    Drawn from the streams ``population`` and ``side`` (module docstring), so it is the same
    population :func:`simulate_world` builds its log from.

    >>> p = draw_population(draw_world(3, size="tiny", family="longtail"))
    >>> p.side.shape[1] == p.side_proj.shape[1] > 0
    True
    """
    r_pop = stream(spec, "population")
    n_items, n_cat, n_tags = spec.n_items, spec.n_categories, spec.n_tags
    pop = (r_pop.permutation(n_items) + 1.0) ** -spec.item_zipf
    cat_p = r_pop.dirichlet(np.full(n_cat, 2.0))
    item_cat = r_pop.choice(n_cat, size=n_items, p=cat_p)
    rate = r_pop.uniform(0.05, 0.4, n_tags)
    tag_base = np.log(rate / (1.0 - rate))
    tag_p = sigmoid(tag_base[None, :] + r_pop.normal(0.0, 1.0, (n_cat, n_tags)))
    item_tags = (r_pop.random((n_items, n_tags)) < tag_p[item_cat]).astype(np.int8)
    is_new = r_pop.permutation(n_items) < round(NEW_ITEM_POOL * n_items)
    cat_vec = r_pop.normal(size=(n_cat, _D))
    item_vec = 0.7 * cat_vec[item_cat] + 0.7 * r_pop.normal(size=(n_items, _D))
    item_bias = r_pop.normal(size=n_items)
    item_quality = 0.6 * item_bias + 0.8 * r_pop.normal(size=n_items)
    item_price = r_pop.normal(size=n_items)
    user_vec = r_pop.normal(size=(spec.n_users, _D))
    user_bias = r_pop.normal(size=spec.n_users)
    user_activity = 0.6 * user_bias + 0.8 * r_pop.normal(size=spec.n_users)
    signals = [SIGNALS[k] for k in r_pop.permutation(len(SIGNALS))[:spec.n_signals]]
    side, side_proj = np.zeros((n_items, 0)), np.zeros((_D, 0))
    if spec.n_side:
        r_side = stream(spec, "side")
        side_proj = r_side.normal(size=(_D, spec.n_side))
        z = item_vec @ side_proj
        z = (z - z.mean(0)) / z.std(0)
        rho = spec.side_corr
        side = rho * z + math.sqrt(1.0 - rho * rho) * r_side.normal(size=(n_items, spec.n_side))
    return Population(pop, item_cat, item_tags, is_new, cat_vec, item_vec, item_bias,
                      item_quality, item_price, user_vec, user_bias, user_activity, signals,
                      side, side_proj)


@dataclass(frozen=True)
class Traffic:
    """Requests in time order: session, time, user, length, context; the late period's start."""

    req_sess: np.ndarray
    req_time: np.ndarray
    req_user: np.ndarray
    sizes: np.ndarray
    req_ctx: np.ndarray
    hour_phase: float
    late_start: int | None
    new_users: int


def _sessions_per_user(spec: WorldSpec, r_req: np.random.Generator, r_tail: np.random.Generator
                       ) -> np.ndarray:
    """``1 + Poisson(sessions_per_user - 1)``, or under ``user_zipf`` the heavy-tailed law."""
    if spec.user_zipf == 0:
        return 1 + r_req.poisson(spec.sessions_per_user - 1.0, size=spec.n_users)
    w = (r_tail.permutation(spec.n_users) + 1.0) ** -spec.user_zipf
    return 1 + r_req.poisson((spec.sessions_per_user - 1.0) * w / w.mean())


def _late_period(spec: WorldSpec, n_sess_u: np.ndarray, sess_user: np.ndarray, start: np.ndarray,
                 span: int, rng: np.random.Generator) -> tuple[np.ndarray, int, int]:
    """Session starts with the last ``late_share`` of sessions in a late period ``[L, span)``.

    The lightest users (random among equals), up to ``new_user_share`` of the late sessions, run
    all their sessions in it; every other user's first session is before it, and exactly enough
    of their other sessions (at random) are in it to make ``round(late_share * S)`` late
    sessions (fewer only when the users have too few other sessions). ``L`` puts the early and
    late sessions at the same density; the uniform draws ``start`` are mapped into the two parts.

    Returns:
        The session starts, ``L`` and the number of new users.
    """
    n_sess = sess_user.size
    n_late = round(spec.late_share * n_sess)
    order = np.lexsort((rng.permutation(spec.n_users), n_sess_u))  # lightest first
    n_new = int(np.searchsorted(np.cumsum(n_sess_u[order]), round(spec.new_user_share * n_late),
                                side="right"))
    new_user = np.zeros(spec.n_users, dtype=bool)
    new_user[order[:n_new]] = True
    late = new_user[sess_user]
    first = np.zeros(n_sess, dtype=bool)
    first[np.cumsum(n_sess_u) - n_sess_u] = True
    others = np.flatnonzero(~late & ~first)
    k = min(others.size, max(0, n_late - int(late.sum())))
    late[rng.choice(others, size=k, replace=False)] = True
    late_start = int(round(span * (1.0 - late.sum() / n_sess)))
    start = np.where(late, late_start + start * (span - late_start) // span,
                     start * late_start // span)
    return start, late_start, n_new


def draw_traffic(spec: WorldSpec) -> Traffic:
    """Users -> sessions -> requests (stream ``requests``; ``tails`` for the long tails)."""
    r_req, r_tail = stream(spec, "requests"), stream(spec, "tails")
    span = spec.days * DAY
    n_sess_u = _sessions_per_user(spec, r_req, r_tail)
    sess_user, sess_start = draw_sessions(r_req, n_sess_u, span)
    late_start, new_users = None, 0
    if spec.late_share > 0:
        sess_start, late_start, new_users = _late_period(spec, n_sess_u, sess_user, sess_start,
                                                         span, r_tail)
    req_sess, req_time = draw_requests(r_req, sess_start, spec.requests_per_session)
    n_req = req_sess.size
    sizes = _draw_lengths(r_req, n_req, spec)
    ctx_p = r_req.dirichlet(np.full(spec.n_contexts, 2.0))
    req_ctx = r_req.choice(spec.n_contexts, size=n_req, p=ctx_p)
    hour_phase = r_req.uniform(0, 24)
    return Traffic(req_sess, req_time, sess_user[req_sess], sizes, req_ctx, hour_phase,
                    late_start, new_users)


def draw_slates(spec: WorldSpec, pop: Population, traffic: Traffic) -> tuple[np.ndarray, np.ndarray]:
    """Distinct items per request by Zipf popularity (stream ``slates``); after ``NEW_ITEM_START`` of the
    period, ``new_item_share`` of the slots come from the held-back new items.

    Returns:
        ``imp_req [N]`` and ``imp_item [N]``, request after request.
    """
    rng, sizes = stream(spec, "slates"), traffic.sizes
    n_req = sizes.size
    slate = np.full((n_req, spec.max_len), -1, dtype=np.int64)

    def fill(rows: np.ndarray, p: np.ndarray) -> None:
        n_cand = 2 * int(sizes[rows].max(initial=1)) + 8
        fill_slates(rng, slate, rows, sizes, p, n_cand=n_cand, grow=2, max_rounds=40)

    if spec.new_item_share > 0:
        p_old = np.where(pop.is_new, 0.0, pop.pop)
        p_new = np.where(pop.is_new, pop.pop, 0.0)
        p_old, p_new = p_old / p_old.sum(), p_new / p_new.sum()
        late = traffic.req_time >= NEW_ITEM_START * spec.days * DAY
        p_late = (1.0 - spec.new_item_share) * p_old + spec.new_item_share * p_new
        fill(np.flatnonzero(~late), p_old)
        fill(np.flatnonzero(late), p_late / p_late.sum())
    else:
        fill(np.arange(n_req), pop.pop / pop.pop.sum())
    return np.repeat(np.arange(n_req), sizes), slate[slate >= 0]


@dataclass
class Impressions:
    """Per-impression arrays, reordered together by the logging policy."""

    req: np.ndarray
    item: np.ndarray
    user: np.ndarray
    cat: np.ndarray
    ctx: np.ndarray
    hour: np.ndarray
    tags: np.ndarray
    z: np.ndarray = None  # [N, n_signals] latent signals
    f: np.ndarray = None  # relevance

    def reorder(self, idx: np.ndarray) -> None:
        for name in ("item", "f", "z", "user", "cat", "ctx", "hour", "tags"):
            setattr(self, name, getattr(self, name)[idx])


def relevance(spec: WorldSpec, pop: Population, imp: Impressions, hour_phase: float,
               rng: np.random.Generator) -> np.ndarray:
    """The relevance ``f`` (stream ``truth``): sets ``imp.z`` and returns ``f`` with standard
    deviation ``signal_std``. Every scorer's parameters are drawn whatever ``spec.scorer`` is."""
    n, d = imp.req.size, _D
    u_i, i_i, c_i, x_i, tags_i = imp.user, imp.item, imp.cat, imp.ctx, imp.tags
    match = rng.normal(size=n)          # a query-item match score: differs per impression
    latent = {
        "item_quality": pop.item_quality[i_i], "user_activity": pop.user_activity[u_i],
        "hour_cycle": math.sqrt(2.0) * np.sin(2 * np.pi * (imp.hour - hour_phase) / 24.0),
        "item_price": pop.item_price[i_i], "match": match,
    }
    z = imp.z = np.stack([latent[s] for s in pop.signals], axis=1)
    n_sig = len(pop.signals)
    # additive: per-field effects, linear in the signals
    cat_eff = rng.normal(size=spec.n_categories)
    ctx_eff = rng.normal(size=spec.n_contexts)
    tag_w = rng.normal(size=spec.n_tags)
    beta = rng.normal(size=n_sig)
    terms = [pop.user_bias[u_i], pop.item_bias[i_i], cat_eff[c_i], ctx_eff[x_i], tags_i @ tag_w,
             z @ beta]
    shares = rng.dirichlet(np.ones(len(terms)))
    additive = sum(math.sqrt(w) * standardize(t) for w, t in zip(shares, terms))
    # factorised: field biases + all pairwise dot products of per-field latent vectors
    ctx_vec = rng.normal(size=(spec.n_contexts, d))
    tag_vec = rng.normal(size=(spec.n_tags, d)) / math.sqrt(max(1.0, tags_i.sum(1).mean()))
    num_vec = rng.normal(size=(n_sig, d))
    fields = [pop.user_vec[u_i], pop.item_vec[i_i], pop.cat_vec[c_i], ctx_vec[x_i], tags_i @ tag_vec,
              *(z[:, [k]] * num_vec[k] for k in range(n_sig))]
    tot = sum(fields)
    pair = 0.5 * ((tot * tot).sum(1) - sum((f * f).sum(1) for f in fields))
    a = rng.uniform(0.4, 0.8)
    biases = pop.user_bias[u_i] + pop.item_bias[i_i] + cat_eff[c_i] + ctx_eff[x_i]
    factorised = math.sqrt(a) * standardize(pair) + math.sqrt(1 - a) * standardize(biases)
    # deep: a random two-layer tanh network over embeddings, tags and signals
    proj_u, proj_i = rng.normal(size=(d, 4)) / math.sqrt(d), rng.normal(size=(d, 4)) / math.sqrt(d)
    emb_c, emb_x = rng.normal(size=(spec.n_categories, 3)), rng.normal(size=(spec.n_contexts, 2))
    inp = np.concatenate([pop.user_vec[u_i] @ proj_u, pop.item_vec[i_i] @ proj_i, emb_c[c_i],
                          emb_x[x_i], tags_i - tags_i.mean(0), z], axis=1)
    w1 = rng.normal(size=(inp.shape[1], 32)) * 2.0 / math.sqrt(inp.shape[1])
    w2 = rng.normal(size=(32, 16)) * 1.5 / math.sqrt(32)
    w3 = rng.normal(size=16)
    deep = np.tanh(np.tanh(inp @ w1) @ w2) @ w3
    mix = rng.dirichlet(np.ones(3))
    comps = {"additive": additive, "factorised": factorised, "deep": deep}
    if spec.scorer == "mixed":
        f = sum(math.sqrt(w) * standardize(comps[k]) for w, k in zip(mix, comps))
    else:
        f = comps[spec.scorer]
    if spec.interaction_share > 0:  # the user x item latent interaction, a share of the variance
        s = spec.interaction_share
        uv = np.einsum("nd,nd->n", pop.user_vec[u_i], pop.item_vec[i_i])
        f = math.sqrt(1.0 - s) * standardize(f) + math.sqrt(s) * standardize(uv)
    return spec.signal_std * standardize(f)


def display_order(spec: WorldSpec, imp: Impressions, sizes: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """The logging policy (stream ``order``): shuffled requests in random order, the others by
    a noisy ``f``. Reorders ``imp`` within each request.

    Returns:
        ``shuffled [R]`` (bool) and the 1-based positions ``[N]``.
    """
    rng, n = stream(spec, "order"), imp.req.size
    shuffled = rng.random(sizes.size) < spec.explore_share
    noisy = imp.f + rng.normal(0.0, spec.sort_noise * spec.signal_std, size=n)
    key = np.where(shuffled[imp.req], rng.random(n), -noisy)
    imp.reorder(np.lexsort((key, imp.req)))
    starts = np.cumsum(sizes) - sizes
    return shuffled, np.arange(n) - starts[imp.req] + 1


def missing_items(spec: WorldSpec, pop: Population, n_columns: int) -> np.ndarray:
    """``[I, n_columns]`` bool: which items miss their value of each item-level numeric column
    (stream ``missing``): item ``i`` with chance ``sigmoid(a - item_quality_i)``, ``a`` found by
    bisection so that the mean chance over items is ``spec.missing_share`` (none when 0).

    >>> spec = draw_world(3, size="tiny", missing_share=0.3)
    >>> m = missing_items(spec, draw_population(spec), 4)
    >>> m.shape == (spec.n_items, 4) and bool(0.2 < m.mean() < 0.4)
    True
    """
    if spec.missing_share <= 0 or n_columns == 0:
        return np.zeros((spec.n_items, n_columns), dtype=bool)
    q = pop.item_quality
    lo, hi = -30.0, 30.0
    for _ in range(100):
        a = 0.5 * (lo + hi)
        lo, hi = (a, hi) if sigmoid(a - q).mean() < spec.missing_share else (lo, a)
    chance = sigmoid(0.5 * (lo + hi) - q)
    return stream(spec, "missing").random((spec.n_items, n_columns)) < chance[:, None]


def observed_numeric(spec: WorldSpec, pop: Population, imp: Impressions
                      ) -> tuple[list[tuple[np.ndarray, str]], np.ndarray, np.ndarray]:
    """The numeric columns that observe the latent signals, and the bids (stream
    ``observations``).

    Returns:
        ``[(column [N], what it observes)]`` (the signals' columns, then the irrelevant one),
        the order in which they are written (a permutation), and ``bid [N]``.
    """
    rng, n, k_sig = stream(spec, "observations"), imp.req.size, len(pop.signals)
    noise_scale = spec.signal_noise * rng.uniform(0.5, 1.5, size=k_sig)
    item_noise = rng.normal(size=(k_sig, spec.n_items))
    user_noise = rng.normal(size=(k_sig, spec.n_users))
    imp_noise = rng.normal(size=(k_sig, n))
    irrelevant_item_level = bool(rng.random() < 0.5)
    irr = rng.normal(size=spec.n_items)[imp.item] if irrelevant_item_level else rng.normal(size=n)
    cols: list[tuple[np.ndarray, str]] = []
    for k, s in enumerate(pop.signals):
        sd = float(noise_scale[k])
        if s == "item_quality":
            col = imp.z[:, k] + sd * item_noise[k][imp.item]
            what = f"item_quality (item-level) + Normal(0, {sd:.2f}) per item"
        elif s == "user_activity":
            col = imp.z[:, k] + sd * user_noise[k][imp.user]
            what = f"user_activity (user-level) + Normal(0, {sd:.2f}) per user"
        elif s == "item_price":
            col = np.round(np.exp(3.0 + 0.5 * (imp.z[:, k] + sd * item_noise[k][imp.item])), 2)
            what = f"exp(3 + 0.5 (item_price + Normal(0, {sd:.2f}) per item)), a price"
        elif s == "match":
            col = imp.z[:, k] + sd * imp_noise[k]
            what = f"match (per impression) + Normal(0, {sd:.2f})"
        else:
            col = imp.hour.astype(np.float64)
            what = "hour of day (exact); the truth uses a daily sine of it"
        cols.append((col, what))
    cols.append((irr, "irrelevant: " + ("per-item" if irrelevant_item_level
                                         else "per-impression") + " Normal(0, 1) noise"))
    num_order = rng.permutation(len(cols))
    item_bid = (math.log(rng.uniform(0.2, 5.0)) + 0.3 * rng.normal(size=spec.n_categories)[pop.item_cat]
                + 0.4 * rng.normal(size=spec.n_items))
    bid = np.exp(item_bid[imp.item] + 0.15 * rng.normal(size=n))
    return cols, num_order, bid
