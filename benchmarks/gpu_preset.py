"""The GPU preset's batch budget and learning-rate rule against the CPU preset, built on the CPU.

``trainer=gpu`` trains with batches of 65,536 impressions and the learning rate of its rule
(``conf/trainer/gpu.yaml``). This benchmark checks that the test log loss and NDCG@10 it reaches
stay within noise of the CPU preset's (4,096, lr 0.002): each run's point inside the other's 95 %
bootstrap interval over test requests. Quality only: the preset is composed as it ships but built
on the CPU (fp32, deterministic), so the figures are the same on any machine; nothing is timed
(``benchmarks.train`` times the presets).

Data: the default simulator (``hybridrank-train`` with no overrides), or generated worlds trained
as ``hybridrank-train data=clicklog`` on the world's log, position not a feature (what the shipped
click-log config does)::

    python -m benchmarks.gpu_preset --data sim
    python -m benchmarks.gpu_preset --data world --seeds 1000 1001 --impressions 400000 [--family longtail]
    python -m benchmarks.gpu_preset --data sim --variant "b65k_linear|@gpu|model.optimizer.lr=0.032"
    python -m benchmarks.gpu_preset --tables results/gpu_preset.json

Variants: ``cpu`` (no overrides) and ``gpu`` unless ``--variant`` gives others (``NAME`` of a
known one, or ``NAME|override|...``, ``@gpu`` standing for the gpu variant's overrides). Results
are appended to ``--out`` (JSON) and a table is printed.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import common as C
from benchmarks.common import RESULTS
from benchmarks.grid import compose_config, train_run

#: the GPU preset built on the CPU: fp32 and deterministic, everything else as trainer=gpu ships it
GPU_ON_CPU = ["trainer=gpu", "trainer.accelerator=cpu", "trainer.devices=1", "trainer.precision=32-true",
              "trainer.deterministic=true"]
VARIANTS: dict[str, list[str]] = {"cpu": [], "gpu": GPU_ON_CPU}
METRICS = ("logloss", "ndcg@10")


def parse_variant(text: str) -> tuple[str, list[str]]:
    """``NAME|override|...`` (or a known name) -> (name, overrides); ``@NAME`` inside stands for
    a known variant's overrides."""
    name, *overrides = text.split("|")
    out: list[str] = []
    for o in overrides or [f"@{name}"]:
        if o.startswith("@") and o[1:] not in VARIANTS:
            raise SystemExit(f"unknown variant {o[1:]!r}: known {sorted(VARIANTS)}, or NAME|override|...")
        out.extend(VARIANTS[o[1:]] if o.startswith("@") else [o])
    return name, out


def run_one(overrides: Sequence[str]) -> dict[str, Any]:
    """One ``hybridrank-train`` run in-process (bootstrap intervals on); the figures reported."""
    overrides = ["intervals.n_boot=1000", *overrides]
    cfg = compose_config(["paths.output_dir=unused", *overrides])
    with tempfile.TemporaryDirectory(prefix="hybridrank-gpupreset-") as tmp:
        result = train_run(overrides, tmp)
    rows = result["intervals"]["rows"]
    return {"overrides": list(overrides), "budget": int(cfg.data.budget), "lr": float(cfg.model.optimizer.lr),
            **{m: rows["this model"][m] for m in METRICS},
            "epochs": result["training"]["epochs"], "best_epoch": result["training"]["best_epoch"]}


def world_overrides(seed: int, impressions: int | None, family: str, work: Path) -> tuple[list[str], str]:
    """Write world ``seed``'s log under ``work``; the overrides that train on it, and its name."""
    from benchmarks.worlds import prepare_world
    from benchmarks.worlds import world_overrides as clicklog_overrides

    w = prepare_world(seed, work, family=family, pins={"n_impressions": impressions} if impressions else {})
    ov = [o for o in clicklog_overrides(w.world, w.dir / "log.parquet", False) if not o.startswith("intervals.")]
    return ov, f"world {seed} ({family}, {w.world.frame.height:,} impressions)"


def within(a: Sequence[float], b: Sequence[float]) -> bool:
    """Each point ([estimate, lower, upper]) inside the other's interval."""
    return b[1] <= a[0] <= b[2] and a[1] <= b[0] <= a[2]


def table(results: Sequence[dict[str, Any]]) -> str:
    """One row per data set and variant; the differences to ``cpu`` and whether they are noise."""
    rows = []
    for r in results:
        base = r["runs"].get("cpu")
        for name, run in r["runs"].items():
            other = base is not None and name != "cpu"
            rows.append([r["data"], name, run["budget"], f"{run['lr']:.4g}",
                         *(f"{run[m][0]:.5f} [{run[m][1]:.5f}, {run[m][2]:.5f}]" for m in METRICS),
                         f"{run['epochs']} ({run['best_epoch']})",
                         " / ".join(f"{run[m][0] - base[m][0]:+.5f}" for m in METRICS) if other else "-",
                         " / ".join("yes" if within(run[m], base[m]) else "NO" for m in METRICS) if other else "-"])
    return C.markdown_table(["data", "variant", "budget", "lr", "test log loss [95 % CI]", "test NDCG@10 [95 % CI]",
                             "epochs (best)", "minus cpu (log loss / NDCG@10)", "within noise of cpu"], rows)


def parser():
    ap = C.parser("benchmarks.gpu_preset", __doc__)
    ap.add_argument("--data", choices=("sim", "world"), default="sim")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1000, 1001, 1002])
    ap.add_argument("--impressions", type=int, default=None, help="pin the worlds' n_impressions")
    ap.add_argument("--family", default="base")
    ap.add_argument("--variant", action="append", default=None, help="NAME or NAME|override|... (repeatable)")
    ap.add_argument("--out", type=Path, default=RESULTS / "gpu_preset.json")
    ap.add_argument("--tables", nargs="+", type=Path, default=None, help="print saved results (merged), run nothing")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    a = parser().parse_args(argv)
    if a.tables:  # one data set's runs from several files are merged
        merged: dict[str, dict[str, Any]] = {}
        for path in a.tables:
            for r in json.loads(path.read_text()):
                merged.setdefault(r["data"], {"data": r["data"], "runs": {}})["runs"].update(r["runs"])
        print(table(list(merged.values())))
        return 0
    C.quiet()
    variants = [parse_variant(v) for v in (a.variant or ["cpu", "gpu"])]
    saved = json.loads(a.out.read_text()) if a.out.exists() else []
    with tempfile.TemporaryDirectory(prefix="hybridrank-gpupreset-worlds-") as work:
        datasets = ([([], "default simulator")] if a.data == "sim" else
                    [world_overrides(s, a.impressions, a.family, Path(work)) for s in a.seeds])
        for base, name in datasets:
            runs = {}
            for vname, ov in variants:
                runs[vname] = run_one([*base, *ov])
                print(f"{name} {vname}: " + ", ".join(f"{m} {runs[vname][m][0]:.5f}" for m in METRICS), flush=True)
            saved.append({"data": name, "runs": runs})
            C.write_json(a.out, saved)
    print(table(saved))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
