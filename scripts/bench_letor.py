"""Which loss? MQ2008, standard 5-fold protocol: hybridrank losses next to LightGBM, one table.

The question of this script is the loss (every loss config with the MLP scorer of
``experiment=letor``); ``bench_real.py`` asks which scorer, on MQ2008 and the other real data
sets. Both train through ``_common.train_hybrid`` and ``_common.fit_lightgbm``.

Fold k is built from the parts S1..S5 (train = the three parts after k - 1, cyclically;
validation = the next part; test = the last; see the shared DATASETS.md). Every model sees only
its fold's training rows, stops early on the fold's validation part only, and is reported on the
fold's test part. Every row -- LightGBM included -- is scored by the same code,
:func:`hybridrank.evaluation.evaluate_logits`: NDCG@1/3/5/10 (exp gain, ties averaged) and MAP under
``empty="skip"`` and ``empty="zero"``, and on binary relevance (label > 0) the log loss, ECE
(15 quantile bins) and PCOC of ``sigmoid(score)``. The table shows mean ± std over the folds.

Rows:
- ``lgbm lambdarank``: LightGBM ``lambdarank``, lr 0.05, 31 leaves, early stopping on the
  validation part's NDCG@10 (its raw scores are not probabilities: its calibration columns only
  show that).
- ``lgbm binary``: LightGBM ``binary`` on label > 0, early stopping on the validation log loss.
- hybridrank with ``experiment=letor`` (``conf/experiment/letor.yaml``) and each loss config:
  ``bce`` (pure pointwise), ``softmax`` (pure ranking), and the hybrids.

``--tutorial-leak`` adds the setting of a widely read tutorial: train on the concatenation of
Fold1..5 ``train.txt``, stop early on the concatenation of Fold1..5 ``vali.txt`` and report on
that same concatenation. Every validation row is then also a training row (the folds are
rotations of the same five parts), so the numbers measure memorisation, not ranking.

Usage::

    python scripts/bench_letor.py --write-docs          # all folds, all models (~10-15 min)
    python scripts/bench_letor.py --folds 1 --models lgbm_lambdarank bce_softmax
    python scripts/bench_letor.py --tutorial-leak       # also the leaky setting
    python scripts/bench_letor.py --quick               # smoke test: fold 1, 2 epochs, 3 models

Writes JSON (``--out``, default ``results/letor.json``) and prints Markdown tables. With
``--write-docs`` it rewrites the generated sections of ``docs/BENCHMARKS.md``, and only from a
complete run (all five folds, every model, LightGBM installed, no failed row).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import _common as C
import torch

LGBM_MODELS = ("lgbm_lambdarank", "lgbm_binary")
HYBRID_MODELS = ("bce", "softmax", "bce_softmax", "bce_ranknet", "bce_lambdarank",
                 "bce_calibrated_softmax", "rcr", "jrc")
QUICK_MODELS = ("lgbm_binary", "bce", "bce_softmax")
#: models whose score is not meant to be a probability (calibration columns flagged)
UNCALIBRATED = {"lgbm_lambdarank", "softmax"}
LABELS = {
    "lgbm_lambdarank": "LightGBM lambdarank",
    "lgbm_binary": "LightGBM binary",
    "bce": "hybridrank bce (pointwise)",
    "softmax": "hybridrank softmax (ranking)",
    "bce_softmax": "hybridrank bce_softmax",
    "bce_ranknet": "hybridrank bce_ranknet",
    "bce_lambdarank": "hybridrank bce_lambdarank",
    "bce_calibrated_softmax": "hybridrank bce_calibrated_softmax",
    "rcr": "hybridrank rcr",
    "jrc": "hybridrank jrc",
}
RANK_KEYS = ("ndcg@1", "ndcg@3", "ndcg@5", "ndcg@10", "map")
CAL_KEYS = ("logloss", "ece", "pcoc")
LGBM_COMMON = dict(learning_rate=0.05, num_leaves=31, min_data_in_leaf=20, num_threads=2,
                   seed=0, deterministic=True, force_row_wise=True, verbose=-1)
MAX_ROUNDS = 2000
PATIENCE = 50
QUICK = ["trainer.max_epochs=2"]  # --quick: hybridrank rows


# ----------------------------------------------------------------------------------------------
# one setting (a fold, or the leaky tutorial setting)
# ----------------------------------------------------------------------------------------------
def _run_one(name: str, splits, extra: list[str], data_overrides: list[str], quick: bool):
    """(val logits, test logits, info) of one model on the setting's ``splits``."""
    if name in LGBM_MODELS:
        r = C.fit_lightgbm(name.removeprefix("lgbm_"), splits, LGBM_COMMON,
                           max_rounds=100 if quick else MAX_ROUNDS, patience=PATIENCE)
        return r["z_val"].float(), r["z_test"].float(), {"best_iteration": r["best_iteration"]}
    torch.manual_seed(0)
    run = C.train_hybrid(
        ["experiment=letor", *data_overrides, f"loss={name}", *(QUICK if quick else []), *extra],
        splits=splits)
    best = run.result.get("best_checkpoint") or ""
    return run.z_val, run.z_test, {"best_checkpoint": Path(best).name if best else None,  # epochNN: best epoch
                           "train_seconds": run.result.get("seconds")}


