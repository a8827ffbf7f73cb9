"""Randomly built click-log "worlds": many logs with a known truth, to judge defaults on.

:mod:`hybridrank.data.simulators.clicklog` builds one kind of log. A default (the position-bias tower, the
stopping rule, the automatic calibrator) that is tuned on it may only be tuned to it, so this
module draws whole *worlds* from a seed: column names, feature kinds, click rate, list lengths,
position curve, logging policy, drift over time and the structure of the true scorer all change
from seed to seed.

Two steps:

- :func:`~hybridrank.data.simulators.world_spec.draw_world` turns a seed into a
  :class:`~hybridrank.data.simulators.world_spec.WorldSpec` (every structural choice, drawn from
  ``np.random.default_rng(seed)``; any field can be pinned with a keyword; a ``family`` adds
  choices, e.g. ``longtail``: an ad log's long tails);
- :func:`simulate_world` turns a spec into a :class:`World`: the polars frame, the column map for
  hybridrank's click-log config, the true position offsets and a description of every feature.
  :meth:`World.write` stores ``log.parquet`` and ``world.json`` for command-line runs;
  :func:`load_world` reads them back.

The truth. Each impression ``i`` shown at slot ``j`` (1-based) is clicked with probability::

    true_p = sigmoid(true_logit + offset[j])        offset[1] = 0 (the reference slot)
    true_logit = intercept + drift(time) + f(user, item, context, features)

``true_logit`` is the relevance logit at slot 1, ``true_p_ref = sigmoid(true_logit)`` the click
probability at slot 1, so the probability at ANY slot ``k`` is ``sigmoid(true_logit + offset[k])``
with the offsets of :attr:`World.offsets` (also in ``world.json``). The intercept is solved by
bisection so that the mean of ``true_p`` over the logged impressions equals ``spec.ctr``. These three
truth columns have fixed names (:data:`TRUTH_COLUMNS`); every other name comes from the world's
naming scheme (:data:`NAMING_SCHEMES`), so no code can lean on one spelling.

Determinism. The spec is drawn from ``default_rng(seed)``; the simulation uses independent streams
``default_rng([seed, k])`` per concern (population, truth, requests, slates, observations, order,
clicks, position curve; the long tails' ``tails`` and ``side``), so pinning one field (say
``logging="random"`` instead of ``"sorted"``) leaves the users, items and slates of that seed as
they were. Same spec, bit-identical frame.

>>> w = simulate_world(draw_world(3, size="tiny"))
>>> w.frame.height == w.frame[w.columns["request"]].len()
True
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from hybridrank.atomic import atomic_path
from hybridrank.data.simulators.common import DAY, sigmoid, solve_intercept
from hybridrank.data.simulators.world_spec import (
    CONTEXT_VALUES,
    NAMING_SCHEMES,
    TIME_ORIGIN,
    TRUTH_COLUMNS,
    WorldSpec,
    draw_world,  # noqa: F401  (the doctests draw specs)
)
from hybridrank.data.simulators.world_steps import (
    Impressions,
    Population,
    Traffic,
    display_order,
    draw_population,
    draw_slates,
    draw_traffic,
    missing_items,
    observed_numeric,
    relevance,
    stream,
)

__all__ = ["World", "simulate_world", "load_world", "position_offsets", "drift_logit"]

_WEEK = 7 * DAY


def position_offsets(spec: WorldSpec, rng: np.random.Generator | None = None) -> np.ndarray:
    """True logit offsets per slot: ``out[j]`` for slots ``j = 1..max_len``; ``out[0]`` is NaN.

    With ``s = position_strength`` and ``u = position_shape`` in [0, 1], before jitter:

    - ``log``: ``-a log j`` with ``a = s / log 10``;
    - ``power``: ``-a (j^b - 1)``, ``b = 0.25 + 0.5 u`` (steeper than ``log`` deep in the list),
      ``a = s / (10^b - 1)``;
    - ``exponential``: ``-A (1 - exp(-(j - 1) / tau))``, ``tau = 1.5 + 4.5 u``, bounded by ``A``;
    - ``cascade``: the log of the probability of examining slot ``j`` when each earlier slot stops
      the user with probability ``c``, above a floor ``e`` of users who look anywhere:
      ``log(e + (1 - e)(1 - c)^(j - 1))``, ``e = exp(-s) (0.05 + 0.45 u)``;
    - ``none``: 0.

    Every curve has ``offset[1] = 0`` and ``offset[10] = -s``. ``position_jitter > 0`` adds
    ``Normal(0, jitter)`` to slots 2.. (drawn from ``rng``; not under ``none``): bumps no
    parametric curve follows.

    >>> s = draw_world(0, size="tiny", position_curve="log", position_strength=1.0,
    ...                position_jitter=0.0, max_len=10)
    >>> [round(float(x), 3) for x in position_offsets(s)[[1, 10]]]
    [0.0, -1.0]
    """
    j = np.arange(spec.max_len + 1, dtype=np.float64)
    s, u = spec.position_strength, spec.position_shape
    with np.errstate(divide="ignore", invalid="ignore"):
        if spec.position_curve == "log":
            off = -s / math.log(10.0) * np.log(j)
        elif spec.position_curve == "power":
            b = 0.25 + 0.5 * u
            off = -s / (10.0 ** b - 1.0) * (j ** b - 1.0)
        elif spec.position_curve == "exponential":
            tau = 1.5 + 4.5 * u
            off = -s / (1.0 - math.exp(-9.0 / tau)) * (1.0 - np.exp(-(j - 1.0) / tau))
        elif spec.position_curve == "cascade":
            e = math.exp(-s) * (0.05 + 0.45 * u)
            keep = ((math.exp(-s) - e) / (1.0 - e)) ** (1.0 / 9.0)      # 1 - c
            off = np.log(e + (1.0 - e) * keep ** (j - 1.0))
        else:
            off = np.zeros_like(j)
    if spec.position_jitter > 0 and spec.max_len >= 2 and spec.position_curve != "none":
        if rng is None:
            rng = stream(spec, "position")
        off[2:] += rng.normal(0.0, spec.position_jitter, size=spec.max_len - 1)
    off[0] = np.nan
    off[1] = 0.0
    return off


@dataclass(frozen=True, eq=False)
class World:
    """A simulated click log with its truth.

    Attributes:
        frame: one row per impression, requests contiguous in time order, positions ``1..len``
            ascending within a request. Columns: ids (request, session, user, item: int64),
            time (int64 epoch seconds), position (int64), the category (int64) and context
            (string) categoricals, numeric features (float64), tag indicators (int8 0/1), bid
            (float64 > 0), the label (int8 0/1), optionally the explore mark (int8) and the
            propensity (float64, null on sorted requests), and the truth columns
            :data:`TRUTH_COLUMNS` (float64).
        spec: the :class:`WorldSpec`.
        columns: the column map, with exactly the keys of hybridrank's ``ColumnMap`` (request,
            label, session, user, time, position, item, bid, true_p, numeric, categorical,
            request_time_bucket), so ``ColumnMap(**world.columns)`` or a ``data.source.columns``
            override reads the log. Position is mapped but not a numeric feature (add it to
            ``numeric`` to train with the slot as an input).
        extra: the columns outside the map: ``p_ref``, ``logit`` (truth), ``explore`` and
            ``propensity`` (None when absent).
        offsets: true logit offset per slot, indexed by slot (``offsets[0]`` is NaN).
        features: feature column -> what it observes (for reading results, never for training).
        params: drawn values that are not columns: ``intercept`` (solved), ``signals`` (the
            latent numeric signals used), ``drift_sign`` and ``drift_phase``.
    """

    frame: pl.DataFrame
    spec: WorldSpec
    columns: dict[str, Any]
    extra: dict[str, str | None]
    offsets: np.ndarray
    features: dict[str, str]
    params: dict[str, Any]

    def offset(self, slots: Any) -> np.ndarray:
        """True logit offsets of 1-based ``slots`` (array-like)."""
        slots = np.asarray(slots, dtype=np.int64)
        if slots.size and (slots.min() < 1 or slots.max() >= self.offsets.size):
            raise ValueError(f"slots must be in 1..{self.offsets.size - 1}")
        return self.offsets[slots]

    def metadata(self) -> dict[str, Any]:
        """What ``world.json`` holds (JSON-safe)."""
        lab = self.frame[self.columns["label"]]
        return {
            "spec": self.spec.to_dict(),
            "describe": self.spec.describe(),
            "columns": self.columns,
            "extra_columns": self.extra,
            "position_offsets": {"first_slot": 1, "values": [float(x) for x in self.offsets[1:]]},
            "features": self.features,
            "params": self.params,
            "rows": self.frame.height,
            "requests": self.frame[self.columns["request"]].n_unique(),
            "observed_ctr": float(lab.mean()),
            "mean_true_p": float(self.frame[self.columns["true_p"]].mean()),
        }

    def write(self, directory: str | os.PathLike) -> Path:
        """Write ``log.parquet`` and ``world.json`` into ``directory`` (each atomically).

        ``world.json`` holds the spec, the column map, the extra columns, the offsets (``values[k]``
        is slot ``k + 1``), the feature descriptions and :attr:`params`; :func:`load_world` reads both back.
        Returns the directory.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        with atomic_path(directory / "log.parquet") as tmp:
            self.frame.write_parquet(tmp)
        with atomic_path(directory / "world.json") as tmp:
            tmp.write_text(json.dumps(self.metadata(), indent=2) + "\n")
        return directory


