"""Scorers: shapes, base-rate start, loop references, list-aware invariants, export parity, and
planted interactions that each scorer learns where an additive (or per-impression) model cannot."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridrank.models.attention import list_layout
from hybridrank.models.scorers import DCNv2Scorer, DeepFMScorer, FMScorer, LinearScorer, ListAwareScorer, MLPScorer

pytestmark = pytest.mark.usefixtures("one_thread")  # small tensors: tests/conftest.py


# Small options so that every test stays fast; the defaults are exercised by test_default_options.
SCORERS = {
    "mlp": (MLPScorer, dict(hidden=(16,), emb_dim=4)),
    "linear": (LinearScorer, {}),
    "fm": (FMScorer, dict(emb_dim=4)),
    "deepfm": (DeepFMScorer, dict(emb_dim=4, hidden=(16,))),
    "dcn_parallel": (DCNv2Scorer, dict(n_cross=2, hidden=(16,), emb_dim=4)),
    "dcn_stacked_lowrank": (DCNv2Scorer, dict(n_cross=2, low_rank=3, structure="stacked", hidden=(16,),
                                              emb_dim=4)),
    "dcn_cross_only": (DCNv2Scorer, dict(n_cross=2, hidden=(), emb_dim=4)),
    "list_aware": (ListAwareScorer, dict(d_model=8, n_heads=2, n_layers=2, ffn_dim=16, hidden=(16,),
                                         emb_dim=4)),
}
NEW = ["fm", "deepfm", "dcn_parallel", "dcn_stacked_lowrank", "dcn_cross_only", "list_aware"]
VOCAB = [6, 9]


def build(name: str, n_numeric: int = 3, vocab=VOCAB, n_outputs: int = 1, **extra):
    cls, opts = SCORERS[name]
    return cls(n_numeric=n_numeric, vocab_sizes=vocab, n_outputs=n_outputs, **{**opts, **extra})


def batch(lengths, n_numeric: int = 3, vocab=VOCAB, seed: int = 0):
    """Flat batch of lists of the given lengths: ``num [B, F]``, ``cat [B, C]`` (OOV code 0 included),
    ``request [B]`` (ids 0..G-1, non-decreasing)."""
    g = torch.Generator().manual_seed(seed)
    b = int(sum(lengths))
    num = torch.randn(b, n_numeric, generator=g)
    cat = torch.stack([torch.randint(0, v + 1, (b,), generator=g) for v in vocab], 1) if vocab else \
        torch.zeros(b, 0, dtype=torch.long)
    request = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths, dtype=torch.long))
    return num, cat, request


def randomize(model: torch.nn.Module, seed: int = 0, scale: float = 0.5) -> torch.nn.Module:
    """Every parameter drawn afresh, so that zero-initialized output layers do not hide anything."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(scale * torch.randn(p.shape, generator=g))
    return model.eval()


def click_logit(out: torch.Tensor) -> torch.Tensor:
    return out[:, 1] - out[:, 0] if out.shape[1] == 2 else out[:, 0]


# --- shapes and construction ---------------------------------------------------------------------
@pytest.mark.parametrize("name", list(SCORERS))
@pytest.mark.parametrize("n_outputs", [1, 2])
@pytest.mark.parametrize("n_numeric,vocab", [(3, VOCAB), (0, VOCAB), (3, []), (1, [4])])
def test_shapes_and_attributes(name, n_outputs, n_numeric, vocab):
    model = randomize(build(name, n_numeric, vocab, n_outputs))
    num, cat, request = batch([3, 1, 5], n_numeric, vocab)
    out = model(num, cat, request)
    assert out.shape == (9, n_outputs) and out.dtype == torch.float32
    assert torch.isfinite(out).all()
    assert out[:, -1].std() > 0  # the inputs do reach the output
    assert model.n_numeric == n_numeric and tuple(model.vocab_sizes) == tuple(vocab)
    assert model.n_outputs == n_outputs and model.list_aware == (name == "list_aware")
    out.sum().backward()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("name", list(SCORERS))
