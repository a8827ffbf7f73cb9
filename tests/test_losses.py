"""Tests of the loss catalogue: fixed numbers, loop references, hypothesis invariants, contract."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import pytest
import reference as R
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import Lists, padded_lists

import hybridrank.losses as L

CONF = Path(__file__).resolve().parents[1] / "conf" / "loss"


pytestmark = pytest.mark.usefixtures("one_thread")  # small tensors: tests/conftest.py


@dataclass(frozen=True)
class Spec:
    fn: object
    ref: object
    shift_invariant: bool = True  # a purely ranking loss
    distinct: bool = False  # label ties are broken by slot (ListMLE): invariants need no ties
    n_outputs: int = 1
    # which lists enter the mean: "pair" | "nonempty" | "both_classes" | "impressions" (every
    # non-empty list counts and the mean divides by the total impression weight, as BCE)
    counts: str = "pair"


def _ref_bce(logits, labels, mask, weights=None):
    per, counted, _ = R.ref_bce(logits, labels, mask, weights)
    return per, counted


SPECS = {
    "bce": Spec(L.bce_loss, _ref_bce, shift_invariant=False, counts="nonempty"),
    "ranknet": Spec(L.ranknet_loss, R.ref_ranknet),
    "ranknet_gain": Spec(partial(L.ranknet_loss, pair_weight="gain"),
                         partial(R.ref_ranknet, scheme="gain")),
    "hinge": Spec(L.hinge_loss, R.ref_hinge),
    "lambdarank": Spec(L.lambdarank_loss, partial(R.ref_ranknet, scheme="ndcg")),
    "lambdaloss": Spec(L.lambda_loss, R.ref_lambdaloss),
    "lambdaloss_ndcg2": Spec(partial(L.lambda_loss, scheme="ndcg2"),
                             partial(R.ref_lambdaloss, scheme="ndcg2")),
    "softmax": Spec(L.softmax_loss, R.ref_softmax),
    "listmle": Spec(L.listmle_loss, R.ref_listmle, distinct=True),
    "position_aware_listmle": Spec(L.position_aware_listmle_loss,
                                   partial(R.ref_listmle, position_aware=True), distinct=True),
    "approx_ndcg": Spec(L.approx_ndcg_loss, R.ref_approx_ndcg),
    "neural_ndcg": Spec(L.neural_ndcg_loss, R.ref_neural_ndcg),
    "neural_ndcg_k2": Spec(partial(L.neural_ndcg_loss, k=2), partial(R.ref_neural_ndcg, k=2)),
    "calibrated_softmax": Spec(L.calibrated_softmax_loss, R.ref_calibrated_softmax,
                               shift_invariant=False, counts="nonempty"),
    "rcr": Spec(L.rcr_loss, R.ref_rcr, shift_invariant=False),
    "calibrated_softmax_exp": Spec(partial(L.calibrated_softmax_loss, link="exp"),
                                   partial(R.ref_calibrated_softmax, link="exp"),
                                   shift_invariant=False, counts="nonempty"),
    "jrc": Spec(L.jrc_loss, R.ref_jrc, n_outputs=2, counts="impressions"),
    "jrc_opposite": Spec(partial(L.jrc_loss, opposite_only=True),
                         partial(R.ref_jrc, opposite_only=True), n_outputs=2,
                         counts="impressions"),
    "jrc_list": Spec(partial(L.jrc_loss, reduction_scope="list"), partial(R.ref_jrc, scope="list"),
                     n_outputs=2, counts="both_classes"),
    "jrc_opposite_list": Spec(partial(L.jrc_loss, opposite_only=True, reduction_scope="list"),
                              partial(R.ref_jrc, opposite_only=True, scope="list"), n_outputs=2,
                              counts="both_classes"),
}
NAMES = sorted(SPECS)
ALL = torch.ones(1, 2, dtype=torch.bool)


def _call(spec: Spec, b: Lists, reduction: str = "mean", weighted: bool = True, logits=None):
    return spec.fn(b.logits if logits is None else logits, b.labels, mask=b.mask,
                   weights=b.weights if weighted else None, reduction=reduction)


def _draw(spec: Spec, **kw):
    return padded_lists(distinct_labels=spec.distinct, n_outputs=spec.n_outputs, **kw)


def _close(a, b, tol=None):
    if tol is None:  # exact-ish in float64, float32 rounding otherwise
        f32 = any(isinstance(v, torch.Tensor) and v.dtype == torch.float32 for v in (a, b))
        tol = 2e-6 if f32 else 1e-9
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float64),
                               torch.as_tensor(b, dtype=torch.float64), rtol=tol, atol=tol)


# --- fixed numbers written as formulas -------------------------------------------------------


def test_fixed_numbers_pointwise():
    s, y = torch.tensor([[2.0, -1.0]]), torch.tensor([[1.0, 0.0]])
    want = (math.log1p(math.exp(-2.0)) + math.log1p(math.exp(-1.0))) / 2
    _close(L.bce_loss(s, y, mask=ALL), want)
    # scaled target: t = 1/2 for label 1 of label_max 2
    want = (0.5 * math.log1p(math.exp(-2.0)) + 0.5 * math.log1p(math.exp(2.0))
            + math.log1p(math.exp(-1.0))) / 2
    _close(L.bce_loss(s, y, mask=ALL, target="scaled", label_max=2.0), want)
    # weighted mean: sum w l / sum w
    w = torch.tensor([[3.0, 1.0]])
    want = (3 * math.log1p(math.exp(-2.0)) + math.log1p(math.exp(-1.0))) / 4
    _close(L.bce_loss(s, y, mask=ALL, weights=w), want)


def test_fixed_numbers_pairwise():
    s = torch.tensor([[1.0, 0.0, 3.0]])
    y = torch.tensor([[2.0, 1.0, 0.0]])
    m = torch.ones(1, 3, dtype=torch.bool)
    sp = lambda d: math.log1p(math.exp(-d))  # noqa: E731
    # pairs (0,1) d=1, (0,2) d=-2, (1,2) d=-3: mean over 3 pairs
    _close(L.ranknet_loss(s, y, mask=m), (sp(1) + sp(-2) + sp(-3)) / 3)
    _close(L.hinge_loss(s, y, mask=m), (0 + 3 + 4) / 3)
    # |Δgain| weights 2, 3, 1 with the pair-count denominator
    _close(L.ranknet_loss(s, y, mask=m, pair_weight="gain"), (2 * sp(1) + 3 * sp(-2) + sp(-3)) / 3)
    # two lists: mean over lists with a pair; the second list (all zeros) does not count
    s2 = torch.tensor([[2.0, 0.0], [5.0, 1.0]])
    y2 = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    _close(L.ranknet_loss(s2, y2, mask=torch.ones(2, 2, dtype=torch.bool)), sp(2))


def test_fixed_numbers_lambda_weights():
    # scores put the worse item first: ranks r = (2, 1); labels (1, 0); IDCG = 1
    s, y = torch.tensor([[0.0, 1.0]]), torch.tensor([[1.0, 0.0]])
    rho = abs(1 / math.log2(3) - 1.0)
    _close(L.lambdarank_loss(s, y, mask=ALL), rho * math.log1p(math.e))
    delta = abs(1.0 - 1 / math.log2(3))  # gap 1: 1/D(1) - 1/D(2)
    _close(L.lambda_loss(s, y, mask=ALL), (rho + 10 * delta) * math.log1p(math.e) / math.log(2))


def test_fixed_numbers_listwise():
    s = torch.tensor([[1.0, 0.0, -1.0]])
    y = torch.tensor([[1.0, 0.0, 1.0]])
    m = torch.ones(1, 3, dtype=torch.bool)
    lse = math.log(math.e + 1 + math.exp(-1))
    _close(L.softmax_loss(s, y, mask=m), -((1 - lse) + (-1 - lse)) / 2)
    # ListMLE with distinct labels (2, 1, 0) on scores (1, 0, -1): sorted order is storage order
    y3 = torch.tensor([[2.0, 1.0, 0.0]])
    t1, t2 = lse - 1.0, math.log(1 + math.exp(-1)) - 0.0
    _close(L.listmle_loss(s, y3, mask=m), t1 + t2)
    a = [7 / 11, 3 / 11, 1 / 11]  # 2^(n-k+1) - 1 for n = 3: 7, 3, 1
    _close(L.position_aware_listmle_loss(s, y3, mask=m), a[0] * t1 + a[1] * t2)
    # calibrated softmax: anchor score 0 with label 1, not divided by the label mass; the default
    # sigmoid link scores each item by u = log σ(s), the TF-Ranking link by u = s
    lse0 = math.log(1 + math.e + 1 + math.exp(-1))
    _close(L.calibrated_softmax_loss(s, y, mask=m, link="exp"),
           -((0 - lse0) + (1 - lse0) + (-1 - lse0)))
    u = [math.log(1 / (1 + math.exp(-v))) for v in (1.0, 0.0, -1.0)]
    lse_u = math.log(1 + sum(math.exp(v) for v in u))
    _close(L.calibrated_softmax_loss(s, y, mask=m), -((0 - lse_u) + (u[0] - lse_u) + (u[2] - lse_u)))
    # RCR: -(1/C) Σ y log(σ(s_i) / Σ σ)
    sig = [1 / (1 + math.exp(-v)) for v in (1.0, 0.0, -1.0)]
    want = -(math.log(sig[0] / sum(sig)) + math.log(sig[2] / sum(sig))) / 2
    _close(L.rcr_loss(s, y, mask=m), want)


def test_fixed_numbers_ndcg_family():
    s, y = torch.tensor([[0.0, 0.0]]), torch.tensor([[1.0, 0.0]])
    # equal scores: approx rank of each = 1 + σ(0) = 1.5; DCG = 1 / log2(2.5); IDCG = 1
    _close(L.approx_ndcg_loss(s, y, mask=ALL), 1 - 1 / math.log2(2.5))
    # NeuralSort of equal scores is uniform: soft gains 1/2 at both ranks
    _close(L.neural_ndcg_loss(s, y, mask=ALL), 1 - (0.5 + 0.5 / math.log2(3)))


def test_fixed_numbers_jrc():
    z = torch.tensor([[[0.0, 1.0], [0.5, -1.0], [0.0, 0.0]]])
    y = torch.tensor([[1.0, 0.0, 0.0]])
    m = torch.ones(1, 3, dtype=torch.bool)
    lse1 = math.log(math.e + math.exp(-1) + 1)
    lse0 = math.log(1 + math.exp(0.5) + 1)
    want = ((lse1 - 1.0) + (lse0 - 0.5) + (lse0 - 0.0)) / 3
    _close(L.jrc_loss(z, y, mask=m), want)
    # opposite only: the click competes with the two non-clicks, each non-click with the click
    opp = ((lse1 - 1.0) + (math.log(math.exp(0.5) + 1) - 0.5) + (math.log(2) - 0.0)) / 3
    _close(L.jrc_loss(z, y, mask=m, opposite_only=True), opp)


# --- brute-force loop references -------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
@settings(max_examples=25)
def test_matches_loop_reference(name, data):
    spec = SPECS[name]
    b = data.draw(_draw(spec, weighted=True))
    per, counted = spec.ref(b.logits, b.labels, b.mask, b.weights)
    got = _call(spec, b, "none")
    _close(got, R.reduce(per, counted, "none"), tol=1e-7)
    _close(_call(spec, b, "sum"), R.reduce(per, counted, "sum"), tol=1e-7)
    denom = None
    if name == "bce":
        denom = R.ref_bce(b.logits, b.labels, b.mask, b.weights)[2]
    elif spec.counts == "impressions":
        denom = R.ref_jrc_denominator(b.labels, b.mask, b.weights)
    _close(_call(spec, b, "mean"), R.reduce(per, counted, "mean", denom), tol=1e-7)


# --- hypothesis invariants -------------------------------------------------------------------


def _permute_rows(b: Lists, perms: list[list[int]]) -> Lists:
    logits, labels, weights = b.logits.clone(), b.labels.clone(), b.weights.clone()
    for g, p in enumerate(perms):
        idx = torch.tensor(p, dtype=torch.long)
        n = len(p)
        logits[g, :n], labels[g, :n], weights[g, :n] = b.logits[g, idx], b.labels[g, idx], \
            b.weights[g, idx]
    return Lists(logits, labels, b.mask, weights, b.lengths)


@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
@settings(max_examples=30)
def test_invariants(name, data):
    spec = SPECS[name]
    b = data.draw(_draw(spec, weighted=True))
    base = _call(spec, b, "none")
    assert torch.isfinite(base).all()
    # reduction="none" sums to reduction="sum"
    _close(base.sum(), _call(spec, b, "sum"))
    # masked == truncated: each list alone, without any padding, gives the same value
    for g, n in enumerate(b.lengths):
        if n > 0:
            _close(_call(spec, b.row(g), "none")[0], base[g])
    # extra padding (with garbage) changes nothing
    _close(_call(spec, b.pad_more(3, fill=-1e3), "none"), base)
    # permuting the real items of a list changes nothing
    perms = [data.draw(st.permutations(range(n))) for n in b.lengths]
    _close(_call(spec, _permute_rows(b, perms), "none"), base)
    # gradients are finite, and padding gets none
    logits = b.logits.clone().requires_grad_(True)
    _call(spec, b, "mean", logits=logits).backward()
    assert torch.isfinite(logits.grad).all()
    pad = ~b.mask
    assert (logits.grad[pad] == 0).all()


@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
@settings(max_examples=20)
def test_shift_per_list(name, data):
    """A per-list constant shift leaves pure ranking losses unchanged and moves the others."""
    spec = SPECS[name]
    b = data.draw(_draw(spec, min_len=2))
    shift = torch.tensor(data.draw(st.lists(st.sampled_from([-3.0, -1.5, 2.0, 4.0]),
                                            min_size=len(b.lengths), max_size=len(b.lengths))),
                         dtype=torch.float64)
    if spec.n_outputs == 2:
        both = b.logits + shift[:, None, None]  # shifting z0 and z1 alike: pCTR unchanged
        _close(_call(spec, b, "none", logits=both), _call(spec, b, "none"))
        moved = b.logits.clone()
        moved[..., 1] += shift[:, None]  # moves the click logit z1 - z0
    else:
        moved = b.logits + shift[:, None]
    base, after = _call(spec, b, "none"), _call(spec, b, "none", logits=moved)
    if spec.shift_invariant:
        _close(after, base)
    else:
        # lists that should move: counted, and (for RCR's sigmoid shares) not all scores equal
        real_s = torch.where(b.mask, b.logits, torch.nan)
        hi = torch.nan_to_num(real_s, nan=-1e9).amax(1)
        spread = hi > torch.nan_to_num(real_s, nan=1e9).amin(1)
        counted = _counted(spec, b) & (spread | (spec.counts == "nonempty"))
        if spec.n_outputs == 2:  # moving z1 alone moves L_gen only where both labels compete
            counted = _counted(replace(spec, counts="both_classes"), b)
        if counted.any():
            # one shift can land on the same value by symmetry (BCE of logits [0, -2] with labels
            # [0, 1] shifted by +2); a loss that moves with the level cannot equal itself at the
            # shift and at twice the shift too (convex in the shift for BCE; and in general)
            twice = moved + (moved - b.logits)
            after2 = _call(spec, b, "none", logits=twice)
            assert not (torch.allclose(after[counted], base[counted], rtol=1e-6, atol=1e-9)
                        and torch.allclose(after2[counted], base[counted], rtol=1e-6, atol=1e-9))


def _counted(spec: Spec, b: Lists) -> torch.Tensor:
    real = b.mask
    lab = torch.where(real, b.labels, torch.nan)
    two_labels = (torch.nan_to_num(lab, nan=-1e9).amax(1) > torch.nan_to_num(lab, nan=1e9).amin(1))
    if spec.counts in ("nonempty", "impressions"):
        return real.any(1)
    if spec.counts == "both_classes":
        click = (b.labels > 0) & real
        return click.any(1) & (real & ~click).any(1)
    return two_labels


@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
@settings(max_examples=20)
def test_mean_is_over_counted_lists(name, data):
    spec = SPECS[name]
    b = data.draw(_draw(spec))
    counted = _counted(spec, b)
    none = _call(spec, b, "none", weighted=False)
    assert (none[~counted] == 0).all()
    if spec.counts == "impressions":  # like BCE: a mean over every real impression
        want = none.sum() / b.mask.sum() if b.mask.any() else torch.tensor(0.0)
        _close(_call(spec, b, "mean", weighted=False), want)
    elif name != "bce":
        want = none.sum() / counted.sum() if counted.any() else torch.tensor(0.0)
        _close(_call(spec, b, "mean", weighted=False), want)


# --- the degenerate-case contract ------------------------------------------------------------


def _degenerate_batch(n_outputs: int):
    """Rows: fully masked, single positive item, no positive, all labels equal (positive)."""
    labels = torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [2.0, 2.0, 2.0]])
    mask = torch.tensor([[False] * 3, [True, False, False], [True] * 3, [True] * 3])
    shape = (4, 3, 2) if n_outputs == 2 else (4, 3)
    logits = torch.randn(shape, generator=torch.Generator().manual_seed(0)).requires_grad_(True)
    return logits, labels, mask


@pytest.mark.parametrize("name", NAMES)
def test_degenerate_contract(name):
    spec = SPECS[name]
    logits, labels, mask = _degenerate_batch(spec.n_outputs)
    none = spec.fn(logits, labels, mask=mask, reduction="none")
    assert torch.isfinite(none).all() and none[0] == 0
    if spec.counts == "nonempty":  # BCE and calibrated softmax learn from any real item
        assert (none[1:] > 0).all()
    elif spec.counts == "impressions":  # JRC over the batch: one-label lists compete within
        assert none[1] == 0  # a single impression competes with itself only
        per, counted = spec.ref(logits.detach(), labels, mask)
        _close(none, R.reduce(per, counted, "none"), tol=1e-6)
        total = spec.fn(logits, labels, mask=mask)
        total.backward()
        assert torch.isfinite(logits.grad).all()
    else:
        assert (none == 0).all()
        total = spec.fn(logits, labels, mask=mask)
        assert total.item() == 0.0
        total.backward()
        assert torch.isfinite(logits.grad).all() and (logits.grad == 0).all()
    # a fully masked batch is 0 with zero gradients for every loss
    empty = torch.zeros_like(mask)
    logits.grad = None
    total = spec.fn(logits, labels, mask=empty)
    assert total.item() == 0.0
    total.backward()
    assert (logits.grad == 0).all()
    # zero lists and zero-width lists
    z = torch.zeros((0, 3) + logits.shape[2:])
    assert spec.fn(z, torch.zeros(0, 3), mask=torch.zeros(0, 3, dtype=torch.bool)).item() == 0


@pytest.mark.parametrize("name", NAMES)
def test_extreme_logits_finite(name):
    spec = SPECS[name]
    labels = torch.tensor([[1.0, 0.0, 2.0, 0.0]])
    mask = torch.tensor([[True, True, True, False]])
    shape = (1, 4, 2) if spec.n_outputs == 2 else (1, 4)
    logits = (torch.tensor([1e4, -1e4, 3e3, float("nan")]).reshape(1, 4, *([1] * (len(shape) - 2)))
              .expand(shape).clone().requires_grad_(True))
    out = spec.fn(logits, labels, mask=mask)
    out.backward()
    assert torch.isfinite(out) and torch.isfinite(logits.grad).all()


# --- training and precision ------------------------------------------------------------------


def _toy_problem(seed: int = 0, g: int = 32, length: int = 8, d: int = 5):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(g, length, d, generator=gen)
    w_true = torch.randn(d, generator=gen)
    p = torch.sigmoid(x @ w_true - 1.0)
    y = (torch.rand(g, length, generator=gen) < p).float() + (p > 0.6).float()
    lengths = torch.randint(2, length + 1, (g,), generator=gen)
    mask = torch.arange(length)[None, :] < lengths[:, None]
    return x, y, mask


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_loss_decreases_on_learnable_problem(name):
    spec = SPECS[name]
    torch.manual_seed(0)
    x, y, mask = _toy_problem()
    model = torch.nn.Linear(x.shape[-1], spec.n_outputs)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)

    def loss_now():
        out = model(x)
        return spec.fn(out if spec.n_outputs == 2 else out.squeeze(-1), y, mask=mask)

    first = loss_now().item()
    for _ in range(60):
        opt.zero_grad()
        loss_now().backward()
        opt.step()
    assert loss_now().item() < 0.95 * first


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_autocast_finite(name, dtype):
    spec = SPECS[name]
    x, y, mask = _toy_problem(g=8)
    model = torch.nn.Linear(x.shape[-1], spec.n_outputs)
    with torch.autocast("cpu", dtype=dtype):
        out = model(x * 30.0)
        out = out if spec.n_outputs == 2 else out.squeeze(-1)
        assert out.dtype == dtype
        value = spec.fn(out, y, mask=mask)
    value.backward()
    assert torch.isfinite(value)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    # the half-precision padding fill itself is finite and loses nothing
    logits = torch.randn(3, 4, *([2] if spec.n_outputs == 2 else [])).to(dtype)
    lab = torch.tensor([[1.0, 0, 0, 0]] * 3)
    m = torch.tensor([[True, True, False, False]] * 3)
    assert torch.isfinite(spec.fn(logits, lab, mask=m))


# --- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_bad_input_raises(name):
    spec = SPECS[name]
    shape = (2, 3, 2) if spec.n_outputs == 2 else (2, 3)
    s, y, m = torch.zeros(shape), torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="mask"):
        spec.fn(s, y, mask=m.float())
    with pytest.raises(ValueError, match="labels"):
        spec.fn(s, y.long(), mask=m)
    with pytest.raises(ValueError, match="logits"):
        spec.fn(s.long(), y, mask=m)
    with pytest.raises(ValueError, match=r"logits shape \[2, 4"):
        spec.fn(torch.zeros((2, 4) + shape[2:]), y, mask=m)
    with pytest.raises(ValueError, match=r"mask shape \[2, 2\]"):
        spec.fn(s, y, mask=m[:, :2])
    with pytest.raises(ValueError, match="weights shape"):
        spec.fn(s, y, mask=m, weights=torch.ones(2, 2))
    with pytest.raises(ValueError, match="reduction"):
        spec.fn(s, y, mask=m, reduction="avg")


def test_jrc_needs_two_outputs():
    with pytest.raises(ValueError, match=r"JRC needs two logits.*\[G, L, 2\]"):
        L.jrc_loss(torch.zeros(2, 3), torch.zeros(2, 3), mask=torch.ones(2, 3, dtype=torch.bool))


def test_option_checks():
    s, y, m = torch.zeros(1, 2), torch.zeros(1, 2), ALL
    with pytest.raises(ValueError, match="pair_weight"):
        L.ranknet_loss(s, y, mask=m, pair_weight="ndgc")
    with pytest.raises(ValueError, match="gain"):
        L.approx_ndcg_loss(s, torch.tensor([[1.0, 0.0]]), mask=m, gain="log")
    with pytest.raises(ValueError, match="target"):
        L.bce_loss(s, y, mask=m, target="soft")


def test_listmle_tie_order_seed():
    """A seed fixes the tie order (deterministic, seed-dependent); None draws it from torch's
    global generator, so ``torch.manual_seed`` reproduces it."""
    s = torch.randn(6, 5, generator=torch.Generator().manual_seed(1))
    y = torch.tensor([[1.0, 1.0, 1.0, 0.0, 0.0]] * 6)
    m = torch.ones(6, 5, dtype=torch.bool)
    a = L.listmle_loss(s, y, mask=m, reduction="none", seed=0)
    _close(a, L.listmle_loss(s, y, mask=m, reduction="none", seed=0))
    draws = {tuple(L.listmle_loss(s, y, mask=m, reduction="none", seed=k).tolist())
             for k in range(8)}
    assert len(draws) > 1
    torch.manual_seed(5)
    b = L.listmle_loss(s, y, mask=m, reduction="none")
    torch.manual_seed(5)
    _close(b, L.listmle_loss(s, y, mask=m, reduction="none"))


def _mean_tie_gradients(fn, scores, labels, draws, seeded):
    """Per-draw gradients ``[draws, L]`` of ``fn`` at fixed scores, over random tie orders."""
    m = torch.ones_like(labels, dtype=torch.bool)
    grads = []
    torch.manual_seed(0)
    for k in range(draws):
        s = scores.clone().requires_grad_(True)
        fn(s, labels, mask=m, seed=k if seeded else None).backward()
        grads.append(s.grad[0])
    return torch.stack(grads)


@pytest.mark.parametrize("fn", [L.listmle_loss, L.position_aware_listmle_loss],
                         ids=["listmle", "position_aware_listmle"])
@pytest.mark.parametrize("seeded", [True, False], ids=["seeds", "global_rng"])
@pytest.mark.slow
def test_listmle_tie_gradient_is_symmetric(fn, seeded):
    """One click among six zero-labelled items, all scores equal: over random tie orders every
    non-click must get the same expected gradient, whatever its storage slot. (An arithmetic-
    progression tie hash gave about [-.16, -.06, .07, .26, .72]: the model learnt storage order.)"""
    labels = torch.tensor([[0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]])
    grads = _mean_tie_gradients(fn, torch.zeros(1, 7), labels, draws=1500, seeded=seeded)
    others = grads[:, labels[0] == 0]  # [draws, 6]
    mean, se = others.mean(0), others.std(0) / math.sqrt(others.shape[0])
    assert float((mean - mean.mean()).abs().max()) < 6 * float(se.max()) + 1e-3, mean.tolist()
    # shift invariance: the click's expected gradient balances the others
    assert float(grads.mean(0).sum().abs()) < 1e-5


@pytest.mark.parametrize("name", ["softmax", "listmle", "position_aware_listmle", "bce",
                                  "approx_ndcg", "calibrated_softmax"])
@pytest.mark.parametrize("weighted", [False, True])
def test_hand_written_backward_matches_finite_differences(name, weighted):
    """Softmax CE and ListMLE have analytic backwards, every loss masks through a custom
    function: torch.autograd.gradcheck compares them with finite differences in float64."""
    gen = torch.Generator().manual_seed(3)
    s = torch.randn(4, 6, dtype=torch.float64, generator=gen).requires_grad_(True)
    y = torch.randint(0, 3, (4, 6), generator=gen).double()
    m = torch.rand(4, 6, generator=gen) > 0.25
    w = torch.rand(4, 6, generator=gen, dtype=torch.float64) + 0.5 if weighted else None
    fn = SPECS[name].fn
    kw = {"seed": 1} if "listmle" in name else {}
    assert torch.autograd.gradcheck(
        lambda x: fn(x, y, mask=m, weights=w, reduction="none", **kw), (s,))


def _listmle_exact(s: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Float64 ListMLE of full lists with distinct labels, by ``logcumsumexp`` (exact)."""
    order = torch.argsort(y, dim=1, descending=True)
    ss = s.double().gather(1, order)
    tail = torch.logcumsumexp(ss.flip(1), dim=1).flip(1)
    return (tail - ss).sum(dim=1)


