"""The group-aware sampler and collation: whole groups, budgets, determinism, pooled lists."""

from __future__ import annotations

import collections
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from hybridrank.data.collate import ListDataset, collate
from hybridrank.data.datamodule import MIN_FITTED_BUDGET, fitted_budget
from hybridrank.data.sampler import GroupBatchSampler, negative_counts, unit_ids
from hybridrank.lists import ListData, lengths_to_offsets


def make_data(lengths, sessions=None, users=None, seed=0, ctr=0.2, times=None) -> ListData:
    rng = np.random.default_rng(seed)
    lengths = torch.as_tensor(lengths, dtype=torch.long)
    n = int(lengths.sum())
    scope = {}
    if sessions is not None:
        scope["session"] = torch.as_tensor(sessions, dtype=torch.long)
    if users is not None:
        scope["user"] = torch.as_tensor(users, dtype=torch.long)
    return ListData(
        num=torch.arange(n, dtype=torch.float32).unsqueeze(1),  # feature = row number
        cat=torch.zeros(n, 1, dtype=torch.long),
        label=torch.as_tensor(rng.random(n) < ctr, dtype=torch.float32),
        offsets=lengths_to_offsets(lengths), scope=scope,
        time=None if times is None else torch.as_tensor(times, dtype=torch.long),
    )


@st.composite
def datasets(draw):
    n_req = draw(st.integers(1, 60))
    lengths = draw(st.lists(st.integers(1, 12), min_size=n_req, max_size=n_req))
    n_sess = draw(st.integers(1, n_req))
    sessions = draw(st.lists(st.integers(0, n_sess - 1), min_size=n_req, max_size=n_req))
    return make_data(lengths, sessions=sessions, seed=draw(st.integers(0, 100)))


def epoch_rows(data, sampler, dataset):
    rows, batches = [], []
    for req in sampler:
        b = dataset[req]
        rows.append(b.rows)
        batches.append((req, b))
    return torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long), batches


@given(datasets(), st.sampled_from(["request", "session"]), st.integers(12, 80),
       st.integers(0, 5), st.integers(1, 3))
def test_every_impression_once_groups_whole_budget_respected(data, scope, budget, epoch, world):
    units = unit_ids(data, scope)
    seen = []
    n_batches = set()
    for rank in range(world):
        try:
            s = GroupBatchSampler(data, budget=budget, scope=scope, seed=7,
                                  num_replicas=world, rank=rank)
        except ValueError as e:  # a unit larger than the budget, or too few units to share
            assert "budget" in str(e) or "ranks" in str(e)
            return
        s.set_epoch(epoch)
        ds = ListDataset(data, scope=scope)
        rows, batches = epoch_rows(data, s, ds)
        n_batches.add(len(batches))
        seen.append(rows)
        for req, b in batches:
            assert len(b) <= budget
            # whole units: every request of a unit present in the batch is all of that unit
            u = units[req]
            for unit in np.unique(u):
                assert (units == unit).sum() == (u == unit).sum()
            # whole requests
            assert b.mask.sum(1).tolist() == data.lengths[torch.as_tensor(req)].tolist()
    assert len(n_batches) == 1, "every rank must get the same number of batches"
    allrows = torch.cat(seen)
    assert sorted(allrows.tolist()) == list(range(data.n_impressions))


def test_an_epoch_whose_shuffle_cannot_be_shared_takes_an_order_that_packs():
    """Two ranks, budget 17, requests of 6, 6, 12, 12, 12 rows: an order with the two 6s together
    packs four batches, one with them apart five single-request batches that two ranks cannot
    share. No epoch may fail in the middle of a run (the construction's order packed): every
    epoch still gives both ranks the same number of batches and every row once."""
    from hybridrank.data.sampler import pack

    data = make_data([6, 6, 12, 12, 12])
    sizes = np.array([6, 6, 12, 12, 12])
    seed = next(k for k in range(100)   # a seed whose epoch 0 packs (construction) and a later one not
                if len(pack(sizes[np.random.default_rng([k, 0]).permutation(5)], 17)) - 1 == 4
                and any(len(pack(sizes[np.random.default_rng([k, e]).permutation(5)], 17)) - 1 == 5
                        for e in range(1, 10)))
    ranks = [GroupBatchSampler(data, budget=17, seed=seed, num_replicas=2, rank=r) for r in range(2)]
    for epoch in range(10):
        rows = []
        for s in ranks:
            s.set_epoch(epoch)
            rows.append([int(i) for b in s for i in b])
        assert len(list(ranks[0])) == len(list(ranks[1])) == 2
        assert sorted(rows[0] + rows[1]) == [0, 1, 2, 3, 4]


