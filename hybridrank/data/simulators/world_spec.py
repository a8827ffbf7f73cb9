"""The spec of a click-log "world": every structural choice, drawn from a seed.

:func:`draw_world` turns a seed into a :class:`WorldSpec` (column names, feature kinds, click
rate, list lengths, position curve, logging policy, drift over time, the structure of the true
scorer and, in the ``longtail`` family, an ad log's long tails), drawn from
``np.random.default_rng(seed)``; any field can be pinned with a keyword.
:func:`hybridrank.data.simulators.world.simulate_world` turns the spec into the log.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "WorldSpec", "draw_world", "NAMING_SCHEMES", "SIZES", "TRUTH_COLUMNS", "TIME_ORIGIN",
    "POSITION_CURVES", "SCORERS", "DRIFTS", "LOGGING", "SIGNALS", "FAMILIES", "LONGTAIL_LATE_SHARE",
    "TAIL_DEFAULTS", "CONTEXT_VALUES", "NEW_ITEM_POOL", "NEW_ITEM_START",
]

#: Target impression counts per ``size`` (drawn log-uniformly in the range).
SIZES = {"tiny": (5_000, 15_000), "small": (40_000, 120_000)}

#: Names of the truth columns (the same in every world): the click probability at the logged slot,
#: at the reference slot 1, and the relevance logit at slot 1.
TRUTH_COLUMNS = {"true_p": "true_p", "p_ref": "true_p_ref", "logit": "true_logit"}

#: Column names per naming scheme. ``tag``, ``numeric`` and ``side`` are patterns numbered from 0.
NAMING_SCHEMES: dict[str, dict[str, str]] = {
    "web": dict(request="request_id", session="session_id", user="user_id", time="ts",
                position="position", item="item_id", label="click", bid="bid",
                category="item_category", context="device", tag="tag_{}", numeric="f{}", side="emb_{}",
                explore="is_explore", propensity="propensity"),
    "letor": dict(request="qid", session="sid", user="uid", time="timestamp", position="rank",
                  item="doc_id", label="clicked", bid="cpc", category="topic", context="vertical",
                  tag="kw_{}", numeric="feat_{}", side="lsi_{}", explore="randomized", propensity="pscore"),
    "ads": dict(request="impression_group", session="visit_id", user="visitor",
                time="event_time", position="slot", item="ad_id", label="is_click", bid="max_cpc",
                category="ad_format", context="platform", tag="interest_{}", numeric="x{}", side="ad_emb_{}",
                explore="uniform_bucket", propensity="logging_prob"),
    "shop": dict(request="page_view", session="session_key", user="customer", time="epoch_s",
                 position="rank_pos", item="sku", label="clk", bid="bid_amount",
                 category="brand_tier", context="channel", tag="attr_{}", numeric="num_{}", side="vec_{}",
                 explore="shuffled", propensity="p_logged"),
}

POSITION_CURVES = ("log", "power", "exponential", "cascade", "none")
SCORERS = ("additive", "factorised", "deep", "mixed")
DRIFTS = ("none", "linear", "weekly")
LOGGING = ("random", "sorted")
#: The latent numeric signals a world may use (each observed through one noisy numeric column).
SIGNALS = ("item_quality", "user_activity", "hour_cycle", "item_price", "match")
CONTEXT_VALUES = ("web", "ios", "android", "tablet", "tv", "app")
_EXPLORE_SHARES = (0.0, 0.01, 0.05, 0.10, 0.20)
_EXPLORE_P = (0.3, 0.15, 0.25, 0.2, 0.1)
#: Times are int epoch seconds from here on (2023-11-15 00:00 UTC): ``time - TIME_ORIGIN`` is the
#: time within the world's period of ``days``.
TIME_ORIGIN = 1_700_006_400
NEW_ITEM_POOL = 0.2          # share of the catalogue held back as "new items" (new_item_share > 0)
NEW_ITEM_START = 0.7         # new items appear in requests after this fraction of the period

#: World families :func:`draw_world` draws from: ``base`` (the structural choices above) and
#: ``longtail`` (the base draws plus an ad log's long tails: heavy-tailed user activity, users
#: unseen before the test period, dense item side features, user x item latent interactions).
FAMILIES = ("base", "longtail")
#: The late period of a ``longtail`` world: the share of sessions that conf/data/clicklog.yaml's
#: time split makes the test split (its ``test: 0.2``).
LONGTAIL_LATE_SHARE = 0.2
#: The spec fields of the long tails and their values in a ``base`` world (which leave the world
#: as the base family has always drawn it).
TAIL_DEFAULTS: dict[str, Any] = {"user_zipf": 0.0, "late_share": 0.0, "new_user_share": 0.0,
                                 "n_side": 0, "side_corr": 0.0, "interaction_share": 0.0,
                                 "missing_share": 0.0}


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
    Long tails (drawn by the ``longtail`` family; the defaults leave a world as ``base`` draws it)
        family: the family the spec was drawn from (:data:`FAMILIES`).
        user_zipf: 0 (``1 + Poisson(sessions_per_user - 1)`` sessions per user), or the exponent
            of a heavy-tailed activity law: user ``u`` runs ``1 + Poisson((sessions_per_user - 1)
            w_u / mean(w))`` sessions, ``w_u = rank_u ** -user_zipf`` over a random ranking of
            the users (0.8..1.2: most users have a session or two, the top 1 % hold a large share
            of the impressions; the family also draws short lists, 1..2 requests per session and
            1.5..3 sessions per user, so users are many).
        late_share: 0, or the share of sessions in the late period, the sessions that start
            latest (0.2, :data:`LONGTAIL_LATE_SHARE`: the test split of conf/data/clicklog.yaml).
            Every user with a session outside it has one before it (``params["late_start"]`` is
            when it starts).
        new_user_share: the share of the late period's sessions (so, in expectation, of its
            impressions) run by users seen nowhere before it: ids never seen in training when the
            late period is the test split (0..0.5; the lightest users are the new ones). Needs
            ``late_share > 0``.
        n_side: dense item side features, like an ad embedding (4..12): side feature ``k`` of an
            item is ``side_corr * z_k + sqrt(1 - side_corr^2) * e_k``, ``z_k`` a standardised
            random projection of the item's latent vector, ``e_k`` Normal(0, 1) noise per item.
        side_corr: the correlation of each side feature with its latent projection (0.3..0.9).
        interaction_share: the share of ``f``'s variance from the user x item latent dot product:
            ``f = sqrt(1 - s) f_scorer + sqrt(s) user_vec . item_vec``, both standardised
            (0.3..0.7).
        missing_share: the share of items whose value of an item-level numeric feature (the
            ``item_quality`` and ``item_price`` observations, the side features) is missing, per
            item and column, like hotels without reviews: missing not at random, item ``i``'s
            chance ``sigmoid(a - item_quality_i)`` with ``a`` set so the items' mean is the share
            (weak items miss more). Written as nulls; no family draws it (pin it: 0..0.9).
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
    family: str = "base"
    user_zipf: float = 0.0
    late_share: float = 0.0
    new_user_share: float = 0.0
    n_side: int = 0
    side_corr: float = 0.0
    interaction_share: float = 0.0
    missing_share: float = 0.0

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
        need(1 <= self.n_contexts <= len(CONTEXT_VALUES), f"n_contexts must be 1..{len(CONTEXT_VALUES)}")
        need(1 <= self.n_signals <= len(SIGNALS), f"n_signals must be 1..{len(SIGNALS)}")
        need(1 <= self.min_len <= self.max_len, f"need 1 <= min_len <= max_len, got "
             f"{self.min_len}, {self.max_len}")
        n_old = self.n_items - (round(NEW_ITEM_POOL * self.n_items) if self.new_item_share > 0 else 0)
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
        need(self.family in FAMILIES, f"family must be one of {FAMILIES}, got {self.family!r}")
        need(self.user_zipf >= 0.0, "user_zipf must be >= 0")
        need(0.0 <= self.late_share < 1.0, "late_share must be in [0, 1)")
        need(0.0 <= self.new_user_share < 1.0, "new_user_share must be in [0, 1)")
        need(self.new_user_share == 0.0 or self.late_share > 0.0,
             "new_user_share > 0 needs late_share > 0 (new users appear in the late period)")
        need(self.n_side >= 0, "n_side must be >= 0")
        need(0.0 <= self.side_corr <= 1.0, "side_corr must be in [0, 1]")
        need(0.0 <= self.interaction_share <= 1.0, "interaction_share must be in [0, 1]")
        need(0.0 <= self.missing_share <= 0.9, "missing_share must be in [0, 0.9]")

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
        family = "" if self.family == "base" else f", {self.family}"
        return (f"world {self.seed} [{self.size}, {self.naming}{family}]: ~{self.n_impressions:,} imps, "
                f"CTR {self.ctr:.2%}, lists {self.min_len}-{self.max_len}{singles}, "
                f"curve {curve}, logging {log}, scorer {self.scorer} (std {self.signal_std:.2f}), "
                f"drift {drift}, {self.n_items:,} items (zipf {self.item_zipf:.2f})" + self._tails())

    def _tails(self) -> str:
        """The long tails for :meth:`describe` ("" when none is set)."""
        parts = []
        if self.user_zipf:
            parts.append(f"users zipf {self.user_zipf:.2f}")
        if self.late_share:
            parts.append(f"{self.new_user_share:.0%} of the last {self.late_share:.0%} of sessions "
                         "by new users")
        if self.n_side:
            parts.append(f"{self.n_side} side features (corr {self.side_corr:.2f})")
        if self.interaction_share:
            parts.append(f"user x item {self.interaction_share:.0%}")
        if self.missing_share:
            parts.append(f"{self.missing_share:.0%} of items missing each item-level numeric")
        return "; " + ", ".join(parts) if parts else ""


_FIELDS = tuple(f.name for f in dataclasses.fields(WorldSpec))
#: the fields :func:`draw_world` takes as keywords (not ``seed``, ``size``, ``family``)
_PINNABLE = tuple(f for f in _FIELDS if f not in ("seed", "size", "family"))
#: ``default_rng([seed, _FAMILY_STREAM + family index])`` draws a family's own fields (far from
#: the simulation's stream numbers ``[seed, 0..]``)
_FAMILY_STREAM = 1_000


def _loguniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _mean_length(min_len: int, max_len: int, one_item_share: float) -> float:
    """Expected request length under :func:`_draw_lengths`."""
    k = np.arange(min_len, max_len + 1, dtype=np.float64)
    w = np.log(k + 1) - np.log(k)
    return one_item_share + (1.0 - one_item_share) * float((k * w).sum() / w.sum())


def draw_world(seed: int, *, size: str = "small", family: str = "base", **overrides: Any) -> WorldSpec:
    """Draw a world's spec from ``np.random.default_rng(seed)``; keywords pin any field.

    The ``longtail`` family draws every base field first, as ``base`` does, then its own fields
    from a second generator (:func:`_draw_longtail`), so a long-tail world shares its seed's
    naming, catalogue, click rate, curve, logging and drift with the base world of that seed
    (its list lengths, sessions and so its number of users are its own).

    Every field is drawn whatever is pinned, so pinning one field leaves the others as the seed
    drew them, except where fields are tied together:

    - ``logging`` and ``explore_share``: ``random`` means ``explore_share=1``; pinning only
      ``explore_share`` picks the logging (1 -> random, < 1 -> sorted); pinning only
      ``logging="sorted"`` keeps the drawn share of a sorted world.
    - ``position_curve="none"`` sets ``position_strength=0``; ``drift="none"`` sets
      ``drift_amplitude=0``.
    - ``min_len`` / ``max_len``: pinning one moves the other if they would cross.
    - ``n_users`` follows from ``n_impressions``, the lengths and the session sizes unless pinned.
    - ``new_user_share > 0`` pinned without ``late_share`` sets ``late_share`` to
      :data:`LONGTAIL_LATE_SHARE` where it is 0.

    Args:
        seed: any integer >= 0.
        size: ``"tiny"`` (5k-15k impressions, for tests) or ``"small"`` (40k-120k).
        family: one of :data:`FAMILIES`.
        **overrides: :class:`WorldSpec` fields to pin (``size`` is recorded as ``"custom"`` when
            ``n_impressions`` is pinned).

    Returns:
        The :class:`WorldSpec`.

    >>> draw_world(5, size="tiny", logging="sorted", explore_share=0.05).explore_share
    0.05
    >>> draw_world(5, size="tiny", logging="random").explore_share
    1.0
    >>> draw_world(5, size="tiny", family="longtail").late_share
    0.2
    """
    if size not in SIZES:
        raise ValueError(f"size must be one of {list(SIZES)}, got {size!r}")
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {list(FAMILIES)}, got {family!r}")
    unknown = sorted(set(overrides) - set(_PINNABLE))
    if unknown:
        raise TypeError(f"draw_world: cannot pin {unknown}; fields are {list(_PINNABLE)}")
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
    d["family"] = family
    d.update(TAIL_DEFAULTS)
    if family == "longtail":
        tails = _draw_longtail(seed)
        min_len, max_len = tails.pop("min_len"), tails.pop("max_len")
        d.update(tails)

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
    if float(pin.get("new_user_share", 0.0)) > 0 and "late_share" not in pin and not d["late_share"]:
        d["late_share"] = LONGTAIL_LATE_SHARE
    d["min_len"] = pin.get("min_len", min_len)
    d["max_len"] = pin.get("max_len", max_len)
    d["n_users"] = pin.get("n_users", max(1, round(
        d["n_impressions"] / (_mean_length(int(d["min_len"]), int(d["max_len"]),
                                           float(d["one_item_share"]))
                              * float(d["sessions_per_user"]) * float(d["requests_per_session"])))))
    return WorldSpec(**{k: d[k] for k in _FIELDS})


def _draw_longtail(seed: int) -> dict[str, Any]:
    """The ``longtail`` family's fields, from their own generator (the base draws stay as they are).

    Short lists (2..5 to 10..40 items), 1..2 requests per session and 1.5..3 sessions per user
    on average, so that most users have a handful of impressions and the activity law has a
    tail to spread: users are many, as in an ad log, not a few heavy ones.
    """
    rng = np.random.default_rng([seed, _FAMILY_STREAM + FAMILIES.index("longtail")])
    return {
        "min_len": int(rng.integers(2, 6)),
        "max_len": round(_loguniform(rng, 10, 40)),
        "requests_per_session": round(float(rng.uniform(1.0, 2.0)), 2),
        "sessions_per_user": round(float(rng.uniform(1.5, 3.0)), 2),
        "user_zipf": round(float(rng.uniform(0.8, 1.2)), 3),
        "late_share": LONGTAIL_LATE_SHARE,
        "new_user_share": round(float(rng.uniform(0.0, 0.5)), 3),
        "n_side": int(rng.integers(4, 13)),
        "side_corr": round(float(rng.uniform(0.3, 0.9)), 3),
        "interaction_share": round(float(rng.uniform(0.3, 0.7)), 3),
    }
