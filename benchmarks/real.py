"""Which scorer? The scorers on real data: MQ2008 (5 folds), the MSLR-WEB subset, Open Bandit.

Every hybridrank scorer (``linear``, ``mlp``, ``fm``, ``deepfm``, ``dcnv2``, ``list_aware``) with each loss of
``--losses`` (default ``bce``, the pointwise anchor, and the hybrid ``bce_softmax``), next to
LightGBM ``binary`` and ``lambdarank`` trained in the same run on the same splits, all scored by
the same code. Train time is the fit alone (hybridrank: ``trainer.fit`` with its per-epoch
validation; LightGBM: Dataset construction + boosting with early stopping), reported as a ratio
to LightGBM binary's in the same run. ``python -m benchmarks.letor`` asks which loss.

- **MQ2008**: the standard 5 folds, ``experiment=letor`` (tuned on Fold1's validation part for the
  MLP); every scorer takes those settings (``linear`` and ``fm`` have no hidden layers or dropout). Mean ± std
  over folds, and 95 % bootstrap intervals over the 784 test queries of the five folds pooled,
  with paired differences against LightGBM.
- **MSLR subset** and **Open Bandit** (the uniform-random ``all`` campaign): the same small-data
  settings (:data:`SMALL_DATA`), one split, intervals over the test requests. These data sets are
  tiny: read their intervals before their means::

    python -m benchmarks.real --write-docs              # all three data sets
    python -m benchmarks.real --datasets mq2008 --folds 1 --models mlp lgbm_binary
    python -m benchmarks.real --quick                   # smoke test: fold 1, 3 epochs

Writes ``results/real.json`` (``--out``) and prints Markdown tables; ``--write-docs`` rewrites the
"Scorers on real data" section of docs/BENCHMARKS.md, only from a complete run.
"""

from __future__ import annotations

import os

# Before torch and LightGBM load OpenMP: idle OpenMP threads sleep instead of spinning (spinning
# threads on a shared machine made LightGBM's times, and so the time ratios, meaningless).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import torch  # noqa: E402

from benchmarks import common as C  # noqa: E402
from benchmarks.baselines import LGBM_PARAMS, fit_rows, require_lightgbm  # noqa: E402
from benchmarks.grid import load_splits  # noqa: E402

HYBRID = ("linear", "mlp", "fm", "deepfm", "dcnv2", "list_aware")
#: scorers without hidden layers or dropout: the small-data settings of those keys do not apply
NO_HIDDEN = ("linear", "fm")
LGBM = ("lgbm_binary", "lgbm_lambdarank")
UNCALIBRATED = {"lgbm_lambdarank"}
#: the small-data settings of experiment=letor, for the data sets it does not select
SMALL_DATA = ["model.scorer.hidden=[64,32]", "model.scorer.dropout=0.1", "model.optimizer.lr=0.001",
              "data.budget=1024", "data.min_batches=0", "trainer.max_epochs=60", "callbacks.early_stopping.patience=8"]
DATASETS = ("mq2008", "mslr", "open_bandit")
TITLES = {"mq2008": "MQ2008, 5 folds", "mslr": "MSLR-WEB subset", "open_bandit": "Open Bandit sample"}
LABELS = {"lgbm_binary": "LightGBM binary", "lgbm_lambdarank": "LightGBM lambdarank"}


def scorer_overrides(model: str, dataset: str, quick: bool) -> list[str]:
    """The scorer's overrides: ``experiment=letor`` on MQ2008, :data:`SMALL_DATA` elsewhere;
    ``linear`` and ``fm`` have no hidden layers or dropout, so those keys are left out (deleted on MQ2008)."""
    if dataset == "mq2008":
        ov = ["experiment=letor", f"model={model}"] + (
            ["~model.scorer.hidden", "~model.scorer.dropout"] if model in NO_HIDDEN else [])
    else:
        net = ("model.scorer.hidden", "model.scorer.dropout")
        ov = [f"data={dataset}", f"model={model}",
              *(o for o in SMALL_DATA if model not in NO_HIDDEN or not o.startswith(net))]
    return ov + (["trainer.max_epochs=3"] if quick else [])


