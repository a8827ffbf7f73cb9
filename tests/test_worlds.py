"""The world generator: determinism, pinned fields, the truth, logging policies, file output, and
the long-tail family."""

from __future__ import annotations

import json
import math

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridrank.data.readers import ColumnMap, normalize_types
from hybridrank.data.validate import validate_frame
from hybridrank.data.worlds import (
    LONGTAIL_LATE_SHARE,
    NAMING_SCHEMES,
    POSITION_CURVES,
    TAIL_DEFAULTS,
    TIME_ORIGIN,
    TRUTH_COLUMNS,
    World,
    WorldSpec,
    draw_world,
    load_world,
    position_offsets,
    simulate_world,
)


def _world(seed: int, **pin) -> World:
    return simulate_world(draw_world(seed, size="tiny", **pin))


def _spearman_slot_relevance(w: World, min_len: int = 3) -> float:
    """Mean over requests (>= min_len items) of the rank correlation of -slot and relevance."""
    c = w.columns
    df = (w.frame.with_columns(
        (-pl.col(c["position"])).rank().over(c["request"]).alias("a"),
        pl.col(TRUTH_COLUMNS["logit"]).rank().over(c["request"]).alias("b"))
        .group_by(c["request"]).agg(pl.corr("a", "b").alias("rho"), pl.len().alias("n"))
        .filter(pl.col("n") >= min_len))
    return float(df["rho"].mean())


# ----------------------------------------------------------------------------------------------
# spec: determinism and pinned fields
# ----------------------------------------------------------------------------------------------
def test_same_seed_bit_identical_different_seed_different():
    a, b, c = _world(11), _world(11), _world(12)
    assert draw_world(11, size="tiny") == draw_world(11, size="tiny")
    assert a.frame.equals(b.frame) and a.columns == b.columns
    np.testing.assert_array_equal(a.offsets, b.offsets)
    assert not a.frame.equals(c.frame)


def test_spec_is_json_safe_and_rebuilds():
    spec = draw_world(4)
    d = json.loads(json.dumps(spec.to_dict()))
    assert WorldSpec(**d) == spec
    assert "\n" not in spec.describe() and spec.describe().startswith("world 4 [small, ")


@pytest.mark.parametrize("pin", [
    {"logging": "sorted", "explore_share": 0.05},
    {"position_curve": "cascade", "position_strength": 1.5},
    {"scorer": "factorised", "ctr": 0.003, "drift": "weekly", "drift_amplitude": 0.4},
    {"naming": "letor", "min_len": 2, "max_len": 4, "one_item_share": 0.0, "n_items": 1000},
    {"n_impressions": 3000, "n_users": 70, "mark_explore": True, "propensity": False},
])
def test_pinned_fields_are_honoured_and_the_rest_is_the_seeds(pin):
    free = draw_world(9, size="tiny")
    spec = draw_world(9, size="tiny", **pin)
    for k, v in pin.items():
        assert getattr(spec, k) == v, k
    tied = {"logging", "explore_share", "position_strength", "drift_amplitude", "n_users", "size",
            "min_len", "max_len"}
    for k, v in spec.to_dict().items():
        if k not in pin and k not in tied:
            assert v == getattr(free, k), k


def test_tied_fields():
    assert draw_world(1, logging="random").explore_share == 1.0
    assert draw_world(1, explore_share=0.1).logging == "sorted"
    assert draw_world(1, explore_share=1.0).logging == "random"
    assert draw_world(1, position_curve="none").position_strength == 0.0
    assert draw_world(1, drift="none").drift_amplitude == 0.0
    s = draw_world(1, min_len=150)
    assert s.max_len >= 150
    assert draw_world(1, max_len=2).min_len <= 2
    assert draw_world(1, n_impressions=500).size == "custom"
    with pytest.raises(ValueError, match="explore_share"):
        draw_world(1, logging="random", explore_share=0.1)
    with pytest.raises(ValueError, match="position_strength"):
        draw_world(1, position_curve="none", position_strength=1.0)
    with pytest.raises(TypeError, match="cannot pin"):
        draw_world(1, list_len=3)
    with pytest.raises(TypeError, match="integer"):
        draw_world(1, min_len=2.5)
    with pytest.raises(ValueError, match="max_len"):
        draw_world(1, n_items=50, max_len=100)


