"""Randomly built click-log "worlds": many logs with a known truth, to judge defaults on.

:mod:`hybridrank.simulate` builds one kind of log. A default (the position-bias tower, the
stopping rule, the automatic calibrator) that is tuned on it may only be tuned to it, so this
module draws whole *worlds* from a seed: column names, feature kinds, click rate, list lengths,
position curve, logging policy, drift over time and the structure of the true scorer all change
from seed to seed.

Two steps:

- :func:`draw_world` turns a seed into a :class:`WorldSpec` (every structural choice, drawn from
  ``np.random.default_rng(seed)``; any field can be pinned with a keyword);
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
clicks, position curve), so pinning one field (say ``logging="random"`` instead of ``"sorted"``)
leaves the users, items and slates of that seed as they were. Same spec, bit-identical frame.

>>> w = simulate_world(draw_world(3, size="tiny"))
>>> w.frame.height == w.frame[w.columns["request"]].len()
True
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from hybridrank.atomic import atomic_path
from hybridrank.data.simulate import _repeats, _sigmoid
from hybridrank.data.simulate import _solve_intercept as _simulator_intercept

__all__ = [
    "WorldSpec", "World", "draw_world", "simulate_world", "load_world",
    "position_offsets", "drift_logit", "NAMING_SCHEMES", "SIZES", "TRUTH_COLUMNS", "TIME_ORIGIN", "POSITION_CURVES",
    "SCORERS", "DRIFTS", "LOGGING", "SIGNALS",
]

#: Target impression counts per ``size`` (drawn log-uniformly in the range).
SIZES = {"tiny": (5_000, 15_000), "small": (40_000, 120_000)}

#: Names of the truth columns (the same in every world): the click probability at the logged slot,
#: at the reference slot 1, and the relevance logit at slot 1.
TRUTH_COLUMNS = {"true_p": "true_p", "p_ref": "true_p_ref", "logit": "true_logit"}

#: Column names per naming scheme. ``tag`` and ``numeric`` are patterns numbered from 0.
NAMING_SCHEMES: dict[str, dict[str, str]] = {
    "web": dict(request="request_id", session="session_id", user="user_id", time="ts",
                position="position", item="item_id", label="click", bid="bid",
                category="item_category", context="device", tag="tag_{}", numeric="f{}",
                explore="is_explore", propensity="propensity"),
    "letor": dict(request="qid", session="sid", user="uid", time="timestamp", position="rank",
                  item="doc_id", label="clicked", bid="cpc", category="topic", context="vertical",
                  tag="kw_{}", numeric="feat_{}", explore="randomized", propensity="pscore"),
    "ads": dict(request="impression_group", session="visit_id", user="visitor",
                time="event_time", position="slot", item="ad_id", label="is_click", bid="max_cpc",
                category="ad_format", context="platform", tag="interest_{}", numeric="x{}",
                explore="uniform_bucket", propensity="logging_prob"),
    "shop": dict(request="page_view", session="session_key", user="customer", time="epoch_s",
                 position="rank_pos", item="sku", label="clk", bid="bid_amount",
                 category="brand_tier", context="channel", tag="attr_{}", numeric="num_{}",
                 explore="shuffled", propensity="p_logged"),
}

POSITION_CURVES = ("log", "power", "exponential", "cascade", "none")
SCORERS = ("additive", "factorised", "deep", "mixed")
DRIFTS = ("none", "linear", "weekly")
LOGGING = ("random", "sorted")
#: The latent numeric signals a world may use (each observed through one noisy numeric column).
SIGNALS = ("item_quality", "user_activity", "hour_cycle", "item_price", "match")
_CONTEXT_VALUES = ("web", "ios", "android", "tablet", "tv", "app")
_EXPLORE_SHARES = (0.0, 0.01, 0.05, 0.10, 0.20)
_EXPLORE_P = (0.3, 0.15, 0.25, 0.2, 0.1)
_DAY, _WEEK = 86_400, 7 * 86_400
#: Times are int epoch seconds from here on (2023-11-15 00:00 UTC): ``time - TIME_ORIGIN`` is the
#: time within the world's period of ``days``.
TIME_ORIGIN = 1_700_006_400
_NEW_POOL = 0.2              # share of the catalogue held back as "new items" (new_item_share > 0)
_LATE = 0.7                  # new items appear in requests after this fraction of the period
_STREAMS = ("population", "truth", "requests", "slates", "observations", "order", "clicks",
            "position")


@dataclass(frozen=True)
class WorldSpec:
    """Every structural choice of one world. Draw it with :func:`draw_world`.

    Sizes and population
        seed: the world's seed (>= 0); also seeds the simulation streams.
        size: the size class the target was drawn from (``"tiny"``, ``"small"``, or ``"custom"``).
        n_impressions: target number of impressions (the log lands near it, not on it).
        naming: key of :data:`NAMING_SCHEMES`.
        n_users: users (derived from the target and the lengths unless pinned).
        n_items: item catalogue size, 1e3..1e5 (log-uniform); item ids are the high-cardinality
            categorical, drawn with Zipf popularity ``rank ** -item_zipf`` (0.6..1.1).
        new_item_share: 0, or 0.05..0.3: after 70 % of the period, this share of the slots is
            filled from 20 % of the catalogue never shown before (ids unseen in a time split).
        n_categories: low-cardinality item categorical (4..40).
        n_contexts: request-level string categorical (2..6 values, e.g. device).
        n_tags: multi-hot item tags, written as 0/1 indicator columns (2..8).
        sessions_per_user, requests_per_session: means (>= 1; ``1 + Poisson(mean - 1)``), 1..3.5.
        days: length of the period (14..35 days).
    Lists
        min_len, max_len: request lengths ``floor(exp(U(log min, log(max + 1))))``, min 2..10,
            max log-uniform up to 200.
        one_item_share: share of requests with a single item (0, or 0.01..0.08).
    Features
        n_signals: latent numeric signals used (2..4 of :data:`SIGNALS`), each observed through one
            noisy numeric column; one more numeric column is irrelevant noise.
        signal_noise: noise std of those observations (0.1..1.0, times 0.5..1.5 per column).
    Truth
        ctr: target mean true click probability at the logged slots (0.003..0.15 log-uniform).
        scorer: structure of ``f``: ``additive`` (per-field effects, linear in the numeric
            signals), ``factorised`` (field biases + pairwise dot products of per-field latent
            vectors: what a factorization machine fits), ``deep`` (a random two-layer tanh
            network over embeddings, tags and signals), ``mixed`` (a random blend of the three).
        signal_std: standard deviation of ``f`` over the impressions (0.5..1.5 logits).
        position_curve, position_strength, position_shape, position_jitter: the offsets (see
            :func:`position_offsets`); ``strength`` = ``-offset[10]`` before jitter (0.3..2).
    Logging
        logging: ``random`` (every request shuffled) or ``sorted`` (by ``f`` plus Gaussian
            noise of std ``sort_noise * signal_std``, sort_noise 0.2..1.5).
        explore_share: share of requests shown in uniformly random order (1.0 under ``random``;
            0, 0.01, 0.05, 0.1 or 0.2 under ``sorted``).
        mark_explore: write a 0/1 column marking the shuffled requests (when explore_share > 0).
        propensity: write the probability of the logged slot (when explore_share > 0): ``1 / len``
            on shuffled requests, null on sorted ones (where it has no closed form).
    Drift
        drift: intercept drift over time: ``none``, ``linear`` (from -a to +a or back),
            ``weekly`` (``a * sin(2 pi t / week + phase)``).
        drift_amplitude: ``a`` (0.1..0.5 logits; 0 with ``drift="none"``).
    """

    seed: int
    size: str
    n_impressions: int
    naming: str
    n_users: int
    n_items: int
    item_zipf: float
    new_item_share: float
    n_categories: int
    n_contexts: int
    n_tags: int
    sessions_per_user: float
    requests_per_session: float
    days: int
    min_len: int
    max_len: int
    one_item_share: float
    n_signals: int
    signal_noise: float
    ctr: float
    scorer: str
    signal_std: float
    position_curve: str
    position_strength: float
    position_shape: float
    position_jitter: float
    logging: str
    sort_noise: float
    explore_share: float
    mark_explore: bool
    propensity: bool
    drift: str
    drift_amplitude: float

    def __post_init__(self) -> None:
        casts = {"int": int, "float": float, "str": str, "bool": bool}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.type == "bool" and not isinstance(v, (bool, np.bool_)):
                raise TypeError(f"WorldSpec.{f.name} must be a bool, got {v!r}")
            if f.type == "int" and float(v) != int(v):
                raise TypeError(f"WorldSpec.{f.name} must be an integer, got {v!r}")
            object.__setattr__(self, f.name, casts[f.type](v))
        self._check()

    def _check(self) -> None:
        def need(ok: bool, what: str) -> None:
            if not ok:
                raise ValueError(f"WorldSpec: {what}")
        need(self.seed >= 0, f"seed must be >= 0, got {self.seed}")
        need(self.naming in NAMING_SCHEMES, f"naming must be one of {list(NAMING_SCHEMES)}")
        need(self.scorer in SCORERS, f"scorer must be one of {SCORERS}, got {self.scorer!r}")
        need(self.drift in DRIFTS, f"drift must be one of {DRIFTS}, got {self.drift!r}")
        need(self.logging in LOGGING, f"logging must be one of {LOGGING}, got {self.logging!r}")
        need(self.position_curve in POSITION_CURVES,
             f"position_curve must be one of {POSITION_CURVES}, got {self.position_curve!r}")
        need(min(self.n_impressions, self.n_users, self.n_categories, self.n_tags) >= 1,
             "n_impressions, n_users, n_categories, n_tags must be >= 1")
        need(1 <= self.n_contexts <= len(_CONTEXT_VALUES), f"n_contexts must be 1..{len(_CONTEXT_VALUES)}")
        need(1 <= self.n_signals <= len(SIGNALS), f"n_signals must be 1..{len(SIGNALS)}")
        need(1 <= self.min_len <= self.max_len, f"need 1 <= min_len <= max_len, got "
             f"{self.min_len}, {self.max_len}")
        n_old = self.n_items - (round(_NEW_POOL * self.n_items) if self.new_item_share > 0 else 0)
        need(self.max_len <= n_old, f"max_len={self.max_len} exceeds the {n_old} items a slate can "
             "draw from (slates hold distinct items)")
        need(0.0 < self.ctr < 1.0, f"ctr must be in (0, 1), got {self.ctr}")
        need(self.sessions_per_user >= 1 and self.requests_per_session >= 1 and self.days >= 1,
             "sessions_per_user, requests_per_session and days must be >= 1")
        for name in ("new_item_share", "one_item_share", "explore_share"):
            need(0.0 <= getattr(self, name) <= 1.0, f"{name} must be in [0, 1]")
        need(self.new_item_share < 1.0, "new_item_share must be < 1")
        for name in ("item_zipf", "signal_noise", "signal_std", "position_strength",
                     "position_jitter", "sort_noise", "drift_amplitude"):
            need(getattr(self, name) >= 0.0, f"{name} must be >= 0")
        need(0.0 <= self.position_shape <= 1.0, "position_shape must be in [0, 1]")
        need((self.logging == "random") == (self.explore_share == 1.0),
             f"logging='random' means explore_share=1 (every request shuffled) and 'sorted' means "
             f"explore_share < 1; got logging={self.logging!r}, explore_share={self.explore_share}")
        need(self.position_curve != "none" or self.position_strength == 0.0,
             "position_curve='none' needs position_strength=0")
        need(self.drift != "none" or self.drift_amplitude == 0.0, "drift='none' needs drift_amplitude=0")

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-safe dict (``WorldSpec(**d)`` rebuilds the spec)."""
        return dataclasses.asdict(self)

    def describe(self) -> str:
        """One line for logs and benchmark tables."""
        singles = f" +{self.one_item_share:.0%} singles" if self.one_item_share else ""
        curve = (self.position_curve if self.position_curve == "none"
                 else f"{self.position_curve} {self.position_strength:.2f}")
        if self.logging == "random":
            log = "random"
        else:
            log = f"sorted (noise {self.sort_noise:.2f}, explore {self.explore_share:.0%})"
        drift = self.drift if self.drift == "none" else f"{self.drift} {self.drift_amplitude:.2f}"
        return (f"world {self.seed} [{self.size}, {self.naming}]: ~{self.n_impressions:,} imps, "
                f"CTR {self.ctr:.2%}, lists {self.min_len}-{self.max_len}{singles}, "
                f"curve {curve}, logging {log}, scorer {self.scorer} (std {self.signal_std:.2f}), "
                f"drift {drift}, {self.n_items:,} items (zipf {self.item_zipf:.2f})")


