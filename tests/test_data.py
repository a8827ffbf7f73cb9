"""The data layer: LibSVM / click-log readers, validation, splits, Schema and sources."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from reference import ref_libsvm

from hybridrank.data.fingerprint import DataChangedError, check_fingerprint, file_fingerprint, fingerprint_diff
from hybridrank.data.hashing import stable_hash
from hybridrank.data.libsvm import read_libsvm
from hybridrank.data.readers import ColumnMap, normalize_types, read_clicklog
from hybridrank.data.schema import Schema
from hybridrank.data.simulate import simulate_clicklog
from hybridrank.data.sources import SIM_COLUMNS_MAP, ClickLogSource, LetorSource, SimulatedSource, Splits
from hybridrank.data.splits import split_frame
from hybridrank.data.validate import validate_frame

ROOT = Path(__file__).resolve().parents[1]
FEATS = [f"f{i}" for i in range(1, 47)]


def reference_libsvm(path: Path, n_features: int):
    """The tests' one LibSVM reference (tests/reference.py) on a file: labels, qids, the dense
    matrix and comments."""
    ref = ref_libsvm(path.read_bytes(), n_features)
    return np.array(ref["label"]), ref["qid"], ref["dense"], ref["comment"]


def dense(frame: pl.DataFrame) -> np.ndarray:
    cols = [c for c in frame.columns if c.startswith("f") and c[1:].isdigit()]
    return frame.select(cols).to_numpy()


# ----------------------------------------------------------------------------------------------
# LibSVM on the real LETOR files
# ----------------------------------------------------------------------------------------------
@pytest.mark.real_data
def test_mq2008_all_parts(real_data):
    d = real_data / "letor" / "MQ2008"
    df = pl.concat([read_libsvm(d / f"S{i}.txt") for i in range(1, 6)])
    assert df.height == 15_211
    assert df["qid"].n_unique() == 784
    assert [c for c in df.columns if c.startswith("f")] == FEATS
    counts = dict(df["label"].value_counts().iter_rows())
    assert counts == {0.0: 12_279, 1.0: 2_001, 2.0: 931}
    assert df["comment"].str.starts_with("docid = ").all()
    assert df["line"][0] == 1


@pytest.mark.real_data
def test_mq2008_fold_files_and_reference_agree(real_data):
    d = real_data / "letor" / "MQ2008" / "Fold1"
    sizes = {"train": 9_630, "vali": 2_707, "test": 2_874}
    for name, n in sizes.items():
        df = read_libsvm(d / f"{name}.txt")
        assert df.height == n
    df = read_libsvm(d / "vali.txt")
    labels, qids, mat, comments = reference_libsvm(d / "vali.txt", 46)
    np.testing.assert_array_equal(dense(df), mat)
    assert df["qid"].to_list() == qids and df["comment"].to_list() == comments


@pytest.mark.slow
@pytest.mark.real_data
def test_mslr_subset_crlf(real_data):
    path = real_data / "letor" / "MSLR_msn1_fold1_5k" / "msn1.fold1.train.5k.txt"
    assert b"\r\n" in path.read_bytes()[:5000]
    df = read_libsvm(path)
    assert df.height == 5_000
    assert len([c for c in df.columns if c.startswith("f")]) == 136
    assert set(df["label"].unique().to_list()) == {0.0, 1.0, 2.0, 3.0, 4.0}
    assert not df["qid"].str.contains("\r").any()
    assert df["comment"].null_count() == df.height
    _, _, mat, _ = reference_libsvm(path, 136)
    np.testing.assert_array_equal(dense(df), mat)


@pytest.mark.real_data
def test_letor_source_fold1_and_parts(real_data):
    d = real_data / "letor" / "MQ2008"
    s = LetorSource(d / "Fold1/train.txt", d / "Fold1/vali.txt", d / "Fold1/test.txt",
                    label_max=2).load()
    assert isinstance(s, Splits)
    assert (s.train.n_impressions, s.val.n_impressions, s.test.n_impressions) == (
        9_630, 2_707, 2_874)
    assert (s.train.n_requests, s.val.n_requests, s.test.n_requests) == (471, 157, 156)
    assert s.train.num.shape == (9_630, 46) and s.train.cat.shape == (9_630, 0)
    assert s.schema.label_max == 2 and s.train.position is None
    assert torch.allclose(s.train.num.mean(0), torch.zeros(46), atol=1e-4)
    parts = LetorSource([d / "S1.txt", d / "S2.txt", d / "S3.txt"], d / "S4.txt", d / "S5.txt",
                        label_max=2).load()
    assert torch.equal(parts.train.label, s.train.label)
    assert torch.allclose(parts.train.num, s.train.num)


# ----------------------------------------------------------------------------------------------
# LibSVM on small hand-written files
# ----------------------------------------------------------------------------------------------
def write(tmp_path: Path, text: str | bytes, name: str = "data.txt") -> Path:
    p = tmp_path / name
    p.write_bytes(text.encode() if isinstance(text, str) else text)
    return p


def test_sparse_indices_comments_blank_lines(tmp_path):
    p = write(tmp_path, "# header comment\n2 qid:7 3:0.5 #doc=a # b\n\n0 qid:7 1:-2e-1\n"
                        "1 qid:8   2:4\t5:1\n1 qid:8\n")
    df = read_libsvm(p)
    assert df.columns == ["label", "qid", "f1", "f2", "f3", "f4", "f5", "comment", "line"]
    np.testing.assert_array_equal(dense(df), [[0, 0, .5, 0, 0], [-.2, 0, 0, 0, 0],
                                              [0, 4, 0, 0, 1], [0, 0, 0, 0, 0]])
    assert df["label"].to_list() == [2.0, 0.0, 1.0, 1.0]
    assert df["qid"].to_list() == ["7", "7", "8", "8"]
    assert df["comment"].to_list() == ["doc=a # b", None, None, None]
    assert df["line"].to_list() == [2, 4, 5, 6]
    wide = read_libsvm(p, n_features=8)
    assert dense(wide).shape == (4, 8)
    with pytest.raises(ValueError, match=r"data\.txt: line 5: feature index > n_features=3"):
        read_libsvm(p, n_features=3)


def test_crlf(tmp_path):
    p = write(tmp_path, "1 qid:1 1:3 2:4 \r\n0 qid:1 2:1\r\n")
    df = read_libsvm(p)
    np.testing.assert_array_equal(dense(df), [[3, 4], [0, 1]])
    assert df["qid"].to_list() == ["1", "1"]


@pytest.mark.parametrize("bad, fragment", [
    ("x qid:1 1:1", "bad label 'x'"),
    ("1 1:1 2:2", "missing or empty qid"),
    ("1 qid: 1:1", "missing or empty qid"),
    ("1", "missing or empty qid"),
    ("1 qid:1 7", "without ':' '7'"),
    ("1 qid:1 1:abc", "non-numeric feature value in '1:abc'"),
    ("1 qid:1 a:1", "non-integer feature index in 'a:1'"),
    ("1 qid:1 0:1", "feature index < 1 in '0:1'"),
    ("1 qid:1 -3:1", "feature index < 1 in '-3:1'"),
    ("1 qid:1 2:1 1:5 2:3", "duplicate feature index in '2:3'"),
])
def test_malformed_lines_name_file_line_and_text(tmp_path, bad, fragment):
    p = write(tmp_path, f"0 qid:1 1:0.5 2:1\n\n{bad} # c\n1 qid:2 1:1\n", "bad_file.txt")
    with pytest.raises(ValueError) as e:
        read_libsvm(p)
    msg = str(e.value)
    assert "bad_file.txt" in msg and "line 3" in msg and fragment in msg, msg


def test_first_malformed_line_is_reported(tmp_path):
    p = write(tmp_path, "0 qid:1 1:1\n1 qid:1 1:x\nbad qid:1 1:1\n")
    with pytest.raises(ValueError, match="line 2: non-numeric"):
        read_libsvm(p)


def test_missing_empty_and_non_utf8(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        read_libsvm(tmp_path / "nope.txt")
    for text in ("", "\n\n  \n", "# only a comment\n"):
        with pytest.raises(ValueError, match=r"empty\.txt: empty file"):
            read_libsvm(write(tmp_path, text, "empty.txt"))
    p = write(tmp_path, b"0 qid:1 1:1\n1 qid:1 1:2 #caf\xe9\n", "latin1.txt")
    with pytest.raises(ValueError, match=r"latin1\.txt: line 2: bytes that are not UTF-8"):
        read_libsvm(p)


def test_non_adjacent_qid_blocks_are_one_request(tmp_path, caplog):
    p = write(tmp_path, "0 qid:a 1:1\n1 qid:b 1:2\n2 qid:a 1:3\n")
    with caplog.at_level(logging.WARNING):
        df = read_libsvm(p)
    assert "more than one block" in caplog.text
    cm = ColumnMap(request="qid", label="label", numeric=["f1"])
    data = Schema.fit(df, cm, 2, normalize=False).transform(df)
    assert data.offsets.tolist() == [0, 2, 3]
    assert data.label.tolist() == [0.0, 2.0, 1.0]
    assert data.request_key.to_list() == ["a", "b"]


row_st = st.tuples(
    st.integers(0, 4),
    st.sampled_from(["1", "2", "10", "q7"]),
    st.dictionaries(st.integers(1, 30), st.floats(allow_nan=False, allow_infinity=False,
                                                  width=32), max_size=8),
    st.one_of(st.none(), st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF),
                                 max_size=12)),
    st.sampled_from([" ", "\t", "  "]),
)


@given(rows=st.lists(row_st, min_size=1, max_size=25), crlf=st.booleans())
def test_random_rows_round_trip(tmp_path_factory, rows, crlf):
    lines = []
    for label, qid, feats, comment, sep in rows:
        toks = [str(label), f"qid:{qid}"] + [f"{k}:{v!r}" for k, v in feats.items()]
        line = sep.join(toks)
        if comment is not None:
            line += f" #{comment}"
        lines.append(line)
    eol = "\r\n" if crlf else "\n"
    p = tmp_path_factory.mktemp("rt") / "rows.txt"
    p.write_bytes(eol.join(lines).encode("utf-8"))
    df = read_libsvm(p, n_features=30)
    labels, qids, mat, comments = reference_libsvm(p, 30)
    np.testing.assert_array_equal(df["label"].to_numpy(), labels)
    assert df["qid"].to_list() == qids
    np.testing.assert_array_equal(dense(df), mat)
    assert df["comment"].to_list() == comments


# ----------------------------------------------------------------------------------------------
# Click logs
# ----------------------------------------------------------------------------------------------
SMALL_MAP = ColumnMap(
    request="request_id", label="click", session="session_id", user="user_id", time="time",
    position="position", item="item_id", bid="bid", true_p="p_true",
    numeric=["item_price", "hour", "position"], categorical=["item_id", "item_category"],
)


@pytest.fixture(scope="module")
def small_log() -> pl.DataFrame:
    return simulate_clicklog(n_users=60, seed=4)


@pytest.mark.parametrize("suffix", ["parquet", "csv"])
def test_read_clicklog_parquet_csv(tmp_path, small_log, suffix):
    p = tmp_path / f"log.{suffix}"
    getattr(small_log.with_columns(extra=pl.lit("x")), f"write_{suffix}")(p)
    df = read_clicklog(p, SMALL_MAP)
    assert "extra" not in df.columns
    assert df.height == small_log.height
    for c in ("click", "item_price", "position", "time", "request_id"):
        np.testing.assert_allclose(df[c].to_numpy().astype(float),
                                   small_log[c].to_numpy().astype(float))
    assert df["position"].dtype == pl.Int64 and df["time"].dtype == pl.Int64
    assert df["_source_row"].to_list()[:3] == [1, 2, 3]


def test_read_clicklog_glob_and_errors(tmp_path, small_log):
    half = small_log.height // 2
    (tmp_path / "parts").mkdir()
    small_log[:half].write_parquet(tmp_path / "parts" / "a.parquet")
    small_log[half:].write_parquet(tmp_path / "parts" / "b.parquet")
    df = read_clicklog(str(tmp_path / "parts" / "*.parquet"), SMALL_MAP)
    assert df.height == small_log.height
    assert df["_source_row"][half] == 1 and str(df["_source_file"][half]).endswith("b.parquet")
    with pytest.raises(FileNotFoundError, match="no click-log files match"):
        read_clicklog(str(tmp_path / "parts" / "*.csv"), SMALL_MAP)
    with pytest.raises(FileNotFoundError, match="missing.parquet"):
        read_clicklog(tmp_path / "missing.parquet", SMALL_MAP)
    bad_map = ColumnMap(request="req", label="click", numeric=["item_price", "colour"])
    with pytest.raises(ValueError) as e:
        read_clicklog(tmp_path / "parts" / "a.parquet", bad_map)
    msg = str(e.value)
    assert "['req', 'colour']" in msg and "item_price" in msg and "session_id" in msg


def test_mistyped_column_is_named(tmp_path, small_log):
    df = small_log[:50].with_columns(pl.col("item_price").cast(pl.String))
    df = df.with_columns(pl.when(pl.int_range(pl.len()) == 7).then(pl.lit("cheap"))
                         .otherwise(pl.col("item_price")).alias("item_price"))
    df.write_csv(tmp_path / "t.csv")
    with pytest.raises(ValueError, match=r"'item_price'.*1 value\(s\), first 'cheap' at .*t\.csv "
                                         r"row 8"):
        read_clicklog(tmp_path / "t.csv", SMALL_MAP)
    df.write_parquet(tmp_path / "t.parquet")
    with pytest.raises(ValueError, match="item_price"):
        read_clicklog(tmp_path / "t.parquet", SMALL_MAP)


def test_nan_policy_error_and_fill(tmp_path, small_log, caplog):
    df = small_log.with_columns(
        pl.when(pl.int_range(pl.len()).is_in([3, 9])).then(float("nan"))
        .otherwise(pl.col("item_price")).alias("item_price"))
    df.write_parquet(tmp_path / "nan.parquet")
    frame = read_clicklog(tmp_path / "nan.parquet", SMALL_MAP)
    with pytest.raises(ValueError, match=r"'item_price'.*2 row\(s\), first nan at .*nan\.parquet "
                                         r"row 4"):
        validate_frame(frame, SMALL_MAP, label_max=1)
    with caplog.at_level(logging.WARNING):
        filled = validate_frame(frame, SMALL_MAP, label_max=1, nan_policy="fill", fill_value=-1)
    assert filled["item_price"][3] == -1 and filled["item_price"][9] == -1
    assert filled.height == frame.height
    assert "filled 2" in caplog.text
    with pytest.raises(ValueError, match="nan_policy"):
        validate_frame(frame, SMALL_MAP, label_max=1, nan_policy="drop")


def test_value_checks(small_log):
    with pytest.raises(ValueError, match=r"label 'click' missing, NaN or outside \[0, label_max=1\] .*: 1 row"):
        validate_frame(small_log.with_columns(
            pl.when(pl.int_range(pl.len()) == 5).then(3).otherwise(pl.col("click")).alias("click")),
            SMALL_MAP, label_max=1)
    with pytest.raises(ValueError, match="position 'position' missing or < 1"):
        validate_frame(small_log.with_columns(pl.col("position") - 2), SMALL_MAP, label_max=1)
    with pytest.raises(ValueError, match="empty"):
        validate_frame(small_log[:0], SMALL_MAP, label_max=1, name="val")
    with pytest.raises(ValueError, match="id column 'session_id'"):
        validate_frame(small_log.with_columns(session_id=None), SMALL_MAP, label_max=1)


def test_column_map_from_dict():
    cm = ColumnMap.from_dict({"request": "r", "label": "y", "numeric": ("a", "b")})
    assert cm.numeric == ["a", "b"] and cm.categorical == []
    assert ColumnMap.from_dict(cm.to_dict()) == cm
    with pytest.raises(ValueError, match="unknown ColumnMap keys \\['lable'\\]"):
        ColumnMap.from_dict({"request": "r", "label": "y", "lable": "z"})
    with pytest.raises(ValueError, match="needs a `time` column"):
        ColumnMap(request=["a", "b"], label="y", request_time_bucket=60)


def test_time_features_column_map_rules():
    cm = ColumnMap(request="r", label="y", time="ts", categorical=["c"],
                   time_features=["weekday", "hour"])
    assert cm.categorical == ["c", "ts_weekday", "ts_hour"]
    assert cm.derived_columns() == {"ts_weekday": "weekday", "ts_hour": "hour"}
    assert "ts_weekday" not in cm.source_columns() and "ts" in cm.source_columns()
    again = ColumnMap.from_dict(cm.to_dict())  # a stored map lists them already: not twice
    assert again == cm and again.categorical == ["c", "ts_weekday", "ts_hour"]
    with pytest.raises(ValueError, match="time_features \\['month'\\] unknown"):
        ColumnMap(request="r", label="y", time="ts", time_features=["month"])
    with pytest.raises(ValueError, match="need a `time` column"):
        ColumnMap(request="r", label="y", time_features=["hour"])
    with pytest.raises(ValueError, match="twice"):
        ColumnMap(request="r", label="y", time="ts", time_features=["hour", "hour"])


@given(st.lists(st.integers(-10**9, 4 * 10**9), min_size=1, max_size=30), st.booleans())
def test_time_features_match_a_datetime_reference(stamps, as_text):
    """UTC weekday (0 = Monday) and hour against Python's datetime, from epoch seconds and from
    ISO strings alike."""
    import datetime as dt

    utc = [dt.datetime.fromtimestamp(t, dt.timezone.utc) for t in stamps]
    col = [u.strftime("%Y-%m-%dT%H:%M:%S") for u in utc] if as_text else stamps
    frame = pl.DataFrame({"r": list(range(len(stamps))), "y": [0.0] * len(stamps), "ts": col})
    cm = ColumnMap(request="r", label="y", time="ts", time_features=["weekday", "hour"])
    out = normalize_types(frame, cm)
    assert out["ts_weekday"].to_list() == [u.weekday() for u in utc]
    assert out["ts_hour"].to_list() == [u.hour for u in utc]


def test_time_features_are_learned_from_and_computed_again_for_scoring(tmp_path, small_log):
    """The derived categoricals get a vocabulary from train like any categorical, and a frame
    read for scoring (which has no such column) gets the same codes."""
    cm = ColumnMap(**{**SMALL_MAP.to_dict(), "categorical": ["item_id", "item_category"],
                      "time_features": ["weekday", "hour"]})
    small_log.write_parquet(tmp_path / "log.parquet")
    s = ClickLogSource(tmp_path / "log.parquet", cm.to_dict(),
                       {"by": "hash", "val": 0.2, "test": 0.2, "key": "user"}).load()
    assert list(s.schema.categorical) == ["item_id", "item_category", "time_weekday", "time_hour"]
    assert s.schema.vocab_sizes[2] == small_log.select(
        ((pl.col("time") // 86400 + 3) % 7).n_unique()).item()
    again = s.schema.read(read_clicklog(tmp_path / "log.parquet", cm).drop("time_weekday", "time_hour"))
    fresh = s.schema.read(read_clicklog(tmp_path / "log.parquet", cm))
    assert torch.equal(again.cat, fresh.cat) and torch.equal(again.num, fresh.num)
    # ListData keeps one time per request (the simulator's requests happen at one instant)
    t = torch.repeat_interleave(fresh.time, torch.diff(fresh.offsets))
    hours = ((t // 3600) % 24).tolist()
    vocab = list(s.schema.vocab["time_hour"])  # code k + 1 for the k-th kept value (as text)
    want = [vocab.index(str(h)) + 1 if str(h) in vocab else 0 for h in hours]
    np.testing.assert_array_equal(fresh.cat[:, 3].numpy(), want)


# ----------------------------------------------------------------------------------------------
# Splits
# ----------------------------------------------------------------------------------------------
def random_log(n_rows: int = 20_000, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    n_users, n_sess = 300, 1500
    sess_user = rng.integers(0, n_users, n_sess)
    req_sess = rng.integers(0, n_sess, 4000)
    req = rng.integers(0, 4000, n_rows)
    return pl.DataFrame({
        "req": [f"r{r}" for r in req],
        "sess": req_sess[req],
        "user": sess_user[req_sess[req]],
        "t": rng.integers(0, 10**6, 4000)[req] + rng.integers(0, 5, n_rows),
        "y": rng.integers(0, 2, n_rows).astype(float),
        "x": rng.normal(size=n_rows),
    })


RANDOM_MAP = ColumnMap(request="req", label="y", session="sess", user="user", time="t",
                       numeric=["x"])


@pytest.mark.parametrize("by", ["time", "hash"])
@pytest.mark.parametrize("key", ["request", "session", "user"])
def test_split_never_cuts_a_request(by, key):
    df = random_log()
    parts = split_frame(df, RANDOM_MAP, by=by, val=0.15, test=0.25, key=key, seed=1)
    assert sum(p.height for p in parts) == df.height
    reqs = [set(p["req"].unique().to_list()) for p in parts]
    assert not (reqs[0] & reqs[1]) and not (reqs[0] & reqs[2]) and not (reqs[1] & reqs[2])
    col = {"request": "req", "session": "sess", "user": "user"}[key]
    keys = [set(p[col].unique().to_list()) for p in parts]
    assert not (keys[0] & keys[1] or keys[0] & keys[2] or keys[1] & keys[2])
    n = sum(len(k) for k in keys)
    tol = 0.002 if by == "time" else 4 / math.sqrt(n)
    assert abs(len(keys[1]) / n - 0.15) < tol + 1 / n
    assert abs(len(keys[2]) / n - 0.25) < tol + 1 / n
    if by == "time":  # every test key starts after every train key
        start = [p.group_by(col).agg(pl.col("t").min())["t"] for p in parts]
        assert start[0].max() <= start[1].min() and start[1].max() <= start[2].min()
    again = split_frame(df, RANDOM_MAP, by=by, val=0.15, test=0.25, key=key, seed=1)
    assert all(a.equals(b) for a, b in zip(parts, again))


def test_split_errors():
    df = random_log(2000)
    bad = df.with_columns(sess=pl.int_range(pl.len()))  # requests now span sessions
    with pytest.raises(ValueError, match="span several session values"):
        split_frame(bad, RANDOM_MAP, key="session")
    with pytest.raises(ValueError, match="needs a time column"):
        split_frame(df, ColumnMap(request="req", label="y"), by="time", key="request")
    with pytest.raises(ValueError, match="needs a 'session' column"):
        split_frame(df, ColumnMap(request="req", label="y"), by="hash", key="session")


def test_hash_split_places_each_key_by_its_own_bucket():
    """A hash split is a rule per key (what makes it the same chunk by chunk as over the whole
    log): checked against a loop that hashes each session alone, and over two halves of the
    log split separately."""
    from hybridrank.data.splits import DEFAULT_SPLIT, split_parts, split_spec

    df = random_log(3000)
    parts = split_frame(df, RANDOM_MAP, by="hash", val=0.2, test=0.3, key="session", seed=7)
    expect = {}
    for s in df["sess"].unique().to_list():
        u = int(stable_hash(pl.Series([s]), 7)[0] % np.uint64(10_000)) / 10_000
        expect[s] = 2 if u < 0.3 else 1 if u < 0.5 else 0
    for i, part in enumerate(parts):
        assert part.height and all(expect[s] == i for s in part["sess"].to_list())
        # each part keeps the rows' storage order
        assert part.equals(df.filter(pl.col("sess").replace_strict(expect) == i))
    halves = [split_parts(h, RANDOM_MAP, {"by": "hash", "val": 0.2, "test": 0.3, "key": "session",
                                          "seed": 7}) for h in (df.head(1500), df.tail(1500))]
    for i, name in enumerate(("train", "val", "test")):
        assert pl.concat([h[name] for h in halves]).equals(parts[i])
    whole = split_parts(df, RANDOM_MAP, None)  # a source without a split: every row trains
    assert whole["train"].equals(df) and whole["val"].height == whole["test"].height == 0
    assert split_spec(None) == DEFAULT_SPLIT and split_spec(None) is not DEFAULT_SPLIT


def test_stable_hash_is_pinned():
    h = stable_hash(pl.Series([1, 2, 3]))
    assert np.array_equal(h, stable_hash(pl.Series(["1", "2", "3"])))
    assert np.array_equal(h, stable_hash(pl.Series([1, 2, 3])))
    assert not np.array_equal(h, stable_hash(pl.Series([1, 2, 3]), seed=1))
    assert len(set(stable_hash(pl.Series(["", "a", "ab", "ba", None])).tolist())) == 5
    # pinned: splits must not change between versions or machines
    assert stable_hash(pl.Series(["a"]))[0] == np.uint64(1804080386290714614)


# ----------------------------------------------------------------------------------------------
# Schema
# ----------------------------------------------------------------------------------------------
def reference_transform(df: pl.DataFrame, schema: Schema):
    """Loop reference: requests by (min time, first appearance); rows by (position, input)."""
    rows = df.rows(named=True)
    first, tmin = {}, {}
    for i, r in enumerate(rows):
        first.setdefault(r["req"], i)
        tmin[r["req"]] = min(tmin.get(r["req"], r["t"]), r["t"])
    order = sorted(first, key=lambda q: (tmin[q], first[q]))
    out_rows, offsets = [], [0]
    for q in order:
        mine = [i for i, r in enumerate(rows) if r["req"] == q]
        mine.sort(key=lambda i: (rows[i]["pos"], i))
        out_rows += mine
        offsets.append(len(out_rows))
    vocab = {v: k + 1 for k, v in enumerate(schema.vocab["c"])}
    num = [[(rows[i][c] - m) / s for c, m, s in zip(schema.numeric, schema.mean, schema.std)]
           for i in out_rows]
    cat = [[vocab.get(str(rows[i]["c"]), 0)] for i in out_rows]
    label = [rows[i]["y"] for i in out_rows]
    return order, offsets, num, cat, label, [tmin[q] for q in order]


@given(seed=st.integers(0, 10_000))
def test_transform_matches_loop_reference(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    req = rng.integers(0, 8, n)
    df = pl.DataFrame({
        "req": [f"q{r}" for r in req], "sess": req % 3, "user": req % 2,
        "t": rng.integers(0, 4, n), "pos": rng.integers(1, 5, n),
        "x": rng.normal(size=n), "z": np.full(n, 2.0), "c": rng.integers(0, 5, n),
        "y": rng.integers(0, 3, n).astype(float),
    })
    cm = ColumnMap(request="req", label="y", session="sess", user="user", time="t",
                   position="pos", numeric=["x", "z"], categorical=["c"])
    train = df.filter(pl.col("c") != 4)
    schema = Schema.fit(train if train.height else df, cm, 2)
    assert schema.std[1] == 1.0  # constant column: std 0 -> 1
    data, stats = schema.transform_with_stats(df)
    order, offsets, num, cat, label, tmin = reference_transform(df, schema)
    assert data.request_key.to_list() == order
    assert data.offsets.tolist() == offsets
    np.testing.assert_allclose(data.num.numpy(), np.array(num, dtype=np.float32).reshape(-1, 2),
                               rtol=1e-5, atol=1e-5)
    assert data.cat.tolist() == cat
    assert data.label.tolist() == label
    assert data.time.tolist() == tmin
    assert stats["oov"]["c"] == sum(c == [0] for c in cat)
    # scopes: same session value <-> same dense id
    sess_of = dict(zip(df["req"].to_list(), df["sess"].to_list()))
    ids = data.scope["session"].tolist()
    for a, qa in enumerate(order):
        for b, qb in enumerate(order):
            assert (ids[a] == ids[b]) == (sess_of[qa] == sess_of[qb])
    assert sorted(set(ids)) == list(range(len(set(ids))))


@given(seed=st.integers(0, 10_000), transform=st.sampled_from(["log", "identity"]))
def test_position_feature_transform_matches_loop_reference(seed, transform):
    """Position as a feature: log(position) (or the position as it is) per row, then the
    train mean and population standard deviation, against a plain loop."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 80))
    df = pl.DataFrame({"req": rng.integers(0, 9, n), "pos": rng.integers(1, 200, n),
                       "x": rng.normal(size=n), "y": rng.integers(0, 2, n).astype(float)})
    cm = ColumnMap(request="req", label="y", position="pos", numeric=["x", "pos"],
                   position_transform=transform)
    schema = Schema.fit(df, cm, 1)
    vals = [math.log(p) if transform == "log" else float(p) for p in df["pos"].to_list()]
    mean = sum(vals) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / n)
    assert schema.mean[1] == pytest.approx(mean, rel=1e-9, abs=1e-12)
    assert schema.std[1] == pytest.approx(sd if sd > 0 else 1.0, rel=1e-9, abs=1e-12)
    data = schema.transform(df)
    want = [((math.log(p) if transform == "log" else float(p)) - schema.mean[1]) / schema.std[1]
            for p in data.position.tolist()]
    np.testing.assert_allclose(data.num[:, 1].numpy(), want, rtol=1e-5, atol=1e-5)


