"""Run the speed benchmarks and collect their Markdown tables into docs/BENCHMARKS.md ("Speed").

Each benchmark runs as its own subprocess (a fresh interpreter, so one cannot warm or slow the
next): ``bench_metrics.py``, ``bench_reader.py``, ``bench_train.py`` (``bench_losses.py`` writes its
own section, "Losses: speed and values against allRank", and is run on its own). A
script that does not exist yet is skipped with a note; one that fails is reported with the tail
of its output. The Markdown tables (and the lines right before them) are kept, other chatter
dropped. The section is stamped with the date and the machine (CPU model and count).

Usage: ``python scripts/bench_all.py [--quick] [--only reader metrics] [--write-docs]``
(``--quick`` passes ``--quick`` to the scripts that accept it and fewer repeats to the reader;
``--write-docs`` rewrites the "Speed" section, only from a complete run: every script, no
``--quick``, none failed).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import _common as C

SCRIPTS = {
    "metrics": ("bench_metrics.py", "Metrics: NDCG@10 against torchmetrics"),
    "reader": ("bench_reader.py", "Reader: read_libsvm against a line-by-line Python parser"),
    "train": ("bench_train.py", "Training throughput"),
}


def markdown_only(text: str) -> str:
    """The tables of a script's output, each with the non-empty line just before it."""
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
    script, _ = SCRIPTS[name]
    path = C.ROOT / "scripts" / script
    if not path.exists():
        return f"_skipped: `scripts/{script}` does not exist yet._", 0.0, False
    help_text = subprocess.run([sys.executable, str(path), "--help"], capture_output=True,
                               text=True, cwd=C.ROOT, timeout=120).stdout
    args = []
    if quick and "--quick" in help_text:
        args.append("--quick")
    if quick and name == "reader":
        args += ["--repeats", "3"]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True,
                              cwd=C.ROOT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"_failed: timed out after {timeout:.0f} s._", time.perf_counter() - t0, False
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        return (f"_failed with exit code {proc.returncode}:_\n\n```\n{tail}\n```", seconds, False)
    return markdown_only(proc.stdout), seconds, True


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", choices=list(SCRIPTS), default=list(SCRIPTS))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per script")
    C.add_docs_options(p)
    args = p.parse_args(argv)
    C.check_docs_request(args, [why for bad, why in [
        (args.quick, "--quick"), (set(args.only) != set(SCRIPTS), f"--only {' '.join(args.only)}")] if bad])
    C.data_root()
    parts = [f"Generated {time.strftime('%Y-%m-%d %H:%M')} by `python scripts/bench_all.py"
             f"{' --quick' if args.quick else ''}` on {C.machine()}. Other processes may share "
             "the CPU: compare rows of one table (measured side by side in one run), not "
             "absolute times across runs."]
    failed = []
    for name in args.only:
        script, title = SCRIPTS[name]
        print(f"running {script} ...", flush=True)
        body, seconds, ok = run(name, args.quick, args.timeout)
        if not ok and not body.startswith("_skipped"):
            failed.append(script)
        note = f" ({seconds:.0f} s)" if seconds else ""
        parts.append(f"### {title}\n\n`python scripts/{script}`{note}\n\n{body}")
        print(body + "\n", flush=True)
    text = "\n\n".join(parts)
    C.write_docs(args, {"Speed": text}, failures=failed)
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