def test_pinning_the_policy_keeps_the_population_and_slates():
    a, b = _world(5, logging="random"), _world(5, logging="sorted", explore_share=0.0)
    ca = a.columns
    key = [ca["request"], ca["item"], ca["user"], ca["time"]]
    assert a.frame.select(key).sort(key).equals(b.frame.select(key).sort(key))


def test_names_follow_the_scheme_and_vary_over_seeds():
    seen = set()
    for seed in range(12):
        spec = draw_world(seed, size="tiny")
        seen.add(spec.naming)
    assert len(seen) >= 3
    for scheme, names in NAMING_SCHEMES.items():
        w = _world(2, naming=scheme)
        for role in ("request", "session", "user", "time", "position", "item", "label", "bid"):
            assert w.columns[role] == names[role]
            assert names[role] in w.frame.columns


# ----------------------------------------------------------------------------------------------
# the truth
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 3, 7])
def test_probabilities_are_sigmoid_of_logit_plus_offset_exactly(seed):
    w = _world(seed)
    f = w.frame
    rel = f[TRUTH_COLUMNS["logit"]].to_numpy()
    pos = f[w.columns["position"]].to_numpy()
    p, p_ref = f[TRUTH_COLUMNS["true_p"]].to_numpy(), f[TRUTH_COLUMNS["p_ref"]].to_numpy()
    assert ((p > 0) & (p < 1)).all() and ((p_ref > 0) & (p_ref < 1)).all()
    np.testing.assert_array_equal(p, 1.0 / (1.0 + np.exp(-(rel + w.offset(pos)))))
    np.testing.assert_array_equal(p_ref, 1.0 / (1.0 + np.exp(-rel)))
    assert w.offsets[1] == 0.0 and np.isnan(w.offsets[0])
    assert w.offsets.size == w.spec.max_len + 1


@pytest.mark.parametrize("curve", POSITION_CURVES)
def test_position_curves(curve):
    strength = 0.0 if curve == "none" else 1.3
    spec = draw_world(0, position_curve=curve, position_strength=strength, position_jitter=0.0,
                      max_len=200, n_items=2000)
    off = position_offsets(spec)
    assert off[1] == 0.0
    assert off[10] == pytest.approx(-strength, abs=1e-12)
    assert (np.diff(off[1:]) <= 1e-12).all()                           # never rises
    if curve in ("exponential", "cascade"):
        assert off[200] > -10.0                                         # bounded
    if curve == "power":
        log = position_offsets(draw_world(0, position_curve="log", position_strength=1.3,
                                          position_jitter=0.0, max_len=200, n_items=2000))
        assert off[100] < log[100]                                      # steeper than log


@pytest.mark.parametrize("seed,ctr", [(1, None), (2, 0.003), (3, 0.15), (6, None)])
def test_ctr_lands_on_the_target(seed, ctr):
    pin = {} if ctr is None else {"ctr": ctr}
    w = _world(seed, **pin)
    p = w.frame[TRUTH_COLUMNS["true_p"]].to_numpy()
    y = w.frame[w.columns["label"]].to_numpy()
    assert p.mean() == pytest.approx(w.spec.ctr, rel=1e-9)
    assert abs(y.sum() - p.sum()) < 4.5 * math.sqrt((p * (1 - p)).sum())