@pytest.mark.parametrize("scale", [1.0, 25.0, 300.0, 3000.0])
def test_listmle_at_any_score_scale(scale):
    """Exact (float32 rounding) while a list's scores span < ~180; beyond, each far term is
    within log L + 1 of the exact one and the gradient still orders the list correctly."""
    gen = torch.Generator().manual_seed(5)
    g, length = 64, 12
    s = (torch.randn(g, length, generator=gen) * scale).requires_grad_(True)
    y = torch.argsort(torch.rand(g, length, generator=gen), dim=1).float()  # distinct labels
    m = torch.ones(g, length, dtype=torch.bool)
    got = L.listmle_loss(s, y, mask=m, reduction="none")
    exact = _listmle_exact(s.detach(), y)
    spread = (s.detach().amax(1) - s.detach().amin(1)).double()
    near = spread < 170
    torch.testing.assert_close(got.double()[near], exact[near], rtol=2e-5, atol=2e-4)
    assert ((got.double() - exact).abs() <= length * (math.log(length) + 1.0) + 1e-3).all()
    got.sum().backward()
    assert torch.isfinite(s.grad).all()
    # a gradient step lowers the exact loss, at every scale
    with torch.no_grad():
        step = s - 1e-3 * scale * s.grad
    assert float(_listmle_exact(step, y).sum()) < float(exact.sum())


