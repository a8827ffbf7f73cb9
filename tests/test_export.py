"""Score export, atomic writes, portable models, bad inputs and the calibration report."""

from __future__ import annotations

import datetime as dt
import hashlib
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from hybridrank.atomic import atomic_path
from hybridrank.lists import ListData, lengths_to_offsets
from hybridrank.losses import HybridLoss
from hybridrank.models.ranker import HybridRanker
from hybridrank.models.scorers import MLPScorer
from hybridrank.serving.calibration import IsotonicCalibrator, PlattCalibrator, calibrator_from_dict
from hybridrank.serving.checkpoint import load_model
from hybridrank.serving.export import (
    ScoreWriter,
    build_metadata,
    export_torchscript,
    ranks_within_requests,
    read_scores,
    score_frame,
)


@pytest.fixture(scope="module")
def trained(_small_run, compose_cfg):
    """The session's small trained run (conftest.small_run; read, never written): its checkpoint,
    model, config and splits."""
    import hydra

    ckpt = _small_run["ckpt"]
    model = load_model(ckpt)
    config = dict(model.hparams.config)
    splits = hydra.utils.instantiate(config["data"]["source"]).load()
    return {"ckpt": ckpt, "model": model, "config": config, "splits": splits,
            "compose": compose_cfg}


def export_cfg(trained, out: Path, *overrides: str):
    return trained["compose"]("export", f"checkpoint={trained['ckpt']}", f"output={out}",
                              *overrides)


def no_temp_files(directory: Path) -> bool:
    return not [p for p in directory.iterdir() if p.name.startswith(".") and p.suffix == ".tmp"]


# --- pure helpers ------------------------------------------------------------------------------
def test_ranks_by_pctr_ties_in_storage_order():
    p = np.array([0.2, 0.5, 0.5, 0.1, 0.3, 0.3, 0.3])
    offsets = np.array([0, 4, 7])
    ranks = ranks_within_requests(p, offsets)
    assert ranks.tolist() == [3, 1, 2, 4, 1, 2, 3]


def test_atomic_path_keeps_old_file_on_error(tmp_path):
    target = tmp_path / "scores.parquet"
    target.write_text("OLD")
    with pytest.raises(RuntimeError, match="boom"), atomic_path(target) as tmp:
        tmp.write_text("half a file")
        raise RuntimeError("boom")
    assert target.read_text() == "OLD"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scores.parquet"]


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_score_writer_exception_mid_write_leaves_old_file(tmp_path, suffix):
    target = tmp_path / f"scores{suffix}"
    target.write_text("OLD")
    frame = pl.DataFrame({"request_id": [1, 1], "pctr": [0.1, 0.2]})
    meta = {"hybridrank_version": "test"}
    with pytest.raises(RuntimeError, match="disk on fire"), ScoreWriter(target, meta) as w:
        w.write(frame)
        w.write(frame)
        raise RuntimeError("disk on fire")
    assert target.read_text() == "OLD"
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]
    with ScoreWriter(target, meta) as w:  # and a clean write replaces it
        w.write(frame)
    back, md = read_scores(target)
    assert back.height == 2 and md["hybridrank_version"] == "test" and md["n_rows"] == 2


def test_two_output_model_exports_both_logits(tmp_path):
    torch.manual_seed(0)
    scorer = MLPScorer(3, [5, 4], n_outputs=2, hidden=(8,))
    model = HybridRanker(scorer, HybridLoss(0.5, terms={"jrc": {"weight": 0.5}}))
    n = 9
    data = ListData(num=torch.randn(n, 3), cat=torch.randint(0, 5, (n, 2)), label=torch.zeros(n),
                    offsets=lengths_to_offsets(torch.tensor([4, 5])),
                    bid=torch.rand(n), request_key=pl.Series("request", ["a", "b"]))
    f = score_frame(model, data)
    assert {"logit0", "logit1"} <= set(f.columns)
    assert np.allclose(f["logit"], f["logit1"] - f["logit0"], atol=1e-6)
    assert f["request_id"].to_list() == ["a"] * 4 + ["b"] * 5
    assert np.array_equal(f["ecpm"].to_numpy(), f["bid"].to_numpy() * f["pctr"].to_numpy())
    ts = torch.jit.load(str(export_torchscript(model, None, tmp_path / "m.pt")))
    assert np.allclose(ts(data.num, data.cat).numpy(), f["pctr"].to_numpy(), atol=1e-6)


