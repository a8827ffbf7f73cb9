"""Missing numeric values read under ``nan_policy="indicator"``: the training mean plus a 0/1
missing-value feature per column, fitted in one pass or over chunks, carried by the model into
the files it scores; and the simulator's worlds with missing values (``missing_share``)."""

from __future__ import annotations

import logging

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridrank.data.readers import ColumnMap
from hybridrank.data.schema import Schema, SchemaFit
from hybridrank.data.validate import validate_frame

CM = ColumnMap(request="r", label="y", numeric=["a", "b", "c"])


def _frame(a, b, c, seed=0):
    n = len(a)
    rng = np.random.default_rng(seed)
    return pl.DataFrame({"r": np.arange(n) // 3, "y": (rng.random(n) < 0.3).astype(np.int64),
                         "a": a, "b": b, "c": c}, schema_overrides={"a": pl.Float64, "b": pl.Float64,
                                                                      "c": pl.Float64})


def test_validate_keeps_missing_values_missing_and_counts_them(caplog):
    df = _frame([1.0, None, float("nan"), float("inf"), 5.0, 6.0], [1.0] * 6, [2.0] * 6)
    with caplog.at_level(logging.INFO):
        out = validate_frame(df, CM, label_max=1, nan_policy="indicator", name="log")
    assert out["a"].to_list() == [1.0, None, None, None, 5.0, 6.0]
    assert "log: kept 3 missing/NaN/inf numeric value(s) as missing (nan_policy='indicator'): {'a': 3}" \
        in caplog.text
    with pytest.raises(ValueError, match=r"set nan_policy='indicator' to fill them with the training mean"):
        validate_frame(df, CM, label_max=1)


def test_indicator_schema_against_numpy():
    """The scaler of a column with holes is the mean / population std of its present values; a
    missing value reads 0 (the mean) and its column's indicator 1; columns without holes get none."""
    a = [1.0, None, 3.0, None, 9.0, 7.0, 2.0, 4.0, None]
    b = [float(v) for v in range(9)]
    df = validate_frame(_frame(a, b, [5.0] * 9), CM, label_max=1, nan_policy="indicator")
    schema = Schema.fit(df, CM, 1, nan_policy="indicator")
    present = np.array([v for v in a if v is not None])
    assert schema.missing == ("a",) and schema.feature_names == ("a", "b", "c", "a:missing")
    assert schema.mean[0] == pytest.approx(present.mean()) and schema.std[0] == pytest.approx(present.std())
    assert schema.mean[1] == pytest.approx(4.0) and schema.std[2] == 1.0  # constant column: std 1
    num = schema.transform(df).num.numpy()
    gone = np.array([v is None for v in a])
    assert num.shape == (9, 4)
    assert np.array_equal(num[:, 3], gone.astype(np.float32))
    assert np.all(num[gone, 0] == 0.0)
    assert num[~gone, 0] == pytest.approx((present - present.mean()) / present.std(), rel=1e-6)
    assert Schema.from_dict(schema.to_dict()) == schema
    whole = schema.transform(_frame([2.0] * 3, [1.0] * 3, [5.0] * 3)).num.numpy()  # a chunk without holes
    assert whole.shape == (3, 4) and (whole[:, 3] == 0).all()


def test_a_column_missing_only_at_scoring_time_reads_the_mean_and_is_logged(caplog):
    df = _frame([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [1.0, None, 3.0, 4.0, 5.0, 6.0], [0.0] * 6)
    schema = Schema.fit(validate_frame(df, CM, label_max=1, nan_policy="indicator"), CM, 1,
                        nan_policy="indicator")
    assert schema.missing == ("b",)
    new = _frame([None, 2.0, 3.0], [1.0, 2.0, None], [0.0] * 3)
    with caplog.at_level(logging.WARNING):
        num = schema.read(new).num.numpy()
    assert "missing values in numeric ['a'], which had none in training" in caplog.text
    assert num[0, 0] == 0.0 and num[2, 1] == 0.0 and num[:, 3].tolist() == [0.0, 0.0, 1.0]
    assert np.isfinite(num).all()


def test_missing_value_features_need_the_indicator_policy():
    with pytest.raises(ValueError, match=r"missing-value features \['a'\] need nan_policy='indicator'"):
        Schema(("a",), (), {}, (0.0,), (1.0,), 1.0, ColumnMap(request="r", label="y", numeric=["a"]),
               missing=("a",))
    with pytest.raises(ValueError, match=r"missing-value features for \['z'\], which are not numeric"):
        Schema(("a",), (), {}, (0.0,), (1.0,), 1.0, ColumnMap(request="r", label="y", numeric=["a"]),
               nan_policy="indicator", missing=("z",))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(st.none(), st.floats(-1e3, 1e3)), min_size=2, max_size=40),
       st.integers(1, 6))
