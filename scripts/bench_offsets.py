"""What the clicks allow: the position tower's estimator given the TRUE relevance, beside the floor.

``scripts/bench_generalization.py`` measures the whole pipeline (a model learns the relevance, the
tower estimates the offsets from it). When PCOC at the reference slot or an offset misses there,
three things can be at fault: the relevance model, the offsets' estimator, or the clicks
themselves. This script takes the relevance model out: on random-order worlds
(:mod:`hybridrank.data.worlds`, split as ``conf/data/clicklog.yaml`` splits) it hands
:class:`~hybridrank.models.position.PositionBias` the true position-free click logits of the
training rows and alternates its exact per-slot update with the intercept step, as training does,
until the offsets stop moving. It prints per world, for the test rows:

- ``floor``: PCOC at the reference slot of the truth itself, its level fitted to the training
  clicks (``sum sigmoid(true logit + c) = clicks``): the click sampling noise that no estimator
  of a level from these clicks escapes (1 with infinitely many clicks). A world whose floor lies
  outside [0.95, 1.05] meets that target only by luck;
- for the shipped estimator (``pool`` and ``monotone``, the defaults) and with each switched off:
  PCOC at the reference slot and the largest error of the offsets of slots 2-10 (logit).

Aggregates: worlds with PCOC in [0.95, 1.05], offsets within 0.1 and 0.2, and the root mean square
of log PCOC. Usage::

    python scripts/bench_offsets.py --worlds 10 --seed0 1120
    python scripts/bench_offsets.py --worlds 10 --seed0 1110 --impressions 400000
    python scripts/bench_offsets.py --worlds 8 --seed0 2120 --impressions 400000 --explore-shares 0.05,0.1

With ``--explore-shares`` the logs are sorted by a noisy relevance estimate with that share of
marked exploration requests: the marked rows then show what the exploration traffic alone gives
(the unmarked rows, handed the TRUE relevance, are not confounded as a model's would be).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hybridrank.data.readers import ColumnMap
from hybridrank.data.sources import split_frame
from hybridrank.data.worlds import draw_world, simulate_world
from hybridrank.models.position import PositionBias

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generalization import SPLIT, _logit, _pin, level_shift  # noqa: E402  (the CLI runs' split)

#: name -> (PositionBias switches, exploration marked?). Unmarked, the tower fits the offsets
#: on every impression and the level on the reference slot's pooled click logit; marked, the
#: offsets on the exploration requests (every request of a random-order log) and the level on
#: every click given the offsets: the two modes a random-order log meets, by whether its
#: exploration column is mapped
ESTIMATORS: dict[str, tuple[dict[str, bool], bool]] = {
    "shipped": ({}, False),
    "no_pool": ({"pool": False}, False),
    "no_monotone": ({"monotone": False}, False),
    "per_slot": ({"pool": False, "monotone": False}, False),
    "shipped_marked": ({}, True),
    "no_pool_marked": ({"pool": False}, True),
}


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def fit_offsets(position: np.ndarray, relevance: np.ndarray, click: np.ndarray, request: np.ndarray,
                max_iter: int = 60, tol: float = 1e-5, explore: np.ndarray | None = None,
                n_boot: int = 0, **switches: bool) -> tuple[np.ndarray, float, dict | None]:
    """The tower's offsets and the intercept shift at their fixed point, given ``relevance``
    (position-free logits of each row): each round accumulates every row once (one "epoch")
    and takes :meth:`PositionBias.update`, whose reference step moves the intercept.
    ``explore``: 0/1 per row, the requests marked as exploration (the offsets then come from
    them alone, and the intercept from every click given the offsets). With ``n_boot``, the
    third value is the tower's serving-level interval (:meth:`PositionBias.level_interval`)."""
    tower = PositionBias(n_boot=n_boot, **switches)
    pos = torch.from_numpy(position.astype(np.int64))
    rel = torch.from_numpy(relevance.astype(np.float64))
    y = torch.from_numpy(click.astype(np.float64))
    req = torch.from_numpy(np.unique(request, return_inverse=True)[1].astype(np.int64))
    mark = None if explore is None else torch.from_numpy(np.asarray(explore) > 0)
    shift = 0.0
    for _ in range(max_iter):
        tower.accumulate(pos, rel + shift, y, request=req, explore=mark)
        change, ref_step = tower.update()
        shift += ref_step
        if change < tol and abs(ref_step) < tol:
            break
    return np.asarray(tower.offsets(), dtype=np.float64), shift, tower.level_interval()


#: bootstrap replicates of the shipped rows (the serving level's interval and its coverage)
N_BOOT = 100


