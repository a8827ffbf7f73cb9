"""Benchmark the loss catalogue against allRank: forward + backward time, values, peak memory.

Prints Markdown tables; ``--write-docs`` (not with ``--quick``) writes them into the "Losses"
section of docs/BENCHMARKS.md: (1) every loss at ``[G, L]`` = 4096×16, 1024×64, 256×256 (labels
0..2, ~70 % of slots real), with its peak memory (torch's CPU memory profiler) and allRank's
counterpart timed side by side when ``allrank`` is installed (``pip install --no-deps allrank``;
:func:`load_allrank_losses` stands in for the packages its import chain pulls in and no loss
uses): a cell is the median over rounds of the best of a few runs, ours and allRank alternating
run by run; (2) the values of both on the same inputs, normalisations aligned (each row says
how); (3) our padded pairwise / softmax losses against the flat-batch forms of tutorials.

Usage: ``python -m benchmarks.losses [--quick] [--write-docs] [--rounds 5] [--threads 2]``
(about 10 minutes on 2 cores with allRank, mostly its pairwise losses at 256×256).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from unittest import mock

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence
from torch.profiler import ProfilerActivity, profile

from benchmarks import common as C
from hybridrank.lists import pad_index
from hybridrank.losses import LOSSES, bce_loss, ranknet_loss, softmax_loss, valid_pairs

SHAPES = [(4096, 16), (1024, 64), (256, 256)]
SECTION = "Losses: speed and values against allRank"
# Rough bytes per G·L² element held at peak, to skip runs that would need several GB.
SINKHORN_BYTES = 4 * 80
MAX_BYTES = 6e9


# --- allRank's losses, without its heavy dependencies --------------------------------------------
def load_allrank_losses() -> types.ModuleType | None:
    """``allrank.models.losses`` if allRank is installed (``pip install --no-deps allrank``), else None.

    Its import chain imports torchvision, gcsfs and pkg_resources at module level, none of which a
    loss uses: stand-ins (mocks) take the place of those that are missing during the import only.
    """
    if importlib.util.find_spec("allrank") is None:
        return None

    def missing(name: str) -> bool:
        try:
            return name not in sys.modules and importlib.util.find_spec(name) is None
        except (ImportError, ValueError):  # a missing parent package
            return True

    added = [n for n in ("torchvision", "torchvision.transforms", "gcsfs", "pkg_resources") if missing(n)]
    sys.modules.update({n: mock.MagicMock() for n in added})
    try:
        return importlib.import_module("allrank.models.losses")
    finally:
        for name in added:
            sys.modules.pop(name, None)


# --- timing ------------------------------------------------------------------------------------
def _clock() -> float:
    """Wall time; with one intra-op thread the thread's CPU time, which a busy machine's
    preemptions do not inflate (all the work runs on this thread then)."""
    return time.thread_time() if torch.get_num_threads() == 1 else time.perf_counter()


def _once(fn: Callable[[], torch.Tensor]) -> float:
    t0 = _clock()
    fn().backward()
    return _clock() - t0


def timed(fn: Callable[[], torch.Tensor], repeats: int) -> float:
    """Best-of-``repeats`` seconds of ``fn().backward()`` after one warm-up run.

    The minimum, not the median: on a shared machine interference only ever adds time.
    """
    fn().backward()
    return min(_once(fn) for _ in range(repeats))


def side_by_side(ours: Callable, theirs: Callable | None, rounds: int) -> dict:
    """Interleaved timings: per round the best of a few runs of each, alternating run by run.

    Returns ``ours`` / ``theirs`` (median over rounds of the per-round best, seconds) and
    ``ratios`` (theirs / ours per round).
    """
    ours().backward()
    first = _once(ours)
    if theirs is not None:
        theirs().backward()
        first = max(first, _once(theirs))
    runs = 1 if first > 0.5 else 3  # heavy cases: fewer runs per round
    rounds = max(3, rounds // 2) if first > 1.0 else rounds
    t_ours, t_theirs = [], []
    for r in range(rounds):
        a, b = [], []
        for k in range(runs):
            if theirs is not None and (r + k) % 2:
                b.append(_once(theirs))
            a.append(_once(ours))
            if theirs is not None and not (r + k) % 2:
                b.append(_once(theirs))
        t_ours.append(min(a))
        if b:
            t_theirs.append(min(b))
    out = {"ours": statistics.median(t_ours)}
    if t_theirs:
        out["theirs"] = statistics.median(t_theirs)
        out["ratios"] = [b / a for a, b in zip(t_ours, t_theirs)]
    return out


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


# --- inputs and the allRank counterparts ---------------------------------------------------------
def make_lists(g: int, length: int, seed: int = 0, distinct: bool = False):
    """Labels 0..2 (or distinct per list), and a mask with ~70 % real slots (first row full)."""
    gen = torch.Generator().manual_seed(seed)
    if distinct:
        labels = torch.argsort(torch.rand(g, length, generator=gen), dim=1).float()
    else:
        labels = torch.randint(0, 3, (g, length), generator=gen).float()
    n = torch.randint(max(1, length // 2), length + 1, (g,), generator=gen)
    n[0] = length
    return labels, torch.arange(length)[None, :] < n[:, None]


def padded_for_allrank(labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """allRank marks padding by the label -1."""
    return torch.where(mask, labels, torch.full_like(labels, -1.0))


@dataclass
class Counterpart:
    """allRank's function for one of our losses, and how their values line up."""

    name: str  # as shown in the table
    call: Callable  # (logits, y_true with -1 padding) -> scalar
    # (ours_fn, logits, labels, mask) -> (ours aligned to allRank's normalisation, allRank value)
    align: Callable | None = None
    note: str = ""
    distinct: bool = False  # compare values on labels without ties


