"""Training throughput: impressions per second for one epoch on a ~1M-impression simulated log.

Measures, side by side in one run on the default model (embeddings + MLP, BCE + softmax CE):
- the data path alone (sampler + vectorised collation into padded batches),
- a plain PyTorch loop (data + forward + backward + Adam step),
- the Lightning ``Trainer`` epoch (what ``hybridrank-train`` runs), with the share of the epoch
  spent waiting on data (time between the end of one batch and the start of the next).

Usage: python scripts/bench_train.py [--users 9200] [--budget 4096] [--scope request]
"""

from __future__ import annotations

import argparse
import time

import pytorch_lightning as pl
import torch

from hybridrank.data.datamodule import ListDataModule
from hybridrank.data.sources import SimulatedSource
from hybridrank.lists import gather_lists
from hybridrank.losses import HybridLoss
from hybridrank.models.ranker import HybridRanker
from hybridrank.models.scorers import MLPScorer


class DataWait(pl.Callback):
    """Accumulates the time between one batch's end and the next batch's start (data fetching)."""

    def __init__(self):
        self.wait = 0.0
        self.t_end = None
        self.t0 = None
        self.n = 0

    def on_train_epoch_start(self, trainer, module):
        self.t0 = self.t_end = time.perf_counter()

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.wait += time.perf_counter() - self.t_end
        self.n += len(batch)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.t_end = time.perf_counter()

    def on_train_epoch_end(self, trainer, module):
        self.total = time.perf_counter() - self.t0


def make_loss() -> HybridLoss:
    return HybridLoss(point_weight=0.5, terms={"softmax": {"loss": "softmax", "weight": 0.5}})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=9200, help="simulated users (9,200 ~ 1M impressions)")
    ap.add_argument("--budget", type=int, default=4096, help="impressions per batch")
    ap.add_argument("--scope", default="request", help="ranking-term scope: request | session | user")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    t = time.perf_counter()
    splits = SimulatedSource(n_users=a.users, seed=0, split={"by": "time", "val": 0.0001, "test": 0.0001}).load()
    load_s = time.perf_counter() - t
    train = splits.train
    n = train.n_impressions
    dm = ListDataModule(splits=splits, budget=a.budget, scope=a.scope, max_unit_size=min(512, a.budget))

    # 1) data path alone
    loader = dm.train_dataloader()
    t = time.perf_counter()
    n_batches = sum(1 for _ in loader)
    data_s = time.perf_counter() - t

    # 2) plain PyTorch loop
    torch.manual_seed(0)
    loss = make_loss()
    scorer = MLPScorer(train.num.shape[1], list(splits.schema.vocab_sizes), base_rate=0.03)
    opt = torch.optim.Adam(scorer.parameters(), lr=2e-3)
    t = time.perf_counter()
    for b in dm.train_dataloader():
        out = scorer(b.num, b.cat, b.request).squeeze(-1)
        total, _ = loss(gather_lists(out, b.rank_index, b.rank_mask),
                        gather_lists(b.label, b.rank_index, b.rank_mask), mask=b.rank_mask,
                        weights=None if b.weight is None else gather_lists(b.weight, b.rank_index, b.rank_mask))
        opt.zero_grad(set_to_none=True)
        total.backward()
        opt.step()
    loop_s = time.perf_counter() - t

    # 3) Lightning epoch
    torch.manual_seed(0)
    # with the schema, as hybridrank-train builds it: the steps then do what a CLI run's do
    # (unseen-value dropout from the datamodule's counts included)
    module = HybridRanker(MLPScorer(train.num.shape[1], list(splits.schema.vocab_sizes), base_rate=0.03),
                          make_loss(), data={"schema": splits.schema.to_dict(), "base_rate": 0.03})
    wait = DataWait()
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
                         use_distributed_sampler=False, callbacks=[wait], log_every_n_steps=50)
    trainer.fit(module, datamodule=dm)

    rows = [
        ("data only (sampler + collation)", data_s, None),
        ("PyTorch loop (data + fwd + bwd + Adam)", loop_s, data_s / loop_s),
        ("Lightning Trainer epoch", wait.total, wait.wait / wait.total),
    ]
    print(f"\nsimulated log: {n:,} training impressions in {train.n_requests:,} requests, "
          f"{n_batches} batches of <= {a.budget:,} impressions, scope={a.scope}, "
          f"{torch.get_num_threads()} threads (simulate + load + tensorise: {load_s:.1f} s)\n")
    print("| path | seconds | impressions / s | data share |")
    print("|---|---:|---:|---:|")
    for name, s, share in rows:
        sh = "n/a" if share is None else f"{100 * share:.1f} %"
        print(f"| {name} | {s:.2f} | {n / s:,.0f} | {sh} |")


if __name__ == "__main__":
    main()