def run_setting(tag: str, data_overrides: list[str], models: list[str], extra: list[str],
                quick: bool = False) -> dict[str, dict]:
    """Train every model on one train/val/test triple; ``{model: {"test": .., "val": .., ..}}``."""
    out: dict[str, dict] = {}
    splits = C.load_splits(["experiment=letor", *data_overrides])  # one load for every model
    for name in models:
        t0 = time.perf_counter()
        try:
            z_val, z_test, info = _run_one(name, splits, extra, data_overrides, quick)
        except Exception as e:  # one broken loss must not cost the rest of the table
            print(f"  [{tag}] {name}: FAILED: {type(e).__name__}: {e}", flush=True)
            out[name] = {"error": f"{type(e).__name__}: {e}"}
            continue
        seconds = time.perf_counter() - t0
        test = C.evaluate(splits.test, z_test)
        val = C.evaluate(splits.val, z_val, empties=("skip",))["skip"]
        out[name] = {"test": test, "val": val, "seconds": seconds, **info}
        s = test["skip"]
        print(f"  [{tag}] {name:<22} test ndcg@10 {s['ndcg@10']:.4f}  logloss {s['logloss']:.4f}"
              f"  ece {s['ece']:.4f}  pcoc {s.get('pcoc', float('nan')):.3f}"
              f"  (val ndcg@10 {val['ndcg@10']:.4f}, {seconds:.1f} s)", flush=True)
    return out


# ----------------------------------------------------------------------------------------------
# tables
# ----------------------------------------------------------------------------------------------
def per_model(folds: dict[int, dict], model: str, empty: str) -> dict[int, dict]:
    return {k: f[model]["test"][empty] for k, f in folds.items() if "test" in f.get(model, {})}


def main_tables(folds: dict[int, dict], models: list[str]) -> tuple[str, dict]:
    summary: dict = {}
    rows_skip, rows_zero = [], []
    for m in models:
        skip, zero = per_model(folds, m, "skip"), per_model(folds, m, "zero")
        if not skip:
            continue
        summary[m] = {"skip": C.summarize(skip, RANK_KEYS + CAL_KEYS),
                      "zero": C.summarize(zero, RANK_KEYS),
                      "seconds": C.mean_std([folds[k][m]["seconds"] for k in skip])[0]}
        flag = " †" if m in UNCALIBRATED else ""
        rows_skip.append([LABELS[m]] + [C.fmt_ms([v[k] for v in skip.values()]) for k in RANK_KEYS]
                         + [C.fmt_ms([v[k] for v in skip.values()]) + flag for k in CAL_KEYS]
                         + [f"{summary[m]['seconds']:.0f}"])
        rows_zero.append([LABELS[m]] + [C.fmt_ms([v[k] for v in zero.values()]) for k in RANK_KEYS])
    n_folds = len(folds)
    first = next(iter(folds.values()))
    any_model = next((r for r in first.values() if "test" in r), {"test": {"skip": {}}})
    n_skipped = int(any_model["test"]["skip"].get("n_skipped", 0))
    n_lists = int(any_model["test"]["skip"].get("n_lists", 0))
    text = (
        f"Test parts of {n_folds} fold(s) (folds {', '.join(map(str, folds))}), mean ± std over "
        "folds.\n\n"
        f"**`empty=\"skip\"`** (queries without a relevant document left out: e.g. {n_skipped} of "
        f"{n_lists} in the first fold's test part). Calibration columns are on label > 0; "
        "† = the score is not a probability by design (shown to make the point).\n\n"
        + C.markdown_table(["model", "NDCG@1", "NDCG@3", "NDCG@5", "NDCG@10", "MAP", "log loss",
                            "ECE", "PCOC", "s/fold"], rows_skip)
        + "\n\n**`empty=\"zero\"`** (the LETOR papers' convention: such queries count as 0).\n\n"
        + C.markdown_table(["model", "NDCG@1", "NDCG@3", "NDCG@5", "NDCG@10", "MAP"], rows_zero)
    )
    return text, summary


