"""Does the model converge to the truth? The simulator at 1x, 4x and 16x the default data.

The built-in simulator (``hybridrank/simulate.py``) knows every impression's true click
probability, so each test split has two fixed references: the **oracle** (the true pCTR: the Bayes
log loss, the best NDCG@10 in expectation) and the **base rate** (the test split's click rate for
every impression). A scorer that can represent the true model should close its gap to the oracle
as the data grows; this script measures whether it does.

Data sizes: ``data.source.sessions_per_user`` = 3 x size (1x is the default, 3), so every user
brings ``size`` times as many requests; users (2,500), items (1,000), categories, slate sizes,
the CTR target and the simulator seed are the defaults at every size, and so is the latent world
(user and item vectors, effects), which is drawn before the sessions. The split is the default
one (by time, whole sessions: the last 10 % of sessions are validation, the last 20 % test), so
the test split grows with the data too and each size has its own oracle.

Rows (every one scored by the same code, :mod:`hybridrank.metrics.uncertainty` over the test requests):

- hybridrank scorers ``mlp``, ``fm``, ``deepfm``, ``dcnv2``, ``list_aware`` trained with
  ``loss=bce`` (pure pointwise: the question here is whether the scorer reaches the true
  probability), each with the setting of :data:`SETTINGS` (chosen on the 1x and 4x validation
  splits by ``--tune``; the same setting at every size), early stopping and checkpoint choice on
  the validation log loss;
- ``default mlp``: the out-of-the-box model of the README when this benchmark was written
  (``model=mlp loss=bce_softmax``, 3 epochs; the default loss is ``bce`` since 2026-11-27), the
  reference of the goal;
- LightGBM ``binary`` (early stopping on the validation log loss) and ``lambdarank`` (on the
  validation NDCG@10), numeric features plus the categorical ids as LightGBM categorical
  features, settings from :data:`LGBM_PARAMS` (also chosen by ``--tune``);
- the oracle and the base rate.

Per row: test log loss and its gap to Bayes (paired bootstrap against the oracle), NDCG@10 and
its gap to the oracle, ECE (15 quantile bins) and PCOC, 95 % percentile intervals over test
requests (seeded), fit time and its ratio to LightGBM binary's in the same run. The best hybridrank
scorer *by validation log loss* is compared with LightGBM, paired, and the goal is checked.

Usage::

    python scripts/bench_convergence.py --quick          # smoke test (~3 min): small data
    python scripts/bench_convergence.py --write-docs     # 1x, 4x, 16x (hours on 2 cores)
    python scripts/bench_convergence.py --sizes 1 4 --models mlp deepfm lgbm_binary
    python scripts/bench_convergence.py --tune           # the validation grid (writes its own JSON)

Writes ``results/convergence.json`` (``--out``) and prints Markdown tables; ``--write-docs``
rewrites the "Convergence" section of ``docs/BENCHMARKS.md``, only from a complete run (the
default sizes and models, no ``--quick``).
"""

from __future__ import annotations

import os

# Before torch and LightGBM load OpenMP: idle OpenMP threads sleep instead of spinning. On a
# shared, oversubscribed machine spinning threads slowed LightGBM (2 threads) up to 100x in the
# same run (MQ2008 fold 1: 82 s vs 0.6 s), which would make any time ratio meaningless.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import _common as C  # noqa: E402
import torch  # noqa: E402

HYBRID = ("mlp", "fm", "deepfm", "dcnv2", "list_aware")
LGBM = ("lgbm_binary", "lgbm_lambdarank")
DEFAULT = "default_mlp"
ALL_MODELS = (*HYBRID, DEFAULT, *LGBM)
LOSS = "bce"
#: the trainer of every tuned hybridrank row: at most this many epochs, early stopping on the
#: validation log loss with patience 2 (the checkpoint of the best epoch is scored)
TRAINER = ["trainer.max_epochs=12", "callbacks.early_stopping.patience=2"]

#: Per-scorer settings, chosen on VALIDATION log loss by ``--tune`` (results/convergence_tune.json;
#: the grid and the choice are in docs/BENCHMARKS.md). The same setting at every size.
SETTINGS: dict[str, list[str]] = {
    "mlp": ["optimizer=adam", "model.optimizer.weight_decay=0.0001", "data.budget=1024"],
    "fm": ["optimizer=adam", "model.optimizer.lr=0.01"],
    "deepfm": ["optimizer=adam", "model.optimizer.lr=0.005", "model.optimizer.weight_decay=0.0001"],
    "dcnv2": ["optimizer=adam", "model.optimizer.weight_decay=0.0001", "data.budget=1024"],
    "list_aware": ["optimizer=adam", "model.optimizer.lr=0.005",
                   "model.optimizer.weight_decay=0.0001"],
}
#: LightGBM: what every setting shares (bench_letor.py's settings; LightGBM's own defaults for
#: the categorical options), and the setting chosen on validation by ``--tune`` (both objectives)
LGBM_BASE = dict(learning_rate=0.05, num_leaves=31, min_data_in_leaf=20, num_threads=2, seed=0,
                 deterministic=True, force_row_wise=True, verbose=-1)