def run_setting(dataset: str, data_ov: list[str], runs: list[tuple[str, str | None]], quick: bool,
                data_extra: Sequence[str] = ()) -> dict:
    """Every row of ``runs`` (model, loss) on one split: its test logits, fit seconds and
    validation figures, and the rows that ``failed``. ``data_extra``: data overrides of the
    hybridrank rows only (LightGBM reads the data as the data config gives it); the rows of a
    split are the same either way."""
    splits = load_splits(data_ov)
    ours = load_splits([*data_ov, *data_extra]) if data_extra else splits
    fits = {}
    for model, loss in runs:
        name = f"{model}|{loss}" if loss else model
        fits.update(fit_rows(dataset, splits if model in LGBM else ours, {
            name: [*scorer_overrides(model, dataset, quick), *data_ov[1:], *data_extra, f"loss={loss}"]},
            quick=quick))
    done = {n: r for n, r in fits.items() if "error" not in r}
    return {"test": splits.test, "failed": [n for n in fits if n not in done],
            "logits": {n: r["z_test"].double() for n, r in done.items()},
            "fit_seconds": {n: r["fit_seconds"] for n, r in done.items()},
            "info": {n: {**r["info"], "val_logloss": r["val"].get("logloss"), "val_ndcg@10": r["val"].get("ndcg@10")}
                     for n, r in done.items()}}


def _f(iv, d=4) -> str:
    if iv is None or iv.estimate is None:
        return "n/a"
    return f"{iv.estimate:.{d}f}" if iv.lower is None else f"{iv.estimate:.{d}f} [{iv.lower:.{d}f}, {iv.upper:.{d}f}]"


def _d(pr, d=4) -> str:
    if pr is None or pr.diff is None:
        return ""
    ci = "" if pr.lower is None else f" [{pr.lower:+.{d}f}, {pr.upper:+.{d}f}]"
    return f"{pr.diff:+.{d}f}{ci}{'*' if pr.p_value is not None and pr.p_value < pr.alpha else ''}"


def dataset_table(dataset: str, results: list[dict], names: list[str], n_boot: int, seed: int) -> tuple[str, dict]:
    from hybridrank.metrics.uncertainty import compare_bootstrap

    names = [n for n in names if all(n in r["logits"] for r in results)]
    tests = [r["test"] for r in results]
    positions = [t.position for t in tests]
    data = tests[0] if len(results) == 1 else SimpleNamespace(
        label=torch.cat([t.label for t in tests]), lengths=torch.cat([t.lengths for t in tests]),
        position=None if any(p is None for p in positions) else torch.cat(positions))
    stats = {n: C.split_stats(data, torch.cat([r["logits"][n] for r in results])) for n in names}
    metrics = ["ndcg@10", "logloss", "ece", "pcoc"]
    base = "lgbm_binary" if "lgbm_binary" in stats else None
    iv, vs_bin = compare_bootstrap(stats, **({"baseline": base} if base else {}), n_boot=n_boot, seed=seed,
                                   metrics=metrics)
    vs_bin = vs_bin if base else {}
    vs_lam = (compare_bootstrap(stats, baseline="lgbm_lambdarank", n_boot=n_boot, seed=seed, metrics=["ndcg@10"])[1]
              if "lgbm_lambdarank" in stats else {})
    per_fold = {n: [C.evaluate(r["test"], r["logits"][n].float(), empties=("skip",))["skip"] for r in results]
                for n in names}
    secs = {n: sum(r["fit_seconds"][n] for r in results) / len(results) for n in names}
    folds = len(results) > 1
    rows, summary = [], {}
    for n in names:
        model, _, loss = n.partition("|")
        flag = " †" if model in UNCALIBRATED else ""
        ms = {k: C.mean_std([m[k] for m in per_fold[n] if k in m]) for k in ("ndcg@10", "logloss")}
        row = [LABELS.get(model, f"hybridrank {model} ({loss})")]
        row += [f"{ms['ndcg@10'][0]:.4f} ± {ms['ndcg@10'][1]:.4f}"] if folds else []
        row += [_f(iv[n]["ndcg@10"]), _d(vs_lam.get(n, {}).get("ndcg@10"))]
        row += [f"{ms['logloss'][0]:.4f} ± {ms['logloss'][1]:.4f}{flag}"] if folds else []
        row += [_f(iv[n]["logloss"]) + flag, "" if model in UNCALIBRATED else _d(vs_bin.get(n, {}).get("logloss")),
                _f(iv[n]["ece"]) + flag, _f(iv[n]["pcoc"], 3) + flag, f"{secs[n]:.1f}",
                f"{secs[n] / secs['lgbm_binary']:.1f}×" if secs.get("lgbm_binary") else ""]
        rows.append(row)
        summary[n] = {"test": {k: dict(estimate=v.estimate, lower=v.lower, upper=v.upper) for k, v in iv[n].items()},
                      "vs_lgbm_binary_logloss": vars(vs_bin[n]["logloss"]) if n in vs_bin else None,
                      "vs_lgbm_lambdarank_ndcg@10": vars(vs_lam[n]["ndcg@10"]) if n in vs_lam else None,
                      "per_fold": per_fold[n], "fit_seconds": secs[n], "info": [r["info"][n] for r in results]}
    header = (["model"] + ["NDCG@10 mean ± std"] * folds + ["NDCG@10 [95 % CI]", "Δ NDCG@10 vs lambdarank"]
              + ["log loss mean ± std"] * folds + ["log loss [95 % CI]", "Δ log loss vs binary", "ECE", "PCOC",
                                                  "fit s" + ("/fold" if folds else ""), "fit time / LightGBM binary"])
    any_stats = next(iter(stats.values()))
    head = (f"**{TITLES[dataset]}**: {any_stats.n_requests:,} test requests"
            + (" (the five test parts pooled)" if folds else "")
            + f", {int(any_stats.columns['lists:valid'].sum()):,} of them with a positive (the others are skipped "
            f"by NDCG), {any_stats.n_positives:,} positive impressions.\n\n")
    return head + C.markdown_table(header, rows), summary


