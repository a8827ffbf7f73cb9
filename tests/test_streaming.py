"""Larger-than-memory click logs: streaming parquet chunks of whole requests (hybridrank.data.streaming)."""

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

from hybridrank.data.schema import Schema
from hybridrank.data.simulate import simulate_clicklog
from hybridrank.data.sources import SIM_COLUMNS_MAP
from hybridrank.data.streaming import StreamingClickLogSource
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
for b in src.dataset(budget=4096, scope="session", seed=1):
    rows.append(b.rows.numpy().astype("int32")); clicks += float(b.label.sum()); batches += 1
import numpy as np
rows = np.sort(np.concatenate(rows))
print(json.dumps({"growth_mb": peak_mb() - base, "n": int(rows.size), "batches": batches,
                  "once": bool(np.array_equal(rows, np.arange(src.n_impressions))),
                  "clicks": clicks, "chunks": len(src.layout())}))
"""


def _run(code: str, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_one_epoch_streams_every_impression_once_in_bounded_memory(big_log):
    full = _run(_FULL, big_log["glob"])
    stream = _run(_STREAM, big_log["glob"], "40000")
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
    loader = DataLoader(src.dataset(budget=4096, scope="session", max_unit_size=512, seed=0),
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


def test_every_impression_once_and_batches_hold_whole_requests(small_log):
    src = StreamingClickLogSource(small_log["glob"], SIM_COLUMNS_MAP, chunk_rows=900)
    ds = src.dataset(budget=300, scope="request", seed=2)
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


def test_ddp_shards_are_disjoint_and_equal_length(small_log):
    src = StreamingClickLogSource(small_log["glob"], SIM_COLUMNS_MAP, chunk_rows=400)
    shards = [list(src.dataset(budget=256, num_replicas=3, rank=r, seed=0)) for r in range(3)]
    assert len({len(s) for s in shards}) == 1 and len(shards[0]) > 0
    seen = torch.cat([b.rows for s in shards for b in s])
    assert seen.unique().numel() == seen.numel()  # no impression on two ranks
    with pytest.raises(ValueError, match="cannot feed 1000 shards"):
        list(src.dataset(num_replicas=1000, rank=0))


def test_request_split_inside_a_file_is_an_error(small_log, tmp_path):
    df = pl.read_parquet(small_log["paths"][0])
    first = df["request_id"][0]
    moved = pl.concat([df.slice(1), df.slice(0, 1)])  # first row of request `first` goes last
    moved.write_parquet(tmp_path / "a.parquet")
    with pytest.raises(ValueError, match=rf"a\.parquet: request {first} is not contiguous: its rows "
                                         r"start at row 1 and again at row \d+"):
        StreamingClickLogSource(tmp_path / "a.parquet", SIM_COLUMNS_MAP).layout()


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
        list(src.dataset(budget=3, scope="session"))