LGBM_PARAMS = {**LGBM_BASE, **dict(num_leaves=15, min_data_in_leaf=200, cat_smooth=200, cat_l2=200,
                                   min_data_per_group=200)}
LGBM_ROUNDS, LGBM_PATIENCE = 3000, 50

LABELS = {"mlp": "hybridrank mlp", "fm": "hybridrank fm", "deepfm": "hybridrank deepfm",
          "dcnv2": "hybridrank dcnv2", "list_aware": "hybridrank list_aware",
          DEFAULT: "default mlp (bce_softmax, 3 epochs)", "lgbm_binary": "LightGBM binary",
          "lgbm_lambdarank": "LightGBM lambdarank", "oracle": "oracle (true pCTR)",
          "base_rate": "base rate",
          "no_interaction": "*reference:* true model without its user-item term",
          "reference_mf": "*reference:* well-specified MF (not a hybridrank scorer)"}
REFERENCES = ("no_interaction", "reference_mf")
#: scores that are not probabilities by design: calibration columns flagged
UNCALIBRATED = {"lgbm_lambdarank"}
METRICS = ("logloss", "ndcg@10", "ece", "pcoc")

# ----------------------------------------------------------------------------------------------
# the validation grid of --tune
# ----------------------------------------------------------------------------------------------
_OPT = {
    "adam lr2e-3": ["optimizer=adam"],  # the default optimizer
    "adam lr1e-3": ["optimizer=adam", "model.optimizer.lr=0.001"],
    "adam lr5e-3": ["optimizer=adam", "model.optimizer.lr=0.005"],
    "adamw wd0.01": ["optimizer=adamw", "model.optimizer.weight_decay=0.01"],
    "adamw wd0.1": ["optimizer=adamw", "model.optimizer.weight_decay=0.1"],
    "adam l2 1e-6": ["optimizer=adam", "model.optimizer.weight_decay=0.000001"],
    "adam l2 1e-4": ["optimizer=adam", "model.optimizer.weight_decay=0.0001"],
    "adamw wd1": ["optimizer=adamw", "model.optimizer.weight_decay=1.0"],
}
_SCORER = {
    "mlp": {"emb8": ["model.scorer.emb_dim=8"], "emb32": ["model.scorer.emb_dim=32"],
            "drop0.2": ["model.scorer.dropout=0.2"]},
    "fm": {"emb8": ["model.scorer.emb_dim=8"], "emb32": ["model.scorer.emb_dim=32"]},
    "deepfm": {"emb8": ["model.scorer.emb_dim=8"], "emb32": ["model.scorer.emb_dim=32"],
               "drop0.2": ["model.scorer.dropout=0.2"]},
    "dcnv2": {"emb8": ["model.scorer.emb_dim=8"], "emb32": ["model.scorer.emb_dim=32"],
              "drop0.2": ["model.scorer.dropout=0.2"]},
    "list_aware": {"drop0.2": ["model.scorer.dropout=0.2"]},
}
#: stage 2, around stage 1's best (Adam with L2 1e-4 on every parameter): learning rate, L2
#: strength, batch size (impressions per batch, 4x the steps) and embedding size combined
_OPT2 = {
    "adam l2 1e-5": ["optimizer=adam", "model.optimizer.weight_decay=0.00001"],
    "adam l2 1e-3": ["optimizer=adam", "model.optimizer.weight_decay=0.001"],
    "adam lr5e-3 l2 1e-4": ["optimizer=adam", "model.optimizer.lr=0.005",
                            "model.optimizer.weight_decay=0.0001"],
    "adam lr1e-2": ["optimizer=adam", "model.optimizer.lr=0.01"],
    "adam lr1e-2 l2 1e-4": ["optimizer=adam", "model.optimizer.lr=0.01",
                            "model.optimizer.weight_decay=0.0001"],
    "adam l2 1e-4 budget1024": ["optimizer=adam", "model.optimizer.weight_decay=0.0001",
                                "data.budget=1024"],
    "adam l2 1e-4 emb8": ["optimizer=adam", "model.optimizer.weight_decay=0.0001",
                          "model.scorer.emb_dim=8"],
}
#: list_aware costs ~5-15x the MLP per epoch: a smaller grid
_LIST_AWARE_OPT = ("adam lr2e-3", "adam lr1e-3", "adamw wd0.1", "adamw wd1", "adam l2 1e-4",
                   "adam lr5e-3 l2 1e-4")


def tune_grid(model: str) -> dict[str, list[str]]:
    """name -> overrides: stage 1, the optimizer settings (default scorer) and scorer options
    (default optimizer); stage 2, combinations around stage 1's best. list_aware gets a smaller
    grid (:data:`_LIST_AWARE_OPT`)."""
    grid = {k: v for k, v in _OPT.items() if model != "list_aware" or k in _LIST_AWARE_OPT}
    grid.update({k: ["optimizer=adam", *v] for k, v in _SCORER[model].items()})
    grid.update({k: v for k, v in _OPT2.items() if model != "list_aware" or k in _LIST_AWARE_OPT})
    return grid


