"""The GPU preset's batch budget and learning-rate rule against the CPU preset, on the CPU.

``trainer=gpu`` trains with a large batch budget (``conf/trainer/gpu.yaml``); this script checks
that its test log loss and NDCG@10 stay within noise of the CPU preset's (budget 4,096): each
run's point inside the other's 95 % bootstrap interval over test requests. Quality only: the GPU
preset is composed as it ships but built on the CPU (``trainer.accelerator=cpu``, fp32,
deterministic), so the figures are the same on any machine; no timings are taken.

Data: the default simulator (``hybridrank-train`` with no overrides), and generated worlds
(:func:`hybridrank.data.worlds.draw_world`, trained as ``hybridrank-train data=clicklog`` on the
world's log with its column map, position not a feature: what the shipped click-log config does).

    python scripts/bench_gpu_preset.py --data sim
    python scripts/bench_gpu_preset.py --data world --seeds 1000 1001 --impressions 400000 [--family longtail]
    python scripts/bench_gpu_preset.py --data sim --variant "b65k_sqrt|data.budget=65536|model.optimizer.lr=0.008"
    python scripts/bench_gpu_preset.py --tables results/gpu_preset.json

Variants: ``cpu`` (no overrides) and ``gpu`` (``trainer=gpu`` on the CPU) unless ``--variant``
gives others (``NAME|override|override...``, ``@gpu`` standing for the gpu variant's overrides;
``--variant cpu --variant gpu`` keeps those). The
results go to ``--out`` (JSON, appended to when it exists) and a table is printed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

#: the GPU preset built on the CPU: fp32 and deterministic, everything else as trainer=gpu ships it
GPU_ON_CPU = ["trainer=gpu", "trainer.accelerator=cpu", "trainer.devices=1", "trainer.precision=32-true",
              "trainer.deterministic=true"]
VARIANTS: dict[str, list[str]] = {"cpu": [], "gpu": GPU_ON_CPU}
METRICS = ("logloss", "ndcg@10")


def parse_variant(text: str) -> tuple[str, list[str]]:
    """``NAME|override|...`` (or a known name) -> (name, overrides); an override ``@gpu`` stands
    for a known variant's overrides."""
    name, *overrides = text.split("|")
    if not overrides:
        overrides = [f"@{name}"]
    out: list[str] = []
    for o in overrides:
        if o.startswith("@") and o[1:] not in VARIANTS:
            raise SystemExit(f"unknown variant {o[1:]!r}: known {sorted(VARIANTS)}, or NAME|override|...")
        out.extend(VARIANTS[o[1:]] if o.startswith("@") else [o])
    return name, out


def run_one(overrides: Sequence[str]) -> dict[str, Any]:
    """One ``hybridrank-train`` run in-process; the figures this script reports."""
    from _common import compose_config, quiet

    from hybridrank.cli.train import train

    quiet()
    with tempfile.TemporaryDirectory(prefix="hybridrank-gpupreset-") as tmp:
        cfg = compose_config([f"paths.output_dir={tmp}", "trainer.enable_progress_bar=false", "logger=none",
                              *overrides])
        result = train(cfg)
    rows = result["intervals"]["rows"]
    return {"overrides": list(overrides), "budget": int(cfg.data.budget),
            "lr": float(cfg.model.optimizer.lr),
            "scheduler": (dict(cfg.model.scheduler) if cfg.model.get("scheduler") else None),
            **{m: rows["this model"][m] for m in METRICS},
            # the oracle (true pCTR) and base-rate rows: how much there is to learn
            "reference": {r: {m: v[m][0] for m in METRICS} for r, v in rows.items() if r != "this model"},
            "epochs": result["training"]["epochs"], "best_epoch": result["training"]["best_epoch"],
            "stopped": result["training"]["stopped_because"]}


def world_overrides(seed: int, impressions: int | None, family: str, work: Path) -> tuple[list[str], str]:
    """Write world ``seed``'s log under ``work``; the overrides that train on it, and its name."""
    from bench_generalization import _overrides, prepare_world

    pins = {"n_impressions": impressions} if impressions else {}
    w = prepare_world(seed, "small", work, pins, family)
    ov = [o for o in _overrides(w["world"], w["dir"] / "log.parquet", False) if not o.startswith("intervals.")]
    return ov, f"world {seed} ({family}, {w['world'].frame.height:,} impressions)"


def within(a: Sequence[float], b: Sequence[float]) -> bool:
    """Each point ([estimate, lower, upper]) inside the other's interval."""
    return b[1] <= a[0] <= b[2] and a[1] <= b[0] <= a[2]


def table(results: Sequence[dict[str, Any]]) -> str:
    lines = ["| data | variant | budget | lr | test log loss [95 % CI] | test NDCG@10 [95 % CI] | "
             "epochs (best) | minus cpu (log loss / NDCG@10) | within noise of cpu |",
             "|---|---|---:|---:|---|---|---|---|---|"]
    for r in results:
        base = r["runs"].get("cpu")
        for name, run in r["runs"].items():
            other = base is not None and name != "cpu"
            ok = " / ".join("yes" if within(run[m], base[m]) else "NO" for m in METRICS) if other else "-"
            diff = " / ".join(f"{run[m][0] - base[m][0]:+.5f}" for m in METRICS) if other else "-"
            cells = [f"{run[m][0]:.5f} [{run[m][1]:.5f}, {run[m][2]:.5f}]" for m in METRICS]
            lines.append(f"| {r['data']} | {name} | {run['budget']} | {run['lr']:.4g} | {cells[0]} | "
                         f"{cells[1]} | {run['epochs']} ({run['best_epoch']}) | {diff} | {ok} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", choices=("sim", "world"), default="sim")
    ap.add_argument("--seeds", type=int, nargs="*", default=[1000, 1001, 1002, 1003, 1004])
    ap.add_argument("--impressions", type=int, default=None,
                    help="pin the worlds' impression count (default: as drawn, 40k-120k)")
    ap.add_argument("--family", default="base", help="world family (base, longtail)")
    ap.add_argument("--variant", action="append", default=None, help="NAME|override|... (repeatable)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "gpu_preset.json")
    ap.add_argument("--tables", nargs="+", type=Path, default=None, help="print saved results")
    a = ap.parse_args(argv)
    if a.tables:  # entries of one data set in several files are merged
        merged: dict[str, dict[str, Any]] = {}
        for path in a.tables:
            for r in json.loads(path.read_text()):
                merged.setdefault(r["data"], {"data": r["data"], "runs": {}})["runs"].update(r["runs"])
        print(table(list(merged.values())))
        return 0
    variants = [parse_variant(v) for v in (a.variant or ["cpu", "gpu"])]
    saved = json.loads(a.out.read_text()) if a.out.exists() else []
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hybridrank-worlds-") as tmp:
        datasets: list[tuple[str, list[str]]] = []
        if a.data == "sim":
            datasets.append(("default simulator", []))
        else:
            for seed in a.seeds:
                ov, name = world_overrides(seed, a.impressions, a.family, Path(tmp))
                datasets.append((name, ov))
        for data, ov in datasets:
            entry = next((r for r in saved if r["data"] == data), None)
            if entry is None:
                entry = {"data": data, "runs": {}}
                saved.append(entry)
            for name, extra in variants:
                entry["runs"][name] = run_one([*ov, *extra])
                a.out.write_text(json.dumps(saved, indent=1))
                print(table([entry]), flush=True)
    print(table(saved))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