def test_empty_batch(name):
    model = build(name, n_outputs=2)
    num, cat, request = batch([], 3, VOCAB)
    assert model(num, cat, request).shape == (0, 2)


@pytest.mark.parametrize("name", list(SCORERS))
def test_refuses_no_input_and_bad_n_outputs(name):
    with pytest.raises(ValueError, match="no input"):
        build(name, 0, [])
    with pytest.raises(ValueError, match="n_outputs"):
        build(name, n_outputs=3)


def test_bad_options_refused():
    with pytest.raises(ValueError, match="structure"):
        DCNv2Scorer(3, structure="both")
    with pytest.raises(ValueError, match="low_rank"):
        DCNv2Scorer(3, low_rank=0)
    with pytest.raises(ValueError, match="divisible"):
        ListAwareScorer(3, d_model=10, n_heads=4)
    with pytest.raises(ValueError, match="length_bounds"):
        ListAwareScorer(3, length_bounds=(8, 4))


@pytest.mark.parametrize("cls", [FMScorer, DeepFMScorer, DCNv2Scorer, ListAwareScorer])
def test_default_options(cls):
    """The defaults the configs will use build and run on a realistic click-log schema."""
    model = cls(n_numeric=5, vocab_sizes=[2500, 1000, 20], base_rate=0.03)
    num, cat, request = batch([4, 20, 7], 5, [2500, 1000, 20])
    out = model(num, cat, request)
    assert out.shape == (31, 1) and torch.isfinite(out).all()


# --- base-rate start ----------------------------------------------------------------------------
def fm_pairwise(model: DeepFMScorer, num: torch.Tensor, cat: torch.Tensor) -> torch.Tensor:
    """Brute-force ``sum_{f < f'} <e_f, e_f'>`` over every pair of fields, row by row ``[B]``."""
    out = []
    for r in range(num.shape[0]):
        fields = [num[r, j] * model.fields.numeric[j] for j in range(model.n_numeric)]
        fields += [t.weight[cat[r, j]] for j, t in enumerate(model.fields.tables)]
        out.append(sum((fields[a] * fields[b]).sum() for a in range(len(fields))
                       for b in range(a + 1, len(fields))))
    return torch.stack(out)


@pytest.mark.parametrize("name", list(SCORERS))
@pytest.mark.parametrize("n_outputs", [1, 2])
@pytest.mark.parametrize("rate", [0.003, 0.1, 0.6])
def test_base_rate_start(name, n_outputs, rate):
    """sigma(click logit) starts at the base rate: exactly for the zero-initialized output layers
    (DCN-v2, list-aware), up to the brute-force pairwise term for (Deep)FM, on average (of the
    logit) for the MLP and linear scorers, whose output weights are random."""
    torch.manual_seed(0)
    model = build(name, 5, [30, 1000, 7], n_outputs, base_rate=rate).eval()
    num, cat, request = batch([10] * 30, 5, [30, 1000, 7])
    with torch.no_grad():
        z = click_logit(model(num, cat, request))
    target = math.log(rate / (1 - rate))
    if name.startswith("dcn") or name == "list_aware":
        torch.testing.assert_close(z, torch.full_like(z, target), atol=1e-6, rtol=0)
    elif name in ("fm", "deepfm"):
        with torch.no_grad():
            pair = fm_pairwise(model, num, cat)
        torch.testing.assert_close(z - target, pair, atol=1e-6, rtol=0)
        assert pair.abs().max() < 0.01
    else:  # random output weights: the bias is exact, the logits scatter around it
        assert abs(click_logit(model.head.bias[None]).item() - target) < 1e-6
        assert abs(z.mean().item() - target) < 0.5