_FIELDS = tuple(f.name for f in dataclasses.fields(WorldSpec))


def _loguniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _mean_length(min_len: int, max_len: int, one_item_share: float) -> float:
    """Expected request length under :func:`_draw_lengths`."""
    k = np.arange(min_len, max_len + 1, dtype=np.float64)
    w = np.log(k + 1) - np.log(k)
    return one_item_share + (1.0 - one_item_share) * float((k * w).sum() / w.sum())


def draw_world(seed: int, *, size: str = "small", **overrides: Any) -> WorldSpec:
    """Draw a world's spec from ``np.random.default_rng(seed)``; keywords pin any field.

    Every field is drawn whatever is pinned, so pinning one field leaves the others as the seed
    drew them, except where fields are tied together:

    - ``logging`` and ``explore_share``: ``random`` means ``explore_share=1``; pinning only
      ``explore_share`` picks the logging (1 -> random, < 1 -> sorted); pinning only
      ``logging="sorted"`` keeps the drawn share of a sorted world.
    - ``position_curve="none"`` sets ``position_strength=0``; ``drift="none"`` sets
      ``drift_amplitude=0``.
    - ``min_len`` / ``max_len``: pinning one moves the other if they would cross.
    - ``n_users`` follows from ``n_impressions``, the lengths and the session sizes unless pinned.

    Args:
        seed: any integer >= 0.
        size: ``"tiny"`` (5k-15k impressions, for tests) or ``"small"`` (40k-120k).
        **overrides: :class:`WorldSpec` fields to pin (``size`` is recorded as ``"custom"`` when
            ``n_impressions`` is pinned).

    Returns:
        The :class:`WorldSpec`.

    >>> draw_world(5, size="tiny", logging="sorted", explore_share=0.05).explore_share
    0.05
    >>> draw_world(5, size="tiny", logging="random").explore_share
    1.0
    """
    if size not in SIZES:
        raise ValueError(f"size must be one of {list(SIZES)}, got {size!r}")
    unknown = sorted(set(overrides) - set(_FIELDS[2:]))
    if unknown:
        raise TypeError(f"draw_world: cannot pin {unknown}; fields are {list(_FIELDS[2:])}")
    rng = np.random.default_rng(seed)
    lo, hi = SIZES[size]
    d: dict[str, Any] = {"seed": int(seed), "size": size}
    d["n_impressions"] = round(_loguniform(rng, lo, hi))
    d["naming"] = list(NAMING_SCHEMES)[int(rng.integers(len(NAMING_SCHEMES)))]
    d["n_items"] = round(_loguniform(rng, 1e3, 1e5))
    d["item_zipf"] = round(float(rng.uniform(0.6, 1.1)), 3)
    new = float(rng.uniform(0.05, 0.3))
    d["new_item_share"] = round(new, 3) if rng.random() < 0.5 else 0.0
    d["n_categories"] = int(rng.integers(4, 41))
    d["n_contexts"] = int(rng.integers(2, 7))
    d["n_tags"] = int(rng.integers(2, 9))
    d["sessions_per_user"] = round(float(rng.uniform(1.0, 3.5)), 2)
    d["requests_per_session"] = round(float(rng.uniform(1.0, 3.5)), 2)
    d["days"] = int(rng.integers(14, 36))
    min_len = int(rng.integers(2, 11))
    max_len = round(_loguniform(rng, max(min_len, 5), 200))
    single = float(rng.uniform(0.01, 0.08))
    d["one_item_share"] = round(single, 3) if rng.random() < 0.6 else 0.0
    d["n_signals"] = int(rng.integers(2, 5))
    d["signal_noise"] = round(float(rng.uniform(0.1, 1.0)), 3)
    d["ctr"] = round(_loguniform(rng, 0.003, 0.15), 5)
    d["scorer"] = SCORERS[int(rng.integers(len(SCORERS)))]
    d["signal_std"] = round(float(rng.uniform(0.5, 1.5)), 3)
    curve = POSITION_CURVES[int(rng.integers(len(POSITION_CURVES)))]
    strength = round(float(rng.uniform(0.3, 2.0)), 3)
    d["position_shape"] = round(float(rng.random()), 3)
    jitter = float(rng.uniform(0.02, 0.1))
    d["position_jitter"] = round(jitter, 3) if rng.random() < 0.3 else 0.0
    logging = "random" if rng.random() < 0.4 else "sorted"
    d["sort_noise"] = round(float(rng.uniform(0.2, 1.5)), 3)
    share = float(_EXPLORE_SHARES[int(rng.choice(len(_EXPLORE_SHARES), p=_EXPLORE_P))])
    d["mark_explore"] = bool(rng.random() < 0.7)
    d["propensity"] = bool(rng.random() < 0.5)
    drift = DRIFTS[int(rng.integers(len(DRIFTS)))]
    amp = round(float(rng.uniform(0.1, 0.5)), 3)

    # pinned fields, then the fields tied to them
    pin = dict(overrides)
    d.update({k: v for k, v in pin.items()
              if k not in ("logging", "explore_share", "position_curve", "position_strength",
                           "drift", "drift_amplitude", "min_len", "max_len", "n_users")})
    if "n_impressions" in pin:
        d["size"] = "custom"
    if "logging" in pin:
        logging = pin["logging"]
    elif "explore_share" in pin:
        logging = "random" if float(pin["explore_share"]) == 1.0 else "sorted"
    d["logging"] = logging
    d["explore_share"] = pin.get("explore_share", 1.0 if logging == "random" else share)
    d["position_curve"] = pin.get("position_curve", curve)
    d["position_strength"] = pin.get("position_strength",
                                     0.0 if d["position_curve"] == "none" else strength)
    d["drift"] = pin.get("drift", drift)
    d["drift_amplitude"] = pin.get("drift_amplitude", 0.0 if d["drift"] == "none" else amp)
    if "min_len" in pin and "max_len" not in pin:
        max_len = max(max_len, int(pin["min_len"]))
    if "max_len" in pin and "min_len" not in pin:
        min_len = min(min_len, int(pin["max_len"]))
    d["min_len"] = pin.get("min_len", min_len)
    d["max_len"] = pin.get("max_len", max_len)
    d["n_users"] = pin.get("n_users", max(1, round(
        d["n_impressions"] / (_mean_length(int(d["min_len"]), int(d["max_len"]),
                                           float(d["one_item_share"]))
                              * float(d["sessions_per_user"]) * float(d["requests_per_session"])))))
    return WorldSpec(**{k: d[k] for k in _FIELDS})


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
            rng = np.random.default_rng([spec.seed, _STREAMS.index("position")])
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
# Simulation
# ----------------------------------------------------------------------------------------------
def _solve_intercept(logit_wo: np.ndarray, target: float) -> float:
    """The simulator's bisection over a wider range (worlds reach CTRs of 0.3 % with deep scorers)."""
    return _simulator_intercept(logit_wo, target, bound=30.0, iterations=80)


