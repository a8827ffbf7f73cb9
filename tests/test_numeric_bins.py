"""The piecewise-linear encoding of numeric features (``data.source.numeric_bins``): the encoding
against a loop, the edges against numpy's quantiles, a chunked fit against one fit, and a model
that carries the edges into the files it scores."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hybridrank.data.schema as schema_module
from hybridrank.data.readers import ColumnMap
from hybridrank.data.schema import Schema, SchemaFit, check_numeric_bins, piecewise_linear

CM = ColumnMap(request="r", label="y", numeric=["a", "b"])


def _loop(x, edges):
    """Bin t of value v: (v - e_t) / (e_t+1 - e_t), at least 0 unless t is the first bin, at
    most 1 unless t is the last."""
    out = []
    for v in x:
        row = []
        for t in range(len(edges) - 1):
            u = (v - edges[t]) / (edges[t + 1] - edges[t])
            if t > 0:
                u = max(u, 0.0)
            if t < len(edges) - 2:
                u = min(u, 1.0)
            row.append(u)
        out.append(row)
    return np.array(out)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-50, 50), min_size=1, max_size=20),
       st.lists(st.floats(-20, 20), min_size=2, max_size=8, unique=True))
def test_piecewise_linear_against_a_loop(values, edges):
    edges = sorted(edges)
    if min(np.diff(edges)) < 1e-3:
        return
    x = np.array(values)
    got = piecewise_linear(x, edges)
    assert got == pytest.approx(_loop(x, edges), rel=1e-9, abs=1e-9)
    # inside the edges the encoding is invertible: the value is the first edge plus the bins'
    # widths weighted by their entries
    inside = (x >= edges[0]) & (x <= edges[-1])
    back = edges[0] + got[inside] @ np.diff(edges)
    assert back == pytest.approx(x[inside], abs=1e-9)


def _frame(n, seed=0):
    rng = np.random.default_rng(seed)
    return pl.DataFrame({"r": np.arange(n) // 4, "y": rng.integers(0, 2, n),
                         "a": rng.exponential(size=n), "b": np.full(n, 3.0)})


def test_bins_are_the_training_quantiles_standardised():
    df = _frame(400)
    schema = Schema.fit(df, CM, 1, numeric_bins=4)
    a = df["a"].to_numpy()
    want = (np.quantile(a, [0, 0.25, 0.5, 0.75, 1.0]) - a.mean()) / a.std()
    assert schema.bins[0] == pytest.approx(tuple(want))
    assert schema.bins[1] == (0.0,)  # a constant column: one edge, kept as one column
    assert schema.feature_names == ("a:bin0", "a:bin1", "a:bin2", "a:bin3", "b")
    num = schema.transform(df).num.numpy()
    z = (a - a.mean()) / a.std()
    order = np.argsort(df["r"].to_numpy(), kind="stable")  # transform keeps request order
    assert num[:, :4] == pytest.approx(piecewise_linear(z[order], want), rel=1e-5, abs=1e-6)
    assert np.all(num[:, 4] == 0.0)
    assert Schema.from_dict(schema.to_dict()) == schema
    assert Schema.fit(df, CM, 1).bins == ()  # off by default


def test_a_chunked_fit_samples_the_same_rows(monkeypatch):
    """Above the sample's size the edges come from a uniform sample of the training rows, the
    same sample however the rows are chunked."""
    monkeypatch.setattr(schema_module, "BIN_SAMPLE_ROWS", 150)
    df = _frame(1000, seed=3)
    whole = SchemaFit(CM, 1, numeric_bins=5)
    whole.update(df)
    parts = SchemaFit(CM, 1, numeric_bins=5)
    for a, b in ((0, 333), (333, 340), (340, 1000)):
        parts.update(df[a:b])
    assert np.array_equal(np.sort(whole._keys), np.sort(parts._keys)) and len(whole._keys) == 150
    assert parts.finish().bins[0] == pytest.approx(whole.finish().bins[0])


@pytest.mark.parametrize("bad", [1, -2, 2.5, True, "x"])
def test_bad_bin_counts_are_errors(bad):
    with pytest.raises((ValueError, TypeError), match="numeric_bins|could not convert"):
        check_numeric_bins(bad)


def test_a_bin_count_is_checked_when_the_source_is_built(tmp_path):
    from hybridrank.data.sources import ClickLogSource

    _frame(40).write_parquet(tmp_path / "log.parquet")
    with pytest.raises(ValueError, match="numeric_bins must be 0 \\(off\\) or an integer >= 2, got 1"):
        ClickLogSource(tmp_path / "log.parquet", CM.to_dict(), numeric_bins=1)


@pytest.mark.slow
def test_a_model_trained_on_bins_scores_new_files_with_its_edges(tmp_path, compose_cfg):
    """Trained with ``numeric_bins``, the scorer reads one column per bin and the export
    encodes new files with the training edges: the exported pCTR is the kept model's own."""
    import torch

    from hybridrank.cli.export import export
    from hybridrank.cli.train import train
    from hybridrank.data.simulate import simulate_clicklog
    from hybridrank.models.ranker import HybridRanker
    from hybridrank.serving.export import read_scores

    df = simulate_clicklog(n_users=120, seed=4)
    df.write_parquet(tmp_path / "train.parquet")
    result = train(compose_cfg("config", f"paths.output_dir={tmp_path}/run", "data=clicklog",
                               f"data.source.path={tmp_path}/train.parquet", "data.source.numeric_bins=4",
                               "trainer.max_epochs=1"))
    model = HybridRanker.load_from_checkpoint(result["best_checkpoint"], map_location="cpu", weights_only=True)
    schema = model.schema
    assert schema.bins and model.scorer.n_numeric == len(schema.feature_names) > len(schema.numeric)
    new = tmp_path / "new.parquet"
    df.head(1200).write_parquet(new)
    out = tmp_path / "scores.parquet"
    export(compose_cfg("export", f"checkpoint={result['best_checkpoint']}", f"output={out}",
                       f"input={new}", "calibrator=none"))
    frame, _ = read_scores(out)
    data = schema.read(df.head(1200))
    assert data.num.shape[1] == len(schema.feature_names)
    z = model.predict_split(data)[0]
    assert frame.height == 1200
    assert np.sort(frame["pctr"].to_numpy()) == pytest.approx(np.sort(torch.sigmoid(z).numpy()), rel=1e-5)


def test_bins_and_missing_value_features_together():
    """Under ``nan_policy="indicator"`` a hole reads the training mean (0) before binning, the
    edges come from the present values only, and the indicator columns follow the bins."""
    from hybridrank.data.validate import validate_frame

    df = _frame(200, seed=5).with_row_index("i").with_columns(
        a=pl.when(pl.col("i") % 4 == 0).then(None).otherwise(pl.col("a"))).drop("i")
    df = validate_frame(df, CM, label_max=1, nan_policy="indicator")
    schema = Schema.fit(df, CM, 1, numeric_bins=3, nan_policy="indicator")
    present = df["a"].drop_nulls().to_numpy()
    want = (np.quantile(present, [0, 1 / 3, 2 / 3, 1]) - present.mean()) / present.std()
    assert schema.bins[0] == pytest.approx(tuple(want))
    assert schema.feature_names == ("a:bin0", "a:bin1", "a:bin2", "b", "a:missing")
    num = schema.transform(df).num.numpy()
    gone = df["a"].is_null().to_numpy()
    assert np.array_equal(num[:, 4], gone.astype(np.float32))
    assert num[gone, :3] == pytest.approx(np.tile(piecewise_linear(np.zeros(1), want), (gone.sum(), 1)))
