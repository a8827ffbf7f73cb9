"""``hybridrank-simulate``: write the built-in simulator's click log to parquet or CSV."""

from __future__ import annotations

import argparse
import sys
import time as _time
from pathlib import Path

import polars as pl

from hybridrank.atomic import atomic_path
from hybridrank.cli._app import cli_errors
from hybridrank.data.simulate import simulate_clicklog

__all__ = ["main"]


def _write(df: pl.DataFrame, out: Path) -> None:
    suffix = out.suffix.lower()
    if suffix not in (".parquet", ".csv"):
        raise ValueError(f"--out must end in .parquet or .csv, got {out}")
    with atomic_path(out) as tmp:
        if suffix == ".parquet":
            df.write_parquet(tmp)
        else:
            df.write_csv(tmp)


@cli_errors("hybridrank-simulate")
def main(argv: list[str] | None = None) -> int:
    """Console script ``hybridrank-simulate``: write a simulated click log to parquet or CSV."""
    ap = argparse.ArgumentParser(prog="hybridrank-simulate", description=main.__doc__)
    ap.add_argument("--out", type=Path, required=True, help="output file, .parquet or .csv")
    ap.add_argument("--n-users", type=int, default=2500)
    ap.add_argument("--n-items", type=int, default=1000)
    ap.add_argument("--n-categories", type=int, default=20)
    ap.add_argument("--sessions-per-user", type=float, default=3.0)
    ap.add_argument("--requests-per-session", type=float, default=3.0)
    ap.add_argument("--min-slate", type=int, default=4)
    ap.add_argument("--max-slate", type=int, default=20)
    ap.add_argument("--base-ctr", type=float, default=0.03)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.out.suffix.lower() not in (".parquet", ".csv"):  # before minutes of simulation
        raise ValueError(f"--out must end in .parquet or .csv, got {a.out}")
    t0 = _time.perf_counter()
    try:
        df = simulate_clicklog(
            n_users=a.n_users, n_items=a.n_items, n_categories=a.n_categories,
            sessions_per_user=a.sessions_per_user, requests_per_session=a.requests_per_session,
            min_slate=a.min_slate, max_slate=a.max_slate, base_ctr=a.base_ctr, seed=a.seed,
        )
    except ValueError as e:
        print(f"hybridrank-simulate: {e}", file=sys.stderr)
        return 2
    _write(df, a.out)
    n_req = df["request_id"].n_unique()
    no_click = 1.0 - df.group_by("request_id").agg(pl.col("click").max())["click"].mean()
    print(f"{df.height:,} impressions, {n_req:,} requests, "
          f"{df['session_id'].n_unique():,} sessions, {df['user_id'].n_unique():,} users; "
          f"CTR {df['click'].mean():.4f} "
          f"(mean p_true {df['p_true'].mean():.4f}); {no_click:.1%} of requests without a click; "
          f"wrote {a.out} in {_time.perf_counter() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
