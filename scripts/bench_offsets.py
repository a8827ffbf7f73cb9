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

**The ceiling without a shape assumption** (``ceiling``). The floor knows the offsets. An estimator
that assumes nothing about the curve's shape must take each slot's click logit from that slot's
own clicks: with the true relevance, the best it can do (unbiased, at the information bound) is a
per-slot error ``eps_j ~ Normal(0, 1 / I_j)``, ``I_j = sum p (1 - p)`` over the slot's training
rows (the true click probabilities; exploration rows only where the offsets come from them). So
the offsets' errors are ``eps_j - eps_1`` and the level's is ``eps_1`` (random order, unmarked), or,
with exploration marked, the all-traffic level given those offsets: the score of every click
(the exploration rows' noise, the same draws as the offsets', plus the other rows' own) minus what
the offsets' errors move, over the information of all rows. Drawn 20,000 times, the share
of draws meeting a target is the chance that such an estimator meets it in this world (PCOC on the
test rows without drift: the click noise alone). Its sum over worlds is the number of worlds it
can be expected to meet a target in. Pooling and the monotone projection are shape assumptions:
they can beat it where the curve is as smooth as they assume, and pay where it is not.
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
from bench_generalization import SPLIT, _logit, _pin, _sigmoid, level_shift  # noqa: E402  (the CLI runs' split)

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

#: targets: (name, PCOC band half-width, largest offset error of slots 2-10). Issue 17 asks for the
#: first in 90 % of the random-order worlds, issue 21 for the second in 90 % of those with >= 5 %
#: exploration
TARGETS = (("pcoc5_off0.1", 0.05, 0.1), ("pcoc10_off0.2", 0.10, 0.2))
#: draws of the ceiling's Monte Carlo
N_DRAWS = 20_000


def information_ceiling(position: np.ndarray, p_true: np.ndarray, fit_rows: np.ndarray,
                        rel_test: np.ndarray, marked: bool, top: int, seed: int = 0
                        ) -> dict[str, float]:
    """The chance, per target of :data:`TARGETS`, that an estimator with no assumption about the
    curve's shape meets it in this world (see the module docstring, "The ceiling").

    ``position`` and ``p_true`` (the true click probability at the logged slot) of the training
    rows; ``fit_rows``: the rows the offsets are fitted on (bool); ``rel_test``: the true
    position-free logits of the test rows; ``marked``: the level from every click given the
    offsets (exploration mapped), else from the reference slot's own clicks; ``top``: slots
    ``2..top`` are checked. Also ``pcoc_band``: the chance of the 5 % band alone."""
    slots = int(min(position.max(), 50))
    pos = np.minimum(position, 50) - 1
    info = p_true * (1.0 - p_true)
    i_fit = np.bincount(pos[fit_rows], weights=info[fit_rows], minlength=slots)[:slots]
    i_all = np.bincount(pos, weights=info, minlength=slots)[:slots]
    if np.any(i_fit[:top] <= 0):
        return {name: 0.0 for name, _, _ in TARGETS} | {"pcoc_band": 0.0}
    rng = np.random.default_rng(seed)
    # a slot past ``top`` without fitted rows is taken as known (no error of its own): a ceiling
    sd = np.where(i_fit > 0, 1.0 / np.sqrt(np.maximum(i_fit, 1e-300)), 0.0)
    eps = rng.standard_normal((N_DRAWS, slots)) * sd                     # [D, S]
    err = eps - eps[:, :1]                                               # offsets' errors
    if marked:
        # the level matches every click given the offsets: its score sums the exploration rows'
        # noise and the other rows' (independent of it), minus what the offsets' errors move
        i_rest = np.maximum(i_all - i_fit, 0.0)
        rest = rng.standard_normal((N_DRAWS, slots)) * np.sqrt(i_rest)   # I_j^s eps_j^s
        level = (eps @ i_fit + rest.sum(axis=1) - err @ i_all) / i_all.sum()
    else:
        level = eps[:, 0]
    # PCOC of a level error on the test rows (no drift): quantiles suffice, PCOC rises with it
    grid = np.linspace(level.min(), level.max(), 401)
    base = float(_sigmoid(rel_test).sum())
    pc = np.array([float(_sigmoid(rel_test + g).sum()) / base for g in grid])
    pcoc = np.interp(level, grid, pc)
    worst = np.abs(err[:, 1:top]).max(axis=1) if top >= 2 else np.zeros(N_DRAWS)
    out = {name: float(np.mean((np.abs(pcoc - 1) <= band) & (worst <= tol)))
           for name, band, tol in TARGETS}
    out["pcoc_band"] = float(np.mean(np.abs(pcoc - 1) <= 0.05))
    return out


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
    # random order: every row identifies the offsets, and without a shape assumption the level is
    # the reference slot's own (all clicks given offsets from the same rows reduce to it)
    sorted_log = world.spec.explore_share < 1.0
    row["ceiling"] = information_ceiling(
        train[pos_c].to_numpy().astype(np.int64), train["true_p"].to_numpy(),
        explore > 0 if sorted_log else np.ones(train.height, dtype=bool), rel_test,
        marked=sorted_log, top=top, seed=seed)
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
    out += ["", "| target: PCOC@ref within / every offset of slots 2-10 within | ceiling without a shape "
            "assumption (expected worlds) | " + " | ".join(ESTIMATORS) + " |",
            "|---|---|" + "---|" * len(ESTIMATORS)]
    for name, band, tol in TARGETS:
        met = [sum(abs(r[e]["pcoc"] - 1) <= band and r[e]["offset_err"] <= tol for r in rows)
               for e in ESTIMATORS]
        out.append(f"| {band:.0%} / {tol} logit | {sum(r['ceiling'][name] for r in rows):.1f}/{n} | "
                   + " | ".join(f"{m}/{n}" for m in met) + " |")
    out.append(f"| {0.05:.0%} / - (PCOC alone) | {sum(r['ceiling']['pcoc_band'] for r in rows):.1f}/{n} | "
               + " | ".join(f"{sum(abs(r[e]['pcoc'] - 1) <= 0.05 for r in rows)}/{n}" for e in ESTIMATORS)
               + " |")
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
    print("| world | curve | exploration | train clicks | floor | ceiling: P(5 % / 0.1), P(10 % / 0.2) | "
          + " | ".join(f"{e} PCOC / offset err" for e in ESTIMATORS) + " |")
    print("|---|---|---|---|---|---|" + "---|" * len(ESTIMATORS))
    for i, seed in enumerate(range(a.seed0, a.seed0 + a.worlds)):
        extra = {} if shares is None else {"logging": "sorted", "explore_share": shares[i % len(shares)],
                                           "mark_explore": True}
        r = world_row(seed, a.size, **pins, **extra)
        rows.append(r)
        cells = " | ".join(f"{r[e]['pcoc']:.3f} / {r[e]['offset_err']:.3f}" for e in ESTIMATORS)
        ceil = " / ".join(f"{r['ceiling'][name]:.2f}" for name, _, _ in TARGETS)
        print(f"| {seed} | {r['curve']} | {r['explore_share']:.0%} | {r['clicks']:,} | {r['floor']:.3f} "
              f"| {ceil} | {cells} |", flush=True)
    print()
    print(aggregate(rows))
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
