"""Does pooling help? Session-scope pseudo-pairs vs request-scope lists at equal training budget.

Trains the same model, loss, epochs and batch budget on the simulated click log with the ranking
term's lists formed per request (LETOR style) or per session (pseudo-pairs across the requests of
a session, docs/CONVENTIONS.md §1.2); evaluation always ranks within requests. Several training seeds;
prints mean ± std of test NDCG@10, GAUC, log loss, ECE and PCOC, and writes JSON.

Usage: python scripts/bench_pooling.py [--seeds 0 1 2] [--losses bce_softmax bce_ranknet] [--out results/pooling.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import _common as C

METRICS = ("ndcg@10", "gauc", "logloss", "ece", "pcoc")


def run(loss: str, scope: str, seed: int, epochs: int, users: int) -> dict:
    result = C.train_hybrid([f"loss={loss}", f"data.scope={scope}", f"seed={seed}",
                             f"trainer.max_epochs={epochs}", f"data.source.n_users={users}"]).result
    return {m: result["test"][f"test/{m}"] for m in METRICS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--losses", nargs="+", default=["bce_softmax", "bce_ranknet"])
    ap.add_argument("--scopes", nargs="+", default=["request", "session"])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--users", type=int, default=2500)
    ap.add_argument("--out", default="results/pooling.json")
    a = ap.parse_args()
    results = {}
    for loss in a.losses:
        for scope in a.scopes:
            runs = [run(loss, scope, s, a.epochs, a.users) for s in a.seeds]
            results[f"{loss}/{scope}"] = runs
            print(f"done {loss}/{scope}", flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(results, indent=2))
    print(f"\nsimulated log, {a.users} users, {a.epochs} epochs, seeds {a.seeds}: test metrics "
          "(mean ± std over seeds; ranking within requests)\n")
    print("| loss | ranking-term scope | " + " | ".join(METRICS) + " |")
    print("|---|---|" + "---:|" * len(METRICS))
    for key, runs in results.items():
        loss, scope = key.split("/")
        cells = []
        for m in METRICS:
            v = [r[m] for r in runs]
            sd = statistics.stdev(v) if len(v) > 1 else 0.0
            cells.append(f"{statistics.mean(v):.4f} ± {sd:.4f}")
        print(f"| {loss} | {scope} | " + " | ".join(cells) + " |")
    print(f"\nJSON: {a.out}")


if __name__ == "__main__":
    main()
