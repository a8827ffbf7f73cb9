"""MQ2008, standard 5-fold protocol: hybridrank losses next to LightGBM, one table, same metrics.

Fold k is built from the parts S1..S5 (train = the three parts after k - 1, cyclically;
validation = the next part; test = the last; see the shared DATASETS.md). Every model sees only
its fold's training rows, stops early on the fold's validation part only, and is reported on the
fold's test part. Every row -- LightGBM included -- is scored by the same code,
:func:`hybridrank.models.ranker.evaluate_logits`: NDCG@1/3/5/10 (exp gain, ties averaged) and MAP under
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

    python scripts/bench_letor.py                       # all folds, all models (~10-15 min)
    python scripts/bench_letor.py --folds 1 --models lgbm_lambdarank bce_softmax
    python scripts/bench_letor.py --tutorial-leak       # also the leaky setting

Writes JSON (``--out``, default ``results/letor.json``), prints Markdown tables and (unless
``--no-docs``) rewrites the generated sections of ``docs/BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import _common as C
import numpy as np
import torch

LGBM_MODELS = ("lgbm_lambdarank", "lgbm_binary")
HYBRID_MODELS = ("bce", "softmax", "bce_softmax", "bce_ranknet", "bce_lambdarank",
                 "calibrated_softmax", "rcr", "jrc")
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
    "calibrated_softmax": "hybridrank calibrated_softmax",
    "rcr": "hybridrank rcr",
    "jrc": "hybridrank jrc",
}
RANK_KEYS = ("ndcg@1", "ndcg@3", "ndcg@5", "ndcg@10", "map")
CAL_KEYS = ("logloss", "ece", "pcoc")
LGBM_COMMON = dict(learning_rate=0.05, num_leaves=31, min_data_in_leaf=20, num_threads=2,
                   seed=0, deterministic=True, force_row_wise=True, verbose=-1)
MAX_ROUNDS = 2000
PATIENCE = 50


# ----------------------------------------------------------------------------------------------
# models: each returns (val logits, test logits, info)
# ----------------------------------------------------------------------------------------------
def run_lightgbm(name: str, splits, lgb) -> tuple[torch.Tensor, torch.Tensor, dict]:
    x_tr, y_tr, g_tr = C.split_arrays(splits.train)
    x_va, y_va, g_va = C.split_arrays(splits.val)
    if name == "lgbm_lambdarank":
        params = dict(objective="lambdarank", metric="ndcg", eval_at=[10], **LGBM_COMMON)
        train_set = lgb.Dataset(x_tr, y_tr, group=g_tr)
        val_set = lgb.Dataset(x_va, y_va, group=g_va, reference=train_set)
    else:
        params = dict(objective="binary", metric="binary_logloss", **LGBM_COMMON)
        train_set = lgb.Dataset(x_tr, (y_tr > 0).astype(np.float64))
        val_set = lgb.Dataset(x_va, (y_va > 0).astype(np.float64), reference=train_set)
    booster = lgb.train(params, train_set, num_boost_round=MAX_ROUNDS, valid_sets=[val_set],
                        callbacks=[lgb.early_stopping(PATIENCE, verbose=False)])
    it = booster.best_iteration

    def score(data) -> torch.Tensor:  # raw_score: the logit for binary, the ranking score else
        raw = booster.predict(data.num.double().numpy(), num_iteration=it, raw_score=True)
        return torch.from_numpy(np.asarray(raw, dtype=np.float64)).float()

    return score(splits.val), score(splits.test), {"best_iteration": it}


def run_hybrid(loss: str, data_overrides: list[str], extra: list[str]):
    result, splits, z_val, z_test = C.train_hybrid(
        ["experiment=letor", *data_overrides, f"loss={loss}", *extra])
    best = result.get("best_checkpoint") or ""
    info = {"best_checkpoint": Path(best).name if best else None,  # epochNN.ckpt: the best epoch
            "train_seconds": result.get("seconds")}
    return splits, z_val, z_test, info


def load_splits(data_overrides: list[str]):
    import hydra

    cfg = C.compose_config(["experiment=letor", *data_overrides, "paths.output_dir=/tmp"])
    return hydra.utils.instantiate(cfg.data.source).load()


# ----------------------------------------------------------------------------------------------
# one setting (a fold, or the leaky tutorial setting)
# ----------------------------------------------------------------------------------------------
def _run_one(name, data_overrides, lgb, extra, splits):
    """(splits, val logits, test logits, info) of one model; splits None if it was skipped."""
    if name in LGBM_MODELS:
        if lgb is None:
            return None, None, None, None
        splits = splits if splits is not None else load_splits(data_overrides)
        z_val, z_test, info = run_lightgbm(name, splits, lgb)
        return splits, z_val, z_test, info
    torch.manual_seed(0)
    return run_hybrid(name, data_overrides, extra)


def run_setting(tag: str, data_overrides: list[str], models: list[str], lgb, extra: list[str]
                ) -> dict[str, dict]:
    """Train every model on one train/val/test triple; ``{model: {"test": .., "val": .., ..}}``."""
    out: dict[str, dict] = {}
    splits = None
    for name in models:
        t0 = time.perf_counter()
        try:
            data, z_val, z_test, info = _run_one(name, data_overrides, lgb, extra, splits)
        except Exception as e:  # one broken loss must not cost the rest of the table
            print(f"  [{tag}] {name}: FAILED: {type(e).__name__}: {e}", flush=True)
            out[name] = {"error": f"{type(e).__name__}: {e}"}
            continue
        if data is None:
            continue
        if splits is None:
            splits = data
        seconds = time.perf_counter() - t0
        test = C.evaluate(data.test, z_test)
        val = C.evaluate(data.val, z_val, empties=("skip",))["skip"]
        out[name] = {"test": test, "val": val, "seconds": seconds, **info}
        s = test["skip"]
        print(f"  [{tag}] {name:<20} test ndcg@10 {s['ndcg@10']:.4f}  logloss {s['logloss']:.4f}"
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
    p.add_argument("--models", nargs="+", default=list(LGBM_MODELS + HYBRID_MODELS),
                   choices=list(LGBM_MODELS + HYBRID_MODELS))
    p.add_argument("--out", default=str(C.RESULTS / "letor.json"))
    p.add_argument("--tutorial-leak", action="store_true",
                   help="also run the leaky tutorial setting (lambdarank + --leak-model)")
    p.add_argument("--leak-model", default="jrc", choices=list(HYBRID_MODELS))
    p.add_argument("--leak-only", action="store_true",
                   help="run only the leaky setting; the clean numbers come from --out")
    p.add_argument("--no-docs", action="store_true", help="do not touch docs/BENCHMARKS.md")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (1: the MLP is tiny; more threads only spin)")
    p.add_argument("overrides", nargs="*", help="extra hydra overrides for the hybridrank rows")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    C.quiet()
    C.data_root()
    lgb = C.lightgbm_or_none()
    folds = C.parse_folds(args.folds)
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
        results["folds"][k] = run_setting(f"fold{k}", C.fold_overrides(k), args.models, lgb,
                                          args.overrides)
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
        leak_models = [m for m in ("lgbm_lambdarank", args.leak_model) if m in LGBM_MODELS
                       and lgb is not None or m in HYBRID_MODELS]
        results["tutorial_leak"] = run_setting("leak", leak_overrides(), leak_models, lgb,
                                               args.overrides)
        leak_md = leak_table(results["tutorial_leak"], summary)
        print("\n" + leak_md, flush=True)

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=float))
    print(f"\nJSON: {out}")
    if not args.no_docs:
        stamp = time.strftime("%Y-%m-%d")
        cmd = "python scripts/bench_letor.py " + " ".join(sys.argv[1:] if argv is None else argv)
        if not args.leak_only:
            C.write_section("MQ2008 5-fold", f"Generated {stamp} by `{cmd.strip()}` on "
                            f"{C.machine()}; 5-fold wall time {elapsed / 60:.1f} min.\n\n"
                            f"{table}\n\n{goal}")
        if leak_md:
            C.write_section("Tutorial leak", f"Generated {stamp} by `{cmd.strip()}`.\n\n{leak_md}")
        print(f"updated {C.DOCS}")


if __name__ == "__main__":
    main()