def load_world(directory: str | os.PathLike) -> World:
    """Read a :class:`World` written by :meth:`World.write`."""
    directory = Path(directory)
    meta = json.loads((directory / "world.json").read_text())
    vals = meta["position_offsets"]["values"]
    return World(frame=pl.read_parquet(directory / "log.parquet"), spec=WorldSpec(**meta["spec"]),
                 columns=meta["columns"], extra=meta["extra_columns"],
                 offsets=np.array([np.nan, *vals], dtype=np.float64), features=meta["features"],
                 params=meta["params"])


# ----------------------------------------------------------------------------------------------
# Simulation: simulate_world runs the steps of world_steps.py, then the truth and the frame
# ----------------------------------------------------------------------------------------------
def _solve_intercept(logit_wo: np.ndarray, target: float) -> float:
    """The simulator's bisection over a wider range (worlds reach CTRs of 0.3 % with deep scorers)."""
    return solve_intercept(logit_wo, target, bound=30.0, iterations=80)


def drift_logit(spec: WorldSpec, sign: float, phase: float, seconds: np.ndarray) -> np.ndarray:
    """The intercept drift (logit) at ``seconds`` after the log's start (``time - TIME_ORIGIN``):
    ``linear`` from ``-sign·a`` to ``+sign·a`` over ``spec.days``, ``weekly`` a sine of amplitude
    ``a`` and phase ``phase``, ``none`` zero. ``sign`` and ``phase`` are the world's
    ``params["drift_sign"]`` / ``params["drift_phase"]``."""
    t = np.asarray(seconds, dtype=np.float64)
    if spec.drift == "linear":
        return sign * spec.drift_amplitude * (2.0 * (t / (spec.days * DAY)) - 1.0)
    if spec.drift == "weekly":
        return spec.drift_amplitude * np.sin(2 * np.pi * t / _WEEK + phase)
    return np.zeros(t.shape)


