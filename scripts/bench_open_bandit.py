"""Position effects on the real Open Bandit sample: the tower's offsets against non-parametric ratios.

The ZOZOTOWN Open Bandit sample (``../shared/data/clicklogs/open_bandit_dataset_sample``) holds
two logging policies over the same three slots: ``random`` (items placed uniformly at random, so
slot and relevance are independent) and ``bts`` (Bernoulli Thompson sampling, with the policy's
``propensity_score`` of each logged item-in-slot). Each policy has three campaigns (all / men /
women, 10,000 rows each); they are pooled here, with the campaign as a feature.

1. **random**: ``hybridrank-train`` with a position-bias tower (``monotone=false``: three slots of
   a page, not a vertical list; ``monotone=true`` beside it) against the non-parametric log-odds
   ratio of each slot's CTR to slot 1's, with a bootstrap interval over rows. Under random
   placement the two estimate the same thing, so they must agree within their intervals.
2. **bts**: the tower with ``columns.propensity`` (inverse-propensity weighted offsets) against
   the self-normalised IPW non-parametric ratios of the same log, the naive (unweighted) ratios,
   and the random log's ratios (the policy-free reference).

About 130 clicks per policy (the tower sees the training split's ~90): every interval is wide,
and the comparison is one of agreement within noise, not of precision. The tower's clicks by slot
are its training split's; the non-parametric ratios use the whole log.

Run: ``python scripts/bench_open_bandit.py`` (writes ``results/open_bandit_positions.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from _common import data_root  # noqa: E402

CAMPAIGNS = ("all", "men", "women")
USER = [f"user_feature_{i}" for i in range(4)]


def pooled_log(policy: str, out: Path) -> pl.DataFrame:
    """The three campaigns of one policy in one parquet file (campaign as a column)."""
    base = data_root() / "clicklogs" / "open_bandit_dataset_sample" / policy
    frames = []
    for c in CAMPAIGNS:
        f = pl.read_csv(base / c / f"{c}.csv").select(
            "timestamp", "item_id", "position", "click", "propensity_score", *USER)
        frames.append(f.with_columns(pl.lit(c).alias("campaign"),
                                     pl.col("item_id").cast(pl.String)))
    frame = pl.concat(frames).with_columns(
        pl.col("timestamp").str.to_datetime(time_zone="UTC").dt.epoch("s").alias("time"))
    frame.write_parquet(out)
    return frame


def train_tower(path: Path, run: Path, *, propensity: bool, monotone: bool) -> dict:
    cmd = ["hybridrank-train", "data=clicklog", f"data.source.path={path}", "position_bias=tower",
           f"model.position_bias.monotone={str(monotone).lower()}", "model.position_bias.n_boot=200",
           "intervals.n_boot=0", f"hydra.run.dir={run}", "data.source.duplicates=keep",
           "data.source.split.key=request", "data.source.columns.request=[campaign," + ",".join(USER) + "]",
           "data.source.columns.request_time_bucket=86400", "data.source.columns.label=click",
           "data.source.columns.session=null", "data.source.columns.user=null",
           "data.source.columns.time=time", "data.source.columns.position=position",
           "data.source.columns.item=item_id", "data.source.columns.bid=null",
           "data.source.columns.numeric=[]",
           "data.source.columns.categorical=[item_id,campaign," + ",".join(USER) + "]"]
    if propensity:
        cmd.append("data.source.columns.propensity=propensity_score")
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ})
    if proc.returncode != 0:
        raise RuntimeError(f"hybridrank-train failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return json.loads((run / "metrics.json").read_text())["position_bias"]


def ratios(frame: pl.DataFrame, *, weight: str | None = None, n_boot: int = 2000,
           seed: int = 0, max_ipw: float = 100.0) -> dict[str, list]:
    """Per-slot logit(CTR_j) - logit(CTR_1) (self-normalised weighted CTRs with ``weight``),
    with a percentile bootstrap interval over rows."""
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

    point = est(np.ones_like(y))
    rng = np.random.default_rng(seed)
    reps = np.stack([est(rng.poisson(1.0, y.size).astype(np.float64)) for _ in range(n_boot)])
    lo, hi = np.percentile(reps, [2.5, 97.5], axis=0)
    clicks = [int(y[pos == j].sum()) for j in range(k)]
    return {"offsets": point.tolist(), "lower": lo.tolist(), "upper": hi.tolist(), "clicks": clicks}


def _iv(p: float, lo: float | None, hi: float | None) -> str:
    return f"{p:+.3f}" if lo is None else f"{p:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def agree(a_point, a_lo, a_hi, b_point, b_lo, b_hi) -> bool:
    """The two estimates differ by less than 1.96 standard errors of their difference (each
    standard error read off its 95 % interval, the two estimates independent)."""
    se = ((a_hi - a_lo) / 3.92) ** 2 + ((b_hi - b_lo) / 3.92) ** 2
    return bool(abs(a_point - b_point) <= 1.96 * se ** 0.5)


def inside(a_point, b_lo, b_hi) -> bool:
    return bool(b_lo <= a_point <= b_hi)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "open_bandit_positions.json")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows, table = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        logs = {p: pooled_log(p, tmp / f"{p}.parquet") for p in ("random", "bts")}
        ref = ratios(logs["random"])
        rows["random: non-parametric"] = ref
        for mono in (False, True):
            rows[f"random: tower (monotone={str(mono).lower()})"] = train_tower(
                tmp / "random.parquet", tmp / f"run_random_{mono}", propensity=False, monotone=mono)
        rows["bts: non-parametric, naive"] = ratios(logs["bts"])
        rows["bts: non-parametric, IPW"] = ratios(logs["bts"], weight="propensity_score")
        rows["bts: tower with propensities"] = train_tower(
            tmp / "bts.parquet", tmp / "run_bts", propensity=True, monotone=False)
    lines = ["| estimate | clicks by slot | slot 2 | slot 3 | random non-parametric point inside its intervals "
             "| agrees with random non-parametric (difference within 1.96 SE) |", "|---|---|---|---|---|---|"]
    for name, r in rows.items():
        off, lo, hi = r["logit_offsets"] if "logit_offsets" in r else r["offsets"], r["lower"], r["upper"]
        cells = [_iv(off[j], lo[j], hi[j]) for j in (1, 2)]
        same = name == "random: non-parametric"
        ok = "-" if same else ("yes" if all(agree(off[j], lo[j], hi[j], ref["offsets"][j], ref["lower"][j],
                                                   ref["upper"][j]) for j in (1, 2)) else "no")
        ins = "-" if same else ("yes" if all(inside(ref["offsets"][j], lo[j], hi[j]) for j in (1, 2)) else "no")
        clicks = r.get("clicks")
        clicks = ", ".join(f"{c:.0f}" for c in clicks[:3]) if clicks else "-"
        lines.append(f"| {name} | {clicks} | {cells[0]} | {cells[1]} | {ins} | {ok} |")
        ident = r.get("identifiability")
        if ident:
            table.append(f"{name}: {ident['verdict']}")
    report = "\n".join(lines)
    print(report)
    print("\n" + "\n".join(table))
    print(f"\n{(time.perf_counter() - t0):.0f} s")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