LGBM_GRID = {
    "lr0.05 leaves31": dict(learning_rate=0.05, num_leaves=31, min_data_in_leaf=20),
    "lr0.05 leaves127": dict(learning_rate=0.05, num_leaves=127, min_data_in_leaf=20),
    "lr0.05 leaves31 minleaf200": dict(learning_rate=0.05, num_leaves=31, min_data_in_leaf=200),
    "lr0.1 leaves31": dict(learning_rate=0.1, num_leaves=31, min_data_in_leaf=20),
    "lr0.05 leaves31 catsmooth50": dict(learning_rate=0.05, num_leaves=31, min_data_in_leaf=20,
                                        cat_smooth=50, cat_l2=50),
    "lr0.05 leaves31 catsmooth200": dict(learning_rate=0.05, num_leaves=31, min_data_in_leaf=20,
                                         cat_smooth=200, cat_l2=200, min_data_per_group=200),
    "lr0.05 leaves31 ids numeric": dict(learning_rate=0.05, num_leaves=31, min_data_in_leaf=20,
                                        categorical=False),
    "lr0.02 leaves31 catsmooth200": dict(learning_rate=0.02, num_leaves=31, min_data_in_leaf=20,
                                         cat_smooth=200, cat_l2=200, min_data_per_group=200),
    "lr0.05 leaves15 minleaf200 catsmooth200": dict(learning_rate=0.05, num_leaves=15,
                                                    min_data_in_leaf=200, cat_smooth=200,
                                                    cat_l2=200, min_data_per_group=200),
}


# ----------------------------------------------------------------------------------------------
# data and runs
# ----------------------------------------------------------------------------------------------
def sim_overrides(size: int, quick: bool) -> list[str]:
    out = [f"data.source.sessions_per_user={3 * size}"]
    if quick:
        out.append("data.source.n_users=300")
    return out


def describe(splits) -> dict:
    tr = splits.train
    users = int(tr.cat[:, 0].unique().numel())  # user_id is the first categorical column
    out = {"users_in_train": users}
    for name in ("train", "val", "test"):
        d = getattr(splits, name)
        out[name] = {"impressions": d.n_impressions, "requests": d.n_requests,
                     "clicks": int((d.label > 0).sum()),
                     "requests_with_click": int((torch.segment_reduce(
                         (d.label > 0).float(), "sum", lengths=d.lengths) > 0).sum())}
    out["train_clicks_per_user"] = out["train"]["clicks"] / max(users, 1)
    return out


def hybrid_overrides(model: str, quick: bool, extra: list[str] | None = None) -> list[str]:
    if model == DEFAULT:
        base = ["model=mlp", "loss=bce_softmax"]  # the README's default when written: nothing else changed
        return base + (["trainer.max_epochs=1"] if quick else [])
    trainer = ["trainer.max_epochs=2", "callbacks.early_stopping.patience=1"] if quick else TRAINER
    return [f"model={model}", f"loss={LOSS}", *trainer,
            *(SETTINGS[model] if extra is None else extra)]


def run_model(model: str, splits, args, extra=None, lgbm_params=None) -> dict:
    if model in LGBM:
        params = LGBM_PARAMS if lgbm_params is None else {**LGBM_BASE, **lgbm_params}
        rounds = 100 if args.quick else LGBM_ROUNDS
        r = C.fit_lightgbm(model.removeprefix("lgbm_"), splits, params, max_rounds=rounds,
                           patience=LGBM_PATIENCE)
    else:
        run = C.train_hybrid(hybrid_overrides(model, args.quick, extra), splits=splits)
        r = {"fit_seconds": run.result["fit_seconds"], "best_epoch": run.result.get("val_epoch"),
             "z_val": run.z_val, "z_test": run.z_test}
        if "epochs" in run.result:  # epochs trained, where train() reports them
            r["epochs"] = run.result["epochs"]
    val = C.evaluate(splits.val, r["z_val"].float(), empties=("skip",))["skip"]
    r["val"] = {k: val[k] for k in ("logloss", "ndcg@10", "ece", "pcoc") if k in val}
    return r


# ----------------------------------------------------------------------------------------------
# two references that separate what the data allows from what the scorers learn
# ----------------------------------------------------------------------------------------------
def no_interaction_truth(size: int, quick: bool, test) -> torch.Tensor:
    """Logits of the true model WITHOUT its user-item affinity term, on the test impressions.

    The simulator draws every random number whatever ``affinity_scale`` is, so
    ``simulate_clicklog(affinity_scale=0, ...)`` lists the same impressions in the same order
    with ``p_true`` = the true model minus the affinity term (its intercept re-solved to the same
    mean CTR). Test rows are found by (request id, position); their item ids are checked.
    """
    import numpy as np
    from omegaconf import OmegaConf

    from hybridrank.data.simulate import simulate_clicklog

    cfg = C.compose_config(["paths.output_dir=unused", *sim_overrides(size, quick)])
    kw = {k: v for k, v in OmegaConf.to_container(cfg.data.source, resolve=True).items()
          if k not in ("_target_", "split", "label_max", "position_feature", "schema")}
    frame = simulate_clicklog(**{**kw, "affinity_scale": 0.0})
    req = frame["request_id"].to_numpy()
    keys = test.request_key.to_numpy()
    starts = np.searchsorted(req, keys)
    rows = (starts[test.request_of_row().numpy()] + test.position.numpy() - 1).astype(np.int64)
    if not np.array_equal(frame["item_id"].to_numpy()[rows], test.item_key.to_numpy()):
        raise RuntimeError("no_interaction_truth: test rows do not match the simulated frame")
    return torch.logit(torch.from_numpy(frame["p_true"].to_numpy()[rows]), eps=1e-7)