def test_position_transform_default_stored_and_refused():
    cm = ColumnMap(request="r", label="y", position="p", numeric=["p"])
    assert cm.position_transform == "log"
    with pytest.raises(ValueError, match="position_transform='sqrt'"):
        ColumnMap(request="r", label="y", position="p", position_transform="sqrt")
    df = pl.DataFrame({"r": [1, 1, 1, 2, 2], "p": [1, 2, 3, 1, 40], "y": [1.0, 0, 0, 0, 1]})
    logged = Schema.fit(df, cm, 1)
    back = Schema.from_dict(json.loads(json.dumps(logged.to_dict())))
    assert back == logged and back.columns.position_transform == "log"
    # a schema stored before the key existed was trained on raw positions: it reads them raw
    raw = Schema.fit(df, ColumnMap(**{**cm.to_dict(), "position_transform": "identity"}), 1)
    old = raw.to_dict()
    del old["columns"]["position_transform"]
    again = Schema.from_dict(old)
    assert again.columns.position_transform == "identity" and again == raw
    assert torch.equal(again.transform(df).num, raw.transform(df).num)
    assert not torch.equal(logged.transform(df).num, raw.transform(df).num)


def test_transform_input_order_without_time_or_position():
    df = pl.DataFrame({"r": [3, 1, 3, 2, 1], "y": [0.0, 1, 1, 0, 0], "x": [1.0, 2, 3, 4, 5]})
    cm = ColumnMap(request="r", label="y", numeric=["x"])
    data = Schema.fit(df, cm, 1, normalize=False).transform(df)
    assert data.request_key.to_list() == [3, 1, 2]
    assert data.num[:, 0].tolist() == [1, 3, 2, 5, 4]
    assert data.scope == {} and data.time is None and data.position is None


