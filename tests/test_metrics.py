"""Metrics: fixed numbers, sklearn and loop references, invariants, streaming == one-shot."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from metric_reference import (
    ap_ref,
    auc_ref,
    bin_ref,
    ece_ref,
    gauc_ref,
    log_loss_ref,
    mean_over_lists,
    ndcg_ref,
    pcoc_ref,
    rr_ref,
)
from sklearn.metrics import average_precision_score, ndcg_score, roc_auc_score
from sklearn.metrics import log_loss as sk_log_loss

from hybridrank.metrics.calibration import (
    bin_index,
    ece,
    log_loss,
    normalized_entropy,
    pcoc,
    pcoc_by_position,
    reliability_table,
)
from hybridrank.metrics.list_metrics import ListMetrics
from hybridrank.metrics.logit_histogram import hist_parts
from hybridrank.metrics.ranking import (
    auc,
    auc_from_counts,
    auc_per_list,
    average_precision_per_list,
    gauc,
    mean_average_precision,
    mrr,
    ndcg,
    ndcg_per_list,
    reciprocal_rank_per_list,
)

L2 = math.log2


def pad(lists, extra_cols=0, extra_rows=0, garbage=7.0):
    """``[(scores, labels), ...]`` -> padded float64 scores, labels, mask; padding holds garbage."""
    width = max([len(s) for s, _ in lists] + [1]) + extra_cols
    g = len(lists) + extra_rows
    s = torch.full((g, width), garbage, dtype=torch.float64)
    y = torch.full((g, width), 2.0, dtype=torch.float64)
    m = torch.zeros(g, width, dtype=torch.bool)
    for i, (sc, lab) in enumerate(lists):
        s[i, : len(sc)] = torch.tensor(sc, dtype=torch.float64)
        y[i, : len(lab)] = torch.tensor(lab, dtype=torch.float64)
        m[i, : len(sc)] = True
    return s, y, m


def split(pairs):
    return [([a for a, _ in lst], [b for _, b in lst]) for lst in pairs]


# small lists with many ties; empty lists allowed (all-padding rows)
item = st.tuples(st.integers(0, 3).map(float), st.integers(0, 2).map(float))
lists_st = st.lists(st.lists(item, min_size=0, max_size=5), min_size=1, max_size=4).map(split)


def mean_or_none(fn, *args, **kw):
    try:
        return fn(*args, **kw)
    except ValueError:
        return None


def close(a, b, tol=1e-9):
    if a is None or b is None:
        return a is None and b is None
    return abs(float(a) - float(b)) <= tol


# --- fixed numbers --------------------------------------------------------------------------------


def one(scores, labels):
    return pad([(scores, labels)])


def test_ndcg_fixed_numbers():
    s, y, m = one([3.0, 2.0, 1.0], [0.0, 1.0, 2.0])
    dcg = 0 / L2(2) + 1 / L2(3) + 3 / L2(4)
    idcg = 3 / L2(2) + 1 / L2(3)
    assert float(ndcg(s, y, mask=m, k=None)) == pytest.approx(dcg / idcg)
    assert float(ndcg(s, y, mask=m, k=1)) == 0.0
    lin = (1 / L2(3) + 2 / L2(4)) / (2 + 1 / L2(3))
    assert float(ndcg(s, y, mask=m, k=None, gain="linear")) == pytest.approx(lin)
    many = ndcg(s, y, mask=m, k=(1, 2, None))
    assert many.shape == (3,)
    assert float(many[1]) == pytest.approx((1 / L2(3)) / (3 + 1 / L2(3)))


def test_ndcg_tie_cutoff_inside_block():
    # items 0 and 1 tie at ranks 1-2 (gains 3 and 0), item 2 (gain 1) is third
    s, y, m = one([1.0, 1.0, 0.0], [2.0, 0.0, 1.0])
    assert float(ndcg(s, y, mask=m, k=1)) == pytest.approx((3 / 2) / 3)
    dcg2 = 3 / 2 * (1 + 1 / L2(3))
    assert float(ndcg(s, y, mask=m, k=2)) == pytest.approx(dcg2 / (3 + 1 / L2(3)))
    dcg3 = dcg2 + 1 / L2(4)
    assert float(ndcg(s, y, mask=m, k=3)) == pytest.approx(dcg3 / (3 + 1 / L2(3)))


def test_map_mrr_auc_fixed_numbers():
    s, y, m = one([4.0, 3.0, 3.0, 1.0], [0.0, 1.0, 0.0, 1.0])
    # pessimistic: item 1 has rank 3 (ties with item 2), item 3 rank 4
    assert float(mean_average_precision(s, y, mask=m)) == pytest.approx((1 / 3 + 2 / 4) / 2)
    assert float(mrr(s, y, mask=m)) == pytest.approx(1 / 3)
    # pairs (pos, neg): (3, 4) 0, (3, 3) 1/2, (1, 4) 0, (1, 3) 0
    assert float(auc(s, y, mask=m)) == pytest.approx(0.5 / 4)
    assert float(gauc(s, y, mask=m)) == pytest.approx(0.5 / 4)


def test_gauc_weights_by_impressions():
    s, y, m = pad([([2.0, 1.0], [1.0, 0.0]), ([1.0, 2.0, 3.0, 0.0], [1.0, 0.0, 0.0, 0.0]),
                   ([1.0, 2.0], [1.0, 1.0])])
    assert float(gauc(s, y, mask=m)) == pytest.approx((2 * 1.0 + 4 * (1 / 3)) / 6)


def test_calibration_fixed_numbers():
    p = torch.tensor([0.0, 0.05, 0.5, 1.0], dtype=torch.float64)
    y = torch.tensor([0.0, 0.0, 1.0, 1.0])
    assert float(ece(p, y, bins=10, binning="uniform")) == pytest.approx((0.05 + 0.5 + 0.0) / 4)
    # quantile, 2 bins: {0, .05} and {.5, 1}
    assert float(ece(p, y, bins=2)) == pytest.approx((0.05 + 0.5) / 4)
    assert float(pcoc(p, y)) == pytest.approx(1.55 / 2)
    q = torch.tensor([0.2, 0.6])
    t = torch.tensor([0.0, 1.0])
    ll = -(math.log(0.8) + math.log(0.6)) / 2
    assert float(log_loss(q, t)) == pytest.approx(ll)
    assert float(normalized_entropy(q, t)) == pytest.approx(ll / math.log(2))
    clipped = log_loss(torch.tensor([0.0, 1.0]), torch.tensor([1.0, 0.0]))
    assert float(clipped) == pytest.approx(-math.log(1e-7), rel=1e-6)
    tab = reliability_table(p, y, 2, "uniform")
    assert tab.count.tolist() == [2, 2]
    assert tab.mean_p.tolist() == pytest.approx([0.025, 0.75])
    assert tab.mean_y.tolist() == pytest.approx([0.0, 1.0])
    assert math.isnan(float(reliability_table(p, y, 4, "uniform").mean_p[1]))


def test_pcoc_by_position():
    p = torch.tensor([[0.2, 0.1, 0.1], [0.4, 0.3, 0.0]])
    y = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    pos = torch.tensor([[1, 2, 3], [1, 2, 3]])
    m = torch.tensor([[True, True, True], [True, True, False]])
    r = pcoc_by_position(p, y, pos, mask=m)
    assert r.position.tolist() == [1, 2, 3]
    assert r.pcoc[:2].tolist() == pytest.approx([0.6, 0.4])
    assert math.isinf(float(r.pcoc[2])) and float(r.positives[2]) == 0
    assert r.count.tolist() == [2, 2, 1]


# --- sklearn references ---------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 3, 5, None])
def test_ndcg_matches_sklearn_linear_gain(k):
    # sklearn: linear gain, tie-averaged, lists without relevance scored 0 (our empty="zero"),
    # fixed-length lists only and at least 2 documents each.
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, size=(200, 7)) * (rng.random((200, 7)) < 0.5)
    s = rng.integers(0, 4, size=(200, 7)).astype(float)  # many ties
    m = torch.ones(200, 7, dtype=torch.bool)
    ours = ndcg(torch.tensor(s), torch.tensor(y, dtype=torch.float64), mask=m, k=k, gain="linear",
                empty="zero")
    assert float(ours) == pytest.approx(ndcg_score(y, s, k=k), abs=1e-12)
    keep = y.sum(1) > 0
    ours_skip = ndcg(torch.tensor(s), torch.tensor(y, dtype=torch.float64), mask=m, k=k,
                     gain="linear", empty="skip")
    assert float(ours_skip) == pytest.approx(ndcg_score(y[keep], s[keep], k=k), abs=1e-12)


def test_map_matches_sklearn_average_precision():
    rng = np.random.default_rng(1)
    lists = []
    for _ in range(60):
        n = int(rng.integers(2, 9))
        lab = (rng.random(n) < 0.4).astype(float)
        lab[rng.integers(n)] = 1.0
        lists.append((rng.integers(0, 3, n).astype(float).tolist(), lab.tolist()))
    s, y, m = pad(lists, extra_cols=2)
    ref = np.mean([average_precision_score(lab, sc) for sc, lab in lists])
    assert float(mean_average_precision(s, y, mask=m)) == pytest.approx(ref, abs=1e-12)


def test_auc_and_log_loss_match_sklearn():
    rng = np.random.default_rng(2)
    s = rng.integers(0, 20, size=(50, 8)).astype(float)  # ties across lists
    y = (rng.random((50, 8)) < 0.3).astype(float)
    m = rng.random((50, 8)) < 0.8
    st_, yt, mt = torch.tensor(s), torch.tensor(y), torch.tensor(m)
    assert float(auc(st_, yt, mask=mt)) == pytest.approx(roc_auc_score(y[m], s[m]), abs=1e-12)
    p = 1 / (1 + np.exp(-(s - 10) / 4))
    assert float(log_loss(torch.tensor(p), yt, mask=mt)) == pytest.approx(
        sk_log_loss(y[m], p[m]), abs=1e-12)
    per, ok = auc_per_list(st_, yt, mask=mt)
    for g in range(50):
        if ok[g]:
            assert float(per[g]) == pytest.approx(roc_auc_score(y[g][m[g]], s[g][m[g]]))


# --- loop references (hypothesis) -----------------------------------------------------------------


@given(lists_st, st.sampled_from(["skip", "zero", "one"]), st.sampled_from(["exp", "linear"]))
def test_ndcg_matches_tie_enumeration(lists, empty, gain):
    s, y, m = pad(lists, extra_cols=1, extra_rows=1)
    ks = (1, 2, 3, None)
    got = mean_or_none(ndcg, s, y, mask=m, k=ks, gain=gain, empty=empty)
    for j, k in enumerate(ks):
        ref = mean_over_lists(lambda a, b, k=k: ndcg_ref(a, b, k, gain), lists, empty)
        assert close(None if got is None else got[j], ref)


@given(lists_st, st.sampled_from(["skip", "zero", "one"]))
def test_map_mrr_gauc_auc_match_loops(lists, empty):
    s, y, m = pad(lists, extra_cols=1)
    assert close(mean_or_none(mean_average_precision, s, y, mask=m, empty=empty),
                 mean_over_lists(ap_ref, lists, empty))
    assert close(mean_or_none(mrr, s, y, mask=m, empty=empty), mean_over_lists(rr_ref, lists, empty))
    assert close(mean_or_none(gauc, s, y, mask=m), gauc_ref(lists))
    flat_s = [v for sc, _ in lists for v in sc]
    flat_y = [v for _, lab in lists for v in lab]
    assert close(mean_or_none(auc, s, y, mask=m), auc_ref(flat_s, flat_y) if flat_s else None)


probs = st.lists(st.sampled_from([0.0, 0.01, 0.1, 0.1, 0.3, 0.5, 0.77, 0.9, 1.0]),
                 min_size=1, max_size=40)


@given(probs, st.data(), st.integers(1, 12), st.sampled_from(["quantile", "uniform"]))
def test_ece_pcoc_log_loss_match_loops(p, data, bins, binning):
    y = data.draw(st.lists(st.sampled_from([0.0, 1.0, 2.0]), min_size=len(p), max_size=len(p)))
    pt, yt = torch.tensor(p, dtype=torch.float64), torch.tensor(y)
    assert float(ece(pt, yt, bins=bins, binning=binning)) == pytest.approx(
        ece_ref(p, y, bins, binning), abs=1e-12)
    assert float(log_loss(pt, yt)) == pytest.approx(log_loss_ref(p, y), abs=1e-9)
    if any(v > 0 for v in y):
        assert float(pcoc(pt, yt)) == pytest.approx(pcoc_ref(p, y), abs=1e-12)
    idx = bin_index(pt, bins, binning)
    assert idx.tolist() == bin_ref(p, bins, binning)


# --- invariants -----------------------------------------------------------------------------------


def per_list_all(s, y, m, empty="skip"):
    out = [ndcg_per_list(s, y, mask=m, k=(1, 3, None), empty=empty)[0],
           average_precision_per_list(s, y, mask=m, empty=empty)[0],
           reciprocal_rank_per_list(s, y, mask=m, empty=empty)[0], auc_per_list(s, y, mask=m)[0]]
    return torch.cat([o.reshape(o.shape[0], -1).double() for o in out], 1)


@given(lists_st, st.integers(0, 3), st.integers(0, 2), st.floats(-5, 5))
def test_padding_changes_nothing(lists, cols, rows, garbage):
    a = pad(lists)
    b = pad(lists, extra_cols=cols, extra_rows=rows, garbage=garbage)
    b[0][~b[2]] = float("nan") if cols % 2 else garbage  # NaN in padding is fine
    g = len(lists)
    torch.testing.assert_close(per_list_all(*a), per_list_all(*b)[:g], rtol=0, atol=1e-12)
    for fn in (ndcg, mean_average_precision, mrr, gauc, auc):
        assert close(mean_or_none(fn, *a[:2], mask=a[2]), mean_or_none(fn, *b[:2], mask=b[2]))
    for empty in ("zero", "one"):
        assert close(mean_or_none(ndcg, *a[:2], mask=a[2], empty=empty),
                     mean_or_none(ndcg, *b[:2], mask=b[2], empty=empty))


@given(lists_st, st.randoms(use_true_random=False))
def test_permutation_within_list_changes_nothing(lists, rnd):
    shuffled = []
    for sc, lab in lists:
        order = list(range(len(sc)))
        rnd.shuffle(order)
        shuffled.append(([sc[i] for i in order], [lab[i] for i in order]))
    torch.testing.assert_close(per_list_all(*pad(lists)), per_list_all(*pad(shuffled)),
                               rtol=0, atol=1e-12)


def test_constant_scores_do_not_depend_on_storage_order():
    labels = [2.0, 1.0, 0.0, 0.0, 0.0]
    first = one([0.5] * 5, labels)
    last = one([0.5] * 5, labels[::-1])
    for k in (1, 3, None):
        a, b = ndcg(*first[:2], mask=first[2], k=k), ndcg(*last[:2], mask=last[2], k=k)
        assert float(a) == pytest.approx(float(b), abs=1e-12)
    # every item sits on ranks 1..5 uniformly: DCG@1 = mean gain = (3 + 1) / 5, IDCG@1 = 3
    assert float(ndcg(*first[:2], mask=first[2], k=1)) == pytest.approx(4 / 5 / 3)
    assert float(mrr(*first[:2], mask=first[2])) == pytest.approx(1 / 5)


@given(lists_st)
def test_empty_policies(lists):
    s, y, m = pad(lists, extra_rows=1)
    vals, valid = ndcg_per_list(s, y, mask=m, k=3, empty="skip")
    nonempty = m.any(1)
    has_pos = ((y > 0) & m).any(1)
    assert valid.tolist() == (nonempty & has_pos).tolist()
    for empty, fill in (("zero", 0.0), ("one", 1.0)):
        v2, ok2 = ndcg_per_list(s, y, mask=m, k=3, empty=empty)
        assert ok2.tolist() == nonempty.tolist()
        assert torch.all(v2[nonempty & ~has_pos] == fill)
        torch.testing.assert_close(v2[valid], vals[valid])
        n_all, n_empty = int(nonempty.sum()), int((nonempty & ~has_pos).sum())
        if n_all:
            want = (float(vals[valid].sum()) + fill * n_empty) / n_all
            assert float(ndcg(s, y, mask=m, k=3, empty=empty)) == pytest.approx(want)


@given(st.integers(1, 60), st.integers(1, 20), st.integers(0, 5), st.integers(0, 5))
def test_p0_and_p1_land_in_first_and_last_bin(n, bins, zeros, ones):
    p = torch.cat([torch.zeros(zeros), torch.rand(n, generator=torch.Generator().manual_seed(n)),
                   torch.ones(ones)]).double()
    uni = bin_index(p, bins, "uniform")
    assert torch.all(uni[:zeros] == 0) and torch.all(uni[zeros + n:] == bins - 1)
    q = bin_index(p, bins, "quantile")
    assert torch.all(q[:zeros] == 0)
    assert torch.all(q[zeros + n:] == q.max())  # the last non-empty bin
    if ones <= p.numel() / bins:
        assert torch.all(q[zeros + n:] == bins - 1)


# --- errors ---------------------------------------------------------------------------------------


def test_errors_name_the_argument():
    s, y, m = one([1.0, 2.0], [1.0, 0.0])
    with pytest.raises(ValueError, match="scores"):
        ndcg(torch.tensor([[float("nan"), 1.0]]), y, mask=m)
    with pytest.raises(ValueError, match="labels"):
        mrr(s, torch.tensor([[float("nan"), 1.0]]), mask=m)
    with pytest.raises(ValueError, match="p contains NaN"):
        ece(torch.tensor([float("nan"), 0.2]), torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match=r"p must lie in \[0, 1\]"):
        log_loss(torch.tensor([1.5]), torch.tensor([1.0]))
    with pytest.raises(ValueError, match="only one class"):
        auc(s, torch.ones_like(y), mask=m)
    with pytest.raises(ValueError, match="GAUC undefined"):
        gauc(s, torch.zeros_like(y), mask=m)
    with pytest.raises(ValueError, match="no positive"):
        pcoc(torch.tensor([0.3]), torch.tensor([0.0]))
    with pytest.raises(ValueError, match="single class"):
        normalized_entropy(torch.tensor([0.3]), torch.tensor([0.0]))
    with pytest.raises(ValueError, match="ndcg undefined"):
        ndcg(s, torch.zeros_like(y), mask=m)
    assert float(ndcg(s, torch.zeros_like(y), mask=m, empty="one")) == 1.0
    for bad in ({"empty": "drop"}, {"gain": "log"}, {"ties": "first"}, {"k": 0}):
        with pytest.raises(ValueError):
            ndcg(s, y, mask=m, **bad)
    with pytest.raises(ValueError, match="Unexpected keyword"):
        ListMetrics(bin=10)  # a typo is not swallowed
    with pytest.raises(ValueError, match="binning"):
        ece(torch.tensor([0.3]), torch.tensor([0.0]), binning="width")


# --- one argument convention: mask keyword-only, as in the losses ----------------------------------

_METRIC_MODULES = ("ranking", "calibration", "list_kernels", "request_sums", "statistics", "per_request",
                   "builders", "uncertainty", "report", "logit_histogram")


def _public_callables():
    """Every public function (and ``ListMetrics.update``) of the metric modules, by qualified name."""
    import importlib
    import inspect

    out = {}
    for name in _METRIC_MODULES:
        mod = importlib.import_module(f"hybridrank.metrics.{name}")
        for attr in mod.__all__:
            obj = getattr(mod, attr)
            if inspect.isfunction(obj) and obj.__module__ == mod.__name__:
                out[f"{name}.{attr}"] = obj
    out["ListMetrics.update"] = ListMetrics.update
    return out


def test_every_mask_parameter_is_keyword_only():
    import inspect

    with_mask = {n: f for n, f in _public_callables().items() if "mask" in inspect.signature(f).parameters}
    # the pure functions, the kernels, the builders of padded lists and the streaming update
    assert {"ranking.ndcg", "ranking.gauc", "ranking.auc", "calibration.ece", "list_kernels.check_lists",
            "request_sums.ranking_sums", "builders.list_stats", "builders.field_stats",
            "ListMetrics.update"} <= set(with_mask)
    for name, fn in with_mask.items():
        kind = inspect.signature(fn).parameters["mask"].kind
        assert kind is inspect.Parameter.KEYWORD_ONLY, f"{name}: mask is {kind.description}"


def test_a_positional_mask_is_a_type_error_not_another_argument():
    from hybridrank.metrics.builders import calibration_stats, field_stats, list_stats, ranking_stats
    from hybridrank.metrics.request_sums import ranking_sums

    s, y, m = one([2.0, 1.0, 0.5], [1.0, 0.0, 1.0])
    p = torch.sigmoid(s)
    for fn, args in ((ndcg, (s, y, m)), (ndcg_per_list, (s, y, m)), (mean_average_precision, (s, y, m)),
                     (average_precision_per_list, (s, y, m)), (mrr, (s, y, m)),
                     (reciprocal_rank_per_list, (s, y, m)), (auc, (s, y, m)), (auc_per_list, (s, y, m)),
                     (gauc, (s, y, m)), (log_loss, (p, y, m)), (ece, (p, y, m)), (pcoc, (p, y, m)),
                     (ranking_sums, (s, y, m)), (list_stats, (s, y, m)), (ranking_stats, (s, y, m)),
                     (calibration_stats, (p, y, m)), (field_stats, (p, y, m)),
                     (ListMetrics().update, (s, y, m))):
        with pytest.raises(TypeError, match="positional argument"):
            fn(*args)
    # field_stats' fields are keyword-only too: an old call (p, y, mask, fields) binds nothing silently
    with pytest.raises(TypeError, match="positional argument"):
        field_stats(p, y, m, {"c": torch.zeros_like(m, dtype=torch.long)})
    # the keyword form gives the documented values
    assert float(mrr(s, y, mask=m)) == 1.0
    assert float(ndcg(s, y, mask=m, k=None)) == pytest.approx((1 + 1 / L2(4)) / (1 + 1 / L2(3)))


def test_list_metrics_take_mask_by_keyword_through_torchmetrics():
    """``forward`` and a ``MetricCollection`` pass the keyword mask through to ``update``."""
    from torchmetrics import MetricCollection

    s, y, m = one([2.0, 1.0, 0.5], [1.0, 0.0, 1.0])
    direct = ListMetrics(ks=(2,))
    direct.update(s, y, mask=m)
    coll = MetricCollection({"a": ListMetrics(ks=(2,))})
    coll.update(s, y, mask=m)
    fwd = ListMetrics(ks=(2,))
    fwd(s, y, mask=m)
    want = {k: float(v) for k, v in direct.compute().items()}
    assert want["ndcg@2"] == pytest.approx((1 + 0.0) / (1 + 1 / L2(3))) and want["n_lists"] == 1
    assert {k: float(v) for k, v in coll.compute().items()} == want  # one metric: its own keys
    assert {k: float(v) for k, v in fwd.compute().items()} == want


def test_no_metric_module_imports_a_private_name():
    """The engine's parts share only public names (``from x import _name`` across modules is a
    hidden coupling): checked on the imports of every module of the package."""
    import ast
    from pathlib import Path

    import hybridrank

    root = Path(hybridrank.__file__).parent
    bad = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and (
                    "metrics" in node.module or path.parent.name == "metrics"):
                bad += [f"{path.relative_to(root)}:{node.lineno} {node.module}.{a.name}"
                        for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    assert not bad, bad


# --- streaming ------------------------------------------------------------------------------------


def random_lists(seed, g=300, lmax=12, ctr=0.15, graded=True):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, lmax + 1, (g,), generator=gen)
    m = torch.arange(lmax)[None, :] < lengths[:, None]
    z = torch.randn(g, lmax, generator=gen, dtype=torch.float64) * 1.5 - 1.5
    hit = torch.rand(g, lmax, generator=gen) < ctr
    y = hit.double() * (torch.randint(1, 3, (g, lmax), generator=gen) if graded else 1)
    pos = torch.arange(1, lmax + 1).expand(g, lmax)
    return z, y, m, pos


def pure_all(z, y, m, ks=(1, 3, 5, 10), binning="quantile", bins=15, empty="skip"):
    p = torch.sigmoid(z)
    out = {f"ndcg@{k}": v for k, v in zip(ks, ndcg(z, y, mask=m, k=ks, empty=empty))}
    out.update(map=mean_average_precision(z, y, mask=m, empty=empty), mrr=mrr(z, y, mask=m, empty=empty),
               auc=auc(z, y, mask=m), gauc=gauc(z, y, mask=m), logloss=log_loss(p, y, mask=m),
               ne=normalized_entropy(p, y, mask=m), pcoc=pcoc(p, y, mask=m),
               ece=ece(p, y, mask=m, bins=bins, binning=binning))
    return out


@pytest.mark.parametrize("empty", ["skip", "zero"])
def test_list_metrics_equal_pure_functions(empty):
    z, y, m, pos = random_lists(0)
    metric = ListMetrics(binning="uniform", empty=empty, positions=5)
    metric.update(z, y, mask=m, positions=pos)
    got = metric.compute()
    want = pure_all(z, y, m, binning="uniform", empty=empty)
    for key, value in want.items():
        tol = 1e-3 if key == "auc" else 1e-12
        assert float(got[key]) == pytest.approx(float(value), abs=tol), key
    by_pos = pcoc_by_position(torch.sigmoid(z), y, pos, mask=m)
    for i in range(5):
        assert float(got[f"pcoc@pos{i + 1}"]) == pytest.approx(float(by_pos.pcoc[i]), abs=1e-12)
    assert "pcoc@pos6" not in got
    n_empty = int((m.any(1) & ~((y > 0) & m).any(1)).sum())
    assert float(got["n_lists"]) == 300 and float(got["n_empty"]) == n_empty
    assert float(got["n_skipped"]) == (n_empty if empty == "skip" else 0)
    assert float(got["n_impressions"]) == int(m.sum())


def test_streaming_auc_and_quantile_ece_within_stated_bounds():
    z, y, m, _ = random_lists(1, g=2000)
    metric = ListMetrics()
    metric.update(z, y, mask=m)
    got = metric.compute()
    want = pure_all(z, y, m)
    pos, cnt = metric.hist_pos, metric.hist_count
    # every positive-negative pair sharing a fine bin, counted 1/2: a looser bound
    auc_bound = 0.5 * (pos * (cnt - pos)).sum() / (pos.sum() * (cnt - pos).sum())
    assert float(metric.auc_bound()) <= float(auc_bound)
    assert float(got["auc"]) == pytest.approx(float(auc_from_counts(pos, cnt - pos)[0]), abs=1e-15)
    assert abs(float(got["auc"]) - float(want["auc"])) <= float(metric.auc_bound()) + 1e-12
    assert float(auc_bound) < 1e-3
    n = float(cnt.sum())
    ece_bound = 2 * (metric.bins - 1) * float(cnt.max()) / n
    assert abs(float(got["ece"]) - float(want["ece"])) <= ece_bound


@pytest.mark.parametrize("shift, scale", [(25.0, 1.0), (-40.0, 1.0), (0.0, 30.0), (1e5, 1.0),
                                          (0.0, 1e-4)])
def test_streaming_auc_far_from_zero(shift, scale):
    """Pure ranking losses leave the logit scale free: the streaming AUC must not care where it
    lies (a fixed [-16, 16] histogram put every logit of ``z + 25`` in one bin: AUC 0.5)."""
    z, _, m, _ = random_lists(1, g=2000, graded=False)
    gen = torch.Generator().manual_seed(11)
    y = (torch.rand(z.shape, generator=gen, dtype=torch.float64) < torch.sigmoid(2 * z)).double()
    assert float(auc(z, y, mask=m)) > 0.75  # an informative score: collapsing to 0.5 would show
    z = z * scale + shift
    metric = ListMetrics()
    metric.update(z, y, mask=m)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a tight bound: no warning
        got = metric.compute()
    exact = float(auc(z, y, mask=m))
    assert abs(float(got["auc"]) - exact) <= 1e-3, (float(got["auc"]), exact)
    assert abs(float(got["auc"]) - exact) <= float(metric.auc_bound()) + 1e-12
    assert float(metric.auc_bound()) < 1e-3
    # GAUC and NDCG never used the histogram; quantile ECE within its bound
    p = torch.sigmoid(z)
    cnt = metric.hist_count
    ece_bound = 2 * (metric.bins - 1) * float(cnt.max()) / float(cnt.sum())
    assert abs(float(got["ece"]) - float(ece(p, y, mask=m))) <= ece_bound


def test_streaming_histogram_widens_exactly_across_updates():
    """Later logits far outside the first batch's range coarsen the bins exactly: streaming equals
    one shot, whatever the order, and merging two differently-ranged states is exact."""
    z, y, m, _ = random_lists(2, g=600)
    z = z.clone()
    z[300:] = z[300:] * 20 + 50  # the second half lives elsewhere
    one_shot = ListMetrics()
    one_shot.update(z, y, mask=m)
    want = one_shot.compute()
    for order in (torch.arange(600), torch.arange(599, -1, -1)):
        streamed = ListMetrics()
        for idx in order.split(97):
            streamed.update(z[idx], y[idx], mask=m[idx])
        torch.testing.assert_close(streamed.hist, one_shot.hist, rtol=0, atol=1e-9)
        for key, value in streamed.compute().items():
            assert float(value) == pytest.approx(float(want[key]), abs=1e-12), key
    a, b = ListMetrics(), ListMetrics()
    a.update(z[300:], y[300:], mask=m[300:])
    b.update(z[:300], y[:300], mask=m[:300])
    a.merge_state(b)
    torch.testing.assert_close(a.hist, one_shot.hist, rtol=0, atol=1e-9)
    assert abs(float(want["auc"]) - float(auc(z, y, mask=m))) <= float(one_shot.auc_bound()) + 1e-12


def test_streaming_auc_warns_when_its_bound_is_loose():
    z, y, m, _ = random_lists(3, g=500, graded=False)
    z = z.clone()
    z[0, 0] = 1e6  # one absurd outlier stretches the range: every other logit shares a bin
    metric = ListMetrics()
    metric.update(z, y, mask=m)
    with pytest.warns(UserWarning, match="streaming AUC is only known to within"):
        got = metric.compute()
    assert abs(float(got["auc"]) - float(auc(z, y, mask=m))) <= float(metric.auc_bound()) + 1e-12
    # exact ties are no error: a constant model has bound 0 and no warning
    const = ListMetrics()
    const.update(torch.full_like(z, 3.0), y, mask=m)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert float(const.compute()["auc"]) == 0.5
    assert float(const.auc_bound()) == 0.0


def test_streaming_quantile_ece_exact_with_one_value_per_fine_bin():
    gen = torch.Generator().manual_seed(3)
    centers = torch.randperm(4096, generator=gen)[:600].double()
    z = (-8.0 + centers / 256).reshape(60, 10)  # 600 distinct logits on a 1/256 grid
    y = (torch.rand(60, 10, generator=gen) < torch.sigmoid(z)).double()
    m = torch.ones(60, 10, dtype=torch.bool)
    metric = ListMetrics(hist_bins=8192)
    metric.update(z, y, mask=m)
    got = metric.compute()
    assert float(got["ece"]) == pytest.approx(float(ece(torch.sigmoid(z), y)), abs=1e-12)
    assert float(got["auc"]) == pytest.approx(float(auc(z, y)), abs=1e-12)
    _, _, count, *_ = hist_parts(metric.hist)
    assert int((count > 0).sum()) == 600 and float(metric.auc_bound()) == 0.0


@given(st.integers(0, 10_000), st.lists(st.integers(1, 299), max_size=6))
@pytest.mark.slow
def test_streaming_over_random_splits_equals_one_shot(seed, cuts):
    z, y, m, pos = random_lists(seed % 7)
    one_shot = ListMetrics(positions=3)
    one_shot.update(z, y, mask=m, positions=pos)
    want = one_shot.compute()
    streamed = ListMetrics(positions=3)
    perm = torch.randperm(300, generator=torch.Generator().manual_seed(seed))
    bounds = [0, *sorted(set(cuts)), 300]
    for a, b in zip(bounds[:-1], bounds[1:]):
        idx = perm[a:b]
        width = int(m[idx].sum(1).max())  # each chunk padded to its own width
        streamed.update(z[idx, :width], y[idx, :width], mask=m[idx, :width], positions=pos[idx, :width])
    got = streamed.compute()
    assert got.keys() == want.keys()
    for key in want:
        assert float(got[key]) == pytest.approx(float(want[key]), abs=1e-12), key


def test_merged_states_equal_one_shot():
    z, y, m, _ = random_lists(4)
    a, b, full = ListMetrics(), ListMetrics(), ListMetrics()
    a.update(z[:100], y[:100], mask=m[:100])
    b.update(z[100:], y[100:], mask=m[100:])
    full.update(z, y, mask=m)
    a.merge_state(b)
    want = full.compute()
    for key, value in a.compute().items():
        assert float(value) == pytest.approx(float(want[key]), abs=1e-12), key


def test_streaming_undefined_values_are_absent():
    z = torch.tensor([[0.3, -1.0, 2.0]])
    m = torch.ones(1, 3, dtype=torch.bool)
    metric = ListMetrics()
    metric.update(z, torch.zeros(1, 3), mask=m)
    got = metric.compute()
    for key in ("auc", "gauc", "ne", "pcoc", "ndcg@10", "map", "mrr"):
        assert key not in got
    assert float(got["n_skipped"]) == 1 and float(got["n_positives"]) == 0
    assert "logloss" in got and "ece" in got
    metric = ListMetrics(empty="zero")
    metric.update(z, torch.zeros(1, 3), mask=m)
    assert float(metric.compute()["ndcg@10"]) == 0.0


def test_float32_logits_and_reliability():
    z, y, m, _ = random_lists(5)
    metric = ListMetrics(ks=(5,))
    metric.update(z.float(), y.float(), mask=m)
    got = metric.compute()
    assert float(got["ndcg@5"]) == pytest.approx(float(ndcg(z, y, mask=m, k=5)), abs=1e-5)
    table = metric.reliability()
    assert float(table.count.sum()) == float(m.sum())
    assert table.count.shape == (15,)


def test_empty_batches_and_integer_inputs():
    metric = ListMetrics()
    for shape in ((0, 4), (3, 0)):
        metric.update(torch.zeros(shape), torch.zeros(shape), mask=torch.zeros(shape, dtype=torch.bool))
    assert set(metric.compute()) == {"n_lists", "n_empty", "n_skipped", "n_impressions",
                                     "n_positives"}
    s, y, m = one([3.0, 1.0, 2.0], [0.0, 2.0, 1.0])
    assert float(ndcg(s.long(), y.long(), mask=m)) == pytest.approx(float(ndcg(s, y, mask=m)))
    assert float(ndcg(s.float(), y.float(), mask=m)) == pytest.approx(float(ndcg(s, y, mask=m)))