class _ReferenceMF(torch.nn.Module):
    """The simulator's own structure: a rank-8 user . (item + category) product, user / item
    biases, one weight per position and per hour, linear in the other numeric features."""

    def __init__(self, sizes: list[int], n_hours: int, n_numeric: int, base_rate: float, k: int = 8):
        super().__init__()
        emb = torch.nn.Embedding
        self.u, self.i, self.c = emb(sizes[0], k), emb(sizes[1], k), emb(sizes[2], k)
        for e in (self.u, self.i, self.c):
            torch.nn.init.normal_(e.weight, std=0.1)
        self.ub, self.ib = emb(sizes[0], 1), emb(sizes[1], 1)
        self.pb, self.hb = emb(21, 1), emb(n_hours, 1)
        for e in (self.ub, self.ib, self.pb, self.hb):
            torch.nn.init.zeros_(e.weight)
        self.lin = torch.nn.Linear(n_numeric, 1)
        torch.nn.init.zeros_(self.lin.weight)
        torch.nn.init.constant_(self.lin.bias, math.log(base_rate / (1 - base_rate)))

    def forward(self, f):
        u, i, c, pos, hour, x = f
        return ((self.u(u) * (self.i(i) + self.c(c))).sum(1) + self.ub(u)[:, 0] + self.ib(i)[:, 0]
                + self.pb(pos)[:, 0] + self.hb(hour)[:, 0] + self.lin(x)[:, 0])

    def penalty(self, f):
        """Frequency-weighted L2: the squared norms of the rows a batch uses, averaged."""
        u, i, c = f[0], f[1], f[2]
        return ((self.u(u) ** 2).sum(1) + (self.i(i) ** 2).sum(1) + (self.c(c) ** 2).sum(1)
                + self.ub(u)[:, 0] ** 2 + self.ib(i)[:, 0] ** 2).mean()


#: L2 strengths of the reference learner, one chosen per size on the validation log loss
REF_LAMBDAS = (0.0003, 0.001, 0.003, 0.01)


def fit_reference_mf(splits, quick: bool) -> dict:
    """A well-specified reference learner (not a hybridrank scorer): :class:`_ReferenceMF`, Adam
    lr 0.01, batches of 8,192 impressions, early stopping (patience 3) and the L2 strength
    (:data:`REF_LAMBDAS`) on the validation log loss. Shows what the data allows."""
    import torch.nn.functional as F

    names = list(splits.schema.numeric)
    h = names.index("hour")
    other = [j for j, n in enumerate(names) if n not in ("hour", "position")]
    hours = torch.unique(torch.cat([d.num[:, h] for d in (splits.train, splits.val, splits.test)]))
    sizes = [len(splits.schema.vocab[c]) + 1 for c in splits.schema.categorical]

    def feats(d):
        return (d.cat[:, 0], d.cat[:, 1], d.cat[:, 2], d.position.clamp(max=20),
                torch.bucketize(d.num[:, h].contiguous(), hours), d.num[:, other])

    tr, va = feats(splits.train), feats(splits.val)
    y_tr, y_va = (splits.train.label > 0).float(), (splits.val.label > 0).float()
    n = y_tr.numel()
    best: dict = {"val": math.inf}
    t0 = time.perf_counter()
    for lam in (REF_LAMBDAS[:2] if quick else REF_LAMBDAS):
        torch.manual_seed(0)
        m = _ReferenceMF(sizes, hours.numel(), len(other), float(y_tr.mean()))
        opt = torch.optim.Adam(m.parameters(), lr=0.01)
        run_best, bad, state, epoch_best = math.inf, 0, None, 0
        for epoch in range(2 if quick else 60):
            for b in torch.randperm(n).split(8192):
                f = [x[b] for x in tr]
                loss = F.binary_cross_entropy_with_logits(m(f), y_tr[b]) + lam * m.penalty(f)
                opt.zero_grad()
                loss.backward()
                opt.step()
            with torch.no_grad():
                v = F.binary_cross_entropy_with_logits(m(va), y_va).item()
            if v < run_best - 1e-7:
                run_best, bad, epoch_best = v, 0, epoch + 1
                state = {k: t.clone() for k, t in m.state_dict().items()}
            else:
                bad += 1
                if bad >= 3:
                    break
        if run_best < best["val"]:
            m.load_state_dict(state)
            with torch.no_grad():
                best = {"val": run_best, "lambda": lam, "best_epoch": epoch_best,
                        "z_val": m(va).double(), "z_test": m(feats(splits.test)).double()}
    best["fit_seconds"] = time.perf_counter() - t0  # the whole lambda grid
    return best


