"""Time ``hybridrank.data.libsvm.read_libsvm`` against a plain line-by-line Python parser.

Both read the same files in the same run and return the same thing: labels, qids and a dense
float64 feature matrix (the script checks that the two agree exactly before timing). The plain
parser is what most LETOR tutorials write: for each line, drop the ``#`` comment, split on
whitespace, ``float`` the label, strip ``qid:``, split each ``i:v`` token and ``float`` the value,
then fill a numpy matrix. Timing: best of ``--repeats`` runs per reader (the minimum, since on a
shared machine interference only ever adds time), readers interleaved run by run so that load
changes hit both alike.

Datasets: all of MQ2008 (S1..S5, 15,211 rows x 46 features) and the MSLR-WEB subset (2 x 5,000
rows x 136 features, CRLF).

Usage: ``python -m benchmarks.reader [--repeats 7] [--json results/reader.json]``
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from benchmarks import common as C
from hybridrank.data.libsvm import read_libsvm


def read_plain(path: str | Path, n_features: int | None = None):
    """The straightforward parser: one Python loop iteration per line and per token.

    Returns ``(labels [N] float64, qids list[str], features [N, F] float64)``.
    """
    labels: list[float] = []
    qids: list[str] = []
    rows: list[dict[int, float]] = []
    width = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            tokens = line.split()
            labels.append(float(tokens[0]))
            if not tokens[1].startswith("qid:"):
                raise ValueError(f"{path}: missing qid in {line[:60]!r}")
            qids.append(tokens[1][4:])
            feats = {}
            for tok in tokens[2:]:
                i, v = tok.split(":", 1)
                feats[int(i)] = float(v)
            if feats:
                width = max(width, max(feats))
            rows.append(feats)
    width = n_features or width
    mat = np.zeros((len(rows), width))
    for r, feats in enumerate(rows):
        for i, v in feats.items():
            mat[r, i - 1] = v
    return np.asarray(labels), qids, mat


def read_hybridrank(path: str | Path, n_features: int | None = None):
    df = read_libsvm(path, n_features=n_features)
    width = df.width - 4  # label, qid, f1..fK, comment, line
    return (df["label"].to_numpy(), df["qid"].to_list(),
            df.select([f"f{i}" for i in range(1, width + 1)]).to_numpy())


def check_same(files: list[Path]) -> None:
    for p in files:
        a, b = read_plain(p), read_hybridrank(p)
        if not (np.array_equal(a[0], b[0]) and a[1] == b[1] and np.array_equal(a[2], b[2])):
            raise SystemExit(f"{p}: the two readers disagree")


def best_of(files: list[Path], repeats: int) -> dict[str, float]:
    times = {"plain": [], "read_libsvm": []}
    for _ in range(repeats):
        for name, fn in (("plain", read_plain), ("read_libsvm", read_hybridrank)):
            t0 = time.perf_counter()
            for p in files:
                fn(p)
            times[name].append(time.perf_counter() - t0)
    return {k: min(v) for k, v in times.items()} | {f"{k}_median": float(np.median(v))
                                                     for k, v in times.items()}


def parser() -> argparse.ArgumentParser:
    p = C.parser("benchmarks.reader", __doc__)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", default=None, help="also write the numbers here")
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    root = C.data_root() / "letor"
    datasets = {
        "MQ2008 S1..S5": [root / "MQ2008" / f"S{i}.txt" for i in range(1, 6)],
        "MSLR subset (train + test)": sorted((root / "MSLR_msn1_fold1_5k").glob("*.txt")),
    }
    rows, out = [], {}
    for name, files in datasets.items():
        check_same(files)
        n_rows = sum(read_libsvm(f).height for f in files)
        mb = sum(f.stat().st_size for f in files) / 1e6
        t = best_of(files, args.repeats)
        ratio = t["plain"] / t["read_libsvm"]
        out[name] = {"rows": n_rows, "megabytes": mb, **t, "speedup": ratio}
        rows.append([name, f"{n_rows:,}", f"{mb:.1f}", f"{t['plain'] * 1e3:.0f}",
                     f"{t['read_libsvm'] * 1e3:.0f}", f"{ratio:.1f}x"])
    print(f"read_libsvm vs a line-by-line Python parser, best of {args.repeats} (same run, "
          f"interleaved); {C.machine()}\n")
    print(C.markdown_table(["files", "rows", "MB", "plain Python (ms)", "read_libsvm (ms)",
                            "speed-up"], rows))
    if args.json:
        C.write_json(args.json, out)


if __name__ == "__main__":
    main()