# --- end to end on a trained checkpoint ----------------------------------------------------------
@pytest.mark.slow
def test_export_matches_in_memory_prediction(trained, tmp_path):
    from hybridrank.cli.export import export

    out = tmp_path / "scores.parquet"
    result = export(export_cfg(trained, out, "calibrator=platt", "chunk_rows=500"))
    frame, meta = read_scores(out)
    test = trained["splits"].test
    assert result["n_rows"] == frame.height == test.n_impressions
    # same logits and pCTR as the in-memory model, row for row (storage order)
    z = trained["model"].predict_split(test)[0]
    assert np.allclose(frame["logit"].to_numpy(), z.numpy(), atol=1e-6)
    # ... and as the model applied by hand to the features (the serving path, batch at once)
    with torch.no_grad():
        direct = trained["model"](test.num, test.cat)
    assert np.allclose(frame["logit"].to_numpy(), direct.numpy(), atol=1e-6)
    cal = calibrator_from_dict(meta["calibrator"])
    assert isinstance(cal, PlattCalibrator)
    assert np.allclose(frame["pctr"].to_numpy(), cal.predict_proba(z.double()).numpy(),
                       atol=1e-9)
    # ranks: 1-based within request by pCTR, ties by storage order (brute-force reference)
    off = test.offsets.tolist()
    pctr = frame["pctr"].to_list()
    expected = []
    for r in range(len(off) - 1):
        idx = list(range(off[r], off[r + 1]))
        order = sorted(idx, key=lambda i: (-pctr[i], i))
        rank = {i: k + 1 for k, i in enumerate(order)}
        expected += [rank[i] for i in idx]
    assert frame["rank"].to_list() == expected
    # ids, positions and eCPM
    assert frame["request_id"].to_list() == test.request_key.gather(
        test.request_of_row().numpy()).to_list()
    assert frame["position"].to_list() == test.position.tolist()
    assert np.array_equal(frame["ecpm"].to_numpy(),
                          test.bid.double().numpy() * frame["pctr"].to_numpy())
    # metadata round trip
    assert meta["checkpoint_sha256"] == hashlib.sha256(trained["ckpt"].read_bytes()).hexdigest()
    assert Path(meta["checkpoint_path"]) == trained["ckpt"].resolve()
    assert meta["config"] == trained["config"]
    assert calibrator_from_dict(meta["calibrator"]).to_dict() == meta["calibrator"]
    assert meta["neg_keep_rate"] == pytest.approx(trained["model"].data_info["neg_keep_rate"])
    assert meta["correction_applied"] is False
    assert dt.datetime.fromisoformat(meta["created_at"]).tzinfo is not None
    assert meta["hybridrank_version"]
    assert meta["n_rows"] == frame.height
    fit = meta["calibration_fit"]
    assert fit["split"] == "val" and fit["after"]["logloss"] <= fit["before"]["logloss"] + 1e-9
    assert no_temp_files(tmp_path)


