"""What the clicks allow: the position tower's estimator given the TRUE relevance, beside the floor.

When PCOC at the reference slot or an offset misses on the worlds (:mod:`benchmarks.worlds`), the
relevance model, the offsets' estimator or the clicks can be at fault. This benchmark takes the
relevance model out: on random-order worlds it hands :class:`~hybridrank.models.position.PositionBias`
the true position-free logits of the training rows and alternates its per-slot update with the
intercept step, as training does, until the offsets stop moving. Per world, on the test rows:
``floor`` (PCOC at the reference slot of the truth itself, its level fitted to the training
clicks: the click noise no level estimate escapes); PCOC and the largest offset error of slots
2-10 for the shipped estimator (``pool``, ``monotone``) and with each switched off; and the
``ceiling`` of an estimator that assumes nothing about the curve's shape
(:func:`information_ceiling`: each slot's logit from its own clicks at the information bound,
``eps_j ~ Normal(0, 1 / I_j)``, ``I_j = sum p (1 - p)`` over the slot's fitted rows; drawn 20,000
times). With ``--explore-shares`` the logs are sorted by a noisy relevance estimate with that share
of marked exploration requests::

    python -m benchmarks.offsets --worlds 10 --seed0 1120
    python -m benchmarks.offsets --worlds 8 --seed0 2120 --impressions 400000 --explore-shares 0.05,0.1
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from benchmarks import common as C
from benchmarks.common import logit, sigmoid
from benchmarks.worlds import level_shift, split_world

#: name -> (PositionBias switches, exploration marked?). Unmarked, the tower fits the offsets on
#: every impression and the level on the reference slot's pooled click logit; marked, the offsets
#: on the exploration requests (every request of a random-order log) and the level on every click
#: given the offsets: the two modes a random-order log meets, by whether its exploration is mapped
ESTIMATORS: dict[str, tuple[dict[str, bool], bool]] = {
    "shipped": ({}, False), "no_pool": ({"pool": False}, False), "no_monotone": ({"monotone": False}, False),
    "per_slot": ({"pool": False, "monotone": False}, False), "shipped_marked": ({}, True),
    "no_pool_marked": ({"pool": False}, True),
}
#: bootstrap replicates of the shipped rows (the serving level's interval and its coverage)
N_BOOT = 100
#: targets: (name, PCOC band half-width, largest offset error of slots 2-10)
TARGETS = (("pcoc5_off0.1", 0.05, 0.1), ("pcoc10_off0.2", 0.10, 0.2))
#: draws of the ceiling's Monte Carlo
N_DRAWS = 20_000


def fit_offsets(position: np.ndarray, relevance: np.ndarray, click: np.ndarray, request: np.ndarray,
                max_iter: int = 60, tol: float = 1e-5, explore: np.ndarray | None = None,
                n_boot: int = 0, **switches: bool) -> tuple[np.ndarray, float, dict | None]:
    """The tower's offsets and the intercept shift at their fixed point, given ``relevance``
    (position-free logits of each row): each round accumulates every row once (one "epoch") and
    takes :meth:`PositionBias.update`, whose reference step moves the intercept. ``explore``: 0/1
    per row, the requests marked as exploration. With ``n_boot``, the third value is the tower's
    serving-level interval (:meth:`PositionBias.level_interval`)."""
    from hybridrank.models.position import PositionBias

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


def information_ceiling(position: np.ndarray, p_true: np.ndarray, fit_rows: np.ndarray, rel_test: np.ndarray,
                        marked: bool, top: int, seed: int = 0) -> dict[str, float]:
    """The chance, per target of :data:`TARGETS`, that an estimator with no assumption about the
    curve's shape meets it in this world (the module docstring, ``ceiling``), and ``pcoc_band``:
    the chance of the 5 % band alone.

    Args:
        position, p_true: ``[N]`` slot and true click probability at the logged slot of the
            training rows. fit_rows: ``[N]`` bool, the rows the offsets are fitted on.
        rel_test: the true position-free logits of the test rows.
        marked: the level from every click given the offsets (exploration mapped), else from the
            reference slot's own clicks. top: slots ``2..top`` are checked.
    """
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
        rest = rng.standard_normal((N_DRAWS, slots)) * np.sqrt(np.maximum(i_all - i_fit, 0.0))
        level = (eps @ i_fit + rest.sum(axis=1) - err @ i_all) / i_all.sum()
    else:
        level = eps[:, 0]
    # PCOC of a level error on the test rows (no drift): quantiles suffice, PCOC rises with it
    grid = np.linspace(level.min(), level.max(), 401)
    base = float(sigmoid(rel_test).sum())
    pcoc = np.interp(level, grid, np.array([float(sigmoid(rel_test + g).sum()) / base for g in grid]))
    worst = np.abs(err[:, 1:top]).max(axis=1) if top >= 2 else np.zeros(N_DRAWS)
    out = {name: float(np.mean((np.abs(pcoc - 1) <= band) & (worst <= tol))) for name, band, tol in TARGETS}
    out["pcoc_band"] = float(np.mean(np.abs(pcoc - 1) <= 0.05))
    return out


def world_row(seed: int, size: str = "small", **pins: Any) -> dict[str, Any]:
    """One world's row (``pins`` as :func:`~hybridrank.data.worlds.draw_world` takes them;
    random-order logging unless they pin ``explore_share < 1``)."""
    from hybridrank.data.worlds import draw_world, simulate_world

    world = simulate_world(draw_world(seed, size=size, **{"logging": "random", **pins}))
    cols = world.columns
    train, _, test = split_world(world)
    click = (train[cols["label"]].to_numpy() > 0).astype(np.float64)
    ref_test = test["true_p_ref"].to_numpy()
    rel_test = logit(ref_test)

    def pcoc(shift: float) -> float:
        return float(sigmoid(rel_test + shift).sum() / ref_test.sum())

    mark_col = world.extra.get("explore")
    explore = (train[mark_col].to_numpy() if mark_col is not None
               else np.full(train.height, int(world.spec.explore_share == 1.0)))
    row: dict[str, Any] = {"seed": seed, "describe": world.spec.describe(), "explore_share": world.spec.explore_share,
                           "curve": world.spec.position_curve, "clicks": int(click.sum()),
                           "floor": pcoc(level_shift(logit(train["true_p"].to_numpy()), click.sum()))}
    truth = np.asarray(world.offsets, dtype=np.float64)  # truth[j]: slot j (index 0 unused)
    top = int(min(10, world.spec.max_len))
    # random order: every row identifies the offsets, and without a shape assumption the level is
    # the reference slot's own (all clicks given offsets from the same rows reduce to it)
    sorted_log = world.spec.explore_share < 1.0
    position = train[cols["position"]].to_numpy()
    fit_rows = explore > 0 if sorted_log else np.ones(train.height, dtype=bool)
    row["ceiling"] = information_ceiling(position.astype(np.int64), train["true_p"].to_numpy(), fit_rows, rel_test,
                                         marked=sorted_log, top=top, seed=seed)
    for name, (switches, marked) in ESTIMATORS.items():
        off, shift, level = fit_offsets(position, logit(train["true_p_ref"].to_numpy()), click,
                                        train[cols["request"]].to_numpy(), explore=explore if marked else None,
                                        n_boot=N_BOOT if name.startswith("shipped") else 0, **switches)
        err = float(np.max(np.abs(off[1:top] - truth[2:top + 1]))) if top >= 2 else 0.0
        row[name] = {"pcoc": pcoc(shift), "offset_err": err}
        if level is not None:
            # the estimate's level error is `shift` (the relevance is the truth): covered when
            # the true level, estimate - shift, lies in [estimate + lo, estimate + hi]
            lo, hi = level["interval_logit"]
            row[name].update(level_lo=lo, level_hi=hi, level_covered=bool(-hi <= shift <= -lo))
    return row


def aggregate(rows: list[dict[str, Any]]) -> str:
    """Per estimator: worlds in the PCOC band, RMS log PCOC, offsets within 0.1 / 0.2, level
    coverage; then per target the ceiling's expected worlds beside each estimator's count."""
    n = len(rows)
    out = ["| estimator | PCOC@ref in [0.95, 1.05] | RMS log PCOC | offsets within 0.1 | within 0.2 "
           "| level interval covers the truth | median half-width (logit) |", "|---|---|---|---|---|---|---|"]
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
            "assumption (expected worlds) | " + " | ".join(ESTIMATORS) + " |", "|---|---|" + "---|" * len(ESTIMATORS)]
    for name, band, tol in TARGETS:
        met = [sum(abs(r[e]["pcoc"] - 1) <= band and r[e]["offset_err"] <= tol for r in rows) for e in ESTIMATORS]
        out.append(f"| {band:.0%} / {tol} logit | {sum(r['ceiling'][name] for r in rows):.1f}/{n} | "
                   + " | ".join(f"{m}/{n}" for m in met) + " |")
    out.append(f"| {0.05:.0%} / - (PCOC alone) | {sum(r['ceiling']['pcoc_band'] for r in rows):.1f}/{n} | "
               + " | ".join(f"{sum(abs(r[e]['pcoc'] - 1) <= 0.05 for r in rows)}/{n}" for e in ESTIMATORS) + " |")
    return "\n".join(out)


def parser() -> argparse.ArgumentParser:
    return C.world_parser("benchmarks.offsets", __doc__, worlds=10, seed0=1120, explore=True)


def main(argv: Sequence[str] | None = None) -> int:
    a = parser().parse_args(argv)
    rows = []
    print("| world | curve | exploration | train clicks | floor | ceiling: P(5 % / 0.1), P(10 % / 0.2) | "
          + " | ".join(f"{e} PCOC / offset err" for e in ESTIMATORS) + " |")
    print("|---|---|---|---|---|---|" + "---|" * len(ESTIMATORS))
    for i, seed in enumerate(range(a.seed0, a.seed0 + a.worlds)):
        r = world_row(seed, a.size, **C.world_pins(a), **C.explore_pins(a.explore_shares, i))
        rows.append(r)
        cells = " | ".join(f"{r[e]['pcoc']:.3f} / {r[e]['offset_err']:.3f}" for e in ESTIMATORS)
        ceil = " / ".join(f"{r['ceiling'][name]:.2f}" for name, _, _ in TARGETS)
        print(f"| {seed} | {r['curve']} | {r['explore_share']:.0%} | {r['clicks']:,} | {r['floor']:.3f} "
              f"| {ceil} | {cells} |", flush=True)
    print("\n" + aggregate(rows))
    if a.out is not None:
        C.write_json(a.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
