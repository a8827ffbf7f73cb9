"""Auction replay: a brute-force per-request loop reference, GSP invariants, bad input.

The reference below is written from the rules in the module docstring of hybridrank.serving.auction
(eligibility, sort by eCPM with storage-order ties, GSP / first-price prices per click, separable
clicks) as plain Python loops over requests and candidates, sharing no code with the module.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridrank.cli.auction import main
from hybridrank.data.simulate import simulate_clicklog
from hybridrank.serving.auction import auction_stats, position_factors, replay_auctions, replay_frame, run_auction

# --- the reference -----------------------------------------------------------------------------


def ref_auction(lengths, bid, score, truth, k, factors, mechanism, reserve, reserve_ecpm):
    """Per request: list of (row, price per click), clicks, revenue, value, outside-option value."""
    out, start = [], 0
    for n in lengths:
        cands = []
        for i in range(start, start + n):
            e = bid[i] * score[i]
            if bid[i] >= reserve and e >= reserve_ecpm and e > 0:
                cands.append((e, i))
        cands.sort(key=lambda c: (-c[0], c[1]))
        slots, clicks, revenue, value = [], 0.0, 0.0, 0.0
        for j in range(min(k, len(cands))):
            e, i = cands[j]
            if mechanism == "gsp":
                nxt = cands[j + 1][0] if j + 1 < len(cands) else 0.0
                price = max(max(nxt, reserve_ecpm) / score[i], reserve)
            else:
                price = bid[i]
            c = truth[i] * factors[j]
            slots.append((i, price))
            clicks += c
            revenue += price * c
            value += bid[i] * c
        outside = sum(reserve_ecpm * factors[j] for j in range(len(slots), k))
        out.append((slots, clicks, revenue, value, outside))
        start += n
    return out


# --- strategies --------------------------------------------------------------------------------

# subnormal floats are left out: a scale c times a subnormal loses relative precision (not a property of the auction)
_BIDS = st.one_of(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.25]),
                  st.floats(0.0, 5.0, allow_nan=False, allow_subnormal=False))
_PCTR = st.one_of(st.sampled_from([0.0, 0.01, 0.1, 0.2, 0.5, 1.0]),
                  st.floats(0.0, 1.0, allow_nan=False, allow_subnormal=False))


@st.composite
def auctions(draw, *, with_reserve_ecpm: bool = True):
    lengths = draw(st.lists(st.integers(0, 6), min_size=1, max_size=5))
    if sum(lengths) == 0:
        lengths[0] = 1
    n = sum(lengths)
    bid = draw(st.lists(_BIDS, min_size=n, max_size=n))
    score = draw(st.lists(_PCTR, min_size=n, max_size=n))
    truth = draw(st.lists(_PCTR, min_size=n, max_size=n))
    k = draw(st.integers(1, 4))
    f = sorted(draw(st.lists(st.floats(0.0, 1.0, allow_subnormal=False), min_size=k, max_size=k)), reverse=True)
    reserve = draw(st.sampled_from([0.0, 0.5, 1.0]))
    reserve_ecpm = draw(st.sampled_from([0.0, 0.05, 0.2])) if with_reserve_ecpm else 0.0
    return lengths, bid, score, truth, k, f, reserve, reserve_ecpm


def offsets_of(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


# --- against the reference ---------------------------------------------------------------------


@settings(max_examples=30)
@given(auctions(), st.sampled_from(["gsp", "first_price"]))
def test_matches_brute_force(case, mechanism):
    lengths, bid, score, truth, k, f, reserve, reserve_ecpm = case
    o = run_auction(bid, score, offsets=offsets_of(lengths), eval_pctr=truth, slots=k,
                    slot_factors=f, mechanism=mechanism, reserve=reserve, reserve_ecpm=reserve_ecpm)
    ref = ref_auction(lengths, bid, score, truth, k, f, mechanism, reserve, reserve_ecpm)
    for r, (slots, clicks, revenue, value, outside) in enumerate(ref):
        assert o.filled[r] == len(slots)
        assert o.winner[r].tolist() == [i for i, _ in slots] + [-1] * (k - len(slots))
        np.testing.assert_allclose(o.price[r], [p for _, p in slots] + [0.0] * (k - len(slots)),
                                   rtol=1e-12)
        np.testing.assert_allclose([o.clicks[r], o.revenue[r], o.value[r], o.outside[r]],
                                   [clicks, revenue, value, outside], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(o.surplus, o.value - o.revenue)


@settings(max_examples=20)
@given(auctions())
def test_oracle_is_the_reference_run_on_the_truth(case):
    lengths, bid, score, truth, k, f, reserve, reserve_ecpm = case
    r = replay_auctions(bid, score, offsets=offsets_of(lengths), true_pctr=truth, slots=k,
                        slot_factors=f, reserve=reserve, reserve_ecpm=reserve_ecpm)
    ref = ref_auction(lengths, bid, truth, truth, k, f, "gsp", reserve, reserve_ecpm)
    assert r.oracle.winner.tolist() == [[i for i, _ in s] + [-1] * (k - len(s)) for s, *_ in ref]
    np.testing.assert_allclose(r.oracle.revenue, [rev for _, _, rev, _, _ in ref], rtol=1e-12, atol=1e-15)


@settings(max_examples=20)
@given(auctions(), st.sampled_from(["gsp", "first_price"]))
def test_request_ids_group_like_offsets(case, mechanism):
    lengths, bid, score, truth, k, f, reserve, reserve_ecpm = case
    ids = np.repeat([f"req-{9 - i}" for i in range(len(lengths))], lengths)  # not sorted: contiguous
    a = replay_auctions(bid, score, offsets=offsets_of(lengths), true_pctr=truth, slots=k,
                        mechanism=mechanism, reserve=reserve, reserve_ecpm=reserve_ecpm)
    b = replay_auctions(bid, score, request_ids=ids, true_pctr=truth, slots=k, mechanism=mechanism,
                        reserve=reserve, reserve_ecpm=reserve_ecpm)
    nonempty = np.asarray(lengths) > 0  # ids cannot express an empty request
    assert a.model.winner[nonempty].tolist() == b.model.winner.tolist()
    np.testing.assert_array_equal(a.model.revenue[nonempty], b.model.revenue)
    assert b.request_key.tolist() == [f"req-{9 - i}" for i, n in enumerate(lengths) if n]


# --- invariants --------------------------------------------------------------------------------


@settings(max_examples=30)
@given(auctions())
def test_gsp_price_is_individually_rational_and_respects_reserves(case):
    lengths, bid, score, truth, k, f, reserve, reserve_ecpm = case
    o = run_auction(bid, score, offsets=offsets_of(lengths), eval_pctr=truth, slots=k, slot_factors=f,
                    reserve=reserve, reserve_ecpm=reserve_ecpm)
    won = o.winner >= 0
    b, p = np.asarray(bid)[o.winner[won]], np.asarray(score)[o.winner[won]]
    assert (o.price[won] <= b * (1 + 1e-12)).all()  # individual rationality
    assert (o.price[won] >= reserve).all()
    assert (o.price[won] * p >= reserve_ecpm * (1 - 1e-12)).all()
    assert (o.surplus >= -1e-12 * np.maximum(o.value, 1)).all()


@settings(max_examples=30)
@given(auctions(with_reserve_ecpm=False), st.sampled_from(["gsp", "first_price"]))
def test_oracle_welfare_dominates(case, mechanism):
    lengths, bid, score, truth, k, f, reserve, _ = case
    r = replay_auctions(bid, score, offsets=offsets_of(lengths), true_pctr=truth, slots=k,
                        slot_factors=f, mechanism=mechanism, reserve=reserve)
    assert (r.oracle.welfare >= r.model.welfare - 1e-12).all()


@settings(max_examples=30)
@given(auctions())
def test_oracle_total_welfare_dominates_with_an_ecpm_reserve(case):
    lengths, bid, score, truth, k, f, reserve, reserve_ecpm = case
    r = replay_auctions(bid, score, offsets=offsets_of(lengths), true_pctr=truth, slots=k,
                        slot_factors=f, reserve=reserve, reserve_ecpm=reserve_ecpm)
    assert (r.oracle.total_welfare >= r.model.total_welfare - 1e-12).all()


def test_over_prediction_beats_the_oracle_on_ads_only_welfare_under_a_reserve():
    bid, p = [1.0, 1.0], [0.04, 0.01]  # true eCPM 0.04 and 0.01 < reserve 0.02
    r = replay_auctions(bid, np.asarray(p) * 4, offsets=[0, 2], true_pctr=p, slots=2, reserve_ecpm=0.02)
    assert r.oracle.filled[0] == 1 and r.model.filled[0] == 2
    assert r.model.welfare[0] > r.oracle.welfare[0]  # the weak ad adds value...
    assert r.model.total_welfare[0] < r.oracle.total_welfare[0]  # ...worth less than the slot's outside option
    assert r.oracle.outside[0] == pytest.approx(0.02) and r.model.outside[0] == 0


@settings(max_examples=30)
@given(auctions(), st.sampled_from([0.25, 0.5, 2.0, 4.0]))
def test_uniform_scale_cancels_in_gsp_without_ecpm_reserve(case, c):
    lengths, bid, score, truth, k, f, reserve, _ = case
    kw = dict(offsets=offsets_of(lengths), true_pctr=truth, slots=k, slot_factors=f, reserve=reserve)
    a = replay_auctions(bid, score, **kw)
    b = replay_auctions(bid, np.asarray(score) * c, **kw)  # powers of 2: ties and ratios are exact
    assert a.model.winner.tolist() == b.model.winner.tolist()
    np.testing.assert_allclose(b.model.price, a.model.price, rtol=1e-12)
    np.testing.assert_allclose(b.model.revenue, a.model.revenue, rtol=1e-12)


def test_uniform_scale_does_not_cancel_with_ecpm_reserve():
    bid, p = [1.0, 1.0, 1.0], [0.04, 0.02, 0.01]
    kw = dict(offsets=[0, 3], true_pctr=p, slots=2, reserve_ecpm=0.015)
    a = replay_auctions(bid, p, **kw)
    b = replay_auctions(bid, np.asarray(p) * 2, **kw)  # everything looks twice as good
    assert a.model.winner.tolist() == [[0, 1]]
    # the floor no longer binds: the slot-2 winner pays ecpm_3 / p instead of the reserve
    assert b.model.winner.tolist() == [[0, 1]]
    assert a.model.price[0, 1] == pytest.approx(0.015 / 0.02)
    assert b.model.price[0, 1] == pytest.approx(0.02 / 0.04)
    assert b.model.revenue[0] < a.model.revenue[0]
    c = replay_auctions(bid, np.asarray(p) / 2, **kw)  # under-prediction rejects a good candidate
    assert c.model.filled[0] == 1 and c.model.welfare[0] < a.model.welfare[0]


def test_non_uniform_distortion_changes_allocation():
    bid, p = [1.0, 3.0], [0.10, 0.04]  # true eCPM 0.10 vs 0.12: row 1 should win
    q = 1 / (1 + np.exp(-(3 * np.log(np.asarray(p) / (1 - np.asarray(p))) + 1)))
    r = replay_auctions(bid, q, offsets=[0, 2], true_pctr=p, slots=1)
    assert r.oracle.winner.tolist() == [[1]] and r.model.winner.tolist() == [[0]]
    assert r.summary()["welfare_share"] == pytest.approx(0.10 / 0.12)


@settings(max_examples=20)
@given(auctions())
def test_first_price_revenue_is_welfare(case):
    lengths, bid, score, truth, k, f, reserve, reserve_ecpm = case
    r = replay_auctions(bid, score, offsets=offsets_of(lengths), true_pctr=truth, slots=k,
                        slot_factors=f, mechanism="first_price", reserve=reserve, reserve_ecpm=reserve_ecpm)
    np.testing.assert_allclose(r.model.revenue, r.model.welfare, rtol=1e-12)
    np.testing.assert_allclose(r.model.surplus, 0.0, atol=1e-12)


def test_ties_go_to_the_earlier_row():
    o = run_auction([1.0, 2.0, 2.0, 4.0], [0.2, 0.1, 0.1, 0.05], offsets=[0, 4], slots=4)
    assert o.winner.tolist() == [[0, 1, 2, 3]]  # all eCPM 0.2: storage order
    np.testing.assert_allclose(o.price, [[1.0, 2.0, 2.0, 0.0]])  # tie: pay own bid; last: 0


def test_short_requests_fill_what_they_can():
    o = run_auction([1.0, 1.0, 0.0, 1.0], [0.1, 0.2, 0.5, 0.3], offsets=[0, 1, 3, 4], slots=3)
    assert o.filled.tolist() == [1, 1, 1]  # the zero bid is never eligible
    assert o.winner.tolist() == [[0, -1, -1], [1, -1, -1], [3, -1, -1]]
    assert o.price.tolist() == [[0.0, 0.0, 0.0]] * 3  # no competitor, no reserve: GSP price 0


# --- frames, summaries, statistics ------------------------------------------------------------


@pytest.fixture(scope="module")
def sim():
    return simulate_clicklog(n_users=300, seed=3)


def test_replay_frame_on_simulated_log(sim):
    z = np.log(sim["p_true"] / (1 - sim["p_true"])).to_numpy()
    frame = sim.with_columns(pctr=pl.Series(1 / (1 + np.exp(-(3 * z + 1)))))
    opts = dict(slots=3, slot_factors=position_factors(3), reserve_ecpm=0.01)
    r = replay_frame(frame, **opts)
    ref = replay_auctions(frame["bid"], frame["pctr"], request_ids=frame["request_id"],
                          true_pctr=frame["p_true"], **opts)
    np.testing.assert_array_equal(r.model.welfare, ref.model.welfare)
    s = r.summary()
    assert not s["estimated"] and 0 < s["welfare_share"] < 1  # the distortion loses welfare
    calib = replay_frame(sim.with_columns(pctr=pl.col("p_true")), **opts).summary()
    assert calib["welfare_share"] == 1.0 and calib["revenue_share"] == 1.0
    per = r.per_request()
    assert per.height == sim["request_id"].n_unique()
    np.testing.assert_allclose(per["clicks"].sum(), s["clicks"])


def test_auction_stats_match_summary(sim):
    frame = sim.with_columns(pctr=pl.col("p_true") * 0.5)
    r = replay_frame(frame, slots=2, reserve_ecpm=0.02)
    pt, s = auction_stats(r, per=1000).point(), r.summary()
    assert pt["welfare"] == pytest.approx(s["welfare"] / r.n_requests * 1000)
    assert pt["revenue_share"] == pytest.approx(s["revenue_share"])
    o = auction_stats(r, which="oracle").point()
    assert o["welfare_share"] == pytest.approx(1.0)


def test_without_truth_the_numbers_are_flagged_as_estimates():
    with pytest.warns(UserWarning, match="own estimates"):
        r = replay_auctions([1.0, 2.0], [0.1, 0.2], offsets=[0, 2])
    assert r.estimated and r.oracle is None and "welfare_share" not in r.summary()
    with pytest.raises(ValueError, match="no oracle"):
        auction_stats(r, which="oracle")
    frame = pl.DataFrame({"request_id": [1, 1], "bid": [1.0, 2.0], "pctr": [0.1, 0.2]})
    with pytest.warns(UserWarning, match="own estimates"):
        assert replay_frame(frame).estimated


# --- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kw, match", [
    (dict(bid=[1.0, -1.0]), r"bid: 1 value\(s\) negative.*row 1"),
    (dict(bid=[1.0, math.inf]), r"bid: .*infinite"),
    (dict(pctr=[0.1, math.nan]), r"pctr: .*NaN.*row 1"),
    (dict(pctr=[0.1, 0.2, 0.3]), "pctr has 3 rows, expected 2"),
    (dict(pctr=[0.1, 1.5]), "pctr > 1 cannot serve"),
    (dict(eval_pctr=[0.1]), "eval_pctr has 1 rows"),
    (dict(slots=0), "slots must be an int >= 1"),
    (dict(slots=2.0), "slots must be an int >= 1"),
    (dict(slots=2, slot_factors=[1.0]), "one entry per slot"),
    (dict(slots=2, slot_factors=[0.5, 1.0]), "non-increasing"),
    (dict(slot_factors=[math.nan]), "finite"),
    (dict(mechanism="vcg"), "mechanism must be one of"),
    (dict(reserve=-1.0), "reserve must be"),
    (dict(reserve_ecpm=math.nan), "reserve_ecpm must be"),
    (dict(offsets=[0, 3]), "end at 2"),
    (dict(offsets=[0.0, 2.0]), "integer array"),
    (dict(offsets=None), "exactly one of offsets"),
    (dict(request_ids=[1, 1]), "exactly one of offsets"),
])
def test_bad_input(kw, match):
    args = dict(bid=[1.0, 2.0], pctr=[0.1, 0.2], offsets=[0, 2])
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        run_auction(args.pop("bid"), args.pop("pctr"), **args)


def test_bad_input_replay():
    with pytest.raises(ValueError, match="true_pctr|eval_pctr"):
        replay_auctions([1.0], [0.1], offsets=[0, 1], true_pctr=[1.2])
    with pytest.raises(ValueError, match="separate runs"):
        replay_auctions([1.0] * 3, [0.1] * 3, request_ids=[1, 2, 1], true_pctr=[0.1] * 3)
    with pytest.raises(ValueError, match="'bid' not in the frame"):
        replay_frame(pl.DataFrame({"request_id": [1], "pctr": [0.1]}))
    with pytest.raises(ValueError, match="missing value"):
        replay_frame(pl.DataFrame({"request_id": [1, 1], "bid": [1.0, None], "pctr": [0.1, 0.2],
                                   "p_true": [0.1, 0.2]}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # with a truth column there is no warning
        replay_frame(pl.DataFrame({"request_id": [1], "bid": [1.0], "pctr": [0.1], "p_true": [0.1]}))
    with pytest.raises(ValueError, match="slot factor kind"):
        position_factors(3, "exp")


# --- the console command --------------------------------------------------------------------------


def _write_scores(tmp_path, sim):
    z = np.log(sim["p_true"] / (1 - sim["p_true"])).to_numpy()
    base = sim.select("request_id", "bid", "p_true")
    paths = []
    for name, p in (("calib", sim["p_true"].to_numpy()), ("miscaled", 1 / (1 + np.exp(-(3 * z + 1))))):
        path = tmp_path / f"{name}.parquet"
        base.with_columns(pctr=p).write_parquet(path)
        paths.append(str(path))
    return paths


def test_cli_prints_a_table_with_intervals(tmp_path, sim, capsys):
    paths = _write_scores(tmp_path, sim)
    rc = main([*paths, "--slots", "3", "--slot-factors", "log2", "--reserve-ecpm", "0.01", "--n-boot", "200"])
    out = capsys.readouterr().out
    assert rc == 0
    rows = {}
    for line in out.splitlines():  # first table only: the paired table repeats the names
        if line.startswith("| "):
            rows.setdefault(line.split(" | ")[0].strip("| "), line)
    assert {"oracle (true pCTR)", "calib", "miscaled"} <= set(rows)
    r = replay_frame(pl.read_parquet(paths[1]), slots=3, slot_factors=position_factors(3), reserve_ecpm=0.01)
    share = 100 * r.summary()["welfare_share"]
    cells = rows["miscaled"].split(" | ")
    assert cells[4].startswith(f"{share:.2f} [") or cells[4].startswith(f"{share:.1f} [")
    assert "100.0 [100.0, 100.0]" in rows["calib"]  # the truth as the score is the oracle
    assert "Paired with `calib`" in out and "significant at 5 %" in out
    assert "welfare incl. outside % of oracle" in out


def test_cli_errors_and_warning(tmp_path, sim, capsys):
    paths = _write_scores(tmp_path, sim)
    other = sim.select("request_id", "bid").with_columns(pctr=pl.col("bid") * 0 + 0.1, bid=pl.col("bid") * 2)
    other.write_parquet(tmp_path / "other.parquet")
    assert main([paths[0], str(tmp_path / "other.parquet")]) == 2
    assert "bids differ from calib" in capsys.readouterr().err
    sim.select("request_id", "bid").write_parquet(tmp_path / "nopctr.parquet")
    assert main([str(tmp_path / "nopctr.parquet")]) == 2
    assert "missing column(s) ['pctr']" in capsys.readouterr().err
    assert main([paths[0], "--slot-factors", "1,2,0.5"]) == 2
    assert "non-increasing" in capsys.readouterr().err
    sim.select("request_id", "bid").with_columns(pctr=pl.lit(0.05)).write_parquet(tmp_path / "est.parquet")
    assert main([str(tmp_path / "est.parquet"), "--n-boot", "50"]) == 0
    cap = capsys.readouterr()
    assert "WARNING: no true pCTR" in cap.out and "own estimates" in cap.err
    assert main([str(tmp_path / "est.parquet"), "--truth", paths[0], "--n-boot", "50"]) == 0
    assert "oracle (true pCTR)" in capsys.readouterr().out
