"""Batches built where the split lives: a host plan plus a device gather, equal bit for bit to the
host batches; chunks copied to the device once; the next chunk of a streamed log prefetched."""

from __future__ import annotations

import gc
import threading
import time
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from lightning_fabric.utilities.apply_func import move_data_to_device
from torch.overrides import TorchFunctionMode

from hybridrank.data.collate import ListDataset, collate, gather_batch, plan_batch
from hybridrank.data.datamodule import ListDataModule
from hybridrank.data.sampler import GroupBatchSampler, capped_sizes, unit_ids
from hybridrank.data.scanner import Chunk
from hybridrank.data.sources import SIM_COLUMNS_MAP, SimulatedSource
from hybridrank.data.stream import PREFETCH_THREAD, BatchStream, chunk_seed
from hybridrank.data.streaming import StreamingClickLogSource
from hybridrank.lists import Batch, ListData, lengths_to_offsets, pad_index

pytestmark = pytest.mark.usefixtures("one_thread")

CUDA = torch.cuda.is_available()
BATCH_FIELDS = ("num", "cat", "label", "index", "mask", "rank_index", "rank_mask", "rows",
                "request", "weight", "position", "explore", "propensity")


# ----------------------------------------------------------------------------------------------
# The reference: collate as it was before the split into plan and gather (one host function)
# ----------------------------------------------------------------------------------------------
def _cap_before(unit_of_row, label, cap, generator):
    n_units = int(unit_of_row.max()) + 1 if unit_of_row.numel() else 0
    size = torch.bincount(unit_of_row, minlength=n_units)
    if not bool((size > cap).any()):
        return torch.ones_like(label, dtype=torch.bool), None
    neg = label <= 0
    n_neg = torch.bincount(unit_of_row, weights=neg.double(), minlength=n_units).long()
    n_pos = size - n_neg
    neg_budget = torch.from_numpy(capped_sizes(size.numpy(), n_pos.numpy(), cap)) - n_pos
    prio = torch.rand(label.shape, generator=generator, dtype=torch.float64)
    prio = torch.where(neg, prio, torch.full_like(prio, -1.0))
    order = torch.argsort(unit_of_row.double() * 4 + prio + 1, stable=True)
    unit_start = lengths_to_offsets(size)[:-1]
    rank_in_unit = torch.empty_like(unit_of_row)
    rank_in_unit[order] = torch.arange(len(order)) - unit_start[unit_of_row[order]]
    neg_rank = rank_in_unit - n_pos[unit_of_row]
    keep = ~neg | (neg_rank < neg_budget[unit_of_row])
    kept_neg = torch.minimum(neg_budget, n_neg)
    rate = torch.where(n_neg > 0, kept_neg.double() / n_neg.clamp(min=1).double(),
                       torch.ones(n_units, dtype=torch.float64))
    w = torch.where(neg, 1.0 / rate[unit_of_row].clamp(min=1e-12), torch.ones_like(rate[unit_of_row]))
    return keep, w.float()


def collate_before(data, requests, units=None, *, max_unit_size=None, generator=None,
                   reweight_negatives=True) -> Batch:
    lengths = data.lengths[requests]
    starts = data.offsets[requests]
    req_off = lengths_to_offsets(lengths)
    n = int(req_off[-1])
    rows = torch.repeat_interleave(starts - req_off[:-1], lengths) + torch.arange(n)
    req_of_row = torch.repeat_interleave(torch.arange(len(requests)), lengths)
    if units is None:
        units = torch.arange(len(requests))
    new_unit = torch.ones(len(requests), dtype=torch.bool)
    new_unit[1:] = units[1:] != units[:-1]
    unit_of_req = torch.cumsum(new_unit.long(), 0) - 1
    unit_of_row = unit_of_req[req_of_row]
    label = data.label[rows]
    weight = None
    if max_unit_size is not None:
        keep, weight = _cap_before(unit_of_row, label, max_unit_size, generator)
        if weight is not None:
            rows, req_of_row, unit_of_row, label = rows[keep], req_of_row[keep], unit_of_row[keep], label[keep]
            weight = weight[keep] if reweight_negatives else None
            lengths = torch.bincount(req_of_row, minlength=len(requests))
    index, mask = pad_index(lengths)
    n_units = int(unit_of_req[-1]) + 1 if len(requests) else 0
    unit_len = torch.bincount(unit_of_row, minlength=n_units)
    rank_index, rank_mask = pad_index(unit_len)
    return Batch(
        num=data.num[rows], cat=data.cat[rows], label=label,
        index=index, mask=mask, rank_index=rank_index, rank_mask=rank_mask, rows=rows,
        request=req_of_row, weight=weight, position=None if data.position is None else data.position[rows],
        explore=None if data.explore is None else data.explore[rows],
        propensity=None if data.propensity is None else data.propensity[rows],
    )


