"""Run by tests/test_ddp.py in a subprocess: Lightning re-launches this script once per rank.

Trains one epoch with DDP on CPU (gloo), records which impressions every rank saw, and validates a
fixed model; writes everything under the output folder given as the first argument.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytorch_lightning as pl
import torch

from hybridrank.data.datamodule import ListDataModule
from hybridrank.data.sources import SimulatedSource
from hybridrank.losses import HybridLoss
from hybridrank.models.ranker import HybridRanker
from hybridrank.models.scorers import MLPScorer


class RecordRows(pl.Callback):
    def __init__(self, out: Path):
        self.out, self.rows = out, []

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.rows.append(batch.rows.cpu())

    def on_train_epoch_end(self, trainer, module):
        rows = torch.cat(self.rows) if self.rows else torch.zeros(0, dtype=torch.long)
        torch.save(rows, self.out / f"rows_rank{trainer.global_rank}_epoch{trainer.current_epoch}.pt")
        self.rows = []


def main(out: Path, devices: int) -> None:
    pl.seed_everything(0, workers=True, verbose=False)
    splits = SimulatedSource(n_users=200, seed=0).load()
    dm = ListDataModule(splits=splits, budget=1024, scope="session", max_unit_size=None,
                        eval_budget=2048)
    loss = HybridLoss(point_weight=0.5, terms={"softmax": {"loss": "softmax", "weight": 0.5}})
    torch.manual_seed(0)
    scorer = MLPScorer(splits.train.num.shape[1], list(splits.schema.vocab_sizes), base_rate=0.03)
    module = HybridRanker(scorer, loss)
    kwargs = dict(accelerator="cpu", devices=devices, max_epochs=2, logger=False,
                  enable_checkpointing=False, enable_progress_bar=False,
                  use_distributed_sampler=False, reload_dataloaders_every_n_epochs=1,
                  num_sanity_val_steps=0, enable_model_summary=False, check_val_every_n_epoch=100)
    if devices > 1:
        kwargs["strategy"] = "ddp"
    trainer = pl.Trainer(callbacks=[RecordRows(out)], **kwargs)
    # validation of the untrained (identically seeded) model: must equal the single-process one
    val = trainer.validate(module, datamodule=dm, verbose=False)[0]
    trainer.fit(module, datamodule=dm)
    if trainer.is_global_zero:
        (out / "val.json").write_text(json.dumps({k: float(v) for k, v in val.items()}))
        (out / "n_impressions.json").write_text(json.dumps(splits.train.n_impressions))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
