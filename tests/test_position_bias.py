"""Position-bias-aware training: the bias tower, the serving score at the reference position, and
the end-to-end check against the simulator's true click probability at position 1."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch
from host_reads import HostReads

from hybridrank.losses import HybridLoss
from hybridrank.models.position import PositionBias
from hybridrank.models.ranker import HybridRanker, serve
from hybridrank.models.scorers import MLPScorer


def test_tower_is_zero_at_the_reference_and_applies_the_tail_rule():
    b = PositionBias(max_position=4, reference_position=2)
    b.offset.copy_(torch.tensor([0.3, 0.0, -0.3, -0.5]))
    got = b(torch.tensor([1, 2, 3, 4, 9])).tolist()
    assert got == pytest.approx([0.3, 0.0, -0.3, -0.5, -0.5])  # tail="share": slot 9 -> slot 4
    assert b.offsets() == pytest.approx([0.3, 0.0, -0.3, -0.5])
    with pytest.raises(ValueError, match="reference_position=5 must lie in"):
        PositionBias(max_position=4, reference_position=5)
    strict = PositionBias(max_position=4, tail="error")
    with pytest.raises(ValueError, match="position 9 is past max_position=4"):
        strict(torch.tensor([1, 9]))
    with pytest.raises(ValueError, match="1-based; got 0"):
        b(torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="tail must be one of"):
        PositionBias(tail="clamp")


def _slot_mle(r, slot, y, n_slots, ref=0, iters=50):
    """Independent reference: per-slot maximum likelihood offset given fixed relevance logits
    (Newton on Σ (y - σ(r + b)) = 0 for each slot), relative to the reference slot."""
    b = np.zeros(n_slots)
    for j in range(n_slots):
        rj, yj = r[slot == j], y[slot == j]
        for _ in range(iters):
            p = 1 / (1 + np.exp(-(rj + b[j])))
            b[j] += (yj - p).sum() / (p * (1 - p)).sum()
    return b - b[ref]


def _synthetic(seed=0, n=200_000, n_slots=6):
    rng = np.random.default_rng(seed)
    r = rng.normal(-3.0, 1.0, n)
    slot = rng.integers(0, n_slots, n)                  # random order: slot independent of r
    true = -0.4 * np.log1p(np.arange(n_slots))          # -0.4 log(position)
    y = (rng.random(n) < 1 / (1 + np.exp(-(r + true[slot])))).astype(np.float64)
    return r, slot, y, true


def _fit(tower, r, slot, y, epochs, batch=20_000):
    for _ in range(epochs):
        for i in range(0, r.size, batch):
            sl = slice(i, i + batch)
            tower.accumulate(torch.from_numpy(slot[sl] + 1), torch.from_numpy(r[sl]),
                             torch.from_numpy(y[sl]), step=i)
        tower.update()


@pytest.mark.slow
def test_exact_update_converges_to_the_per_slot_maximum_likelihood():
    r, slot, y, true = _synthetic()
    tower = PositionBias(max_position=6, n_boot=50, monotone=False, pool=False)
    _fit(tower, r, slot, y, epochs=8)
    mle = _slot_mle(r, slot, y, 6)
    assert np.abs(np.array(tower.offsets()) - mle).max() < 2e-3, (tower.offsets(), mle)
    assert float(tower.last_change) < 1e-3
    # within sampling error of the truth (about 0.03 per slot with ~ 1,400 clicks per slot)
    assert np.abs(np.array(tower.offsets()) - true).max() < 0.1
    rep = tower.report()
    assert rep["updates"] == 8 and rep["estimated"] == [True] * 6
    assert rep["lower"][0] is None and rep["upper"][0] is None  # the reference slot is fixed at 0
    assert sum(rep["impressions"]) == pytest.approx(r.size)
    assert sum(rep["clicks"]) == pytest.approx(y.sum())


@pytest.mark.slow
def test_bootstrap_interval_matches_the_sampling_error():
    """The online Poisson bootstrap's interval has the width of the offsets' standard error:
    compared with the spread of the MLE over independent data sets (a direct simulation)."""
    r, slot, y, _ = _synthetic(seed=1, n=100_000, n_slots=3)
    tower = PositionBias(max_position=3, n_boot=200, monotone=False, pool=False)
    _fit(tower, r, slot, y, epochs=6)
    rep = tower.report()
    width = np.array(rep["upper"][1:]) - np.array(rep["lower"][1:])
    fits = np.array([_slot_mle(*_synthetic(seed=s, n=100_000, n_slots=3)[:3], 3)[1:]
                     for s in range(20, 50)])
    direct = 2 * 1.96 * fits.std(axis=0, ddof=1)
    assert np.all((width > 0.6 * direct) & (width < 1.6 * direct)), (width, direct)
    lo, hi = np.array(rep["lower"][1:]), np.array(rep["upper"][1:])
    off = np.array(rep["logit_offsets"][1:])
    assert np.all((lo < off) & (off < hi))


def test_replicate_sums_equal_a_loop_over_impressions_and_draws_are_poisson_one():
    """The bootstrap's replicate sums against a plain loop (each impression's values times its
    request's weight, added to its slot), and the weights' frequencies against Poisson(1)."""
    from scipy.stats import chisquare, poisson

    from hybridrank.models.position import poisson_one, replicate_sums

    rng = np.random.default_rng(0)
    n, n_req, n_slots, k = 300, 40, 7, 5
    req = torch.from_numpy(np.sort(rng.integers(0, n_req, n)))
    slot = torch.from_numpy(rng.integers(0, n_slots, n))
    vals = torch.from_numpy(rng.random((3, n)))
    counts = poisson_one((n_req, k), torch.Generator().manual_seed(1))
    got = replicate_sums(vals, req * n_slots + slot, counts, n_slots)
    want = np.zeros((3, k, n_slots))
    for i in range(n):
        for b in range(k):
            want[:, b, int(slot[i])] += vals[:, i].numpy() * float(counts[int(req[i]), b])
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)
    draws = poisson_one((400_000,), torch.Generator().manual_seed(2)).numpy()
    assert np.array_equal(draws, np.round(draws)) and draws.min() == 0
    observed = np.bincount(draws.astype(int), minlength=7)[:7].astype(float)
    observed[6] += (draws > 6).sum()
    expected = poisson.pmf(np.arange(7), 1.0) * draws.size
    expected[6] = poisson.sf(5, 1.0) * draws.size
    assert chisquare(observed, expected).pvalue > 1e-3, (observed, expected)


def test_unseen_slots_carry_the_nearest_lower_slot_and_the_tail_is_counted():
    r, slot, y, _ = _synthetic(seed=2, n=50_000, n_slots=3)
    slot = np.where(slot == 2, 3, slot)                 # slot index 2 (position 3) never shown
    pos = slot + 1
    pos[:100] = 9                                       # past max_position=5: shares slot 5
    tower = PositionBias(max_position=5, n_boot=0, monotone=False)
    for _ in range(3):
        tower.accumulate(torch.from_numpy(pos), torch.from_numpy(r), torch.from_numpy(y))
        tower.update()
    rep = tower.report()
    assert rep["estimated"] == [True, True, False, True, True]
    assert rep["logit_offsets"][2] == rep["logit_offsets"][1]
    assert rep["tail_impressions"] == 100
    assert rep["lower"] == [None] * 5  # no bootstrap asked


def test_monotone_offsets_pool_noisy_slots():
    """Few clicks per slot: the free per-slot estimates zig-zag; the monotone ones are the
    information-weighted non-increasing fit of them (pool adjacent violators, checked against
    scipy on the free fixed point) and closer to the truth."""
    from scipy.optimize import isotonic_regression

    r, slot, y, true = _synthetic(seed=5, n=12_000, n_slots=8)
    free = PositionBias(max_position=8, n_boot=0, monotone=False, pool=False)
    mono = PositionBias(max_position=8, n_boot=0, pool=False)
    for t in (free, mono):
        _fit(t, r, slot, y, epochs=10)
    b_free, b_mono = np.array(free.offsets()), np.array(mono.offsets())
    assert np.all(np.diff(b_mono) <= 1e-9) and b_mono[0] == 0.0
    assert np.abs(b_mono - true).mean() < np.abs(b_free - true).mean()
    s = mono.last_sums                                  # clicks, expected clicks, impressions
    info = (s[1] * (s[2] - s[1]) / s[2]).numpy()
    ref = isotonic_regression(b_free, weights=info, increasing=False).x
    assert np.abs((ref - ref[0]) - b_mono).max() < 0.03


def _level(tower, r, slot, y, epochs=10, batch=20_000):
    """Fit like training does (the reference step moves the relevance intercept) and return the
    fitted intercept shift and offsets."""
    shift = 0.0
    for _ in range(epochs):
        for i in range(0, r.size, batch):
            sl = slice(i, i + batch)
            tower.accumulate(torch.from_numpy(slot[sl] + 1), torch.from_numpy(r[sl] + shift),
                             torch.from_numpy(y[sl]), step=i)
        shift += tower.update()[1]
    return shift, np.array(tower.offsets())


def test_pooling_borrows_strength_where_clicks_are_few():
    """Known truth, few clicks per slot (12k impressions over 8 slots, ~5 % CTR): over 12 data
    sets, pooling toward the curve brings the offsets and the slot-1 level (the serving pCTR)
    closer to the truth than per-slot estimates; the relevance logits start 0.3 off, so the level
    is estimated, not given."""
    err_free, err_pool, lvl_free, lvl_pool = [], [], [], []
    for seed in range(12):
        r, slot, y, true = _synthetic(seed=100 + seed, n=12_000, n_slots=8)
        r = r - 0.3
        for pool, errs, lvls in ((False, err_free, lvl_free), (True, err_pool, lvl_pool)):
            shift, off = _level(PositionBias(max_position=8, n_boot=0, pool=pool), r, slot, y)
            errs.append(np.abs(off - true).max())
            lvls.append(abs(shift - 0.3))
    assert np.mean(err_pool) < 0.8 * np.mean(err_free), (np.mean(err_pool), np.mean(err_free))
    assert np.sqrt(np.mean(np.square(lvl_pool))) < np.sqrt(np.mean(np.square(lvl_free))), (
        lvl_pool, lvl_free)


def test_pooling_keeps_what_many_clicks_say_against_the_curve():
    """A step curve (slots 2-3 at -0.2, slots 4-8 at -1.2), not smooth in log(slot), with many
    clicks per slot: the slots' spread around the curve dwarfs their noise, so pooling leaves
    the per-slot estimates nearly where they were."""
    rng = np.random.default_rng(7)
    n, n_slots = 400_000, 8
    r = rng.normal(-2.0, 1.0, n)
    slot = rng.integers(0, n_slots, n)
    true = np.array([0.0, -0.2, -0.2, -1.2, -1.2, -1.2, -1.2, -1.2])
    y = (rng.random(n) < 1 / (1 + np.exp(-(r + true[slot])))).astype(np.float64)
    _, pooled = _level(PositionBias(max_position=8, n_boot=0), r, slot, y, epochs=6, batch=100_000)
    _, free = _level(PositionBias(max_position=8, n_boot=0, pool=False), r, slot, y, epochs=6,
                     batch=100_000)
    assert np.abs(pooled - free).max() < 0.03, (pooled, free)
    assert np.abs(pooled - true).max() < 0.08, (pooled, true)


def test_state_round_trips_through_a_checkpoint_mid_epoch():
    r, slot, y, _ = _synthetic(seed=3, n=30_000, n_slots=4)
    a = PositionBias(max_position=4, n_boot=20)
    _fit(a, r, slot, y, epochs=2)
    a.accumulate(torch.from_numpy(slot[:5000] + 1), torch.from_numpy(r[:5000]),
                 torch.from_numpy(y[:5000]), step=7)           # half an epoch pending
    b = PositionBias(max_position=4, n_boot=20)
    b.load_state_dict(a.state_dict())
    for t in (a, b):
        t.accumulate(torch.from_numpy(slot[5000:] + 1), torch.from_numpy(r[5000:]),
                     torch.from_numpy(y[5000:]), step=8)
        t.update()
    assert a.report() == b.report()


@pytest.mark.parametrize("n_outputs", [1, 2])
def test_serve_adds_the_offset_to_the_click_logit_only(n_outputs):
    torch.manual_seed(0)
    scorer = MLPScorer(3, [4], n_outputs=n_outputs, hidden=(8,))
    terms = {"jrc": {"weight": 0.5}} if n_outputs == 2 else {}
    loss = HybridLoss(0.5, terms=terms)
    tower = PositionBias(max_position=5)
    tower.offset.copy_(torch.tensor([0.0, -0.4, -0.7, -0.9, -1.0]))
    num, cat, pos = torch.randn(6, 3), torch.randint(0, 5, (6, 1)), torch.tensor([1, 2, 3, 4, 5, 7])
    z_serve, out_serve = serve(scorer, loss, num, cat, None, None, tower)
    z_pos, out_pos = serve(scorer, loss, num, cat, None, pos, tower)
    # the serving score is the relevance part: the logit at the reference position
    assert torch.allclose(z_serve, loss.click_logit(scorer(num, cat)))
    assert torch.allclose(z_pos - z_serve, tower(pos))
    if n_outputs == 2:  # the no-click logit z0 is untouched
        assert torch.equal(out_pos[:, 0], out_serve[:, 0])


@pytest.mark.parametrize("n_outputs", [1, 2])
def test_offset_dropout_replaces_a_share_of_offsets_by_the_batch_mean(n_outputs):
    """``drop_offsets``: about ``dropout`` of the rows get the batch's mean offset in place of
    their own, only in the click-logit column; the rest, and every row at dropout 0, unchanged."""
    offsets = torch.tensor([0.0, -0.4, -0.7, -0.9, -1.0])
    pos = torch.randint(1, 6, (20_000,), generator=torch.Generator().manual_seed(1))
    relevance = torch.randn(20_000, n_outputs, generator=torch.Generator().manual_seed(2))
    out = relevance.clone()
    out[:, -1] += offsets[pos - 1]
    off = PositionBias(max_position=5, dropout=0.0, dropout_when="always")
    off.offset.copy_(offsets)
    assert off.drop_offsets(out, pos) is out
    tower = PositionBias(max_position=5, dropout=0.25, dropout_when="always")
    tower.offset.copy_(offsets)
    torch.manual_seed(3)
    dropped = tower.drop_offsets(out, pos)
    seen = dropped[:, -1] - relevance[:, -1]               # the offset each row's loss sees
    own = torch.isclose(seen, offsets[pos - 1], atol=1e-6)
    mean = torch.isclose(seen, offsets[pos - 1].mean().expand_as(seen), atol=1e-6)
    assert bool((own | mean).all())
    assert not bool((own & mean).any())       # no slot's offset is the mean: every row tells
    share = float(mean.float().mean())
    assert abs(share - 0.25) < 0.015, share   # binomial sd 0.003
    if n_outputs == 2:  # the no-click logit is untouched
        assert torch.equal(dropped[:, 0], out[:, 0])
    with pytest.raises(ValueError, match="dropout must lie in"):
        PositionBias(dropout=1.0)
    with pytest.raises(ValueError, match="dropout_when must be one of"):
        PositionBias(dropout=0.5, dropout_when="sometimes")


def test_offset_dropout_acts_only_where_the_effect_is_not_identified():
    """``dropout_when="not_identified"``: inert before the first update, on a random-order log
    and where exploration requests identify the offsets; active on a sorted log without them."""
    out = torch.zeros(4000, 1)
    pos = torch.arange(4000) % 6 + 1

    def changed(tower):
        return bool((tower.drop_offsets(out, pos) != out).any())

    for seed, explore, use_explore, confounded in ((1, 0.0, False, True), (2, 1.0, False, False),
                                                   (3, 0.15, True, False)):
        seen, slot, y, is_x, _ = _sorted_log(seed=seed, explore=explore)
        tower = PositionBias(max_position=6, n_boot=0, dropout=0.5)
        assert not tower.confounded() and not changed(tower)   # nothing measured yet
        _feed(tower, seen, slot, y, is_x, use_explore=use_explore)
        assert tower.confounded() is confounded
        assert (tower.report()["identifiability"]["identified"] is False) is confounded
        assert changed(tower) is confounded
        rep = tower.report()
        assert rep["dropout_active"] is confounded
        restored = PositionBias(max_position=6, n_boot=0, dropout=0.5)
        assert not restored.confounded()                      # read before loading: cached False
        restored.load_state_dict(tower.state_dict())
        assert restored.confounded() is confounded            # the cache does not survive a load
        assert ("replaced by their mean" in rep["identifiability"]["verdict"]) is confounded


@pytest.mark.slow
def test_offset_dropout_trains_end_to_end_and_is_reported(tmp_path, compose_cfg):
    """``position_bias.dropout`` through the command-line config: training runs, the offsets are
    estimated as without it (finite, falling with the slot), and the report says the share."""
    from hybridrank.cli.train import train

    result = train(compose_cfg("config", f"paths.output_dir={tmp_path}", "data.source.n_users=300",
                               "trainer.max_epochs=2", "experiment=position_bias",
                               "model.position_bias.dropout=0.5", "model.position_bias.n_boot=0",
                               "model.position_bias.dropout_when=always"))
    rep = result["position_bias"]
    assert rep["dropout"] == 0.5 and rep["dropout_when"] == "always"
    offsets = np.array(rep["logit_offsets"][:5])
    assert np.isfinite(offsets).all() and offsets[0] == 0.0 and offsets[4] < 0, offsets


def test_model_refuses_position_as_a_feature_or_no_position():
    from hybridrank.data.readers import ColumnMap
    from hybridrank.data.schema import Schema

    frame = pl.DataFrame({"r": [1, 1, 2], "y": [0.0, 1.0, 0.0], "x": [0.1, 0.2, 0.3],
                          "position": [1, 2, 1]})
    tower = {"_target_": "hybridrank.models.position.PositionBias"}
    scorer = {"_target_": "hybridrank.models.scorers.MLPScorer", "_partial_": True}
    loss = {"_target_": "hybridrank.losses.HybridLoss"}
    as_feature = Schema.fit(frame, ColumnMap(request="r", label="y", position="position",
                                             numeric=["x", "position"]), 1)
    with pytest.raises(ValueError, match="also a numeric feature"):
        HybridRanker(scorer, loss, position_bias=tower, data={"schema": as_feature.to_dict()})
    no_position = Schema.fit(frame, ColumnMap(request="r", label="y", numeric=["x"]), 1)
    with pytest.raises(ValueError, match="needs the display position"):
        HybridRanker(scorer, loss, position_bias=tower, data={"schema": no_position.to_dict()})
    ok = Schema.fit(frame, ColumnMap(request="r", label="y", position="position", numeric=["x"]), 1)
    assert HybridRanker(scorer, loss, position_bias=tower, data={"schema": ok.to_dict()}).position_bias


def test_auto_builds_the_tower_only_where_the_position_is_known_and_not_a_feature(tmp_path):
    """``position_bias=auto`` (``when: position_known``): the same three schemas as above give no
    tower, no tower, and a tower, without an error; the hyperparameters (what a checkpoint
    rebuilds from) hold the outcome, not the rule; an unknown ``when`` is an error."""
    from hybridrank.data.readers import ColumnMap
    from hybridrank.data.schema import Schema

    frame = pl.DataFrame({"r": [1, 1, 2], "y": [0.0, 1.0, 0.0], "x": [0.1, 0.2, 0.3],
                          "position": [1, 2, 1]})
    auto = {"_target_": "hybridrank.models.position.PositionBias", "when": "position_known",
            "max_position": 7}
    scorer = {"_target_": "hybridrank.models.scorers.MLPScorer", "_partial_": True}
    loss = {"_target_": "hybridrank.losses.HybridLoss"}
    schemas = {
        "feature": ColumnMap(request="r", label="y", position="position", numeric=["x", "position"]),
        "none": ColumnMap(request="r", label="y", numeric=["x"]),
        "tower": ColumnMap(request="r", label="y", position="position", numeric=["x"]),
    }
    for kind, cm in schemas.items():
        m = HybridRanker(scorer, loss, position_bias=auto, data={"schema": Schema.fit(frame, cm, 1).to_dict()})
        assert (m.position_bias is not None) == (kind == "tower"), kind
        stored = m.hparams["position_bias"]
        if kind == "tower":
            assert "when" not in stored and stored["max_position"] == 7 and m.position_bias.max_position == 7
            assert m.position_bias_note is None
        else:
            assert stored is None and m.position_bias_note
    with pytest.raises(ValueError, match="position_bias.when must be one of"):
        HybridRanker(scorer, loss, position_bias={**auto, "when": "sometimes"},
                     data={"schema": Schema.fit(frame, schemas["tower"], 1).to_dict()})


def _expected_log_loss(q: np.ndarray, p: np.ndarray) -> float:
    """Cross-entropy of predictions q against true probabilities p (the expected log loss)."""
    q = np.clip(q, 1e-7, 1 - 1e-7)
    return float(np.mean(-(p * np.log(q) + (1 - p) * np.log1p(-q))))


@pytest.mark.slow
def test_tower_recovers_ctr_at_position_one_and_ranks_better(tmp_path, compose_cfg):
    """Against the simulator's p_true_ref (the same impression's true CTR at position 1): the
    tower's serving pCTR is calibrated there and ranks better than a position-as-feature model
    scored at the logged positions (what an export of such a model gives an auction)."""
    from hybridrank.cli.export import export
    from hybridrank.cli.train import train
    from hybridrank.data.simulate import simulate_clicklog
    from hybridrank.serving.export import read_scores

    users = 2500  # the default simulated log (~270k impressions)
    common = [f"data.source.n_users={users}", "trainer.max_epochs=3", "loss=bce"]
    runs = {}
    for name, extra in (("feature", []), ("tower", ["experiment=position_bias"])):
        out = tmp_path / name
        result = train(compose_cfg("config", f"paths.output_dir={out}", *common, *extra))
        scores = out / "scores.parquet"
        res = export(compose_cfg("export", f"checkpoint={result['best_checkpoint']}",
                                 f"output={scores}", "calibrator=none"))
        frame, meta = read_scores(scores)
        runs[name] = (frame, meta, res)
    truth = simulate_clicklog(n_users=users, seed=0).select("request_id", "item_id", "p_true_ref")

    def joined(frame):
        j = frame.join(truth, on=["request_id", "item_id"], how="left")
        assert j["p_true_ref"].null_count() == 0
        return j

    tower, feature = joined(runs["tower"][0]), joined(runs["feature"][0])
    p_ref = tower["p_true_ref"].to_numpy()
    bayes = _expected_log_loss(p_ref, p_ref)
    q_tower = tower["pctr"].to_numpy()
    q_feature = feature["pctr"].to_numpy()  # scored at the logged positions
    # calibration at the reference position: the tower within 10 %; the feature model's export
    # (at logged positions, mostly below the top slot) under-predicts the top slot's CTR
    pcoc_tower = q_tower.sum() / p_ref.sum()
    pcoc_feature = q_feature.sum() / p_ref.sum()
    assert 0.9 < pcoc_tower < 1.1, pcoc_tower
    assert pcoc_feature < 0.85, pcoc_feature
    gap_tower = _expected_log_loss(q_tower, p_ref) - bayes
    gap_feature = _expected_log_loss(q_feature, p_ref) - bayes
    # (most of what remains is the relevance model's own error, as at the logged positions)
    assert gap_tower < 0.8 * gap_feature, (gap_tower, gap_feature)
    # ranking candidates by true value at the top slot: NDCG@10 with the true CTR as linear gain
    offsets = np.concatenate([[0], np.cumsum(tower.group_by("request_id", maintain_order=True)
                                             .len()["len"].to_numpy())])
    lengths = torch.from_numpy(np.diff(offsets))
    from hybridrank.lists import gather_lists, pad_index
    index, mask = pad_index(lengths)

    from hybridrank.metrics.request_stats import ranking_stats
    from hybridrank.metrics.uncertainty import paired_bootstrap

    gains = gather_lists(torch.from_numpy(p_ref), index, mask)

    def stats(scores):
        return ranking_stats(gather_lists(torch.from_numpy(scores), index, mask), gains, mask=mask,
                             ks=10, gain="linear")

    diff = paired_bootstrap(stats(q_tower), stats(q_feature), n_boot=500, seed=0)["ndcg@10"]
    assert diff.diff > 0 and diff.p_value < 0.05, str(diff)
    # the export says what pctr is and how to get the expected CTR of another slot
    meta = runs["tower"][1]
    info = meta["position_bias"]
    assert info["reference_position"] == 1 and info["logit_offsets"][0] == 0.0
    # the learned offsets follow the simulator's -0.5 log(position) (positions 2..10; ~200 clicks
    # per position leave a log-odds noise of ~0.1 each)
    learned = np.array(info["logit_offsets"][1:10])
    true = -0.5 * np.log(np.arange(2, 11))
    assert np.mean(np.abs(learned - true)) < 0.2, learned
    assert np.corrcoef(learned, true)[0, 1] > 0.8, learned
    # pctr_at_position is the same model at the logged position: sigma(logit + offset)
    pos = tower["position"].to_numpy().clip(1, info["max_position"])
    off = np.array(info["logit_offsets"])[pos - 1]
    expect = 1 / (1 + np.exp(-(tower["logit"].to_numpy().astype(np.float64) + off)))
    assert np.allclose(tower["pctr_at_position"].to_numpy(), expect, atol=1e-5)
    assert "pctr_at_position" not in runs["feature"][0].columns
    assert pl.Series(q_tower).is_finite().all()


# --- identifiability: sorted logging, exploration traffic, propensities ------------------------
def test_within_request_rank_correlation_matches_scipy():
    from scipy.stats import spearmanr

    from hybridrank.models.position import within_request_rank_correlation

    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 9, size=40)
    L = int(lengths.max())
    pos = np.zeros((40, L), dtype=np.int64)
    rel = np.zeros((40, L))
    mask = np.zeros((40, L), dtype=bool)
    for g, n in enumerate(lengths):
        pos[g, :n] = rng.permutation(n) + 1
        rel[g, :n] = rng.integers(0, 3, size=n)          # ties in the relevance
        mask[g, :n] = True
    rho, valid = within_request_rank_correlation(torch.from_numpy(pos), torch.from_numpy(rel),
                                                 torch.from_numpy(mask))
    for g, n in enumerate(lengths):
        ok = n >= 3 and len(set(rel[g, :n])) > 1
        assert bool(valid[g]) == ok
        if ok:
            assert float(rho[g]) == pytest.approx(spearmanr(-pos[g, :n], rel[g, :n])[0], abs=1e-12)


def _sorted_log(seed=0, n_req=6000, size=6, explore=0.0, noise=0.5):
    """Requests of ``size`` items shown sorted by a noisy true relevance (a share ``explore`` of
    the requests in random order); the model sees only part of the relevance (``seen``). The
    click rate is low (~4 %), where the per-slot offset given ``seen`` equals the one given the
    whole relevance (at high rates, averaging over the hidden part shrinks it a little)."""
    rng = np.random.default_rng(seed)
    seen = rng.normal(-3.5, 1.0, (n_req, size))
    hidden = rng.normal(0.0, 0.8, (n_req, size))          # relevance the features do not explain
    true = seen + hidden
    order = np.argsort(-(true + noise * rng.normal(size=true.shape)), axis=1)
    is_x = rng.random(n_req) < explore
    order[is_x] = np.array([rng.permutation(size) for _ in range(int(is_x.sum()))]).reshape(-1, size)
    slot = np.empty_like(order)
    np.put_along_axis(slot, order, np.arange(size)[None, :].repeat(n_req, 0), axis=1)
    offsets = -0.4 * np.log1p(np.arange(size))
    y = (rng.random(true.shape) < 1 / (1 + np.exp(-(true + offsets[slot])))).astype(np.float64)
    return seen, slot, y, is_x, offsets


def _feed(tower, seen, slot, y, is_x, epochs=6, use_explore=True, propensity=None):
    n_req, size = seen.shape
    index = torch.arange(n_req * size).reshape(n_req, size)
    mask = torch.ones(n_req, size, dtype=torch.bool)
    for _ in range(epochs):
        tower.accumulate(torch.from_numpy(slot.reshape(-1) + 1), torch.from_numpy(seen.reshape(-1)),
                         torch.from_numpy(y.reshape(-1)),
                         request=torch.arange(n_req).repeat_interleave(size),
                         explore=torch.from_numpy(np.repeat(is_x, size)) if use_explore else None,
                         propensity=propensity, lists=(index, mask))
        tower.update()


def test_sorted_logging_without_exploration_is_diagnosed():
    seen, slot, y, is_x, _ = _sorted_log(seed=1)
    tower = PositionBias(max_position=6, n_boot=20)
    _feed(tower, seen, slot, y, is_x, use_explore=False)
    ident = tower.report()["identifiability"]
    assert ident["identified"] is False and "NOT identified" in ident["verdict"]
    assert ident["rank_correlation"] > 0.3
    # the intervals' width is reported; a precision verdict about a confounded curve is not
    assert ident["widest_half_width"] is not None, ident
    assert ident["precise"] is None, ident


def test_random_logging_is_not_flagged():
    seen, slot, y, is_x, offsets = _sorted_log(seed=2, explore=1.0)   # every request shuffled
    tower = PositionBias(max_position=6, n_boot=20)
    _feed(tower, seen, slot, y, is_x, use_explore=False)
    ident = tower.report()["identifiability"]
    assert ident["identified"] is True and abs(ident["rank_correlation"]) < 0.05


def test_a_large_epoch_diagnoses_every_kth_step_after_its_first_update():
    """With more requests per epoch than ``diagnosis_requests``, the next epoch diagnoses the
    batches of every k-th step only (k = requests // cap); the verdict equals the brute-force
    correlation over exactly those batches, and the stride survives a checkpoint."""
    from scipy.stats import spearmanr

    seen, slot, y, is_x, _ = _sorted_log(seed=1, n_req=6000)
    n_batches, per = 12, 500
    tower = PositionBias(max_position=6, n_boot=0, diagnosis_requests=1000)

    def epoch(t, first_step):
        for b in range(n_batches):
            rows = slice(b * per, (b + 1) * per)
            s, r, yy = slot[rows], seen[rows], y[rows]
            index = torch.arange(per * 6).reshape(per, 6)
            t.accumulate(torch.from_numpy(s.reshape(-1) + 1), torch.from_numpy(r.reshape(-1)),
                         torch.from_numpy(yy.reshape(-1)), request=torch.arange(per).repeat_interleave(6),
                         step=first_step + b, lists=(index, torch.ones(per, 6, dtype=torch.bool)))
        t.update()

    epoch(tower, 0)
    assert tower.report()["identifiability"]["requests_measured"] == 6000    # the first epoch: all
    assert int(tower.diagnosis_stride) == 6                                   # 6000 // 1000
    epoch(tower, 12)                                                          # steps 12..23: 12 and 18
    ident = tower.report()["identifiability"]
    assert ident["requests_measured"] == 2 * per
    rows = np.r_[0:per, 6 * per:7 * per]
    rho = [spearmanr(-slot[g], seen[g])[0] for g in rows]
    assert ident["rank_correlation"] == pytest.approx(float(np.mean(rho)), abs=1e-9)
    assert int(tower.diagnosis_stride) == 6                                   # 1000 diagnosed x 6
    again = PositionBias(max_position=6, n_boot=0, diagnosis_requests=1000)
    again.load_state_dict(tower.state_dict())
    assert again._stride == 6
    small = PositionBias(max_position=6, n_boot=0)                            # default cap 50,000
    epoch(small, 0)
    assert int(small.diagnosis_stride) == 1
    with pytest.raises(ValueError, match="diagnosis_requests"):
        PositionBias(diagnosis_requests=-1)
    # the epoch's requests known before the fit: the first epoch is sampled too (steps 0 and 6),
    # with the verdict of exactly those batches; an update or a loaded state is not overridden
    planned = PositionBias(max_position=6, n_boot=0, diagnosis_requests=1000)
    assert planned.plan_diagnosis(6000) == 6 and int(planned.diagnosis_stride) == 6
    epoch(planned, 0)
    ident = planned.report()["identifiability"]
    assert ident["requests_measured"] == 2 * per
    rows = np.r_[0:per, 6 * per:7 * per]
    assert ident["rank_correlation"] == pytest.approx(
        float(np.mean([spearmanr(-slot[g], seen[g])[0] for g in rows])), abs=1e-9)
    assert planned.plan_diagnosis(60_000) == 6                                # updated: kept
    assert PositionBias(max_position=6, diagnosis_requests=0).plan_diagnosis(6000) == 1
    assert PositionBias(max_position=6).plan_diagnosis(6000) == 1            # under the cap


def test_a_fit_plans_the_first_epochs_diagnosis_from_the_training_requests(tmp_path):
    """HybridRanker's setup hands the datamodule's training request count to the tower: the
    first epoch of a log with more requests than ``diagnosis_requests`` is sampled."""
    import pytorch_lightning as pl

    from hybridrank.data.datamodule import ListDataModule
    from hybridrank.data.sources import SimulatedSource

    splits = SimulatedSource(n_users=60, seed=0, split={"by": "time", "val": 0.2, "test": 0.2}).load()
    dm = ListDataModule(splits=splits, budget=256)
    n_train = dm.split_requests["train"]
    assert n_train == splits.train.n_requests
    tower = PositionBias(max_position=10, n_boot=0, diagnosis_requests=n_train // 4)
    model = HybridRanker(MLPScorer(splits.train.num.shape[1], splits.schema.vocab_sizes, hidden=(8,)),
                         loss=HybridLoss(), position_bias=tower)
    seen_strides = []

    class Spy(pl.Callback):
        def on_train_epoch_start(self, trainer, module):
            seen_strides.append(module.position_bias._stride)

    pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, limit_val_batches=0, callbacks=[Spy()],
               default_root_dir=tmp_path).fit(model, datamodule=dm)
    assert seen_strides == [n_train // (n_train // 4)]


@pytest.mark.slow
def test_exploration_traffic_identifies_the_offsets():
    """Sorted logging with 15 % of requests shuffled: offsets from all the traffic absorb the
    hidden relevance (biased); from the exploration requests they are within their intervals."""
    seen, slot, y, is_x, offsets = _sorted_log(seed=3, n_req=40000, explore=0.15)
    confounded = PositionBias(max_position=6, n_boot=50)
    _feed(confounded, seen, slot, y, is_x, use_explore=False)
    explored = PositionBias(max_position=6, n_boot=50)
    _feed(explored, seen, slot, y, is_x, use_explore=True)
    bias_all = np.abs(np.array(confounded.offsets()) - offsets).max()
    rep = explored.report()
    err = np.abs(np.array(rep["logit_offsets"]) - offsets)
    assert bias_all > 0.3, bias_all
    assert err.max() < 0.25, err  # ~ 270 exploration clicks per slot: standard error ~ 0.09
    assert rep["identifiability"]["estimated_from"] == "exploration"
    assert rep["identifiability"]["identified"] is True
    assert 0.1 < rep["identifiability"]["exploration_share"] < 0.2
    assert rep["identifiability"]["precise"] is True, rep["identifiability"]
    covered = [lo <= t <= hi for lo, hi, t in zip(rep["lower"][1:], rep["upper"][1:], offsets[1:])]
    assert sum(covered) >= 4, (rep["lower"], rep["upper"], offsets)


def test_little_exploration_is_reported_as_imprecise():
    """The same policy with 3/20 of the requests (~40 exploration clicks per slot): the offsets
    stay identified, their intervals widen as the exploration clicks shrink, and the verdict says
    IMPRECISE with the widest half-width, which must match the reported intervals."""
    seen, slot, y, is_x, offsets = _sorted_log(seed=3, n_req=6000, explore=0.15)
    tower = PositionBias(max_position=6, n_boot=50)
    _feed(tower, seen, slot, y, is_x, use_explore=True)
    rep = tower.report()
    ident = rep["identifiability"]
    assert ident["identified"] is True and ident["precise"] is False, ident
    assert "IMPRECISE" in ident["verdict"]
    widest = max((hi - lo) / 2 for lo, hi in zip(rep["lower"][1:], rep["upper"][1:]) if lo is not None)
    assert ident["widest_half_width"] == pytest.approx(widest)
    assert widest > 0.25


def test_too_few_exploration_clicks_are_reported_as_unreliable():
    """1 % exploration of a short log: a handful of clicks in the reference slot. The verdict must
    not call the offsets reliable (they are noise; projected on monotone sequences their bootstrap
    intervals can look narrow): identified by the exploration requests, but UNRELIABLE and not
    precise, with how many clicks there were."""
    seen, slot, y, is_x, offsets = _sorted_log(seed=5, n_req=3000, explore=0.01)
    tower = PositionBias(max_position=6, n_boot=50)
    _feed(tower, seen, slot, y, is_x, use_explore=True)
    rep = tower.report()
    ident = rep["identifiability"]
    ref_clicks = rep["fit_clicks"][0]
    assert ident["estimated_from"] == "exploration"
    assert ref_clicks < 20 and ident["identifying_clicks_reference"] == ref_clicks
    assert ident["identified"] is True and ident["too_few_clicks"] is True
    assert ident["precise"] is False and "UNRELIABLE" in ident["verdict"], ident
    assert "intervals reflect" not in ident["verdict"]
    assert f"hold {ref_clicks:.0f} click(s) in the reference slot" in ident["verdict"]
    # the exploration requests are what was fitted: fewer clicks than the whole log
    assert sum(rep["fit_clicks"]) < 0.05 * sum(rep["clicks"])


@pytest.mark.slow
def test_a_random_order_log_reads_the_same_marked_as_exploration_or_not():
    """Every request of a random-order log marked as exploration is the same data as the log
    unmarked: the same offsets and the same verdict (identified; unreliable where the reference
    slot has few clicks, reliable where it has many). World 1002 of the generalization bench was
    flagged NOT identified only because its requests were marked."""
    for n_req, few in ((300, True), (20_000, False)):
        seen, slot, y, is_x, offsets = _sorted_log(seed=7, n_req=n_req, explore=1.0)
        assert is_x.all()
        verdicts = []
        for marked in (True, False):
            tower = PositionBias(max_position=6, n_boot=50)
            _feed(tower, seen, slot, y, is_x, use_explore=marked)
            ident = tower.report()["identifiability"]
            assert ident["estimated_from"] == ("exploration" if marked else "all")
            verdicts.append((ident["identified"], ident["too_few_clicks"], tower.offsets()))
        assert verdicts[0][:2] == verdicts[1][:2] == (True, few), (n_req, verdicts)
        np.testing.assert_allclose(verdicts[0][2], verdicts[1][2], atol=1e-9)


def test_propensities_reweight_toward_a_random_placement():
    """A logging policy that places items by a known probability that depends on relevance the
    model does not see: the naive update absorbs it; the inverse-propensity weighted one (which
    re-weights the log toward a placement independent of relevance) recovers the offsets."""
    rng = np.random.default_rng(4)
    n = 120_000
    seen = rng.normal(-3.0, 0.7, n)
    true = seen + rng.normal(0, 0.8, n)               # part of the relevance is hidden
    c = true - true.mean()
    logits = np.stack([1.2 * c, np.zeros(n), -1.2 * c], axis=1)
    prob = np.exp(logits - logits.max(1, keepdims=True))
    prob /= prob.sum(1, keepdims=True)                # the policy: relevant items go up
    slot = (rng.random(n)[:, None] > np.cumsum(prob, 1)).sum(1)
    offsets = np.array([0.0, -0.5, -0.9])
    y = (rng.random(n) < 1 / (1 + np.exp(-(true + offsets[slot])))).astype(np.float64)
    naive = PositionBias(max_position=3, n_boot=0)
    weighted = PositionBias(max_position=3, n_boot=0, max_ipw=1000.0)
    prop = torch.from_numpy(prob[np.arange(n), slot])
    for _ in range(8):
        for t, pr in ((naive, None), (weighted, prop)):
            t.accumulate(torch.from_numpy(slot + 1), torch.from_numpy(seen), torch.from_numpy(y),
                         propensity=pr)
            t.update()
    assert weighted.report()["identifiability"]["estimated_from"] == "propensity"
    assert np.abs(np.array(naive.offsets()) - offsets).max() > 0.2
    assert np.abs(np.array(weighted.offsets()) - offsets).max() < 0.12, weighted.offsets()


def test_pooled_intervals_are_the_hull_with_the_per_slot_ones_and_old_checkpoints_load():
    """With pooling the reported interval holds the pooled replicates' percentile interval and is
    at least as wide as a per-slot tower's on the same data (the per-slot interval does not rest
    on the curve); a state dict written before the interval buffer existed still loads."""
    r, slot, y, _ = _synthetic(seed=9, n=12_000, n_slots=8)
    pooled = PositionBias(max_position=8, n_boot=50)
    per_slot = PositionBias(max_position=8, n_boot=50, pool=False)
    _fit(pooled, r, slot, y, epochs=6)
    _fit(per_slot, r, slot, y, epochs=6)
    rep, ref = pooled.report(), per_slot.report()
    q = torch.quantile(pooled.boot_offset, torch.tensor([0.025, 0.975], dtype=torch.float64), dim=0)
    lo, hi = np.array(rep["lower"][1:], dtype=float), np.array(rep["upper"][1:], dtype=float)
    assert np.all(lo <= q[0, 1:].numpy() + 1e-12) and np.all(hi >= q[1, 1:].numpy() - 1e-12)
    width = hi - lo
    width_per_slot = np.array(ref["upper"][1:], dtype=float) - np.array(ref["lower"][1:], dtype=float)
    assert np.all(width >= 0.8 * width_per_slot), (width, width_per_slot)
    assert "hull" in rep["interval"]["method"]

    old = {k: v for k, v in pooled.state_dict().items() if k not in ("offset_lower", "offset_upper")}
    loaded = PositionBias(max_position=8, n_boot=50)
    loaded.load_state_dict(old)
    assert bool(torch.isnan(loaded.offset_lower).all() and torch.isnan(loaded.offset_upper).all())
    got = loaded.report()
    assert np.allclose(np.array(got["lower"][1:], dtype=float), q[0, 1:].numpy())


def _level_marked(tower, r, slot, y, epochs=10, marked=False):
    """:func:`_level` in one batch per epoch, every impression marked as exploration or none."""
    shift = 0.0
    x = torch.ones(r.size, dtype=torch.bool) if marked else None
    for _ in range(epochs):
        tower.accumulate(torch.from_numpy(slot + 1), torch.from_numpy(r + shift), torch.from_numpy(y),
                         request=torch.arange(r.size), explore=x)
        shift += tower.update()[1]
    return shift


@pytest.mark.slow
def test_serving_level_interval_has_the_width_of_the_level_sampling_error():
    """Per-slot tower: the serving level is the reference slot's own click logit. Its bootstrap
    interval against the spread of the fitted level over independent data sets (a direct
    simulation); the relevance is the truth, so the fitted shift is the level's error."""
    def tower(n_boot):
        return PositionBias(max_position=4, n_boot=n_boot, monotone=False, pool=False)

    r, slot, y, _ = _synthetic(seed=3, n=40_000, n_slots=4)
    t = tower(200)
    _level_marked(t, r, slot, y)
    level = t.report()["serving_level"]
    lo, hi = level["interval_logit"]
    assert lo < 0 < hi and level["ctr_factor"] == pytest.approx([np.exp(lo), np.exp(hi)])
    shifts = np.array([_level_marked(tower(0), *_synthetic(seed=s, n=40_000, n_slots=4)[:3])
                       for s in range(100, 130)])
    direct = 2 * 1.96 * shifts.std(ddof=1)
    assert 0.6 * direct < hi - lo < 1.6 * direct, (hi - lo, direct)
    assert tower(0).report()["serving_level"] is None  # no bootstrap, no interval


