"""What following the click level's trend is worth, with the relevance model taken out.

A model that cannot see time learns its log's average click level; ``hybridrank-export`` follows a
straight-line trend of the training and validation rows when it finds one that fits
(:func:`hybridrank.serving.level_trend.fit_level_trend`). This benchmark judges that rule without
training: on worlds with the drift pinned to ``none``, ``linear`` and ``weekly`` in turn, a
**perfect time-blind model** (the true logits, the drift replaced by its mean before the test period,
the level fitted to those rows' clicks) is scored at slot 1 on the test rows: ``static`` (as it is),
``trend`` (the shipped rule's shift at each row's time), ``plain_line`` (any significant slope of a
plain weighted line: no weekly cycle, overdispersion or lack-of-fit check). It prints PCOC at slot 1
per world, and per drift kind the worlds within 5 % and 10 % and the RMS of log PCOC::

    python -m benchmarks.level_trend --worlds 40 --seed0 7000
    python -m benchmarks.level_trend --worlds 20 --seed0 7100 --impressions 400000
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl
import torch

from benchmarks import common as C
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
    ap = C.world_parser("benchmarks.level_trend", __doc__, worlds=20, seed0=7000)
    ap.add_argument("--drifts", default=",".join(DRIFTS))
    ap.add_argument("--alpha", type=float, default=0.01, help="the slope's significance level (shipped: 0.01)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = parser()
    a = ap.parse_args(argv)
    drifts = [d for d in a.drifts.split(",") if d]
    if unknown := sorted(set(drifts) - set(DRIFTS)):
        ap.error(f"unknown drifts {unknown}; choose from {DRIFTS}")
    rows = []
    print("| world | drift | amplitude | days | clicks | static | trend | plain_line | verdict |")
    print("|---|---|---|---|---|---|---|---|---|")
    for seed in range(a.seed0, a.seed0 + a.worlds):
        for drift in drifts:
            r = world_row(seed, drift, a.size, alpha=a.alpha, **C.world_pins(a))
            rows.append(r)
            print(f"| {seed} | {drift} | {r['amplitude']:.2f} | {r['days']} | {r['clicks']:,} | {r['static']:.3f} | "
                  f"{r['trend']:.3f} | {r['plain_line']:.3f} | {r['verdict']} |", flush=True)
    print("\n" + aggregate(rows))
    if a.out is not None:
        C.write_json(a.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
