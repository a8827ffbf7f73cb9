"""Auction-ready pCTR on the simulated log: position bias and money metrics, with 95 % intervals.

The simulator knows each impression's true click probability at the top slot (``p_true_ref``, the
logged position's effect ``-0.5 log(position)`` removed), which is what an auction that scores
candidates before positions exist needs. Every model is trained on the default simulated log
(3 epochs, best epoch on validation log loss) and scored on the test requests.

Part 1, position bias: a model with position as a feature, scored as its export does (at the
logged position) and with the position feature set to 1 (a common work-around), against a
position-bias tower whose serving score is the logit at position 1 (``experiment=position_bias``):
NDCG@10 with the true top-slot CTR as (linear) gain, the expected log loss against ``p_true_ref``
(gap to its entropy, the Bayes limit), and PCOC against ``p_true_ref``.

Part 2, auction replay (``hybridrank.serving.auction``): every test request is an auction for 3 slots,
GSP, bids as values per click, expected clicks ``p_true_ref × j^-0.5`` in slot ``j`` (the
separable approximation of the simulator's position effect), with and without an eCPM reserve.
Every loss row is trained with the position-bias tower and served at position 1, so the rows
differ by their loss alone: the calibrated hybrids, pure BCE, a pure ranking loss (softmax), two
deliberately mis-scaled versions of the BCE + tower model (every pCTR doubled; and
over-confident, the logit's distance to the base rate doubled:
``logit' = 2 (logit - logit(ctr)) + logit(ctr)``), the position-as-feature BCE model scored at
the logged position (what a naive export hands an auction), and the oracle allocation. A uniform
factor cancels in GSP prices and in the order of ``bid × pCTR``; it matters against a reserve. A
non-uniform distortion changes allocation and prices everywhere.

Usage::

    python scripts/bench_auction.py --write-docs   # 7 trainings on the default log
    python scripts/bench_auction.py --quick        # 600 users, 1 epoch: a smoke test

Writes ``results/auction.json`` and, with ``--write-docs`` (not with ``--quick``), the ``auction``
section of ``docs/BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import _common as C
import numpy as np
import polars as pl
import torch

LOSSES = ("bce", "softmax", "bce_softmax", "bce_calibrated_softmax", "rcr", "jrc")
RESERVE_ECPM = 0.05


def train(overrides: list[str]):
    """Train on the simulated log (``_common.train_hybrid``); return the kept model, the test
    split read with its schema and the wall time."""
    t0 = time.perf_counter()
    run = C.train_hybrid(overrides)
    return run.model, run.splits.test, time.perf_counter() - t0


def frame_of(test, logits: torch.Tensor, truth: pl.DataFrame) -> pl.DataFrame:
    """The export's columns the replay needs, with the true top-slot CTR joined on."""
    req = test.request_key.gather(test.request_of_row().numpy())
    f = pl.DataFrame({"request_id": req, "item_id": test.item_key, "bid": test.bid.double().numpy(),
                      "pctr": torch.sigmoid(logits.double()).numpy(),
                      "position": test.position.numpy()})
    f = f.join(truth, on=["request_id", "item_id"], how="left", maintain_order="left")
    assert f["p_true_ref"].null_count() == 0
    return f


def position_feature_at_one(model, test) -> torch.Tensor:
    """A position-as-feature model scored with every candidate's position feature set to 1."""
    import dataclasses

    schema = model.schema
    j = list(schema.numeric).index("position")
    num = test.num.clone()
    num[:, j] = (1.0 - schema.mean[j]) / schema.std[j]
    return model.predict_split(dataclasses.replace(test, num=num))[0]