def test_clicks_per_slot_match_the_truth_on_a_random_order_world():
    w = simulate_world(draw_world(21, size="tiny", logging="random", n_impressions=40_000,
                                  ctr=0.08, min_len=2, max_len=30, position_curve="log",
                                  position_strength=1.5, position_jitter=0.0))
    c = w.columns
    per = (w.frame.group_by(c["position"])
           .agg(pl.col(c["label"]).sum().alias("y"), pl.col("true_p").sum().alias("p"),
                (pl.col("true_p") * (1 - pl.col("true_p"))).sum().alias("v"),
                pl.col("true_logit").mean().alias("rel"), pl.len().alias("n"))
           .filter(pl.col("n") >= 200).sort(c["position"]))
    assert per.height >= 15
    z = ((per["y"] - per["p"]) / per["v"].sqrt()).to_numpy()
    assert np.abs(z).max() < 4.0 and (z ** 2).mean() < 2.0
    # the slot does not depend on relevance: the mean relevance logit is flat over slots ...
    rel = per["rel"].to_numpy()
    assert np.ptp(rel) < 0.25
    # ... so the click rate falls with the offsets: slot 1 vs 10 by about the curve
    ctr = (per["y"] / per["n"]).to_numpy()
    assert ctr[0] > 2.0 * ctr[9]


def test_random_order_is_independent_of_relevance_sorted_is_not():
    rnd = _spearman_slot_relevance(_world(8, logging="random", n_impressions=15_000))
    srt = _spearman_slot_relevance(_world(8, logging="sorted", explore_share=0.0, sort_noise=0.5,
                                          n_impressions=15_000))
    assert abs(rnd) < 0.05
    assert srt > 0.5


def test_explore_column_marks_exactly_the_shuffled_requests():
    w = _world(13, logging="sorted", explore_share=0.2, sort_noise=0.0, mark_explore=True,
               propensity=True, one_item_share=0.0, min_len=6, n_impressions=15_000)
    c, ex, pr = w.columns, w.extra["explore"], w.extra["propensity"]
    assert ex == NAMING_SCHEMES[w.spec.naming]["explore"] and ex in w.frame.columns
    per = (w.frame.group_by(c["request"], maintain_order=True)
           .agg(pl.col(ex).first(), pl.col(ex).n_unique().alias("k"),
                (pl.col("true_logit").diff().drop_nulls() < 0).all().alias("sorted"),
                pl.len().alias("n"), pl.col(pr).first().alias("prop"),
                pl.col(pr).null_count().alias("nulls")))
    assert (per["k"] == 1).all()                                # one mark per request
    marked, srt = per[ex].to_numpy() == 1, per["sorted"].to_numpy()
    assert srt[~marked].all()                                   # unmarked: sorted by relevance
    assert srt[marked].mean() < 0.02                            # marked: shuffled (1/720 sorted)
    n = per.height
    assert abs(marked.mean() - 0.2) < 4 * math.sqrt(0.2 * 0.8 / n)
    prop = per["prop"].to_numpy()
    np.testing.assert_allclose(prop[marked], 1.0 / per["n"].to_numpy()[marked])
    assert (per["nulls"].to_numpy()[~marked] == per["n"].to_numpy()[~marked]).all()
    assert (per["nulls"].to_numpy()[marked] == 0).all()


def test_no_explore_column_without_exploration():
    w = _world(13, logging="sorted", explore_share=0.0, mark_explore=True, propensity=True)
    assert w.extra["explore"] is None and w.extra["propensity"] is None


def test_list_lengths_in_range():
    w = _world(4, min_len=3, max_len=40, one_item_share=0.05, n_impressions=15_000)
    n = w.frame.group_by(w.columns["request"]).len()["len"].to_numpy()
    assert ((n == 1) | ((n >= 3) & (n <= 40))).all()
    assert 0.02 < (n == 1).mean() < 0.09 and n.max() > 30
    n0 = _world(4, min_len=3, max_len=40, one_item_share=0.0).frame.group_by(
        w.columns["request"]).len()["len"].to_numpy()
    assert n0.min() >= 3


