"""What following the click level's trend is worth, with the relevance model taken out.

A model that cannot see time learns its log's average click level; when the level drifts, its pCTR
for the period after the log is off by the drift since that average. ``hybridrank-export`` tests
the training and validation rows for a straight-line trend
(:func:`hybridrank.serving.level_trend.fit_level_trend`) and, when one is found and fits, moves
every scored row to the level the line forecasts at its time. This benchmark judges that rule
without training anything: on worlds (split as the runs split them) with the drift pinned to
``none``, ``linear`` and ``weekly`` in turn, a **perfect time-blind model** (the true logits with
the drift replaced by its mean over the rows before the test period, its level fitted to their
clicks) is scored on the test rows at slot 1:

- ``static``: as it is (what a time-blind model can hope for);
- ``trend``: with the shipped rule's shift at each test row's time;
- ``plain_line``: a plain weighted line through the days instead (no weekly cycle, no
  overdispersion, no lack-of-fit check): any significant slope is followed.

It prints PCOC at slot 1 against the truth per world, and per drift kind the worlds within 5 % and
10 % and the RMS of log PCOC::

    python -m benchmarks.level_trend --worlds 40 --seed0 7000
    python -m benchmarks.level_trend --worlds 20 --seed0 7100 --impressions 400000
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from benchmarks.common import logit, sigmoid
from benchmarks.worlds import level_shift, split_world, world_drift

RULES = ("static", "trend", "plain_line")
DRIFTS = ("none", "linear", "weekly")


def world_row(seed: int, drift: str, size: str = "small", alpha: float = 0.01, **pins: Any) -> dict[str, Any]:
    """One world's row: PCOC at slot 1 of the perfect time-blind model under each rule."""
    from hybridrank.data.worlds import draw_world, simulate_world
    from hybridrank.serving.level_trend import fit_level_trend

    world = simulate_world(draw_world(seed, size=size, drift=drift, **pins))
    train, val, test = split_world(world)
    pre = pl.concat([train, val])
    mean_drift = float(np.mean(world_drift(world, pre)))
    z = logit(pre["true_p"].to_numpy()) - world_drift(world, pre) + mean_drift   # at the logged slot
    y = (pre[world.columns["label"]].to_numpy() > 0).astype(np.float64)
    p_ref = test["true_p_ref"].to_numpy()
    z_test = logit(p_ref) - world_drift(world, test) + mean_drift                # at slot 1
    level = level_shift(z, y.sum())
    tcol = world.columns["time"]
    t_pre = torch.from_numpy(pre[tcol].to_numpy().astype(np.float64))
    t_test = torch.from_numpy(test[tcol].to_numpy().astype(np.float64))
    zt, yt = torch.from_numpy(z + level), torch.from_numpy(y)
    shipped = fit_level_trend(zt, yt, t_pre, alpha=alpha)
    loose = fit_level_trend(zt, yt, t_pre, alpha=alpha, fit_alpha=1e-300, cycle_seconds=None)
    shifts = {"static": np.zeros(test.height), "trend": shipped.shift(t_test).numpy(),
              "plain_line": loose.shift(t_test).numpy()}
    row: dict[str, Any] = {"seed": seed, "drift": drift, "amplitude": world.spec.drift_amplitude,
                           "days": world.spec.days, "clicks": int(y.sum()), "applied": shipped.applied,
                           "verdict": shipped.verdict}
    for rule in RULES:
        row[rule] = float(sigmoid(z_test + level + shifts[rule]).sum() / p_ref.sum())
    return row


def aggregate(rows: list[dict[str, Any]]) -> str:
    out = ["| drift | worlds | rule | PCOC@1 within 5 % | within 10 % | RMS log PCOC |", "|---|---|---|---|---|---|"]
    for drift in DRIFTS:
        sub = [r for r in rows if r["drift"] == drift]
        n = len(sub)
        for rule in RULES if sub else ():
            x = np.array([r[rule] for r in sub])
            rms = math.sqrt(float(np.mean(np.log(x) ** 2)))
            out.append(f"| {drift} | {n} | {rule} | {int(np.sum(np.abs(x - 1) <= 0.05))}/{n} | "
                       f"{int(np.sum(np.abs(x - 1) <= 0.10))}/{n} | {rms:.3f} |")
        if sub:
            out.append(f"| {drift} | {n} | (trend applied in) | {sum(r['applied'] for r in sub)}/{n} | | |")
    return "\n".join(out)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.level_trend", description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", type=int, default=20)
    ap.add_argument("--seed0", type=int, default=7000)
    ap.add_argument("--size", default="small", choices=("tiny", "small"))
    ap.add_argument("--impressions", type=int, default=None, help="pin n_impressions")
    ap.add_argument("--drifts", default=",".join(DRIFTS))
    ap.add_argument("--alpha", type=float, default=0.01, help="the slope's significance level (shipped: 0.01)")
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = parser()
    a = ap.parse_args(argv)
    pins = {} if a.impressions is None else {"n_impressions": a.impressions}
    drifts = [d for d in a.drifts.split(",") if d]
    if unknown := sorted(set(drifts) - set(DRIFTS)):
        ap.error(f"unknown drifts {unknown}; choose from {DRIFTS}")
    rows = []
    print("| world | drift | amplitude | days | clicks | static | trend | plain_line | verdict |")
    print("|---|---|---|---|---|---|---|---|---|")
    for seed in range(a.seed0, a.seed0 + a.worlds):
        for drift in drifts:
            r = world_row(seed, drift, a.size, alpha=a.alpha, **pins)
            rows.append(r)
            print(f"| {seed} | {drift} | {r['amplitude']:.2f} | {r['days']} | {r['clicks']:,} | {r['static']:.3f} | "
                  f"{r['trend']:.3f} | {r['plain_line']:.3f} | {r['verdict']} |", flush=True)
    print("\n" + aggregate(rows))
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
