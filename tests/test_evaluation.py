"""Evaluation is written once: train's table, hybridrank-eval's and hybridrank-compare's figures of
the same checkpoint on the same split are the same numbers, to the last digit.

What each reports, and which quantities coincide:

- ``hybridrank-train`` (``metrics.json``): ``test`` (the model's points at the logged positions,
  ranked by its logit, calibrated as ``σ(logit)``), ``reference`` (the true pCTR and the base rate)
  and ``intervals`` (rows ``this model``, the oracle, the base rate; paired against the model);
- ``hybridrank-eval``: ``ranking.before`` / ``summaries.before`` are the same model row (after the
  downsampling correction, which is zero for a model trained on every negative), ``after`` the
  calibrated one, the oracle row, and ``intervals`` with ``after`` and the oracle paired against
  ``before``;
- ``hybridrank-compare`` on an export of the split (``pctr = σ(logit)``, no calibrator, no
  correction, no level trend) and a file of the true pCTR: the model's and the oracle's points,
  intervals and their paired difference. ``map`` has a point in ``metrics.json`` but no interval
  there.
"""

from __future__ import annotations

import math

import pytest
import torch

from hybridrank.evaluation.figures import (
    COMPARE_METRICS,
    EVAL_COLUMNS,
    TABLE_COLUMNS,
    calibration_report,
    compare_figures,
    final_figures,
    model_statistics,
    reference_rows,
    score_split,
)
from hybridrank.evaluation.tables import format_calibration_report, format_table, interval_cell

ORACLE = "oracle (true pCTR)"
FIELD = "f_ece@item_category"


