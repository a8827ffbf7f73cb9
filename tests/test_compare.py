"""hybridrank-compare: metrics of score files with intervals, paired tests against the first."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

from hybridrank.cli.compare import main
from hybridrank.evaluation.tables import compare_scores


def _frames(seed: int = 0, n_req: int = 400, size: int = 8):
    rng = np.random.default_rng(seed)
    n = n_req * size
    truth = 1 / (1 + np.exp(-(rng.normal(size=n) - 2.5)))
    label = (rng.random(n) < truth).astype(np.float64)
    req = np.repeat(np.arange(n_req), size)
    good = np.clip(truth * np.exp(rng.normal(0, 0.1, n)), 1e-6, 1 - 1e-6)
    noise = np.clip(rng.random(n) * 2 * truth.mean(), 1e-6, 1 - 1e-6)  # no information
    base = {"request_id": req, "label": label}
    return (pl.DataFrame({**base, "pctr": good}), pl.DataFrame({**base, "pctr": noise}),
            pl.DataFrame({**base, "pctr": good.copy()}))


def test_planted_difference_is_significant_and_identical_files_are_not():
    good, noise, same = _frames()
    report = compare_scores({"good": good, "noise": noise, "same": same}, n_boot=300)
    paired = report.split("Paired with")[1]
    noise_row = next(r for r in paired.splitlines() if r.startswith("| noise"))
    same_row = next(r for r in paired.splitlines() if r.startswith("| same"))
    assert noise_row.count(" *") >= 3          # ndcg, gauc, logloss... all clearly worse
    assert " *" not in same_row and "+0 [+0, +0]" in same_row
    assert "400 requests, 3,200 impressions" in report


def test_mismatched_files_are_refused(tmp_path):
    good, noise, _ = _frames()
    with pytest.raises(ValueError, match="column 'label' differs from a at 1 row"):
        compare_scores({"a": good, "b": noise.with_columns(
            pl.when(pl.int_range(pl.len()) == 5).then(1 - pl.col("label")).otherwise(
                pl.col("label")).alias("label"))})
    with pytest.raises(ValueError, match="rows vs"):
        compare_scores({"a": good, "b": noise.head(10)})
    good.write_parquet(tmp_path / "a.parquet")
    noise.write_csv(tmp_path / "b.csv")
    assert main([str(tmp_path / "a.parquet"), str(tmp_path / "b.csv"), "--n-boot", "50"]) == 0
    assert main([str(tmp_path / "a.parquet"), str(tmp_path / "a.parquet")]) == 2


def test_report_cells_are_the_engines_points_and_the_metrics_of_the_scores():
    """Every estimate printed is the one engine's point (frame_stats), and that is the metric of
    the file's scores by plain loops / sklearn."""
    from sklearn.metrics import average_precision_score, ndcg_score, roc_auc_score

    from hybridrank.evaluation.figures import COMPARE_METRICS as METRICS
    from hybridrank.metrics.calibration import bin_index
    from hybridrank.metrics.request_stats import frame_stats

    good, _, _ = _frames(seed=1, n_req=120)
    report = compare_scores({"good": good}, n_boot=50)
    row = next(r for r in report.splitlines() if r.startswith("| good"))
    printed = [float(cell.split(" [")[0]) for cell in row.strip("| \n").split(" | ")[1:]]
    point = frame_stats(good).point()
    assert printed == [round(point[m], 4) for m in METRICS]
    p, y = good["pctr"].to_numpy(), good["label"].to_numpy()
    lists = [(p[i:i + 8], y[i:i + 8]) for i in range(0, len(p), 8)]
    pos = [(s, t) for s, t in lists if t.any()]
    two = [(s, t) for s, t in pos if not t.all()]
    q = np.clip(p, 1e-7, 1 - 1e-7)
    b = bin_index(torch.from_numpy(p), 15).numpy()
    want = {
        "ndcg@10": np.mean([ndcg_score([2 ** t - 1], [s], k=10) for s, t in pos]),
        "gauc": sum(len(s) * roc_auc_score(t, s) for s, t in two) / sum(len(s) for s, _ in two),
        "map": np.mean([average_precision_score(t, s) for s, t in pos]),
        "logloss": -np.mean(y * np.log(q) + (1 - y) * np.log(1 - q)),
        "ece": sum(abs(p[b == k].sum() - y[b == k].sum()) for k in range(15)) / len(p),
        "pcoc": p.sum() / y.sum(),
    }
    for m in METRICS:
        assert point[m] == pytest.approx(want[m], rel=1e-9), m
