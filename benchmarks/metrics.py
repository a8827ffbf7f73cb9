"""Time hybridrank's NDCG@10 against torchmetrics' ``RetrievalNormalizedDCG`` on the same data.

Conventions are matched: linear gain, lists without a relevant item score 0 (hybridrank
``empty="zero"``, torchmetrics ``empty_target_action="neg"``), continuous random scores (no ties, so
tie handling cannot differ). hybridrank gets padded ``[G, L]`` tensors; torchmetrics the flat
``(preds, target, indexes)`` form it expects. Prints a Markdown table.

Usage: ``python -m benchmarks.metrics [--requests 20000 100000] [--repeats 5]``
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import torch
from torchmetrics.retrieval import RetrievalNormalizedDCG

from benchmarks import common as C
from hybridrank.lists import gather_lists, pad_index
from hybridrank.metrics.list_metrics import ListMetrics
from hybridrank.metrics.ranking import ndcg


def make_data(n_requests: int, seed: int = 0):
    """Flat requests of 5..15 impressions: randn scores, graded labels 0..2 (CTR-like sparsity)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(5, 16, (n_requests,), generator=gen)
    n = int(lengths.sum())
    preds = torch.randn(n, generator=gen)
    clicked = torch.rand(n, generator=gen) < 0.12
    target = clicked.long() * torch.randint(1, 3, (n,), generator=gen)
    indexes = torch.repeat_interleave(torch.arange(n_requests), lengths)
    return lengths, preds, target, indexes


def timed(fn, repeats: int) -> tuple[float, float, object]:
    """(best, median) wall seconds over ``repeats`` calls, and the last result."""
    out, times = None, []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[0], times[len(times) // 2], out


def bench(n_requests: int, repeats: int, tm_repeats: int) -> list[tuple]:
    lengths, preds, target, indexes = make_data(n_requests)
    n = int(lengths.sum())

    def pad():
        index, mask = pad_index(lengths)
        return gather_lists(preds, index, mask), gather_lists(target.float(), index, mask), mask

    scores, labels, mask = pad()

    def pure():
        return ndcg(scores, labels, mask=mask, k=10, gain="linear", empty="zero")

    def pure_with_padding():
        s, y, m = pad()
        return ndcg(s, y, mask=m, k=10, gain="linear", empty="zero")

    def streaming():
        metric = ListMetrics(ks=(10,), gain="linear", empty="zero")
        metric.update(scores, labels, mask=mask)
        return metric.compute()["ndcg@10"]

    def reference():
        metric = RetrievalNormalizedDCG(top_k=10, empty_target_action="neg")
        metric.update(preds, target, indexes)
        return metric.compute()

    pure()  # warm-up
    streaming()
    t_tm, med_tm, v_tm = timed(reference, tm_repeats)
    rows = []
    for name, fn in (("hybridrank `ndcg` (padded input)", pure),
                     ("hybridrank `ndcg` incl. padding from flat", pure_with_padding),
                     ("hybridrank `ListMetrics` update+compute (all metrics)", streaming)):
        t, med, v = timed(fn, repeats)
        diff = abs(float(v) - float(v_tm))
        if diff > 1e-6:
            raise AssertionError(f"{name}: NDCG@10 {float(v):.8f} != {float(v_tm):.8f}")
        rows.append((n_requests, n, name, t, med, t_tm / t, float(v), diff))
    tm_name = "torchmetrics `RetrievalNormalizedDCG`"
    rows.append((n_requests, n, tm_name, t_tm, med_tm, 1.0, float(v_tm), 0.0))
    return rows


def parser() -> argparse.ArgumentParser:
    p = C.parser("benchmarks.metrics", __doc__)
    p.add_argument("--requests", type=int, nargs="+", default=[20_000, 100_000],
                        help="request counts (100,000 requests of 5..15 is ~1M impressions)")
    p.add_argument("--repeats", type=int, default=20, help="timed calls of hybridrank")
    p.add_argument("--tm-repeats", type=int, default=2, help="timed calls of torchmetrics")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU; NDCG@10, linear "
          "gain, empty lists = 0; speed-up = best torchmetrics time / best time\n")
    print("| requests | impressions | implementation | best (ms) | median (ms) "
          "| speed-up vs torchmetrics | NDCG@10 | abs diff |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|")
    for r in args.requests:
        for req, n, name, t, med, ratio, v, diff in bench(r, args.repeats, args.tm_repeats):
            print(f"| {req:,} | {n:,} | {name} | {t * 1e3:.1f} | {med * 1e3:.1f} | {ratio:.0f}x "
                  f"| {v:.6f} | {diff:.1e} |")


if __name__ == "__main__":
    main()