@pytest.mark.slow
def test_csv_export_with_sidecar_and_all_splits(trained, tmp_path):
    from hybridrank.cli.export import export

    out = tmp_path / "scores.csv"
    export(export_cfg(trained, out, "calibrator=none", "split=all"))
    assert (tmp_path / "scores.csv.meta.json").exists()
    frame, meta = read_scores(out)
    s = trained["splits"]
    assert frame.height == s.train.n_impressions + s.val.n_impressions + s.test.n_impressions
    assert frame["split"].unique().sort().to_list() == ["test", "train", "val"]
    assert meta["calibrator"] == {"name": "none"}
    z = trained["model"].predict_split(s.val)[0].double()
    got = frame.filter(pl.col("split") == "val")["pctr"].to_numpy()
    assert np.allclose(got, torch.sigmoid(z).numpy(), atol=1e-9)


@pytest.fixture(scope="module")
def sim_file(trained, tmp_path_factory):
    """The simulated click log behind the checkpoint, as a parquet file."""
    import hydra

    from hybridrank.data.simulate import simulate_clicklog

    source = hydra.utils.instantiate(trained["config"]["data"]["source"])
    path = tmp_path_factory.mktemp("data") / "log.parquet"
    simulate_clicklog(**source.simulator).write_parquet(path)
    return path


@pytest.mark.slow
def test_input_file_streams_in_chunks_and_ignores_row_order(trained, sim_file, tmp_path):
    from hybridrank.cli.export import export

    a = tmp_path / "a.parquet"
    export(export_cfg(trained, a, "calibrator=none", f"input={sim_file}", "chunk_rows=700"))
    shuffled = tmp_path / "shuffled.parquet"
    pl.read_parquet(sim_file).sample(fraction=1.0, shuffle=True, seed=3).write_parquet(shuffled)
    b = tmp_path / "b.parquet"
    export(export_cfg(trained, b, "calibrator=none", f"input={shuffled}", "chunk_rows=700"))
    fa, ma = read_scores(a)
    fb, _ = read_scores(b)
    assert fa.height == fb.height == pl.read_parquet(sim_file).height
    assert ma["scored"]["input"] == str(sim_file)
    key = ["request_id", "item_id"]
    j = fa.join(fb, on=key, suffix="_b")
    assert j.height == fa.height
    assert np.allclose(j["pctr"].to_numpy(), j["pctr_b"].to_numpy(), atol=1e-6)
    assert (j["rank"] == j["rank_b"]).all()


@pytest.mark.slow
def test_unlabeled_input_has_no_label_column(trained, sim_file, tmp_path):
    from hybridrank.cli.export import export

    nolabel = tmp_path / "new.parquet"
    pl.read_parquet(sim_file).drop("click", "p_true").write_parquet(nolabel)
    out = tmp_path / "s.parquet"
    export(export_cfg(trained, out, "calibrator=none", f"input={nolabel}"))
    frame, _ = read_scores(out)
    assert "label" not in frame.columns and "pctr" in frame.columns


@pytest.mark.slow
def test_failure_in_a_later_chunk_leaves_old_file(trained, sim_file, tmp_path):
    from hybridrank.cli.export import export

    df = pl.read_parquet(sim_file)
    last = df["request_id"][-1]
    bad = tmp_path / "bad.parquet"
    df.with_columns(pl.when(pl.col("request_id") == last).then(float("nan"))
                    .otherwise(pl.col("item_price")).alias("item_price")).write_parquet(bad)
    out = tmp_path / "scores.parquet"
    out.write_text("OLD")
    with pytest.raises(ValueError, match="item_price"):
        export(export_cfg(trained, out, "calibrator=none", f"input={bad}", "chunk_rows=300"))
    assert out.read_text() == "OLD"
    assert no_temp_files(tmp_path)


