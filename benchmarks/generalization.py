"""Defaults judged on many randomly built click logs ("worlds"), not on one simulator.

The command line of the world harness (:mod:`benchmarks.worlds`, where the figures are defined)::

    python -m benchmarks.generalization --worlds 24 --seed0 1000 [--variants default,tower,...]
        [--size small] [--family longtail] [--explore-shares 0,0.01,0.05,0.1] [--pin FIELD=VALUE ...]
    python -m benchmarks.generalization --tables results/generalization.json [more.json ...]

Prints each world's table as it is done and the aggregate at the end; the results go to
``results/generalization.json`` (``--out``); ``--tables`` prints the tables of saved results.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.common import RESULTS, parse_pin


def _variants(text: str) -> list[str]:
    from benchmarks.worlds import VARIANTS

    names = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown variants {unknown}; known: {sorted(VARIANTS)}")
    return names


def parser() -> argparse.ArgumentParser:
    from hybridrank.data.worlds import FAMILIES

    ap = argparse.ArgumentParser(prog="python -m benchmarks.generalization", description=__doc__.split("\n\n")[0])
    ap.add_argument("--worlds", type=int, default=24)
    ap.add_argument("--seed0", type=int, default=1000)
    ap.add_argument("--size", default="small", choices=("tiny", "small"))
    ap.add_argument("--family", default="base", choices=FAMILIES,
                    help="world family: base, or longtail (heavy-tailed user activity, users unseen before "
                         "the test period, dense item side features, user x item latent interactions)")
    ap.add_argument("--variants", type=_variants, default="default,tower,fm,fm_tower")
    ap.add_argument("--no-reference", action="store_true", help="skip the reference FM")
    ap.add_argument("--out", type=Path, default=RESULTS / "generalization.json")
    ap.add_argument("--keep", type=Path, default=None, help="keep the worlds and runs here")
    ap.add_argument("--extra", nargs="*", default=[], help="hydra overrides for every run")
    ap.add_argument("--pin", nargs="*", default=[], metavar="FIELD=VALUE",
                    help="pin world fields (draw_world keywords), e.g. logging=random")
    ap.add_argument("--explore-shares", default=None,
                    help="confounded-logging family: worlds sorted by a noisy relevance estimate, each with "
                         "the next of these exploration shares (e.g. 0,0.01,0.05,0.1), marked in a column")
    ap.add_argument("--tables", nargs="+", type=Path, default=None, metavar="JSON",
                    help="print the world and aggregate tables of saved --out files (merged), run nothing")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    from benchmarks.worlds import aggregate, run_family, world_table

    a = parser().parse_args(argv)
    if a.tables:
        results = [r for path in a.tables for r in json.loads(path.read_text())["results"]]
        print(world_table(results) + "\n\n## Aggregate\n\n" + aggregate(results))
        return 0
    t_all = time.perf_counter()

    def progress(result: dict) -> None:
        print(f"# {result['describe']} ({result['seconds']['total']:.0f} s)", flush=True)
        print(world_table([result]), flush=True)

    results = run_family(a.family, range(a.seed0, a.seed0 + a.worlds), a.variants, size=a.size,
                         pins=dict(parse_pin(x) for x in a.pin), extra=a.extra, reference=not a.no_reference,
                         explore_shares=[float(x) for x in a.explore_shares.split(",")] if a.explore_shares else None,
                         work=a.keep, progress=progress)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"results": results, "variants": a.variants,
                                 "seconds": time.perf_counter() - t_all}, indent=1, default=str))
    print("\n## Aggregate\n\n" + aggregate(results))
    print(f"\n{len(results)} worlds in {(time.perf_counter() - t_all) / 60:.1f} min; {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
