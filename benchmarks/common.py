"""The protocol pieces the benchmarks share, each written once.

- the shared data folder and MQ2008's five folds (:func:`mq2008_fold`, :func:`fold_overrides`);
- the metric conventions of the tables (:data:`BASE_METRICS`) and scoring flat logits under them
  (:func:`evaluate`, :func:`split_stats`: the package's own metric code, so every row of a table,
  LightGBM's included, is scored by one code path);
- figures against a known truth: :func:`xent` (the clipped log loss), :func:`per_request_se`;
- formatting, JSON results, and rewriting marked sections of docs/BENCHMARKS.md only when asked
  (``--write-docs``) and only after a complete run.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import re
import statistics
import sys
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "BENCHMARKS.md"
RESULTS = ROOT / "results"
#: probabilities are clipped to [EPS, 1 - EPS] in a log loss
EPS = 1e-7
#: the metric conventions of the LETOR tables (docs/CONVENTIONS.md §4, §5)
BASE_METRICS = dict(ks=(1, 3, 5, 10), gain="exp", ties="average", bins=15, binning="quantile")


def data_root() -> Path:
    """The shared data folder: ``$HYBRIDRANK_REAL_DATA``, else ``../shared/data`` next to the repo."""
    env = os.environ.get("HYBRIDRANK_REAL_DATA")
    root = Path(env) if env else ROOT.parent / "shared" / "data"
    if not (root / "letor" / "MQ2008").is_dir():
        raise SystemExit(f"MQ2008 not found under {root}/letor/MQ2008; set HYBRIDRANK_REAL_DATA "
                         "to the shared data folder")
    os.environ["HYBRIDRANK_REAL_DATA"] = str(root)  # the hydra data configs read it too
    return root


def mq2008_fold(k: int) -> tuple[list[str], str, str]:
    """Fold ``k`` (1..5) of MQ2008 as (train parts, val part, test part): the three parts after
    k - 1 (cyclically), the next one, the last. Fold1 = (S1, S2, S3 | S4 | S5), Fold2 = (S2, S3, S4
    | S5 | S1), ..."""
    if not 1 <= k <= 5:
        raise ValueError(f"MQ2008 has folds 1..5, got {k}")
    parts = [str(data_root() / "letor" / "MQ2008" / f"S{(k - 1 + i) % 5 + 1}.txt") for i in range(5)]
    return parts[:3], parts[3], parts[4]


def fold_overrides(k: int) -> list[str]:
    """Hydra overrides that point ``data=letor_mq2008`` at fold ``k``'s parts."""
    train, val, test = mq2008_fold(k)
    return ["data=letor_mq2008", f"data.source.train=[{','.join(train)}]", f"data.source.val={val}",
            f"data.source.test={test}"]


def parse_folds(text: str) -> list[int]:
    """``"1-5"``, ``"1,3"``, ``"2"`` -> a sorted list of fold numbers."""
    out: set[int] = set()
    for piece in filter(None, (p.strip() for p in text.split(","))):
        a, _, b = piece.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    if not out or any(not 1 <= f <= 5 for f in out):
        raise SystemExit(f"--folds: folds are 1..5, got {text!r}")
    return sorted(out)


def parse_pin(text: str) -> tuple[str, Any]:
    """``FIELD=VALUE`` of a world pin: the value as an int, a float, a bool or the string
    (anything without ``=`` is an error: argparse's ``type`` for ``--pin``)."""
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise ValueError(f"a pin is FIELD=VALUE, got {text!r}")
    for cast in (int, float):
        try:
            return key, cast(value)
        except ValueError:
            pass
    return key, {"true": True, "false": False}.get(value.lower(), value)


def parser(module: str, doc: str) -> argparse.ArgumentParser:
    """The argument parser of ``python -m <module>``, described by its docstring's first line."""
    return argparse.ArgumentParser(prog=f"python -m {module}", description=doc.splitlines()[0])


