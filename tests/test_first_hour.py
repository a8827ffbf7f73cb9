"""Small things a new user meets in the first hour (issue 19): report cells whose point and interval
agree or say why not, a LibSVM file narrower than its config, what git ignores."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from hybridrank.evaluation import TABLE_COLUMNS, format_table
from hybridrank.lists import ListData, lengths_to_offsets
from hybridrank.metrics.request_stats import flat_stats
from hybridrank.metrics.uncertainty import interval_table

ROOT = Path(__file__).resolve().parents[1]


def split_intervals(data: ListData, rows, *, metrics, n_boot: int, seed: int = 0):
    """Bootstrap intervals of logit rows on one split, as the train table computes them."""
    stats = {name: flat_stats(z, data.label, data.lengths) for name, z in rows.items()}
    return interval_table(stats, metrics=metrics, n_boot=n_boot, seed=seed)
CELL = re.compile(r"^(-?\d+\.\d+) \[(-?\d+\.\d+|0), (-?\d+\.\d+)\]([⁺†]?)$")


def _split(n_requests: int, clicks: int, seed: int = 0) -> ListData:
    """Requests of 5..12 impressions with ``clicks`` clicks in all and a known true pCTR."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(5, 13, (n_requests,), generator=g)
    n = int(lengths.sum())
    true_p = torch.rand(n, generator=g) * 0.1
    label = torch.zeros(n)
    label[torch.randperm(n, generator=g)[:clicks]] = 1.0
    return ListData(num=torch.zeros(n, 1), cat=torch.zeros(n, 1, dtype=torch.long), label=label,
                    offsets=lengths_to_offsets(lengths), true_p=true_p)


def _table(data: ListData, n_boot: int = 200) -> str:
    rate = float(data.label.mean().clamp(1e-7, 1 - 1e-7))
    rows = {"oracle (true pCTR)": torch.logit(data.true_p.double(), eps=1e-7),
            "base rate": torch.logit(torch.full((data.n_impressions,), rate, dtype=torch.float64))}
    iv = split_intervals(data, rows, metrics=TABLE_COLUMNS, n_boot=n_boot, seed=0)
    points = {name: {m: v[0] for m, v in r.items() if v[0] is not None} for name, r in iv["rows"].items()}
    return format_table({"test": {}, "reference": points, "intervals": iv})


def _cells(table: str) -> list[str]:
    out = []
    for line in table.splitlines():
        if line.startswith("| ") and "---" not in line and not line.startswith("| model"):
            out += [c.strip() for c in line.strip("|").split("|")[1:]]
    return out


def test_every_cell_holds_its_point_or_says_why():
    """The base rate's ECE is exactly 0 on the split (it predicts the split's own rate) while
    every resample's is above 0: a percentile interval then excludes its own point
    (``0.0000 [0.0009, 0.0531]`` in issue 19). Every cell must hold its point, be marked
    one-sided, or say that it has no interval."""
    table = _table(_split(400, 60))
    cells = _cells(table)
    assert cells
    one_sided = 0
    for cell in cells:
        if "[no interval]" in cell or cell == "n/a":
            continue
        m = CELL.match(cell)
        assert m, cell
        point, lower, upper, mark = float(m[1]), float(m[2]), float(m[3]), m[4]
        if mark == "†":
            continue
        assert lower <= point <= upper, cell
        one_sided += mark == "⁺"
    assert one_sided >= 1, table  # the base rate's ECE at 0
    assert "one-sided interval [0, upper]" in table


def test_base_rate_ece_is_zero_and_its_resamples_are_not():
    """The situation the one-sided cell is for, checked on the numbers themselves."""
    data = _split(400, 60)
    rate = float(data.label.mean())
    iv = split_intervals(data, {"base rate": torch.logit(torch.full((data.n_impressions,), rate,
                                                                    dtype=torch.float64))},
                         metrics=("ece",), n_boot=200, seed=0)
    est, lower, upper = iv["rows"]["base rate"]["ece"]
    assert est == pytest.approx(0.0, abs=1e-8) and lower > est  # 0 up to the float32 rate
    from hybridrank.evaluation import interval_cell

    assert interval_cell("ece", est, lower, upper) == (f"0.0000 [0, {upper:.4f}]⁺", "⁺")


def test_a_cell_without_interval_says_why():
    """Two clicks in the whole split: most resamples hold no click and NDCG / GAUC cannot be
    computed there, so there is no interval, and the table says so and why."""
    table = _table(_split(60, 2))
    missing = [c for c in _cells(table) if "[no interval]" in c]
    assert missing, table
    reasons = [line for line in table.splitlines() if line.startswith("[no interval]")]
    assert reasons, table
    assert all("resamples undefined" in r for r in reasons), reasons


def test_interval_cell_rules():
    from hybridrank.evaluation import interval_cell

    assert interval_cell("ndcg@10", 0.5, 0.45, 0.55) == ("0.5000 [0.4500, 0.5500]", None)
    assert interval_cell("f_ece@item", 0.001, 0.002, 0.01) == ("0.0010 [0, 0.0100]⁺", "⁺")
    assert interval_cell("pcoc", 0.9, 0.95, 1.1)[1] == "†"  # not bounded at 0: marked, kept
    assert interval_cell("gauc", 0.6, None, None, "no interval: 700 of 1000 resamples undefined") \
        == ("0.6000 [no interval]", "no interval: 700 of 1000 resamples undefined")


def test_libsvm_narrower_than_n_features_is_noted(tmp_path, caplog):
    """A 10-feature file read with MQ2008's n_features=46 is padded with 36 zero columns: a
    warning names the counts (it used to be silent)."""
    from hybridrank.data.libsvm import read_libsvm

    path = tmp_path / "ten.txt"
    path.write_text("".join(f"{i % 3} qid:{i // 4} " + " ".join(f"{j}:{(i + j) % 7 / 7:.3f}"
                                                            for j in range(1, 11)) + "\n"
                            for i in range(12)))
    with caplog.at_level("WARNING", logger="hybridrank.data.libsvm"):
        frame = read_libsvm(path, n_features=46)
    assert frame.select([f"f{j}" for j in range(11, 47)]).to_numpy().max() == 0
    assert "largest feature index is 10 but n_features=46" in caplog.text
    assert "36 zero column(s)" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="hybridrank.data.libsvm"):
        read_libsvm(path, n_features=10)
        read_libsvm(path)
    assert "zero column" not in caplog.text


def test_gitignore_covers_what_the_readme_writes():
    """Files the README's commands write when run in the checkout stay out of git."""
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    paths = ["build/lib/x.py", "data/clicks/sim.parquet", "logs/day=2026-01-01/part-0.parquet",
             "data/new/log.parquet", "runs/demo/metrics.json", "outputs/train/x/metrics.json",
             "results/letor.json"]
    p = subprocess.run([git, "check-ignore", "--no-index", *paths], cwd=ROOT, capture_output=True,
                       text=True)
    assert sorted(p.stdout.split()) == sorted(paths), p.stdout + p.stderr
    kept = subprocess.run([git, "check-ignore", "--no-index", "data/README.md", "conf/config.yaml"],
                          cwd=ROOT, capture_output=True, text=True)
    assert kept.stdout == ""
