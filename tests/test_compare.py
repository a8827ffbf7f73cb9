"""hybridrank-compare: metrics of score files with intervals, paired tests against the first."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from hybridrank.cli.compare import compare_scores, main


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