def assert_same_batch(a: Batch, b: Batch) -> None:
    """Every field equal bit for bit: values, dtypes, shapes (compared on the host)."""
    for name in BATCH_FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            x, y = x.cpu(), y.cpu()
            assert x.dtype == y.dtype and x.shape == y.shape, name
            if x.is_floating_point():  # bit for bit, NaN-safe
                x, y = x.view(torch.int32 if x.element_size() == 4 else torch.int64), \
                    y.view(torch.int32 if y.element_size() == 4 else torch.int64)
            assert torch.equal(x, y), name


# ----------------------------------------------------------------------------------------------
# Random splits
# ----------------------------------------------------------------------------------------------
def make_split(lengths, sessions, users, seed, ctr, extras=True) -> ListData:
    rng = np.random.default_rng(seed)
    lengths = torch.as_tensor(lengths, dtype=torch.long)
    n = int(lengths.sum())
    pos = torch.cat([torch.arange(1, int(k) + 1) for k in lengths]) if n else torch.zeros(0, dtype=torch.long)
    return ListData(
        num=torch.as_tensor(rng.normal(size=(n, 3)), dtype=torch.float32),
        cat=torch.as_tensor(rng.integers(0, 50, size=(n, 2)), dtype=torch.long),
        label=torch.as_tensor(rng.random(n) < ctr, dtype=torch.float32),
        offsets=lengths_to_offsets(lengths),
        scope={"session": torch.as_tensor(sessions, dtype=torch.long),
               "user": torch.as_tensor(users, dtype=torch.long)},
        position=pos if extras else None,
        explore=torch.as_tensor(rng.random(n) < 0.3) if extras else None,
        propensity=torch.as_tensor(rng.uniform(0.1, 1, n), dtype=torch.float32) if extras else None,
        bid=torch.as_tensor(rng.uniform(0, 2, n), dtype=torch.float32) if extras else None,
    )


def clone(data: ListData) -> ListData:
    """A copy of the split in fresh memory (another 'device' on the host)."""
    return replace(data, **{k: v.clone() for k, v in data.tensors().items() if "." not in k},
                   scope={k: v.clone() for k, v in data.scope.items()})


@st.composite
def splits(draw):
    n_req = draw(st.integers(1, 40))
    lengths = draw(st.lists(st.integers(1, 30), min_size=n_req, max_size=n_req))
    n_sess = draw(st.integers(1, n_req))
    sessions = draw(st.lists(st.integers(0, n_sess - 1), min_size=n_req, max_size=n_req))
    users = [s % 3 for s in sessions]  # sessions nest in users
    return make_split(lengths, sessions, users, seed=draw(st.integers(0, 10**6)),
                      ctr=draw(st.sampled_from([0.0, 0.05, 0.3, 1.0])), extras=draw(st.booleans()))


@given(splits(), st.sampled_from(["request", "session", "user"]),
       st.one_of(st.none(), st.integers(1, 40)), st.booleans(), st.integers(0, 10**6), st.data())