def _pair_sum(fn, s, y, m):
    """Sum over every pair of the batch (allRank's reduction) from our per-list pair means."""
    return (fn(s, y, mask=m, reduction="none") * valid_pairs(y, m).sum((1, 2))).sum()


def counterparts(A) -> dict[str, Counterpart]:
    if A is None:
        return {}

    def ar(fn, **kw):
        return lambda s, y: fn(s, y, **kw)

    def pairs_align(ar_fn):
        def align(fn, s, y, m):
            return _pair_sum(fn, s, y, m), ar_fn(s, padded_for_allrank(y, m))
        return align

    def ranknet_align(fn, s, y, m):
        n_pairs = valid_pairs(y, m).sum()
        return _pair_sum(fn, s, y, m) / n_pairs, A.rankNet(s, padded_for_allrank(y, m))

    def softmax_align(fn, s, y, m):
        target = torch.where(m, torch.exp(y), torch.zeros_like(y))  # ∝ softmax(y) over real
        return fn(s, target, mask=m), A.listNet(s, padded_for_allrank(y, m))

    def listmle_align(fn, s, y, m):
        return fn(s, y, mask=m, reduction="sum") / y.shape[0], A.listMLE(s, padded_for_allrank(y, m))

    def ndcg_align(ar_fn, over_positive_lists):
        def align(fn, s, y, m):
            ndcg = 1.0 - fn(s, y, mask=m, reduction="none")
            valid = valid_pairs(y, m).any(dim=2).any(dim=1)  # ours: lists with two labels
            den = ((y > 0) & m).any(dim=1).sum() if over_positive_lists else y.shape[0]
            return -ndcg[valid].sum() / den, ar_fn(s, padded_for_allrank(y, m))
        return align

    lambdarank = ar(A.lambdaLoss, weighing_scheme="lambdaRank_scheme", reduction_log="natural")
    lambdaloss = ar(A.lambdaLoss, weighing_scheme="ndcgLoss2PP_scheme", mu=10.0)
    approx = ar(A.approxNDCGLoss, alpha=10.0)  # our temperature 0.1
    neural = ar(A.neuralNDCG, temperature=1.0)
    return {
        "ranknet": Counterpart("rankNet", ar(A.rankNet), ranknet_align,
                               "ours: mean over a list's pairs, then over lists; aligned: Σ pairs / "
                               "all pairs of the batch"),
        "lambdarank": Counterpart("lambdaLoss(lambdaRank_scheme)", lambdarank,
                                  pairs_align(lambdarank),
                                  "aligned: Σ over pairs (allRank's sum), natural log"),
        "lambdaloss": Counterpart("lambdaLoss(ndcgLoss2PP_scheme)", lambdaloss,
                                  pairs_align(lambdaloss), "aligned: Σ over pairs, μ = 10, log2"),
        "softmax": Counterpart("listNet", ar(A.listNet), softmax_align,
                               "listNet's target is softmax(y): ours with labels exp(y)"),
        "listmle": Counterpart("listMLE", ar(A.listMLE), listmle_align,
                               "distinct labels (no random ties); aligned: Σ over lists / G",
                               distinct=True),
        "position_aware_listmle": Counterpart("listMLE", ar(A.listMLE),
                                              note="no position-aware ListMLE in allRank"),
        "approx_ndcg": Counterpart("approxNDCGLoss(alpha=10)", approx, ndcg_align(approx, False),
                                   "allRank: -Σ NDCG / all lists; ours 1 - NDCG, mean over lists "
                                   "with two labels"),
        "neural_ndcg": Counterpart("neuralNDCG", neural, ndcg_align(neural, True),
                                   "allRank: -mean NDCG over lists with a positive, Sinkhorn to "
                                   "tol 1e-6 (max 50 rounds); ours 1 - NDCG, 30 rounds"),
    }


