"""How hard each part of a hybrid loss pulls on the logits, per world: BCE against softmax CE.

``HybridLoss`` adds ``point_weight * BCE`` (a mean over impressions) and ``weight * softmax CE``
(a mean over the lists that hold a click). The weights read like mixing proportions, but the two
means have different denominators: on a batch, the softmax term's gradient with respect to the
logits has an L1 norm of about ``2 * (1 - p)`` per clicked list divided by the number of clicked
lists (about 2 whatever the click rate), BCE's ``sum |p - y| / N`` (about ``2 * CTR``). So the
ranking term pulls about ``1 / CTR`` times harder than its weight says.

This script measures it on random worlds (:mod:`hybridrank.data.worlds`): batches of whole
requests (about ``--budget`` impressions, requests drawn at random), logits at their true value
(what training converges toward), and prints per world the two L1 norms, their ratio and the
ratio (the ratio at ``loss=bce_softmax``'s equal weights), with a 0.9 / 0.1 mix, and with
``rank_reduction=impressions`` (the term's sum over lists per impression)::

    python scripts/bench_loss_mix.py --worlds 8 --seed0 1140
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from hybridrank.data.worlds import draw_world, simulate_world
from hybridrank.losses.listwise import softmax_loss
from hybridrank.losses.pointwise import bce_loss


def padded_batch(sizes: np.ndarray, starts: np.ndarray, logit: np.ndarray, label: np.ndarray,
                 pick: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``[G, L]`` logits, labels and mask of the picked requests."""
    width = int(sizes[pick].max())
    s = torch.zeros(len(pick), width)
    y = torch.zeros(len(pick), width)
    m = torch.zeros(len(pick), width, dtype=torch.bool)
    for g, r in enumerate(pick):
        a, n = starts[r], sizes[r]
        s[g, :n] = torch.from_numpy(logit[a:a + n]).float()
        y[g, :n] = torch.from_numpy(label[a:a + n]).float()
        m[g, :n] = True
    return s, y, m


def grad_l1(fn, s: torch.Tensor, y: torch.Tensor, m: torch.Tensor) -> float:
    s = s.clone().requires_grad_()
    fn(s, y, mask=m).backward()
    return float(s.grad.abs().sum())


def world_row(seed: int, budget: int, n_batches: int, size: str = "small") -> dict:
    world = simulate_world(draw_world(seed, size=size, logging="random"))
    f, cols = world.frame, world.columns
    req = f[cols["request"]].to_numpy()
    starts = np.flatnonzero(np.r_[True, req[1:] != req[:-1]])  # requests are contiguous
    sizes = np.diff(np.r_[starts, len(req)])
    p = np.clip(f["true_p"].to_numpy(), 1e-7, 1 - 1e-7)
    logit, label = np.log(p / (1 - p)), f[cols["label"]].to_numpy().astype(np.float64)
    rng = np.random.default_rng(seed)
    bce, soft, soft_imp = [], [], []
    for _ in range(n_batches):
        order = rng.permutation(len(sizes))
        pick = order[: max(1, int(np.searchsorted(np.cumsum(sizes[order]), budget)))]
        s, y, m = padded_batch(sizes, starts, logit, label, pick)
        if y.sum() == 0:
            continue
        bce.append(grad_l1(bce_loss, s, y, m))
        soft.append(grad_l1(softmax_loss, s, y, m))
        soft_imp.append(grad_l1(lambda *a, **k: softmax_loss(*a, reduction="sum", **k), s, y, m) / float(m.sum()))
    b, r = float(np.mean(bce)), float(np.mean(soft))
    return {"seed": seed, "ctr": float(label.mean()), "bce": b, "softmax": r, "ratio": r / b,
            "ratio_impressions": float(np.mean(soft_imp)) / b}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worlds", type=int, default=8)
    ap.add_argument("--seed0", type=int, default=1140)
    ap.add_argument("--budget", type=int, default=4096, help="impressions per batch (data.budget)")
    ap.add_argument("--batches", type=int, default=20)
    a = ap.parse_args(argv)
    print("| world | CTR | 1 / CTR | L1 grad BCE | L1 grad softmax | softmax / BCE | at 0.9 / 0.1 | "
          "softmax / BCE, rank_reduction=impressions |")
    print("|---|---|---|---|---|---|---|---|")
    for seed in range(a.seed0, a.seed0 + a.worlds):
        w = world_row(seed, a.budget, a.batches)
        print(f"| {seed} | {w['ctr']:.2%} | {1 / w['ctr']:.0f} | {w['bce']:.4f} | {w['softmax']:.3f} | "
              f"{w['ratio']:.0f} | {w['ratio'] * 0.1 / 0.9:.1f} | {w['ratio_impressions']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