@pytest.mark.slow
@pytest.mark.parametrize("marked", [False, True])
def test_serving_level_interval_covers_the_true_level(marked):
    """The shipped tower (pooled, monotone) on 20 independent random-order logs with the true
    relevance: the level's 95 % interval holds the true level (fitted shift 0) in most of them
    (marked: the level from every click given the exploration offsets). An interval of half the
    width would hold it about 60 % of the time."""
    covered = 0
    for s in range(200, 220):
        r, slot, y, _ = _synthetic(seed=s, n=20_000, n_slots=8)
        t = PositionBias(max_position=8, n_boot=50)
        shift = _level_marked(t, r, slot, y, epochs=5, marked=marked)
        lo, hi = t.report()["serving_level"]["interval_logit"]
        covered += -hi <= shift <= -lo
    assert covered >= 16, covered


def test_old_checkpoints_without_the_level_interval_load():
    r, slot, y, _ = _synthetic(seed=4, n=5_000, n_slots=3)
    t = PositionBias(max_position=3, n_boot=20)
    _level_marked(t, r, slot, y, epochs=2)
    assert t.report()["serving_level"] is not None
    old = {k: v for k, v in t.state_dict().items() if k not in ("level_lower", "level_upper")}
    loaded = PositionBias(max_position=3, n_boot=20)
    loaded.load_state_dict(old)
    assert loaded.report()["serving_level"] is None
    assert loaded.report()["logit_offsets"] == t.report()["logit_offsets"]


