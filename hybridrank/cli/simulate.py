"""``hybridrank-simulate``: write the built-in simulator's click log to parquet or CSV.

The log is drawn and written in blocks of ``--chunk-users`` users
(:func:`hybridrank.data.simulators.writer.write_clicklog`), so memory holds one block whatever
``--n-users`` is; a log of at most ``--chunk-users`` users is ``simulate_clicklog``'s, bit for bit.
"""

from __future__ import annotations

import argparse
import sys
import time as _time
from pathlib import Path

from hybridrank.cli._app import cli_errors
from hybridrank.data.simulators.clicklog import CHUNK_USERS
from hybridrank.data.simulators.writer import output_kind, write_clicklog

__all__ = ["main"]


@cli_errors("hybridrank-simulate")
def main(argv: list[str] | None = None) -> int:
    """Console script ``hybridrank-simulate``: write a simulated click log to parquet or CSV."""
    ap = argparse.ArgumentParser(prog="hybridrank-simulate", description=main.__doc__)
    ap.add_argument("--out", type=Path, required=True,
                    help="output: a .parquet or .csv file, or a folder (no suffix) that gets one "
                         "parquet file per block of users")
    ap.add_argument("--n-users", type=int, default=2500)
    ap.add_argument("--n-items", type=int, default=1000)
    ap.add_argument("--n-categories", type=int, default=20)
    ap.add_argument("--sessions-per-user", type=float, default=3.0)
    ap.add_argument("--requests-per-session", type=float, default=3.0)
    ap.add_argument("--min-slate", type=int, default=4)
    ap.add_argument("--max-slate", type=int, default=20)
    ap.add_argument("--base-ctr", type=float, default=0.03)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chunk-users", type=int, default=CHUNK_USERS,
                    help="users drawn and written at a time (memory); a log of at most this many "
                         "users is the same whatever the value")
    a = ap.parse_args(argv)
    output_kind(a.out)  # a bad suffix fails before minutes of simulation
    t0 = _time.perf_counter()
    try:
        s = write_clicklog(
            a.out, chunk_users=a.chunk_users,
            n_users=a.n_users, n_items=a.n_items, n_categories=a.n_categories,
            sessions_per_user=a.sessions_per_user, requests_per_session=a.requests_per_session,
            min_slate=a.min_slate, max_slate=a.max_slate, base_ctr=a.base_ctr, seed=a.seed,
        )
    except ValueError as e:
        print(f"hybridrank-simulate: {e}", file=sys.stderr)
        return 2
    files = f" ({s.files} files)" if s.files > 1 else ""
    print(f"{s.rows:,} impressions, {s.requests:,} requests, {s.sessions:,} sessions, "
          f"{s.users:,} users; CTR {s.ctr:.4f} (mean p_true {s.mean_p_true:.4f}); "
          f"{s.no_click_share:.1%} of requests without a click; "
          f"wrote {a.out}{files} in {_time.perf_counter() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
