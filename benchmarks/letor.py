"""Which loss? MQ2008, the standard 5-fold protocol: hybridrank losses next to LightGBM, one table.

Each model trains on its fold's training parts (:func:`benchmarks.common.mq2008_fold`), stops early
on the fold's validation part only and is reported on its test part; every row, LightGBM's
included, is scored by the same code (:func:`benchmarks.common.evaluate`), mean ± std over the folds
(the protocol: docs/BENCHMARKS.md, "Ranking quality: MQ2008"). ``python -m benchmarks.real`` asks
which scorer::

    python -m benchmarks.letor --write-docs          # all folds, all models
    python -m benchmarks.letor --folds 1 --models lgbm_lambdarank bce_softmax
    python -m benchmarks.letor --quick               # smoke test: fold 1, 2 epochs, 3 models

Writes JSON (``--out``, default ``results/letor.json``) and prints Markdown tables; ``--write-docs``
rewrites the "MQ2008 5-fold" section of docs/BENCHMARKS.md, only from a complete run.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from benchmarks import common as C
from benchmarks.baselines import fit_rows, require_lightgbm
from benchmarks.grid import load_splits

LGBM_MODELS = ("lgbm_lambdarank", "lgbm_binary")
HYBRID_MODELS = ("bce", "softmax", "bce_softmax", "bce_ranknet", "bce_lambdarank", "bce_calibrated_softmax",
                 "rcr", "jrc")
QUICK_MODELS = ("lgbm_binary", "bce", "bce_softmax")
#: models whose score is not meant to be a probability (calibration columns flagged)
UNCALIBRATED = {"lgbm_lambdarank", "softmax"}
LABELS = {"lgbm_lambdarank": "LightGBM lambdarank", "lgbm_binary": "LightGBM binary",
          "bce": "hybridrank bce (pointwise)", "softmax": "hybridrank softmax (ranking)",
          **{m: f"hybridrank {m}" for m in HYBRID_MODELS[2:]}}
RANK_KEYS = ("ndcg@1", "ndcg@3", "ndcg@5", "ndcg@10", "map")
CAL_KEYS = ("logloss", "ece", "pcoc")


def run_setting(tag: str, data_overrides: list[str], models: list[str], extra: list[str],
                quick: bool = False) -> dict[str, dict]:
    """Train every model on one fold; ``{model: {"test": {empty: metrics}, "val": metrics, ...}}``
    (``{"error": ...}`` for a model that failed)."""
    splits = load_splits(["experiment=letor", *data_overrides])  # one load for every model
    fits = fit_rows(tag, splits, {m: ["experiment=letor", *data_overrides, f"loss={m}",
                                      *(["trainer.max_epochs=2"] if quick else []), *extra] for m in models},
                    quick=quick)
    return {m: r if "error" in r else {"test": r["test"], "val": r["val"], "seconds": r["seconds"], **r["info"]}
            for m, r in fits.items()}


def main_tables(folds: dict[int, dict], models: list[str]) -> tuple[str, dict]:
    summary: dict = {}
    rows_skip, rows_zero = [], []
    for m in models:
        skip = {k: f[m]["test"]["skip"] for k, f in folds.items() if "test" in f.get(m, {})}
        zero = {k: f[m]["test"]["zero"] for k, f in folds.items() if "test" in f.get(m, {})}
        if not skip:
            continue
        summary[m] = {"skip": C.summarize(skip, RANK_KEYS + CAL_KEYS), "zero": C.summarize(zero, RANK_KEYS),
                      "seconds": C.mean_std([folds[k][m]["seconds"] for k in skip])[0]}
        flag = " †" if m in UNCALIBRATED else ""
        rows_skip.append([LABELS[m]] + [C.fmt_ms([v[k] for v in skip.values()]) for k in RANK_KEYS]
                         + [C.fmt_ms([v[k] for v in skip.values()]) + flag for k in CAL_KEYS]
                         + [f"{summary[m]['seconds']:.0f}"])
        rows_zero.append([LABELS[m]] + [C.fmt_ms([v[k] for v in zero.values()]) for k in RANK_KEYS])
    first = next(iter(folds.values()))
    any_model = next((r for r in first.values() if "test" in r), {"test": {"skip": {}}})["test"]["skip"]
    text = (
        f"Test parts of {len(folds)} fold(s) (folds {', '.join(map(str, folds))}), mean ± std over folds.\n\n"
        f"**`empty=\"skip\"`** (queries without a relevant document left out: e.g. "
        f"{int(any_model.get('n_skipped', 0))} of {int(any_model.get('n_lists', 0))} in the first fold's test "
        "part). Calibration columns are on label > 0; † = the score is not a probability by design (shown to "
        "make the point).\n\n"
        + C.markdown_table(["model", "NDCG@1", "NDCG@3", "NDCG@5", "NDCG@10", "MAP", "log loss", "ECE", "PCOC",
                            "s/fold"], rows_skip)
        + "\n\n**`empty=\"zero\"`** (the LETOR papers' convention: such queries count as 0).\n\n"
        + C.markdown_table(["model", "NDCG@1", "NDCG@3", "NDCG@5", "NDCG@10", "MAP"], rows_zero))
    return text, summary


def goal_text(summary: dict) -> str:
    """Which hybridrank rows meet both targets (LightGBM lambdarank's NDCG@10, LightGBM binary's ECE),
    each with its (NDCG@10, ECE) difference to them."""
    lam, binr = summary.get("lgbm_lambdarank"), summary.get("lgbm_binary")
    if not lam or not binr:
        return "(goal check needs both LightGBM rows)"
    target_ndcg, target_ece = lam["skip"]["ndcg@10"]["mean"], binr["skip"]["ece"]["mean"]
    verdicts: dict[bool, list[str]] = {True: [], False: []}
    for m, s in summary.items():
        if m not in LGBM_MODELS and m not in UNCALIBRATED:
            nd, ece = s["skip"]["ndcg@10"]["mean"], s["skip"]["ece"]["mean"]
            verdicts[nd >= target_ndcg and ece <= target_ece].append(
                f"{LABELS[m]} ({nd - target_ndcg:+.4f}, {ece - target_ece:+.4f})")
    return (f"Goal: NDCG@10 ≥ LightGBM lambdarank ({target_ndcg:.4f}) and ECE ≤ LightGBM binary ({target_ece:.4f}), "
            f"`empty=\"skip\"`, means over folds; (NDCG@10, ECE) difference to those: meets both: "
            f"{', '.join(verdicts[True]) or 'none'}; falls short: {', '.join(verdicts[False]) or 'none'}.")


def parser() -> argparse.ArgumentParser:
    p = C.parser("benchmarks.letor", __doc__)
    p.add_argument("--folds", default="1-5", help="e.g. 1-5, 1, 1,3 (default 1-5)")
    p.add_argument("--models", nargs="+", default=None, choices=list(LGBM_MODELS + HYBRID_MODELS),
                   help=f"default: every model (--quick: {' '.join(QUICK_MODELS)})")
    p.add_argument("--out", default=None)
    p.add_argument("--quick", action="store_true", help="smoke test: fold 1, 2 epochs, 100 boosting rounds, 3 models")
    C.add_docs_options(p)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: the MLP is tiny)")
    p.add_argument("overrides", nargs="*", help="extra hydra overrides for the hybridrank rows")
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.quick:
        args.folds = "1" if args.folds == "1-5" else args.folds
    args.models = args.models or list(QUICK_MODELS if args.quick else LGBM_MODELS + HYBRID_MODELS)
    args.out = args.out or str(C.RESULTS / ("letor_quick.json" if args.quick else "letor.json"))
    folds = C.parse_folds(args.folds)
    C.check_docs_request(args, [why for bad, why in [
        (args.quick, "--quick"), (folds != [1, 2, 3, 4, 5], f"folds {args.folds}"),
        (set(args.models) != set(LGBM_MODELS + HYBRID_MODELS), "not every model"),
        (bool(args.overrides), f"overrides {args.overrides}")] if bad])
    require_lightgbm(args.models)
    torch.set_num_threads(args.threads)
    C.quiet()
    C.data_root()
    t_start = time.perf_counter()
    results: dict = {"folds": {}, "config": {"models": args.models, "overrides": args.overrides,
                                             "experiment": "letor", "machine": C.machine()}}
    for k in folds:
        train, val, test = C.mq2008_fold(k)
        print(f"fold {k}: train {', '.join(Path(x).name for x in train)} | val {Path(val).name} | "
              f"test {Path(test).name}", flush=True)
        results["folds"][k] = run_setting(f"fold{k}", C.fold_overrides(k), args.models, args.overrides, args.quick)
    table, results["summary"] = main_tables(results["folds"], args.models)
    goal = goal_text(results["summary"])
    elapsed = results["seconds_5fold"] = time.perf_counter() - t_start
    print("\n" + table + "\n\n" + goal + f"\n\nwall time {elapsed / 60:.1f} min", flush=True)
    C.write_json(args.out, results, default=float)
    print(f"\nJSON: {args.out}")
    failures = [f"fold{k} {m}" for k, rows in results["folds"].items() for m, r in rows.items() if "error" in r]
    stamp = f"Generated {time.strftime('%Y-%m-%d')} by `{C.command('letor', argv)}` on {C.machine()}"
    C.write_docs(args, {"MQ2008 5-fold": f"{stamp}; 5-fold wall time {elapsed / 60:.1f} min.\n\n{table}\n\n{goal}"},
                 failures=failures)


if __name__ == "__main__":
    main()