def drift_logit(spec: WorldSpec, sign: float, phase: float, seconds: np.ndarray) -> np.ndarray:
    """The intercept drift (logit) at ``seconds`` after the log's start (``time - TIME_ORIGIN``):
    ``linear`` from ``-sign·a`` to ``+sign·a`` over ``spec.days``, ``weekly`` a sine of amplitude
    ``a`` and phase ``phase``, ``none`` zero. ``sign`` and ``phase`` are the world's
    ``params["drift_sign"]`` / ``params["drift_phase"]``."""
    t = np.asarray(seconds, dtype=np.float64)
    if spec.drift == "linear":
        return sign * spec.drift_amplitude * (2.0 * (t / (spec.days * _DAY)) - 1.0)
    if spec.drift == "weekly":
        return spec.drift_amplitude * np.sin(2 * np.pi * t / _WEEK + phase)
    return np.zeros(t.shape)


def _standardize(x: np.ndarray) -> np.ndarray:
    sd = float(x.std())
    return (x - x.mean()) / sd if sd > 0 else np.zeros_like(x)


def _draw_lengths(rng: np.random.Generator, n: int, spec: WorldSpec) -> np.ndarray:
    """Request lengths: 1 with probability ``one_item_share``, else discretised log-uniform."""
    u, v = rng.random(n), rng.random(n)
    lo, hi = spec.min_len, spec.max_len
    k = np.floor(np.exp(math.log(lo) + u * (math.log(hi + 1) - math.log(lo)))).astype(np.int64)
    return np.where(v < spec.one_item_share, 1, np.clip(k, lo, hi))


