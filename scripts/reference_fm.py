"""A plainly specified factorization machine, to put beside hybridrank on the random worlds.

The model (Rendle 2010), on one-hot categorical fields and numeric features ``x_k``::

    logit = b + sum_f w_f[id_f] + sum_k u_k x_k
            + 1/2 sum_d [ (sum_j e_jd)^2 - sum_j e_jd^2 ]     e_j = V_f[id_f] or x_k v_k

Categorical ids get a vocabulary from the training frame (row 0 of each field: unseen ids);
numeric features, and the logged slot as the numeric ``log(slot)``, are standardised with
training statistics; scoring "at slot 1" feeds ``log(1) = 0`` through the same standardisation. Training: BCE plus
``l2`` times the squared norm of the embedding rows and first-order weights each example uses
(summed over the example's fields, averaged over the batch), Adam (lr 1e-3), batches of 1024,
early stopping on validation log loss (patience 3 epochs), best weights restored.

Run ``python scripts/reference_fm.py --seed 0`` to draw one small world, split it by time (last
20 % of requests test, the 10 % before them validation), fit, and print the test log loss beside
the Bayes limit and the PCOC of the slot-1 prediction against the true slot-1 probability.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import polars as pl
import torch

from hybridrank.data.worlds import TRUTH_COLUMNS, draw_world, simulate_world


class _FM(torch.nn.Module):
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
        idx = cat + self.offsets                                  # [B, F] rows of the tables
        e = torch.cat([self.emb(idx), num[:, :, None] * self.v_num], dim=1)   # [B, F + K, D]
        w = self.w(idx).squeeze(-1)                                # [B, F]
        pair = 0.5 * (e.sum(1).pow(2) - e.pow(2).sum(1)).sum(1)
        logit = self.b + w.sum(1) + num @ self.u_num + pair
        reg = (self.emb(idx).pow(2).sum((1, 2)) + w.pow(2).sum(1)).mean()
        return logit, reg


def fit_reference_fm(train: pl.DataFrame, val: pl.DataFrame, columns: Mapping[str, Any], *,
                     dim: int = 8, l2: float = 1e-4, lr: float = 1e-3, batch: int = 1024,
                     max_epochs: int = 100, patience: int = 3, seed: int = 0, verbose: bool = False,
                     ) -> Callable[..., np.ndarray]:
    """Fit the FM on ``train`` (early stopping on ``val``); return ``predict(frame, slot=1)``.

    ``columns`` is a world's column map (``categorical``, ``numeric``, ``position``, ``label``).
    ``predict`` returns click probabilities with the position feature set to ``slot`` (an int),
    or to each row's logged slot with ``slot=None``.
    """
    torch.manual_seed(seed)
    cats, nums, pos = list(columns["categorical"]), list(columns["numeric"]), columns["position"]
    vocab = {c: {v: i + 1 for i, v in enumerate(train[c].unique(maintain_order=True).to_list())}
             for c in cats}

    def numeric(frame: pl.DataFrame, slot: int | None) -> np.ndarray:
        logslot = np.log(frame[pos].to_numpy() if slot is None else np.full(frame.height, slot))
        return np.c_[frame.select(nums).to_numpy(), logslot].astype(np.float64)

    x = numeric(train, None)
    mean, std = x.mean(0), np.where(x.std(0) > 0, x.std(0), 1.0)

    def encode(frame: pl.DataFrame, slot: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        cat = np.stack([frame[c].replace_strict(vocab[c], default=0, return_dtype=pl.Int64)
                        .to_numpy() for c in cats], axis=1)
        num = (numeric(frame, slot) - mean) / std
        return torch.from_numpy(cat), torch.from_numpy(num.astype(np.float32))

    y_tr = torch.tensor(train[columns["label"]].to_numpy(), dtype=torch.float32)
    y_va = torch.tensor(val[columns["label"]].to_numpy(), dtype=torch.float32)
    (c_tr, n_tr), (c_va, n_va) = encode(train, None), encode(val, None)
    ctr = float(y_tr.mean().clamp(1e-4, 1 - 1e-4))
    model = _FM([len(vocab[c]) + 1 for c in cats], n_tr.shape[1], dim, math.log(ctr / (1 - ctr)))
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
        if verbose:
            print(f"  epoch {_epoch + 1}: val log loss {val_loss:.5f}")
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


def split_by_time(frame: pl.DataFrame, columns: Mapping[str, Any], *, val: float = 0.1,
                  test: float = 0.2) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Requests ordered by time: the last ``test`` share is test, the ``val`` share before it val."""
    req, t = columns["request"], columns["time"]
    order = (frame.group_by(req).agg(pl.col(t).min()).sort([t, req])[req].to_numpy())
    n = order.size
    n_test, n_val = round(test * n), round(val * n)
    part = np.zeros(n, dtype=np.int8)
    part[n - n_test - n_val:n - n_test], part[n - n_test:] = 1, 2
    tagged = frame.join(pl.DataFrame({req: order, "__part": part}), on=req, how="left",
                        maintain_order="left")
    return tuple(tagged.filter(pl.col("__part") == k).drop("__part") for k in range(3))


def log_loss(y: np.ndarray, p: np.ndarray) -> float:
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, nargs="+", default=[0])
    ap.add_argument("--size", default="small")
    ap.add_argument("--l2", type=float, default=1e-4)
    ap.add_argument("--pin", nargs="*", default=[], metavar="FIELD=VALUE",
                    help="pin world fields, e.g. drift=none logging=random (values read as JSON)")
    a = ap.parse_args(argv)
    pins = {}
    for item in a.pin:
        k, _, v = item.partition("=")
        try:
            pins[k] = json.loads(v)
        except json.JSONDecodeError:
            pins[k] = v
    for seed in a.seed:
        w = simulate_world(draw_world(seed, size=a.size, **pins))
        tr, va, te = split_by_time(w.frame, w.columns)
        t0 = time.perf_counter()
        predict = fit_reference_fm(tr, va, w.columns, l2=a.l2)
        y = te[w.columns["label"]].to_numpy().astype(np.float64)
        p_logged, p1 = predict(te, slot=None), predict(te, slot=1)
        p_true, p_ref = te[TRUTH_COLUMNS["true_p"]].to_numpy(), te[TRUTH_COLUMNS["p_ref"]].to_numpy()
        base = float(tr[w.columns["label"]].mean())
        print(w.spec.describe())
        print(f"  rows train/val/test {tr.height:,}/{va.height:,}/{te.height:,}; "
              f"{predict.epochs} epochs in {time.perf_counter() - t0:.1f}s")
        print(f"  test log loss: FM {log_loss(y, p_logged):.5f} | Bayes (true_p) "
              f"{log_loss(y, p_true):.5f} | constant train CTR {log_loss(y, np.full_like(y, base)):.5f}")
        print(f"  drift: mean true_p test / train {p_true.mean() / tr[TRUTH_COLUMNS['true_p']].mean():.3f}")
        print(f"  slot-1 PCOC vs true_p_ref: {p1.sum() / p_ref.sum():.3f}; "
              f"PCOC at logged slot vs clicks {p_logged.sum() / max(y.sum(), 1):.3f} "
              f"(vs true_p {p_logged.sum() / p_true.sum():.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
