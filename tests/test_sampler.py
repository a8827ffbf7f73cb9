"""The group-aware sampler and collation: whole groups, budgets, determinism, pooled lists."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from hybridrank.data.sampler import GroupBatchSampler, ListDataset, collate, unit_ids
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