@pytest.mark.slow
def test_refit_on_the_kept_checkpoint_is_one_exact_step_from_its_own_logits(tmp_path, compose_cfg):
    """After fitting, the best checkpoint's offsets are one per-slot step logit(Y/N) - logit(P/N)
    from the kept model's own position-free logits over the whole training split (recomputed
    here with plain tensors from the checkpoint before the refit: one epoch, so last.ckpt holds
    the same weights); the reference slot's step went to the click head's bias; nothing else
    moved. With refit: false the best checkpoint is the epoch's own."""
    from hybridrank.cli.train import build_datamodule, train
    from hybridrank.models.scorers import _click_head

    common = ["experiment=position_bias", "data.source.n_users=300", "trainer.max_epochs=1",
              "model.position_bias.pool=false", "model.position_bias.monotone=false",
              "model.position_bias.n_boot=0",
              "intervals.n_boot=0", "test_after_fit=false"]
    cfg = compose_cfg("config", f"paths.output_dir={tmp_path / 'on'}", *common)
    result = train(cfg)
    best = HybridRanker.load_from_checkpoint(result["best_checkpoint"], weights_only=False)
    before = HybridRanker.load_from_checkpoint(tmp_path / "on" / "checkpoints" / "last.ckpt",
                                               weights_only=False).eval()
    # the plain reference: sums per slot of clicks, σ(r + old offset) and impressions
    dm = build_datamodule(cfg, None)
    S = before.position_bias.max_position
    Y, P, N = (torch.zeros(S, dtype=torch.float64) for _ in range(3))
    old = before.position_bias.offset.double()
    with torch.no_grad():
        for batch in dm.eval_dataloader("train"):
            r = before.predict(batch.num, batch.cat, batch.request)[0].double()  # reference slot
            k = batch.position.long().clamp(max=S) - 1
            Y.index_add_(0, k, (batch.label > 0).double())
            P.index_add_(0, k, torch.sigmoid(r + old[k]))
            N.index_add_(0, k, torch.ones_like(r))
    seen = N > 0
    level = old + (torch.log((Y + 0.5) / (N - Y + 0.5)) - torch.log((P + 0.5) / (N - P + 0.5)))
    want = (level - level[0])[seen]
    got = best.position_bias.offset.double()[seen]
    assert torch.allclose(got, want, atol=1e-5), (got, want)
    assert int(best.position_bias.updates) == int(before.position_bias.updates) + 1
    head_before, head_after = _click_head(before.scorer).bias.detach(), _click_head(best.scorer).bias.detach()
    assert float(head_after[-1] - head_before[-1]) == pytest.approx(float(level[0] - old[0]), abs=1e-5)
    sb, sa = before.state_dict(), best.state_dict()
    moved = [k for k in sb if not k.startswith("position_bias.") and not torch.equal(sb[k], sa[k])]
    assert len(moved) == 1 and moved[0].endswith("bias"), moved
    # refit: false keeps the epoch's own offsets
    off = train(compose_cfg("config", f"paths.output_dir={tmp_path / 'off'}", *common,
                            "model.position_bias.refit=false"))
    kept = HybridRanker.load_from_checkpoint(off["best_checkpoint"], weights_only=False)
    assert torch.equal(kept.position_bias.offset, before.position_bias.offset)
    assert off["position_bias"]["refit"] is False and result["position_bias"]["refit"] is True
    # the report's training summary is the fit's, not the refit pass's (its validate restores the
    # callbacks' state from the kept epoch, when the stopping rule had not acted yet)
    stopped = train(compose_cfg("config", f"paths.output_dir={tmp_path / 'stopped'}", *common,
                                "trainer.max_epochs=30", "callbacks.early_stopping.patience=1"))
    assert stopped["training"]["stopped_because"].startswith("early stopping"), stopped["training"]
    assert stopped["training"]["epochs"] > stopped["training"]["best_epoch"]
    assert stopped["position_bias"]["refit"] is True