# --- FM / DCN-v2 against explicit formulas -----------------------------------------------------------
@pytest.mark.parametrize("n_outputs", [1, 2])
@pytest.mark.parametrize("n_numeric,vocab", [(3, VOCAB), (0, [4, 5, 6]), (4, [])])
def test_fm_matches_brute_force(n_outputs, n_numeric, vocab):
    """z_o = b_o + first-order + sum_{f<f'} sum_k a_ok e_fk e_f'k, every pair enumerated."""
    model = randomize(build("fm", n_numeric, vocab, n_outputs))
    num, cat, _ = batch([7], n_numeric, vocab, seed=3)
    with torch.no_grad():
        got = model(num, cat)
        a, bias = model.fm_head.weight, model.fm_head.bias
        for r in range(num.shape[0]):
            fields = [num[r, j] * model.fields.numeric[j] for j in range(n_numeric)]
            fields += [t.weight[cat[r, j]] for j, t in enumerate(model.fields.tables)]
            for o in range(n_outputs):
                z = bias[o].clone()
                if n_numeric:
                    z += sum(model.first_num.weight[o, j] * num[r, j] for j in range(n_numeric))
                z += sum(t.weight[cat[r, j], o] for j, t in enumerate(model.first_cat))
                z += sum((a[o] * fields[i] * fields[k]).sum() for i in range(len(fields))
                         for k in range(i + 1, len(fields)))
                torch.testing.assert_close(got[r, o], z, atol=1e-5, rtol=1e-5)


def test_dcn_cross_layer_formula_and_low_rank():
    """A full-rank cross network whose W_l = U_l V_l^T equals the low-rank network with U_l, V_l,
    and one layer is x0 * (W x0 + b) + x0 written out."""
    low = randomize(DCNv2Scorer(3, VOCAB, n_cross=2, low_rank=2, hidden=(), emb_dim=4))
    full = DCNv2Scorer(3, VOCAB, n_cross=2, hidden=(), emb_dim=4).eval()
    with torch.no_grad():
        full.embeddings.load_state_dict(low.embeddings.state_dict())
        full.head.load_state_dict(low.head.state_dict())
        for lf, ll in zip(full.cross, low.cross):
            lf.w.weight.copy_(ll.w[1].weight @ ll.w[0].weight)
            lf.w.bias.copy_(ll.w[1].bias)
    num, cat, _ = batch([9], 3, VOCAB)
    torch.testing.assert_close(full(num, cat), low(num, cat), atol=1e-5, rtol=1e-5)
    one = randomize(DCNv2Scorer(3, VOCAB, n_cross=1, hidden=(), emb_dim=4))
    with torch.no_grad():
        x0 = torch.cat([num, one.embeddings(cat)], 1)
        w, b = one.cross[0].w.weight, one.cross[0].w.bias
        x1 = torch.stack([torch.stack([x0[r, i] * (sum(w[i, j] * x0[r, j] for j in range(x0.shape[1])) + b[i])
                                       + x0[r, i] for i in range(x0.shape[1])]) for r in range(x0.shape[0])])
        torch.testing.assert_close(one(num, cat), one.head(x1), atol=1e-5, rtol=1e-5)


# --- the list-aware scorer ------------------------------------------------------------------------
def reference_list_aware(model: ListAwareScorer, num, cat, request) -> torch.Tensor:
    """Loop reference: each list on its own, attention written out head by head, no padding."""
    h_all = model.encoder(torch.cat([num, model.embeddings(cat)], 1))
    outs = []
    for rid in torch.unique_consecutive(request):
        h = h_all[request == rid]
        for blk in model.blocks:
            q, k, v = blk.qkv(blk.norm1(h)).chunk(3, dim=1)
            heads = []
            for i in range(blk.n_heads):
                sl = slice(i * blk.d_head, (i + 1) * blk.d_head)
                w = torch.softmax(q[:, sl] @ k[:, sl].T / math.sqrt(blk.d_head), dim=1)
                heads.append(w @ v[:, sl])
            h = h + blk.proj(torch.cat(heads, 1))
            h = h + blk.ffn(blk.norm2(h))
        outs.append(model.head(model.norm(h)))
    return torch.cat(outs)