def _same(a, b) -> bool:
    """Equal to the last digit (None and NaN equal themselves)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _paired(p) -> dict:
    """A paired result as ``interval_table`` stores it (from a ``PairedResult`` or its dict)."""
    if isinstance(p, dict):
        return p
    return {"diff": p.diff, "lower": p.lower, "upper": p.upper, "p_value": p.p_value,
            "verdict": p.verdict}


def assert_same_reports(train: dict, ev: dict, comparison, *, model_file: str, oracle_file: str):
    """train's ``test`` / ``reference`` / ``intervals``, eval's ``before`` rows and compare's
    figures of the same checkpoint and split are identical where they are the same quantity."""
    tiv, eiv = train["intervals"], ev["intervals"]
    model = {k.removeprefix("test/"): v for k, v in train["test"].items()}
    oracle = train["reference"][ORACLE]
    # eval's model row is train's: every point (ranking.before holds them all) ...
    assert ev["ranking"]["before"].keys() == model.keys()
    assert all(_same(ev["ranking"]["before"][k], v) for k, v in model.items())
    for row, values in (("before", model), (ORACLE, oracle)):
        s = ev["summaries"][row]
        assert (s["logloss"], s["ece"], s["pcoc"]) == (values["logloss"], values["ece"], values["pcoc"])
        assert s["fields"]["item_category"]["f_ece"] == values[FIELD]
    # ... and every interval and paired test of the rows both report
    common = [m for m in (*TABLE_COLUMNS, FIELD) if m in (*EVAL_COLUMNS, FIELD)]
    assert len(common) == len(TABLE_COLUMNS) + 1
    for t_row, e_row in (("this model", "before"), (ORACLE, ORACLE)):
        for m in common:
            assert tiv["rows"][t_row][m] == eiv["rows"][e_row][m], (t_row, m)
            assert tiv["notes"][t_row].get(m) == eiv["notes"][e_row].get(m), (t_row, m)
    for m in common:
        assert tiv["paired"][ORACLE][m] == eiv["paired"][ORACLE][m], m
    for k in ("n_requests", "n_positives", "n_boot", "alpha", "seed"):
        assert tiv[k] == eiv[k], k
    # the two tables print the same cells for the same figures
    table = format_table(train, (*TABLE_COLUMNS, FIELD))
    printed = format_calibration_report({**ev, "split": "test"})
    for t_row, e_row in (("this model", "before"), (ORACLE, ORACLE)):
        cells = [interval_cell(m, *tiv["rows"][t_row][m])[0] for m in (*TABLE_COLUMNS, FIELD)]
        assert f"| {t_row} | " + " | ".join(cells) + " |" in table
        cells = [interval_cell(m, *eiv["rows"][e_row][m])[0] for m in (*EVAL_COLUMNS, FIELD)]
        assert f"| {e_row} | " + " | ".join(cells) + " |" in printed
    # compare: the model's file and the true pCTR's file. A score file holds probabilities, not
    # the logits train and eval sum over, so its figures agree to float64 rounding (a few ulp:
    # logit(sigmoid(z)) is not z bit for bit), not bit for bit
    def close(a, b):
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
        if isinstance(a, str) or a is None:
            return a == b
        return a == pytest.approx(b, rel=1e-12, abs=1e-15)

    assert comparison.metrics == list(COMPARE_METRICS)
    for name, values, t_row in ((model_file, model, "this model"), (oracle_file, oracle, ORACLE)):
        for m in COMPARE_METRICS:
            iv = comparison.intervals[name][m]
            assert close(iv.estimate, values[m]), (name, m)
            if m in tiv["rows"][t_row]:
                assert close([iv.estimate, iv.lower, iv.upper], tiv["rows"][t_row][m]), (name, m)
    for m in TABLE_COLUMNS:
        assert close(_paired(comparison.paired[oracle_file][m]), tiv["paired"][ORACLE][m]), m
    assert comparison.stats[model_file].n_requests == tiv["n_requests"]
    assert comparison.stats[model_file].n_positives == tiv["n_positives"]


def _score_frames(model, chunks):
    """An export of the split without calibrator, correction or trend, and its true pCTR."""
    import polars as pl

    from hybridrank.serving.export import score_frame

    frame = pl.concat([score_frame(model, data) for data in chunks])
    return frame, frame.with_columns(pl.col("p_true").alias("pctr"))


@pytest.fixture(scope="module")
def untrained(compose_cfg, tmp_path_factory):
    """A model as ``hybridrank-train`` builds it, before training, on a small simulated log."""
    import hydra

    from hybridrank.cli.train import build_model

    cfg = compose_cfg("config", f"paths.output_dir={tmp_path_factory.mktemp('untrained')}",
                      "data.source.n_users=80", "model.metrics.fields=[item_category]")
    torch.manual_seed(0)
    datamodule = hydra.utils.instantiate(cfg.data)
    return build_model(cfg, datamodule).eval(), datamodule


def test_train_eval_and_compare_figures_are_one_computation(untrained):
    """The module's three paths (train's ``final_figures``, eval's ``calibration_report``,
    compare's ``compare_figures``) on one model and split give identical figures; the split read
    in small chunks gives the same scores as read whole."""
    from hybridrank.serving.calibration import IdentityCalibrator

    model, dm = untrained
    train = final_figures(model, dm.eval_chunks("test", 1 << 20), n_boot=40, seed=3)
    assert set(train["reference"]) == {ORACLE, "base rate"} and set(train["intervals"]["rows"]) == {
        "this model", ORACLE, "base rate"}
    whole = score_split(model, dm.eval_chunks("test"))
    pieces = list(dm.eval_chunks("test", 97))
    assert len(pieces) > 3
    scored = score_split(model, pieces)
    for name in ("logit", "label", "lengths", "position", "true_p", "time"):
        assert torch.equal(getattr(scored, name), getattr(whole, name)), name
    assert scored.fields.keys() == {"item_category"}
    assert torch.equal(scored.fields["item_category"], whole.fields["item_category"])
    ev = calibration_report(scored, IdentityCalibrator(), conventions=model.metric_conventions,
                            n_boot=40, seed=3)
    frame, truth = _score_frames(model, dm.eval_chunks("test"))
    comparison = compare_figures({"model.parquet": frame, "truth.parquet": truth}, n_boot=40, seed=3)
    assert_same_reports(train, ev, comparison, model_file="model.parquet", oracle_file="truth.parquet")


def test_reference_rows_and_model_statistics(untrained):
    """The base rate is the split's click rate for every impression; the oracle the true pCTR;
    the model's row ranks by its logit and is calibrated as its sigmoid."""
    model, dm = untrained
    label = torch.tensor([0.0, 2.0, 0.0, 0.0, 1.0])
    rows = reference_rows(label, torch.tensor([0.1, 0.5, 0.2, 0.1, 0.4]))
    assert list(rows) == [ORACLE, "base rate"]
    assert rows["base rate"].tolist() == [0.4] * 5 and rows["base rate"].dtype == torch.float64
    assert reference_rows(torch.zeros(3), None)["base rate"].tolist() == [1e-7] * 3  # clipped
    stats = model_statistics(model, dm.eval_chunks("test"))
    test = torch.cat([d.label for d in dm.eval_chunks("test")])
    z = torch.cat([model.predict_split(d, at_logged_position=True)[0] for d in dm.eval_chunks("test")])
    p = torch.sigmoid(z.double())
    y = (test > 0).double()
    logloss = float(-(y * p.clamp(1e-7, 1 - 1e-7).log() + (1 - y) * (1 - p.clamp(1e-7, 1 - 1e-7)).log()).mean())
    assert stats["this model"].point()["logloss"] == pytest.approx(logloss, rel=1e-9)
    assert stats["base rate"].point()["pcoc"] == pytest.approx(1.0, rel=1e-12)
    with pytest.raises(ValueError, match="holds no request"):
        score_split(model, [])