def test_tf_ranking_documented_examples():
    """The standalone examples of TF-Ranking's Keras losses (y_true [[1, 0]], y_pred [[0.6, 0.8]],
    and the ragged batch [[1, 0], [0, 1, 0]] / [[.6, .8], [.5, .8, .4]]), with the normalisation
    differences stated: TF-Ranking's pairwise losses sum the pairs and divide by the number of
    list slots (batch x list size, padding included), its ApproxNDCG loss is -NDCG."""
    s1, y1, m1 = torch.tensor([[0.6, 0.8]]), torch.tensor([[1.0, 0.0]]), ALL
    s2 = torch.tensor([[0.6, 0.8, 0.0], [0.5, 0.8, 0.4]])
    y2 = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    m2 = torch.tensor([[True, True, False], [True, True, True]])
    tol = 2e-6
    # CalibratedSoftmaxLoss(virtual_label=0.1): the exp link, anchor label 0.1
    _close(L.calibrated_softmax_loss(s1, y1, mask=m1, anchor_label=0.1, link="exp"), 1.1808171,
           tol)
    # SoftmaxLoss: per-list CE, mean over lists
    _close(L.softmax_loss(s1, y1, mask=m1), 0.7981389, tol)
    _close(L.softmax_loss(s2, y2, mask=m2), 0.83911896, tol)
    # ListMLELoss: no label tie in the first example; the ragged one has a tie between 0.5 and
    # 0.4, and TF's documented value is one of its two orders
    _close(L.listmle_loss(s1, y1, mask=m1), 0.7981389, tol)
    values = {round(float(L.listmle_loss(s2, y2, mask=m2, seed=k)), 5) for k in range(20)}
    assert round(1.1613163, 5) in values and len(values) == 2
    # PairwiseLogisticLoss / PairwiseHingeLoss: Σ pairs / (G x list size)
    for fn, one, ragged in [(L.ranknet_loss, 0.39906943, 0.3109182), (L.hinge_loss, 0.6, 0.41666666)]:
        _close(fn(s1, y1, mask=m1) / 2, one, tol)
        pair_sums = fn(s2, y2, mask=m2, reduction="none") * L.valid_pairs(y2, m2).sum((1, 2))
        _close(pair_sums.sum() / 6, ragged, tol)
    # ApproxNDCGLoss (temperature 0.1): -NDCG, ours 1 - NDCG
    _close(1 - L.approx_ndcg_loss(s1, y1, mask=m1), 0.655107, tol)
    _close(1 - L.approx_ndcg_loss(s2, y2, mask=m2), 0.80536866, tol)