def test_linear_drift_is_an_affine_function_of_time():
    base = _world(6, drift="none", position_jitter=0.0)
    lin = _world(6, drift="linear", drift_amplitude=0.5, position_jitter=0.0)
    t = base.frame[base.columns["time"]].to_numpy().astype(np.float64)
    diff = lin.frame["true_logit"].to_numpy() - base.frame["true_logit"].to_numpy()
    slope, icpt = np.polyfit(t, diff, 1)
    assert np.abs(diff - (slope * t + icpt)).max() < 1e-6
    # from -0.5 to +0.5 (or back) over the period: about 1 logit across the observed times
    assert 0.7 < abs(slope) * np.ptp(t) < 1.05


def test_new_items_appear_only_late():
    def fresh_share(share: float) -> float:
        """Share of the late impressions whose item was never shown before the late period."""
        w = _world(3, new_item_share=share, n_impressions=15_000, n_items=1000, item_zipf=0.6)
        c = w.columns
        f = w.frame.with_columns(pl.col(c["time"]).min().over(c["item"]).alias("first_seen"))
        late_start = TIME_ORIGIN + 0.7 * w.spec.days * 86_400
        late = f.filter(pl.col(c["time"]) >= late_start)
        return float((late["first_seen"] >= late_start).mean())

    # a small, flat catalogue: every old item is shown early, so the fresh ones are the new pool
    assert fresh_share(0.0) < 0.03
    assert 0.25 < fresh_share(0.3) < 0.36


# ----------------------------------------------------------------------------------------------
# invariants over many worlds, and the files
# ----------------------------------------------------------------------------------------------
def _check_invariants(w: World) -> None:
    c, f = w.columns, w.frame
    req = f[c["request"]].to_numpy()
    assert (np.diff(req) >= 0).all()                                    # contiguous, in order
    n = np.bincount(req)[np.unique(req)]
    starts = np.r_[0, np.flatnonzero(np.diff(req)) + 1]
    expect = np.arange(f.height) - np.repeat(starts, n) + 1
    np.testing.assert_array_equal(f[c["position"]].to_numpy(), expect)  # positions 1..len
    assert f.select(c["request"], c["item"]).is_duplicated().sum() == 0
    per_req = f.group_by(c["request"]).agg(pl.col(c["time"]).n_unique().alias("t"),
                                           pl.col(c["session"]).n_unique().alias("s"))
    assert (per_req["t"] == 1).all() and (per_req["s"] == 1).all()
    ok = f.select((pl.col(c["time"]).diff().over(c["session"]).fill_null(0) >= 0).all()).item()
    assert ok                                                           # time never goes back
    assert f.select(pl.col(c["numeric"]).is_nan().any()).sum_horizontal().item() == 0
    assert (f[c["bid"]] > 0).all()
    assert set(f[c["label"]].unique().to_list()) <= {0, 1}
    # every column is mapped, and hybridrank's own reader accepts the log as it is
    mapped = set(ColumnMap(**c).source_columns()) | {v for v in w.extra.values() if v}
    assert mapped == set(f.columns)
    cm = ColumnMap(**c)
    validate_frame(normalize_types(f, cm), cm, label_max=1)


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 10**6))
def test_every_world_passes_the_invariants(seed):
    _check_invariants(_world(seed))


def test_write_and_load(tmp_path):
    w = _world(17, logging="sorted", explore_share=0.1, mark_explore=True, propensity=True)
    out = w.write(tmp_path / "w17")
    assert sorted(p.name for p in out.iterdir()) == ["log.parquet", "world.json"]
    meta = json.loads((out / "world.json").read_text())
    assert meta["position_offsets"]["first_slot"] == 1
    assert len(meta["position_offsets"]["values"]) == w.spec.max_len
    assert set(meta["features"]) == set(w.columns["numeric"]) | set(w.columns["categorical"])
    back = load_world(out)
    assert back.frame.equals(w.frame) and back.spec == w.spec and back.columns == w.columns
    assert back.extra == w.extra and back.features == w.features and back.params == w.params
    np.testing.assert_array_equal(back.offsets, w.offsets)
    f = back.frame
    pos = f[back.columns["position"]].to_numpy()
    np.testing.assert_array_equal(f["true_p"].to_numpy(), 1.0 / (1.0 + np.exp(
        -(f["true_logit"].to_numpy() + back.offset(pos)))))
    _check_invariants(back)


