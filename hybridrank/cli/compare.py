"""``hybridrank-compare``: are two (or more) score files different, beyond the noise?

::

    hybridrank-compare run_a/scores.parquet run_b/scores.parquet [--score-column pctr] [--n-boot 1000]

Every file must score the same requests with the same labels (exports of one split by two runs);
each gets ranking and calibration metrics with percentile bootstrap intervals over requests, and
every file after the first a paired comparison with the first on the same resamples (the request
noise common to both cancels): the difference, its interval and a two-sided p-value. The number
of requests and positive labels is printed: a difference of 0.002 NDCG on 150 requests is noise.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import polars as pl

from hybridrank.cli._app import add_deprecated_alias, cli_errors
from hybridrank.metrics.request_stats import frame_stats
from hybridrank.metrics.uncertainty import compare_bootstrap, format_interval
from hybridrank.serving.export import read_score_table, require_columns

__all__ = ["compare_scores", "main"]

METRICS = ("ndcg@10", "gauc", "map", "logloss", "ece", "pcoc")


def compare_scores(frames: Mapping[str, pl.DataFrame], *, score: str = "pctr",
                   label: str = "label", request: str = "request_id",
                   metrics: Sequence[str] = METRICS, n_boot: int = 1000, alpha: float = 0.05,
                   seed: int = 0, empty: str = "skip") -> str:
    """A Markdown report: each frame's metrics with intervals, and paired tests vs the first.

    Args:
        frames: name -> score frame (request id, label, score columns; the same requests and
            labels in every frame, rows sorted by request).
        score: the probability column (``pctr``); it is also the ranking score.
        metrics: which to report; n_boot, alpha, seed: the bootstrap; empty: NDCG's policy for
            requests without a positive label.
    """
    require_columns(frames, (request, label, score))
    names = list(frames)
    first = frames[names[0]]
    for name, f in frames.items():
        if f.height != first.height:
            raise ValueError(f"{name}: {f.height} rows vs {first.height} in {names[0]}; the files "
                             "must score the same impressions")
        for col in (request, label):
            diff = np.flatnonzero(f[col].to_numpy() != first[col].to_numpy())
            if diff.size:
                i = int(diff[0])
                raise ValueError(f"{name}: column {col!r} differs from {names[0]} at {diff.size} "
                                 f"row(s), first row {i + 1}: {f[col][i]!r} vs {first[col][i]!r}")
    stats = {n: frame_stats(frames[n], score=score, label=label, request=request, empty=empty)
             for n in names}
    have = [m for m in metrics if m in stats[names[0]].metrics]
    ivs, paired = compare_bootstrap(stats, n_boot=n_boot, alpha=alpha, seed=seed, metrics=have)
    s0 = stats[names[0]]
    lines = [f"{s0.n_requests:,} requests, {first.height:,} impressions, {s0.n_positives:,} positive "
             f"labels; {100 * (1 - alpha):g} % percentile bootstrap intervals over requests "
             f"({n_boot} resamples, seed {seed}).", "",
             "| scores | " + " | ".join(have) + " |", "|---" * (len(have) + 1) + "|"]
    for n in names:
        lines.append(f"| {n} | " + " | ".join(format_interval(ivs[n][m], 4) for m in have) + " |")
    if len(names) > 1:
        lines += ["", f"Paired with `{names[0]}` (difference = row - `{names[0]}`, same resamples):",
                  "", "| scores | " + " | ".join(have) + " |", "|---" * (len(have) + 1) + "|"]
        for n in names[1:]:
            cells = []
            for m in have:
                d = paired[n][m]
                cells.append(d.verdict if d.p_value is None else
                             f"{d.diff:+.4g} [{d.lower:+.4g}, {d.upper:+.4g}], p = {d.p_value:.3g}"
                             + (" *" if d.p_value < alpha else ""))
            lines.append(f"| {n} | " + " | ".join(cells) + " |")
        lines += ["", f"`*`: significant at {100 * alpha:g} % (two-sided paired bootstrap)."]
    return "\n".join(lines)


@cli_errors("hybridrank-compare")
def main(argv: list[str] | None = None) -> int:
    """Console script ``hybridrank-compare``."""
    ap = argparse.ArgumentParser(prog="hybridrank-compare", description=__doc__.splitlines()[0])
    ap.add_argument("scores", nargs="+", type=Path, help="score files (.parquet / .csv), same rows")
    ap.add_argument("--score-column", default="pctr",
                    help="probability column (also the ranking score)")
    ap.add_argument("--label-column", default="label")
    ap.add_argument("--request-column", default="request_id")
    # the names before hybridrank-auction and -compare agreed on --*-column
    for old in ("score", "label", "request"):
        add_deprecated_alias(ap, f"--{old}", f"--{old}-column")
    ap.add_argument("--empty", default="skip", choices=("skip", "zero", "one"))
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    try:
        names = [str(p) for p in a.scores]
        if len(set(names)) != len(names):
            raise ValueError("the same file is given twice")
        frames = {n: read_score_table(p) for n, p in zip(names, a.scores)}
        print(compare_scores(frames, score=a.score_column, label=a.label_column,
                             request=a.request_column, n_boot=a.n_boot, alpha=a.alpha, seed=a.seed,
                             empty=a.empty))
    except (ValueError, FileNotFoundError) as e:
        print(f"hybridrank-compare: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