def test_unseen_categories_and_request_in_two_sessions(caplog):
    train = pl.DataFrame({"r": [1, 1, 2], "y": [0.0, 1, 0], "c": ["a", "b", "a"], "s": [0, 0, 1]})
    cm = ColumnMap(request="r", label="y", session="s", categorical=["c"])
    schema = Schema.fit(train, cm, 1)
    assert schema.vocab == {"c": ("a", "b")} and schema.vocab_sizes == (2,)
    new = pl.DataFrame({"r": [5, 5, 6], "y": [0.0, 0, 1], "c": ["b", "zz", None], "s": [3, 3, 4]})
    with caplog.at_level(logging.INFO):
        data = schema.transform(new)
    assert data.cat[:, 0].tolist() == [2, 0, 0]
    assert "'c': 2" in caplog.text
    assert schema.transform_with_stats(new)[1]["oov"] == {"c": 2}
    with pytest.raises(ValueError, match="several 's' values, e.g. request 5"):
        schema.transform(new.with_columns(s=pl.Series([3, 4, 4])))


def test_schema_round_trip_json():
    df = simulate_clicklog(n_users=40, seed=2)
    schema = Schema.fit(df, SIM_COLUMNS_MAP, 1)
    back = Schema.from_dict(json.loads(json.dumps(schema.to_dict())))
    assert back == schema
    a, b = schema.transform(df), back.transform(df)
    assert torch.equal(a.num, b.num) and torch.equal(a.cat, b.cat)
    composite = ColumnMap(request=["u", "v"], label="y", time="t", request_time_bucket=10)
    s2 = Schema.fit(pl.DataFrame({"u": [1], "v": ["a"], "y": [1.0], "t": [5]}), composite, 1)
    assert Schema.from_dict(json.loads(json.dumps(s2.to_dict()))) == s2