list_lengths = st.lists(st.integers(1, 12), min_size=1, max_size=6)
BOUNDS = st.sampled_from([(8, 32, 128, 512), (), (1,), (2, 3, 5)])


@settings(max_examples=25)
@given(lengths=list_lengths, bounds=BOUNDS, seed=st.integers(0, 2**16))
def test_list_aware_matches_loop_reference(lengths, bounds, seed):
    model = randomize(build("list_aware", n_outputs=2, length_bounds=bounds), seed)
    num, cat, request = batch(lengths, seed=seed)
    with torch.no_grad():
        torch.testing.assert_close(model(num, cat, request), reference_list_aware(model, num, cat, request),
                                   atol=1e-5, rtol=1e-5)


@settings(max_examples=25)
@given(lengths=list_lengths, data=st.data())
def test_list_aware_permutation_within_list(lengths, data):
    """Permuting the impressions of one list permutes their outputs, and nothing else moves."""
    model = randomize(build("list_aware"))
    num, cat, request = batch(lengths)
    g = data.draw(st.integers(0, len(lengths) - 1))
    start = sum(lengths[:g])
    perm = data.draw(st.permutations(range(lengths[g])))
    order = torch.arange(num.shape[0])
    order[start:start + lengths[g]] = start + torch.tensor(perm, dtype=torch.long)
    with torch.no_grad():
        out, out_p = model(num, cat, request), model(num[order], cat[order], request)
    torch.testing.assert_close(out_p, out[order], atol=1e-5, rtol=1e-5)


@settings(max_examples=25)
@given(lengths=list_lengths, others=st.lists(st.integers(1, 40), max_size=4), bounds=BOUNDS, data=st.data())
def test_list_aware_other_lists_and_padding_change_nothing(lengths, others, bounds, data):
    """A list scored alone, or next to other lists (longer ones pad it more; their features may be
    huge or NaN), gets the same outputs."""
    model = randomize(build("list_aware", length_bounds=bounds))
    num, cat, request = batch(lengths)
    g = data.draw(st.integers(0, len(lengths) - 1))
    rows = request == g
    with torch.no_grad():
        alone = model(num[rows], cat[rows], request[rows])
        together = model(num, cat, request)[rows]
        torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)
        # more lists around it, with garbage features
        o_num, o_cat, o_req = batch(others, seed=1)
        o_num[::2] = 1e6
        o_num[1::3] = float("nan")
        where = data.draw(st.sampled_from(["before", "after"]))
        parts = [(o_num, o_cat, o_req + (-100 if where == "before" else 100)), (num[rows], cat[rows], request[rows])]
        if where == "after":
            parts.reverse()
        big = [torch.cat(t) for t in zip(*parts)]
        mine = big[2] == g
        torch.testing.assert_close(model(*big)[mine], alone, atol=1e-5, rtol=1e-5)


def test_list_aware_output_depends_on_its_list_only():
    model = randomize(build("list_aware"))
    num, cat, request = batch([4, 5])
    with torch.no_grad():
        out = model(num, cat, request)
        changed = num.clone()
        changed[1] += 2.0  # another impression of list 0
        out2 = model(changed, cat, request)
        assert (out2[[0, 2, 3]] - out[[0, 2, 3]]).abs().min() > 1e-4
        torch.testing.assert_close(out2[4:], out[4:])  # list 1 untouched
        # the same impression in two different lists scores differently
        a = model(num[[0, 1]], cat[[0, 1]], torch.tensor([0, 0]))
        b = model(num[[0, 2]], cat[[0, 2]], torch.tensor([0, 0]))
        assert (a[0] - b[0]).abs().max() > 1e-4


@settings(max_examples=25)
@given(lengths=st.lists(st.integers(1, 50), min_size=1, max_size=10), ids=st.data(),
       bounds=BOUNDS, skip_empty=st.booleans())