# --- no host round trip in a training step ------------------------------------------------------
def _as_on_an_accelerator(monkeypatch):
    """The tower as it runs on an accelerator: it reads no tensor for free (not even on the CPU)."""
    import hybridrank._device

    monkeypatch.setattr(hybridrank._device, "free_to_read", lambda t: False)


def _step_batch(seed=0, n_req=400, size=6):
    seen, slot, y, is_x, _ = _sorted_log(seed=seed, n_req=n_req, size=size, explore=0.2)
    index = torch.arange(n_req * size).reshape(n_req, size)
    return dict(position=torch.from_numpy(slot.reshape(-1) + 1), relevance=torch.from_numpy(seen.reshape(-1)),
                label=torch.from_numpy(y.reshape(-1)), weight=torch.full((n_req * size,), 2.0),
                request=torch.arange(n_req).repeat_interleave(size),
                explore=torch.from_numpy(np.repeat(is_x, size)),
                propensity=torch.full((n_req * size,), 0.5),
                lists=(index, torch.ones(n_req, size, dtype=torch.bool)))


def _training_step(tower, b, step):
    """What ``HybridRanker.training_step`` asks of the tower: offsets of the logged positions, the
    batch added to the sums, offset dropout."""
    z = b["relevance"] + tower(b["position"])
    tower.accumulate(b["position"], z - tower(b["position"]), b["label"], b["weight"], b["request"],
                     step, explore=b["explore"], propensity=b["propensity"], lists=b["lists"])
    return tower.drop_offsets(z[:, None], b["position"])