# ----------------------------------------------------------------------------------------------
# Sources
# ----------------------------------------------------------------------------------------------
def test_simulated_source(caplog):
    with caplog.at_level(logging.INFO):
        s = SimulatedSource(n_users=150, seed=1).load()
    assert "simulated train:" in caplog.text and "requests" in caplog.text
    for part in s[:3]:
        assert part.true_p is not None and part.bid is not None and part.position is not None
        assert set(part.scope) == {"session", "user"}
        assert part.scope["session"].shape == (part.n_requests,)
        assert torch.all(part.time[1:] >= part.time[:-1])
    keys = [set(p.request_key.to_list()) for p in s[:3]]
    assert not (keys[0] & keys[1] or keys[0] & keys[2] or keys[1] & keys[2])
    assert s.schema.numeric == tuple(SIM_COLUMNS_MAP.numeric)
    assert s.train.num.shape[1] == 5 and s.train.cat.shape[1] == 3
    assert s.train.time.max() <= s.val.time.min() + 10_000  # sessions split by start time
    with pytest.raises(TypeError, match="n_user"):
        SimulatedSource(n_user=10)


def test_clicklog_source_end_to_end(tmp_path, small_log):
    small_log.write_parquet(tmp_path / "log.parquet")
    src = ClickLogSource(tmp_path / "log.parquet", SMALL_MAP.to_dict(),
                         {"by": "hash", "val": 0.2, "test": 0.2, "key": "user"})
    s = src.load()
    n = s.train.n_impressions + s.val.n_impressions + s.test.n_impressions
    assert n == small_log.height
    assert s.train.item_key is not None and len(s.train.item_key) == s.train.n_impressions
    with pytest.raises(ValueError, match="the val split is empty"):
        ClickLogSource(tmp_path / "log.parquet", SMALL_MAP.to_dict(),
                       {"by": "time", "val": 0.0, "test": 0.2, "key": "session"}).load()
    with pytest.raises(ValueError, match="unknown split options"):
        ClickLogSource(tmp_path / "log.parquet", SMALL_MAP.to_dict(), {"by": "time", "frac": 1})