def parser() -> argparse.ArgumentParser:
    p = C.parser("benchmarks.real", __doc__)
    p.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    p.add_argument("--folds", default="1-5")
    p.add_argument("--models", nargs="+", default=[*HYBRID, *LGBM], choices=[*HYBRID, *LGBM])
    p.add_argument("--losses", nargs="+", default=["bce", "bce_softmax"])
    p.add_argument("--n-boot", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (the nets are tiny here)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--data", nargs="*", default=[], metavar="OVERRIDE",
                   help="data overrides of the hybridrank rows, e.g. data.source.numeric_bins=8")
    p.add_argument("--out", default=None)
    C.add_docs_options(p)
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    complete = dict(datasets=list(DATASETS), folds="1-5", models=[*HYBRID, *LGBM], losses=["bce", "bce_softmax"],
                    n_boot=1000, data=[])
    C.check_docs_request(args, ["--quick"] * args.quick + [
        f"--{k.replace('_', '-')} {getattr(args, k)}" for k, v in complete.items()
        if (sorted(getattr(args, k)) != sorted(v) if isinstance(v, list) else getattr(args, k) != v)])
    if args.quick:
        args.folds, args.n_boot = "1", min(args.n_boot, 200)
    args.out = args.out or str(C.RESULTS / ("real_quick.json" if args.quick else "real.json"))
    require_lightgbm(args.models)
    torch.set_num_threads(args.threads)
    C.quiet()
    C.data_root()
    runs = [(m, None) for m in args.models if m in LGBM] + [
        (m, loss) for loss in args.losses for m in args.models if m in HYBRID]
    names = [f"{m}|{loss}" if loss else m for m, loss in runs]
    t_start = time.perf_counter()
    texts, dump, failures = [], {"machine": C.machine(), "lgbm": LGBM_PARAMS, "small_data": SMALL_DATA}, []
    for ds in args.datasets:
        t0 = time.perf_counter()
        folds = C.parse_folds(args.folds) if ds == "mq2008" else [None]
        results = []
        for k in folds:
            print(f"{ds}" + (f" fold {k}" if k else ""), flush=True)
            data_ov = ["experiment=letor", *C.fold_overrides(k)] if ds == "mq2008" else [f"data={ds}"]
            results.append(run_setting(ds, data_ov, runs, args.quick, args.data))
            failures += [f"{ds}{f' fold {k}' if k else ''} {n}" for n in results[-1]["failed"]]
        table, summary = dataset_table(ds, results, names, args.n_boot, args.seed)
        dump[ds] = {"summary": summary, "seconds": time.perf_counter() - t0, "folds": folds if ds == "mq2008" else None}
        texts.append(table)
        print("\n" + table + "\n", flush=True)
        C.write_json(args.out, dump, default=float)
    elapsed = time.perf_counter() - t_start
    print(f"wall time {elapsed / 60:.1f} min\nJSON: {args.out}")
    C.write_docs(args, {"Scorers on real data": (
        f"Generated {time.strftime('%Y-%m-%d')} by `{C.command('real', argv)}` on {C.machine()}; total wall time "
        f"{elapsed / 60:.0f} min. Intervals: 95 % percentile bootstrap over test requests ({args.n_boot} replicates, "
        f"seed {args.seed}); Δ columns: paired bootstrap difference to the LightGBM row (* = significant at 5 %). "
        "`empty=\"skip\"`; calibration on label > 0; † = not a probability by design. Fit times on a shared "
        "machine: compare the ratios within a table, not the seconds.\n\n" + "\n\n".join(texts))}, failures=failures)


if __name__ == "__main__":
    main()
