"""The period check (``hybridrank.data.period_levels``): validation warns when the test period has a
click level it cannot show (a world with a drifting level), and stays silent without drift; the
levels and the trend against direct computations."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from hybridrank.data.datamodule import ListDataModule
from hybridrank.data.period_levels import check_periods, split_level
from hybridrank.data.sources import ClickLogSource
from hybridrank.data.splits import split_spec
from hybridrank.data.worlds import draw_world, simulate_world
from hybridrank.lists import ListData

#: the split of conf/data/clicklog.yaml: the latest 20 % of sessions test, validation by hash
CLICKLOG_SPLIT = {"by": "time", "val": 0.1, "test": 0.2, "key": "session", "seed": 0, "val_by": "hash"}


def _world_module(tmp_path, drift: str, val_by: str = "hash") -> ListDataModule:
    amp = 0.0 if drift == "none" else 0.5
    w = simulate_world(draw_world(8303, size="tiny", drift=drift, drift_amplitude=amp, ctr=0.08,
                                  n_impressions=20000))
    folder = w.write(tmp_path / drift)
    cols = dict(w.columns)
    cols["numeric"] = [c for c in cols["numeric"] if c != cols["position"]]
    split = split_spec({**CLICKLOG_SPLIT, "val_by": val_by})
    return ListDataModule(ClickLogSource(str(folder / "log.parquet"), cols, split=split), budget=2048)


def test_a_drifting_level_warns_and_a_steady_one_is_silent(tmp_path):
    drifting = _world_module(tmp_path, "linear")
    with pytest.warns(UserWarning, match="validation cannot show a level shift the test period has"):
        drifting.model_data()
    check = drifting.period_check
    # the level rises over the period (linear drift from -0.5 to +0.5 logit): the test period
    # lies above validation's average, by the trend and by the test clicks
    assert check.slope > 0 and check.predicted_gap > 0.2 and check.observed_gap > 0.2
    assert "trends over the training period" in check.message and "test split's click rate" in check.message

    steady = _world_module(tmp_path, "none")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="validation cannot show")
        steady.model_data()
    check = steady.period_check
    assert check.message is None and abs(check.predicted_gap) < 2 * check.predicted_se


def test_a_validation_block_before_test_sees_most_of_the_trend(tmp_path):
    """With ``val_by: time`` validation sits just before test: the trend's predicted gap shrinks
    with the time between them."""
    by_hash, by_time = _world_module(tmp_path, "linear"), _world_module(tmp_path, "linear", "time")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        by_hash.model_data()
        by_time.model_data()
    a, b = by_hash.period_check, by_time.period_check
    assert b.val.time > a.val.time
    assert abs(b.predicted_gap) < 0.5 * abs(a.predicted_gap)


def _lists(labels, sizes, times) -> ListData:
    n = int(sum(sizes))
    return ListData(torch.zeros(n, 0), torch.zeros(n, 0, dtype=torch.long),
                    torch.tensor(labels, dtype=torch.float32),
                    torch.tensor(np.r_[0, np.cumsum(sizes)], dtype=torch.long),
                    time=torch.tensor(times, dtype=torch.long))


def test_levels_and_trend_against_direct_computations():
    rng = np.random.default_rng(0)
    # 400 requests of 1..5 impressions over 100 time units, the click rate rising with time
    sizes = rng.integers(1, 6, 400)
    times = np.sort(rng.integers(0, 100, 400))
    p = 1 / (1 + np.exp(-(-2.0 + 0.01 * np.repeat(times, sizes))))
    labels = (rng.random(sizes.sum()) < p).astype(np.float64) * rng.integers(1, 3, sizes.sum())
    data = _lists(labels, sizes, times)
    lv = split_level(data)
    clicks, n = float((labels > 0).sum()), float(sizes.sum())
    rate = (clicks + 0.5) / (n + 1)
    assert lv.logit == pytest.approx(math.log(rate / (1 - rate)))
    assert lv.time == pytest.approx(float((times * sizes).sum() / n))
    per_req = np.add.reduceat((labels > 0).astype(float), np.r_[0, np.cumsum(sizes)[:-1]])
    se_rate = math.sqrt(((per_req - rate * sizes) ** 2).sum()) / n
    assert lv.se == pytest.approx(se_rate / (rate * (1 - rate)))
    # three splits cut from it: train the first 300 requests, val 300..339, test the last 60
    cuts = np.r_[0, np.cumsum(sizes)]

    def part(a, b):
        return _lists(labels[cuts[a]:cuts[b]], sizes[a:b], times[a:b])

    check = check_periods(part(0, 300), part(300, 340), part(340, 400), blocks=4)
    assert check.slope > 0
    assert check.predicted_gap == pytest.approx(check.slope * (check.test.time - check.val.time))
    assert check.observed_gap == pytest.approx(check.test.logit - check.val.logit)
    assert check.observed_se == pytest.approx(math.hypot(check.test.se, check.val.se))
    # no times, or an empty split: nothing to check
    assert check_periods(part(0, 300), None, part(340, 400)) is None
    no_time = _lists(labels[:cuts[10]], sizes[:10], times[:10])
    no_time.time = None
    assert check_periods(no_time, part(300, 340), part(340, 400)) is None