def test_layout_covers_every_row_once(lengths, ids, bounds, skip_empty):
    """Each row sits in one slot, among the rows of its own list only, ``back`` finds it, and each
    list lies in the block its length calls for (plus one dummy list per block)."""
    request = torch.repeat_interleave(torch.tensor(sorted(ids.draw(st.lists(
        st.integers(-1000, 1000), min_size=len(lengths), max_size=len(lengths), unique=True)))),
        torch.tensor(lengths))
    srcs, masks, back = list_layout(request, bounds, skip_empty=skip_empty)
    flat_src = torch.cat([s.flatten() for s in srcs])
    flat_mask = torch.cat([m.flatten() for m in masks])
    assert torch.equal(flat_src[back], torch.arange(request.numel()))
    assert flat_mask[back].all()
    edges = [0, *bounds, math.inf]
    blocks = [[n for n in lengths if lo < n <= hi] for lo, hi in zip(edges[:-1], edges[1:])]
    if skip_empty:
        blocks = [b for b in blocks if b]
    assert len(srcs) == len(blocks)
    for s, m, want in zip(srcs, masks, blocks):
        assert s.shape == m.shape == (len(want) + 1, max(want, default=1))
        assert [int(r.sum()) for r in m] == [*want, 1]  # the lists in order, then the dummy
        assert s[-1].eq(0).all()
        for row_s, row_m in zip(s, m):  # one list per row, padding repeats its own first row
            assert (request[row_s] == request[row_s[0]]).all() and row_m[: int(row_m.sum())].all()


def test_blocks_and_one_block_agree_on_skewed_lists():
    """One long list among many short ones: the blocked layout equals one block padded to 120."""
    lengths = [1, 2, 3] * 20 + [120] + [5] * 10 + [20]
    model = randomize(build("list_aware", n_outputs=2))
    num, cat, request = batch(lengths)
    assert len(list_layout(request, model.length_bounds, skip_empty=True)[0]) == 3
    with torch.no_grad():
        blocked = model(num, cat, request)
        model.length_bounds = ()
        single = model(num, cat, request)
    torch.testing.assert_close(blocked, single, atol=1e-5, rtol=1e-5)


def test_list_aware_refuses_bad_request():
    model = build("list_aware")
    num, cat, request = batch([2, 3])
    with pytest.raises(ValueError, match="list-aware"):
        model(num, cat)
    with pytest.raises(ValueError, match="shape"):
        model(num, cat, request[:-1])
    with pytest.raises(ValueError, match="integer"):
        model(num, cat, request.float())
    with pytest.raises(ValueError, match="adjacent"):
        model(num, cat, torch.tensor([0, 1, 0, 1, 1]))
    model(num, cat, torch.tensor([5, 5, -2, -2, -2]))  # adjacent runs, any ids: fine