def test_lambdarank_moves_tied_scores():
    """From a constant score the expected |ΔNDCG| over tie orders is not 0 (averaged ranks gave
    |Δ discount| = 0 and a zero gradient: a model started at a constant never moved)."""
    s = torch.zeros(2, 4, requires_grad=True)
    y = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 2.0, 1.0, 0.0]])
    L.lambdarank_loss(s, y, mask=torch.ones(2, 4, dtype=torch.bool)).backward()
    g = s.grad
    assert (g[0, 0] < 0).item() and (g[0, 1:] > 0).all()  # raise the click, lower the rest
    assert (g[1, 1] < g[1, 2]).item() and (g[1, 2] < g[1, 3]).item()
    # the closed form: a block of 4 tied items, E|d(p) - d(q)| over distinct positions p != q
    d = [1 / math.log2(1 + r) for r in range(1, 5)]
    gap = sum(abs(a - b) for a in d for b in d) / 12
    want = gap * math.log(2.0)  # |ΔG| = 1, softplus(0) = log 2, three pairs averaged
    _close(L.lambdarank_loss(s.detach()[:1], y[:1], mask=torch.ones(1, 4, dtype=torch.bool)),
           want, 1e-6)


@pytest.mark.parametrize("fn", [L.approx_ndcg_loss, L.neural_ndcg_loss], ids=["approx", "neural"])
def test_ndcg_losses_constant_weights_change_nothing(fn):
    """Weights scale each item's gain in the DCG *and* the ideal DCG: a constant weight is a
    no-op, and the loss stays in [0, 1] (scaling only the DCG made 1 - 3 NDCG negative)."""
    gen = torch.Generator().manual_seed(0)
    s = torch.randn(5, 6, generator=gen)
    y = torch.randint(0, 3, (5, 6), generator=gen).float()
    m = torch.ones(5, 6, dtype=torch.bool)
    base = fn(s, y, mask=m, reduction="none")
    _close(fn(s, y, mask=m, weights=torch.full((5, 6), 3.0), reduction="none"), base, 1e-6)
    w = torch.rand(5, 6, generator=gen) * 4
    weighted = fn(s, y, mask=m, weights=w, reduction="none")
    assert (weighted >= -1e-6).all() and (weighted <= 1 + 1e-6).all()