# ----------------------------------------------------------------------------------------------
# Data fingerprints
# ----------------------------------------------------------------------------------------------
def _sha256(path: Path) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def test_file_fingerprint_full_and_cheap(tmp_path, small_log):
    p = tmp_path / "log.parquet"
    small_log.write_parquet(p)
    full = file_fingerprint(p)
    assert full == {"path": str(p), "bytes": p.stat().st_size, "hash": _sha256(p),
                    "rows": small_log.height}
    cheap = file_fingerprint(p, full_hash_bytes=0)  # as a parquet file over the threshold
    assert cheap["hash"].startswith("parquet-meta:") and cheap["rows"] == small_log.height
    assert cheap["hash"] != full["hash"]
    small_log.write_parquet(p)  # the same content written again: the same fingerprints
    assert file_fingerprint(p) == full and file_fingerprint(p, full_hash_bytes=0) == cheap
    # one click flipped: both notice (the cheap hash reads the footer and the first / last MiB,
    # the whole of a small file); rows appended: the row count moves too
    small_log.with_columns(click=pl.when(pl.int_range(pl.len()) == 5).then(1 - pl.col("click"))
                           .otherwise(pl.col("click"))).write_parquet(p)
    assert file_fingerprint(p)["hash"] != full["hash"]
    assert file_fingerprint(p, full_hash_bytes=0)["hash"] != cheap["hash"]
    pl.concat([small_log, small_log.head(3)]).write_parquet(p)
    assert file_fingerprint(p, full_hash_bytes=0)["rows"] == small_log.height + 3
    csv = tmp_path / "log.csv"
    small_log.write_csv(csv)  # text files are always hashed whole, no row count
    assert file_fingerprint(csv, full_hash_bytes=0) == {"path": str(csv), "bytes": csv.stat().st_size,
                                                        "hash": _sha256(csv)}


