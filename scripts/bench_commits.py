"""Run benchmark scripts on this checkout and on an earlier commit, side by side, in one run.

A refactoring (the package move of issue 18, say) must leave every benchmark within noise. This
script checks out ``--base`` into a temporary git worktree, then runs each named benchmark once
per round on the base and once on this checkout, alternating (base, here, base, here, ...), so a
machine that gets busier slows both alike. Each side runs its own copy of the script, in a fresh
interpreter, with its own package first on ``PYTHONPATH`` (the base tree needs no install; a
script that does not exist at the base is reported and skipped).

The Markdown tables each run prints are matched cell by cell between the two sides (same table,
same row label, same column). For every numeric cell it prints the median over rounds on each
side and the ratio here / base, with the [min-max] of the per-round ratios: a timing within
noise has a ratio near 1 whose range straddles it; an accuracy figure of a deterministic run has
ratio 1.000 exactly.

Usage::

    python scripts/bench_commits.py --base f45def0 --rounds 3 \\
        --bench "bench_metrics.py --requests 20000 --repeats 10" "bench_reader.py --repeats 5"

Not a test; nothing is written unless ``--out`` is given (JSON of every cell and round).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NUMBER = re.compile(r"^[^\d+\-.]*([+\-]?\d[\d,]*\.?\d*(?:[eE][+\-]?\d+)?)")


def parse_tables(text: str) -> dict[tuple[str, str, str], str]:
    """Every cell of every Markdown table: ``(table title, row label, column) -> text``.

    A table's title is the last non-empty, non-table line before it, its numbers replaced by
    ``#`` (a title may carry the run's own timing), numbered when repeated;
    the row label is the first cell and every other cell that is not a number (``20,000 /
    torchmetrics``), made unique by a counter when a label repeats.
    """
    cells: dict[tuple[str, str, str], str] = {}
    lines = text.splitlines()
    title, header, seen_titles, seen_rows = "", None, {}, {}
    for raw in lines:
        line = raw.strip()
        if not line.startswith("|"):
            if line:  # numbers in a title (a run's own timing) do not name the table
                title, header = re.sub(r"\d[\d,.]*", "#", line), None
            continue
        parts = [c.strip() for c in line.strip("|").split("|")]
        if header is None:
            seen_titles[title] = seen_titles.get(title, 0) + 1
            header = parts
            table = title if seen_titles[title] == 1 else f"{title} #{seen_titles[title]}"
            seen_rows = {}
            continue
        if all(set(c) <= set("-: ") for c in parts):
            continue
        label = " / ".join([parts[0]] + [c for c in parts[1:] if c and number(c) is None])
        seen_rows[label] = seen_rows.get(label, 0) + 1
        if seen_rows[label] > 1:
            label = f"{label} #{seen_rows[label]}"
        for col, value in zip(header[1:], parts[1:]):
            cells[(table, label, col)] = value
    return cells


def number(cell: str) -> float | None:
    """The leading number of a cell (``"12.3 ms"``, ``"251x"``, ``"0.4512 ± 0.01"``), or None."""
    m = NUMBER.match(cell.replace("**", ""))
    if not m:
        return None
    try:
        return float(m.group(1).replace(",", ""))
    except ValueError:
        return None


def run_one(tree: Path, script: list[str], timeout: float) -> tuple[str, float, int]:
    """Run ``scripts/<script>`` of ``tree`` with that tree's package first; output, seconds, rc."""
    env = dict(os.environ, PYTHONPATH=str(tree) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(tree / "scripts" / script[0]), *script[1:]], cwd=tree,
                          env=env, capture_output=True, text=True, timeout=timeout)
    return proc.stdout + proc.stderr, time.perf_counter() - t0, proc.returncode