def _flat_sessions(seed: int, n: int = 80, ctr: float = 0.08):
    gen = torch.Generator().manual_seed(seed)
    session = torch.randint(0, 14, (n,), generator=gen)
    z = torch.randn(n, 2, generator=gen, dtype=torch.float64)
    clicks = (torch.rand(n, generator=gen) < ctr).long()
    return z, clicks, session


def _pad_sessions(z, clicks, session):
    ids = session.unique()
    width = max(int((session == i).sum()) for i in ids)
    logits = torch.zeros(len(ids), width, 2, dtype=z.dtype)
    labels = torch.zeros(len(ids), width, dtype=z.dtype)
    mask = torch.zeros(len(ids), width, dtype=torch.bool)
    for g, i in enumerate(ids):
        rows = torch.nonzero(session == i).squeeze(1)
        logits[g, :len(rows)], labels[g, :len(rows)] = z[rows], clicks[rows].to(z.dtype)
        mask[g, :len(rows)] = True
    return logits, labels, mask


@pytest.mark.parametrize("opposite_only", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_jrc_batch_scope_is_easyrec_averaging(seed, opposite_only):
    """The default averaging is the paper's and Alibaba EasyRec / TorchEasyRec's: L_gen over every
    impression of the batch (sessions without a click included), checked on a flat batch with
    session ids against the [B, B] same-session formulation, values and gradients."""
    z, clicks, session = _flat_sessions(seed)
    logits, labels, mask = _pad_sessions(z, clicks, session)
    ours_in = logits.clone().requires_grad_(True)
    ours = L.jrc_loss(ours_in, labels, mask=mask, opposite_only=opposite_only)
    theirs = R.ref_jrc_flat(z.tolist(), clicks.tolist(), session.tolist(), opposite_only)
    _close(ours, theirs, 1e-9)
    # gradient: the flat formulation written with torch ops, differentiated by autograd
    zf = z.clone().requires_grad_(True)
    n = len(clicks)
    pool = session[:, None] == session[None, :]  # [i, j]: j in i's session
    if opposite_only:
        pool &= torch.eye(n, dtype=torch.bool) | (clicks[None, :] != clicks[:, None])
    col = zf[:, clicks].T  # [i, j] = z_{c_i}(j)
    lse = torch.logsumexp(col.masked_fill(~pool, float("-inf")), dim=1)
    flat = (lse - zf[torch.arange(n), clicks]).mean()
    flat.backward()
    ours.backward()
    _close(flat, theirs, 1e-9)
    grad_padded = torch.zeros_like(z)
    for g, i in enumerate(session.unique()):
        rows = torch.nonzero(session == i).squeeze(1)
        grad_padded[rows] = ours_in.grad[g, :len(rows)]
    _close(grad_padded, zf.grad, 1e-9)
    # the "list" scope is a different average: per-list means over two-label lists
    listed = L.jrc_loss(logits, labels, mask=mask, opposite_only=opposite_only,
                        reduction_scope="list")
    assert abs(float(listed) - theirs) > 1e-3


# --- HybridLoss, click_logit, configs --------------------------------------------------------


def test_hybrid_parts_and_total():
    gen = torch.Generator().manual_seed(0)
    s = torch.randn(3, 4, generator=gen)
    y = torch.tensor([[1.0, 0, 0, 2], [0, 0, 0, 0], [1, 1, 0, 0]])
    m = torch.ones(3, 4, dtype=torch.bool)
    loss = L.HybridLoss(0.3, "scaled", 2, terms={
        "softmax": {"weight": 0.5},
        "pairs": {"loss": "ranknet", "weight": 0.2, "options": {"pair_weight": "gain"}},
    })
    total, parts = loss(s, y, mask=m)
    point = L.bce_loss(s, y, mask=m, target="scaled", label_max=2)
    soft = L.softmax_loss(s, y, mask=m)
    pairs = L.ranknet_loss(s, y, mask=m, pair_weight="gain")
    _close(total, 0.3 * point + 0.5 * soft + 0.2 * pairs, tol=1e-6)
    assert set(parts) == {"point", "rank", "softmax", "pairs"}
    _close(parts["rank"], 0.5 * soft + 0.2 * pairs, tol=1e-6)
    assert all(not v.requires_grad and v.dim() == 0 for v in parts.values())
    assert loss.n_outputs == 1


def test_hybrid_jrc_uses_click_logit_everywhere():
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(3, 4, 2, generator=gen)
    y = torch.tensor([[1.0, 0, 0, 1], [0, 0, 0, 0], [1, 0, 0, 0]])
    m = torch.ones(3, 4, dtype=torch.bool)
    loss = L.HybridLoss(0.5, terms={"jrc": {"weight": 0.5}, "softmax": {"weight": 0.1}})
    assert loss.n_outputs == 2
    total, parts = loss(z, y, mask=m)
    d = L.click_logit(z)
    _close(d, z[..., 1] - z[..., 0])
    want = (0.5 * L.bce_loss(d, y, mask=m) + 0.5 * L.jrc_loss(z, y, mask=m)
            + 0.1 * L.softmax_loss(d, y, mask=m))
    _close(total, want, tol=1e-6)
    with pytest.raises(ValueError, match=r"JRC needs two logits.*\[3, 4\]"):
        loss(d, y, mask=m)
    with pytest.raises(ValueError, match="n_outputs=1"):
        L.HybridLoss()(z, y, mask=m)


def test_click_logit_layouts():
    out = torch.randn(2, 3, 2)
    _close(L.click_logit(out), out[..., 1] - out[..., 0])
    _close(L.click_logit(out[..., :1]), out[..., 0])
    _close(L.click_logit(out[..., 0]), out[..., 0])  # plain [G, L], even with L = 2 below
    _close(L.click_logit(out[:, :2, 0]), out[:, :2, 0])
    flat = torch.randn(5, 2)
    _close(L.click_logit(flat, n_outputs=2), flat[:, 1] - flat[:, 0])
    _close(L.click_logit(flat[:, :1], n_outputs=1), flat[:, 0])


def test_hybrid_trailing_one_output():
    s = torch.randn(2, 3, 1)
    y, m = torch.tensor([[1.0, 0, 0], [0, 1, 0]]), torch.ones(2, 3, dtype=torch.bool)
    total, _ = L.HybridLoss(terms={"softmax": {}})(s, y, mask=m)
    _close(total, L.bce_loss(s[..., 0], y, mask=m) + L.softmax_loss(s[..., 0], y, mask=m))


def test_hybrid_rejects_bad_config():
    with pytest.raises(ValueError, match="unknown loss 'softmx'"):
        L.HybridLoss(terms={"softmx": {}})
    with pytest.raises(ValueError, match=r"unknown keys \['wieght'\]"):
        L.HybridLoss(terms={"softmax": {"wieght": 1.0}})
    with pytest.raises(ValueError, match="has no option"):
        L.HybridLoss(terms={"ranknet": {"options": {"margin": 1.0}}})
    with pytest.raises(ValueError, match="reserved"):
        L.HybridLoss(terms={"rank": {"loss": "softmax"}})
    with pytest.raises(ValueError, match="point_target"):
        L.HybridLoss(point_target="soft")
    with pytest.raises(ValueError, match="label_max"):
        L.HybridLoss(label_max=0)


@pytest.mark.parametrize("check", ["first", "always"])
def test_hybrid_rejects_bad_labels(check):
    s, m = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)
    for bad, what in [(3.0, "label_max=2"), (-1.0, "label_max=2"), (float("nan"), "nan")]:
        y = torch.tensor([[1.0, 0.0, bad], [0.0, 2.0, 0.0]])
        with pytest.raises(ValueError, match=what):
            L.HybridLoss(label_max=2, check_labels=check)(s, y, mask=m)
    # out-of-range labels on padding are fine
    y = torch.tensor([[1.0, 0.0, 9.0], [0.0, 2.0, float("nan")]])
    pad = torch.tensor([[True, True, False], [True, True, False]])
    total, _ = L.HybridLoss(label_max=2, check_labels=check)(s, y, mask=pad)
    assert torch.isfinite(total)
    # "first" checks once; "always" on every call
    loss = L.HybridLoss(label_max=2, check_labels=check)
    loss(s, torch.zeros(2, 3), mask=m)
    y = torch.tensor([[1.0, 0.0, 5.0], [0.0, 2.0, 0.0]])
    if check == "always":
        with pytest.raises(ValueError):
            loss(s, y, mask=m)
    else:
        loss(s, y, mask=m)