# --- tables ------------------------------------------------------------------------------------
def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f}" if seconds >= 0.01 else f"{seconds * 1e3:,.2f}"


def ratio_cell(ratios: list[float]) -> str:
    med = statistics.median(ratios)
    return f"{med:.2f}× [{min(ratios):.2f}–{max(ratios):.2f}]"


def mb(n: float) -> str:
    return f"{n / 2**20:,.2f}"


def _inputs(name: str, g: int, length: int, distinct: bool = False):
    labels, mask = make_lists(g, length, distinct=distinct)
    shape = (g, length, 2) if name == "jrc" else (g, length)
    logits = torch.randn(shape, generator=torch.Generator().manual_seed(1)).requires_grad_(True)
    return logits, labels, mask


def _too_big(name: str, g: int, length: int) -> bool:
    return name == "neural_ndcg" and g * length * length * SINKHORN_BYTES > MAX_BYTES


def catalogue(shapes, rounds: int, A) -> tuple[str, str]:
    """(speed and memory table, value table) as Markdown."""
    parts = counterparts(A)
    fns = {"bce": bce_loss, **LOSSES}
    head = ["loss", "allRank"]
    for g, length in shapes:
        head += [f"{g}×{length} ours ms (peak MB)", "allRank ms", "speed-up"]
    speed_rows, value_rows = [], []
    for name, fn in fns.items():
        part = parts.get(name)
        row = [name, part.name if part else "—"]
        for g, length in shapes:
            if _too_big(name, g, length):
                row += [f"skipped (~{mb(g * length * length * SINKHORN_BYTES)} est.)", "", ""]
                continue
            logits, labels, mask = _inputs(name, g, length)
            y_ar = padded_for_allrank(labels, mask)

            def ours(fn=fn, logits=logits, labels=labels, mask=mask):
                return fn(logits, labels, mask=mask)

            theirs = (lambda call=part.call, s=logits, y=y_ar: call(s, y)) if part else None
            res = side_by_side(ours, theirs, rounds)
            cell = f"{ms(res['ours'])} ({mb(peak_bytes(ours))})"
            row += [cell, ms(res["theirs"]), ratio_cell(res["ratios"])] if "ratios" in res else [cell, "n/a", "n/a"]
            print(f"  {name} {g}×{length}: {row[-3:]}", flush=True)
        speed_rows.append(row)
        if part and part.align:
            g, length = shapes[0] if name != "neural_ndcg" else (256, 16)
            with torch.no_grad():
                logits, labels, mask = _inputs(name, g, length, distinct=part.distinct)
                a, b = (float(v) for v in part.align(fn, logits, labels, mask))
            rel = abs(a - b) / max(abs(b), 1e-12)
            value_rows.append([name, part.name, f"{g}×{length}", f"{a:.7g}", f"{b:.7g}",
                               f"{rel:.1e}", part.note])
        elif part:
            value_rows.append([name, part.name, "—", "—", "—", "—", part.note])
    values = C.markdown_table(["loss", "allRank", "[G, L]", "ours (aligned)", "allRank",
                               "rel. diff", "alignment"], value_rows) if value_rows else \
        "_allRank is not installed (`pip install --no-deps allrank`): no value comparison._"
    return C.markdown_table(head, speed_rows), values


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


