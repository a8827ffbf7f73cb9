"""Unseen-value dropout (``hybridrank.models.unseen``): the Good-Turing share, the per-value drop
probabilities, the draws, the datamodule's occurrence counts and the model's use of them."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from hypothesis import given
from hypothesis import strategies as st

from hybridrank.data.datamodule import ListDataModule
from hybridrank.data.simulate import simulate_clicklog
from hybridrank.data.sources import SIM_COLUMNS_MAP, ClickLogSource
from hybridrank.data.streaming import StreamingClickLogSource
from hybridrank.losses import HybridLoss
from hybridrank.models.ranker import HybridRanker
from hybridrank.models.scorers import MLPScorer
from hybridrank.models.unseen import (
    drop_probabilities,
    drop_unseen,
    good_turing_unseen,
    probability_tables,
)

counts_st = st.lists(st.integers(0, 40), min_size=2, max_size=60).map(np.array)


@given(counts_st)
def test_good_turing_share_is_singletons_over_occurrences(c):
    n = int(c.sum())
    singletons = sum(1 for k in range(1, len(c)) if c[k] == 1)
    assert good_turing_unseen(c) == (singletons / n if n else 0.0)


@given(counts_st)
def test_drop_probabilities_reach_the_good_turing_share_rare_values_most(c):
    p, info = drop_probabilities(c)
    n = int(c.sum())
    assert p[0] == 0 and ((p >= 0) & (p <= 1)).all()
    assert info["already"] == pytest.approx(c[0] / n if n else 0.0)
    # code 0 after dropout holds the Good-Turing share, or what it already held when that is more
    after = (c[0] + (p * c).sum()) / n if n else 0.0
    assert after == pytest.approx(max(info["already"], info["good_turing"]), abs=1e-7)
    assert info["dropped"] == pytest.approx(after - info["already"], abs=1e-7)
    seen = c[1:] > 0
    order = np.argsort(c[1:][seen], kind="stable")
    assert (np.diff(p[1:][seen][order]) <= 1e-12).all()  # the more often seen, the less dropped
    if info["dropped"] == 0:
        assert (p == 0).all()


def test_drop_probabilities_worked_examples():
    # 4 singletons and one value seen 6 times in 10 occurrences: 40 % unseen by Good-Turing;
    # 4 a / (1 + a) + 6 a / (6 + a) = 4 rows, by hand: 4a(6 + a) + 6a(1 + a) = 4(1 + a)(6 + a),
    # 10a^2 + 30a = 4a^2 + 28a + 24, so 6a^2 + 2a - 24 = 0
    p, info = drop_probabilities([0, 1, 1, 1, 1, 6])
    a = (-2 + np.sqrt(4 + 4 * 6 * 24)) / 12
    assert info["alpha"] == pytest.approx(a, rel=1e-8)
    np.testing.assert_allclose(p, [0] + [a / (1 + a)] * 4 + [a / (6 + a)], rtol=1e-8)
    # code 0 already holds more than the Good-Turing share (min_count, missing values): no dropout
    p, info = drop_probabilities([5, 1, 1, 3])
    assert (p == 0).all() and info["dropped"] == 0 and info["already"] == 0.5
    # every value a singleton: every value is dropped (JSON-safe alpha)
    p, info = drop_probabilities([0, 1, 1, 1])
    assert (p[1:] == 1).all() and info["alpha"] is None and info["dropped"] == 1.0
    # nothing seen twice is not needed: no singleton, nothing to drop
    p, info = drop_probabilities([0, 2, 3])
    assert (p == 0).all() and info["good_turing"] == 0.0
    with pytest.raises(ValueError, match="non-negative integers"):
        drop_probabilities([0, -1, 2])
    with pytest.raises(ValueError, match="non-negative integers"):
        drop_probabilities([0.5, 1.0])


def test_draws_follow_the_probabilities_one_per_request_and_leave_other_columns():
    g = torch.Generator().manual_seed(0)
    probs = torch.tensor([0.0, 0.5, 0.1, 0.9])
    n_req, per = 20_000, 3
    request = torch.arange(n_req).repeat_interleave(per)
    codes = torch.randint(1, 4, (n_req,), generator=g).repeat_interleave(per)
    other = torch.randint(0, 7, (n_req * per,), generator=g)
    cat = torch.stack([codes, other], dim=1)
    before = cat.clone()
    out = drop_unseen(cat, [probs, None], request, generator=g)
    assert torch.equal(cat, before)  # the input is not modified
    assert torch.equal(out[:, 1], other)
    dropped = (out[:, 0] == 0).view(n_req, per)
    assert (dropped.all(1) | ~dropped.any(1)).all()  # a request's rows share the decision
    for code in (1, 2, 3):
        m = codes[::per] == code
        share, p = dropped[m, 0].double().mean().item(), probs[code].item()
        assert abs(share - p) < 4 * np.sqrt(p * (1 - p) / int(m.sum()))
    assert (out[:, 0][~dropped.flatten()] == codes[~dropped.flatten()]).all()
    # one draw per row without requests; nothing to drop: the tensor itself
    rows = (drop_unseen(cat, [probs, None], generator=g)[:, 0] == 0).view(n_req, per)
    assert (rows.any(1) & ~rows.all(1)).any()
    assert drop_unseen(cat, [None, None]) is cat
    with pytest.raises(ValueError, match="2 categorical columns"):
        drop_unseen(cat, [probs])


def _sources(tmp_path, vocab=None):
    df = simulate_clicklog(n_users=80, seed=4)
    folder = tmp_path / "parts"
    folder.mkdir()
    for k, part in enumerate(df.partition_by("user_id", maintain_order=True, as_dict=False)):
        part.write_parquet(folder / f"p{k % 3}_{k}.parquet")
    cols = SIM_COLUMNS_MAP.to_dict()
    split = {"by": "hash", "key": "request", "val": 0.1, "test": 0.1, "seed": 0}
    vocab = vocab or {"hash_buckets": {"item_category": 8}}
    whole = ClickLogSource(str(folder / "*.parquet"), cols, split=split, vocab=vocab)
    streamed = StreamingClickLogSource(str(folder / "*.parquet"), cols, split=split, vocab=vocab,
                                       chunk_rows=700)
    return whole, streamed


@pytest.mark.slow
@pytest.mark.parametrize("vocab,tallied", [
    (None, True),                                                    # every value in the vocabulary
    ({"hash_buckets": {"item_category": 8}, "columns": {"user_id": {"min_count": 40}}}, True),
    ({"hash_buckets": {"item_category": 8}, "columns": {"item_id": {"min_count": 40}}}, False),
])
def test_value_counts_count_requests_per_code_in_memory_and_streamed(tmp_path, monkeypatch, vocab, tallied):
    """The brute-force count of requests per code, in memory and streamed. A streamed source
    tallies the values during its schema pass and reads no training chunk again for the counts,
    unless a column holding several values per request (an item) drops some to code 0 (then the
    pass is made); a user column dropping values is tallied exactly."""
    whole, streamed = _sources(tmp_path, vocab)
    assert len(streamed.layout()) > 3
    a, b = ListDataModule(whole, budget=512), ListDataModule(streamed, budget=512)
    b.model_data()
    reads = []
    real = type(streamed).read_chunk

    def counted(self, chunk, split):
        reads.append(split)
        return real(self, chunk, split)

    monkeypatch.setattr(type(streamed), "read_chunk", counted)
    cb = b.value_counts()
    assert ("train" in reads) is not tallied, reads
    ca = a.value_counts()
    schema = a.schema
    assert set(ca) == {"user_id", "item_id"}  # the hashed column has no vocabulary
    for name in ca:
        j = schema.categorical.index(name)
        ref: Counter = Counter()
        for part in a.eval_chunks("train"):  # brute force: a set of codes per request
            for r in range(part.n_requests):
                lo, hi = int(part.offsets[r]), int(part.offsets[r + 1])
                ref.update(set(part.cat[lo:hi, j].tolist()))
        expect = np.zeros(schema.vocab_sizes[j] + 1, dtype=np.int64)
        for code, k in ref.items():
            expect[code] = k
        np.testing.assert_array_equal(ca[name], expect)
        np.testing.assert_array_equal(cb[name], expect)
    assert ca["user_id"].sum() == sum(p.n_requests for p in a.eval_chunks("train"))


def _model(schema, mode="good_turing"):
    return HybridRanker({"_target_": "hybridrank.models.scorers.MLPScorer", "_partial_": True,
                         "hidden": [8]}, HybridLoss(point_weight=1.0),
                        data={"schema": schema.to_dict(), "base_rate": 0.05}, unseen_dropout=mode)


def test_the_model_trains_the_unseen_row_only_with_dropout(tmp_path):
    whole, _ = _sources(tmp_path)
    dm = ListDataModule(whole, budget=512)
    counts = dm.value_counts()
    j = dm.schema.categorical.index("user_id")
    rows0 = {}
    for mode in ("good_turing", "off"):
        pl.seed_everything(0, verbose=False)
        model = _model(dm.schema, mode)
        assert isinstance(model.scorer, MLPScorer)
        init = model.scorer.embeddings.tables[j].weight[0].detach().clone()
        trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(model, datamodule=dm)
        rows0[mode] = (init, model.scorer.embeddings.tables[j].weight[0].detach())
        if mode == "off":
            assert model.unseen_report == {}
        else:
            info = model.unseen_report["user_id"]
            c = counts["user_id"]
            assert info["good_turing"] == pytest.approx(good_turing_unseen(c)) and info["dropped"] > 0
            assert model.hparams["unseen_dropout"] == "good_turing"
    init, after = rows0["good_turing"]
    assert not torch.allclose(init, after)  # code 0 was trained
    init, after = rows0["off"]
    assert torch.equal(init, after)  # no training row has code 0: its row keeps its start


def test_set_value_counts_checks_what_it_is_given(tmp_path):
    whole, _ = _sources(tmp_path)
    schema = ListDataModule(whole, budget=512).schema
    model = _model(schema)
    j = schema.categorical.index("user_id")
    with pytest.raises(ValueError, match="not a categorical feature"):
        model.set_value_counts({"nope": np.zeros(3, dtype=np.int64)})
    with pytest.raises(ValueError, match=r"value counts of 'user_id': 3 codes, the schema has"):
        model.set_value_counts({"user_id": np.zeros(3, dtype=np.int64)})
    with pytest.raises(ValueError, match="unseen_dropout must be one of"):
        _model(schema, "sometimes")
    n = schema.vocab_sizes[j] + 1
    tables, report = probability_tables({"user_id": np.r_[0, np.ones(n - 1, dtype=np.int64)]},
                                        schema.categorical)
    assert [t is None for t in tables] == [c != "user_id" for c in schema.categorical]
    assert report["user_id"]["dropped"] == 1.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_draws_on_a_gpu_equal_those_on_the_cpu():
    """The model draws from a CPU generator seeded by (run seed, step, rank): tables and codes on
    the GPU give the same codes as on the CPU."""
    probs = torch.tensor([0.0, 0.5, 0.1, 0.9])
    cat = torch.randint(1, 4, (5000, 2), generator=torch.Generator().manual_seed(1))
    request = torch.arange(5000) // 4
    cpu = drop_unseen(cat, [probs, None], request, generator=torch.Generator().manual_seed(7))
    gpu = drop_unseen(cat.cuda(), [probs.cuda(), None], request.cuda(),
                      generator=torch.Generator().manual_seed(7))
    assert gpu.device.type == "cuda" and torch.equal(gpu.cpu(), cpu)


@pytest.mark.slow
def test_scorer_presets_and_yaml_booleans(compose_cfg, tmp_path):
    """The presets of conf/model (on where measured to help, off where not) reach the model as
    strings; a bare YAML ``off`` / ``on`` (read as a boolean) means off / good_turing."""
    presets = {m: compose_cfg("config", f"model={m}").model.unseen_dropout
               for m in ("mlp", "linear", "list_aware", "fm", "deepfm", "dcnv2")}
    assert presets == {"mlp": "good_turing", "linear": "good_turing", "list_aware": "good_turing",
                       "fm": "off", "deepfm": "off", "dcnv2": "off"}
    whole, _ = _sources(tmp_path)
    schema = ListDataModule(whole, budget=512).schema
    assert _model(schema, False).unseen_dropout == "off"
    assert _model(schema, True).unseen_dropout == "good_turing"


def test_a_cli_run_reports_the_dropout_per_column(small_run):
    """``train`` puts the report in its result and ``metrics.json``: per vocabulary column the
    Good-Turing share of the training occurrences it counted, and what it dropped."""
    import json

    report = small_run["result"]["unseen_dropout"]
    assert report == json.loads((small_run["out"] / "metrics.json").read_text())["unseen_dropout"]
    assert set(report) == {"user_id", "item_id", "item_category"}
    for info in report.values():
        assert info["already"] + info["dropped"] == pytest.approx(max(info["already"], info["good_turing"]))