def test_hybrid_zero_point_weight_and_nothing_to_learn():
    s = torch.zeros(2, 3, requires_grad=True)
    y, m = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)
    total, parts = L.HybridLoss(0.0, terms={"ranknet": {}, "softmax": {}})(s, y, mask=m)
    assert total.item() == 0.0 and parts["point"] > 0
    total.backward()
    assert (s.grad == 0).all()


#: the loss configs proper (the others are deprecated old names of these, tests/test_configs.py)
LOSS_CONFIGS = sorted(CONF.glob("*.yaml"))


@pytest.mark.parametrize("path", LOSS_CONFIGS, ids=lambda p: p.stem)
def test_yaml_configs_instantiate(path):
    hydra_utils = pytest.importorskip("hydra.utils")
    omegaconf = pytest.importorskip("omegaconf")
    node = omegaconf.OmegaConf.load(path)
    cfg = omegaconf.OmegaConf.create({"data": {"source": {"label_max": 2}}, "loss": node})
    assert cfg.loss._target_ == "hybridrank.losses.HybridLoss"
    loss = hydra_utils.instantiate(cfg.loss)
    assert isinstance(loss, L.HybridLoss) and loss.label_max == 2
    shape = (2, 4, 2) if loss.n_outputs == 2 else (2, 4)
    s = torch.randn(shape, requires_grad=True)
    y = torch.tensor([[2.0, 0, 1, 0], [0, 0, 1, 0]])
    total, parts = loss(s, y, mask=torch.ones(2, 4, dtype=torch.bool))
    total.backward()
    assert torch.isfinite(total) and {"point", "rank"} <= set(parts)