def goal_text(summary: dict) -> str:
    lam, binr = summary.get("lgbm_lambdarank"), summary.get("lgbm_binary")
    if not lam or not binr:
        return "(goal check needs both LightGBM rows)"
    target_ndcg = lam["skip"]["ndcg@10"]["mean"]
    target_ece = binr["skip"]["ece"]["mean"]
    lines = [f"Goal: NDCG@10 ≥ LightGBM lambdarank ({target_ndcg:.4f}) and ECE ≤ LightGBM "
             f"binary ({target_ece:.4f}), `empty=\"skip\"`, means over folds."]
    for m, s in summary.items():
        if m in LGBM_MODELS or m in UNCALIBRATED:
            continue
        nd, ece = s["skip"]["ndcg@10"]["mean"], s["skip"]["ece"]["mean"]
        ok = nd >= target_ndcg and ece <= target_ece
        lines.append(f"- {LABELS[m]}: NDCG@10 {nd:.4f} ({nd - target_ndcg:+.4f}), ECE {ece:.4f} "
                     f"({ece - target_ece:+.4f}) -> {'meets both' if ok else 'falls short'}")
    return "\n".join(lines)


def leak_table(leak: dict, summary: dict) -> str:
    rows = []
    for m, r in leak.items():
        if "test" not in r:
            continue
        clean = summary.get(m)
        s = r["test"]["skip"]
        z = r["test"]["zero"]
        rows.append([LABELS[m], f"{s['ndcg@5']:.3f}", f"{s['ndcg@10']:.3f}", f"{z['ndcg@5']:.3f}",
                     clean and C.fmt_ms(clean["skip"]["ndcg@5"]["folds"]) or "n/a",
                     clean and C.fmt_ms(clean["skip"]["ndcg@10"]["folds"]) or "n/a",
                     clean and C.fmt_ms(clean["zero"]["ndcg@5"]["folds"]) or "n/a"])
    return (
        "Leaky setting: train on Fold1..5 `train.txt` concatenated, early-stop on Fold1..5 "
        "`vali.txt` concatenated and report on that same concatenation (all 784 queries; each of "
        "them is also in the training data, three times). Clean: the 5-fold test parts above.\n\n"
        + C.markdown_table(["model", "leaky NDCG@5 (skip)", "leaky NDCG@10 (skip)",
                            "leaky NDCG@5 (zero)", "clean NDCG@5 (skip)", "clean NDCG@10 (skip)",
                            "clean NDCG@5 (zero)"], rows)
    )


