"""Larger-than-memory click logs: streaming parquet chunks of whole requests (hybridrank.data.streaming),
and the one data path they share with in-memory sources."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import pytorch_lightning as pl_
import torch
from memprobe import PROBE
from torch.utils.data import DataLoader

from hybridrank.data.collate import ListDataset
from hybridrank.data.datamodule import ListDataModule
from hybridrank.data.readers import ColumnMap, read_clicklog
from hybridrank.data.sampler import GroupBatchSampler
from hybridrank.data.schema import Schema
from hybridrank.data.simulate import simulate_clicklog
from hybridrank.data.sources import SIM_COLUMNS_MAP, ClickLogSource
from hybridrank.data.stream import BatchStream
from hybridrank.data.streaming import StreamingClickLogSource
from hybridrank.evaluation import evaluate_model
from hybridrank.losses import HybridLoss
from hybridrank.models.ranker import HybridRanker
from hybridrank.models.scorers import MLPScorer

N_FILES = 8


def write_parts(df: pl.DataFrame, folder: Path, n_files: int, row_group: int = 10_000) -> list[Path]:
    """Cut a simulated log (sorted by request) into ``n_files`` files at request boundaries."""
    folder.mkdir(parents=True, exist_ok=True)
    req = df["request_id"].to_numpy()
    cuts = np.searchsorted(req, np.linspace(0, req.max() + 1, n_files + 1).astype(np.int64))
    paths = []
    for i in range(n_files):
        p = folder / f"part-{i:03d}.parquet"
        df.slice(int(cuts[i]), int(cuts[i + 1] - cuts[i])).write_parquet(p, row_group_size=row_group)
        paths.append(p)
    return paths


@pytest.fixture(scope="module")
def big_log(tmp_path_factory) -> dict:
    """8 parquet files of ~100k impressions each (~800k in all), row groups of 10k rows."""
    folder = tmp_path_factory.mktemp("stream")
    df = simulate_clicklog(n_users=7_500, seed=3)
    write_parts(df, folder, N_FILES)
    return {"glob": str(folder / "*.parquet"), "n": df.height, "clicks": int(df["click"].sum())}


@pytest.fixture(scope="module")
def small_log(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("small")
    df = simulate_clicklog(n_users=120, seed=5)
    paths = write_parts(df, folder, 3, row_group=500)
    return {"glob": str(folder / "*.parquet"), "df": df, "paths": paths, "folder": folder}


# ----------------------------------------------------------------------------------------------
# Memory: a subprocess per measurement, peak RSS growth over a baseline taken after the imports
# ----------------------------------------------------------------------------------------------
_PRELUDE = PROBE + """
import json, sys
from hybridrank.data import SIM_COLUMNS_MAP, Schema
from hybridrank.data.stream import BatchStream
from hybridrank.data.streaming import StreamingClickLogSource
base = reset_peak()
"""

_FULL = _PRELUDE + """
frame = pl.read_parquet(sys.argv[1])
schema = Schema.fit(frame, SIM_COLUMNS_MAP, 1)
data = schema.transform(frame)
print(json.dumps({"growth_mb": peak_mb() - base, "n": data.n_impressions}))
"""

_STREAM = _PRELUDE + """
src = StreamingClickLogSource(sys.argv[1], SIM_COLUMNS_MAP, chunk_rows=int(sys.argv[2]))
rows, clicks, batches = [], 0.0, 0
for b in BatchStream(src, budget=4096, scope="session", seed=1):
    rows.append(b.rows.numpy().astype("int32")); clicks += float(b.label.sum()); batches += 1
import numpy as np
rows = np.sort(np.concatenate(rows))
print(json.dumps({"growth_mb": peak_mb() - base, "n": int(rows.size), "batches": batches,
                  "once": bool(np.array_equal(rows, np.arange(src.n_impressions))),
                  "clicks": clicks, "chunks": len(src.layout())}))