def _iv(iv) -> dict:
    return {"estimate": iv.estimate, "lower": iv.lower, "upper": iv.upper, "note": iv.note}


def _pr(pr) -> dict:
    return {"a": pr.a, "b": pr.b, "diff": pr.diff, "lower": pr.lower, "upper": pr.upper,
            "p_value": pr.p_value, "verdict": pr.verdict}


def run_size(size: int, models: list[str], args) -> dict:
    from hybridrank.metrics.uncertainty import compare_bootstrap, paired_bootstrap

    t0 = time.perf_counter()
    splits = C.load_splits(sim_overrides(size, args.quick))
    info = describe(splits)
    print(f"\n== {size}x: {info['train']['impressions']:,} train impressions, "
          f"{info['train']['clicks']:,} train clicks ({info['train_clicks_per_user']:.1f} per user); "
          f"test {info['test']['requests']:,} requests, {info['test']['clicks']:,} clicks "
          f"(load {time.perf_counter() - t0:.0f} s)", flush=True)
    runs: dict[str, dict] = {}
    logits: dict[str, torch.Tensor] = {}
    for m in models:
        t = time.perf_counter()
        try:
            r = run_model(m, splits, args)
        except Exception as e:  # one failing scorer must not cost the rest of the table
            print(f"  [{size}x] {m}: FAILED: {type(e).__name__}: {e}", flush=True)
            runs[m] = {"error": f"{type(e).__name__}: {e}"}
            continue
        logits[m] = r.pop("z_test")
        r.pop("z_val")
        runs[m] = r
        print(f"  [{size}x] {m:<16} val logloss {r['val']['logloss']:.5f} ndcg@10 "
              f"{r['val']['ndcg@10']:.4f} | fit {r['fit_seconds']:.0f} s"
              + (f", {r['epochs']} epochs (best {r['best_epoch']})" if "epochs" in r
                 else f", {r['best_iteration']} rounds" if "best_iteration" in r
                 else f", best epoch {r.get('best_epoch')}")
              + f" | wall {time.perf_counter() - t:.0f} s", flush=True)
    test = splits.test
    if args.references:
        t = time.perf_counter()
        logits["no_interaction"] = no_interaction_truth(size, args.quick, test)
        ref = fit_reference_mf(splits, args.quick)
        logits["reference_mf"] = ref.pop("z_test")
        val = C.evaluate(splits.val, ref.pop("z_val").float(), empties=("skip",))["skip"]
        runs["reference_mf"] = {"fit_seconds": ref["fit_seconds"], "lambda": ref["lambda"],
                                "best_epoch": ref["best_epoch"],
                                "val": {k: val[k] for k in ("logloss", "ndcg@10", "ece", "pcoc")}}
        print(f"  [{size}x] references: reference MF lambda {ref['lambda']} val logloss "
              f"{val['logloss']:.5f} | wall {time.perf_counter() - t:.0f} s", flush=True)
    rate = float((test.label > 0).double().mean())
    logits["oracle"] = torch.logit(test.true_p.double(), eps=1e-7)
    logits["base_rate"] = torch.full((test.n_impressions,), math.log(rate / (1 - rate)),
                                     dtype=torch.float64)
    stats = {k: C.split_stats(test, z) for k, z in logits.items()}
    intervals, gaps = compare_bootstrap(stats, baseline="oracle", n_boot=args.n_boot,
                                        seed=args.seed, metrics=list(METRICS))
    out = {"size": size, "data": info, "runs": runs,
           "test": {k: {m: _iv(iv) for m, iv in v.items()} for k, v in intervals.items()},
           "gap": {k: {m: _pr(p) for m, p in v.items()} for k, v in gaps.items()},
           "n_test_positives": stats["oracle"].n_positives,
           "n_test_requests": stats["oracle"].n_requests}
    # the best hybridrank scorer by VALIDATION log loss, compared with LightGBM (paired)
    tuned = [m for m in HYBRID if m in logits]
    if tuned:
        best = min(tuned, key=lambda m: runs[m]["val"]["logloss"])
        out["best"] = best
        cmp = {}
        for lg, metric in (("lgbm_binary", "logloss"), ("lgbm_lambdarank", "ndcg@10")):
            if lg in logits:
                pr = paired_bootstrap(stats[best], stats[lg], n_boot=args.n_boot, seed=args.seed,
                                      metrics=[metric])[metric]
                cmp[lg] = _pr(pr)
        out["best_vs_lgbm"] = cmp
    out["seconds"] = time.perf_counter() - t0
    return out


# ----------------------------------------------------------------------------------------------
# tables
# ----------------------------------------------------------------------------------------------
def _fmt(d: dict | None, digits: int = 4) -> str:
    if not d or d.get("estimate") is None:
        return "n/a"
    if d.get("lower") is None:
        return f"{d['estimate']:.{digits}f} [no interval]"
    return f"{d['estimate']:.{digits}f} [{d['lower']:.{digits}f}, {d['upper']:.{digits}f}]"


