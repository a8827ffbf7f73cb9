"""Sweep the pointwise / ranking mixing weight of each hybrid loss: ordering vs calibration.

For every hybrid (``bce_softmax``, ``bce_calibrated_softmax``, ``rcr``, ``jrc``, ``bce_ranknet``) and
every ``point_weight`` w, train with ``model.loss.point_weight=w`` and the ranking term's weight
``1 - w`` (hydra overrides of ``conf/loss/<name>.yaml``), then record the test NDCG@10, ECE
(15 quantile bins) and log loss. w = 1 is pure BCE (trained once and shared by the one-logit
hybrids; JRC's w = 1 is BCE on its two-logit head), w = 0 pure ranking.

Datasets: ``sim`` (the click-log simulator, fewer users than the default to stay quick; it knows
the true click probability, so the plots also show the oracle's NDCG and the Bayes log loss) and
``mq2008`` (MQ2008 Fold1 with ``experiment=letor``; early stopping on its validation part).

Writes ``results/pareto_<dataset>.json`` and ``.png`` (NDCG@10 vs ECE and vs log loss) and, with
``--write-docs`` after a complete run (7 weights, every hybrid, no ``--quick``), a summary table
into ``docs/BENCHMARKS.md``.

Usage::

    python scripts/pareto.py --write-docs        # both datasets, 7 weights (~15-20 min)
    python scripts/pareto.py --quick             # 3 weights, fewer simulated users
    python scripts/pareto.py --datasets mq2008   # one dataset (run two in parallel on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import math
import time

import _common as C
import torch

#: hybrid loss config -> the name of its ranking term in ``terms:``
HYBRIDS = {"bce_softmax": "softmax", "bce_calibrated_softmax": "calibrated_softmax", "rcr": "rcr",
           "jrc": "jrc", "bce_ranknet": "ranknet"}
WEIGHTS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
QUICK_WEIGHTS = (0.0, 0.5, 1.0)
KEYS = ("ndcg@10", "ece", "logloss", "pcoc", "auc")


def dataset_overrides(name: str, quick: bool, sim_users: int | None) -> list[str]:
    if name == "sim":
        users = sim_users or (600 if quick else 1200)
        return ["data=sim", f"data.source.n_users={users}", "trainer.max_epochs=4"]
    if name == "mq2008":
        return ["experiment=letor", *C.fold_overrides(1)]
    raise SystemExit(f"unknown dataset {name!r}")


def run_point(base: list[str], loss: str, w: float) -> dict:
    term = HYBRIDS.get(loss)
    over = [*base, f"loss={loss}"]
    if term is not None:
        over += [f"model.loss.point_weight={w}", f"model.loss.terms.{term}.weight={1.0 - w}"]
    torch.manual_seed(0)
    t0 = time.perf_counter()
    result = C.train_hybrid(over).result
    test = {k.removeprefix("test/"): v for k, v in result["test"].items()}
    return {"loss": loss, "w": w, "seconds": time.perf_counter() - t0,
            **{k: test.get(k, math.nan) for k in KEYS},
            "reference": result.get("reference", {})}


def sweep(name: str, weights, hybrids, base: list[str]) -> dict:
    points = []
    bce_point = None
    for loss in hybrids:
        for w in weights:
            if w == 1.0 and loss != "jrc":  # pure BCE: the same model for every one-logit hybrid
                if bce_point is None:
                    bce_point = run_point(base, "bce", 1.0)
                    print(f"  [{name}] bce (w=1)            ndcg@10 {bce_point['ndcg@10']:.4f} "
                          f"ece {bce_point['ece']:.4f} logloss {bce_point['logloss']:.4f}",
                          flush=True)
                points.append({**bce_point, "loss": loss, "shared_bce": True})
                continue
            pt = run_point(base, loss, w)
            points.append(pt)
            print(f"  [{name}] {loss:<20} w={w:<4} ndcg@10 {pt['ndcg@10']:.4f} ece {pt['ece']:.4f} "
                  f"logloss {pt['logloss']:.4f} ({pt['seconds']:.0f} s)", flush=True)
    reference = next((p["reference"] for p in points if p.get("reference")), {})
    for p in points:
        p.pop("reference", None)
    return {"dataset": name, "overrides": base, "points": points, "reference": reference}


def plot(res: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    oracle = res["reference"].get("oracle (true pCTR)")
    for ax, xkey, xlabel in ((axes[0], "ece", "test ECE (15 quantile bins)"),
                             (axes[1], "logloss", "test log loss")):
        for loss in dict.fromkeys(p["loss"] for p in res["points"]):
            pts = sorted((p for p in res["points"] if p["loss"] == loss), key=lambda p: p["w"])
            line, = ax.plot([p[xkey] for p in pts], [p["ndcg@10"] for p in pts], "o-", ms=4,
                            label=loss, alpha=0.85)
            for p in pts:
                if p["w"] == 0.0:
                    ax.plot(p[xkey], p["ndcg@10"], "X", ms=11, color=line.get_color(), mec="k")
                if p["w"] not in (0.0, 1.0):
                    ax.annotate(f"{p['w']:g}", (p[xkey], p["ndcg@10"]), fontsize=7,
                                xytext=(3, 3), textcoords="offset points")
        bce = next((p for p in res["points"] if p.get("shared_bce")), None)
        if bce:
            ax.plot(bce[xkey], bce["ndcg@10"], "*", ms=18, color="gold", mec="k", zorder=5,
                    label="pure BCE (w = 1)")
        ax.plot([], [], "X", ms=10, color="grey", mec="k", label="pure ranking (w = 0)")
        if oracle:
            ax.axhline(oracle["ndcg@10"], color="k", ls="--", lw=1, label="oracle NDCG@10")
            if xkey == "logloss":
                ax.axvline(oracle["logloss"], color="k", ls=":", lw=1, label="Bayes log loss")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("test NDCG@10 (empty lists skipped)")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8, loc="best")
    fig.suptitle(f"{res['dataset']}: mixing weight w = point_weight (ranking weight 1 - w); "
                 "up and left is better")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def summary_table(res: dict) -> str:
    rows = []
    for p in res["points"]:
        rows.append([p["loss"], f"{p['w']:g}", f"{p['ndcg@10']:.4f}", f"{p['ece']:.4f}",
                     f"{p['logloss']:.4f}", f"{p['pcoc']:.3f}"])
    ref = res["reference"]
    for name, r in ref.items():
        rows.append([f"*{name}*", "", f"{r.get('ndcg@10', math.nan):.4f}",
                     f"{r.get('ece', math.nan):.4f}", f"{r.get('logloss', math.nan):.4f}",
                     f"{r.get('pcoc', math.nan):.3f}"])
    # per hybrid: the weight with the best NDCG@10 among points whose ECE is within 0.005 of the
    # best ECE of that hybrid -- a descriptive reading of the sweep, not a tuned choice
    best_lines = []
    for loss in dict.fromkeys(p["loss"] for p in res["points"]):
        pts = [p for p in res["points"] if p["loss"] == loss]
        ece_min = min(p["ece"] for p in pts)
        ok = [p for p in pts if p["ece"] <= ece_min + 0.005]
        b = max(ok, key=lambda p: p["ndcg@10"])
        top = max(pts, key=lambda p: p["ndcg@10"])
        best_lines.append(f"- {loss}: highest NDCG@10 {top['ndcg@10']:.4f} at w = {top['w']:g} "
                          f"(ECE {top['ece']:.4f}); among near-best-ECE points, w = {b['w']:g} "
                          f"(NDCG@10 {b['ndcg@10']:.4f}, ECE {b['ece']:.4f})")
    return (C.markdown_table(["loss", "w (point weight)", "NDCG@10", "ECE", "log loss", "PCOC"],
                             rows) + "\n\n" + "\n".join(best_lines))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", nargs="+", default=["sim", "mq2008"], choices=["sim", "mq2008"])
    p.add_argument("--hybrids", nargs="+", default=list(HYBRIDS), choices=list(HYBRIDS))
    p.add_argument("--weights", nargs="+", type=float, default=None)
    p.add_argument("--quick", action="store_true", help="3 weights, fewer simulated users")
    p.add_argument("--sim-users", type=int, default=None)
    C.add_docs_options(p)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    C.check_docs_request(args, [why for bad, why in [
        (args.quick, "--quick"), (args.weights is not None, "--weights"),
        (set(args.hybrids) != set(HYBRIDS), "--hybrids"), (args.sim_users is not None, "--sim-users")]
        if bad])
    torch.set_num_threads(args.threads)
    C.quiet()
    weights = tuple(args.weights) if args.weights else (QUICK_WEIGHTS if args.quick else WEIGHTS)
    C.RESULTS.mkdir(exist_ok=True)
    for name in args.datasets:
        if name == "mq2008":
            C.data_root()
        t0 = time.perf_counter()
        print(f"{name}: weights {weights}", flush=True)
        res = sweep(name, weights, args.hybrids,
                    dataset_overrides(name, args.quick, args.sim_users))
        res["seconds"] = time.perf_counter() - t0
        json_path, png_path = C.RESULTS / f"pareto_{name}.json", C.RESULTS / f"pareto_{name}.png"
        json_path.write_text(json.dumps(res, indent=2))
        plot(res, png_path)
        table = summary_table(res)
        print("\n" + table + f"\n\n{json_path}, {png_path} ({res['seconds'] / 60:.1f} min)\n",
              flush=True)
        title = "simulated log" if name == "sim" else "MQ2008 Fold1"
        C.write_docs(args, {f"Pareto: {title}": (
            f"Generated {time.strftime('%Y-%m-%d')} by `python scripts/pareto.py "
            f"--datasets {name} --write-docs` "
            f"(overrides: `{' '.join(o for o in res['overrides'] if 'source.' not in o)}`; "
            f"{res['seconds'] / 60:.1f} min). Plot: `results/pareto_{name}.png`. Test split "
            "metrics, one seed, so differences of ~0.01 NDCG are within noise.\n\n" + table)})


if __name__ == "__main__":
    main()