def leak_overrides() -> list[str]:
    """Fold1..5 train files concatenated, and Fold1..5 vali files (built from the parts)."""
    folds = [C.mq2008_fold(k) for k in range(1, 6)]
    train = ",".join(p for tr, _, _ in folds for p in tr)  # every part three times
    vali = ",".join(va for _, va, _ in folds)  # every part once
    return ["data=letor_mq2008", f"data.source.train=[{train}]", f"data.source.val=[{vali}]",
            f"data.source.test=[{vali}]"]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--folds", default="1-5", help="e.g. 1-5, 1, 1,3 (default 1-5)")
    p.add_argument("--models", nargs="+", default=None, choices=list(LGBM_MODELS + HYBRID_MODELS),
                   help=f"default: every model (--quick: {' '.join(QUICK_MODELS)})")
    p.add_argument("--out", default=None)
    p.add_argument("--tutorial-leak", action="store_true",
                   help="also run the leaky tutorial setting (lambdarank + --leak-model)")
    p.add_argument("--leak-model", default="jrc", choices=list(HYBRID_MODELS))
    p.add_argument("--leak-only", action="store_true",
                   help="run only the leaky setting; the clean numbers come from --out")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: fold 1, 2 epochs, 100 boosting rounds, 3 models")
    C.add_docs_options(p)
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (1: the MLP is tiny; more threads only spin)")
    p.add_argument("overrides", nargs="*", help="extra hydra overrides for the hybridrank rows")
    args = p.parse_args(argv)
    if args.quick:
        args.folds = "1" if args.folds == "1-5" else args.folds
    args.models = args.models or list(QUICK_MODELS if args.quick else LGBM_MODELS + HYBRID_MODELS)
    args.out = args.out or str(C.RESULTS / ("letor_quick.json" if args.quick else "letor.json"))
    folds = C.parse_folds(args.folds)
    C.check_docs_request(args, [why for bad, why in [
        (args.quick, "--quick"), (folds != [1, 2, 3, 4, 5], f"folds {args.folds}"),
        (set(args.models) != set(LGBM_MODELS + HYBRID_MODELS), "not every model"),
        (bool(args.overrides), f"overrides {args.overrides}")] if bad])

    leak_models = ["lgbm_lambdarank", args.leak_model] if args.tutorial_leak else []
    C.require_lightgbm([*args.models, *leak_models])
    torch.set_num_threads(args.threads)
    C.quiet()
    C.data_root()
    t_start = time.perf_counter()
    results: dict = {"folds": {}, "config": {"models": args.models, "overrides": args.overrides,
                                             "experiment": "letor", "machine": C.machine()}}
    if args.leak_only:
        previous = json.loads(Path(args.out).read_text())
        results.update({k: v for k, v in previous.items() if k not in ("tutorial_leak", "config")})
        folds = []
    for k in folds:
        print(f"fold {k}: train {', '.join(Path(x).name for x in C.mq2008_fold(k)[0])} | "
              f"val {Path(C.mq2008_fold(k)[1]).name} | test {Path(C.mq2008_fold(k)[2]).name}",
              flush=True)
        results["folds"][k] = run_setting(f"fold{k}", C.fold_overrides(k), args.models,
                                          args.overrides, args.quick)
    elapsed = None
    if not args.leak_only:
        table, summary = main_tables(results["folds"], args.models)
        results["summary"] = summary
        goal = goal_text(summary)
        elapsed = time.perf_counter() - t_start
        results["seconds_5fold"] = elapsed
        print("\n" + table + "\n\n" + goal + f"\n\nwall time {elapsed / 60:.1f} min", flush=True)
    summary = results["summary"]

    leak_md = None
    if args.tutorial_leak:
        print("\ntutorial leak setting", flush=True)
        results["tutorial_leak"] = run_setting("leak", leak_overrides(), leak_models,
                                               args.overrides, args.quick)
        leak_md = leak_table(results["tutorial_leak"], summary)
        print("\n" + leak_md, flush=True)

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=float))
    print(f"\nJSON: {out}")
    failures = [f"{tag} {m}" for tag, rows in [*((f"fold{k}", r) for k, r in results["folds"].items()),
                                               ("leak", results.get("tutorial_leak") or {})]
                for m, r in rows.items() if "error" in r]
    stamp = time.strftime("%Y-%m-%d")
    cmd = ("python scripts/bench_letor.py " + " ".join(sys.argv[1:] if argv is None else argv)).strip()
    sections = {}
    if not args.leak_only:
        sections["MQ2008 5-fold"] = (f"Generated {stamp} by `{cmd}` on {C.machine()}; 5-fold wall "
                                     f"time {elapsed / 60:.1f} min.\n\n{table}\n\n{goal}")
    if leak_md:
        sections["Tutorial leak"] = f"Generated {stamp} by `{cmd}`.\n\n{leak_md}"
    C.write_docs(args, sections, failures=failures)


if __name__ == "__main__":
    main()