@pytest.mark.slow
def test_bad_inputs_fail_before_any_output(trained, sim_file, tmp_path):
    from hybridrank.cli.export import export

    df = pl.read_parquet(sim_file)
    out = tmp_path / "o.parquet"
    # a column the model needs
    missing = tmp_path / "missing.parquet"
    df.drop("item_price").write_parquet(missing)
    with pytest.raises(ValueError, match=r"'item_price' \(numeric feature\)"):
        export(export_cfg(trained, out, "calibrator=none", f"input={missing}"))
    # negative and NaN bids: count and first row
    bids = df["bid"].to_numpy().copy()
    bids[[5, 17]] = [-1.0, np.nan]
    badbid = tmp_path / "badbid.parquet"
    df.with_columns(pl.Series("bid", bids)).write_parquet(badbid)
    with pytest.raises(ValueError, match=r"bid 'bid' missing, not finite or negative: 2 row\(s\), "
                                         r"first -1.0 at .*badbid\.parquet row 6"):
        export(export_cfg(trained, out, "calibrator=none", f"input={badbid}"))
    # an output path that cannot be written (its parent is a file)
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="blocker"):
        export(export_cfg(trained, blocker / "o.parquet", "calibrator=none"))
    # a column-map override that would read the position feature another way
    assert trained["model"].schema.columns.position_transform == "log"
    with pytest.raises(ValueError, match="cannot change the model's features .*position_transform"):
        export(export_cfg(trained, out, "calibrator=none", f"input={sim_file}",
                          "columns={position_transform: identity}"))
    with pytest.raises(ValueError, match="cannot change the model's features"):  # the feature is position's
        export(export_cfg(trained, out, "calibrator=none", f"input={sim_file}", "columns={position: item_pop}"))
    # data whose features differ from the model's
    cfg = export_cfg(trained, out, "calibrator=none", "data=clicklog",
                     f"data.source.path={sim_file}", "data.source.columns.numeric=[item_price]")
    with pytest.raises(ValueError, match=r"features differ from the model's: numeric \['item_price'\]"):
        export(cfg)
    assert not out.exists()
    assert no_temp_files(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("cal", ["platt", "isotonic"])
def test_portable_models_reproduce_pctr(trained, tmp_path, cal):
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from hybridrank.cli.export import export

    out = tmp_path / "scores.parquet"
    result = export(export_cfg(trained, out, f"calibrator={cal}", "portable=true"))
    frame, meta = read_scores(out)
    test = trained["splits"].test
    n = 300  # a batch size the models were not traced with
    expected = frame["pctr"].to_numpy()[:n]
    num, cat = test.num[:n], test.cat[:n]
    ts = torch.jit.load(result["portable"]["torchscript"])
    assert np.allclose(ts(num, cat).numpy(), expected, atol=1e-5)
    names = {name for name, _ in ts.named_modules()}
    assert not any("metrics" in name for name in names)   # serving only: no metric state
    assert not any("loss" in name for name, _ in ts.named_parameters())
    sess = ort.InferenceSession(result["portable"]["onnx"])
    got = sess.run(["pctr"], {"num": num.numpy(), "cat": cat.numpy()})[0]
    assert np.allclose(got, expected, atol=1e-5)
    ops = {node.op_type for node in onnx.load(result["portable"]["onnx"]).graph.node}
    allowed = {"Gather", "Concat", "Gemm", "MatMul", "Add", "Relu", "Sub", "Mul", "Div",
               "Sigmoid", "Slice", "Squeeze", "Unsqueeze", "Reshape", "Constant", "Shape",
               "Cast", "Clip", "Min", "Max", "GreaterOrEqual", "ReduceSum", "Less", "Greater",
               "Where", "Identity", "ConstantOfShape", "Equal", "Not", "And", "Flatten"}
    assert ops <= allowed, ops - allowed
    assert "Sigmoid" in ops or cal == "isotonic"
    if cal == "isotonic":
        assert isinstance(calibrator_from_dict(meta["calibrator"]), IsotonicCalibrator)


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "reweighted", "applied"), [
    ("auto", True, False), ("auto", False, True), ("always", True, True), ("never", False, False)])
