"""Default regularisation judged across world families: shipped scorers against a tuned plain FM.

Each world (:mod:`hybridrank.data.worlds`, ``base`` or ``longtail`` family, fields pinned with
``--pin``) is written and split as ``benchmarks.worlds`` does (the shipped
``conf/data/clicklog.yaml`` split: the latest 20 % of sessions test, validation drawn by hash
before them). Every variant (hydra overrides on top of the shipped click-log run: position not a
feature, so ``position_bias=auto`` builds the tower) is trained in-process with
:func:`hybridrank.cli.train.train` on the same loaded splits, its kept checkpoint scored on test
without calibrator or level trend (the model itself), and compared with the world's truth:

- ``excess``: test log loss at the logged slots against ``true_p`` minus the Bayes limit;
  ``excess_new`` / ``excess_seen``: the same on impressions of users unseen / seen in training;
- ``ndcg_gap``: oracle NDCG@10 minus the model's, true slot-1 CTR as linear gain;
- ``ll`` / ``base_ll``: test log loss against the clicks, and that of the training click rate;
- ``epochs``, ``best_epoch``, ``steps`` (optimizer steps of the fit).

Per-request sums of the excess are kept so that two variants compare with a paired standard
error. ``--grid`` adds the plain FM of ``benchmarks.baselines`` over an L2 x learning-rate grid,
the setting with the lowest validation log loss reported as ``grid_best``.

    python -m benchmarks.defaults run --family longtail --seeds 8200-8209 \
        --variant fm="model=fm;loss=bce" --variant mlp="loss=bce" --grid --out results/d.jsonl
    python -m benchmarks.defaults table results/d.jsonl --against grid_best

Rows are appended to the ``--out`` JSON-lines file as they finish; a rerun skips rows already
there (same world, pins and overrides).
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from benchmarks import common as C
from benchmarks.baselines import LGBM_PARAMS, fit_lightgbm, fit_reference_fm
from benchmarks.common import parse_pin as _pin
from benchmarks.common import quiet
from benchmarks.common import xent as _xent
from benchmarks.grid import compose_config, load_splits, train_hybrid, train_run
from benchmarks.worlds import _ndcg10, prepare_world
from benchmarks.worlds import world_overrides as _overrides

#: The plain FM's grid: per-example L2 on the rows used x Adam learning rate (dim 8, batch 1024).
GRID = [{"l2": l2, "lr": lr} for l2 in (1e-4, 1e-2, 0.1, 0.3, 1.0) for lr in (1e-3, 3e-3)]
#: the first grid (the gap measurement on worlds 8200-8209): two more L2 values
GRID14 = [{"l2": l2, "lr": lr} for l2 in (1e-4, 1e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0) for lr in (1e-3, 3e-3)]


def parse_seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b) + 1) if b else [int(a)])
    return out


def parse_variant(text: str) -> tuple[str, list[str]]:
    """``name=override;override`` (``;`` separates overrides, which may hold commas)."""
    name, _, rest = text.partition("=")
    return name, [o for o in rest.split(";") if o]


# ----------------------------------------------------------------------------------------------
# figures of one set of predictions
# ----------------------------------------------------------------------------------------------
def figures(p_logged: np.ndarray, p_ref: np.ndarray, truth: Mapping[str, np.ndarray],
            offsets: np.ndarray) -> dict[str, Any]:
    """The row's figures; ``truth``: ``true_p``, ``true_p_ref``, ``y``, ``new`` (unseen user),
    ``base`` (training click rate), aligned with the predictions, rows grouped by request."""
    tp, y, new = truth["true_p"], truth["y"], truth["new"]
    excess = _xent(p_logged, tp) - _xent(tp, tp)
    per_req = np.add.reduceat(excess, offsets[:-1])
    ll = _xent(p_logged, y)
    out = {"excess": float(excess.mean()), "ll": float(ll.mean()),
           "base_ll": float(_xent(np.full_like(y, truth["base"]), y).mean()),
           "ndcg_gap": _ndcg10(truth["true_p_ref"], truth["true_p_ref"], offsets)
           - _ndcg10(p_ref, truth["true_p_ref"], offsets),
           "pcoc": float(p_ref.sum() / truth["true_p_ref"].sum()),
           "new_share": float(new.mean()), "n_test": int(y.size), "req_excess": [round(float(v), 7) for v in per_req]}
    for name, m in (("excess_new", new), ("excess_seen", ~new)):
        out[name] = float(excess[m].mean()) if m.any() else None
    return out


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


# ----------------------------------------------------------------------------------------------
# one world: load once, train every variant on it
# ----------------------------------------------------------------------------------------------
class WorldRun:
    """A prepared world, its splits loaded once, and its truth aligned with the test split."""

    def __init__(self, seed: int, family: str, size: str, pins: Mapping[str, Any], work: Path):
        import hydra

        self.seed, self.family, self.size, self.pins = seed, family, size, dict(pins)
        self.w = prepare_world(seed, work, size=size, family=family, pins=pins)
        world = self.w.world
        self.base_overrides = _overrides(world, self.w.dir / "log.parquet", False)
        cfg = compose_config(self.base_overrides)
        self.splits = hydra.utils.instantiate(cfg.data.source).load()
        test = self.splits.test
        cols = world.columns
        lengths = test.lengths.numpy()
        keys = pl.DataFrame({"__r": np.repeat(np.asarray(test.request_key), lengths),
                             "__i": np.asarray(test.item_key)})
        frame = self.w.test.select(pl.col(cols["request"]).alias("__r"), pl.col(cols["item"]).alias("__i"),
                                      "true_p", "true_p_ref")
        keys = keys.with_columns(pl.col("__r").cast(frame["__r"].dtype), pl.col("__i").cast(frame["__i"].dtype))
        joined = keys.join(frame, on=["__r", "__i"], how="left", maintain_order="left")
        if joined["true_p_ref"].null_count():
            raise RuntimeError(f"world {seed}: test rows without truth after the join")
        user_col = self.splits.schema.categorical.index(cols["user"])
        train_y = self.splits.train.label.numpy()
        self.truth = {"true_p": joined["true_p"].to_numpy(), "true_p_ref": joined["true_p_ref"].to_numpy(),
                      "y": (test.label.numpy() > 0).astype(np.float64),
                      "new": test.cat[:, user_col].numpy() == 0, "base": float((train_y > 0).mean())}
        self.offsets = test.offsets.numpy()

    def describe(self) -> str:
        return self.w.world.spec.describe()

    def hybrid(self, overrides: Sequence[str]) -> dict[str, Any]:
        from hybridrank.models.ranker import HybridRanker

        with tempfile.TemporaryDirectory(prefix="bench-defaults-") as tmp:
            result = train_run([*self.base_overrides, "test_after_fit=false", *overrides], tmp, splits=self.splits)
            best = result["best_checkpoint"]
            model = HybridRanker.load_from_checkpoint(best, map_location="cpu", weights_only=True).eval()
            import torch

            step = int(torch.load(best, map_location="cpu", weights_only=False)["global_step"])
        tower = model.position_bias is not None
        z_logged = model.predict_split(self.splits.test, at_logged_position=tower)[0].double().numpy()
        z_ref = model.predict_split(self.splits.test)[0].double().numpy()
        tr = result["training"]
        row = figures(_sigmoid(z_logged), _sigmoid(z_ref), self.truth, self.offsets)
        # steps per epoch from the kept checkpoint (global_step after best_epoch epochs)
        per_epoch = step / tr["best_epoch"] if tr.get("best_epoch") else math.nan
        row.update(epochs=tr["epochs"], best_epoch=tr["best_epoch"], steps=round(per_epoch * tr["epochs"]),
                   val_ll=float(result["val"]["val/logloss"]), tower=tower,
                   stop=str(tr["stopped_because"])[:40])
        return row

    def lightgbm(self) -> dict[str, Any]:
        """LightGBM binary, early stopped on validation log loss (``benchmarks.baselines.fit_lightgbm``,
        its shared settings), with ``log(position)`` as a feature."""
        from dataclasses import replace
        from types import SimpleNamespace

        import torch

        def with_position(d):
            return replace(d, num=torch.cat([d.num, d.position.float().log()[:, None]], dim=1))

        s = self.splits
        test = with_position(s.test)
        slot1 = test.num.clone()
        slot1[:, -1] = 0.0  # log(1): the test rows again, scored at slot 1
        both = SimpleNamespace(num=torch.cat([test.num, slot1]), cat=torch.cat([test.cat, test.cat]),
                               label=torch.cat([test.label, test.label]),
                               lengths=torch.cat([test.lengths, test.lengths]))
        val = with_position(s.val)
        r = fit_lightgbm("binary", SimpleNamespace(train=with_position(s.train), val=val, test=both),
                         LGBM_PARAMS)
        z = r["z_test"].double().numpy()
        n = test.n_impressions
        row = figures(_sigmoid(z[:n]), _sigmoid(z[n:]), self.truth, self.offsets)
        y_val = (val.label.numpy() > 0).astype(np.float64)
        row.update(best_iteration=r["best_iteration"],
                   val_ll=float(np.mean(_xent(_sigmoid(r["z_val"].double().numpy()), y_val))))
        return row

    def reference(self, grid: Sequence[Mapping[str, float]]) -> list[dict[str, Any]]:
        world = self.w.world
        cols = dict(world.columns)
        cols["numeric"] = [c for c in cols["numeric"] if c != cols["position"]]
        test = self.w.test
        # the reference scores the test frame in its own order: put the truth in that order
        order = self._frame_order(test)
        rows = []
        for g in grid:
            predict = fit_reference_fm(self.w.train, self.w.val, cols, **g)
            logged, ref = predict(test, slot=None)[order], predict(test, slot=1)[order]
            row = figures(logged, ref, self.truth, self.offsets)
            row.update(variant=f"ref l2={g['l2']:g} lr={g['lr']:g}", epochs=predict.epochs,
                       val_ll=float(predict.best_val_log_loss), setting=dict(g))
            rows.append(row)
        return rows

    def _frame_order(self, test: pl.DataFrame) -> np.ndarray:
        """Row indices of ``test`` in the test split's order (request, item keys)."""
        cols = self.w.world.columns
        split = self.splits.test
        keys = pl.DataFrame({"__r": np.repeat(np.asarray(split.request_key), split.lengths.numpy()),
                             "__i": np.asarray(split.item_key)})
        frame = test.select(pl.col(cols["request"]).alias("__r"), pl.col(cols["item"]).alias("__i")) \
            .with_row_index("__k")
        keys = keys.with_columns(pl.col("__r").cast(frame["__r"].dtype), pl.col("__i").cast(frame["__i"].dtype))
        return keys.join(frame, on=["__r", "__i"], how="left", maintain_order="left")["__k"].to_numpy()