def world_row(seed: int, size: str = "small", **pins: Any) -> dict[str, Any]:
    """One world's row (``pins`` as :func:`~hybridrank.data.worlds.draw_world` takes them;
    random-order logging unless they pin ``explore_share < 1``)."""
    pins = {"logging": "random", **pins}
    world = simulate_world(draw_world(seed, size=size, **pins))
    cols = world.columns
    train, _, test = split_frame(world.frame, ColumnMap(**cols), **SPLIT)
    pos_c, lab, req = cols["position"], cols["label"], cols["request"]
    click = (train[lab].to_numpy() > 0).astype(np.float64)
    ref_test = test["true_p_ref"].to_numpy()
    rel_test = _logit(ref_test)

    def pcoc(shift: float) -> float:
        return float(_sigmoid(rel_test + shift).sum() / ref_test.sum())

    mark_col = world.extra.get("explore")
    explore = (train[mark_col].to_numpy() if mark_col is not None
               else np.full(train.height, int(world.spec.explore_share == 1.0)))
    row: dict[str, Any] = {"seed": seed, "describe": world.spec.describe(),
                           "explore_share": world.spec.explore_share,
                           "curve": world.spec.position_curve, "clicks": int(click.sum()),
                           "floor": pcoc(level_shift(_logit(train["true_p"].to_numpy()), click.sum()))}
    truth = np.asarray(world.offsets, dtype=np.float64)  # truth[j]: slot j (index 0 unused)
    top = int(min(10, world.spec.max_len))
    for name, (switches, marked) in ESTIMATORS.items():
        boot = N_BOOT if name.startswith("shipped") else 0
        off, shift, level = fit_offsets(train[pos_c].to_numpy(), _logit(train["true_p_ref"].to_numpy()),
                                        click, train[req].to_numpy(), explore=explore if marked else None,
                                        n_boot=boot, **switches)
        err = float(np.max(np.abs(off[1:top] - truth[2:top + 1]))) if top >= 2 else 0.0
        row[name] = {"pcoc": pcoc(shift), "offset_err": err}
        if level is not None:
            # the estimate's level error is `shift` (the relevance is the truth): covered when
            # the true level, estimate - shift, lies in [estimate + lo, estimate + hi]
            lo, hi = level["interval_logit"]
            row[name].update(level_lo=lo, level_hi=hi, level_covered=bool(-hi <= shift <= -lo))
    return row


def aggregate(rows: list[dict[str, Any]]) -> str:
    n = len(rows)
    out = ["| estimator | PCOC@ref in [0.95, 1.05] | RMS log PCOC | offsets within 0.1 | within 0.2 "
           "| level interval covers the truth | median half-width (logit) |",
           "|---|---|---|---|---|---|---|"]
    floor = np.log([r["floor"] for r in rows])
    out.append(f"| floor (true offsets, true relevance) | {int(np.sum(np.abs(np.exp(floor) - 1) <= 0.05))}/{n} "
               f"| {math.sqrt(float(np.mean(floor ** 2))):.3f} | - | - | - | - |")
    for name in ESTIMATORS:
        lp = np.log([r[name]["pcoc"] for r in rows])
        err = np.array([r[name]["offset_err"] for r in rows])
        cov = [r[name]["level_covered"] for r in rows if "level_covered" in r[name]]
        half = [(r[name]["level_hi"] - r[name]["level_lo"]) / 2 for r in rows if "level_hi" in r[name]]
        out.append(f"| {name} | {int(np.sum(np.abs(np.exp(lp) - 1) <= 0.05))}/{n} "
                   f"| {math.sqrt(float(np.mean(lp ** 2))):.3f} | {int(np.sum(err <= 0.1))}/{n} "
                   f"| {int(np.sum(err <= 0.2))}/{n} | "
                   + (f"{sum(cov)}/{len(cov)} | {float(np.median(half)):.3f} |" if cov else "- | - |"))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", type=int, default=10)
    ap.add_argument("--seed0", type=int, default=1120)
    ap.add_argument("--size", default="small")
    ap.add_argument("--impressions", type=int, default=None, help="pin n_impressions")
    ap.add_argument("--explore-shares", default=None,
                    help="e.g. 0.05,0.1: relevance-sorted logs with this share of marked "
                         "exploration requests, in turn (default: random-order logs)")
    ap.add_argument("--pin", nargs="*", default=[], metavar="FIELD=VALUE",
                    help="pin world fields (as bench_generalization.py: drift=none, ...)")
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON")
    a = ap.parse_args(argv)
    pins: dict[str, Any] = {} if a.impressions is None else {"n_impressions": a.impressions}
    pins.update(dict(_pin(p) for p in a.pin))
    shares = [float(x) for x in a.explore_shares.split(",")] if a.explore_shares else None
    rows = []
    print("| world | curve | exploration | train clicks | floor | "
          + " | ".join(f"{e} PCOC / offset err" for e in ESTIMATORS) + " |")
    print("|---|---|---|---|---|" + "---|" * len(ESTIMATORS))
    for i, seed in enumerate(range(a.seed0, a.seed0 + a.worlds)):
        extra = {} if shares is None else {"logging": "sorted", "explore_share": shares[i % len(shares)],
                                           "mark_explore": True}
        r = world_row(seed, a.size, **pins, **extra)
        rows.append(r)
        cells = " | ".join(f"{r[e]['pcoc']:.3f} / {r[e]['offset_err']:.3f}" for e in ESTIMATORS)
        print(f"| {seed} | {r['curve']} | {r['explore_share']:.0%} | {r['clicks']:,} | {r['floor']:.3f} "
              f"| {cells} |", flush=True)
    print()
    print(aggregate(rows))
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