def test_simulator_fingerprint_is_its_parameters_and_split():
    import inspect

    fp = SimulatedSource(n_users=50, seed=1).fingerprint()
    defaults = {k: p.default for k, p in inspect.signature(simulate_clicklog).parameters.items()}
    assert fp["kind"] == "simulated"
    assert fp["simulator"] == {**defaults, "n_users": 50, "seed": 1}
    assert fp["split"] == {"by": "time", "val": 0.1, "test": 0.2, "key": "session"}
    assert check_fingerprint(fp, SimulatedSource(n_users=50, seed=1).fingerprint())  # the same
    assert not check_fingerprint(None, fp)  # a checkpoint from before fingerprints: nothing to compare
    assert not check_fingerprint({"kind": "splits in memory"}, fp)  # nor splits given in memory
    with pytest.raises(DataChangedError, match=r"simulator\.n_users changed: 50 -> 51"):
        check_fingerprint(fp, SimulatedSource(n_users=51, seed=1).fingerprint())
    with pytest.raises(DataChangedError, match=r"split\.val changed: 0\.1 -> 0\.2"):
        check_fingerprint(fp, SimulatedSource(n_users=50, seed=1,
                                              split={"by": "time", "val": 0.2, "test": 0.2,
                                                     "key": "session"}).fingerprint())