def test_a_training_step_reads_nothing_back_and_sums_what_the_cpu_path_sums(monkeypatch):
    """Run as on an accelerator (every batch with exploration, propensities, weights, lists, the
    bootstrap, offset dropout active), the tower's per-step work reads no tensor value into
    Python; its sums equal those of the CPU path (which reads CPU tensors for free), the rank
    sums up to float rounding, and so do the offsets of the next update."""
    seen, slot, y, is_x, _ = _sorted_log(seed=1, n_req=3000)
    towers = []
    for accelerator in (False, True):
        tower = PositionBias(max_position=6, n_boot=20, dropout=0.5, dropout_when="always")
        _feed(tower, seen, slot, y, is_x, epochs=1, use_explore=False)   # offsets to drop
        with monkeypatch.context() as m:
            if accelerator:
                _as_on_an_accelerator(m)
            with HostReads(where="models/position") as guard:
                for step in range(3):
                    torch.manual_seed(step)
                    _training_step(tower, _step_batch(seed=10 + step), step)
            if accelerator:
                assert guard.reads == [], guard.reads
            else:  # the CPU path reads CPU tensors (free), and the guard sees it
                assert guard.reads
            towers.append(tower)
    cpu, acc = towers
    for name, buf in cpu.named_buffers():
        if name == "epoch_diagnosis":
            assert torch.allclose(buf, acc.get_buffer(name), rtol=1e-12, atol=0), name
        else:
            assert torch.equal(buf, acc.get_buffer(name)), name
    cpu.update(), acc.update()
    assert np.allclose(cpu.offsets(), acc.offsets(), rtol=0, atol=1e-9)