def test_refit_offsets_needs_a_tower(untrained):
    model, _ = untrained
    with pytest.raises(ValueError, match="position-bias tower"):
        model.refit_offsets(None, None)
    assert model._refitting_offsets is False


@pytest.mark.slow
def test_train_eval_and_compare_report_the_same_figures(small_run, compose_cfg, tmp_path, capsys):
    """Through the entry points: ``metrics.json`` of a run, ``hybridrank-eval`` of its checkpoint
    (``evaluate``) and ``hybridrank-compare`` of its export, on the test split, same bootstrap."""
    import json

    from hybridrank.cli.compare import main as compare_main
    from hybridrank.cli.export import evaluate, export
    from hybridrank.serving.export import read_score_table

    ckpt, out = small_run["ckpt"], small_run["out"]  # fields=[item_category], n_boot=60, seed 0
    saved = json.loads((out / "metrics.json").read_text())
    n_boot, seed = saved["intervals"]["n_boot"], saved["intervals"]["seed"]
    ev = evaluate(compose_cfg("eval", f"checkpoint={ckpt}", f"output_dir={tmp_path / 'eval'}",
                              "calibrator=isotonic", f"n_boot={n_boot}", f"seed={seed}",
                              "figures=false"))
    assert ev["correction"]["logit_shift"] == 0.0 and ev["split"] == "test"
    scores = tmp_path / "scores.parquet"
    export(compose_cfg("export", f"checkpoint={ckpt}", f"output={scores}", "split=test",
                       "calibrator=none", "correction=never", "level_trend.mode=off"))
    frame = read_score_table(scores)
    truth = tmp_path / "truth.parquet"
    frame.with_columns(frame["p_true"].alias("pctr")).write_parquet(truth)
    comparison = compare_figures({str(scores): frame, str(truth): read_score_table(truth)},
                                 n_boot=n_boot, seed=seed)
    assert_same_reports(saved, ev, comparison, model_file=str(scores), oracle_file=str(truth))
    # the console script prints these figures
    assert compare_main([str(scores), str(truth), "--n-boot", str(n_boot), "--seed", str(seed)]) == 0
    printed = capsys.readouterr().out
    row = next(r for r in printed.splitlines() if r.startswith(f"| {scores} |"))
    cells = [f"{saved['test'][f'test/{m}']:.4f}" for m in COMPARE_METRICS]
    assert [c.split(" [")[0] for c in row.strip("| ").split(" | ")[1:]] == cells