def test_letor_fingerprint_names_the_split_of_a_changed_file(tmp_path):
    files = {}
    for name, text in {"train": "1 qid:1 1:0.5\n0 qid:1 1:0.2\n2 qid:2 1:0.1\n0 qid:2 1:0.3\n",
                       "vali": "1 qid:3 1:0.5\n0 qid:3 1:0.2\n",
                       "test": "1 qid:4 1:0.5\n0 qid:4 1:0.1\n"}.items():
        files[name] = write(tmp_path, text, f"{name}.txt")
    fp = LetorSource(files["train"], files["vali"], files["test"], label_max=2).fingerprint()
    assert fp["files"]["test"] == [{"path": str(files["test"]), "bytes": files["test"].stat().st_size,
                                    "hash": _sha256(files["test"])}]
    assert fp["split"] == {"val": "file"}
    files["test"].write_text("1 qid:4 1:0.5\n0 qid:4 1:0.2\n")
    now = LetorSource(files["train"], files["vali"], files["test"], label_max=2).fingerprint()
    size = files["test"].stat().st_size
    assert fingerprint_diff(fp, now) == [f"test files: changed file {files['test']} ({size} -> {size} bytes, "
                                         f"content hash differs)"]
    held_out = LetorSource(files["train"], None, files["test"], label_max=2, val_fraction=0.3)
    assert held_out.fingerprint()["split"] == {"by": "hash", "val": 0.3, "test": 0.0,
                                                "key": "request", "seed": 0}