def _fmt_gap(d: dict | None, digits: int = 4) -> str:
    if not d or d.get("diff") is None:
        return "n/a"
    if d.get("lower") is None:
        return f"{d['diff']:+.{digits}f}"
    return f"{d['diff']:+.{digits}f} [{d['lower']:+.{digits}f}, {d['upper']:+.{digits}f}]"


def size_table(res: dict) -> str:
    runs, test, gap = res["runs"], res["test"], res["gap"]
    base_time = runs.get("lgbm_binary", {}).get("fit_seconds")
    rows = []
    for m in [*ALL_MODELS, *REFERENCES, "oracle", "base_rate"]:
        if m not in test:
            continue
        flag = " †" if m in UNCALIBRATED else ""
        r = runs.get(m, {})
        secs = r.get("fit_seconds")
        ratio = f"{secs / base_time:.1f}×" if secs and base_time else ""
        fit = ("" if secs is None else f"{secs:.0f}"
               + (f" ({r['best_epoch']}/{r['epochs']} ep)" if "epochs" in r
                  else f" (λ {r['lambda']}, grid of {len(REF_LAMBDAS)})" if "lambda" in r
                  else f" ({r['best_iteration']} rounds)" if "best_iteration" in r
                  else f" (best epoch {r.get('best_epoch')})"))
        g = gap.get(m, {})
        rows.append([LABELS[m], _fmt(test[m]["logloss"]) + flag,
                     "0" if m == "oracle" else _fmt_gap(g.get("logloss")) + flag,
                     _fmt(test[m]["ndcg@10"]), "0" if m == "oracle" else _fmt_gap(g.get("ndcg@10")),
                     _fmt(test[m]["ece"]) + flag, _fmt(test[m]["pcoc"], 3) + flag, fit, ratio])
    d = res["data"]
    head = (f"**{res['size']}x** ({d['train']['impressions']:,} train impressions, "
            f"{d['train']['clicks']:,} train clicks, {d['train_clicks_per_user']:.1f} per user; "
            f"test: {res['n_test_requests']:,} requests, {res['n_test_positives']:,} clicks in "
            f"{d['test']['requests_with_click']:,} requests with a click)\n\n")
    return head + C.markdown_table(
        ["model", "log loss", "gap to Bayes", "NDCG@10", "gap to oracle", "ECE", "PCOC",
         "fit s (best/epochs)", "fit time / LightGBM binary"], rows)


def summary_table(results: list[dict]) -> str:
    """model x size: the two gaps, compact."""
    sizes = [r["size"] for r in results]
    header = ["model"] + [f"log-loss gap {s}x" for s in sizes] + [f"NDCG@10 gap {s}x" for s in sizes]
    rows = []
    for m in [*ALL_MODELS, *REFERENCES, "base_rate"]:
        if not any(m in r["gap"] for r in results):
            continue
        flag = " †" if m in UNCALIBRATED else ""
        rows.append([LABELS[m]]
                    + [_fmt_gap(r["gap"].get(m, {}).get("logloss")) + flag for r in results]
                    + [_fmt_gap(r["gap"].get(m, {}).get("ndcg@10")) for r in results])
    return C.markdown_table(header, rows)


def shrink_lines(results: list[dict]) -> list[str]:
    """Does each model's gap shrink from the smallest to the largest size? Two test sets are
    independent, so the verdict needs the two intervals apart (a conservative check)."""
    if len(results) < 2:
        return []
    a, b = results[0], results[-1]
    lines = []
    for m in [*HYBRID, DEFAULT, *LGBM, "reference_mf"]:
        parts = []
        for metric, name in (("logloss", "log-loss gap"), ("ndcg@10", "NDCG gap")):
            if m in UNCALIBRATED and metric == "logloss":
                continue
            ga, gb = a["gap"].get(m, {}).get(metric), b["gap"].get(m, {}).get(metric)
            if not ga or not gb or ga.get("diff") is None or gb.get("diff") is None:
                continue
            sa, sb = abs(ga["diff"]), abs(gb["diff"])
            lo_a = min(abs(ga["lower"]), abs(ga["upper"])) if ga.get("lower") is not None else sa
            hi_b = max(abs(gb["lower"]), abs(gb["upper"])) if gb.get("lower") is not None else sb
            if hi_b < lo_a:
                verdict = "shrinks (intervals apart)"
            elif sb < sa:
                verdict = "smaller, intervals overlap"
            else:
                verdict = "does NOT shrink"
            parts.append(f"{name} {sa:.4f} -> {sb:.4f} ({100 * (sb - sa) / sa:+.0f} %): {verdict}"
                         if sa > 0 else f"{name} {sa:.4f} -> {sb:.4f}")
        if parts:
            lines.append(f"- {LABELS[m]}, {a['size']}x -> {b['size']}x: " + "; ".join(parts))
    return lines