def test_bad_input_of_an_accelerator_training_step_is_raised_by_the_update(monkeypatch):
    """On an accelerator a training step records the checks of its input on the device and the
    epoch's update (or a checkpoint's state_dict before it) raises them, with the same message as
    on the CPU (which raises at once, as does evaluation anywhere)."""
    _as_on_an_accelerator(monkeypatch)
    b = _step_batch()
    cases = [({}, {"position": b["position"].clone().index_fill_(0, torch.tensor([7]), 0)}, "1-based; got 0"),
             ({"tail": "error"}, {"position": b["position"].clone().index_fill_(0, torch.tensor([7]), 9)},
              "position 9 is past max_position=6"),
             ({}, {"propensity": b["propensity"].clone().index_fill_(0, torch.tensor([7]), 0.0)},
              r"propensities must lie in \(0, 1\]")]
    for options, bad, message in cases:
        tower = PositionBias(max_position=6, n_boot=5, **options)
        _training_step(tower, {**b, **bad}, 0)                      # recorded, not raised
        with pytest.raises(ValueError, match=message):
            tower.state_dict()
        _training_step(tower, {**b, **bad}, 1)
        _training_step(tower, b, 2)
        with pytest.raises(ValueError, match=message):
            tower.update()
        tower.update()                                              # raised once, then forgotten
        tower.eval()
        with pytest.raises(ValueError, match=message):             # outside training: at once
            tower.accumulate(**{**b, **bad})
    assert PositionBias(max_position=6, n_boot=5).update() is None   # nothing recorded, nothing fitted


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_training_step_does_not_synchronize():
    """On a GPU the tower's per-step work runs under ``torch.cuda.set_sync_debug_mode("error")``
    (any host-device synchronisation raises), and the update then gives the CPU's offsets."""
    seen, slot, y, is_x, _ = _sorted_log(seed=1, n_req=3000)
    cpu = PositionBias(max_position=6, n_boot=20, dropout=0.5, dropout_when="always")
    _feed(cpu, seen, slot, y, is_x, epochs=1, use_explore=False)
    gpu = PositionBias(max_position=6, n_boot=20, dropout=0.5, dropout_when="always")
    gpu.load_state_dict(cpu.state_dict())
    gpu.cuda()
    batches = [_step_batch(seed=10 + step) for step in range(3)]
    on_gpu = [{k: (tuple(t.cuda() for t in v) if isinstance(v, tuple) else v.cuda()) for k, v in b.items()}
              for b in batches]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step, b in enumerate(on_gpu):
            _training_step(gpu, b, step)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for step, b in enumerate(batches):
        _training_step(cpu, b, step)
    cpu.update(), gpu.update()
    assert np.allclose(cpu.offsets(), gpu.offsets(), rtol=0, atol=1e-5)
    assert cpu.report()["identifiability"]["estimated_from"] == gpu.report()["identifiability"]["estimated_from"]


