"""Run the speed benchmarks and collect their Markdown tables into docs/BENCHMARKS.md ("Speed").

Each benchmark runs in its own subprocess (a fresh interpreter, so one cannot warm or slow the
next): ``benchmarks.metrics``, ``benchmarks.reader`` and ``scripts/bench_train.py``
(``benchmarks.losses`` writes its own section and is run on its own). One that fails is reported
with the tail of its output. The tables (with the line right before each) are kept, other chatter
dropped; the section is stamped with the date and the machine::

    python -m benchmarks.speed [--quick] [--only reader metrics] [--write-docs]

``--quick`` passes ``--quick`` to the benchmarks that accept it and fewer repeats to the reader;
``--write-docs`` rewrites the "Speed" section, only from a complete run (every benchmark, no
``--quick``, none failed).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Sequence

from benchmarks import common as C

#: name -> (command after the interpreter, title in the section)
BENCHES = {
    "metrics": (["-m", "benchmarks.metrics"], "Metrics: NDCG@10 against torchmetrics"),
    "reader": (["-m", "benchmarks.reader"], "Reader: read_libsvm against a line-by-line Python parser"),
    "train": (["scripts/bench_train.py"], "Training throughput"),
}


def markdown_only(text: str) -> str:
    """The tables of a benchmark's output, each with the non-empty line just before it."""
    lines = text.splitlines()
    keep: list[str] = []
    for i, line in enumerate(lines):
        if line.lstrip().startswith("|"):
            if not keep or not keep[-1].lstrip().startswith("|"):
                j = i - 1
                while j >= 0 and not lines[j].strip():
                    j -= 1
                if j >= 0 and not lines[j].lstrip().startswith("|"):
                    keep += ["", lines[j]] if keep else [lines[j]]
                keep.append("")
            keep.append(line)
    return "\n".join(keep).strip() or "(no Markdown table in the output)"


def run(name: str, quick: bool, timeout: float) -> tuple[str, float, bool]:
    """(section body, seconds, succeeded) of one benchmark."""
    cmd = [sys.executable, *BENCHES[name][0]]
    help_text = subprocess.run([*cmd, "--help"], capture_output=True, text=True, cwd=C.ROOT, timeout=120).stdout
    args = (["--quick"] if quick and "--quick" in help_text else []) + (["--repeats", "3"] if quick and name == "reader" else [])
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([*cmd, *args], capture_output=True, text=True, cwd=C.ROOT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"_failed: timed out after {timeout:.0f} s._", time.perf_counter() - t0, False
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        return f"_failed with exit code {proc.returncode}:_\n\n```\n{tail}\n```", seconds, False
    return markdown_only(proc.stdout), seconds, True


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.speed", description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", choices=list(BENCHES), default=list(BENCHES))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per benchmark")
    C.add_docs_options(p)
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    C.check_docs_request(args, [why for bad, why in [
        (args.quick, "--quick"), (set(args.only) != set(BENCHES), f"--only {' '.join(args.only)}")] if bad])
    C.data_root()
    parts = [f"Generated {time.strftime('%Y-%m-%d %H:%M')} by `{C.command('speed', argv)}` on {C.machine()}. "
             "Other processes may share the CPU: compare rows of one table (measured side by side in one run), "
             "not absolute times across runs."]
    failed = []
    for name in args.only:
        print(f"running {name} ...", flush=True)
        body, seconds, ok = run(name, args.quick, args.timeout)
        if not ok:
            failed.append(name)
        shown = " ".join(["python", *BENCHES[name][0]])
        parts.append(f"### {BENCHES[name][1]}\n\n`{shown}`{f' ({seconds:.0f} s)' if seconds else ''}\n\n{body}")
        print(body + "\n", flush=True)
    C.write_docs(args, {"Speed": "\n\n".join(parts)}, failures=failed)
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
