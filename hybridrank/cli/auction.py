"""``hybridrank-auction``: replay score files as ad auctions and print a Markdown table with CIs.

::

    hybridrank-auction calibrated.parquet miscaled.parquet --slots 3 --slot-factors log2 \\
        --mechanism gsp --reserve-ecpm 0.01 [--true-column p_true | --truth log.parquet]

Every file must hold the same requests in the same row order with the same bids (score files of
one split); each gets a row (clicks, revenue, welfare per 1000 requests, welfare and revenue as %
of the oracle, slots filled) with percentile bootstrap intervals over requests, and every file
after the first a paired comparison with the first (same resamples). See ``docs/AUCTION.md``.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import polars as pl

from hybridrank.cli._app import cli_errors
from hybridrank.metrics.request_stats import request_offsets
from hybridrank.metrics.uncertainty import compare_bootstrap, format_interval
from hybridrank.serving.auction import MECHANISMS, auction_stats, position_factors, replay_auctions
from hybridrank.serving.export import read_score_table, require_columns

__all__ = ["compare_auctions", "main"]


def _slot_factors(spec: str, slots: int) -> np.ndarray:
    if spec in ("log2", "none") or spec.startswith("power:"):
        return position_factors(slots, spec)
    try:
        return np.array([float(v) for v in spec.split(",")])
    except ValueError:
        raise ValueError(f"--slot-factors must be 'log2', 'none', 'power:A' or comma-separated numbers, "
                         f"got {spec!r}") from None


def _same(name: str, ref_name: str, a: np.ndarray, b: np.ndarray, what: str) -> None:
    diff = np.flatnonzero(a != b)
    if diff.size:
        i = int(diff[0])
        raise ValueError(f"{name}: {what} differ from {ref_name} at {diff.size} row(s), first row {i}: "
                         f"{b[i]!r} vs {a[i]!r}; files must score the same impressions in the same order")


def compare_auctions(frames: Mapping[str, pl.DataFrame], *, truth: np.ndarray | None = None,
                     score: str = "pctr", bid: str = "bid", request: str = "request_id",
                     true_column: str | None = "p_true", slots: int = 3, slot_factors=None,
                     mechanism: str = "gsp", reserve: float = 0.0, reserve_ecpm: float = 0.0,
                     per: float = 1000.0, n_boot: int = 1000, alpha: float = 0.05, seed: int = 0) -> str:
    """Replay every frame's scores as auctions on the same requests; a Markdown report.

    Args:
        frames: name -> frame with ``request``, ``bid``, ``score`` columns (same rows in all).
        truth: ``[N]`` true pCTR; default: the ``true_column`` of the frames that have it (equal
            across them). Without any, the numbers are the models' own estimates (said loudly).
        slots, slot_factors, mechanism, reserve, reserve_ecpm: :func:`hybridrank.serving.auction.replay_auctions`.
        per: requests the per-request means are scaled to. n_boot, alpha, seed: the bootstrap.

    Returns:
        the report (settings line, table, paired comparisons with the first frame).
    """
    require_columns(frames, (request, bid, score))
    names = list(frames)
    first = frames[names[0]]
    request_offsets(first[request])  # rows sorted by request, before comparing files
    ids0, bid0 = first[request].to_numpy(), first[bid].to_numpy()
    for name in names[1:]:
        f = frames[name]
        if f.height != first.height:
            raise ValueError(f"{name}: {f.height} rows vs {first.height} in {names[0]}")
        _same(name, names[0], ids0, f[request].to_numpy(), "request ids")
        _same(name, names[0], bid0, f[bid].to_numpy(), "bids")
    source = "the given truth"
    if truth is None and true_column is not None:
        have = [n for n in names if true_column in frames[n].columns]
        if have:
            truth = frames[have[0]][true_column].to_numpy()
            for n in have[1:]:
                _same(n, have[0], truth, frames[n][true_column].to_numpy(), f"{true_column!r} values")
            source = f"column `{true_column}`"
    if truth is not None and len(truth) != first.height:
        raise ValueError(f"the truth has {len(truth)} rows, the score files {first.height}")
    opts = dict(slots=slots, slot_factors=slot_factors, mechanism=mechanism, reserve=reserve,
                reserve_ecpm=reserve_ecpm)
    results = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # said in the report instead
        for n in names:
            results[n] = replay_auctions(frames[n][bid], frames[n][score], request_ids=frames[n][request],
                                         true_pctr=truth, **opts)
    r0 = results[names[0]]
    stats = {n: auction_stats(r, per=per) for n, r in results.items()}
    oracle_name = "oracle (true pCTR)"
    if truth is not None:
        stats = {oracle_name: auction_stats(r0, which="oracle", per=per), **stats}
    keys = ["clicks", "revenue", "welfare"]
    if truth is not None:
        keys += ["welfare_share", "revenue_share"] + (["total_welfare_share"] if reserve_ecpm > 0 else [])
    welfare = "total_welfare" if reserve_ecpm > 0 else "welfare"
    intervals, paired = compare_bootstrap(stats, baseline=names[0], metrics=[*keys, welfare, "filled"],
                                          n_boot=n_boot, alpha=alpha, seed=seed)
    level = f"{100 * (1 - alpha):g} %"
    fac = ", ".join(f"{v:.3g}" for v in r0.slot_factors)
    lines = [f"Auction replay: {mechanism}, {slots} slot(s), slot factors [{fac}], reserve {reserve:g} per "
             f"click, eCPM reserve {reserve_ecpm:g}; {r0.n_requests:,} requests, "
             f"{first.height:,} candidates.", ""]
    if truth is None:
        lines += ["**WARNING: no true pCTR. Clicks, revenue and welfare below are each model's own "
                  "estimate of itself, not comparable across models; there is no oracle.**", ""]
    else:
        lines += [f"Expected clicks from the true pCTR ({source}). {level} percentile bootstrap "
                  f"intervals over requests ({n_boot} resamples, seed {seed}).", ""]
    if reserve_ecpm > 0:
        lines += ["Welfare counts the ads only; *incl. outside* adds the eCPM reserve's value for every "
                  "empty slot (reserve_ecpm × slot factor): the quantity the oracle maximises.", ""]
    per_s = f"{per:g} req"
    titles = {"clicks": f"clicks / {per_s}", "revenue": f"revenue / {per_s}",
              "welfare": f"welfare / {per_s}", "welfare_share": "welfare % of oracle",
              "revenue_share": "revenue % of oracle", "total_welfare_share": "welfare incl. outside % of oracle"}
    head = ["scores", *(titles[k] for k in keys), "slots filled / req"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, iv in intervals.items():
        cells = [format_interval(iv[k], None, scale=100.0 if k.endswith("share") else 1.0) for k in keys]
        lines.append("| " + " | ".join([name, *cells, f"{iv['filled'].estimate / per:.2f}"]) + " |")
    others = names[1:]
    if others:
        wt = "welfare incl. outside" if reserve_ecpm > 0 else "welfare"
        lines += ["", f"Paired with `{names[0]}` on the same resamples (difference = row - `{names[0]}`):", "",
                  f"| scores | Δ {wt} / {per_s} | p | Δ revenue / {per_s} | p |", "|---|---|---|---|---|"]
        for n in others:
            cells = []
            for k in (welfare, "revenue"):
                d = paired[n][k]
                if d.p_value is None:
                    cells += [d.verdict, "—"]
                    continue
                cells += [f"{d.diff:+.4g} [{d.lower:+.4g}, {d.upper:+.4g}]",
                          f"{d.p_value:.3g} ({d.verdict})"]
            lines.append("| " + " | ".join([n, *cells]) + " |")
    return "\n".join(lines)


@cli_errors("hybridrank-auction")
def main(argv: list[str] | None = None) -> int:
    """Console script ``hybridrank-auction``: auction replay of score files, Markdown to stdout."""
    ap = argparse.ArgumentParser(prog="hybridrank-auction", description=main.__doc__)
    ap.add_argument("scores", nargs="+", type=Path, help="score files (.parquet / .csv), same rows")
    ap.add_argument("--slots", type=int, default=3)
    ap.add_argument("--mechanism", choices=MECHANISMS, default="gsp")
    ap.add_argument("--reserve", type=float, default=0.0, help="floor price per click (bid units)")
    ap.add_argument("--reserve-ecpm", type=float, default=0.0, help="floor on bid x pCTR")
    ap.add_argument("--slot-factors", default="none",
                    help="'none' (all 1), 'log2' (1/log2(1+j)), 'power:A' (j^-A) or numbers 'a,b,c'")
    ap.add_argument("--score-column", default="pctr")
    ap.add_argument("--bid-column", default="bid")
    ap.add_argument("--request-column", default="request_id")
    ap.add_argument("--true-column", default="p_true", help="true pCTR column, used where present")
    ap.add_argument("--truth", type=Path, help="a file with the true column, same rows as the scores")
    ap.add_argument("--per", type=float, default=1000.0, help="report per this many requests")
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    try:
        frames, seen = {}, set()
        for path in a.scores:
            name = path.stem if path.stem not in seen else str(path)
            seen.add(path.stem)
            frames[name] = read_score_table(path)
        truth = None
        if a.truth is not None:
            tf = read_score_table(a.truth)
            if a.true_column not in tf.columns:
                raise ValueError(f"{a.truth}: no column {a.true_column!r}")
            first = next(iter(frames.values()))
            if a.request_column in tf.columns and a.request_column in first.columns:
                if tf.height == first.height:
                    _same(str(a.truth), a.scores[0].name, first[a.request_column].to_numpy(),
                          tf[a.request_column].to_numpy(), "request ids")
            truth = tf[a.true_column].to_numpy()
        report = compare_auctions(
            frames, truth=truth, score=a.score_column, bid=a.bid_column, request=a.request_column,
            true_column=a.true_column, slots=a.slots, slot_factors=_slot_factors(a.slot_factors, a.slots),
            mechanism=a.mechanism, reserve=a.reserve, reserve_ecpm=a.reserve_ecpm, per=a.per,
            n_boot=a.n_boot, alpha=a.alpha, seed=a.seed)
    except (ValueError, OSError, pl.exceptions.PolarsError) as e:
        print(f"hybridrank-auction: {e}", file=sys.stderr)
        return 2
    if "WARNING: no true pCTR" in report:
        print("hybridrank-auction: no true pCTR column; the numbers are the models' own estimates",
              file=sys.stderr)
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