def test_plan_and_gather_equal_the_collate_before_the_split(data, scope, cap, reweight, seed, draw):
    """plan_batch + gather_batch (and collate, ListDataset) == the one-function collate, bit for
    bit: rows, lists, capping draws and weights, on random splits, scopes, caps, reweighting."""
    units = torch.from_numpy(unit_ids(data, scope))
    order = np.argsort(units.numpy(), kind="stable")
    # a random subset of whole units, units adjacent (what the sampler hands over)
    chosen = draw.draw(st.sets(st.integers(0, int(units.max())), min_size=0))
    req = torch.as_tensor(order[np.isin(units.numpy()[order], sorted(chosen))], dtype=torch.long)

    def gen():
        return torch.Generator().manual_seed(seed)

    want = collate_before(data, req, units[req], max_unit_size=cap, generator=gen(),
                          reweight_negatives=reweight)
    plan = plan_batch(data.offsets, data.label, req, units[req], max_unit_size=cap,
                      generator=gen(), reweight_negatives=reweight)
    assert_same_batch(gather_batch(data, plan), want)
    assert_same_batch(collate(data, req, units[req], max_unit_size=cap, generator=gen(),
                              reweight_negatives=reweight), want)
    assert plan.max_len == (int(want.mask.sum(1).max()) if len(req) else 0)
    # ListDataset: its generator per batch, the split or an equal copy as features
    ds = ListDataset(data, scope=scope, max_unit_size=cap, seed=seed % 1000,
                     reweight_negatives=reweight)
    g = torch.Generator().manual_seed((seed % 1000) * 1_000_003 + int(req[:8].sum()) + len(req))
    want = collate_before(data, req, units[req], max_unit_size=cap, generator=g,
                          reweight_negatives=reweight)
    assert_same_batch(ds[req.numpy()], want)
    copy = ListDataset(data, scope=scope, max_unit_size=cap, seed=seed % 1000,
                       reweight_negatives=reweight, features=clone(data))
    assert_same_batch(copy[req.numpy()], want)