def compare(base_runs: list[dict], here_runs: list[dict]) -> list[tuple]:
    """Rows ``(table, row, column, base median, here median, ratio, lo, hi)`` of numeric cells
    present in every round on both sides."""
    keys = set.intersection(*(set(r) for r in base_runs + here_runs))
    rows = []
    for key in sorted(keys, key=lambda k: (k[0], list(base_runs[0]).index(k))):
        b = [number(r[key]) for r in base_runs]
        h = [number(r[key]) for r in here_runs]
        if any(v is None for v in b + h):
            continue
        mb, mh = statistics.median(b), statistics.median(h)
        ratios = [y / x for x, y in zip(b, h) if x != 0]
        ratio = mh / mb if mb != 0 else (1.0 if mh == 0 else float("inf"))
        rows.append((*key, mb, mh, ratio, min(ratios, default=ratio), max(ratios, default=ratio)))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="the earlier commit (any git revision)")
    p.add_argument("--bench", nargs="+", required=True,
                   help='benchmark command lines relative to scripts/, e.g. "bench_reader.py --repeats 5"')
    p.add_argument("--here", default=None,
                   help="a commit to stand for 'here' (default: this checkout, as it is)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--timeout", type=float, default=1800, help="seconds per benchmark run")
    p.add_argument("--out", default=None, help="write every cell of every round here (JSON)")
    args = p.parse_args()
    if args.rounds < 1:
        raise SystemExit("--rounds must be >= 1")
    base_sha = subprocess.run(["git", "rev-parse", "--short", args.base], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    here_sha = subprocess.run(["git", "rev-parse", "--short", args.here or "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()
    dirty = args.here is None and bool(subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
        text=True).stdout.strip())
    results: dict = {"base": base_sha, "here": here_sha + ("+changes" if dirty else ""), "benches": {}}
    with tempfile.TemporaryDirectory(prefix="bench_commits_") as tmp:
        base_tree = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(base_tree), args.base],
                       cwd=ROOT, check=True)
        here_tree = ROOT
        if args.here is not None:
            here_tree = Path(tmp) / "here"
            subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(here_tree), args.here],
                           cwd=ROOT, check=True)
        for tree in {base_tree, here_tree} - {ROOT}:
            # a tree with configs shipped as hybridrank.conf (package-dir: conf/): without an
            # install, the package finds them through a link (the worktree is temporary)
            if (tree / "conf" / "__init__.py").is_file() and not (tree / "hybridrank" / "conf").exists():
                (tree / "hybridrank" / "conf").symlink_to(Path("..") / "conf", target_is_directory=True)
        try:
            for line in args.bench:
                script = shlex.split(line)
                missing = [name for name, tree in (("base", base_tree), ("here", here_tree))
                           if not (tree / "scripts" / script[0]).is_file()]
                if missing:
                    print(f"\n## {line}\n\nnot in the {' and '.join(missing)} tree: skipped")
                    continue
                runs: dict[str, list[dict]] = {"base": [], "here": []}
                secs: dict[str, list[float]] = {"base": [], "here": []}
                failed = None
                for r in range(args.rounds):
                    for side, tree in (("base", base_tree), ("here", here_tree)):
                        out, sec, rc = run_one(tree, script, args.timeout)
                        if rc != 0:
                            failed = f"{side} round {r + 1} exited {rc}:\n" + out[-3000:]
                            break
                        runs[side].append(parse_tables(out))
                        secs[side].append(sec)
                    if failed:
                        break
                print(f"\n## {line}\n")
                if failed:
                    print(f"FAILED: {failed}")
                    results["benches"][line] = {"failed": failed}
                    continue
                rows = compare(runs["base"], runs["here"])
                print(f"{args.rounds} round(s), base {base_sha} then here {here_sha}, alternating; "
                      f"wall time per run: base {statistics.median(secs['base']):.0f} s, "
                      f"here {statistics.median(secs['here']):.0f} s\n")
                if not rows:
                    print("(no numeric cell common to both sides)")
                current = None
                for table, row, col, mb, mh, ratio, lo, hi in rows:
                    if table != current:
                        current = table
                        print(f"\n{table}\n\n| row | column | base {base_sha} | here {here_sha} | "
                              "here / base [min-max over rounds] |\n|---|---|---|---|---|")
                    print(f"| {row} | {col} | {mb:.6g} | {mh:.6g} | {ratio:.3f} [{lo:.3f}-{hi:.3f}] |")
                results["benches"][line] = {
                    "seconds": secs, "rows": [list(r) for r in rows],
                    "cells": {side: [{" / ".join(k): v for k, v in run.items()} for run in runs[side]]
                              for side in runs}}
                sys.stdout.flush()
        finally:
            for tree in {base_tree, here_tree} - {ROOT}:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