def write_json(path: str | Path, obj: Any, default: Any = str) -> None:
    """``obj`` as JSON at ``path`` (folders made)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1, default=default))


def evaluate(data, logits: torch.Tensor, empties: Iterable[str] = ("skip", "zero")) -> dict[str, dict[str, float]]:
    """``{empty: metrics}`` of flat ``[N]`` logits on a split, one entry per empty-list policy."""
    from hybridrank.evaluation.figures import evaluate_logits

    return {e: evaluate_logits(data, logits, empty=e, **BASE_METRICS) for e in empties}


def split_stats(data, logits: torch.Tensor, *, ks: Sequence[int] = (10,), empty: str = "skip"):
    """Per-request statistics of flat ``[N]`` logits (for intervals over requests), with the
    conventions of :func:`evaluate`."""
    from hybridrank.metrics.request_stats import split_stats as engine_stats

    return engine_stats(data, logits.double(), **{**BASE_METRICS, "ks": tuple(ks), "empty": empty})


def xent(q: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Per-impression log loss of probabilities ``q`` against outcomes (or true probabilities)
    ``p``: ``-(p log q + (1 - p) log(1 - q))``, ``q`` clipped to ``[EPS, 1 - EPS]``."""
    q = np.clip(q, EPS, 1 - EPS)
    return -(p * np.log(q) + (1 - p) * np.log1p(-q))


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-12, 1 - 1e-12)
    return np.log(p / (1 - p))


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def per_request_se(values: np.ndarray, offsets: np.ndarray) -> float:
    """Standard error of a mean over impressions with requests independent: ``sd(S_r) sqrt(R) / N``,
    ``S_r`` the sum of ``values[offsets[r]:offsets[r + 1]]``; NaN with fewer than two requests."""
    sums = np.add.reduceat(values, offsets[:-1]) if values.size else np.zeros(0)
    return float(np.std(sums, ddof=1) * math.sqrt(sums.size) / values.size) if sums.size >= 2 else math.nan


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value); NaNs are ignored."""
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return math.nan, math.nan
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)


def fmt_ms(values: Sequence[float], digits: int = 3) -> str:
    m, s = mean_std(values)
    if math.isnan(m):
        return "n/a"
    return f"{m:.{digits}f} ± {s:.{digits}f}" if len(values) > 1 else f"{m:.{digits}f}"


def summarize(per_fold: Mapping[Any, Mapping[str, float]], keys: Sequence[str]) -> dict:
    """``{key: {"mean", "std", "folds"}}`` over folds."""
    out = {}
    for k in keys:
        vals = [float(m[k]) for m in per_fold.values() if k in m]
        mu, sd = mean_std(vals)
        out[k] = {"mean": mu, "std": sd, "folds": vals}
    return out


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def machine() -> str:
    """One line naming the machine: CPU model, core count, torch threads, Python."""
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), cpu)
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} CPU(s) visible, torch {torch.__version__} with "
            f"{torch.get_num_threads()} thread(s), Python {platform.python_version()}")


def quiet() -> None:
    """Silence Lightning's per-run chatter (the benchmarks print their own progress)."""
    import pytorch_lightning  # noqa: F401  (it sets its loggers' levels on import: import first)

    for name in ("pytorch_lightning", "lightning", "lightning.pytorch", "lightning_fabric", "hybridrank"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")


def command(module: str, argv: Sequence[str] | None) -> str:
    """The command line that ran, ``python -m benchmarks.<module> <args>``, for a docs stamp."""
    return f"python -m benchmarks.{module} {' '.join(sys.argv[1:] if argv is None else argv)}".strip()


def add_docs_options(parser: argparse.ArgumentParser) -> None:
    """``--write-docs``: rewrite this benchmark's section(s) of docs/BENCHMARKS.md after a complete run."""
    parser.add_argument("--write-docs", action="store_true",
                        help="rewrite this benchmark's section(s) of docs/BENCHMARKS.md; only a complete run "
                             "(the default settings, no --quick) may")


def check_docs_request(args, incomplete: Sequence[str]) -> None:
    """Before any work: ``--write-docs`` with settings that cannot make the full tables is an error
    naming them (``incomplete``: the settings that differ from a complete run)."""
    if getattr(args, "write_docs", False) and incomplete:
        raise SystemExit(f"--write-docs: a partial run does not replace the published tables "
                         f"({'; '.join(incomplete)}); drop --write-docs, or run the complete benchmark")


def write_docs(args, sections: Mapping[str, str], *, failures: Sequence[str] = ()) -> None:
    """Rewrite the ``sections`` of docs/BENCHMARKS.md when ``--write-docs`` was given and no row
    failed; otherwise say that the docs were left as they are."""
    if not getattr(args, "write_docs", False):
        print("docs/BENCHMARKS.md not touched (--write-docs rewrites it after a complete run)")
        return
    if failures:
        raise SystemExit(f"--write-docs: not written, {len(failures)} row(s) failed: {', '.join(failures)}")
    for name, body in sections.items():
        write_section(name, body, path=DOCS)
    print(f"updated {DOCS}")


def write_section(name: str, body: str, path: Path = DOCS) -> None:
    """Replace the text between ``<!-- BEGIN name -->`` and ``<!-- END name -->`` in ``path`` (a
    missing section is appended under a ``## name`` heading); the prose around it is left as it is."""
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    block = f"{begin}\n{body.strip()}\n{end}"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + f"\n\n## {name}\n\n{block}\n"
    path.write_text(text)