def flat_vs_padded(batch_sizes, list_len: int, repeats: int) -> str:
    """Per batch size ``B``: ours against the flat form, time and peak memory (ratio flat / ours)."""
    rows = []
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
        row = [f"{b:,}"]
        for ours, flat, flat_reps in [(ours_pair, dense, 1 if b > 4096 else repeats), (ours_list, split_pad, repeats)]:
            t_ours, t_flat = timed(ours, repeats), timed(flat, flat_reps)
            m_ours, m_flat = peak_bytes(ours), peak_bytes(flat)
            row += [f"{ms(t_ours)} / {ms(t_flat)} ({t_flat / t_ours:,.0f}×)",
                    f"{mb(m_ours)} / {mb(m_flat)} ({m_flat / max(m_ours, 1):,.1f}×)"]
        rows.append(row)
        print(f"  flat {b}: {row[1:]}", flush=True)
    return C.markdown_table(["B", "pairwise logistic vs dense [B, B]: ms, ours / flat", "MB, ours / flat",
                             "softmax CE vs split + pad_sequence: ms, ours / flat", "MB, ours / flat"], rows)


def parser() -> argparse.ArgumentParser:
    p = C.parser("benchmarks.losses", __doc__)
    p.add_argument("--quick", action="store_true", help="smaller shapes, for a smoke run")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds per cell")
    p.add_argument("--threads", type=int, default=2)
    C.add_docs_options(p)
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    C.check_docs_request(args, ["--quick"] if args.quick else [])
    torch.set_num_threads(args.threads)
    A = load_allrank_losses()
    t0 = time.perf_counter()
    shapes = [(256, 16), (32, 64)] if args.quick else SHAPES
    rounds = 2 if args.quick else args.rounds
    print(f"{C.machine()}; allRank {'found' if A else 'not installed (column n/a)'}\n", flush=True)
    speed, values = catalogue(shapes, rounds, A)
    flat = flat_vs_padded([1024, 2048] if args.quick else [4096, 8192, 16384], 16,
                          1 if args.quick else 3)
    allrank_note = ("allRank's counterpart in the same run, the two alternating run by run"
                    if A else "allRank not installed: `pip install --no-deps allrank` adds it")
    body = "\n\n".join([
        f"Generated {time.strftime('%Y-%m-%d %H:%M')} by `python -m benchmarks.losses` on "
        f"{C.machine()}. Forward + backward from a leaf logits tensor, labels 0..2, ~70 % of "
        f"the slots real; {allrank_note}. A cell is the median over {rounds} rounds of the best "
        "of a few runs (with one thread: the thread's CPU time); the speed-up is allRank's time "
        "over ours, median [min–max] over rounds. Other processes may share the CPU: compare "
        "within a row.",
        "### Every loss, forward + backward (peak memory of ours: torch's CPU memory profiler)", speed,
        "### Values, ours against allRank on the same inputs", values,
        "### Flat-batch forms vs padded lists (lists of 16, B impressions)", flat,
    ])
    print("\n" + body + "\n")
    print(f"total {time.perf_counter() - t0:.0f} s")
    C.write_docs(args, {SECTION: body})


if __name__ == "__main__":
    main()