# ----------------------------------------------------------------------------------------------
# the long-tail family: heavy-tailed users, users unseen before the test period, side features,
# user x item interactions
# ----------------------------------------------------------------------------------------------
def _longtail(seed: int, **pin) -> World:
    return simulate_world(draw_world(seed, size="tiny", family="longtail", **pin))


def test_longtail_spec_is_the_seeds_base_spec_plus_its_tails():
    base, tail = draw_world(7, size="tiny"), draw_world(7, size="tiny", family="longtail")
    assert tail == draw_world(7, size="tiny", family="longtail")
    assert tail != draw_world(8, size="tiny", family="longtail")
    assert base.family == "base" and tail.family == "longtail"
    assert {k: getattr(base, k) for k in TAIL_DEFAULTS} == TAIL_DEFAULTS   # base worlds: no tails
    redrawn = {"min_len", "max_len", "requests_per_session", "sessions_per_user", "n_users",
               "family", *TAIL_DEFAULTS}
    for k, v in base.to_dict().items():
        if k not in redrawn:
            assert getattr(tail, k) == v, k
    for seed in range(20):
        s = draw_world(seed, family="longtail")
        assert 0.8 <= s.user_zipf <= 1.2 and 0.0 <= s.new_user_share <= 0.5
        assert s.late_share == LONGTAIL_LATE_SHARE and 4 <= s.n_side <= 12
        assert 0.3 <= s.side_corr <= 0.9 and 0.3 <= s.interaction_share <= 0.7
        assert 2 <= s.min_len <= 5 and s.max_len <= 40 and s.requests_per_session <= 2.0
    assert WorldSpec(**json.loads(json.dumps(tail.to_dict()))) == tail
    assert "longtail" in tail.describe() and "users zipf" in tail.describe()


def test_longtail_world_is_deterministic_and_valid():
    a, b = _longtail(3), _longtail(3)
    assert a.frame.equals(b.frame) and a.params == b.params
    assert not a.frame.equals(_longtail(4).frame)
    _check_invariants(a)
    side = [n for n in a.columns["numeric"] if n.startswith(NAMING_SCHEMES[a.spec.naming]["side"][:-2])]
    assert len(side) == a.spec.n_side


@settings(max_examples=5, deadline=None)
@given(st.integers(0, 10**6))
def test_every_longtail_world_passes_the_invariants(seed):
    w = _longtail(seed)
    _check_invariants(w)
    assert w.frame.select(w.columns["user"]).n_unique() == w.spec.n_users


def test_tail_fields_are_checked_and_tied():
    assert draw_world(1, new_user_share=0.3).late_share == LONGTAIL_LATE_SHARE
    with pytest.raises(ValueError, match="family"):
        draw_world(1, family="heavy")
    with pytest.raises(TypeError, match="cannot pin"):
        draw_world(1, family_name="longtail")
    spec = draw_world(1)
    with pytest.raises(ValueError, match="new_user_share > 0 needs late_share"):
        WorldSpec(**{**spec.to_dict(), "new_user_share": 0.2})
    with pytest.raises(ValueError, match="side_corr"):
        WorldSpec(**{**spec.to_dict(), "side_corr": 1.5})


def _per_user(w: World) -> tuple[np.ndarray, np.ndarray]:
    c = w.columns
    per = w.frame.group_by(c["user"]).agg(pl.len().alias("n"), pl.col(c["session"]).n_unique().alias("s"))
    return per["n"].to_numpy(), per["s"].to_numpy()


