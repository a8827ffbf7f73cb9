"""Auction-ready pCTR on the simulated log: position bias and money metrics, with 95 % intervals.

The simulator knows each impression's true click probability at the top slot (``p_true_ref``, the
logged position's effect ``-0.5 log(position)`` removed), which is what an auction that scores
candidates before positions exist needs. Every model is trained on the default simulated log (3
epochs, best epoch on validation log loss) and scored on the test requests.

Part 1, position bias: a model with position as a feature, scored at the logged position (as its
export does) and with the position feature set to 1 (a common work-around), against a
position-bias tower served at position 1 (``experiment=position_bias``): NDCG@10 with the true
top-slot CTR as linear gain, the expected log loss against ``p_true_ref`` (gap to the Bayes
limit), and PCOC against ``p_true_ref``.

Part 2, auction replay (:mod:`hybridrank.serving.auction`): every test request is an auction for 3
slots, GSP, bids as values per click, expected clicks ``p_true_ref × j^-0.5`` in slot ``j``, with
and without an eCPM reserve. Every loss row is trained with the tower and served at position 1, so
the rows differ by their loss alone; beside them two deliberately mis-scaled BCE + tower models
(every pCTR doubled; the logit's distance to the base rate doubled), the position-as-feature BCE
model at the logged position, and the oracle allocation::

    python -m benchmarks.auction --write-docs   # 7 trainings on the default log
    python -m benchmarks.auction --quick        # 600 users, 1 epoch: a smoke test

Writes ``results/auction.json`` and, with ``--write-docs``, the ``auction`` section of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl
import torch

from benchmarks import common as C
from benchmarks.grid import train_hybrid

LOSSES = ("bce", "softmax", "bce_softmax", "bce_calibrated_softmax", "rcr", "jrc")
RESERVE_ECPM = 0.05


def frame_of(test, logits: torch.Tensor, truth: pl.DataFrame) -> pl.DataFrame:
    """The export's columns the replay needs, with the true top-slot CTR joined on."""
    f = pl.DataFrame({"request_id": test.request_key.gather(test.request_of_row().numpy()), "item_id": test.item_key,
                      "bid": test.bid.double().numpy(), "pctr": torch.sigmoid(logits.double()).numpy(),
                      "position": test.position.numpy()})
    f = f.join(truth, on=["request_id", "item_id"], how="left", maintain_order="left")
    assert f["p_true_ref"].null_count() == 0
    return f


def position_feature_at_one(model, test) -> torch.Tensor:
    """A position-as-feature model scored with every candidate's position feature set to 1."""
    j = list(model.schema.numeric).index("position")
    num = test.num.clone()
    num[:, j] = (1.0 - model.schema.mean[j]) / model.schema.std[j]
    return model.predict_split(dataclasses.replace(test, num=num))[0]