# ----------------------------------------------------------------------------------------------
# the run and its tables
# ----------------------------------------------------------------------------------------------
def _key(seed: int, family: str, size: str, pins: Mapping[str, Any], variant: str, overrides: Sequence[str]) -> str:
    return json.dumps([seed, family, size, sorted(pins.items()), variant, list(overrides)], default=str)


def run(a: argparse.Namespace) -> int:
    import torch

    quiet()
    torch.set_num_threads(a.threads)  # one per process: the machine is shared
    pins = dict(_pin(x) for x in a.pin)
    variants = [parse_variant(v) for v in a.variant]
    done = set()
    if a.out.exists():
        done = {r["key"] for r in map(json.loads, a.out.read_text().splitlines()) if r.get("key")}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-defaults-worlds-") as tmp:
        for seed in parse_seeds(a.seeds):
            todo = [(n, o) for n, o in variants if _key(seed, a.family, a.size, pins, n, o) not in done]
            grid = GRID14 if a.grid14 else GRID
            gkey = _key(seed, a.family, a.size, pins, "grid", [json.dumps(grid)])
            if _key(seed, a.family, a.size, pins, "grid", [json.dumps(GRID14)]) in done:
                gkey = _key(seed, a.family, a.size, pins, "grid", [json.dumps(GRID14)])  # holds GRID
            if not todo and (not a.grid or gkey in done):
                continue
            wr = WorldRun(seed, a.family, a.size, pins, Path(tmp))
            print(f"# {wr.describe()}", flush=True)
            head = {"seed": seed, "family": a.family, "size": a.size, "pins": pins,
                    "impressions": wr.w.world.frame.height, "describe": wr.describe()}
            for name, overrides in todo:
                t0 = time.perf_counter()
                fig = wr.lightgbm() if name == "lgbm" else wr.hybrid(overrides)
                row = {**head, "variant": name, "overrides": overrides,
                       "key": _key(seed, a.family, a.size, pins, name, overrides), **fig}
                _append(a.out, row)
                n = row.get("epochs", row.get("best_iteration"))
                print(f"  {name}: excess {row['excess']:.5f} ndcg_gap {row['ndcg_gap']:.4f} epochs {n} "
                      f"({time.perf_counter() - t0:.0f} s under load)", flush=True)
            if a.grid and gkey not in done:
                for row in wr.reference(grid):
                    _append(a.out, {**head, **row, "key": None})
                _append(a.out, {**head, "variant": "grid_done", "key": gkey})
                print("  grid done", flush=True)
    return 0


