"""How much of a variant's excess over Bayes is training-seed noise, and what averaging buys.

For each long-tail world (:mod:`benchmarks.worlds`, ``--score model`` scoring: the kept
checkpoint at the logged slots, no calibrator) every scorer is trained with ``--seeds`` training
seeds, the first run keeping its best three epochs. Rows per scorer, each against the reference
FM's best of :data:`benchmarks.worlds.GRID` by validation log loss:

- ``<scorer>_s<k>``: one run, training seed ``k`` (``_s0`` is the shipped run);
- ``<scorer>_ens<n>``: the mean logit of the first ``n`` seeds' kept checkpoints (``n`` times the
  training);
- ``<scorer>_ck3``: the mean logit of seed 0's best three epochs (no extra training).

The table is :func:`benchmarks.worlds.against_table`: per row, the worlds whose excess is within
``1.02×`` of the reference's and whose NDCG@10 gap to the oracle is within 0.005 of its gap::

    python -m benchmarks.averaging --worlds 10 --seed0 8900 --out results/averaging.json
    python -m benchmarks.averaging --tables results/averaging.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import common as C
from benchmarks import worlds as W
from benchmarks.common import RESULTS, sigmoid

#: scorer -> the overrides of its shipped run on a click log (the position tower, BCE)
SCORERS = {"fm": ["model=fm", "loss=bce"], "mlp": ["loss=bce"]}


def _logits(path: str, splits, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A checkpoint's :func:`benchmarks.worlds.logits_on_test`."""
    from hybridrank.models.ranker import HybridRanker

    model = HybridRanker.load_from_checkpoint(path, map_location="cpu", weights_only=True).eval()
    return W.logits_on_test(model, splits, order)


def _row(w: W.PreparedWorld, name: str, members: Sequence[tuple[np.ndarray, np.ndarray]]) -> dict[str, Any]:
    logged = np.mean([m[0] for m in members], axis=0)
    ref = np.mean([m[1] for m in members], axis=0)
    row = W.truth_figures(w, sigmoid(logged), sigmoid(ref), per_request=True)
    row.pop("req_excess")
    return {"variant": name, "members": len(members), **row}


def run_world(seed: int, work: Path, seeds: int) -> dict[str, Any]:
    """One world's rows (see the module docstring)."""
    t0 = time.perf_counter()
    w = W.prepare_world(seed, work, size="small", family="longtail")
    splits, order = W.load_test_split(w, False)
    variants = {f"{m}_s{k}": ([*ov, f"seed={k}", *(["callbacks.model_checkpoint.save_top_k=3"] if k == 0 else [])],
                              False)
                for m, ov in SCORERS.items() for k in range(seeds)}
    runs = W.train_variants(w, variants, splits=splits)
    rows = []
    for m in SCORERS:
        kept = [runs[f"{m}_s{k}"]["result"]["best_checkpoint"] for k in range(seeds)]
        single = [_logits(p, splits, order) for p in kept]
        rows += [_row(w, f"{m}_s{k}", [single[k]]) for k in range(seeds)]
        rows += [_row(w, f"{m}_ens{n}", single[:n]) for n in range(2, seeds + 1)]
        epochs = sorted(Path(kept[0]).parent.glob("epoch*.ckpt"))
        rows.append({**_row(w, f"{m}_ck{len(epochs)}", [_logits(str(p), splits, order) for p in epochs]),
                     "epochs": [p.stem for p in epochs]})
    reference = W.reference_row(w, W.GRID, per_request=True)
    reference.pop("req_excess", None)
    return {"seed": seed, "describe": w.world.spec.describe(), "rows": [*rows, reference],
            "seconds": round(time.perf_counter() - t0, 1)}


def parser() -> argparse.ArgumentParser:
    ap = C.parser("benchmarks.averaging", __doc__)
    ap.add_argument("--worlds", type=int, default=10)
    ap.add_argument("--seed0", type=int, default=8900)
    ap.add_argument("--seeds", type=int, default=3, help="training seeds per scorer (>= 2)")
    ap.add_argument("--keep", type=Path, default=None, help="keep the worlds and runs here")
    ap.add_argument("--out", type=Path, default=RESULTS / "averaging.json")
    ap.add_argument("--tables", nargs="+", type=Path, default=None, metavar="JSON",
                    help="print the table of saved --out files (merged), run nothing")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    a = parser().parse_args(argv)
    if a.tables:
        print(W.against_table([r for path in a.tables for r in json.loads(path.read_text())["results"]]))
        return 0
    if a.seeds < 2:
        raise SystemExit(f"benchmarks.averaging: --seeds must be at least 2, got {a.seeds}")
    import tempfile

    C.quiet()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(a.seed0, a.seed0 + a.worlds):
            results.append(run_world(seed, a.keep or Path(tmp), a.seeds))
            print(f"# {results[-1]['describe']} ({results[-1]['seconds']:.0f} s)", flush=True)
            C.write_json(a.out, {"results": results})
    print("\n" + W.against_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
