"""``hybridrank-compare``: are two (or more) score files different, beyond the noise?

::

    hybridrank-compare run_a/scores.parquet run_b/scores.parquet [--score-column pctr] [--n-boot 1000]

Every file must score the same requests with the same labels (exports of one split by two runs);
each gets ranking and calibration metrics with percentile bootstrap intervals over requests, and
every file after the first a paired comparison with the first on the same resamples (the request
noise common to both cancels): the difference, its interval and a two-sided p-value. The number
of requests and positive labels is printed: a difference of 0.002 NDCG on 150 requests is noise.
The figures and the report's text are :mod:`hybridrank.evaluation`'s (``compare_figures``,
``compare_scores``); this module reads the files and prints.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hybridrank.cli._app import cli_errors
from hybridrank.evaluation.tables import compare_scores
from hybridrank.serving.export import read_score_table

__all__ = ["main"]


@cli_errors("hybridrank-compare")
def main(argv: list[str] | None = None) -> int:
    """Console script ``hybridrank-compare``."""
    ap = argparse.ArgumentParser(prog="hybridrank-compare", description=__doc__.splitlines()[0])
    ap.add_argument("scores", nargs="+", type=Path, help="score files (.parquet / .csv), same rows")
    ap.add_argument("--score-column", default="pctr",
                    help="probability column (also the ranking score)")
    ap.add_argument("--label-column", default="label")
    ap.add_argument("--request-column", default="request_id")
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
