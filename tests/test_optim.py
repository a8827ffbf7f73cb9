"""LazyAdam against torch's own Adam, AdamW and SparseAdam, and the ranker's sparse tables."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridrank.models import optim
from hybridrank.models.optim import SPARSE_MIN_ELEMENTS, LazyAdam, lazy_adam_rows


@pytest.fixture(params=["host", "device"])
def path(request, monkeypatch):
    """Both ways of the lazy step: the host's (coalesce) and an accelerator's (fixed shapes,
    forced on the CPU as the step-sync test does)."""
    if request.param == "device":
        monkeypatch.setattr(optim, "free_to_read", lambda t: False)
    return request.param


def _pair(v=7, d=3, seed=0):
    torch.manual_seed(seed)
    sparse = torch.nn.Embedding(v, d, sparse=True)
    dense = torch.nn.Embedding(v, d)
    dense.weight.data.copy_(sparse.weight.data)
    return sparse, dense


@pytest.mark.parametrize("decoupled,wd", [(False, 0.0), (False, 0.1), (True, 0.05)])
def test_every_row_in_every_batch_is_adam(decoupled, wd, path):
    """When each batch uses every row (some twice), the lazy step is Adam's / AdamW's step."""
    sparse, dense = _pair()
    lazy = LazyAdam(sparse.parameters(), lr=0.05, weight_decay=wd, decoupled_weight_decay=decoupled)
    ref_cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    ref = ref_cls(dense.parameters(), lr=0.05, weight_decay=wd)
    g = torch.Generator().manual_seed(1)
    for _ in range(12):
        idx = torch.cat([torch.randperm(7, generator=g), torch.randint(0, 7, (5,), generator=g)])
        target = torch.randn(idx.numel(), 3, generator=g)
        for emb, opt in ((sparse, lazy), (dense, ref)):
            opt.zero_grad()
            (emb(idx) - target).pow(2).sum().backward()
            opt.step()
    assert sparse.weight.grad.is_sparse and not dense.weight.grad.is_sparse
    torch.testing.assert_close(sparse.weight, dense.weight, rtol=1e-5, atol=1e-6)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), v=st.integers(1, 40), n=st.integers(1, 60),
       steps=st.integers(1, 6))
def test_random_batches_match_sparse_adam_and_leave_other_rows(seed, v, n, steps, path):
    """On random batches with repeated rows, the lazy update is torch's SparseAdam (an independent
    implementation of the same rule, coalescing first; it adds ``eps`` before the bias
    correction where Adam adds it after, so both run with a negligible ``eps``); rows no batch
    used keep their values and zero moments."""
    sparse, other = _pair(v, 4, seed)
    other = torch.nn.Embedding(v, 4, sparse=True)
    other.weight.data.copy_(sparse.weight.data)
    start = sparse.weight.detach().clone()
    lazy = LazyAdam(sparse.parameters(), lr=0.03, eps=1e-12)
    ref = torch.optim.SparseAdam(other.parameters(), lr=0.03, eps=1e-12)
    g = torch.Generator().manual_seed(seed)
    used = torch.zeros(v, dtype=torch.bool)
    for _ in range(steps):
        idx = torch.randint(0, v, (n,), generator=g)
        used[idx] = True
        w = torch.randn(n, 4, generator=g)
        for emb, opt in ((sparse, lazy), (other, ref)):
            opt.zero_grad()
            (emb(idx) * w).sum().backward()
            opt.step()
    torch.testing.assert_close(sparse.weight, other.weight, rtol=1e-5, atol=1e-6)
    assert torch.equal(sparse.weight[~used], start[~used])
    assert not lazy.state[sparse.weight]["exp_avg"][~used].any()


def test_dense_parameters_get_adams_own_step_and_the_state_resumes(path):
    """A model mixing a sparse table and dense layers: the dense part moves exactly as under
    torch.optim.Adam; a state dict saved mid-way resumes to the same weights."""
    def model():
        torch.manual_seed(0)
        return torch.nn.ModuleDict({"emb": torch.nn.Embedding(9, 2, sparse=True),
                                    "lin": torch.nn.Linear(2, 1)})

    def run(m, opt, steps, start=0):
        for s in range(start, start + steps):
            g = torch.Generator().manual_seed(s)
            idx = torch.randint(0, 9, (6,), generator=g)
            opt.zero_grad()
            m["lin"](m["emb"](idx)).pow(2).sum().backward()
            opt.step()

    a, b = model(), model()
    opt_a = LazyAdam(a.parameters(), lr=0.01, eps=1e-12)
    dense_b = torch.optim.Adam(b["lin"].parameters(), lr=0.01, eps=1e-12)
    table_b = torch.optim.SparseAdam(b["emb"].parameters(), lr=0.01, eps=1e-12)

    class Both:
        def zero_grad(self):
            dense_b.zero_grad()
            table_b.zero_grad()

        def step(self):
            dense_b.step()
            table_b.step()

    run(a, opt_a, 5)
    run(b, Both(), 5)
    for (n, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=n)
    c = model()
    c.load_state_dict(a.state_dict())
    opt_c = LazyAdam(c.parameters(), lr=0.01, eps=1e-12)
    opt_c.load_state_dict(copy.deepcopy(opt_a.state_dict()))   # as read from a checkpoint
    run(a, opt_a, 3, start=5)
    run(c, opt_c, 3, start=5)
    for p, q in zip(a.parameters(), c.parameters(), strict=True):
        assert torch.equal(p, q)


def test_closure_and_what_has_no_lazy_form():
    emb = torch.nn.Embedding(4, 2, sparse=True)
    opt = LazyAdam(emb.parameters(), lr=0.1)

    def closure():
        opt.zero_grad()
        loss = emb(torch.tensor([0, 2])).sum()
        loss.backward()
        return loss

    assert torch.is_tensor(opt.step(closure))
    assert emb.weight.grad.is_sparse                      # the gradient is given back
    for kwargs in ({"amsgrad": True}, {"maximize": True}):
        bad = LazyAdam(emb.parameters(), lr=0.1, **kwargs)
        emb.zero_grad()
        emb(torch.tensor([1])).sum().backward()
        with pytest.raises(ValueError, match="no lazy form"):
            bad.step()
    with pytest.raises(ValueError, match="one sparse dimension"):
        lazy_adam_rows(torch.zeros(2, 2), torch.zeros(2, 2).to_sparse(2), torch.zeros(2, 2),
                       torch.zeros(2, 2), 1, lr=0.1, beta1=0.9, beta2=0.999, eps=1e-8)


def test_the_ranker_gives_its_tables_sparse_gradients_only_where_they_can_be_used():
    from hybridrank.losses import HybridLoss
    from hybridrank.models.ranker import HybridRanker
    from hybridrank.models.scorers import FMScorer, column_tables

    big = SPARSE_MIN_ELEMENTS // 4          # rows: at dim 4, exactly the smallest sparse table

    def ranker(opt, sparse="auto"):
        return HybridRanker(FMScorer(2, [big - 1, 3], emb_dim=4), loss=HybridLoss(), optimizer=opt,
                            sparse_tables=sparse)

    def flags(m):
        return {t.sparse for tables in column_tables(m.scorer) for t in tables}

    def big_flags(m):       # the large column's tables (FM: its embedding and first-order weight)
        return {tables[0].sparse for tables in column_tables(m.scorer) if tables[0].weight.numel() >= big * 4}

    lazy = ranker({"_target_": "hybridrank.models.optim.LazyAdam", "_partial_": True, "lr": 0.01})
    lazy.configure_optimizers()
    assert big_flags(lazy) == {True} and flags(lazy) == {True, False}   # the small ones: dense
    out = lazy.scorer(torch.randn(4, 2), torch.tensor([[1, 2], [1, 0], [3, 1], [5, 3]]))
    out.sum().backward()
    tables = column_tables(lazy.scorer)
    assert tables[0][0].weight.grad.is_sparse and not tables[0][1].weight.grad.is_sparse
    every = ranker({"_target_": "hybridrank.models.optim.LazyAdam", "_partial_": True}, sparse=True)
    every.configure_optimizers()
    assert flags(every) == {True}
    adam = ranker({"_target_": "torch.optim.Adam", "_partial_": True, "lr": 0.01})
    adam.configure_optimizers()
    assert flags(adam) == {False}
    off = ranker({"_target_": "hybridrank.models.optim.LazyAdam", "_partial_": True}, sparse=False)
    off.configure_optimizers()
    assert flags(off) == {False}
    # not on one device (DDP, even with one process), or with gradient clipping: dense
    import pytorch_lightning as pl

    one = pl.strategies.SingleDeviceStrategy(device=torch.device("cpu"))
    lazy_conf = {"_target_": "hybridrank.models.optim.LazyAdam", "_partial_": True}
    for strategy, clip, want in ((object(), None, False), (one, 1.0, False), (one, None, True)):
        m = ranker(lazy_conf)
        m._trainer = SimpleNamespace(strategy=strategy, gradient_clip_val=clip)
        m.configure_optimizers()
        assert big_flags(m) == {want}, (strategy, clip)
    m = ranker(lazy_conf, sparse=True)
    m._trainer = SimpleNamespace(strategy=one, gradient_clip_val=0.5)
    with pytest.raises(ValueError, match="gradient clipping"):
        m.configure_optimizers()
    insist = ranker({"_target_": "torch.optim.Adam", "_partial_": True}, sparse=True)
    with pytest.raises(ValueError, match="sparse_tables=true: Adam takes dense gradients"):
        insist.configure_optimizers()
    with pytest.raises(ValueError, match="sparse_tables must be"):
        ranker(None, sparse="yes")


def test_ranker_hook_name_fast_path_keeps_module_semantics():
    """HybridRanker stores Lightning's running-hook name without nn.Module's checks; everything
    else still goes through them (parameters, buffers, submodules register as before)."""
    from hybridrank.losses import HybridLoss
    from hybridrank.models.ranker import HybridRanker
    from hybridrank.models.scorers import FMScorer

    m = HybridRanker(FMScorer(2, [5, 3], emb_dim=4), loss=HybridLoss())
    m._current_fx_name = "training_step"
    assert m._current_fx_name == "training_step" and "_current_fx_name" not in dict(m.named_parameters())
    m._current_fx_name = None
    assert m._current_fx_name is None
    n_params = len(list(m.parameters()))
    m.extra = torch.nn.Linear(2, 1)                          # a submodule still registers
    m.bias_extra = torch.nn.Parameter(torch.zeros(1))        # and a parameter
    m.register_buffer("buf", torch.ones(1))
    m.buf = torch.zeros(1)                                   # a buffer assignment stays a buffer
    assert len(list(m.parameters())) == n_params + 3 and "extra" in dict(m.named_modules())
    assert "buf" in dict(m.named_buffers()) and float(m.buf) == 0.0


def test_dense_parameters_take_torchs_fused_kernel_and_a_loss_scaler_unscales_every_gradient():
    """Where this torch has a fused Adam kernel for the parameters' device, the dense parameters
    take it (the same step as torch's Adam, tested above; not when the caller asks for foreach).
    The lazy rows do not read a loss scale, so the optimizer leaves the unscaling to the scaler:
    under a GradScaler a sparse table and a dense layer move exactly as without one."""
    lin = torch.nn.Linear(3, 1)
    opt = LazyAdam(lin.parameters(), lr=0.1)
    assert opt.defaults["fused"] == (optim.fused_adam_runs_on(list(lin.parameters())) or None)
    if tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 4):
        assert opt.defaults["fused"] is True          # torch has had a CPU kernel since 2.4
    assert not opt._step_supports_amp_scaling
    assert not LazyAdam(lin.parameters(), foreach=True).defaults["fused"]
    assert not LazyAdam(lin.parameters(), fused=False).defaults["fused"]
    assert not optim.fused_adam_runs_on([torch.zeros(2, dtype=torch.int64)])

    def model():
        torch.manual_seed(0)
        return torch.nn.ModuleDict({"emb": torch.nn.Embedding(9, 2, sparse=True),
                                    "lin": torch.nn.Linear(2, 1)})

    scaler_cls = getattr(getattr(torch, "amp", None), "GradScaler", None)
    if scaler_cls is None:
        pytest.skip("this torch has no device-generic GradScaler")
    try:
        scaler = scaler_cls("cpu", init_scale=2.0 ** 8)
    except (RuntimeError, TypeError):
        pytest.skip("this torch has no CPU GradScaler")
    plain, scaled = model(), model()
    # Adam's step is nearly scale-free; a large eps and an L2 term make a missed unscale show
    opt_p = LazyAdam(plain.parameters(), lr=0.01, eps=0.1, weight_decay=0.1)
    opt_s = LazyAdam(scaled.parameters(), lr=0.01, eps=0.1, weight_decay=0.1)
    for s in range(4):
        g = torch.Generator().manual_seed(s)
        idx = torch.randint(0, 9, (6,), generator=g)
        for m, opt in ((plain, opt_p), (scaled, opt_s)):
            opt.zero_grad()
            loss = m["lin"](m["emb"](idx)).pow(2).sum()
            if opt is opt_s:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
    for (n, p), q in zip(plain.named_parameters(), scaled.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7, msg=n)