def test_a_chunked_fit_equals_one_fit(values, parts):
    """However the training rows are chunked (chunks with no present value of a column
    included), the scaler and the columns with holes are those of one fit over all rows."""
    n = len(values)
    df = validate_frame(_frame(values, list(np.arange(n, dtype=float)), values[::-1]), CM, label_max=1,
                        nan_policy="indicator")
    whole = Schema.fit(df, CM, 1, nan_policy="indicator")
    fit = SchemaFit(CM, 1, nan_policy="indicator")
    for chunk in np.array_split(np.arange(n), min(parts, n)):
        fit.update(df[chunk.tolist()])
    chunked = fit.finish()
    assert chunked.missing == whole.missing
    assert chunked.mean == pytest.approx(whole.mean, rel=1e-9, abs=1e-9)
    assert chunked.std == pytest.approx(whole.std, rel=1e-7, abs=1e-7)


def test_world_missing_values_follow_item_quality():
    """``missing_share`` hides item-level numerics per item, the weaker items more often; at 0 the
    world is the one drawn without the field."""
    from hybridrank.data.simulators.world import simulate_world
    from hybridrank.data.simulators.world_spec import draw_world
    from hybridrank.data.simulators.world_steps import draw_population, missing_items

    spec = draw_world(11, size="tiny", family="longtail", missing_share=0.3)
    pop = draw_population(spec)
    gone = missing_items(spec, pop, 50)
    assert abs(gone.mean() - 0.3) < 0.03
    share = gone.mean(axis=1)
    weak = pop.item_quality < np.median(pop.item_quality)
    assert share[weak].mean() > share[~weak].mean() + 0.1  # missing not at random
    world = simulate_world(spec)
    side = [c for c in world.columns["numeric"] if world.frame[c].null_count()]
    assert len(side) >= spec.n_side
    for c in side:  # an item misses a column on every impression or on none
        per_item = world.frame.group_by(world.columns["item"]).agg(pl.col(c).null_count() / pl.len())
        assert set(per_item[c].unique().to_list()) <= {0.0, 1.0}
    plain = simulate_world(draw_world(11, size="tiny", family="longtail"))
    assert plain.frame.equals(simulate_world(draw_world(11, size="tiny", family="longtail",
                                                        missing_share=0.0)).frame)
    assert not any(plain.frame[c].null_count() for c in plain.columns["numeric"])


@pytest.mark.slow
def test_a_model_trained_with_indicators_scores_files_with_holes(tmp_path, compose_cfg):
    """Trained with nan_policy=indicator, the model reads missing values of the files it scores
    as in training: the same scores as those rows with the training mean written in and the
    indicator set, and a different score from the mean alone (the indicator's weight acts)."""
    from hybridrank.cli.export import export
    from hybridrank.cli.train import train
    from hybridrank.data.simulate import simulate_clicklog
    from hybridrank.models.ranker import HybridRanker
    from hybridrank.serving.export import read_scores

    df = simulate_clicklog(n_users=120, seed=2)
    holes = df.with_row_index("i").with_columns(
        item_price=pl.when(pl.col("i") % 5 == 0).then(None).otherwise(pl.col("item_price"))).drop("i")
    holes.write_parquet(tmp_path / "train.parquet")
    result = train(compose_cfg("config", f"paths.output_dir={tmp_path}/run", "data=clicklog",
                               f"data.source.path={tmp_path}/train.parquet",
                               "data.source.nan_policy=indicator", "trainer.max_epochs=1"))
    model = HybridRanker.load_from_checkpoint(result["best_checkpoint"], map_location="cpu",
                                              weights_only=True)
    assert model.schema.missing == ("item_price",)
    assert model.scorer.n_numeric == len(model.schema.numeric) + 1
    out = tmp_path / "scores.parquet"
    new = tmp_path / "new.parquet"
    holes.head(1500).write_parquet(new)
    export(compose_cfg("export", f"checkpoint={result['best_checkpoint']}", f"output={out}",
                       f"input={new}", "calibrator=none"))
    frame, _ = read_scores(out)
    assert frame.height == 1500 and np.isfinite(frame["pctr"].to_numpy()).all()
    data = model.schema.read(holes.head(1500))
    j = model.schema.numeric.index("item_price")
    gone = data.num[:, -1] == 1
    assert gone.any() and (data.num[gone, j] == 0).all()
    z = model.predict_split(data)[0]
    data.num[:, -1] = 0.0  # the same rows without the indicator
    assert not np.allclose(z[gone].numpy(), model.predict_split(data)[0][gone].numpy())