def test_downsampling_correction_in_export(trained, tmp_path, monkeypatch, mode, reweighted,
                                           applied):
    """A checkpoint that recorded keep rate w = 0.25: the correction shifts the logit by log w."""
    import hybridrank.serving.prepare as prep
    from hybridrank.cli.export import export

    def fake_load(path):
        model = load_model(path)
        model.data_info.update(neg_keep_rate=0.25, reweight_negatives=reweighted)
        return model

    monkeypatch.setattr(prep, "load_model", fake_load)
    out = tmp_path / "s.parquet"
    export(export_cfg(trained, out, "calibrator=none", f"correction={mode}"))
    frame, meta = read_scores(out)
    assert meta["correction"]["mode"] == mode and meta["neg_keep_rate"] == 0.25
    assert meta["correction_applied"] is applied
    z = frame["logit"].to_numpy().astype(np.float64)
    p = 1 / (1 + np.exp(-z))
    q = p / (p + (1 - p) / 0.25) if applied else p
    assert np.allclose(frame["pctr"].to_numpy(), q, atol=1e-9)


@pytest.mark.slow
def test_evaluate_writes_report(trained, tmp_path):
    pytest.importorskip("matplotlib")
    from hybridrank.cli.export import evaluate

    cfg = trained["compose"]("eval", f"checkpoint={trained['ckpt']}", f"output_dir={tmp_path}",
                      "calibrator=isotonic", "fields=[item_category]", "n_boot=200")
    result = evaluate(cfg)
    for key in ("json", "reliability", "pcoc_by_position", "field_item_category"):
        path = Path(result["files"][key])
        assert path.exists() and path.read_bytes()[:4] == (b"\x89PNG" if key != "json" else b"{\n  ")
    s = result["summaries"]
    assert {"before", "after", "oracle (true pCTR)"} <= set(s)
    test = trained["splits"].test
    assert sum(s["after"]["reliability"]["count"]) == test.n_impressions
    assert s["before"]["pcoc_by_position"]["position"][0] == 1
    # field calibration by item_category: counts and clicks per value by brute force, values named
    # by the training vocabulary, the oracle near-calibrated per value
    field = s["after"]["fields"]["item_category"]
    schema = trained["model"].schema
    j = schema.categorical.index("item_category")
    for v, label, n, k in zip(field["value"], field["label"], field["count"], field["positives"]):
        sel = test.cat[:, j] == v
        assert n == int(sel.sum()) and k == int((test.label[sel] > 0).sum())
        assert label == schema.vocab["item_category"][v - 1]
    assert all(lo <= pc <= hi for lo, pc, hi in zip(field["pcoc_lower"], field["pcoc"], field["pcoc_upper"])
               if pc is not None)
    oracle = s["oracle (true pCTR)"]["fields"]["item_category"]
    assert oracle["f_ece"] < s["before"]["fields"]["item_category"]["f_ece"] + 0.01
    iv = result["intervals"]["rows"]["before"]["f_ece@item_category"]
    assert iv[1] <= iv[0] <= iv[2]
    # one engine: the summaries, the ranking block and the intervals print the same numbers
    for row, summary in s.items():
        ivs = result["intervals"]["rows"][row]
        for key in ("logloss", "ece", "pcoc"):
            assert ivs[key][0] == summary[key], (row, key)
        assert ivs["f_ece@item_category"][0] == summary["fields"]["item_category"]["f_ece"]
    for row in ("before", "after"):
        assert all(result["ranking"][row][k] == s[row][k] for k in ("logloss", "ece", "pcoc"))
        assert result["ranking"][row]["ndcg@10"] == result["intervals"]["rows"][row]["ndcg@10"][0]
    # ... and they are the metrics of the scores: the model's pCTR (no downsampling correction
    # here) and the true pCTR, by the pure functions
    from hybridrank.lists import gather_lists, pad_index
    from hybridrank.metrics import ece, log_loss, ndcg

    assert result["correction"]["logit_shift"] == 0.0
    z = trained["model"].predict_split(test, at_logged_position=True)[0].double()
    p = torch.sigmoid(z)
    assert s["before"]["logloss"] == pytest.approx(float(log_loss(p, test.label)), rel=1e-9)
    assert s["before"]["ece"] == pytest.approx(float(ece(p, test.label)), rel=1e-9)
    assert s["oracle (true pCTR)"]["ece"] == pytest.approx(float(ece(test.true_p.double(), test.label)),
                                                          rel=1e-9)
    index, mask = pad_index(test.lengths)
    assert result["ranking"]["before"]["ndcg@10"] == pytest.approx(float(ndcg(
        gather_lists(z, index, mask), gather_lists(test.label.double(), index, mask), mask=mask, k=10)),
        rel=1e-9)