def position_table(frames: dict[str, pl.DataFrame], n_boot: int) -> tuple[str, dict]:
    from hybridrank.lists import gather_lists, pad_index
    from hybridrank.metrics.request_stats import ranking_stats, ratio_stats
    from hybridrank.metrics.uncertainty import compare_bootstrap, format_interval

    first = next(iter(frames.values()))
    lengths = first.group_by("request_id", maintain_order=True).len()["len"].to_numpy()
    req = np.repeat(np.arange(len(lengths)), lengths)
    idx, mask = pad_index(torch.from_numpy(lengths))
    p = first["p_true_ref"].to_numpy()
    gains = gather_lists(torch.from_numpy(p), idx, mask)
    xent_bayes = -(p * np.log(p) + (1 - p) * np.log1p(-p))
    stats = {}
    for name, f in frames.items():
        q = np.clip(f["pctr"].to_numpy(), 1e-7, 1 - 1e-7)
        gap = -(p * np.log(q) + (1 - p) * np.log1p(-q)) - xent_bayes
        per = lambda v: np.bincount(req, v, minlength=len(lengths))  # noqa: E731
        st = ranking_stats(gather_lists(torch.from_numpy(q), idx, mask), gains, mask=mask, ks=10,
                           gain="linear", include=("ndcg",))
        st = st.merge(ratio_stats(per(gap), per(np.ones_like(q)), name="logloss_gap", sizes=lengths))
        st = st.merge(ratio_stats(per(q), per(p), name="pcoc_ref", sizes=lengths))
        stats[name] = st
    ivs, paired = compare_bootstrap(stats, n_boot=n_boot, seed=0)
    cols = [("ndcg@10", "NDCG@10 (true top-slot CTR as gain)"),
            ("logloss_gap", "expected log loss - Bayes"), ("pcoc_ref", "PCOC at position 1")]
    lines = ["| model, scored as | " + " | ".join(t for _, t in cols) + " |",
             "|---" * (len(cols) + 1) + "|"]
    for name in frames:
        lines.append(f"| {name} | " + " | ".join(format_interval(ivs[name][k], 4) for k, _ in cols)
                     + " |")
    base = next(iter(frames))
    lines += ["", f"Paired with `{base}` (same resamples):", "",
              "| model | Δ NDCG@10 | Δ log-loss gap | Δ PCOC |", "|---|---|---|---|"]
    for name, d in paired.items():
        lines.append(f"| {name} | " + " | ".join(str(d[k]).split(": ", 1)[1] for k, _ in cols) + " |")
    data = {n: {k: [iv.estimate, iv.lower, iv.upper] for k, iv in d.items()} for n, d in ivs.items()}
    return "\n".join(lines), data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="600 users, 1 epoch (smoke test)")
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--out", default=str(C.RESULTS / "auction.json"))
    C.add_docs_options(ap)
    a = ap.parse_args()
    C.check_docs_request(a, [why for bad, why in [(a.quick, "--quick"), (a.n_boot != 1000, "--n-boot")]
                             if bad])
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
    bce_model, bce_test, seconds["bce"] = train([*base, "loss=bce"])
    frames["bce, position feature, logged position"] = frame_of(
        bce_test, bce_model.predict_split(bce_test)[0], truth)
    frames["bce, position feature set to 1"] = frame_of(
        bce_test, position_feature_at_one(bce_model, bce_test), truth)
    # every loss with a position-bias tower: position-free serving pCTR at the top slot
    offsets = None
    for loss in LOSSES:
        model, test, s = train([*base, f"loss={loss}", "experiment=position_bias"])
        seconds[f"{loss} + position tower"] = s
        frames[f"{loss} + tower"] = frame_of(test, model.predict_split(test)[0], truth)
        if loss == "bce":
            offsets = model.position_bias.offsets()[:10]
            z = model.predict_split(test)[0].double()
            p = torch.sigmoid(z)
            frames["bce + tower, pCTR × 2"] = frame_of(
                test, torch.logit((2 * p).clamp(max=1 - 1e-6)), truth)
            centre = torch.logit(p.mean())
            frames["bce + tower, over-confident (2× logit spread)"] = frame_of(
                test, 2 * (z - centre) + centre, truth)
        print(f"trained {loss} + tower in {s:.0f} s", flush=True)

    pos_frames = {"bce, position feature, logged position":
                  frames["bce, position feature, logged position"],
                  "bce, position feature set to 1": frames["bce, position feature set to 1"],
                  "bce + position tower (serving: position 1)": frames["bce + tower"]}
    pos_md, pos_data = position_table(pos_frames, a.n_boot)
    factors = position_factors(3, "power:0.5")
    order = ["bce + tower", *(f"{loss} + tower" for loss in LOSSES if loss != "bce"),
             "bce + tower, pCTR × 2", "bce + tower, over-confident (2× logit spread)",
             "bce, position feature, logged position"]
    replay = {n: frames[n] for n in order}
    truth_p = frames["bce + tower"]["p_true_ref"].to_numpy()
    auction_md = {r: compare_auctions(replay, truth=truth_p,
                                      true_column=None, slots=3, slot_factors=factors,
                                      mechanism="gsp", reserve_ecpm=r, n_boot=a.n_boot)
                  for r in (0.0, RESERVE_ECPM)}
    learned = ", ".join(f"{v:+.2f}" for v in offsets)
    true = ", ".join(f"{-0.5 * np.log(j):+.2f}" for j in range(1, 11))
    n_req = frames["bce + tower"]["request_id"].n_unique()
    body = (f"Simulated log ({users:,} users; test split: {n_req:,} requests, "
            f"{frames['bce + tower'].height:,} candidates), 3 epochs per model, scored with the best epoch on "
            f"validation log loss, no post-hoc calibrator. Truth: the simulator's `p_true_ref`, the "
            f"true CTR at the top slot. 95 % bootstrap intervals over test requests ({a.n_boot} "
            f"resamples, seed 0). `python scripts/bench_auction.py`.\n\n"
            f"### Position bias: position as a feature vs a bias tower\n\n{pos_md}\n\n"
            f"Learned tower offsets, positions 1..10: {learned} (the simulator's true "
            f"`-0.5 log(position)`: {true}).\n\n"
            f"### Auction replay: no reserve\n\n{auction_md[0.0]}\n\n"
            f"### Auction replay: eCPM reserve {RESERVE_ECPM}\n\n{auction_md[RESERVE_ECPM]}\n")
    print(body)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"position": pos_data, "offsets": offsets,
                                       "train_seconds": seconds, "auction_md": auction_md,
                                       "machine": C.machine()}, indent=2))
    C.write_docs(a, {"auction": body})
    print(f"wall time {(time.perf_counter() - t0) / 60:.1f} min; JSON: {a.out}")


if __name__ == "__main__":
    main()