def goal_lines(results: list[dict]) -> list[str]:
    lines = ["Goal: the best hybridrank scorer (chosen by validation log loss at each size) beats "
             "LightGBM binary on test log loss and LightGBM lambdarank on test NDCG@10 at every "
             "size, and at the largest size closes at least half of the default MLP's log-loss "
             "gap to Bayes."]
    ok_all = ok_sig = True
    for r in results:
        best = r.get("best")
        if not best:
            continue
        cmp = r.get("best_vs_lgbm", {})
        for lg, metric, better in (("lgbm_binary", "logloss", -1), ("lgbm_lambdarank", "ndcg@10", 1)):
            c = cmp.get(lg)
            if not c:
                ok_all = False
                lines.append(f"- {r['size']}x: no {LABELS[lg]} row")
                continue
            wins = c["diff"] * better > 0
            sig = c["p_value"] is not None and c["p_value"] < 0.05
            ok_all &= wins
            ok_sig &= wins and sig
            lines.append(f"- {r['size']}x: {LABELS[best]} vs {LABELS[lg]}, {metric}: "
                         f"{c['a']:.4f} vs {c['b']:.4f}, difference {_fmt_gap(c)} "
                         f"(paired p = {c['p_value']:.3g}) -> "
                         + ("beats it, significant at 5 %" if wins and sig else
                            "ahead, NOT significant" if wins else
                            "behind, significant at 5 %" if sig else "behind, NOT significant"))
    first, last = results[0], results[-1]
    ref = first["gap"].get(DEFAULT, {}).get("logloss")
    best = last.get("best")
    if ref and ref.get("diff") is not None and best:
        g = last["gap"][best]["logloss"]
        closed = 1 - g["diff"] / ref["diff"]
        met = closed >= 0.5
        ok_all &= met
        ok_sig &= met
        lines.append(f"- {last['size']}x: {LABELS[best]}'s gap to Bayes {g['diff']:.4f} "
                     f"[{g['lower']:.4f}, {g['upper']:.4f}] vs the default MLP's {ref['diff']:.4f} at "
                     f"{first['size']}x: {100 * closed:.0f} % of it closed (goal ≥ 50 %) -> "
                     f"{'met' if met else 'NOT met'}")
        ref_l = last["gap"].get(DEFAULT, {}).get("logloss")
        if ref_l and ref_l.get("diff"):
            lines.append(f"  (against the default MLP trained on the same {last['size']}x data, "
                         f"gap {ref_l['diff']:.4f}: {100 * (1 - g['diff'] / ref_l['diff']):.0f} % "
                         "of it closed)")
    verdict = ("goal met" if ok_sig else
               "goal met on point estimates only (some margins are not significant)" if ok_all
               else "goal NOT met")
    lines.append(f"**Verdict: {verdict}.**")
    return lines


# ----------------------------------------------------------------------------------------------
# --tune: the validation grid
# ----------------------------------------------------------------------------------------------
def print_choice(done: dict) -> dict[str, str]:
    """One setting per model: the smallest mean excess validation log loss over the tuned sizes
    (excess = a setting's val log loss minus the best one's at that size; only settings run at
    every size). LightGBM lambdarank is chosen on the validation NDCG@10 instead."""
    sizes = [k for k in done if k.endswith("x")]
    models = sorted({m for k in sizes for m in done[k] if m != "oracle"})
    choice = {}
    for m in models:
        key = "ndcg@10" if m == "lgbm_lambdarank" else "logloss"
        sign = -1.0 if key == "ndcg@10" else 1.0
        names = [n for n in done[sizes[0]].get(m, {}) if all(n in done[k].get(m, {}) for k in sizes)]
        if not names:
            continue
        excess = {}
        for n in names:
            vals = []
            for k in sizes:
                best = min(sign * r["val"][key] for r in done[k][m].values())
                vals.append(sign * done[k][m][n]["val"][key] - best)
            excess[n] = sum(vals) / len(vals)
        ranked = sorted(excess, key=excess.get)
        choice[m] = ranked[0]
        print(f"choice {m}: {ranked[0]!r} (mean excess val {key} {excess[ranked[0]]:.5f}; "
              f"runner-up {ranked[1]!r} {excess[ranked[1]]:.5f}; {len(names)} settings at "
              f"{', '.join(sizes)})" if len(ranked) > 1 else f"choice {m}: {ranked[0]!r}")
    return choice