def test_ddp_leaves_every_rank_its_own_tower_sums(tmp_path):
    """DDP copies rank 0's buffers over every rank's before each forward unless told not to: the
    tower's sums would then hold rank 0's batches (twice, after the all-reduce) instead of every
    rank's. The model hands DDP the tower's buffers to leave alone (checked on a one-process
    gloo group: DDP's own list of buffers to broadcast)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from hybridrank.data.readers import ColumnMap
    from hybridrank.data.schema import Schema

    frame = pl.DataFrame({"r": [1, 1, 2], "y": [0.0, 1.0, 0.0], "x": [0.1, 0.2, 0.3], "position": [1, 2, 1]})
    schema = Schema.fit(frame, ColumnMap(request="r", label="y", position="position", numeric=["x"]), 1)
    model = HybridRanker({"_target_": "hybridrank.models.scorers.MLPScorer", "_partial_": True},
                         {"_target_": "hybridrank.losses.HybridLoss"},
                         position_bias={"_target_": "hybridrank.models.position.PositionBias", "n_boot": 3},
                         data={"schema": schema.to_dict()})
    model.scorer.register_buffer("probe", torch.zeros(1))   # a buffer DDP does broadcast
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'group'}", rank=0, world_size=1)
    try:
        broadcast = {id(b) for b in DistributedDataParallel(model).modules_buffers}
    finally:
        dist.destroy_process_group()
    assert id(model.scorer.probe) in broadcast
    assert not broadcast & {id(b) for b in model.position_bias.buffers()}
