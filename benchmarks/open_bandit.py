"""Position effects on the real Open Bandit sample: the tower's offsets against non-parametric ratios.

The ZOZOTOWN Open Bandit sample (``<shared data>/clicklogs/open_bandit_dataset_sample``) holds two
logging policies over the same three slots: ``random`` (items placed uniformly at random, so slot
and relevance are independent) and ``bts`` (Bernoulli Thompson sampling, with the policy's
``propensity_score`` of each logged item-in-slot). Each policy has three campaigns (all / men /
women, 10,000 rows each), pooled here with the campaign as a feature.

1. **random**: hybridrank with a position-bias tower (``monotone=false``: three slots of a page,
   not a vertical list; ``monotone=true`` beside it) against the non-parametric log-odds ratio of
   each slot's CTR to slot 1's, with a bootstrap interval over rows. Under random placement the
   two estimate the same thing, so they must agree within their intervals.
2. **bts**: the tower with ``columns.propensity`` (inverse-propensity weighted offsets) against the
   self-normalised IPW non-parametric ratios of the same log, the naive (unweighted) ratios, and
   the random log's ratios (the policy-free reference).

About 130 clicks per policy (the tower sees the training split's ~90): every interval is wide, and
the comparison is one of agreement within noise. ``python -m benchmarks.open_bandit`` (writes
``results/open_bandit_positions.json``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl

from benchmarks.common import RESULTS, data_root
from benchmarks.grid import train_run

CAMPAIGNS = ("all", "men", "women")
USER = [f"user_feature_{i}" for i in range(4)]


def pooled_log(policy: str, out: Path) -> pl.DataFrame:
    """The three campaigns of one policy in one parquet file (campaign as a column)."""
    base = data_root() / "clicklogs" / "open_bandit_dataset_sample" / policy
    frames = [pl.read_csv(base / c / f"{c}.csv").select("timestamp", "item_id", "position", "click",
                                                        "propensity_score", *USER)
              .with_columns(pl.lit(c).alias("campaign"), pl.col("item_id").cast(pl.String)) for c in CAMPAIGNS]
    frame = pl.concat(frames).with_columns(pl.col("timestamp").str.to_datetime(time_zone="UTC").dt.epoch("s").alias("time"))
    frame.write_parquet(out)
    return frame


def train_tower(path: Path, run: Path, *, propensity: bool, monotone: bool) -> dict:
    """The tower's report (``metrics.json["position_bias"]``) trained on one pooled log."""
    cols = {"request": "[campaign," + ",".join(USER) + "]", "request_time_bucket": 86400, "label": "click",
            "session": "null", "user": "null", "time": "time", "position": "position", "item": "item_id",
            "bid": "null", "numeric": "[]", "categorical": "[item_id,campaign," + ",".join(USER) + "]",
            **({"propensity": "propensity_score"} if propensity else {})}
    overrides = ["data=clicklog", f"data.source.path={path}", "position_bias=tower",
                 f"model.position_bias.monotone={str(monotone).lower()}", "model.position_bias.n_boot=200",
                 "data.source.duplicates=keep", "data.source.split.key=request",
                 *(f"data.source.columns.{k}={v}" for k, v in cols.items())]
    return train_run(overrides, run)["position_bias"]


def ratios(frame: pl.DataFrame, *, weight: str | None = None, n_boot: int = 2000, seed: int = 0,
           max_ipw: float = 100.0) -> dict[str, list]:
    """Per-slot logit(CTR_j) - logit(CTR_1) (self-normalised weighted CTRs with ``weight``), with a
    percentile bootstrap interval over rows."""
    pos = frame["position"].to_numpy() - 1
    y = frame["click"].to_numpy().astype(np.float64)
    # inverse propensities capped as the tower caps them (PositionBias.max_ipw, 100)
    w = np.ones_like(y) if weight is None else np.minimum(1.0 / frame[weight].to_numpy(), max_ipw)
    k = int(pos.max()) + 1

    def est(cw: np.ndarray) -> np.ndarray:
        ctr = np.array([(cw * w * y)[pos == j].sum() / (cw * w)[pos == j].sum() for j in range(k)])
        ctr = np.clip(ctr, 1e-9, 1 - 1e-9)
        lo = np.log(ctr / (1 - ctr))
        return lo - lo[0]

    rng = np.random.default_rng(seed)
    reps = np.stack([est(rng.poisson(1.0, y.size).astype(np.float64)) for _ in range(n_boot)])
    lo, hi = np.percentile(reps, [2.5, 97.5], axis=0)
    return {"offsets": est(np.ones_like(y)).tolist(), "lower": lo.tolist(), "upper": hi.tolist(),
            "clicks": [int(y[pos == j].sum()) for j in range(k)]}


def agree(a_point, a_lo, a_hi, b_point, b_lo, b_hi) -> bool:
    """The two estimates differ by less than 1.96 standard errors of their difference (each standard
    error read off its 95 % interval, the two estimates independent)."""
    se = ((a_hi - a_lo) / 3.92) ** 2 + ((b_hi - b_lo) / 3.92) ** 2
    return bool(abs(a_point - b_point) <= 1.96 * se ** 0.5)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.open_bandit", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=RESULTS / "open_bandit_positions.json")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    a = parser().parse_args(argv)
    t0 = time.perf_counter()
    rows, verdicts = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        logs = {p: pooled_log(p, tmp / f"{p}.parquet") for p in ("random", "bts")}
        ref = rows["random: non-parametric"] = ratios(logs["random"])
        for mono in (False, True):
            rows[f"random: tower (monotone={str(mono).lower()})"] = train_tower(
                tmp / "random.parquet", tmp / f"run_random_{mono}", propensity=False, monotone=mono)
        rows["bts: non-parametric, naive"] = ratios(logs["bts"])
        rows["bts: non-parametric, IPW"] = ratios(logs["bts"], weight="propensity_score")
        rows["bts: tower with propensities"] = train_tower(tmp / "bts.parquet", tmp / "run_bts", propensity=True,
                                                           monotone=False)
    lines = ["| estimate | clicks by slot | slot 2 | slot 3 | random non-parametric point inside its intervals "
             "| agrees with random non-parametric (difference within 1.96 SE) |", "|---|---|---|---|---|---|"]
    for name, r in rows.items():
        off, lo, hi = r.get("logit_offsets", r.get("offsets")), r["lower"], r["upper"]
        cells = [f"{off[j]:+.3f}" if lo[j] is None else f"{off[j]:+.3f} [{lo[j]:+.3f}, {hi[j]:+.3f}]" for j in (1, 2)]
        same = name == "random: non-parametric"
        ok = all(agree(off[j], lo[j], hi[j], ref["offsets"][j], ref["lower"][j], ref["upper"][j]) for j in (1, 2))
        ins = all(lo[j] <= ref["offsets"][j] <= hi[j] for j in (1, 2))
        clicks = ", ".join(f"{c:.0f}" for c in r["clicks"][:3]) if r.get("clicks") else "-"
        lines.append(f"| {name} | {clicks} | {cells[0]} | {cells[1]} | {'-' if same else 'yes' if ins else 'no'} "
                     f"| {'-' if same else 'yes' if ok else 'no'} |")
        if r.get("identifiability"):
            verdicts.append(f"{name}: {r['identifiability']['verdict']}")
    print("\n".join(lines) + "\n\n" + "\n".join(verdicts) + f"\n\n{(time.perf_counter() - t0):.0f} s")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