@given(datasets(), st.integers(0, 3))
def test_deterministic_per_seed_and_epoch(data, epoch):
    a = GroupBatchSampler(data, budget=1000, scope="session", seed=3)
    b = GroupBatchSampler(data, budget=1000, scope="session", seed=3)
    a.set_epoch(epoch)
    b.set_epoch(epoch)
    assert [x.tolist() for x in a] == [x.tolist() for x in b]


def test_epochs_shuffle_differently():
    data = make_data([5] * 200, sessions=np.arange(200) // 4)
    s = GroupBatchSampler(data, budget=50, scope="session", seed=1)
    first = [x.tolist() for x in s]
    s.set_epoch(1)
    assert [x.tolist() for x in s] != first


def test_rank_lists_pool_sessions_request_lists_stay_requests():
    # 4 requests, sessions {0,1} and {2,3}
    data = make_data([2, 3, 1, 2], sessions=[0, 0, 1, 1])
    ds = ListDataset(data, scope="session")
    b = ds[np.array([0, 1, 2, 3])]
    assert b.mask.sum(1).tolist() == [2, 3, 1, 2]
    assert b.rank_mask.sum(1).tolist() == [5, 3]
    # the rank list of session 0 holds exactly rows 0..4 of the split
    flat = b.rows[b.rank_index[0][b.rank_mask[0]]]
    assert flat.tolist() == [0, 1, 2, 3, 4]
    # features follow their rows
    assert torch.equal(b.num[:, 0].long(), b.rows)


def test_collate_matches_loop_reference():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 9, size=30)
    data = make_data(lengths)
    req = rng.permutation(30)[:12]
    b = collate(data, torch.as_tensor(req))
    for g, r in enumerate(req):
        s, e = int(data.offsets[r]), int(data.offsets[r + 1])
        got = b.rows[b.index[g][b.mask[g]]]
        assert got.tolist() == list(range(s, e))
        assert torch.equal(b.label[b.index[g][b.mask[g]]], data.label[s:e])


def test_capping_keeps_positives_and_weights_negatives():
    lengths = [300, 10]
    data = make_data(lengths, ctr=0.05, seed=3)
    ds = ListDataset(data, max_unit_size=50, seed=0)
    b = ds[np.array([0, 1])]
    n_pos0 = int(data.label[:300].sum())
    assert b.mask.sum(1).tolist() == [max(50, n_pos0), 10]
    assert int((b.label > 0).sum()) == int(data.label.sum())
    neg0 = (b.label <= 0) & (b.rows < 300)
    expected_w = (300 - n_pos0) / (50 - n_pos0)
    assert torch.allclose(b.weight[neg0], torch.tensor(expected_w, dtype=torch.float32))
    assert torch.all(b.weight[b.rows >= 300] == 1)
    # weighted negatives add up to the unit's true negative count
    assert abs(float(b.weight[neg0].sum()) - (300 - n_pos0)) < 1e-3
    s = GroupBatchSampler(data, budget=100, max_unit_size=50)
    assert s.neg_keep_rate == pytest.approx((50 - n_pos0 + 10 - int(data.label[300:].sum())) /
                                            (310 - int(data.label.sum())))


def test_bad_input_errors():
    data = make_data([5, 5, 500])
    with pytest.raises(ValueError, match="budget"):
        GroupBatchSampler(data, budget=100)
    with pytest.raises(ValueError, match="session"):
        GroupBatchSampler(data, budget=1000, scope="session")
    with pytest.raises(ValueError, match="unknown sampler scope"):
        GroupBatchSampler(data, budget=1000, scope="sesion")
    missing = make_data([2, 2], sessions=[0, -1])
    with pytest.raises(ValueError, match="missing for request #1"):
        unit_ids(missing, "session")


def test_user_window_scope():
    data = make_data([2, 2, 2, 2], users=[0, 0, 0, 1], times=[0, 10, 100, 5])
    assert unit_ids(data, "user_window", window=50).tolist() == [0, 0, 1, 2]
    with pytest.raises(ValueError, match="window"):
        unit_ids(data, "user_window")


# ----------------------------------------------------------------------------------------------
# One unit definition, one keep-rate count, and the drop that count describes
# ----------------------------------------------------------------------------------------------
def ref_units(sessions, users, times, scope, window=None):
    """Brute force: the key of each request's unit, then dense ids in order of first key."""
    keys = []
    for r in range(len(times)):
        if scope == "request":
            keys.append(r)
        elif scope == "session":
            keys.append(sessions[r])
        elif scope == "user":
            keys.append(users[r])
        else:
            keys.append((users[r], math.floor(times[r] / window)))
    order = sorted(set(keys))
    return [order.index(k) for k in keys]