def simulate_world(spec: WorldSpec) -> World:
    """Simulate the click log of ``spec`` (see the module docstring for the truth).

    Users run ``1 + Poisson(sessions_per_user - 1)`` sessions starting uniformly over the period,
    each of ``1 + Poisson(requests_per_session - 1)`` requests a minute or two apart. A request
    draws its length, a context value and distinct items by Zipf popularity, orders them by the
    logging policy and shows them at slots ``1..len``; clicks are Bernoulli(``true_p``). The long
    tails of a spec (``user_zipf``, ``late_share``, ``new_user_share``, ``n_side``,
    ``interaction_share``) change the sessions, add columns and a term of the truth.

    Steps (:mod:`hybridrank.data.simulators.world_steps`): the population, the traffic, the
    slates, the relevance; then the drift, the display order, the truth and the clicks, the
    observed columns and the frame.

    Returns:
        The :class:`World`.
    """
    pop = draw_population(spec)
    traffic = draw_traffic(spec)
    imp_req, imp_item = draw_slates(spec, pop, traffic)
    u_i = traffic.req_user[imp_req]
    imp = Impressions(req=imp_req, item=imp_item, user=u_i, cat=pop.item_cat[imp_item],
                      ctx=traffic.req_ctx[imp_req], hour=(traffic.req_time[imp_req] // 3600) % 24,
                      tags=pop.item_tags[imp_item].astype(np.float64))
    r_truth = stream(spec, "truth")
    imp.f = relevance(spec, pop, imp, traffic.hour_phase, r_truth)
    sign = 1.0 if r_truth.random() < 0.5 else -1.0
    phase = r_truth.uniform(0, 2 * np.pi)
    drift_req = drift_logit(spec, sign, phase, traffic.req_time)
    shuffled, pos = display_order(spec, imp, traffic.sizes)

    # the truth: intercept, probabilities, clicks
    offsets = position_offsets(spec, stream(spec, "position"))
    logit_wo = imp.f + drift_req[imp.req]
    intercept = _solve_intercept(logit_wo + offsets[pos], spec.ctr)
    rel = logit_wo + intercept
    p_true = sigmoid(rel + offsets[pos])
    click = (stream(spec, "clicks").random(imp.req.size) < p_true).astype(np.int8)

    numeric_cols, num_order, bid = observed_numeric(spec, pop, imp)
    truth = {TRUTH_COLUMNS["true_p"]: p_true, TRUTH_COLUMNS["p_ref"]: sigmoid(rel),
             TRUTH_COLUMNS["logit"]: rel}
    frame, columns, extra, features = _frame(spec, pop, traffic, imp, pos, shuffled, numeric_cols,
                                             num_order, bid, click, truth)
    params = {"intercept": float(intercept), "signals": pop.signals, "drift_sign": sign,
              "drift_phase": float(phase)}
    if traffic.late_start is not None:
        params["late_start"] = TIME_ORIGIN + traffic.late_start
        params["new_users"] = traffic.new_users
    return World(frame=frame, spec=spec, columns=columns, extra=extra, offsets=offsets,
                 features=features, params=params)


def _frame(spec: WorldSpec, pop: Population, traffic: Traffic, imp: Impressions, pos: np.ndarray,
           shuffled: np.ndarray, numeric_cols: list[tuple[np.ndarray, str]], num_order: np.ndarray,
           bid: np.ndarray, click: np.ndarray, truth: dict[str, np.ndarray]
           ) -> tuple[pl.DataFrame, dict[str, Any], dict[str, str | None], dict[str, str]]:
    """The log in the world's naming scheme, its column map, extra columns and feature notes."""
    names, imp_req, sizes = NAMING_SCHEMES[spec.naming], imp.req, traffic.sizes
    cols: dict[str, Any] = {
        names["request"]: imp_req.astype(np.int64),
        names["session"]: traffic.req_sess[imp_req].astype(np.int64),
        names["user"]: imp.user.astype(np.int64),
        names["time"]: (TIME_ORIGIN + traffic.req_time[imp_req]).astype(np.int64),
        names["position"]: pos.astype(np.int64),
        names["item"]: imp.item.astype(np.int64),
        names["category"]: imp.cat.astype(np.int64),
        names["context"]: np.asarray(CONTEXT_VALUES)[imp.ctx],
    }
    features = {names["category"]: f"item category ({spec.n_categories} values)",
                names["context"]: f"request context ({spec.n_contexts} values)",
                names["user"]: f"user id ({spec.n_users} users)",
                names["item"]: f"item id ({spec.n_items} items, Zipf {spec.item_zipf})"}
    numeric = []
    # the item-level columns that can miss values: the item signals' observations, the side features
    item_level = [k for k, sig in enumerate(pop.signals) if sig in ("item_quality", "item_price")]
    gone = missing_items(spec, pop, len(item_level) + spec.n_side)
    miss = {k: gone[:, j] for j, k in enumerate(item_level)}

    def observed(name: str, values: np.ndarray, what: str, missing: np.ndarray | None):
        if missing is None or not spec.missing_share:
            return values, what
        hole = missing[imp.item]
        return (pl.Series(name, np.where(hole, np.nan, values)).fill_nan(None),
                f"{what}; missing (null) for {missing.mean():.0%} of items, the weaker ones more often")

    for rank, k in enumerate(num_order):
        name = names["numeric"].format(rank)
        cols[name], features[name] = observed(name, numeric_cols[k][0].astype(np.float64),
                                              numeric_cols[k][1], miss.get(k))
        numeric.append(name)
    for t in range(spec.n_tags):
        name = names["tag"].format(t)
        cols[name] = pop.item_tags[imp.item, t]
        features[name] = f"item tag {t} indicator (multi-hot, rate {pop.item_tags[:, t].mean():.2f})"
        numeric.append(name)
    for k in range(spec.n_side):
        name = names["side"].format(k)
        cols[name], features[name] = observed(
            name, pop.side[imp.item, k], f"item side feature {k} (dense, an ad embedding): correlation "
            f"{spec.side_corr:.2f} with a random projection of the item's latent vector",
            gone[:, len(item_level) + k])
        numeric.append(name)
    cols[names["bid"]] = bid
    cols[names["label"]] = click
    explore = propensity = None
    if spec.mark_explore and spec.explore_share > 0:
        explore = names["explore"]
        cols[explore] = shuffled[imp_req].astype(np.int8)
    if spec.propensity and spec.explore_share > 0:
        propensity = names["propensity"]
        prop = np.where(shuffled[imp_req], 1.0 / sizes[imp_req], np.nan)
        cols[propensity] = pl.Series(propensity, prop).fill_nan(None)
    cols.update(truth)
    columns = {
        "request": names["request"], "label": names["label"], "session": names["session"],
        "user": names["user"], "time": names["time"], "position": names["position"],
        "item": names["item"], "bid": names["bid"], "true_p": TRUTH_COLUMNS["true_p"],
        "numeric": numeric,
        "categorical": [names["user"], names["item"], names["category"], names["context"]],
        "request_time_bucket": None,
    }
    extra = {"p_ref": TRUTH_COLUMNS["p_ref"], "logit": TRUTH_COLUMNS["logit"],
             "explore": explore, "propensity": propensity}
    return pl.DataFrame(cols), columns, extra, features