def test_metadata_is_strings():
    meta = build_metadata(checkpoint_path="x.ckpt", checkpoint_sha256="ab", config={"a": 1},
                          calibrator=PlattCalibrator(a=2.0, b=-1.0), neg_keep_rate=0.5,
                          correction_applied=True)
    assert all(isinstance(v, str) for v in meta.values())
    assert meta["correction_applied"] == "true" and meta["neg_keep_rate"] == "0.5"


@pytest.mark.slow
def test_policies_travel_with_the_model_nan_fill(tmp_path, compose_cfg):
    """Trained with nan_policy=fill, the model fills NaN features of the files it scores with the
    training fill value (issue: export stopped with 'numeric feature ... has missing/NaN/inf')."""
    from hybridrank.cli.export import export
    from hybridrank.cli.train import train
    from hybridrank.data.simulate import simulate_clicklog

    df = simulate_clicklog(n_users=120, seed=2)
    holes = df.with_row_index("i").with_columns(
        item_price=pl.when(pl.col("i") % 50 == 0).then(None).otherwise(pl.col("item_price")),
        item_pop=pl.when(pl.col("i") % 70 == 3).then(float("nan")).otherwise(pl.col("item_pop")),
    ).drop("i")
    holes.write_parquet(tmp_path / "train.parquet")
    result = train(compose_cfg("config", f"paths.output_dir={tmp_path}/run", "data=clicklog",
                               f"data.source.path={tmp_path}/train.parquet",
                               "data.source.nan_policy=fill", "data.source.fill_value=-1.5",
                               "trainer.max_epochs=1"))
    model = load_model(result["best_checkpoint"])
    assert model.schema.nan_policy == "fill" and model.schema.fill_value == -1.5
    new = tmp_path / "new.parquet"
    holes.head(2000).write_parquet(new)
    out = tmp_path / "scores.parquet"
    res = export(compose_cfg("export", f"checkpoint={result['best_checkpoint']}", f"output={out}",
                             f"input={new}", "calibrator=none"))
    frame, _ = read_scores(out)
    assert res["n_rows"] == frame.height == 2000
    assert np.isfinite(frame["pctr"].to_numpy()).all()
    # the filled rows scored exactly as the same rows with the fill value written in
    filled = holes.head(2000).with_columns(pl.col("item_price").fill_null(-1.5),
                                           pl.col("item_pop").fill_nan(-1.5))
    filled.write_parquet(tmp_path / "filled.parquet")
    export(compose_cfg("export", f"checkpoint={result['best_checkpoint']}",
                       f"output={tmp_path}/ref.parquet", f"input={tmp_path}/filled.parquet",
                       "calibrator=none"))
    ref, _ = read_scores(tmp_path / "ref.parquet")
    assert np.array_equal(frame["pctr"].to_numpy(), ref["pctr"].to_numpy())
    # a model trained with the default policy still refuses NaN, naming the column
    strict = train(compose_cfg("config", f"paths.output_dir={tmp_path}/strict", "data=clicklog",
                               f"data.source.path={tmp_path}/filled.parquet", "trainer.max_epochs=1"))
    with pytest.raises(ValueError, match="numeric feature 'item_price' has missing/NaN/inf"):
        export(compose_cfg("export", f"checkpoint={strict['best_checkpoint']}",
                           f"output={tmp_path}/x.parquet", f"input={new}", "calibrator=none"))


