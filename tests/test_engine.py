"""The one metric engine: per-request statistics -> points, replicates, tables, ListMetrics, reports.

Every figure a run reports (the train table, ``metrics.json``, the eval report, hybridrank-compare)
is a formula over totals of per-request sums (:mod:`hybridrank.metrics.request_stats`). Checked
here against plain-Python loops over the scores: the point estimates, every bootstrap replicate
(requests resampled, quantile ECE over the full sample's bins), the streaming ``ListMetrics``
(its states are the same sums), and the final figures of ``hybridrank-train`` end to end.
"""

from __future__ import annotations

import bisect
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from metric_reference import ap_ref, auc_ref, gauc_ref, mean_over_lists, rr_ref
from sklearn.metrics import ndcg_score, roc_auc_score
from strategies import padded_lists

from hybridrank import metrics as M
from hybridrank.metrics.list_metrics import ListMetrics
from hybridrank.metrics.report import calibration_summary
from hybridrank.metrics.request_stats import flat_stats, list_stats
from hybridrank.metrics.uncertainty import bootstrap, resample_counts

EPS = 1e-7


# --- plain-Python references over flat requests ---------------------------------------------


def ndcg_tie_ref(scores, labels, k):
    """NDCG@k (exp gain) with tied scores spread over their ranks: each item of a tied block on
    ranks a..b gets the mean discount of those ranks (the expected DCG over tie orders)."""
    gains = [2.0 ** v - 1 for v in labels]
    if not any(g > 0 for g in gains):
        return None
    k = len(scores) if k is None else k

    def disc(rank):
        return 1 / math.log2(rank + 1) if rank <= k else 0.0

    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    dcg, rank = 0.0, 1
    while rank <= len(order):
        block = [i for i in order if scores[i] == scores[order[rank - 1]]]
        mean_disc = sum(disc(r) for r in range(rank, rank + len(block))) / len(block)
        dcg += mean_disc * sum(gains[i] for i in block)
        rank += len(block)
    ideal = sum(g * disc(r) for r, g in enumerate(sorted(gains, reverse=True), start=1))
    return dcg / ideal


def quantile_bins(p, bins):
    """The quantile rule: ``#{p' < p} * bins // n`` (sorted list + bisect)."""
    srt = sorted(p)
    return [bisect.bisect_left(srt, q) * bins // len(p) for q in p]


def gap_ref(p, y, cells):
    """``sum_c |sum p - sum y| / n`` over the cells (calibration bins, field values)."""
    out = {}
    for q, v, c in zip(p, y, cells):
        a, b = out.get(c, (0.0, 0.0))
        out[c] = (a + q, b + (v > 0))
    return sum(abs(a - b) for a, b in out.values()) / len(p)


def brute(requests, *, ks, bins=None, n_positions=0, cells=None):
    """Every metric of a list of requests ``(scores, labels, p, position, code, ece_bin)`` by loops.

    ``ece_bin``: each impression's bin (None: quantile bins of these impressions).
    """
    lists = [(r[0], r[1]) for r in requests]
    flat = [tuple(r[j][i] for j in range(6)) for r in requests for i in range(len(r[0]))]
    s, y, p, pos, code, ebin = (list(c) for c in zip(*flat))
    out = {}
    for k in ks:
        out["ndcg" if k is None else f"ndcg@{k}"] = mean_over_lists(
            lambda a, b, k=k: ndcg_tie_ref(a, b, k), lists)
    out["map"] = mean_over_lists(ap_ref, lists)
    out["mrr"] = mean_over_lists(rr_ref, lists)
    out["auc"] = auc_ref(s, y)
    out["gauc"] = gauc_ref(lists)
    n, clicks = len(p), sum(1.0 for v in y if v > 0)
    ll = sum(-math.log(min(max(q, EPS), 1 - EPS)) if v > 0 else -math.log(1 - min(max(q, EPS), 1 - EPS))
             for q, v in zip(p, y)) / n
    out["logloss"] = ll
    rate = clicks / n
    out["ne"] = ll / -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate)) if 0 < rate < 1 else None
    out["ece"] = gap_ref(p, y, ebin if bins is None else quantile_bins(p, bins))
    out["pcoc"] = sum(p) / clicks if clicks else None
    out["ctr"] = rate
    for j in range(1, n_positions + 1):
        at = [i for i in range(n) if pos[i] == j]
        c = sum(1.0 for i in at if y[i] > 0)
        out[f"pcoc@pos{j}"] = sum(p[i] for i in at) / c if c else None
    keep = [i for i in range(n) if 1 <= pos[i] <= n_positions]
    out["f_ece@position"] = (gap_ref([p[i] for i in keep], [y[i] for i in keep], [pos[i] for i in keep])
                             if keep else None)
    out["f_ece@cat"] = gap_ref(p, y, code)
    out["n_lists"] = float(len(lists))
    out["n_empty"] = float(sum(1 for _, lab in lists if not any(v > 0 for v in lab)))
    out["n_skipped"] = out["n_empty"]
    out["n_impressions"], out["n_positives"] = float(n), clicks
    return out


