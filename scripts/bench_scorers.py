"""Benchmark the scorers: forward + backward time of one training batch, as ratios to MLPScorer.

Not a test. The batch: 4096 impressions in lists of 4..28 impressions (about 250 lists), 5
numeric features, 3 categorical features with vocabularies 2500 / 1000 / 20, BCE on the click
logit. Every scorer is timed in the same rounds, one after the other, so that a busy machine
slows all of them alike; a round's ratio is a scorer's time over MLPScorer's time in that round,
and the table gives the median ratio and its range over the rounds. A second table times the
list-aware scorer's attention layouts on lists of skewed lengths (MQ2008-like, 5..121).

Usage: ``python scripts/bench_scorers.py [--rounds 7] [--threads 1 2]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from hybridrank.models.scorers import DCNv2Scorer, DeepFMScorer, FMScorer, LinearScorer, ListAwareScorer, MLPScorer

VOCAB = [2500, 1000, 20]


def make_batch(lengths: list[int], seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    b = sum(lengths)
    num = torch.randn(b, 5, generator=g)
    cat = torch.stack([torch.randint(0, v + 1, (b,), generator=g) for v in VOCAB], 1)
    request = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    y = (torch.rand(b, generator=g) < 0.05).float()
    return num, cat, request, y


def lengths_between(lo: int, hi: int, total: int, seed: int = 0, skew: bool = False) -> list[int]:
    rng = np.random.default_rng(seed)
    out: list[int] = []
    while sum(out) < total:
        n = int(min(hi, lo + rng.exponential(15))) if skew else int(rng.integers(lo, hi + 1))
        out.append(n)
    out[-1] -= sum(out) - total
    return [n for n in out if n > 0]


def step_fn(model: torch.nn.Module, batch) -> Callable[[], None]:
    num, cat, request, y = batch

    def step() -> None:
        model.zero_grad(set_to_none=True)
        z = model(num, cat, request)[:, -1]
        F.binary_cross_entropy_with_logits(z, y).backward()

    return step


def rounds(steps: dict[str, Callable[[], None]], n_rounds: int, reps: int) -> dict[str, list[float]]:
    for s in steps.values():
        s()
        s()
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(n_rounds):
        for k, s in steps.items():
            t = time.perf_counter()
            for _ in range(reps):
                s()
            times[k].append((time.perf_counter() - t) / reps)
    return times


def table(times: dict[str, list[float]], base: str) -> None:
    print(f"| scorer | median ms | ratio to {base}: median | min | max |")
    print("|---|---|---|---|---|")
    for k, v in times.items():
        r = [a / b for a, b in zip(v, times[base])]
        print(f"| {k} | {statistics.median(v) * 1e3:.1f} | {statistics.median(r):.2f} | {min(r):.2f} | {max(r):.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    torch.manual_seed(0)
    batch = make_batch(lengths_between(4, 28, 4096))
    models = {
        "MLPScorer (128, 64)": MLPScorer(5, VOCAB),
        "LinearScorer": LinearScorer(5, VOCAB),
        "FMScorer": FMScorer(5, VOCAB),
        "DeepFMScorer": DeepFMScorer(5, VOCAB),
        "DCNv2Scorer parallel": DCNv2Scorer(5, VOCAB),
        "DCNv2Scorer stacked": DCNv2Scorer(5, VOCAB, structure="stacked"),
        "DCNv2Scorer low_rank=8": DCNv2Scorer(5, VOCAB, low_rank=8),
        "ListAwareScorer (defaults)": ListAwareScorer(5, VOCAB),
        "ListAwareScorer n_layers=1": ListAwareScorer(5, VOCAB, n_layers=1),
        "ListAwareScorer n_heads=4": ListAwareScorer(5, VOCAB, n_heads=4),
        "ListAwareScorer d_model=64, ffn 128": ListAwareScorer(5, VOCAB, d_model=64, ffn_dim=128),
    }
    g = int(batch[2].max()) + 1
    for threads in args.threads:
        torch.set_num_threads(threads)
        print(f"\nForward + backward, B=4096 in {g} lists (4..28), {threads} thread(s), "
              f"{args.rounds} rounds of {args.reps} steps")
        table(rounds({k: step_fn(m, batch) for k, m in models.items()}, args.rounds, args.reps),
              "MLPScorer (128, 64)")

    skewed = make_batch(lengths_between(5, 121, 4096, skew=True))
    g = int(skewed[2].max()) + 1
    single = ListAwareScorer(5, VOCAB, length_bounds=())
    blocked = ListAwareScorer(5, VOCAB)
    blocked.load_state_dict(single.state_dict())
    torch.set_num_threads(args.threads[0])
    print(f"\nList-aware layouts, B=4096 in {g} lists of skewed lengths (5..121), "
          f"{args.threads[0]} thread(s)")
    table(rounds({"MLPScorer": step_fn(MLPScorer(5, VOCAB), skewed),
                  "ListAware, one [G, L] block (length_bounds=())": step_fn(single, skewed),
                  "ListAware, blocks by length (default)": step_fn(blocked, skewed)}, args.rounds, args.reps),
          "MLPScorer")


if __name__ == "__main__":
    main()