def tune(args) -> None:
    out_path = Path(args.out).with_name("convergence_tune.json")
    done = json.loads(out_path.read_text()) if out_path.exists() else {}
    for size in args.sizes:
        splits = C.load_splits(sim_overrides(size, args.quick))
        key = f"{size}x"
        done.setdefault(key, {})
        oracle = C.evaluate(splits.val, torch.logit(splits.val.true_p.double(), eps=1e-7),
                            empties=("skip",))["skip"]
        done[key]["oracle"] = {"true pCTR": {"val": {k: oracle[k] for k in ("logloss", "ndcg@10")},
                                             "fit_seconds": 0.0}}
        for m in args.models:
            if m == DEFAULT:
                continue
            grid = ({n: p for n, p in LGBM_GRID.items()} if m in LGBM else tune_grid(m))
            if args.tune_configs:
                grid = {n: g for n, g in grid.items() if n in args.tune_configs}
            for name, cfg in grid.items():
                if name in done[key].get(m, {}):
                    continue
                t = time.perf_counter()
                try:
                    r = (run_model(m, splits, args, lgbm_params=cfg) if m in LGBM
                         else run_model(m, splits, args, extra=list(cfg)))
                except Exception as e:
                    print(f"  [{key}] {m} {name}: FAILED {type(e).__name__}: {e}", flush=True)
                    continue
                row = {"val": r["val"], "fit_seconds": r["fit_seconds"],
                       **{k: r[k] for k in ("epochs", "best_epoch", "best_iteration") if k in r}}
                done[key].setdefault(m, {})[name] = row
                out_path.parent.mkdir(parents=True, exist_ok=True)
                out_path.write_text(json.dumps(done, indent=2))
                print(f"  [{key}] {m:<16} {name:<28} val logloss {r['val']['logloss']:.5f} "
                      f"ndcg@10 {r['val']['ndcg@10']:.4f} fit {r['fit_seconds']:.0f} s "
                      f"{row.get('best_epoch', row.get('best_iteration'))}/{row.get('epochs', '')}"
                      f" (wall {time.perf_counter() - t:.0f} s)", flush=True)
    print(f"\nJSON: {out_path}")
    print_choice(done)
    for key, per in done.items():
        for m, rows in per.items():
            print(f"\n{key} {m} (sorted by val log loss)")
            for name, r in sorted(rows.items(), key=lambda kv: kv[1]["val"]["logloss"]):
                print(f"  {name:<28} {r['val']['logloss']:.5f}  ndcg@10 {r['val']['ndcg@10']:.4f}"
                      f"  {r['fit_seconds']:.0f} s")


# ----------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--models", nargs="+", default=list(ALL_MODELS), choices=list(ALL_MODELS))
    p.add_argument("--models-at", nargs="*", default=[], metavar="SIZE:MODEL,MODEL",
                   help="restrict the models at one size, e.g. 16:mlp,deepfm,lgbm_binary")
    p.add_argument("--quick", action="store_true", help="smoke test: 300 users, 1x and 4x, "
                   "2 epochs, 100 boosting rounds, 200 bootstrap replicates; no docs")
    p.add_argument("--tune", action="store_true", help="run the validation grid instead")
    p.add_argument("--tune-configs", nargs="*", default=None, help="only these grid entries")
    p.add_argument("--no-references", dest="references", action="store_false",
                   help="leave out the two reference rows (no-interaction truth, reference MF)")
    p.add_argument("--n-boot", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--out", default=None)
    C.add_docs_options(p)
    args = p.parse_args(argv)
    C.check_docs_request(args, [why for bad, why in [
        (args.quick, "--quick"), (args.tune, "--tune"), (sorted(args.sizes) != [1, 4, 16], "--sizes"),
        (set(args.models) != set(ALL_MODELS), "--models"), (bool(args.models_at), "--models-at"),
        (not args.references, "--no-references"), (args.n_boot != 1000, "--n-boot")] if bad])
    C.require_lightgbm(args.models)
    if args.quick:
        args.sizes = [s for s in args.sizes if s <= 4] or [1]
        args.n_boot = min(args.n_boot, 200)
    args.out = args.out or str(C.RESULTS / ("convergence_quick.json" if args.quick
                                            else "convergence.json"))
    torch.set_num_threads(args.threads)
    C.quiet()
    if args.tune:
        tune(args)
        return
    at = {}
    for spec in args.models_at:
        s, ms = spec.split(":", 1)
        at[int(s)] = [m for m in ms.split(",") if m]
    t_start = time.perf_counter()
    results = []
    for size in args.sizes:
        models = [m for m in args.models if m in at.get(size, args.models)]
        results.append(run_size(size, models, args))
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"sizes": results, "machine": C.machine(),
                                              "settings": SETTINGS, "lgbm": LGBM_PARAMS,
                                              "trainer": TRAINER, "loss": LOSS}, indent=2,
                                             default=float))
    elapsed = time.perf_counter() - t_start
    tables = "\n\n".join(size_table(r) for r in results)
    text = (tables + "\n\n**Gaps by size** (model − oracle, paired over the test requests; "
            "log loss: lower is better, so the gap is ≥ 0; NDCG@10: the gap is ≤ 0)\n\n"
            + summary_table(results) + "\n\n" + "\n".join(shrink_lines(results))
            + "\n\n" + "\n".join(goal_lines(results)))
    print("\n" + text + f"\n\nwall time {elapsed / 60:.1f} min\nJSON: {args.out}", flush=True)
    cmd = "python scripts/bench_convergence.py " + " ".join(sys.argv[1:] if argv is None else argv)
    C.write_docs(args, {"Convergence": (
        f"Generated {time.strftime('%Y-%m-%d')} by `{cmd.strip()}` on {C.machine()}; total wall "
        f"time {elapsed / 60:.0f} min (fit times are measured side by side in one run on a shared "
        "machine: compare the ratios, not the seconds). † = not a probability by design. "
        f"Intervals: 95 % percentile bootstrap over test requests ({args.n_boot} replicates, seed "
        f"{args.seed}); hybridrank rows: one training seed.\n\n{text}")})


if __name__ == "__main__":
    main()