"""


def _run(*jobs: tuple[str, ...]) -> list[dict]:
    """Run each ``(code, *args)`` in its own fresh interpreter, side by side; their JSON results."""
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for code, *args in jobs]
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-3000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


@pytest.mark.slow
def test_one_epoch_streams_every_impression_once_in_bounded_memory(big_log):
    full, stream = _run((_FULL, big_log["glob"]), (_STREAM, big_log["glob"], "40000"))
    print(f"\nfull load: +{full['growth_mb']:.0f} MB peak RSS for {full['n']} impressions; "
          f"streaming ({stream['chunks']} chunks of ~40k rows): +{stream['growth_mb']:.0f} MB, "
          f"{stream['batches']} batches")
    # every impression exactly once, nothing dropped or repeated, labels intact
    assert full["n"] == stream["n"] == big_log["n"]
    assert stream["once"]
    assert stream["clicks"] == big_log["clicks"]
    # memory bounded by the chunk, not the data: well below the full load measured the same way
    assert full["growth_mb"] > 100, full
    assert stream["growth_mb"] < 0.4 * full["growth_mb"], (stream, full)


@pytest.mark.slow
def test_streaming_loader_trains_a_hybrid_ranker(big_log):
    src = StreamingClickLogSource(big_log["glob"], SIM_COLUMNS_MAP, chunk_rows=50_000, fit_rows=100_000)
    loader = DataLoader(BatchStream(src, budget=4096, scope="session", max_unit_size=512, seed=0),
                        batch_size=None, collate_fn=lambda b: b)
    pl_.seed_everything(0, verbose=False)
    scorer = MLPScorer(len(src.schema.numeric), list(src.schema.vocab_sizes), base_rate=0.03)
    loss = HybridLoss(point_weight=0.5, terms={"softmax": {"loss": "softmax", "weight": 0.5}})
    module = HybridRanker(scorer, loss)
    before = [p.detach().clone() for p in scorer.parameters()]
    trainer = pl_.Trainer(accelerator="cpu", devices=1, max_epochs=1, limit_train_batches=25,
                          logger=False, enable_checkpointing=False, enable_progress_bar=False,
                          enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(module, train_dataloaders=loader)
    assert trainer.global_step == 25
    loss_value = float(trainer.callback_metrics["train/loss"])
    assert np.isfinite(loss_value) and loss_value > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, scorer.parameters()))
    # users first seen after the fitted rows (the log is in time order) go to the OOV bucket 0
    assert set(src.oov) == set(SIM_COLUMNS_MAP.categorical) and src.oov["user_id"] > 0


# ----------------------------------------------------------------------------------------------
# Fast checks on a small log
# ----------------------------------------------------------------------------------------------
def test_streamed_schema_equals_in_memory_fit(small_log):
    src = StreamingClickLogSource(small_log["glob"], SIM_COLUMNS_MAP, chunk_rows=700)
    ref = Schema.fit(small_log["df"], SIM_COLUMNS_MAP, 1)
    assert src.schema.vocab == ref.vocab and src.schema.numeric == ref.numeric
    np.testing.assert_allclose(src.schema.mean, ref.mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(src.schema.std, ref.std, rtol=1e-12)
    # chunks hold whole requests and tile every file
    chunks = src.layout()
    assert len(chunks) > 3 and sum(c.n_rows for c in chunks) == small_log["df"].height
    for c in chunks:
        assert sum(n for _, _, n in c.pieces) == c.n_rows
        for fi, start, n in c.pieces:
            keys = pl.read_parquet(src.files[fi])["request_id"]
            assert start == 0 or keys[start] != keys[start - 1]
            end = start + n
            assert end == len(keys) or keys[end] != keys[end - 1]


@pytest.mark.slow
def test_validation_and_test_parts_are_kept_once_read_within_the_cache(small_log):
    """A log of several chunks keeps the validation / test parts it has read while they fit in
    ``eval_cache_mb``: a second pass reads no file and gives the same data; training parts are
    never kept; a smaller cache keeps only what fits; 0 keeps nothing."""
    def counting(**kw):
        src = StreamingClickLogSource(small_log["glob"], SIM_COLUMNS_MAP, chunk_rows=700, split={}, **kw)
        src.schema  # noqa: B018  (the fit reads every chunk once)
        reads = []
        original = src._read_parts
        src._read_parts = lambda chunk: reads.append(chunk.index) or original(chunk)
        return src, reads

    src, reads = counting()
    n = len(src.layout())
    first = {s: list(src.chunks(s)) for s in ("val", "test", "train")}
    # every chunk once for validation, which keeps its test part too, and once for training
    assert reads.count(0) == 2 and len(reads) == 2 * n
    reads.clear()
    again = {s: list(src.chunks(s)) for s in ("val", "test")}
    assert reads == []
    for s in ("val", "test"):
        assert len(again[s]) == len(first[s]) and all(a is b for a, b in zip(again[s], first[s]))
    list(src.chunks("train"))
    assert len(reads) == n                                    # training parts are read again
    # room for the first chunk's validation and test parts only
    small, reads = counting(eval_cache_mb=(first["val"][0].nbytes + first["test"][0].nbytes) / 2**20)
    list(small.chunks("val"))
    reads.clear()
    assert [d.n_impressions for d in small.chunks("val")] == [d.n_impressions for d in first["val"]]
    assert reads == list(range(1, n))
    reads.clear()
    list(small.chunks("test"))
    assert reads == list(range(1, n))
    none, reads = counting(eval_cache_mb=0)
    list(none.chunks("val"))
    list(none.chunks("val"))
    assert len(reads) == 2 * n
    with pytest.raises(ValueError, match="eval_cache_mb must be >= 0"):
        StreamingClickLogSource(small_log["glob"], SIM_COLUMNS_MAP, eval_cache_mb=-1)


def test_streamed_time_features_equal_in_memory(small_log):
    """Calendar features derived from the time column: the streamed schema and batches' codes
    are those of the in-memory read."""
    cm = ColumnMap.from_dict({**SIM_COLUMNS_MAP.to_dict(), "time_features": ["weekday", "hour"]})
    src = StreamingClickLogSource(small_log["glob"], cm, chunk_rows=700)
    ref = Schema.fit(read_clicklog(small_log["glob"], cm), cm, 1)
    assert src.schema.categorical[-2:] == ("time_weekday", "time_hour")
    assert src.schema.vocab == ref.vocab and len(ref.vocab["time_hour"]) > 1


def test_oov_counts_match_a_reference(small_log):
    """Schema fitted on the first chunk only: every later id outside its vocabulary is counted."""
    src = StreamingClickLogSource(small_log["glob"], SIM_COLUMNS_MAP, chunk_rows=700, fit_rows=1)
    datas = list(src.chunks())
    df = small_log["df"]
    for c in SIM_COLUMNS_MAP.categorical:
        known = set(src.schema.vocab[c])
        expected = int((~df[c].cast(pl.String).is_in(list(known))).sum())
        assert src.oov[c] == expected, c
        assert sum(int((d.cat[:, SIM_COLUMNS_MAP.categorical.index(c)] == 0).sum())
                   for d in datas) == expected
    assert src.oov["user_id"] > 0


@pytest.mark.slow
def test_every_impression_once_and_batches_hold_whole_requests(small_log):
    src = StreamingClickLogSource(small_log["glob"], SIM_COLUMNS_MAP, chunk_rows=900)
    ds = BatchStream(src, budget=300, scope="request", seed=2)
    rows = []
    for b in ds:
        assert len(b) <= 300 and b.mask.sum() == len(b)
        rows.append(b.rows)
    assert torch.equal(torch.cat(rows).sort().values, torch.arange(small_log["df"].height))
    # epochs reshuffle deterministically: same epoch, same batches; next epoch, another order
    ds.set_epoch(0)
    a = [b.rows for b in ds]
    ds.set_epoch(0)
    assert all(torch.equal(x, y) for x, y in zip(a, [b.rows for b in ds]))
    ds.set_epoch(1)
    assert not all(torch.equal(x, y) for x, y in zip(a, [b.rows for b in ds]))


@pytest.mark.slow
def test_ddp_shards_are_disjoint_and_equal_length(small_log):
    src = StreamingClickLogSource(small_log["glob"], SIM_COLUMNS_MAP, chunk_rows=400)
    shards = [list(BatchStream(src, budget=256, num_replicas=3, rank=r, seed=0)) for r in range(3)]
    assert len({len(s) for s in shards}) == 1 and len(shards[0]) > 0
    seen = torch.cat([b.rows for s in shards for b in s])
    assert seen.unique().numel() == seen.numel()  # no impression on two ranks
    with pytest.raises(ValueError, match="cannot feed 1000 shards"):
        list(BatchStream(src, num_replicas=1000, rank=0))


def test_request_split_inside_a_file_is_an_error(small_log, tmp_path):
    df = pl.read_parquet(small_log["paths"][0])
    first = df["request_id"][0]
    moved = pl.concat([df.slice(1), df.slice(0, 1)])  # first row of request `first` goes last
    moved.write_parquet(tmp_path / "a.parquet")
    with pytest.raises(ValueError, match=rf"a\.parquet: request {first} is not contiguous: its rows "
                                         r"start at row 1 and again at row \d+"):
        StreamingClickLogSource(tmp_path / "a.parquet", SIM_COLUMNS_MAP).layout()


@pytest.mark.slow
def test_request_continuing_into_the_next_file_is_one_request(small_log, tmp_path):
    """Logs are often cut into files by size: a request may continue from one file into the next."""
    df = small_log["df"]
    r = df["request_id"][df.height // 2]
    cut = int((df["request_id"] == r).arg_true()[1])  # inside request r
    df.slice(0, cut).write_parquet(tmp_path / "p0.parquet")
    df.slice(cut).write_parquet(tmp_path / "p1.parquet")
    src = StreamingClickLogSource(str(tmp_path / "p*.parquet"), SIM_COLUMNS_MAP, chunk_rows=300)
    datas = list(src.chunks())
    assert sum(d.n_requests for d in datas) == df["request_id"].n_unique()
    whole = [d for d in datas if r in d.request_key.to_list()]
    assert len(whole) == 1
    i = whole[0].request_key.to_list().index(r)
    assert int(whole[0].lengths[i]) == int((df["request_id"] == r).sum())


def test_request_in_two_separate_places_is_an_error(small_log, tmp_path):
    df = small_log["df"]
    r = df["request_id"][df.height // 2]
    rows = df.filter(pl.col("request_id") == r)
    rest = df.filter(pl.col("request_id") != r)
    rows.head(1).write_parquet(tmp_path / "p0.parquet")
    rest.write_parquet(tmp_path / "p1.parquet")
    rows.slice(1).write_parquet(tmp_path / "p2.parquet")
    with pytest.raises(ValueError, match=rf"request {r} spans two files \(.*p0\.parquet and "
                                         r".*p2\.parquet\) without continuing"):
        StreamingClickLogSource(str(tmp_path / "p*.parquet"), SIM_COLUMNS_MAP).layout()


def test_bad_values_name_file_and_row(small_log, tmp_path):
    df = small_log["df"].with_row_index("i").with_columns(
        item_pop=pl.when(pl.col("i") == 1234).then(float("nan")).otherwise(pl.col("item_pop")))
    df.drop("i").write_parquet(tmp_path / "bad.parquet", row_group_size=300)
    src = StreamingClickLogSource(tmp_path / "bad.parquet", SIM_COLUMNS_MAP, chunk_rows=500)
    with pytest.raises(ValueError, match=r"numeric feature 'item_pop' has missing/NaN/inf .* at "
                                         r".*bad\.parquet row 1235"):
        src.fit_schema()


@pytest.mark.slow
def test_input_errors(small_log, tmp_path):
    with pytest.raises(FileNotFoundError, match="no click-log files match"):
        StreamingClickLogSource(str(tmp_path / "none*.parquet"), SIM_COLUMNS_MAP)
    small_log["df"].write_csv(tmp_path / "log.csv")  # CSV streams as well (one scanner for both)
    csv = StreamingClickLogSource(tmp_path / "log.csv", SIM_COLUMNS_MAP, chunk_rows=900)
    assert sum(d.n_impressions for d in csv.chunks()) == small_log["df"].height
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="click logs must be all .parquet or all .csv"):
        StreamingClickLogSource(tmp_path / "notes.txt", SIM_COLUMNS_MAP)
    small_log["df"].drop("bid").write_parquet(tmp_path / "nobid.parquet")
    with pytest.raises(ValueError, match=r"mapped column\(s\) \['bid'\] not found"):
        StreamingClickLogSource(tmp_path / "nobid.parquet", SIM_COLUMNS_MAP)
    small_log["df"].head(0).write_parquet(tmp_path / "empty.parquet")
    with pytest.raises(ValueError, match="empty: no rows"):
        StreamingClickLogSource(tmp_path / "empty.parquet", SIM_COLUMNS_MAP).layout()
    src = StreamingClickLogSource(small_log["glob"], SIM_COLUMNS_MAP, chunk_rows=500)
    with pytest.raises(ValueError, match="do not fit the batch budget of 3"):
        list(BatchStream(src, budget=3, scope="session"))


# ----------------------------------------------------------------------------------------------
# One data path: in memory is the streamed path with one chunk
# ----------------------------------------------------------------------------------------------
ONE_PATH_SPLIT = {"by": "hash", "val": 0.15, "test": 0.2, "key": "session", "seed": 4}
ONE_PATH_BATCHING = dict(budget=700, scope="session", max_unit_size=40, reweight_negatives=True,
                         eval_budget=900, seed=3)


def _dm(source) -> ListDataModule:
    return ListDataModule(source, **ONE_PATH_BATCHING)


def _same_batch(a, b) -> None:
    for field in ("rows", "num", "cat", "label", "index", "mask", "rank_index", "rank_mask",
                  "request", "position"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field
    assert (a.weight is None) == (b.weight is None)
    if a.weight is not None:
        assert torch.equal(a.weight, b.weight)


def _fit(dm: ListDataModule, epochs: int = 2):
    """A seeded model trained by Lightning on the data module; returns it and its last val metrics."""
    pl_.seed_everything(0, verbose=False)
    data = dm.model_data()
    module = HybridRanker({"_target_": "hybridrank.models.scorers.MLPScorer", "_partial_": True,
                           "hidden": [16], "emb_dim": 4},
                          HybridLoss(point_weight=0.5, terms={"softmax": {"loss": "softmax",
                                                                          "weight": 0.5}}),
                          data=data)
    rows = []

    class Rows(pl_.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            rows.append(batch.rows.clone())

    trainer = pl_.Trainer(accelerator="cpu", devices=1, max_epochs=epochs, logger=False,
                          enable_checkpointing=False, enable_progress_bar=False,
                          enable_model_summary=False, num_sanity_val_steps=0,
                          use_distributed_sampler=False, reload_dataloaders_every_n_epochs=1,
                          deterministic=True, callbacks=[Rows()])
    trainer.fit(module, datamodule=dm)
    val = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
    return module, val, rows


def test_in_memory_and_streamed_training_give_the_same_batches_metrics_and_scores(tmp_path):
    """data=clicklog (read whole) and data=clicklog_stream (chunk_rows over the file: one chunk)
    on the same file: the same schema, keep rate and fingerprint; the same impressions in the same
    batches for the same seed and epoch; the same validation metrics and exported scores."""
    df = simulate_clicklog(n_users=90, seed=11)
    df.write_parquet(tmp_path / "log.parquet", row_group_size=1000)
    cols = SIM_COLUMNS_MAP.to_dict()
    whole = ClickLogSource(tmp_path / "log.parquet", cols, split=ONE_PATH_SPLIT)
    streamed = StreamingClickLogSource(tmp_path / "log.parquet", cols, split=ONE_PATH_SPLIT,
                                       chunk_rows=df.height)
    assert whole.chunk_rows is None and streamed.scanner is not None
    a, b = _dm(whole), _dm(streamed)
    ma, mb = a.model_data(), b.model_data()
    assert ma == mb  # schema (scaler, vocabularies, policies), base rate, keep rate, fingerprint
    assert 0 < ma["neg_keep_rate"] < 1  # the cap bites: capping and weights are compared too
    for epoch in (0, 1):
        ba, bb = list(a.train_stream(epoch)), list(b.train_stream(epoch))
        assert len(ba) == len(bb) > 5
        for x, y in zip(ba, bb):
            _same_batch(x, y)
    # the batches are those of the documented recipe: the split's ListData, GroupBatchSampler with
    # the data module's seed (chunk 0), ListDataset collation
    train = whole.load().train
    ref = GroupBatchSampler(train, budget=700, scope="session", max_unit_size=40, seed=3)
    ref.set_epoch(1)
    ds = ListDataset(train, scope="session", max_unit_size=40, seed=3)
    for x, req in zip(a.train_stream(1), ref):
        _same_batch(x, ds[req])
    # training: the same rows per step, the same validation metrics, the same scores
    model_a, val_a, rows_a = _fit(a)
    model_b, val_b, rows_b = _fit(b)
    assert len(rows_a) == len(rows_b) and all(torch.equal(x, y) for x, y in zip(rows_a, rows_b))
    assert val_a == val_b and "val/logloss" in val_a
    for split in ("val", "test"):
        za = torch.cat([model_a.predict_split(d)[0] for d in a.eval_chunks(split, 500)])
        zb = torch.cat([model_b.predict_split(d)[0] for d in b.eval_chunks(split, 500)])
        assert torch.equal(za, zb)


@pytest.mark.slow
def test_several_chunks_keep_the_split_schema_and_keep_rate_of_the_whole_log(tmp_path):
    """A log streamed in many chunks: the hash split puts every request where the whole-log split
    does, the schema fit agrees with the whole-log fit, the keep rate is the same count (request
    units never cross a chunk), every training impression comes once per epoch, and a fixed
    model's metrics over the chunks equal those over the whole split."""
    df = simulate_clicklog(n_users=90, seed=12)
    write_parts(df, tmp_path / "parts", 3, row_group=400)
    cols = SIM_COLUMNS_MAP.to_dict()
    split = {**ONE_PATH_SPLIT, "key": "request"}
    whole = ClickLogSource(str(tmp_path / "parts" / "*.parquet"), cols, split=split)
    streamed = StreamingClickLogSource(str(tmp_path / "parts" / "*.parquet"), cols, split=split,
                                       chunk_rows=1500)
    assert len(streamed.layout()) > 4
    batching = {**ONE_PATH_BATCHING, "scope": "request", "max_unit_size": 8}
    a, b = ListDataModule(whole, **batching), ListDataModule(streamed, **batching)
    ma, mb = a.model_data(), b.model_data()
    sa, sb = Schema.from_dict(ma["schema"]), Schema.from_dict(mb["schema"])
    assert sa.vocab == sb.vocab
    np.testing.assert_allclose(sb.mean, sa.mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(sb.std, sa.std, rtol=1e-12)
    assert ma["neg_keep_rate"] == mb["neg_keep_rate"] < 1 and ma["base_rate"] == mb["base_rate"]
    assert ma["fingerprint"] == mb["fingerprint"]
    for s in ("train", "val", "test"):
        keys_a = sorted(k for d in a.eval_chunks(s) for k in d.request_key.to_list())
        keys_b = sorted(k for d in b.eval_chunks(s) for k in d.request_key.to_list())
        assert keys_a == keys_b and keys_a
    # every training impression once per epoch: count (request, item) pairs of the batches
    n_train = sum(d.n_impressions for d in a.eval_chunks("train"))
    for epoch in (0, 1):
        rows = torch.cat([x.rows for x in b.train_stream(epoch)])
        assert rows.numel() < n_train  # capped negatives dropped ...
        assert rows.unique().numel() == rows.numel()  # ... and nothing twice
    # a fixed model, scored chunk by chunk (max_rows honoured) vs whole: the same metrics
    model = HybridRanker(MLPScorer, HybridLoss(point_weight=1.0), data=ma)
    pieces = list(b.eval_chunks("val", max_rows=100))
    assert len(pieces) > len(list(b.eval_chunks("val")))  # max_rows cuts the chunks further
    assert all(d.n_impressions <= 100 or d.n_requests == 1 for d in pieces)
    whole_val = evaluate_model(model, list(a.eval_chunks("val")))
    chunked_val = evaluate_model(model, pieces)
    assert chunked_val.keys() == whole_val.keys()
    for k, v in whole_val.items():
        assert chunked_val[k] == pytest.approx(v, rel=1e-6, abs=1e-6), k


def test_a_time_split_needs_one_chunk(tmp_path):
    df = simulate_clicklog(n_users=40, seed=2)
    df.write_parquet(tmp_path / "log.parquet")
    by_time = {"by": "time", "val": 0.1, "test": 0.2, "key": "session"}
    one = StreamingClickLogSource(tmp_path / "log.parquet", SIM_COLUMNS_MAP, split=by_time,
                                  chunk_rows=df.height)
    whole = ClickLogSource(tmp_path / "log.parquet", SIM_COLUMNS_MAP, split=by_time)
    assert [d.request_key.to_list() for d in one.chunks("test")] == \
        [d.request_key.to_list() for d in whole.chunks("test")]
    many = StreamingClickLogSource(tmp_path / "log.parquet", SIM_COLUMNS_MAP, split=by_time,
                                   chunk_rows=500)
    with pytest.raises(ValueError, match=r"split by='time' needs every key's start time.*reads \d+ "
                                         r"chunks of chunk_rows=500"):
        many.layout()


@pytest.mark.slow
def test_mid_epoch_resume_skips_the_batches_already_trained_on(small_log):
    """The stream skips the first ``start`` batches of the epoch (what a resumed run restores),
    one chunk or several: the rest are the uninterrupted epoch's batches."""
    for chunk_rows in (10**6, 900):
        src = StreamingClickLogSource(small_log["glob"], SIM_COLUMNS_MAP, chunk_rows=chunk_rows)
        ds = BatchStream(src, budget=300, scope="session", max_unit_size=50, seed=1)
        ds.set_epoch(2)
        full = list(ds)
        ds.start = 7
        rest = list(ds)
        assert len(rest) == len(full) - 7
        for x, y in zip(full[7:], rest):
            _same_batch(x, y)
        assert ds.start == 0 and len(list(ds)) == len(full)  # once


def test_the_data_module_refuses_what_is_not_a_source():
    from hybridrank.data.sources import SimulatedSource

    with pytest.raises(TypeError, match=r"source must be a hybridrank.data.sources.Source .*got dict"):
        ListDataModule({"path": "x.parquet"})
    with pytest.raises(ValueError, match="exactly one of source= and splits="):
        ListDataModule(SimulatedSource(n_users=5), splits=SimulatedSource(n_users=5).load())
    with pytest.raises(ValueError, match=r"unknown sampler scope 'sesion'"):
        ListDataModule(SimulatedSource(n_users=5), scope="sesion")


def test_a_streamed_log_fits_its_batch_budget_as_the_same_log_in_memory(small_log):
    """``data.min_batches`` reads the training impressions from the schema pass, which a streamed
    log makes chunk by chunk: the same log streamed and in memory gets the same budget (here
    the floor, 512: ~6k training impressions), and a streamed epoch keeps to it."""
    from hybridrank.data.datamodule import fitted_budget

    split = {"by": "hash", "val": 0.1, "test": 0.2, "key": "session"}
    streamed = ListDataModule(StreamingClickLogSource(small_log["glob"], SIM_COLUMNS_MAP, chunk_rows=700,
                                                      split=split), budget=4096, min_batches=32)
    whole = ListDataModule(ClickLogSource(small_log["glob"], SIM_COLUMNS_MAP, split=split), budget=4096,
                           min_batches=32)
    streamed.model_data()
    whole.model_data()
    rows = whole.split_rows["train"]
    assert streamed.split_rows["train"] == rows and rows < 4096 * 32
    assert streamed.budget == whole.budget == fitted_budget(rows, 4096, 32, 512) == 512
    batches = list(streamed.train_stream(0))
    assert max(len(b) for b in batches) <= 512 and sum(len(b) for b in batches) == rows