@pytest.fixture
def glob_run(tmp_path, compose_cfg):
    """A model trained through data=clicklog on a glob of two parquet files."""
    from hybridrank.cli.train import train

    df = simulate_clicklog(n_users=70, seed=6)
    half = int((df["request_id"] == df["request_id"][df.height // 2]).arg_true()[0])
    (tmp_path / "logs").mkdir()
    df.slice(0, half).write_parquet(tmp_path / "logs" / "a.parquet")
    df.slice(half).write_parquet(tmp_path / "logs" / "b.parquet")
    result = train(compose_cfg("config", f"paths.output_dir={tmp_path}/run", "data=clicklog",
                               f"data.source.path={tmp_path}/logs/*.parquet", "trainer.max_epochs=1",
                               "trainer.enable_progress_bar=false", "intervals.n_boot=0"))
    return {"ckpt": result["best_checkpoint"], "dir": tmp_path / "logs", "df": df,
            "compose": compose_cfg, "tmp": tmp_path}


def _export(run, *overrides):
    from hybridrank.cli.export import export

    return export(run["compose"]("export", f"checkpoint={run['ckpt']}",
                                 f"output={run['tmp']}/scores.parquet", "calibrator=none",
                                 *overrides))


@pytest.mark.slow
def test_export_of_a_split_refuses_changed_added_or_missing_training_files(glob_run):
    from hybridrank.cli.export import evaluate
    from hybridrank.serving.checkpoint import load_model

    folder = glob_run["dir"]
    a, b = folder / "a.parquet", folder / "b.parquet"
    stored = load_model(glob_run["ckpt"]).data_info["fingerprint"]
    assert stored["kind"] == "clicklog" and stored["split"]["by"] == "time"
    assert [f["path"] for f in stored["files"]] == [str(a), str(b)]
    for f, p in zip(stored["files"], (a, b)):
        assert f["hash"] == _sha256(p) and f["rows"] == pl.read_parquet(p).height
    before = _export(glob_run, "split=test")["n_rows"]
    assert before > 0
    # a training file changed after training: one click flipped
    original = a.read_bytes()
    frame = pl.read_parquet(a)
    frame.with_columns(click=pl.when(pl.int_range(pl.len()) == 3).then(1 - pl.col("click"))
                       .otherwise(pl.col("click"))).write_parquet(a)
    with pytest.raises(DataChangedError, match=rf"changed file {a} \(.*content hash differs\).*"
                                               r"score new files with input=\.\.\. calibrator=none "
                                               r"level_trend\.mode=off"):
        _export(glob_run, "split=test")
    with pytest.raises(DataChangedError, match=rf"changed file {a}"):  # hybridrank-eval as well
        evaluate(glob_run["compose"]("eval", f"checkpoint={glob_run['ckpt']}", "calibrator=none",
                                     f"output_dir={glob_run['tmp']}/report", "n_boot=0"))
    # scoring new files without a calibrator and without the level trend reads no training data
    assert _export(glob_run, f"input={a}", "level_trend.mode=off")["n_rows"] == frame.height
    # the level trend is tested on the training rows: it needs them as they were
    with pytest.raises(DataChangedError, match=rf"changed file {a}"):
        _export(glob_run, f"input={a}")
    a.write_bytes(original)
    assert _export(glob_run, "split=test")["n_rows"] == before
    # the glob now matches an extra file
    extra = glob_run["df"].head(40).with_columns(request_id=pl.col("request_id") + 10**9)
    extra.write_parquet(folder / "c.parquet")
    with pytest.raises(DataChangedError, match=rf"added file {folder / 'c.parquet'} \(the source "
                                               r"reads it now; it was not part of training\)"):
        _export(glob_run, "split=test")
    (folder / "c.parquet").unlink()
    # a training file gone (the glob still matches the other one)
    b.rename(glob_run["tmp"] / "b.parquet")
    (glob_run["tmp"] / "scores.parquet").unlink()
    with pytest.raises(DataChangedError, match=rf"missing file {b} \(trained on it"):
        _export(glob_run, "split=test")
    assert not (glob_run["tmp"] / "scores.parquet").exists()  # refused before any output
    # data=<option> reads other data on purpose: no check against the training fingerprint
    assert _export(glob_run, "split=test", "data=clicklog", f"data.source.path={a}")["n_rows"] > 0


def test_split_val_by_hash_draws_validation_over_the_earlier_time_range():
    from hybridrank.data.readers import ColumnMap

    n = 2000
    frame = pl.DataFrame({"r": np.arange(n), "t": np.arange(n) * 10, "y": np.zeros(n)})
    cm = ColumnMap(request="r", label="y", time="t")
    tr_t, va_t, te_t = split_frame(frame, cm, by="time", key="request")
    tr_h, va_h, te_h = split_frame(frame, cm, by="time", key="request", val_by="hash")
    assert te_h["r"].to_list() == te_t["r"].to_list() == list(range(1600, 2000))  # latest 20 %
    assert va_t["r"].to_list() == list(range(1400, 1600))                         # the block before
    assert va_h.height == 200 and va_h["r"].max() < 1600
    assert va_h["r"].min() < 200 and va_h["r"].max() > 1400      # spread over the whole range
    assert sorted(tr_h["r"].to_list() + va_h["r"].to_list()) == list(range(1600))
    again = split_frame(frame, cm, by="time", key="request", val_by="hash")[1]
    assert again["r"].to_list() == va_h["r"].to_list()             # stable
    with pytest.raises(ValueError, match="val_by='time' needs by='time'"):
        split_frame(frame, cm, by="hash", key="request", val_by="time")


def test_explore_and_propensity_roles_are_read_checked_and_batched():
    """The exploration flag and the logging propensity travel from the log to every batch; bad
    values are errors naming the column."""
    from hybridrank.data.collate import ListDataset, collate  # noqa: F401  (the batch builder)
    from hybridrank.data.readers import ColumnMap
    from hybridrank.data.schema import Schema
    from hybridrank.data.validate import validate_frame

    frame = pl.DataFrame({"r": [1, 1, 2, 2, 3], "y": [0.0, 1.0, 0.0, 0.0, 1.0], "x": [0.1, 0.2, 0.3, 0.4, 0.5],
                          "pos": [1, 2, 1, 2, 1], "ex": [1, 1, 0, 0, 1], "pr": [0.5, 0.5, 0.9, 0.1, 1.0]})
    cm = ColumnMap(request="r", label="y", position="pos", explore="ex", propensity="pr", numeric=["x"])
    ok = validate_frame(frame, cm, label_max=1)
    data = Schema.fit(ok, cm, 1).transform(ok)
    assert data.explore.tolist() == [True, True, False, False, True]
    assert data.propensity.tolist() == pytest.approx([0.5, 0.5, 0.9, 0.1, 1.0])
    part = data.chunks(2)
    first = next(iter(part))
    assert first.explore.tolist() == [True, True] and first.propensity.tolist() == pytest.approx([0.5, 0.5])
    with pytest.raises(ValueError, match="explore 'ex' differs within 1 request"):
        validate_frame(frame.with_columns(pl.Series("ex", [1, 0, 0, 0, 1])), cm, label_max=1)
    with pytest.raises(ValueError, match="explore 'ex' missing or not 0/1"):
        validate_frame(frame.with_columns(pl.Series("ex", [2, 2, 0, 0, 1])), cm, label_max=1)
    with pytest.raises(ValueError, match=r"propensity 'pr' missing or outside \(0, 1\]"):
        validate_frame(frame.with_columns(pl.Series("pr", [0.5, 0.5, 0.0, 0.1, 1.0])), cm, label_max=1)


def test_a_constant_column_is_scaled_by_one_not_by_rounding_noise():
    """A constant training column whose mean lands one ulp off its value has a "std" of ~1e-13:
    it is stored as 1, so a serving value of 683 reads 0.24, not 2e12 (found by Hypothesis)."""
    cm = ColumnMap(request="r", label="y", numeric=["a"])
    df = pl.DataFrame({"r": [0, 0, 1], "y": [0, 1, 0], "a": [682.7634171249226] * 3})
    schema = Schema.fit(df, cm, 1)
    assert schema.std == (1.0,)
    assert schema.read(df.with_columns(a=pl.lit(683.0))).num.flatten().tolist() == pytest.approx([0.2366] * 3, abs=1e-3)