def _append(path: Path, row: Mapping[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(row, default=str) + "\n")


def load_rows(paths: Sequence[Path]) -> dict[tuple, dict[str, dict]]:
    """``{(family, seed, pins): {variant: row}}``; the grid's best by validation log loss is
    added as ``grid_best``."""
    worlds: dict[tuple, dict[str, dict]] = {}
    for path in paths:
        for r in map(json.loads, path.read_text().splitlines()):
            if r["variant"] == "grid_done":
                continue
            k = (r["family"], r["seed"], json.dumps(r.get("pins", {}), sort_keys=True), r.get("size"))
            worlds.setdefault(k, {})[r["variant"]] = r
    for rows in worlds.values():
        grid = [r for v, r in rows.items() if v.startswith("ref ")]
        if grid:
            rows["grid_best"] = min(grid, key=lambda r: r["val_ll"])
            ten = [r for r in grid if r["setting"] in GRID]
            rows["grid10_best"] = min(ten, key=lambda r: r["val_ll"])
    return worlds


def paired(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[float, float]:
    """Mean difference of the excess per impression (``a - b``) and its standard error from the
    per-request sums (requests independent)."""
    d = np.asarray(a["req_excess"]) - np.asarray(b["req_excess"])
    n = int(a["n_test"])
    return float(d.sum() / n), float(np.std(d, ddof=1) * math.sqrt(d.size) / n)


def table(a: argparse.Namespace) -> int:
    worlds = load_rows(a.files)
    variants = a.variants.split(",") if a.variants else sorted({v for rows in worlds.values() for v in rows
                                                                if not v.startswith("ref ")})
    ref = a.against
    print(f"excess over Bayes (ratio to {ref}), NDCG@10 gap (minus {ref}'s); epochs")
    print("| world | " + " | ".join(variants) + " |")
    print("|---" * (len(variants) + 1) + "|")
    wins = {v: [0, 0, 0] for v in variants}
    for k, rows in sorted(worlds.items()):
        cells = []
        r0 = rows.get(ref)
        for v in variants:
            r = rows.get(v)
            if r is None:
                cells.append("-")
                continue
            if r0 is None:
                cells.append(f"{r['excess']:.5f}, {r['ndcg_gap']:.4f}")
                continue
            ratio = r["excess"] / r0["excess"] if r0["excess"] > 0 else math.inf
            dn = r["ndcg_gap"] - r0["ndcg_gap"]
            wins[v][0] += ratio <= 1.02
            wins[v][1] += dn <= 0.005
            wins[v][2] += 1
            cells.append(f"{r['excess']:.5f} ({ratio:.3f}), {dn:+.4f}; {r.get('epochs', '-')}")
        print(f"| {k[0]} {k[1]} | " + " | ".join(cells) + " |")
    if any(w[2] for w in wins.values()):
        print("| within 1.02x / NDCG within 0.005 | " + " | ".join(
            f"{w[0]}/{w[2]}, {w[1]}/{w[2]}" for w in wins.values()) + " |")
    return 0


#: Real logs (``$HYBRIDRANK_REAL_DATA``): name -> data overrides. Labels > 0 are clicks.
OB = "${paths.data_dir}/clicklogs/open_bandit_dataset_sample"
REAL = {
    "mslr": ["data=mslr"],
    **{f"mq2008_fold{k}": ["data=letor_mq2008"] + [f"data.source.{p}=${{paths.data_dir}}/letor/MQ2008/"
                                                   f"Fold{k}/{f}.txt" for p, f in
                                                   (("train", "train"), ("val", "vali"), ("test", "test"))]
       for k in (1, 2)},
    **{f"open_bandit_{pol}_{c}": ["data=open_bandit", f"data.source.path={OB}/{pol}/{c}/{c}.csv"]
       for pol in ("random", "bts") for c in ("all", "men", "women")},
}


def real(a: argparse.Namespace) -> int:
    """Every scorer at its defaults (``loss=bce``) and LightGBM binary on the real logs: test log
    loss against the clicks, beside the training click rate's."""
    quiet()
    C.data_root()
    rows = []
    for name in a.datasets:
        splits = load_splits(REAL[name])
        y = (splits.test.label.numpy() > 0).astype(np.float64)
        base = float((splits.train.label.numpy() > 0).mean())
        out = {"dataset": name, "rows": [splits.train.n_impressions, splits.val.n_impressions, y.size],
               "base_ll": float(_xent(np.full_like(y, base), y).mean()), "ll": {}, "epochs": {}}
        r = fit_lightgbm("binary", splits, LGBM_PARAMS)
        out["ll"]["lgbm"] = float(_xent(_sigmoid(r["z_test"].double().numpy()), y).mean())
        for model in a.models:
            run = train_hybrid([*REAL[name], f"model={model}", "loss=bce", *a.extra], splits=splits)
            p = _sigmoid(run.z_test.double().numpy())
            out["ll"][model] = float(_xent(p, y).mean())
            out["epochs"][model] = run.result["training"]["epochs"]
            out.setdefault("pcoc", {})[model] = float(p.sum() / max(y.sum(), 1.0))
        print(json.dumps(out), flush=True)
        rows.append(out)
    if a.out:
        a.out.write_text(json.dumps(rows, indent=1))
    models = ["lgbm", *a.models]
    print("| data | base rate | " + " | ".join(models) + " |")
    print("|---" * (len(models) + 2) + "|")
    for r in rows:
        print(f"| {r['dataset']} | {r['base_ll']:.4f} | " + " | ".join(
            f"{r['ll'][m]:.4f}" + (f" ({r['epochs'][m]})" if m in r["epochs"] else "") for m in models) + " |")
    return 0


def compare(a: argparse.Namespace) -> int:
    """Each variant against its baseline (the variant named by its prefix before ``_``: ``fm_f10``
    against ``fm``) on the worlds both ran: per world the paired difference of the excess with
    its standard error over requests; the table counts worlds better / worse by 2 SE."""
    worlds = load_rows(a.files)
    names = sorted({v for rows in worlds.values() for v in rows if "_" in v and not v.startswith(("ref ", "grid"))})
    print("| variant | worlds | excess ratio to baseline: mean (min-max) | better / worse by 2 SE | "
          "NDCG@10 gap minus baseline's: mean | epochs: mean (baseline's) |")
    print("|---|---|---|---|---|---|")
    for v in names:
        base = v.split("_")[0]
        pairs = [(rows[v], rows[base]) for rows in worlds.values() if v in rows and base in rows]
        if not pairs:
            continue
        ratios = [x["excess"] / y["excess"] for x, y in pairs]
        diffs = [paired(x, y) for x, y in pairs]
        better = sum(d < -2 * se for d, se in diffs)
        worse = sum(d > 2 * se for d, se in diffs)
        dn = np.mean([x["ndcg_gap"] - y["ndcg_gap"] for x, y in pairs])
        ep = np.mean([x.get("epochs") or np.nan for x, _ in pairs])
        ep0 = np.mean([y.get("epochs") or np.nan for _, y in pairs])
        print(f"| {v} | {len(pairs)} | {np.mean(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) | "
              f"{better} / {worse} | {dn:+.4f} | {ep:.1f} ({ep0:.1f}) |")
    return 0


def parser() -> argparse.ArgumentParser:
    ap = C.parser("benchmarks.defaults", __doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--seeds", required=True, help="e.g. 8200-8209 or 1,5,9")
    r.add_argument("--family", default="longtail", choices=("base", "longtail"))
    r.add_argument("--size", default="small", choices=("tiny", "small"))
    r.add_argument("--pin", nargs="*", default=[], metavar="FIELD=VALUE")
    r.add_argument("--variant", action="append", default=[], metavar="NAME=OVERRIDE;OVERRIDE",
                   help="a hybridrank run with these overrides; the name lgbm: LightGBM binary")
    r.add_argument("--grid", action="store_true", help="the plain FM over GRID")
    r.add_argument("--grid14", action="store_true", help="the 14-setting grid GRID14 instead")
    r.add_argument("--threads", type=int, default=1, help="torch threads of this process")
    r.add_argument("--out", type=Path, required=True)
    t = sub.add_parser("table")
    t.add_argument("files", nargs="+", type=Path)
    t.add_argument("--against", default="grid_best")
    t.add_argument("--variants", default=None)
    c = sub.add_parser("compare")
    c.add_argument("files", nargs="+", type=Path)
    e = sub.add_parser("real")
    e.add_argument("--datasets", nargs="+", default=["mslr", "open_bandit_random_all", "open_bandit_bts_all",
                                                     "mq2008_fold1"], choices=sorted(REAL))
    e.add_argument("--models", nargs="+", default=["linear", "mlp", "fm", "deepfm", "dcnv2"])
    e.add_argument("--extra", nargs="*", default=[], help="hydra overrides for every hybridrank run")
    e.add_argument("--out", type=Path, default=None)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    a = parser().parse_args(argv)
    return {"run": run, "table": table, "real": real, "compare": compare}[a.cmd](a)


if __name__ == "__main__":
    raise SystemExit(main())