@given(datasets(), st.sampled_from(["request", "session", "user", "user_window"]),
       st.one_of(st.none(), st.integers(1, 15)), st.integers(0, 50))
def test_negative_counts_match_a_loop_and_the_drop_collate_applies(data, scope, cap, seed):
    rng = np.random.default_rng(seed)
    n_req = data.n_requests
    users = (data.scope["session"].numpy() % 3).tolist()  # sessions nest in users
    times = rng.integers(0, 200, n_req).tolist()
    data = ListData(num=data.num, cat=data.cat, label=data.label, offsets=data.offsets,
                    scope={"session": data.scope["session"], "user": torch.tensor(users)},
                    time=torch.tensor(times))
    units = ref_units(data.scope["session"].tolist(), users, times, scope, window=40)
    assert unit_ids(data, scope, window=40).tolist() == units
    # brute force: per unit size, positives, kept = all up to the cap, else max(positives, cap)
    size = collections.Counter()
    pos = collections.Counter()
    for r in range(n_req):
        s, e = int(data.offsets[r]), int(data.offsets[r + 1])
        size[units[r]] += e - s
        pos[units[r]] += int((data.label[s:e] > 0).sum())
    neg = sum(size[u] - pos[u] for u in size)
    kept_u = {u: (size[u] if cap is None or size[u] <= cap else max(pos[u], cap)) - pos[u] for u in size}
    kept = sum(kept_u.values())
    assert negative_counts(data, scope, window=40, max_unit_size=cap) == (neg, kept)
    # collate over every unit drops exactly the negatives the count says it keeps
    ds = ListDataset(data, scope=scope, window=40, max_unit_size=cap, seed=seed)
    order = np.argsort(units, kind="stable")
    b = ds[order]
    assert int((b.label <= 0).sum()) == kept and int((b.label > 0).sum()) == sum(pos.values())
    if b.weight is not None:  # the kept negatives of a unit weigh up to all its negatives
        represented = sum(size[u] - pos[u] for u in size if kept_u[u] > 0)
        assert abs(float(b.weight[b.label <= 0].sum()) - represented) < 1e-3 * max(neg, 1)


def test_units_are_keyed_by_request_time_whatever_the_rows_times():
    """A request whose rows straddle a window boundary belongs to the window of its first time:
    from a frame (before any schema) and from the transformed split alike."""
    import polars as pl

    from hybridrank.data.readers import ColumnMap
    from hybridrank.data.schema import Schema, request_lists

    frame = pl.DataFrame({
        "r": [1, 1, 1, 2, 2, 3, 3], "u": [7, 7, 7, 7, 7, 7, 7],
        "t": [48, 49, 51, 52, 53, 98, 120],  # request 1 crosses t=50, request 3 crosses t=100
        "y": [1.0, 0, 0, 0, 0, 1, 0], "x": [0.0] * 7,
    })
    cm = ColumnMap(request="r", label="y", user="u", time="t", numeric=["x"])
    lists = request_lists(frame, cm)
    data = Schema.fit(frame, cm, 1).transform(frame)
    assert lists.time.tolist() == data.time.tolist() == [48, 52, 98]
    # windows of 50: request 1 -> [0, 50), requests 2 and 3 -> [50, 100)
    assert unit_ids(lists, "user_window", 50).tolist() == unit_ids(data, "user_window", 50).tolist() \
        == [0, 1, 1]
    assert negative_counts(lists, "user_window", 50, max_unit_size=2) == \
        negative_counts(data, "user_window", 50, max_unit_size=2) == (5, 2)


class _TwoChunks:
    """Not a ``Source``: only what the batch builder reads (``ChunkedSource``)."""

    schema = None

    def __init__(self, parts):
        from hybridrank.data.scanner import Chunk

        self.parts, base = parts, 0
        self.chunks = []
        for i, d in enumerate(parts):
            self.chunks.append(Chunk(i, d.n_impressions, d.n_requests, base))
            base += d.n_impressions

    def layout(self):
        return self.chunks

    def read_chunk(self, chunk, split):
        return self.parts[chunk.index] if split == "train" else None