def _fill_slates(rng: np.random.Generator, slate: np.ndarray, rows: np.ndarray, sizes: np.ndarray,
                 p: np.ndarray) -> None:
    """Fill ``slate[r, :sizes[r]]`` for ``r`` in ``rows`` with distinct items drawn by ``p``.

    Candidates are drawn with replacement (``2 * max size + 8`` per row), repeats inside a row
    dropped (keeping the first draw), the first ``sizes[r]`` kept; rows left short are drawn again
    with twice the candidates.
    """
    todo = rows
    n_cand = 2 * int(sizes[rows].max(initial=1)) + 8
    for _ in range(40):
        if not todo.size:
            return
        cand = rng.choice(p.size, size=(todo.size, n_cand), p=p)
        dup = _repeats(cand)
        rank = np.cumsum(~dup, axis=1)
        size = sizes[todo][:, None]
        take = ~dup & (rank <= size)
        ok = take.sum(axis=1) == sizes[todo]
        r, c = np.nonzero(take[ok])
        slate[todo[ok][r], rank[ok][r, c] - 1] = cand[ok][r, c]
        todo = todo[~ok]
        n_cand *= 2
    raise RuntimeError("could not draw distinct slates (popularity too concentrated)")


def simulate_world(spec: WorldSpec) -> World:
    """Simulate the click log of ``spec`` (see the module docstring for the truth).

    Users run ``1 + Poisson(sessions_per_user - 1)`` sessions starting uniformly over the period,
    each of ``1 + Poisson(requests_per_session - 1)`` requests a minute or two apart. A request
    draws its length, a context value and distinct items by Zipf popularity, orders them by the
    logging policy and shows them at slots ``1..len``; clicks are Bernoulli(``true_p``).

    Returns:
        The :class:`World`.
    """
    names = NAMING_SCHEMES[spec.naming]
    rs = {name: np.random.default_rng([spec.seed, k]) for k, name in enumerate(_STREAMS)}
    r_pop, r_truth, r_req = rs["population"], rs["truth"], rs["requests"]

    # --- population: items, users, latent signals ---------------------------------------------
    n_items, n_cat, n_tags, d = spec.n_items, spec.n_categories, spec.n_tags, 8
    pop = (r_pop.permutation(n_items) + 1.0) ** -spec.item_zipf
    cat_p = r_pop.dirichlet(np.full(n_cat, 2.0))
    item_cat = r_pop.choice(n_cat, size=n_items, p=cat_p)
    rate = r_pop.uniform(0.05, 0.4, n_tags)
    tag_base = np.log(rate / (1.0 - rate))
    tag_p = _sigmoid(tag_base[None, :] + r_pop.normal(0.0, 1.0, (n_cat, n_tags)))
    item_tags = (r_pop.random((n_items, n_tags)) < tag_p[item_cat]).astype(np.int8)
    is_new = r_pop.permutation(n_items) < round(_NEW_POOL * n_items)
    cat_vec = r_pop.normal(size=(n_cat, d))
    item_vec = 0.7 * cat_vec[item_cat] + 0.7 * r_pop.normal(size=(n_items, d))
    item_bias = r_pop.normal(size=n_items)
    item_quality = 0.6 * item_bias + 0.8 * r_pop.normal(size=n_items)
    item_price = r_pop.normal(size=n_items)
    n_users = spec.n_users
    user_vec = r_pop.normal(size=(n_users, d))
    user_bias = r_pop.normal(size=n_users)
    user_activity = 0.6 * user_bias + 0.8 * r_pop.normal(size=n_users)
    signals = [SIGNALS[k] for k in r_pop.permutation(len(SIGNALS))[:spec.n_signals]]

    # --- users -> sessions -> requests ---------------------------------------------------------
    span = spec.days * _DAY
    n_sess_u = 1 + r_req.poisson(spec.sessions_per_user - 1.0, size=n_users)
    sess_user = np.repeat(np.arange(n_users), n_sess_u)
    n_sess = sess_user.size
    sess_start = r_req.integers(0, span, size=n_sess)
    n_req_s = 1 + r_req.poisson(spec.requests_per_session - 1.0, size=n_sess)
    req_sess = np.repeat(np.arange(n_sess), n_req_s)
    gaps = 1 + r_req.exponential(90.0, size=req_sess.size).astype(np.int64)
    first = np.repeat(np.cumsum(n_req_s) - n_req_s, n_req_s)
    csum = np.cumsum(gaps)
    req_time = sess_start[req_sess] + (csum - csum[first])
    order = np.lexsort((np.arange(req_sess.size), req_time))
    req_sess, req_time = req_sess[order], req_time[order]
    n_req = req_sess.size
    req_user = sess_user[req_sess]
    sizes = _draw_lengths(r_req, n_req, spec)
    ctx_p = r_req.dirichlet(np.full(spec.n_contexts, 2.0))
    req_ctx = r_req.choice(spec.n_contexts, size=n_req, p=ctx_p)
    hour_phase = r_req.uniform(0, 24)

    # --- slates ------------------------------------------------------------------------------
    slate = np.full((n_req, spec.max_len), -1, dtype=np.int64)
    if spec.new_item_share > 0:
        p_old = np.where(is_new, 0.0, pop)
        p_new = np.where(is_new, pop, 0.0)
        p_old, p_new = p_old / p_old.sum(), p_new / p_new.sum()
        late = req_time >= _LATE * span
        p_late = (1.0 - spec.new_item_share) * p_old + spec.new_item_share * p_new
        _fill_slates(rs["slates"], slate, np.flatnonzero(~late), sizes, p_old)
        _fill_slates(rs["slates"], slate, np.flatnonzero(late), sizes, p_late / p_late.sum())
    else:
        _fill_slates(rs["slates"], slate, np.arange(n_req), sizes, pop / pop.sum())
    imp_req = np.repeat(np.arange(n_req), sizes)
    imp_item = slate[slate >= 0]
    n = imp_req.size
    u_i, c_i = req_user[imp_req], item_cat[imp_item]
    x_i, hour = req_ctx[imp_req], (req_time[imp_req] // 3600) % 24
    tags_i = item_tags[imp_item].astype(np.float64)

    # --- latent signals per impression ---------------------------------------------------------
    match = r_truth.normal(size=n)          # a query-item match score: differs per impression
    latent = {
        "item_quality": item_quality[imp_item], "user_activity": user_activity[u_i],
        "hour_cycle": math.sqrt(2.0) * np.sin(2 * np.pi * (hour - hour_phase) / 24.0),
        "item_price": item_price[imp_item], "match": match,
    }
    z = np.stack([latent[s] for s in signals], axis=1)

    # --- the relevance f ---------------------------------------------------------------------
    cat_eff = r_truth.normal(size=n_cat)
    ctx_eff = r_truth.normal(size=spec.n_contexts)
    tag_w = r_truth.normal(size=n_tags)
    beta = r_truth.normal(size=len(signals))
    terms = [user_bias[u_i], item_bias[imp_item], cat_eff[c_i], ctx_eff[x_i], tags_i @ tag_w,
             z @ beta]
    shares = r_truth.dirichlet(np.ones(len(terms)))
    additive = sum(math.sqrt(w) * _standardize(t) for w, t in zip(shares, terms))
    # factorised: field biases + all pairwise dot products of per-field latent vectors
    ctx_vec = r_truth.normal(size=(spec.n_contexts, d))
    tag_vec = r_truth.normal(size=(n_tags, d)) / math.sqrt(max(1.0, tags_i.sum(1).mean()))
    num_vec = r_truth.normal(size=(len(signals), d))
    fields = [user_vec[u_i], item_vec[imp_item], cat_vec[c_i], ctx_vec[x_i], tags_i @ tag_vec,
              *(z[:, [k]] * num_vec[k] for k in range(len(signals)))]
    tot = sum(fields)
    pair = 0.5 * ((tot * tot).sum(1) - sum((f * f).sum(1) for f in fields))
    a = r_truth.uniform(0.4, 0.8)
    biases = user_bias[u_i] + item_bias[imp_item] + cat_eff[c_i] + ctx_eff[x_i]
    factorised = math.sqrt(a) * _standardize(pair) + math.sqrt(1 - a) * _standardize(biases)
    # deep: a random two-layer tanh network over embeddings, tags and signals
    proj_u, proj_i = r_truth.normal(size=(d, 4)) / math.sqrt(d), r_truth.normal(size=(d, 4)) / math.sqrt(d)
    emb_c, emb_x = r_truth.normal(size=(n_cat, 3)), r_truth.normal(size=(spec.n_contexts, 2))
    inp = np.concatenate([user_vec[u_i] @ proj_u, item_vec[imp_item] @ proj_i, emb_c[c_i],
                          emb_x[x_i], tags_i - tags_i.mean(0), z], axis=1)
    w1 = r_truth.normal(size=(inp.shape[1], 32)) * 2.0 / math.sqrt(inp.shape[1])
    w2 = r_truth.normal(size=(32, 16)) * 1.5 / math.sqrt(32)
    w3 = r_truth.normal(size=16)
    deep = np.tanh(np.tanh(inp @ w1) @ w2) @ w3
    mix = r_truth.dirichlet(np.ones(3))
    comps = {"additive": additive, "factorised": factorised, "deep": deep}
    if spec.scorer == "mixed":
        f = sum(math.sqrt(w) * _standardize(comps[k]) for w, k in zip(mix, comps))
    else:
        f = comps[spec.scorer]
    f = spec.signal_std * _standardize(f)

    # --- drift -------------------------------------------------------------------------------
    sign = 1.0 if r_truth.random() < 0.5 else -1.0
    phase = r_truth.uniform(0, 2 * np.pi)
    drift_req = drift_logit(spec, sign, phase, req_time)

    # --- logging policy: the display order within each request ------------------------------
    r_ord = rs["order"]
    shuffled = r_ord.random(n_req) < spec.explore_share
    noisy = f + r_ord.normal(0.0, spec.sort_noise * spec.signal_std, size=n)
    key = np.where(shuffled[imp_req], r_ord.random(n), -noisy)
    disp = np.lexsort((key, imp_req))
    imp_item, f, z, match = imp_item[disp], f[disp], z[disp], match[disp]
    u_i, c_i, x_i, hour, tags_i = u_i[disp], c_i[disp], x_i[disp], hour[disp], tags_i[disp]
    starts = np.cumsum(sizes) - sizes
    pos = np.arange(n) - starts[imp_req] + 1

    # --- truth: intercept, probabilities, clicks ---------------------------------------------
    offsets = position_offsets(spec, rs["position"])
    logit_wo = f + drift_req[imp_req]
    intercept = _solve_intercept(logit_wo + offsets[pos], spec.ctr)
    rel = logit_wo + intercept
    p_true = _sigmoid(rel + offsets[pos])
    p_ref = _sigmoid(rel)
    click = (rs["clicks"].random(n) < p_true).astype(np.int8)

    # --- observed columns --------------------------------------------------------------------
    r_obs = rs["observations"]
    noise_scale = spec.signal_noise * r_obs.uniform(0.5, 1.5, size=len(signals))
    item_noise = r_obs.normal(size=(len(signals), n_items))
    user_noise = r_obs.normal(size=(len(signals), n_users))
    imp_noise = r_obs.normal(size=(len(signals), n))
    irrelevant_item_level = bool(r_obs.random() < 0.5)
    irr = r_obs.normal(size=n_items)[imp_item] if irrelevant_item_level else r_obs.normal(size=n)
    numeric_cols: list[tuple[np.ndarray, str]] = []
    for k, s in enumerate(signals):
        sd = float(noise_scale[k])
        if s == "item_quality":
            col = z[:, k] + sd * item_noise[k][imp_item]
            what = f"item_quality (item-level) + Normal(0, {sd:.2f}) per item"
        elif s == "user_activity":
            col = z[:, k] + sd * user_noise[k][u_i]
            what = f"user_activity (user-level) + Normal(0, {sd:.2f}) per user"
        elif s == "item_price":
            col = np.round(np.exp(3.0 + 0.5 * (z[:, k] + sd * item_noise[k][imp_item])), 2)
            what = f"exp(3 + 0.5 (item_price + Normal(0, {sd:.2f}) per item)), a price"
        elif s == "match":
            col = z[:, k] + sd * imp_noise[k]
            what = f"match (per impression) + Normal(0, {sd:.2f})"
        else:
            col = hour.astype(np.float64)
            what = "hour of day (exact); the truth uses a daily sine of it"
        numeric_cols.append((col, what))
    numeric_cols.append((irr, "irrelevant: " + ("per-item" if irrelevant_item_level
                                                  else "per-impression") + " Normal(0, 1) noise"))
    num_order = r_obs.permutation(len(numeric_cols))
    item_bid = (math.log(r_obs.uniform(0.2, 5.0)) + 0.3 * r_obs.normal(size=n_cat)[item_cat]
                + 0.4 * r_obs.normal(size=n_items))
    bid = np.exp(item_bid[imp_item] + 0.15 * r_obs.normal(size=n))

    # --- the frame ---------------------------------------------------------------------------
    cols: dict[str, Any] = {
        names["request"]: imp_req.astype(np.int64),
        names["session"]: req_sess[imp_req].astype(np.int64),
        names["user"]: u_i.astype(np.int64),
        names["time"]: (TIME_ORIGIN + req_time[imp_req]).astype(np.int64),
        names["position"]: pos.astype(np.int64),
        names["item"]: imp_item.astype(np.int64),
        names["category"]: c_i.astype(np.int64),
        names["context"]: np.asarray(_CONTEXT_VALUES)[x_i],
    }
    features = {names["category"]: f"item category ({n_cat} values)",
                names["context"]: f"request context ({spec.n_contexts} values)",
                names["user"]: f"user id ({n_users} users)",
                names["item"]: f"item id ({n_items} items, Zipf {spec.item_zipf})"}
    numeric = []
    for rank, k in enumerate(num_order):
        name = names["numeric"].format(rank)
        cols[name] = numeric_cols[k][0].astype(np.float64)
        features[name] = numeric_cols[k][1]
        numeric.append(name)
    for t in range(n_tags):
        name = names["tag"].format(t)
        cols[name] = item_tags[imp_item, t]
        features[name] = f"item tag {t} indicator (multi-hot, rate {item_tags[:, t].mean():.2f})"
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
    cols[TRUTH_COLUMNS["true_p"]] = p_true
    cols[TRUTH_COLUMNS["p_ref"]] = p_ref
    cols[TRUTH_COLUMNS["logit"]] = rel
    frame = pl.DataFrame(cols)

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
    params = {"intercept": float(intercept), "signals": signals, "drift_sign": sign,
              "drift_phase": float(phase)}
    return World(frame=frame, spec=spec, columns=columns, extra=extra, offsets=offsets,
                 features=features, params=params)
