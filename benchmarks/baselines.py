"""The baselines the benchmarks put beside hybridrank, in one place.

- :func:`fit_reference_fm`: a plainly written factorization machine, the independent baseline the
  defaults are judged against on the random worlds (:mod:`benchmarks.worlds`);
- :func:`fit_lightgbm`: LightGBM ``binary`` or ``lambdarank`` with early stopping on the
  validation part (:data:`LGBM_PARAMS`), categorical ids as LightGBM categories. The oracle and the
  base rate are ``train``'s own reference rows (:func:`hybridrank.evaluation.figures.reference_rows`).

The reference FM (Rendle 2010), on one-hot categorical fields and numeric features ``x_k``::

    logit = b + sum_f w_f[id_f] + sum_k u_k x_k
            + 1/2 sum_d [ (sum_j e_jd)^2 - sum_j e_jd^2 ]     e_j = V_f[id_f] or x_k v_k

Categorical ids get a vocabulary from the training frame (row 0 of each field: unseen ids);
numeric features, and the logged slot as the numeric ``log(slot)``, are standardised with training
statistics; scoring "at slot 1" feeds ``log(1) = 0`` through the same standardisation. Training: BCE
plus ``l2`` times the squared norm of the embedding rows and first-order weights each example uses
(summed over the example's fields, averaged over the batch), Adam (lr 1e-3), batches of 1024, early
stopping on validation log loss (patience 3 epochs), best weights restored.
"""

from __future__ import annotations

import copy
import math
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import polars as pl
import torch

#: LightGBM's settings in every table (lr 0.05, 31 leaves), deterministic on two threads
LGBM_PARAMS = dict(learning_rate=0.05, num_leaves=31, min_data_in_leaf=20, num_threads=2, seed=0,
                   deterministic=True, force_row_wise=True, verbose=-1)