def test_yaml_configs_present():
    """conf/loss and the loss registry match in both directions. Every ranking term of
    ``LOSSES`` has its hybrid config: ``bce_<term>`` (BCE plus that term), or ``<term>`` itself for
    RCR and JRC, hybrids by definition. Every config is one of: ``bce`` (BCE alone), the hybrid of
    one registry term, or one registry term alone (``point_weight: 0``, named after the term)."""
    omegaconf = pytest.importorskip("omegaconf")
    assert {"bce", "softmax", "bce_softmax", "bce_calibrated_softmax", "rcr", "jrc"} <= {
        p.stem for p in LOSS_CONFIGS}
    held = {}  # config name -> (point weight, the registry names of its terms)
    for path in LOSS_CONFIGS:
        node = omegaconf.OmegaConf.load(path)
        held[path.stem] = (float(node.point_weight),
                           [str(term.get("loss", name)) for name, term in node.terms.items()])
    hybrid = {kind: kind if kind in ("rcr", "jrc") else f"bce_{kind}" for kind in L.LOSSES}
    for kind, name in hybrid.items():  # registry -> configs
        assert name in held, f"LOSSES[{kind!r}] has no config: conf/loss/{name}.yaml is missing"
        assert held[name][1] == [kind] and held[name][0] > 0, (name, held[name])
    for name, (point_weight, kinds) in held.items():  # configs -> registry
        if name == "bce":
            assert (point_weight, kinds) == (1.0, []), held[name]
        elif point_weight == 0:
            assert kinds == [name] and name in L.LOSSES, f"{name}: a pure ranking config {kinds}"
        else:
            assert len(kinds) == 1 and hybrid.get(kinds[0]) == name, (
                f"conf/loss/{name}.yaml ({kinds}) is no registry term's hybrid")