def test_a_sampler_epoch_is_the_same_through_plan_and_gather():
    """A whole epoch of capped session batches: every batch equals the one-function collate."""
    rng = np.random.default_rng(4)
    lengths = rng.integers(1, 40, 300)
    sessions = np.sort(rng.integers(0, 90, 300))
    data = make_split(lengths, sessions, sessions // 4, seed=4, ctr=0.04)
    sampler = GroupBatchSampler(data, budget=200, scope="session", max_unit_size=60, seed=2)
    ds = ListDataset(data, scope="session", max_unit_size=60, seed=2)
    units = torch.from_numpy(unit_ids(data, "session"))
    capped = 0
    for req in sampler:
        r = torch.as_tensor(req)
        g = torch.Generator().manual_seed(2 * 1_000_003 + int(r[:8].sum()) + len(r))
        want = collate_before(data, r, units[r], max_unit_size=60, generator=g)
        assert_same_batch(ds[req], want)
        capped += want.weight is not None
    assert capped > 0


# ----------------------------------------------------------------------------------------------
# No read back from the device in the gather
# ----------------------------------------------------------------------------------------------
class HostSync(AssertionError):
    pass


#: Tensor methods / functions that read a value back to the host (or need to, on a device).
_SYNCING = {"item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__",
            "nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "bincount"}


class NoHostSync(TorchFunctionMode):
    """Fails on every torch call that reads a device value back to the host: ``.item()``,
    ``bool``/``int``/``float`` of a tensor, ``tolist``, ``nonzero``, ``bincount``, a
    ``repeat_interleave`` without ``output_size``, indexing with a boolean mask."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if name in _SYNCING:
            raise HostSync(f"{name} reads a value back to the host")
        if name == "repeat_interleave" and kwargs.get("output_size") is None \
                and isinstance(args[-1] if len(args) > 1 else kwargs.get("repeats"), torch.Tensor):
            raise HostSync("repeat_interleave with tensor repeats needs output_size")
        if name in ("__getitem__", "__setitem__"):
            keys = args[1] if isinstance(args[1], tuple) else (args[1],)
            if any(isinstance(k, torch.Tensor) and k.dtype == torch.bool for k in keys):
                raise HostSync("boolean-mask indexing sizes its result on the host")
        return func(*args, **kwargs)


def test_the_guard_catches_what_syncs():
    t = torch.tensor([3, 1, 2])
    for bad in (lambda: t.max().item(), lambda: int(t[0]), lambda: bool(t.any()), t.tolist,
                t.nonzero, lambda: t[t > 1], lambda: torch.repeat_interleave(t, t),
                lambda: pad_index(t)):  # pad_index without max_len reads the longest list
        with NoHostSync(), pytest.raises(HostSync):
            bad()
    with NoHostSync():  # what the gather may do
        torch.repeat_interleave(torch.arange(3), t, output_size=6)
        pad_index(t, 3)
        t.index_select(0, t - 1)


@given(splits(), st.sampled_from(["request", "session"]), st.one_of(st.none(), st.integers(1, 20)),
       st.booleans())
def test_the_gather_reads_nothing_back_and_runs_on_a_fake_device(data, scope, cap, reweight):
    """gather_batch under a mode that fails on any read back; and on the ``meta`` device (tensors
    without values: a read back there fails too) it lays out batches of the right shapes."""
    ds = ListDataset(data, scope=scope, max_unit_size=cap, reweight_negatives=reweight)
    sampler = GroupBatchSampler(data, budget=10**4, scope=scope, max_unit_size=cap, seed=1)
    meta = data.to("meta")
    for req in sampler:
        plan = ds.plan(req)
        with NoHostSync():
            host = gather_batch(data, plan)
            fake = gather_batch(meta, plan)
        assert_same_batch(host, ds[req])
        for name in BATCH_FIELDS:
            x, y = getattr(host, name), getattr(fake, name)
            assert (x is None) == (y is None)
            if x is not None:
                assert y.device.type == "meta" and y.shape == x.shape and y.dtype == x.dtype, name


def test_plans_come_from_the_host():
    data = make_split([3, 4], [0, 0], [0, 0], seed=0, ctr=0.5)
    with pytest.raises(ValueError, match="plan_batch reads host tensors, but offsets is on meta"):
        plan_batch(data.offsets.to("meta"), data.label, torch.tensor([0]))
    with pytest.raises(ValueError, match="must be on the host.*features="):
        ListDataset(data.to("meta"))
    with pytest.raises(ValueError, match="the same split"):
        ListDataset(data, features=make_split([3], [0], [0], seed=0, ctr=0.5))


# ----------------------------------------------------------------------------------------------
# BatchStream: device path == host path; prefetch
# ----------------------------------------------------------------------------------------------
class Chunks:
    """A ``ChunkedSource`` of given parts that records which thread read each chunk, and can fail
    or dawdle on one of them."""

    schema = None

    def __init__(self, parts, fail_at: int | None = None, delay: float = 0.0):
        self.parts, self.fail_at, self.delay = parts, fail_at, delay
        self.chunks, base = [], 0
        for i, d in enumerate(parts):
            self.chunks.append(Chunk(i, d.n_impressions, d.n_requests, base))
            base += d.n_impressions
        self.readers: list[tuple[int, str]] = []

    def layout(self):
        return self.chunks

    def read_chunk(self, chunk, split):
        self.readers.append((chunk.index, threading.current_thread().name))
        if self.delay:
            time.sleep(self.delay)
        if chunk.index == self.fail_at:
            raise ValueError(f"chunk {chunk.index}: bad value in row 7 of part-{chunk.index}.parquet")
        return self.parts[chunk.index] if split == "train" else None


def random_parts(n_parts: int, seed: int = 0) -> list[ListData]:
    rng = np.random.default_rng(seed)
    parts = []
    for _ in range(n_parts):
        n_req = int(rng.integers(8, 30))
        sessions = np.sort(rng.integers(0, n_req // 2, n_req))
        parts.append(make_split(rng.integers(1, 25, n_req), sessions, sessions // 2,
                                seed=int(rng.integers(10**6)), ctr=0.1))
    return parts


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == PREFETCH_THREAD]


STREAM = dict(budget=60, scope="session", max_unit_size=25, seed=5)


@pytest.mark.parametrize("n_parts", [1, 5])
def test_the_device_path_on_the_cpu_and_prefetch_give_the_host_batches(n_parts):
    """One chunk or several, shuffled, capped: BatchStream(device="cpu") (chunks through the
    device path) and with / without prefetch give the batches of the plain host path, which are
    those of the sampler and the one-function collate, chunk after chunk."""
    parts = random_parts(n_parts)
    host = Chunks(parts)
    ref = BatchStream(host, prefetch=False, **STREAM)
    ref.set_epoch(3)
    want = list(ref)
    assert {name for _, name in host.readers} == {threading.current_thread().name}
    # the documented recipe
    recipe = []
    for c in BatchStream(host, **STREAM).chunk_order(3):
        s = GroupBatchSampler(parts[c], budget=60, scope="session", max_unit_size=25,
                              seed=chunk_seed(5, c))
        s.set_epoch(3)
        units = torch.from_numpy(unit_ids(parts[c], "session"))
        for req in s:
            r = torch.as_tensor(req)
            g = torch.Generator().manual_seed(chunk_seed(5, c) * 1_000_003 + int(r[:8].sum()) + len(r))
            b = collate_before(parts[c], r, units[r], max_unit_size=25, generator=g)
            b.rows = b.rows + host.chunks[c].base
            recipe.append(b)
    assert len(want) == len(recipe) > n_parts
    for a, b in zip(want, recipe):
        assert_same_batch(a, b)
    assert any(b.weight is not None for b in want)
    for device, prefetch in (("cpu", True), ("cpu", False), (None, True)):
        src = Chunks(parts)
        stream = BatchStream(src, device=device, prefetch=prefetch, **STREAM)
        stream.set_epoch(3)
        got = list(stream)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert_same_batch(a, b)
        threads = {name for _, name in src.readers}
        assert (PREFETCH_THREAD in threads) == (prefetch and n_parts > 1), (device, prefetch)
    assert not prefetch_threads()


@pytest.mark.parametrize("n_parts", [1, 5])
def test_the_device_path_lays_out_the_host_batches_on_a_fake_device(n_parts):
    """Chunks copied to the ``meta`` device (a device whose tensors hold no values, so any read
    back would fail): every batch is built there, with the shapes and dtypes of the host batch."""
    parts = random_parts(n_parts, seed=6)
    want = list(BatchStream(Chunks(parts), **STREAM))
    resident: dict = {}
    for _ in range(2):  # a second epoch reuses the one-chunk copy
        got = list(BatchStream(Chunks(parts), device="meta", resident=resident, **STREAM))
        assert len(got) == len(want)
        for a, b in zip(got, want):
            for name in BATCH_FIELDS:
                x, y = getattr(a, name), getattr(b, name)
                assert (x is None) == (y is None), name
                if x is not None:
                    assert x.device.type == "meta" and (x.shape, x.dtype) == (y.shape, y.dtype)
    assert len(resident) == (n_parts == 1)  # streamed chunks are not kept
    assert not prefetch_threads()


def test_a_reader_error_surfaces_with_its_message_and_no_thread_is_left():
    parts = random_parts(4, seed=1)
    src = Chunks(parts, fail_at=2)
    stream = BatchStream(src, shuffle=False, **{**STREAM, "seed": 0})
    got = []
    with pytest.raises(ValueError, match=r"chunk 2: bad value in row 7 of part-2.parquet"):
        for b in stream:
            got.append(b)
    assert (2, PREFETCH_THREAD) in src.readers  # it failed in the reader thread ...
    n_before = sum(len(GroupBatchSampler(p, budget=60, scope="session", max_unit_size=25,
                                         shuffle=False)) for p in parts[:2])
    assert len(got) == n_before  # ... and surfaced when chunk 2 was due, after chunks 0 and 1
    assert not prefetch_threads()


@pytest.mark.slow
def test_an_epoch_stopped_early_leaves_no_reader_thread():
    """The stream closed in the middle of a chunk, a read of the next in flight: the close waits
    for that read, and no prefetch thread is left; a failing read that nobody needs is dropped."""
    for fail_at in (None, 1):
        src = Chunks(random_parts(4, seed=2), fail_at=fail_at, delay=0.3)
        it = iter(BatchStream(src, shuffle=False, **STREAM))
        next(it)
        assert prefetch_threads()  # chunk 1 is being read
        it.close()
        assert not prefetch_threads()
    # a loader over the stream, dropped after a few batches (Lightning's limit_train_batches)
    src = Chunks(random_parts(4, seed=2), delay=0.3)
    loader = torch.utils.data.DataLoader(BatchStream(src, **STREAM), batch_size=None,
                                         collate_fn=lambda b: b)
    it = iter(loader)
    next(it)
    del it
    gc.collect()
    assert not prefetch_threads()


@pytest.mark.slow
def test_a_streamed_log_trains_with_prefetch_and_limit_train_batches(tmp_path):
    """The data module on a streamed log, Lightning stopping the epoch early: the same rows per
    step as without prefetch, and no reader thread left once fit returns."""
    import pytorch_lightning as pl

    from hybridrank.data.simulate import simulate_clicklog
    from hybridrank.losses import HybridLoss
    from hybridrank.models.ranker import HybridRanker

    simulate_clicklog(n_users=60, seed=5).write_parquet(tmp_path / "log.parquet", row_group_size=300)

    def fit(prefetch: bool) -> list[torch.Tensor]:
        src = StreamingClickLogSource(tmp_path / "log.parquet", SIM_COLUMNS_MAP, chunk_rows=600,
                                      split={"key": "session"})
        assert len(src.layout()) > 3
        dm = ListDataModule(src, budget=200, scope="session", max_unit_size=40, seed=1,
                            prefetch=prefetch)
        pl.seed_everything(0, verbose=False)
        module = HybridRanker({"_target_": "hybridrank.models.scorers.MLPScorer",
                               "_partial_": True, "hidden": [8], "emb_dim": 4},
                              HybridLoss(point_weight=1.0), data=dm.model_data())
        rows = []

        class Rows(pl.Callback):
            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                rows.append(batch.rows.clone())

        trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=2, limit_train_batches=4,
                             limit_val_batches=0, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False,
                             num_sanity_val_steps=0, use_distributed_sampler=False,
                             reload_dataloaders_every_n_epochs=1, callbacks=[Rows()])
        trainer.fit(module, datamodule=dm)
        assert dm.batch_device() == torch.device("cpu")
        return rows

    with_prefetch, without = fit(True), fit(False)
    assert len(with_prefetch) == len(without) == 8
    assert all(torch.equal(a, b) for a, b in zip(with_prefetch, without))
    gc.collect()
    for t in prefetch_threads():
        t.join(timeout=10)  # a read left in flight by an iterator Lightning keeps finishes alone
    assert not prefetch_threads()


# ----------------------------------------------------------------------------------------------
# The data module: where batches are built, and Lightning's transfer
# ----------------------------------------------------------------------------------------------
class _Strategy:
    def __init__(self, device):
        self.root_device = torch.device(device)


class _Trainer:
    world_size, global_rank, current_epoch = 1, 0, 0

    def __init__(self, device):
        self.strategy = _Strategy(device)


def test_the_data_module_builds_batches_on_the_trainers_device_as_the_switch_allows():
    src = SimulatedSource(n_users=30, seed=0)
    dm = ListDataModule(src, budget=512)
    assert dm.device_batches == "auto" and dm.batch_device() == torch.device("cpu")
    dm.trainer = _Trainer("meta")  # an accelerator, as far as the data module can tell
    assert dm.batch_device() == torch.device("meta")
    assert ListDataModule(src, budget=512, device_batches=False).batch_device() is None
    assert ListDataModule(src, budget=512, device_batches="false").device_batches is False
    assert ListDataModule(src, budget=512, device="meta").batch_device() == torch.device("meta")
    workers = ListDataModule(src, budget=512, device="meta", num_workers=2)
    assert workers.batch_device() is None  # auto: loader workers build on the host
    with pytest.raises(ValueError, match=r"device_batches=true builds batches on meta.*"
                                         r"num_workers=2.*num_workers=0"):
        ListDataModule(src, budget=512, device="meta", num_workers=2,
                       device_batches=True).batch_device()
    with pytest.raises(ValueError, match="device_batches must be auto, true or false, got 'gpu'"):
        ListDataModule(src, budget=512, device_batches="gpu")


def test_prefetch_auto_reads_ahead_for_an_accelerator_and_not_on_the_cpu():
    """A streamed log's next chunk is read in a thread while an accelerator trains; on the CPU
    the reading thread would only compete with torch's (``prefetch: auto``); true / false force it."""
    src = SimulatedSource(n_users=30, seed=0)
    dm = ListDataModule(src, budget=512)
    assert dm.prefetch == "auto" and dm.prefetches() is False          # no trainer: the CPU
    dm.trainer = _Trainer("cpu")
    assert dm.prefetches() is False
    dm.trainer = _Trainer("meta")                                       # an accelerator
    assert dm.prefetches() is True
    assert ListDataModule(src, budget=512, device="meta").prefetches() is True
    assert ListDataModule(src, budget=512, prefetch="true").prefetches() is True
    assert ListDataModule(src, budget=512, device="meta", prefetch=False).prefetches() is False
    with pytest.raises(ValueError, match="data.prefetch must be auto, true or false, got 'yes'"):
        ListDataModule(src, budget=512, prefetch="yes")


def test_a_split_is_copied_once_and_lightnings_transfer_moves_nothing():
    """The training split of a one-chunk source is copied to the batch device once for every
    epoch (held by the data module, freed at teardown); batches built there are left where they
    are by Lightning's batch transfer."""
    dm = ListDataModule(SimulatedSource(n_users=30, seed=0), budget=512, max_unit_size=64)
    host = [list(dm.train_stream(e)) for e in (0, 1)]
    dm.trainer = _Trainer("meta")
    for e in (0, 1):
        got = list(dm.train_stream(e))
        assert len(got) == len(host[e])
        for a, b in zip(got, host[e]):
            assert a.num.device.type == "meta" and a.rows.shape == b.rows.shape
    assert len(dm._resident) == 1
    ((data, copy),) = dm._resident.values()
    assert copy.num.device.type == "meta" and data.num.device.type == "cpu"
    dm.teardown("fit")
    assert not dm._resident
    batch = host[0][0]
    moved = move_data_to_device(batch, torch.device("cpu"))
    assert all(getattr(moved, f) is getattr(batch, f) for f in BATCH_FIELDS
               if getattr(batch, f) is not None)


def test_list_data_moves_and_counts_its_bytes():
    data = make_split([3, 2], [0, 1], [0, 0], seed=0, ctr=0.5)
    assert data.nbytes == sum(t.numel() * t.element_size() for t in data.tensors().values())
    assert set(data.tensors()) == {"num", "cat", "label", "offsets", "position", "explore",
                                   "propensity", "bid", "scope.session", "scope.user"}
    meta = data.to("meta")
    assert all(t.device.type == "meta" for t in meta.tensors().values())
    assert meta.n_impressions == 5 and meta.device.type == "meta"


# ----------------------------------------------------------------------------------------------
# CUDA (skipped without it): the same batches, built on the GPU
# ----------------------------------------------------------------------------------------------
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("n_parts", [1, 5])
def test_cuda_batches_equal_the_host_batches(n_parts):
    parts = random_parts(n_parts, seed=3)
    ref = BatchStream(Chunks(parts), prefetch=False, **STREAM)
    want = list(ref)
    src = Chunks(parts)
    stream = BatchStream(src, device="cuda", **STREAM)
    got = list(stream)
    torch.cuda.synchronize()
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.num.is_cuda and a.index.is_cuda and a.rows.is_cuda
        assert_same_batch(a, b)
        moved = move_data_to_device(a, torch.device("cuda", torch.cuda.current_device()))
        assert moved.num is a.num  # Lightning's transfer: nothing to move
    assert not prefetch_threads()


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_cuda_gather_never_syncs():
    parts = random_parts(1, seed=4)
    ds = ListDataset(parts[0], scope="session", max_unit_size=25,
                     features=parts[0].to("cuda"))
    sampler = GroupBatchSampler(parts[0], budget=60, scope="session", max_unit_size=25)
    plans = [ds.plan(req) for req in sampler]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        batches = [gather_batch(ds.features, p) for p in plans]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for b, req in zip(batches, sampler):
        assert_same_batch(b, ListDataset(parts[0], scope="session", max_unit_size=25)[req])