def test_load_from_checkpoint_is_self_contained(trained):
    """The one way back from a checkpoint: HybridRanker.load_from_checkpoint, nothing to pass."""
    model = HybridRanker.load_from_checkpoint(trained["ckpt"], map_location="cpu", weights_only=True)
    test = trained["splits"].test
    a = model.predict_split(test)[0]
    b = trained["model"].predict_split(test)[0]
    assert torch.equal(a, b)
    assert model.schema == trained["model"].schema and model.loss.n_outputs == 1


@pytest.mark.slow
def test_list_aware_model_exports_with_a_request_input(tmp_path, compose_cfg):
    """model=list_aware: scored by whole requests everywhere, portable models take `request`."""
    ort = pytest.importorskip("onnxruntime")
    from hybridrank.cli.export import export
    from hybridrank.cli.train import train

    result = train(compose_cfg("config", f"paths.output_dir={tmp_path}/run", "model=list_aware",
                               "data.source.n_users=100", "trainer.max_epochs=1"))
    out = tmp_path / "scores.parquet"
    res = export(compose_cfg("export", f"checkpoint={result['best_checkpoint']}", f"output={out}",
                             "calibrator=platt", "portable=true", "chunk_rows=700"))
    frame, _ = read_scores(out)
    import hydra

    model = load_model(result["best_checkpoint"])
    splits = hydra.utils.instantiate(model.hparams.config["data"]["source"],
                                     _partial_=True)(schema=model.schema).load()
    data = splits.test
    # the export (chunks of whole requests) equals one pass over the whole split
    assert np.allclose(frame["logit"].to_numpy(), model.predict_split(data)[0].numpy(), atol=1e-5)
    n_req = 40
    n = int(data.offsets[n_req])
    num, cat = data.num[:n], data.cat[:n]
    request = data.request_of_row()[:n]
    expected = frame["pctr"].to_numpy()[:n]
    ts = torch.jit.load(res["portable"]["torchscript"])
    assert np.allclose(ts(num, cat, request).numpy(), expected, atol=1e-5)
    sess = ort.InferenceSession(res["portable"]["onnx"])
    assert [i.name for i in sess.get_inputs()] == ["num", "cat", "request"]
    got = sess.run(["pctr"], {"num": num.numpy(), "cat": cat.numpy(), "request": request.numpy()})[0]
    assert np.allclose(got, expected, atol=2e-5)
    # the context matters: the same rows scored as one big list give other scores
    alone = ts(num, cat, torch.zeros_like(request)).numpy()
    assert not np.allclose(alone, expected, atol=1e-4)


@pytest.mark.slow
def test_auto_calibrator_records_its_decision(trained, tmp_path):
    from hybridrank.cli.export import export

    out = tmp_path / "scores.parquet"
    export(export_cfg(trained, out, "calibrator=auto"))
    frame, meta = read_scores(out)
    cal = calibrator_from_dict(meta["calibrator"])
    decision = meta["calibrator"]["decision"]
    assert decision["chosen"] == cal.chosen.name and set(decision["candidates"]) == {
        "none", "shift", "platt", "isotonic"}
    assert meta["calibration_fit"]["decision"] == decision
    # the evidence: clicks behind it, the ranking check, and the calibration split against the
    # scored (test) split's scores
    assert decision["clicks"] > 0 and decision["ranking"]["auc"] > 0.5
    assert decision["resemblance"]["verdict"] in ("resembles", "differs")
    assert decision["resemblance"]["impressions"]["scored"] == frame.height
    assert "time blocks" in decision["rule"]  # the simulated log has request times
    z = torch.from_numpy(frame["logit"].to_numpy().astype(np.float64))
    assert np.allclose(frame["pctr"].to_numpy(), cal.predict_proba(z).numpy(), atol=1e-9)