def test_user_activity_is_heavy_tailed():
    """Most users run one session and have a few impressions; the top 1 % hold a large share.
    The same world with the Poisson law (user_zipf=0) as the reference: no such tail."""
    pin = {"n_impressions": 30_000, "new_user_share": 0.0}
    for seed in (0, 1):
        tail, flat = _longtail(seed, user_zipf=1.0, **pin), _longtail(seed, user_zipf=0.0, **pin)

        def top_share(n: np.ndarray) -> float:
            return float(np.sort(n)[::-1][: max(1, n.size // 100)].sum() / n.sum())

        n, s = _per_user(tail)
        n0, _ = _per_user(flat)
        assert top_share(n) > 0.15 and top_share(n) > 4 * top_share(n0)
        assert (s == 1).mean() > 0.5
        assert np.median(n) < 0.65 * n.mean() and np.median(n0) > 0.8 * n0.mean()
        assert n.size == tail.spec.n_users  # every user runs a session


@pytest.mark.parametrize("seed,share", [(0, 0.0), (1, 0.25), (2, 0.5)])
def test_unseen_users_at_test_match_the_asked_share(seed, share):
    """conf/data/clicklog.yaml's split: the test sessions are the late period; the share of them
    (and, within sampling noise, of their impressions) run by users absent from train and val is
    the asked one. Users absent from train alone are at least as many (validation is drawn at
    random before the test period)."""
    from hybridrank.data.sources import split_frame

    w = _longtail(seed, n_impressions=30_000, new_user_share=share)
    c = w.columns
    train, val, test = split_frame(w.frame, ColumnMap(**c), by="time", val=0.1, test=0.2,
                                   key="session", seed=0, val_by="hash")
    assert test[c["time"]].min() >= w.params["late_start"] > train[c["time"]].max()
    seen = pl.concat([train[c["user"]], val[c["user"]]]).unique().implode()
    per = (test.group_by(c["session"]).agg(pl.col(c["user"]).first(), pl.len().alias("n"))
           .with_columns((~pl.col(c["user"]).is_in(seen)).alias("new")))
    assert per["new"].mean() == pytest.approx(share, abs=0.01)     # by construction, per session
    n, new = per["n"].to_numpy().astype(np.float64), per["new"].to_numpy()
    rows = float((n * new).sum() / n.sum())                          # per impression
    se = math.sqrt(((n * new - rows * n) ** 2).sum()) / n.sum()
    assert abs(rows - share) <= 4 * se + 1e-12
    not_in_train = float((~test[c["user"]].is_in(train[c["user"]].unique().implode())).mean())
    assert not_in_train >= rows
    if share == 0.0:
        assert rows == 0.0


def test_side_features_observe_the_item_latent_vectors():
    from hybridrank.data.worlds import draw_population

    spec = draw_world(5, size="tiny", family="longtail", n_items=4000, side_corr=0.6, n_side=6)
    w, pop = simulate_world(spec), draw_population(spec)
    c, names = w.columns, NAMING_SCHEMES[spec.naming]
    item = w.frame[c["item"]].to_numpy()
    proj = pop.item_vec @ pop.side_proj
    for k in range(spec.n_side):
        col = names["side"].format(k)
        assert col in c["numeric"] and col in w.features
        np.testing.assert_array_equal(w.frame[col].to_numpy(), pop.side[item, k])
        assert np.corrcoef(pop.side[:, k], proj[:, k])[0, 1] == pytest.approx(0.6, abs=0.04)


@pytest.mark.parametrize("share", [0.0, 0.5])
def test_user_item_interaction_takes_its_share_of_the_relevance(share):
    """With an additive scorer (no user x item term of its own) and no drift, the squared
    correlation of the relevance logit with user_vec . item_vec is the asked share."""
    from hybridrank.data.worlds import draw_population

    spec = draw_world(2, size="tiny", family="longtail", n_impressions=20_000, scorer="additive",
                      drift="none", interaction_share=share)
    w, pop = simulate_world(spec), draw_population(spec)
    c = w.columns
    uv = np.einsum("nd,nd->n", pop.user_vec[w.frame[c["user"]].to_numpy()],
                   pop.item_vec[w.frame[c["item"]].to_numpy()])
    r = np.corrcoef(w.frame[TRUTH_COLUMNS["logit"]].to_numpy(), uv)[0, 1]
    assert r ** 2 == pytest.approx(share, abs=0.03)