def test_loss_config_names_say_what_they_hold():
    """A config adding BCE to a ranking term that is not a hybrid by itself is named bce_<term>
    (``softmax`` is the pure ranking loss, ``bce_softmax`` the hybrid); RCR and JRC are hybrids
    by definition (Bai et al. 2023, Sheng et al. 2023). Term names are registry keys."""
    omegaconf = pytest.importorskip("omegaconf")
    for path in LOSS_CONFIGS:
        node = omegaconf.OmegaConf.load(path)
        terms = dict(node.terms)
        for name, term in terms.items():
            assert term.get("loss", name) in L.LOSSES, (path.stem, name)
        if not terms:
            assert path.stem == "bce" and node.point_weight == 1.0
        elif node.point_weight == 0:
            assert path.stem == next(iter(terms)), path.stem  # a pure ranking loss: its term's name
        elif path.stem not in ("rcr", "jrc"):
            assert path.stem == "bce_" + "_".join(terms), path.stem


def test_rank_reduction_per_impression_matches_a_reference_and_balances_the_pull():
    """``rank_reduction="impressions"``: each ranking term is its sum over lists divided by BCE's
    denominator (the impression weight). Against a hand-built reference, with and without
    weights; and on a sparse-click batch the softmax term's pull on the logits (L1 of the
    gradient) drops from ~1 / CTR times BCE's to at most BCE's."""
    g = torch.Generator().manual_seed(0)
    s = torch.randn(40, 12, generator=g)
    y = (torch.rand(40, 12, generator=g) < 0.03).float()
    m = torch.rand(40, 12, generator=g) < 0.9
    w = torch.rand(40, 12, generator=g) + 0.5
    for weights in (None, w):
        loss = L.HybridLoss(0.5, terms={"softmax": {"weight": 0.5}, "ranknet": {"weight": 0.25}},
                            rank_reduction="impressions")
        total, parts = loss(s, y, mask=m, weights=weights)
        denom = (m if weights is None else weights * m).sum()
        ref_soft = L.softmax_loss(s, y, mask=m, weights=weights, reduction="sum") / denom
        ref_pair = L.ranknet_loss(s, y, mask=m, weights=weights, reduction="sum") / denom
        ref = 0.5 * L.bce_loss(s, y, mask=m, weights=weights) + 0.5 * ref_soft + 0.25 * ref_pair
        assert torch.allclose(total, ref, rtol=1e-5), (total, ref)
        assert torch.allclose(parts["softmax"], ref_soft, rtol=1e-5)

    near = math.log(0.03 / 0.97) + 0.3 * s  # logits near the click rate, as in training

    def pull(term_loss):
        x = near.clone().requires_grad_()
        term_loss(x).backward()
        return float(x.grad.abs().sum())

    bce = pull(lambda x: L.bce_loss(x, y, mask=m))
    by_list = pull(lambda x: L.HybridLoss(0.0, terms={"softmax": {}})(x, y, mask=m)[0])
    by_imp = pull(lambda x: L.HybridLoss(0.0, terms={"softmax": {}}, rank_reduction="impressions")(x, y, mask=m)[0])
    assert by_list > 5 * bce and by_imp <= bce, (bce, by_list, by_imp)
    empty = L.HybridLoss(0.5, terms={"softmax": {}}, rank_reduction="impressions")
    total, _ = empty(s, y, mask=torch.zeros_like(m))
    assert total.item() == 0.0
    with pytest.raises(ValueError, match="rank_reduction"):
        L.HybridLoss(0.5, rank_reduction="queries")