def test_the_batch_builder_needs_only_the_chunked_source_members():
    """``BatchStream`` batches any object with ``layout``, ``read_chunk`` and ``schema``: chunk by
    chunk in the epoch's chunk order, each chunk's batches those of its own sampler and collate,
    rows numbered over the whole source; every ``Source`` has the three members."""
    import inspect

    from hybridrank.data.chunked import ChunkedSource
    from hybridrank.data.sources import Source
    from hybridrank.data.stream import BatchStream, chunk_seed

    parts = [make_data([3, 5, 2, 7, 4, 6], sessions=[0, 0, 1, 2, 2, 2], seed=1),
             make_data([2, 8, 3, 3], sessions=[0, 1, 1, 1], seed=2)]
    src = _TwoChunks(parts)
    stream = BatchStream(src, budget=12, scope="session", max_unit_size=9, seed=3)
    stream.set_epoch(4)
    got = list(stream)
    order = np.random.default_rng([3, 4]).permutation(2)
    want = []
    for c in order:
        sampler = GroupBatchSampler(parts[c], budget=12, scope="session", max_unit_size=9,
                                    seed=chunk_seed(3, c))
        sampler.set_epoch(4)
        ds = ListDataset(parts[c], scope="session", max_unit_size=9, seed=chunk_seed(3, c))
        want += [(ds[req], src.chunks[c].base) for req in sampler]
    assert len(got) == len(want) > 2
    for b, (w, base) in zip(got, want):
        assert torch.equal(b.rows, w.rows + base) and torch.equal(b.label, w.label)
        assert torch.equal(b.rank_index, w.rank_index)
        assert (b.weight is None) == (w.weight is None)
        assert b.weight is None or torch.equal(b.weight, w.weight)
    assert any(b.weight is not None for b in got)  # a session over the cap: negatives dropped
    rows = torch.cat([b.rows for b in got])
    positives = torch.cat([d.label for d in parts]).nonzero().squeeze(1)
    assert rows.unique().numel() == rows.numel() and set(positives.tolist()) <= set(rows.tolist())
    assert list(BatchStream(src, split="val")) == []
    members = {n for n, v in vars(ChunkedSource).items()
               if not n.startswith("__") and (inspect.isfunction(v) or isinstance(v, property))}
    assert members == {"schema", "layout", "read_chunk"}
    assert all(hasattr(Source, n) for n in members)


@given(st.integers(0, 2_000_000), st.sampled_from([64, 512, 4096, 65536]), st.integers(0, 64),
       st.sampled_from([None, 16, 512, 4096]))
def test_fitted_budget_gives_an_epoch_min_batches_above_its_floor(rows, budget, min_batches, cap):
    """``fitted_budget`` against its contract, checked by counting: never over the budget; a
    shrunk budget gives an epoch at least ``min_batches`` batches (``ceil(rows / budget)``
    is the fewest batches whole units can pack into) unless it stopped at the floor
    (512, or the unit cap); off (0) or uncapped units: the budget as given."""
    cap = None if cap is None else min(cap, budget)  # the data module caps units at the budget
    got = fitted_budget(rows, budget, min_batches, cap)
    assert got <= budget
    if min_batches == 0 or cap is None:
        assert got == budget
        return
    floor = min(budget, max(MIN_FITTED_BUDGET, cap))
    assert got >= floor
    if got < budget and got > floor:
        assert math.ceil(rows / got) >= min_batches
    if rows >= budget * min_batches:
        assert got == budget


def test_a_small_training_split_gets_min_batches_batches_and_a_large_one_keeps_the_budget():
    """Through the data module on simulated logs: a ~5k-impression training split trains in
    batches of ``max(512, ceil(rows / 32))`` and an epoch has at least 32 of them; a log of more
    than ``budget * min_batches`` impressions keeps the budget; ``min_batches=0`` keeps it."""
    from hybridrank.data.datamodule import ListDataModule
    from hybridrank.data.sources import SimulatedSource

    def module(n_users, **kwargs):
        return ListDataModule(SimulatedSource(n_users=n_users, n_items=300, seed=3), budget=4096,
                              **kwargs)

    small = module(250, min_batches=32)
    small.model_data()
    rows = small.split_rows["train"]
    assert rows < 4096 * 32
    assert small.budget == max(512, math.ceil(rows / 32)) < 4096
    assert small.max_budget == 4096
    batches = list(small.train_stream(0))
    assert len(batches) >= 32 and max(len(b) for b in batches) <= small.budget
    assert sum(len(b) for b in batches) == rows

    off = module(250, min_batches=0)
    off.model_data()
    assert off.budget == 4096 and len(list(off.train_stream(0))) < 32
    uncapped = module(250, min_batches=32, max_unit_size=None)
    uncapped.model_data()
    assert uncapped.budget == 4096

    large = module(2500, min_batches=32)
    large.model_data()
    assert large.split_rows["train"] > 4096 * 32 and large.budget == 4096


@pytest.mark.parametrize("bad", [-1, 2.5, True, "32"])
def test_min_batches_must_be_a_whole_number(bad):
    from hybridrank.data.datamodule import ListDataModule
    from hybridrank.data.sources import SimulatedSource

    with pytest.raises(ValueError, match=r"data\.min_batches must be a whole number >= 0"):
        ListDataModule(SimulatedSource(n_users=20, seed=0), min_batches=bad)