def position_table(frames: dict[str, pl.DataFrame], n_boot: int) -> tuple[str, dict]:
    from hybridrank.lists import gather_lists, pad_index
    from hybridrank.metrics.request_stats import ranking_stats, ratio_stats, request_offsets
    from hybridrank.metrics.uncertainty import compare_bootstrap, format_interval

    first = next(iter(frames.values()))
    lengths = np.diff(request_offsets(first["request_id"])[0])
    req = np.repeat(np.arange(len(lengths)), lengths)
    idx, mask = pad_index(torch.from_numpy(lengths))
    p = first["p_true_ref"].to_numpy()
    gains = gather_lists(torch.from_numpy(p), idx, mask)
    stats = {}
    for name, f in frames.items():
        q = np.clip(f["pctr"].to_numpy(), C.EPS, 1 - C.EPS)
        gap = C.xent(q, p) - C.xent(p, p)
        per = lambda v: np.bincount(req, v, minlength=len(lengths))  # noqa: E731
        st = ranking_stats(gather_lists(torch.from_numpy(q), idx, mask), gains, mask=mask, ks=10, gain="linear",
                           include=("ndcg",))
        st = st.merge(ratio_stats(per(gap), per(np.ones_like(q)), name="logloss_gap", sizes=lengths))
        stats[name] = st.merge(ratio_stats(per(q), per(p), name="pcoc_ref", sizes=lengths))
    ivs, paired = compare_bootstrap(stats, n_boot=n_boot, seed=0)
    cols = [("ndcg@10", "NDCG@10 (true top-slot CTR as gain)"), ("logloss_gap", "expected log loss - Bayes"),
            ("pcoc_ref", "PCOC at position 1")]
    lines = ["| model, scored as | " + " | ".join(t for _, t in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    lines += [f"| {name} | " + " | ".join(format_interval(ivs[name][k], 4) for k, _ in cols) + " |" for name in frames]
    lines += ["", f"Paired with `{next(iter(frames))}` (same resamples):", "",
              "| model | Δ NDCG@10 | Δ log-loss gap | Δ PCOC |", "|---|---|---|---|"]
    lines += [f"| {name} | " + " | ".join(str(d[k]).split(": ", 1)[1] for k, _ in cols) + " |"
              for name, d in paired.items()]
    return "\n".join(lines), {n: {k: [iv.estimate, iv.lower, iv.upper] for k, iv in d.items()} for n, d in ivs.items()}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.auction", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="600 users, 1 epoch (smoke test)")
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--out", default=str(C.RESULTS / "auction.json"))
    C.add_docs_options(ap)
    return ap


def main(argv: Sequence[str] | None = None) -> None:
    a = parser().parse_args(argv)
    C.check_docs_request(a, [why for bad, why in [(a.quick, "--quick"), (a.n_boot != 1000, "--n-boot")] if bad])
    C.quiet()
    from hybridrank.cli.auction import compare_auctions
    from hybridrank.data.simulate import simulate_clicklog
    from hybridrank.serving.auction import position_factors

    t0 = time.perf_counter()
    users = 600 if a.quick else 2500
    base = [f"data.source.n_users={users}", f"trainer.max_epochs={1 if a.quick else 3}"]
    truth = simulate_clicklog(n_users=users, seed=0).select("request_id", "item_id", "p_true_ref")
    frames, seconds = {}, {}
    # position as a feature (the default data), scored at the logged position as a naive export does
    t = time.perf_counter()
    run = train_hybrid([*base, "loss=bce"])
    seconds["bce"] = time.perf_counter() - t
    test = run.splits.test
    frames["bce, position feature, logged position"] = frame_of(test, run.model.predict_split(test)[0], truth)
    frames["bce, position feature set to 1"] = frame_of(test, position_feature_at_one(run.model, test), truth)
    # every loss with a position-bias tower: position-free serving pCTR at the top slot
    offsets = None
    for loss in LOSSES:
        t = time.perf_counter()
        run = train_hybrid([*base, f"loss={loss}", "experiment=position_bias"])
        seconds[f"{loss} + position tower"] = s = time.perf_counter() - t
        model, test = run.model, run.splits.test
        frames[f"{loss} + tower"] = frame_of(test, model.predict_split(test)[0], truth)
        if loss == "bce":
            offsets = model.position_bias.offsets()[:10]
            z = model.predict_split(test)[0].double()
            p = torch.sigmoid(z)
            frames["bce + tower, pCTR × 2"] = frame_of(test, torch.logit((2 * p).clamp(max=1 - 1e-6)), truth)
            centre = torch.logit(p.mean())
            frames["bce + tower, over-confident (2× logit spread)"] = frame_of(test, 2 * (z - centre) + centre, truth)
        print(f"trained {loss} + tower in {s:.0f} s", flush=True)

    pos_md, pos_data = position_table({
        "bce, position feature, logged position": frames["bce, position feature, logged position"],
        "bce, position feature set to 1": frames["bce, position feature set to 1"],
        "bce + position tower (serving: position 1)": frames["bce + tower"]}, a.n_boot)
    order = ["bce + tower", *(f"{loss} + tower" for loss in LOSSES if loss != "bce"), "bce + tower, pCTR × 2",
             "bce + tower, over-confident (2× logit spread)", "bce, position feature, logged position"]
    auction_md = {r: compare_auctions({n: frames[n] for n in order}, truth=frames["bce + tower"]["p_true_ref"].to_numpy(),
                                      true_column=None, slots=3, slot_factors=position_factors(3, "power:0.5"),
                                      mechanism="gsp", reserve_ecpm=r, n_boot=a.n_boot)
                  for r in (0.0, RESERVE_ECPM)}
    learned = ", ".join(f"{v:+.2f}" for v in offsets)
    true = ", ".join(f"{-0.5 * np.log(j):+.2f}" for j in range(1, 11))
    body = (f"Simulated log ({users:,} users; test split: {frames['bce + tower']['request_id'].n_unique():,} "
            f"requests, {frames['bce + tower'].height:,} candidates), 3 epochs per model, scored with the best epoch "
            "on validation log loss, no post-hoc calibrator. Truth: the simulator's `p_true_ref`, the true CTR at "
            f"the top slot. 95 % bootstrap intervals over test requests ({a.n_boot} resamples, seed 0). "
            "`python -m benchmarks.auction`.\n\n"
            f"### Position bias: position as a feature vs a bias tower\n\n{pos_md}\n\n"
            f"Learned tower offsets, positions 1..10: {learned} (the simulator's true `-0.5 log(position)`: {true}).\n\n"
            f"### Auction replay: no reserve\n\n{auction_md[0.0]}\n\n"
            f"### Auction replay: eCPM reserve {RESERVE_ECPM}\n\n{auction_md[RESERVE_ECPM]}\n")
    print(body)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"position": pos_data, "offsets": offsets, "train_seconds": seconds,
                                       "auction_md": auction_md, "machine": C.machine()}, indent=2))
    C.write_docs(a, {"auction": body})
    print(f"wall time {(time.perf_counter() - t0) / 60:.1f} min; JSON: {a.out}")


if __name__ == "__main__":
    main()