# --- export parity -------------------------------------------------------------------------------
def export_both(model, example, path):
    names = ["num", "cat", "request"] if model.list_aware else ["num", "cat"]
    example = example[: len(names)]
    axes = {n: {0: "batch"} for n in [*names, "out"]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(model, example, check_trace=False)
        torch.jit.save(traced, str(path / "m.pt"))
        torch.onnx.export(model, example, str(path / "m.onnx"), input_names=names, output_names=["out"],
                          dynamic_axes=axes, opset_version=17, dynamo=False)
    import onnxruntime as ort

    return torch.jit.load(str(path / "m.pt")), ort.InferenceSession(str(path / "m.onnx")), names


STRUCTURES = [[1], [2] * 10, [40], [1, 17, 3, 1, 8], [6, 6, 6], [2, 600, 9]]


@pytest.mark.slow
@pytest.mark.parametrize("name", NEW + ["mlp"])
@pytest.mark.parametrize("n_outputs", [1, 2])
@pytest.mark.parametrize("n_numeric,vocab", [(3, VOCAB), (4, []), (0, VOCAB)])
def test_export_parity(name, n_outputs, n_numeric, vocab, tmp_path):
    """TorchScript and ONNX reproduce PyTorch on batches whose size and list structure differ from
    the export example (3 lists of 3, 1, 5 rows)."""
    model = randomize(build(name, n_numeric, vocab, n_outputs))
    traced, session, names = export_both(model, batch([3, 1, 5], n_numeric, vocab), tmp_path)
    fed = {i.name for i in session.get_inputs()}
    for k, lengths in enumerate(STRUCTURES):
        inputs = batch(lengths, n_numeric, vocab, seed=10 + k)
        with torch.no_grad():
            want = model(*inputs)
            got_ts = traced(*inputs[: len(names)])
        got_onnx = session.run(None, {n: t.numpy() for n, t in zip(names, inputs) if n in fed})[0]
        assert want.shape[0] < 2 or want.std() > 0.05  # a non-trivial function: parity means something
        torch.testing.assert_close(got_ts, want, atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(got_onnx, want.numpy(), atol=2e-5, rtol=1e-5)


# --- planted interactions -------------------------------------------------------------------------
def excess_log_loss(p: torch.Tensor, z: torch.Tensor) -> float:
    """Expected log loss of logits ``z`` minus the Bayes log loss, under true probabilities ``p``
    (the mean KL divergence from Bernoulli(p) to Bernoulli(sigma(z)))."""
    return (F.binary_cross_entropy_with_logits(z, p) - F.binary_cross_entropy(p, p)).item()


def fit(model, draw, steps: int = 400, lr: float = 0.01) -> float:
    """Plain Adam on BCE, a fresh sample of the planted world each step; excess log loss on a
    held-out sample."""
    torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for step in range(steps):
        num, cat, request, p = draw(step)
        loss = F.binary_cross_entropy_with_logits(model(num, cat, request)[:, -1], torch.bernoulli(p))
        opt.zero_grad()
        loss.backward()
        opt.step()
    num, cat, request, p = draw(-1)
    with torch.no_grad():
        return excess_log_loss(p, model.eval()(num, cat, request)[:, -1])


def _rng(step: int) -> torch.Generator:
    return torch.Generator().manual_seed(10_000 if step < 0 else step)


_LATENT = torch.randn(2, 40, 3, generator=torch.Generator().manual_seed(1))


def draw_latent_dot(step: int):
    """Users and items with random latent vectors: y ~ Bernoulli(sigma(-1 + 1.2 <u_user, v_item>))."""
    g, n = _rng(step), 8192 if step < 0 else 512
    u, v = torch.randint(0, 40, (n,), generator=g), torch.randint(0, 40, (n,), generator=g)
    p = torch.sigmoid(-1.0 + 1.2 * (_LATENT[0, u] * _LATENT[1, v]).sum(1))
    return torch.zeros(n, 0), torch.stack([u + 1, v + 1], 1), None, p


def draw_numeric_product(step: int):
    """Three standard normal features, y ~ Bernoulli(sigma(-1 + 1.5 x1 x2)); x3 is noise."""
    g, n = _rng(step), 8192 if step < 0 else 512
    x = torch.randn(n, 3, generator=g)
    return x, torch.zeros(n, 0, dtype=torch.long), None, torch.sigmoid(-1.0 + 1.5 * x[:, 0] * x[:, 1])


PLANTED = {"latent_dot": (draw_latent_dot, 0, [40, 40]), "numeric_product": (draw_numeric_product, 3, [])}


@pytest.mark.slow
@pytest.mark.parametrize("world", list(PLANTED))
@pytest.mark.parametrize("name", ["fm", "deepfm", "dcn_parallel", "dcn_stacked_lowrank"])
def test_learns_planted_interaction(world, name):
    """FM, DeepFM and DCN-v2 get within a small fraction of the Bayes log loss where the additive
    model stays near the base-rate model (the interaction has no main effect)."""
    draw, n_numeric, vocab = PLANTED[world]
    p = draw(-1)[3]
    rate = float(p.mean())
    constant = excess_log_loss(p, torch.full_like(p, math.log(rate / (1 - rate))))
    additive = fit(LinearScorer(n_numeric, vocab, base_rate=rate), draw)
    learned = fit(build(name, n_numeric, vocab, base_rate=rate, emb_dim=8), draw)
    assert additive > 0.8 * constant  # an additive model cannot use the interaction
    assert learned < 0.2 * additive


def draw_list_relative(step: int):
    """Lists of 3-12 items; an item's feature is its list's level plus noise, and its click
    probability depends on the feature minus the list mean: sigma(-1 + 2 (x_i - mean_list x))."""
    g, n_lists = _rng(step), 1024 if step < 0 else 96
    lengths = torch.randint(3, 13, (n_lists,), generator=g)
    request = torch.repeat_interleave(torch.arange(n_lists), lengths)
    x = 1.5 * torch.randn(n_lists, generator=g)[request] + torch.randn(request.numel(), generator=g)
    mean = torch.zeros(n_lists).index_add_(0, request, x) / lengths
    p = torch.sigmoid(-1.0 + 2.0 * (x - mean[request]))
    num = torch.stack([x, torch.randn(request.numel(), generator=g)], 1)
    return num, torch.zeros(request.numel(), 0, dtype=torch.long), request, p


@pytest.mark.slow
def test_list_aware_learns_list_relative_target():
    """The list-aware scorer learns a click probability relative to the list's mean; a
    per-impression MLP cannot see the list and stays far from the Bayes log loss."""
    p = draw_list_relative(-1)[3]
    rate = float(p.mean())
    per_impression = fit(MLPScorer(2, [], hidden=(32,), base_rate=rate), draw_list_relative)
    list_aware = fit(ListAwareScorer(2, [], d_model=16, n_heads=2, n_layers=1, ffn_dim=32, hidden=(),
                                     base_rate=rate), draw_list_relative)
    assert per_impression > 0.5 * excess_log_loss(p, torch.full_like(p, math.log(rate / (1 - rate))))
    assert list_aware < 0.2 * per_impression


@pytest.mark.parametrize("name", list(SCORERS))
def test_training_lookups_give_the_embeddings_own_gradients(name, monkeypatch):
    """Training steps look the id tables' rows up through ``lookup_rows`` (an ``index_add_``
    backward): every parameter gets the gradient the plain ``nn.Embedding`` lookup gives, codes
    repeated and the OOV row included; inference and a TorchScript trace take the plain lookup."""
    from hybridrank.models import scorers as S

    g = torch.Generator().manual_seed(7)
    num = torch.randn(40, 3, generator=g)
    cat = torch.stack([torch.randint(0, v + 1, (40,), generator=g) for v in VOCAB], dim=1)
    request = torch.repeat_interleave(torch.arange(8), 5)
    up = torch.randn(40, 1, generator=g)

    def grads():
        torch.manual_seed(0)
        s = randomize(build(name))   # zero-initialised heads would pass no gradient to the tables
        (s(num, cat, request) * up).sum().backward()
        return {n: p.grad.clone() for n, p in s.named_parameters() if p.grad is not None}

    calls = []
    real = S._RowLookup.apply
    monkeypatch.setattr(S._RowLookup, "apply", lambda *a: calls.append(1) or real(*a))
    routed = grads()
    assert calls, "no training lookup went through _RowLookup"
    monkeypatch.setattr(S, "lookup_rows", lambda t, c: t(c))
    plain = grads()
    assert routed.keys() == plain.keys()
    for n in plain:
        torch.testing.assert_close(routed[n], plain[n], rtol=1e-5, atol=1e-7, msg=n)
    assert any(n.endswith("weight") and "tables" in n and plain[n].abs().sum() > 0 for n in plain)
    monkeypatch.undo()
    calls.clear()
    monkeypatch.setattr(S._RowLookup, "apply", lambda *a: calls.append(1) or real(*a))
    with torch.no_grad():
        build(name)(num, cat, request)
    assert not calls