def _close(got, want, key):
    assert (got is None) == (want is None), (key, got, want)
    if want is not None:
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12), key


def sample(seed, r=30, ties=True):
    """Flat requests of 1..8 impressions: logits (on a coarse grid: ties), graded labels, 1-based
    positions, a 4-valued field."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 9, (r,), generator=g)
    n = int(lengths.sum())
    z = torch.randn(n, generator=g, dtype=torch.float64) * 1.5 - 1.0
    if ties:
        z = (z * 2).round() / 2
    y = (torch.rand(n, generator=g, dtype=torch.float64) < torch.sigmoid(z)).double()
    y = y * torch.randint(1, 3, (n,), generator=g)
    position = torch.cat([torch.arange(1, int(k) + 1) for k in lengths])
    code = torch.randint(0, 4, (n,), generator=g)
    return z, y, lengths, position, code


def requests_of(z, y, p, position, code, ebin, lengths):
    out, a = [], 0
    for k in lengths.tolist():
        sl = slice(a, a + k)
        out.append(tuple(t[sl].tolist() for t in (z, y, p, position, code, ebin)))
        a += k
    return out


# --- point estimates and replicates = loops -------------------------------------------------


def test_points_and_every_replicate_equal_loops_over_the_resampled_requests():
    """Each replicate of every metric is the metric of the resampled requests (quantile ECE: the
    full sample's bins, carried with each impression); all weights 1 give the point exactly."""
    z, y, lengths, position, code = sample(0)
    ks, bins = (1, 3, None), 4
    st_ = flat_stats(z, y, lengths, position=position, fields={"cat": code}, ks=ks, bins=bins,
                     positions=3)
    p = torch.sigmoid(z)
    ebin = M.bin_index(p, bins, "quantile")
    reqs = requests_of(z, y, p, position, code, ebin, lengths)
    names = list(st_.metrics)
    # the point: the metrics of the full sample, full-sample quantile bins recomputed by the loop
    point = st_.point()
    want = brute(reqs, ks=ks, bins=bins, n_positions=3)
    assert set(point) == set(want)
    for key in names:
        _close(point[key], want[key], key)
    # weights all 1: the point, exactly
    ones = st_.values_of(torch.ones(1, st_.n_requests))
    assert {k: float(v[0]) if bool(ok[0]) else None for k, (v, ok) in ones.items()} == point
    many = st_.values_of(torch.ones(4, st_.n_requests))
    for key in names:
        if point[key] is not None:
            assert many[key][0].tolist() == pytest.approx([point[key]] * 4, rel=1e-14, abs=1e-15)
    # replicates: the resampled data sets, rebuilt by hand
    counts = np.concatenate(list(resample_counts(st_.n_requests, 12, seed=3)))
    reps = st_.values_of(torch.from_numpy(counts))
    for i in range(counts.shape[0]):
        drawn = [reqs[j] for j in np.repeat(np.arange(st_.n_requests), counts[i])]
        ref = brute(drawn, ks=ks, n_positions=3)  # ece over the carried full-sample bins
        for key in names:
            v, ok = reps[key][0][i], reps[key][1][i]
            _close(float(v) if bool(ok) else None, ref[key], f"replicate {i}: {key}")


@settings(max_examples=40, deadline=None)
@given(padded_lists(max_lists=5, max_len=7, label_max=2), st.sampled_from(["quantile", "uniform"]),
       st.integers(1, 6), st.sampled_from(["skip", "zero", "one"]))
def test_engine_points_equal_the_pure_functions(lists, binning, bins, empty):
    s, y, m = lists.logits, lists.labels, lists.mask
    if not bool(m.any()):
        return
    codes = (s.abs() * 3).long() % 3
    pos = torch.arange(1, s.shape[1] + 1).expand_as(m)
    pt = list_stats(s, y, mask=m, position=pos, fields={"c": codes}, ks=(1, None), bins=bins,
                    binning=binning, empty=empty, positions=4).point()
    p = torch.sigmoid(s.double())

    def pure(fn, *args, **kw):
        try:
            return float(fn(*args, **kw))
        except ValueError:
            return None

    _close(pt["ndcg@1"], pure(M.ndcg, s, y, mask=m, k=1, empty=empty), "ndcg@1")
    _close(pt["ndcg"], pure(M.ndcg, s, y, mask=m, k=None, empty=empty), "ndcg")
    _close(pt["map"], pure(M.mean_average_precision, s, y, mask=m, empty=empty), "map")
    _close(pt["mrr"], pure(M.mrr, s, y, mask=m, empty=empty), "mrr")
    _close(pt["auc"], pure(M.auc, s, y, mask=m), "auc")
    _close(pt["gauc"], pure(M.gauc, s, y, mask=m), "gauc")
    _close(pt["logloss"], pure(M.log_loss, p, y, mask=m), "logloss")
    _close(pt["ne"], pure(M.normalized_entropy, p, y, mask=m), "ne")
    _close(pt["pcoc"], pure(M.pcoc, p, y, mask=m), "pcoc")
    _close(pt["ece"], pure(M.ece, p, y, mask=m, bins=bins, binning=binning), "ece")
    _close(pt["f_ece@c"], pure(M.field_ece, p, y, codes, mask=m), "f_ece@c")
    in_pos = m & (pos <= 4)
    _close(pt.get("f_ece@position"),
           pure(M.field_ece, p[in_pos], y[in_pos], pos[in_pos]) if bool(in_pos.any()) else None,
           "f_ece@position")


def test_auc_point_and_replicates_are_exact_and_match_sklearn():
    z, y, lengths, *_ = sample(1, r=60, ties=False)
    st_ = flat_stats(z, y, lengths)
    assert st_.point()["auc"] == pytest.approx(roc_auc_score(y.numpy() > 0, z.numpy()), abs=1e-12)
    iv = bootstrap(st_, n_boot=100, seed=0, metrics=["auc"])["auc"]
    assert iv.lower < iv.estimate < iv.upper


# --- ListMetrics: the same sums, streamed ------------------------------------------------------


def _padded(z, y, lengths, *rest):
    from hybridrank.lists import gather_lists, pad_index

    index, mask = pad_index(lengths)
    return mask, [gather_lists(t, index, mask) for t in (z, y, *rest)]


@pytest.mark.parametrize("binning", ["uniform", "quantile"])
def test_list_metrics_are_the_engine_streamed(binning):
    """ListMetrics' states are the column totals: chunk after chunk it reports the engine's points
    (the exact engine's AUC and quantile ECE within the histogram's stated bounds)."""
    z, y, lengths, position, code = sample(2, r=300, ties=False)
    engine = flat_stats(z, y, lengths, position=position, fields={"cat": code}, binning=binning,
                        positions=5).point()
    mask, (zz, yy, pp, cc) = _padded(z, y, lengths, position, code)
    metric = ListMetrics(binning=binning, positions=5, fields={"cat": 4})
    for idx in torch.arange(300).split(70):
        metric.update(zz[idx], yy[idx], mask=mask[idx], positions=pp[idx], fields={"cat": cc[idx]})
    got = {k: float(v) for k, v in metric.compute().items()}
    assert set(got) == {k for k, v in engine.items() if v is not None}
    cnt = metric.hist_count
    ece_bound = 2 * (metric.bins - 1) * float(cnt.max()) / float(cnt.sum())
    for key, value in got.items():
        tol = (float(metric.auc_bound()) + 1e-12 if key == "auc" else
               ece_bound if key == "ece" and binning == "quantile" else 1e-12)
        assert value == pytest.approx(engine[key], abs=tol), key
    table = metric.field_table("cat")
    from_engine = flat_stats(z, y, lengths, fields={"cat": code}).field_table("cat")
    for a, b in zip(table, from_engine):
        torch.testing.assert_close(a.double(), b.double(), rtol=0, atol=1e-12)


# --- reports --------------------------------------------------------------------------------


def test_calibration_summary_equals_the_pure_functions():
    z, y, lengths, position, code = sample(3, r=200, ties=False)
    p = torch.sigmoid(z)
    s = calibration_summary(p, y, position, bins=7, fields={"cat": code})
    assert s["n"] == p.numel() and s["positives"] == int((y > 0).sum())
    assert s["logloss"] == pytest.approx(float(M.log_loss(p, y)), abs=1e-12)
    assert s["ece"] == pytest.approx(float(M.ece(p, y, bins=7)), abs=1e-12)
    assert s["pcoc"] == pytest.approx(float(M.pcoc(p, y)), abs=1e-12)
    table = M.reliability_table(p, y, 7)
    keep = table.count > 0
    assert s["reliability"]["count"] == table.count[keep].long().tolist()
    assert s["reliability"]["mean_p"] == pytest.approx(table.mean_p[keep].tolist(), abs=1e-12)
    by_pos = M.pcoc_by_position(p, y, position)
    assert s["pcoc_by_position"]["position"] == by_pos.position.tolist()
    assert s["pcoc_by_position"]["f_ece"] == pytest.approx(float(M.field_ece(p, y, position)), abs=1e-12)
    field = s["fields"]["cat"]
    assert field["value"] == sorted(set(code.tolist()))
    assert field["f_ece"] == pytest.approx(float(M.field_ece(p, y, code)), abs=1e-12)
    with pytest.raises(ValueError, match="zero impressions"):
        calibration_summary(torch.zeros(0), torch.zeros(0))


def test_bad_inputs_name_what_and_where():
    z, y, lengths, position, code = sample(4)
    with pytest.raises(ValueError, match="sum to the"):
        flat_stats(z, y, lengths[:-1])
    with pytest.raises(ValueError, match="scores contains NaN"):
        flat_stats(torch.full_like(z, float("nan")), y, lengths)
    with pytest.raises(ValueError, match=r"p must lie in \[0, 1\]"):
        flat_stats(z, y, lengths, p=z + 5)
    with pytest.raises(ValueError, match="field 'cat': codes must be an int tensor"):
        flat_stats(z, y, lengths, fields={"cat": code.double()})
    with pytest.raises(ValueError, match="request_key has 3 entries"):
        flat_stats(z, y, lengths, request_key=[1, 2, 3])
    with pytest.raises(ValueError, match="unknown ranking metrics"):
        flat_stats(z, y, lengths, include=("ndcg", "precision"))
    with pytest.raises(ValueError, match="no field 'dev'"):
        flat_stats(z, y, lengths).field_table("dev")


# --- hybridrank-train: the final figures --------------------------------------------------------


def _sk_ndcg(scores, labels, k):
    """sklearn's NDCG (tie-averaged) on the exp gains ``2^y - 1``; a one-item list by hand."""
    if not any(v > 0 for v in labels):
        return None
    if len(scores) == 1:
        return 1.0
    return float(ndcg_score([[2.0 ** v - 1 for v in labels]], [scores], k=k))


@pytest.mark.slow
def test_train_table_points_equal_brute_force_and_intervals_rest_on_the_same_statistics(
        small_run):
    """Every number of hybridrank-train's table (model, oracle, base rate; f_ece@field) is the
    metric of the scores by loops / sklearn, metrics.json holds the same values, and each interval
    comes from the very statistics whose all-ones weighting gives the printed point."""
    import json

    import hydra

    from hybridrank.evaluation import TABLE_COLUMNS, format_table, model_statistics
    from hybridrank.metrics.uncertainty import interval_table
    from hybridrank.models.ranker import HybridRanker

    cfg, result = small_run["cfg"], small_run["result"]  # fields=[item_category], n_boot=60
    model = HybridRanker.load_from_checkpoint(result["best_checkpoint"], weights_only=True)
    test = hydra.utils.instantiate(cfg.data.source).load().test
    z = model.predict_split(test, at_logged_position=True)[0].double()
    j = model.schema.categorical.index("item_category")
    rate = float((test.label > 0).double().mean())
    rows = {"this model": (z.tolist(), torch.sigmoid(z).tolist()),
            "oracle (true pCTR)": (test.true_p.tolist(), test.true_p.double().tolist()),
            "base rate": ([rate] * test.n_impressions, [rate] * test.n_impressions)}
    labels, cat = test.label.tolist(), test.cat[:, j].tolist()
    bounds = [0, *test.lengths.cumsum(0).tolist()]
    columns = (*TABLE_COLUMNS, "f_ece@item_category")
    values = {"this model": {k.removeprefix("test/"): v for k, v in result["test"].items()},
              **result["reference"]}
    saved = json.loads((small_run["out"] / "metrics.json").read_text())
    table = format_table(result, columns)
    for name, (scores, p) in rows.items():
        lists = [(scores[a:b], labels[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
        want = {
            "ndcg@10": mean_over_lists(lambda s, y: _sk_ndcg(s, y, 10), lists),
            "gauc": sum(len(s) * roc_auc_score(np.array(y) > 0, s) for s, y in lists
                        if 0 < sum(v > 0 for v in y) < len(y))
            / sum(len(s) for s, y in lists if 0 < sum(v > 0 for v in y) < len(y)),
            "logloss": sum(-math.log(min(max(q, EPS), 1 - EPS)) if v > 0
                           else -math.log(1 - min(max(q, EPS), 1 - EPS)) for q, v in zip(p, labels))
            / len(p),
            "ece": gap_ref(p, labels, quantile_bins(p, 15)),
            "pcoc": sum(p) / sum(1.0 for v in labels if v > 0),
            "f_ece@item_category": gap_ref(p, labels, cat),
        }
        from hybridrank.evaluation import interval_cell

        iv = result["intervals"]["rows"][name]
        cells = []
        for c in columns:
            assert values[name][c] == pytest.approx(want[c], rel=1e-9, abs=1e-12), (name, c)
            est, lo, hi = iv[c]
            # one engine: the interval's estimate is the printed point (a percentile interval of
            # the upward-biased ECE need not contain it)
            assert est == values[name][c] and lo <= hi, (name, c)
            cells.append(interval_cell(c, est, lo, hi)[0])  # the table's cell of these figures
        assert f"| {name} | " + " | ".join(cells) + " |" in table
        stored = saved["test"] if name == "this model" else saved["reference"][name]
        assert all(stored[("test/" if name == "this model" else "") + c] == values[name][c]
                   for c in columns)
    # the intervals rest on these statistics: rebuilt, weighted by ones they give the points,
    # and resampled with the run's seed they give the run's intervals
    stats = model_statistics(model, [test])
    for name, st_ in stats.items():
        ones = st_.values_of(torch.ones(1, st_.n_requests), list(columns))
        assert {c: float(ones[c][0][0]) for c in columns} == {c: values[name][c] for c in columns}
    again = interval_table(stats, metrics=columns, n_boot=60, seed=cfg.intervals.seed)
    assert again["rows"] == result["intervals"]["rows"]
