"""Benchmark the loss catalogue: forward + backward time and peak memory on CPU.

Not a test. Prints Markdown tables:

1. every loss at ``[G, L]`` = 4096×16, 1024×64, 64×512 (labels 0..2, ~70 % of slots real);
2. our padded pairwise loss (gather flat scores into ``[G, L]`` + ``ranknet_loss``) against the
   flat-batch form common in tutorials: a dense ``[B, B]`` score-difference matrix over the whole
   batch with pairs restricted to the same query by a ``qid_i == qid_j`` mask;
3. our padded softmax loss against the split + ``torch.nn.utils.rnn.pad_sequence`` form (a Python
   split per query).

Time: best wall time of a few forward + backward runs after one warm-up, 2 intra-op threads.
Peak memory: torch's CPU memory profiler (``torch.profiler`` with ``profile_memory=True``): the
maximum of its running "Total Allocated" counter over one forward + backward, i.e. the peak of
bytes held by tensors allocated inside the measured region (inputs excluded, autograd-saved
intermediates included).

Usage: ``python scripts/bench_losses.py [--quick]`` (about 2–3 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence
from torch.profiler import ProfilerActivity, profile

from hybridrank.lists import pad_index
from hybridrank.losses import LOSSES, bce_loss, ranknet_loss, softmax_loss

SHAPES = [(4096, 16), (1024, 64), (64, 512)]
# Rough bytes per G·L² element held at peak, to skip runs that would need several GB.
SINKHORN_BYTES = 4 * 80
MAX_BYTES = 2.5e9


def timed(fn: Callable[[], torch.Tensor], repeats: int) -> float:
    """Best-of-``repeats`` seconds of ``fn().backward()`` after one warm-up run.

    The minimum, not the median: on a shared machine interference only ever adds time.
    """
    fn().backward()
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn().backward()
        runs.append(time.perf_counter() - t0)
    return min(runs)


def peak_bytes(fn: Callable[[], torch.Tensor]) -> int:
    """Peak bytes allocated by one forward + backward, from torch's CPU memory profiler."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn().backward()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as fh:
            events = json.load(fh)["traceEvents"]
    totals = [e["args"]["Total Allocated"] for e in events
              if e.get("name") == "[memory]" and "Total Allocated" in e.get("args", {})]
    if not totals:
        return 0
    first = next(e for e in events if e.get("name") == "[memory]")
    base = first["args"]["Total Allocated"] - first["args"]["Bytes"]
    return max(totals) - base


def make_lists(g: int, length: int, seed: int = 0, full: bool = False):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 3, (g, length), generator=gen).float()
    if full:
        mask = torch.ones(g, length, dtype=torch.bool)
    else:
        n = torch.randint(max(1, length // 2), length + 1, (g,), generator=gen)
        n[0] = length
        mask = torch.arange(length)[None, :] < n[:, None]
    return labels, mask


def mb(n: float) -> str:
    return f"{n / 2**20:,.2f}"


def catalogue(shapes, repeats: int) -> None:
    print("## Every loss, forward + backward\n")
    print("| loss | " + " | ".join(f"{g}×{l} ms | {g}×{l} MB" for g, l in shapes) + " |")
    print("|---|" + "---:|---:|" * len(shapes))
    fns = {"bce": bce_loss, **LOSSES}
    for name, fn in fns.items():
        cells = []
        for g, length in shapes:
            if name == "neural_ndcg" and g * length * length * SINKHORN_BYTES > MAX_BYTES:
                est = g * length * length * SINKHORN_BYTES
                cells += ["skipped", f"~{mb(est)} est."]
                continue
            labels, mask = make_lists(g, length)
            shape = (g, length, 2) if name == "jrc" else (g, length)
            logits = torch.randn(shape, generator=torch.Generator().manual_seed(1))
            logits.requires_grad_(True)

            def run(fn=fn, logits=logits, labels=labels, mask=mask):
                return fn(logits, labels, mask=mask)

            reps = 1 if g * length * length > 4e6 else repeats
            cells += [f"{timed(run, reps) * 1e3:,.1f}", mb(peak_bytes(run))]
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    print()


def dense_pairwise(scores: torch.Tensor, labels: torch.Tensor, qid: torch.Tensor) -> torch.Tensor:
    """The tutorial form: all B² pairs of the batch, restricted by a same-query mask."""
    diff = scores[:, None] - scores[None, :]
    valid = (qid[:, None] == qid[None, :]) & (labels[:, None] > labels[None, :])
    return (F.softplus(-diff) * valid).sum() / valid.sum().clamp_min(1)


def split_pad_softmax(scores: torch.Tensor, labels: torch.Tensor, lengths: list[int]):
    """The tutorial form: Python split per query, pad_sequence, masked log-softmax CE."""
    s = pad_sequence(list(torch.split(scores, lengths)), batch_first=True, padding_value=-1e4)
    y = pad_sequence(list(torch.split(labels, lengths)), batch_first=True, padding_value=0.0)
    logp = torch.log_softmax(s, dim=1)
    mass = y.sum(1)
    keep = mass > 0
    return (-(y * logp).sum(1)[keep] / mass[keep]).mean()


def _gathered(loss, flat_scores, index, labels, mask):
    return loss(flat_scores[index], labels, mask=mask)


def flat_vs_padded(batch_sizes, list_len: int, repeats: int) -> None:
    print(f"## Flat-batch forms vs padded lists (lists of {list_len}, B impressions)\n")
    print("| B | loss | ours ms | flat ms | time ratio | ours MB | flat MB | memory ratio |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for b in batch_sizes:
        g = b // list_len
        lengths = torch.full((g,), list_len)
        index, mask = pad_index(lengths)
        gen = torch.Generator().manual_seed(0)
        flat_scores = torch.randn(b, generator=gen).requires_grad_(True)
        flat_labels = torch.randint(0, 3, (b,), generator=gen).float()
        qid = torch.repeat_interleave(torch.arange(g), lengths)
        labels = flat_labels[index]
        # Both sides start from flat scores: ours gathers them into [G, L] inside the timing.
        ours_pair = partial(_gathered, ranknet_loss, flat_scores, index, labels, mask)
        ours_list = partial(_gathered, softmax_loss, flat_scores, index, labels, mask)
        dense = partial(dense_pairwise, flat_scores, flat_labels, qid)
        split_pad = partial(split_pad_softmax, flat_scores, flat_labels, lengths.tolist())
        for name, ours, flat, flat_reps in [
            ("pairwise logistic vs dense [B, B]", ours_pair, dense, 1 if b > 4096 else repeats),
            ("softmax CE vs split + pad_sequence", ours_list, split_pad, repeats),
        ]:
            t_ours, t_flat = timed(ours, repeats), timed(flat, flat_reps)
            m_ours, m_flat = peak_bytes(ours), peak_bytes(flat)
            print(f"| {b:,} | {name} | {t_ours * 1e3:,.1f} | {t_flat * 1e3:,.1f} | "
                  f"{t_flat / t_ours:,.0f}× | {mb(m_ours)} | {mb(m_flat)} | "
                  f"{m_flat / max(m_ours, 1):,.1f}× |", flush=True)
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller shapes, for a smoke run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU\n")
    t0 = time.perf_counter()
    if args.quick:
        catalogue([(256, 16), (32, 64)], 1)
        flat_vs_padded([1024, 2048], 16, 1)
    else:
        catalogue(SHAPES, args.repeats)
        flat_vs_padded([4096, 8192, 16384], 16, args.repeats)
    print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