# ----------------------------------------------------------------------------------------------
# the reference factorization machine
# ----------------------------------------------------------------------------------------------
class ReferenceFM(torch.nn.Module):
    """The FM of the module docstring: ``forward(cat [B, F], num [B, K]) -> (logit [B], l2 [])``."""

    def __init__(self, sizes: list[int], n_num: int, dim: int, base_logit: float) -> None:
        super().__init__()
        self.offsets = torch.tensor(np.r_[0, np.cumsum(sizes)[:-1]], dtype=torch.long)
        self.emb = torch.nn.Embedding(int(sum(sizes)), dim)
        self.w = torch.nn.Embedding(int(sum(sizes)), 1)
        self.v_num = torch.nn.Parameter(0.01 * torch.randn(n_num, dim))
        self.u_num = torch.nn.Parameter(torch.zeros(n_num))
        self.b = torch.nn.Parameter(torch.tensor(base_logit))
        torch.nn.init.normal_(self.emb.weight, std=0.01)
        torch.nn.init.zeros_(self.w.weight)

    def forward(self, cat: torch.Tensor, num: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        idx = cat + self.offsets                                            # [B, F] rows of the tables
        e = torch.cat([self.emb(idx), num[:, :, None] * self.v_num], dim=1)   # [B, F + K, D]
        w = self.w(idx).squeeze(-1)                                          # [B, F]
        pair = 0.5 * (e.sum(1).pow(2) - e.pow(2).sum(1)).sum(1)
        reg = (self.emb(idx).pow(2).sum((1, 2)) + w.pow(2).sum(1)).mean()
        return self.b + w.sum(1) + num @ self.u_num + pair, reg


def fit_reference_fm(train: pl.DataFrame, val: pl.DataFrame, columns: Mapping[str, Any], *,
                     dim: int = 8, l2: float = 1e-4, lr: float = 1e-3, batch: int = 1024,
                     max_epochs: int = 100, patience: int = 3, seed: int = 0) -> Callable[..., np.ndarray]:
    """Fit the FM on ``train`` (early stopping on ``val``); return ``predict(frame, slot=1)``.

    ``columns`` is a world's column map (``categorical``, ``numeric``, ``position``, ``label``).
    ``predict`` returns click probabilities with the position feature set to ``slot`` (an int),
    or to each row's logged slot with ``slot=None``; its ``epochs`` and ``best_val_log_loss``
    attributes say how training went.
    """
    torch.manual_seed(seed)
    cats, nums, pos = list(columns["categorical"]), list(columns["numeric"]), columns["position"]
    vocab = {c: {v: i + 1 for i, v in enumerate(train[c].unique(maintain_order=True).to_list())}
             for c in cats}

    # missing numerics (a world's missing_share): the training mean and a 0/1 column each
    holes = [j for j, c in enumerate(nums) if train[c].null_count()]
    fills = np.nanmean(train.select(nums).to_numpy().astype(np.float64), axis=0) if holes else None

    def numeric(frame: pl.DataFrame, slot: int | None) -> np.ndarray:
        logslot = np.log(frame[pos].to_numpy() if slot is None else np.full(frame.height, slot))
        values = frame.select(nums).to_numpy().astype(np.float64)
        if holes:
            gone = np.isnan(values)
            values = np.c_[np.where(gone, fills, values), gone[:, holes]]
        return np.c_[values, logslot]

    x = numeric(train, None)
    mean, std = x.mean(0), np.where(x.std(0) > 0, x.std(0), 1.0)

    def encode(frame: pl.DataFrame, slot: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        cat = np.stack([frame[c].replace_strict(vocab[c], default=0, return_dtype=pl.Int64)
                        .to_numpy() for c in cats], axis=1)
        return torch.from_numpy(cat), torch.from_numpy(((numeric(frame, slot) - mean) / std).astype(np.float32))

    y_tr = torch.tensor(train[columns["label"]].to_numpy(), dtype=torch.float32)
    y_va = torch.tensor(val[columns["label"]].to_numpy(), dtype=torch.float32)
    (c_tr, n_tr), (c_va, n_va) = encode(train, None), encode(val, None)
    ctr = float(y_tr.mean().clamp(1e-4, 1 - 1e-4))
    model = ReferenceFM([len(vocab[c]) + 1 for c in cats], n_tr.shape[1], dim, math.log(ctr / (1 - ctr)))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    best, best_state, bad = math.inf, None, 0
    for _epoch in range(max_epochs):
        model.train()
        for b in torch.randperm(len(y_tr)).split(batch):
            logit, reg = model(c_tr[b], n_tr[b])
            loss = bce(logit, y_tr[b]) + l2 * reg
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            val_loss = float(bce(model(c_va, n_va)[0], y_va))
        if val_loss < best - 1e-6:
            best, best_state, bad = val_loss, copy.deepcopy(model.state_dict()), 0
        else:
            bad += 1
            if bad >= patience:
                break
    model.load_state_dict(best_state)
    model.eval()

    def predict(frame: pl.DataFrame, slot: int | None = 1) -> np.ndarray:
        with torch.no_grad():
            return torch.sigmoid(model(*encode(frame, slot))[0]).double().numpy()

    predict.epochs = _epoch + 1            # type: ignore[attr-defined]
    predict.best_val_log_loss = best       # type: ignore[attr-defined]
    return predict


# ----------------------------------------------------------------------------------------------
# LightGBM
# ----------------------------------------------------------------------------------------------
def require_lightgbm(models: Iterable[str]):
    """``lightgbm`` when LightGBM rows (``lgbm_*`` models) are asked for, None when none are.

    A missing optional dependency is an error, not a table without its LightGBM rows.
    """
    wanted = [m for m in models if m.startswith("lgbm_")]
    if not wanted:
        return None
    try:
        import lightgbm
    except ImportError:
        raise SystemExit(f"LightGBM is not installed, and the rows {wanted} need it: "
                         "pip install -e '.[bench]' (or leave them out with --models)") from None
    return lightgbm


def lgbm_arrays(data) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
    """(features [N, F + C] float64, labels [N], group sizes [R], categorical column indices):
    numeric features first, then the categorical codes (0 = out of vocabulary), which LightGBM
    treats as categories, so trees see the ids the embeddings see."""
    num = data.num.double().numpy()
    cat = data.cat.double().numpy() if data.cat is not None and data.cat.numel() else None
    x = num if cat is None else np.concatenate([num, cat], axis=1)
    cats = [] if cat is None else list(range(num.shape[1], x.shape[1]))
    return x, data.label.double().numpy(), data.lengths.long().numpy(), cats


def fit_lightgbm(objective: str, splits, params: Mapping[str, Any] = LGBM_PARAMS, *, max_rounds: int = 2000,
                 patience: int = 50) -> dict[str, Any]:
    """LightGBM ``binary`` (on label > 0, early stopping on the val log loss) or ``lambdarank``
    (graded labels, early stopping on the val NDCG@10).

    Returns ``{"fit_seconds"`` (Dataset construction + boosting with early stopping),
    ``"best_iteration", "z_val", "z_test"}``: raw scores, the logit for ``binary``.
    """
    import lightgbm as lgb

    x_tr, y_tr, g_tr, cats = lgbm_arrays(splits.train)
    x_va, y_va, g_va, _ = lgbm_arrays(splits.val)
    t0 = time.perf_counter()
    if objective == "lambdarank":
        p = dict(objective="lambdarank", metric="ndcg", eval_at=[10], **params)
        train_set = lgb.Dataset(x_tr, y_tr, group=g_tr, categorical_feature=cats, free_raw_data=False)
        val_set = lgb.Dataset(x_va, y_va, group=g_va, reference=train_set, categorical_feature=cats)
    elif objective == "binary":
        p = dict(objective="binary", metric="binary_logloss", **params)
        train_set = lgb.Dataset(x_tr, (y_tr > 0).astype(np.float64), categorical_feature=cats, free_raw_data=False)
        val_set = lgb.Dataset(x_va, (y_va > 0).astype(np.float64), reference=train_set, categorical_feature=cats)
    else:
        raise ValueError(f"objective must be 'binary' or 'lambdarank', got {objective!r}")
    booster = lgb.train(p, train_set, num_boost_round=max_rounds, valid_sets=[val_set],
                        callbacks=[lgb.early_stopping(patience, verbose=False)])
    fit_seconds = time.perf_counter() - t0
    it = booster.best_iteration

    def score(data) -> torch.Tensor:
        raw = booster.predict(lgbm_arrays(data)[0], num_iteration=it, raw_score=True)
        return torch.from_numpy(np.asarray(raw, dtype=np.float64))

    return {"fit_seconds": fit_seconds, "best_iteration": int(it), "z_val": score(splits.val),
            "z_test": score(splits.test)}


def fit_model(model: str, splits, overrides: list[str], *, quick: bool = False) -> dict[str, Any]:
    """One row of a real-data table: LightGBM (``lgbm_binary`` / ``lgbm_lambdarank``, 100 rounds
    with ``quick``) or hybridrank trained on ``splits`` with ``overrides``
    (:func:`benchmarks.grid.train_run`), scored by its kept checkpoint. ``{"z_val", "z_test",
    "fit_seconds", "info"}``; ``fit_seconds`` is the fit alone (hybridrank: ``trainer.fit`` with
    its per-epoch validation, not the load)."""
    if model.startswith("lgbm_"):
        r = fit_lightgbm(model.removeprefix("lgbm_"), splits, max_rounds=100 if quick else 2000)
        return {**r, "info": {"best_iteration": r["best_iteration"]}}
    from benchmarks.grid import kept_model, train_run

    with tempfile.TemporaryDirectory(prefix="hybridrank-bench-") as tmp:
        result = train_run(overrides, tmp, splits=splits)
        ranker = kept_model(result)
    return {"z_val": ranker.predict_split(splits.val)[0], "z_test": ranker.predict_split(splits.test)[0],
            "fit_seconds": result["fit_seconds"], "result": result, "info": {"best_epoch": result.get("val_epoch")}}


def fit_rows(tag: str, splits, rows: Mapping[str, list[str]], *, quick: bool = False) -> dict[str, dict[str, Any]]:
    """Every row of a real-data table on one loaded split: ``{name: overrides}``, the name's part
    before ``|`` the model of :func:`fit_model`. ``{name: fit_model's result with "seconds" (wall),
    "val" (metrics, ``empty="skip"``) and "test" (``{empty: metrics}``, :func:`benchmarks.common.evaluate`)}``;
    a row that fails is printed and stands as ``{"error": message}``."""
    from benchmarks.common import evaluate

    out: dict[str, dict[str, Any]] = {}
    for name, overrides in rows.items():
        t0 = time.perf_counter()
        try:
            r = fit_model(name.partition("|")[0], splits, overrides, quick=quick)
        except Exception as e:  # one failing row must not cost the table
            print(f"  [{tag}] {name}: FAILED {type(e).__name__}: {e}", flush=True)
            out[name] = {"error": f"{type(e).__name__}: {e}"}
            continue
        r.update(seconds=time.perf_counter() - t0, test=evaluate(splits.test, r["z_test"].float()),
                 val=evaluate(splits.val, r["z_val"].float(), empties=("skip",))["skip"])
        s = r["test"]["skip"]
        print(f"  [{tag}] {name:<26} test ndcg@10 {s.get('ndcg@10', math.nan):.4f} logloss {s['logloss']:.4f} "
              f"ece {s['ece']:.4f} | val ndcg@10 {r['val'].get('ndcg@10', math.nan):.4f} | "
              f"fit {r['fit_seconds']:.1f} s, wall {r['seconds']:.0f} s", flush=True)
        out[name] = r
    return out
