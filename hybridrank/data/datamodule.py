"""The ``LightningDataModule``: a thin shell around :class:`~hybridrank.data.sources.Splits` and the sampler."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytorch_lightning as pl
from torch.utils.data import DataLoader

from hybridrank.data.sampler import GroupBatchSampler, ListDataset
from hybridrank.lists import ListData

__all__ = ["ListDataModule", "ResumableLoader"]


class ResumableLoader(DataLoader):
    """A DataLoader over a :class:`GroupBatchSampler` that resumes in the middle of an epoch.

    Lightning stores ``state_dict()`` in every checkpoint (the loader is "stateful") and hands it
    back through ``load_state_dict`` on resume; the sampler then skips the batches the interrupted
    run had already trained on. The epoch's batches themselves are a function of ``(seed, epoch)``,
    so the resumed run sees exactly the batches the uninterrupted run would have seen.

    Args:
        dataset: the :class:`ListDataset` turning request indices into batches.
        sampler: the group-aware sampler of this epoch.
        progress: returns how many batches of the current epoch have been trained on.
    """

    def __init__(self, dataset: ListDataset, sampler: GroupBatchSampler,
                 progress: Callable[[], int] | None = None, num_workers: int = 0):
        super().__init__(dataset, sampler=sampler, batch_size=None, collate_fn=_identity,
                         num_workers=num_workers)
        self._progress = progress

    def state_dict(self) -> dict[str, Any]:
        done = self._progress() if self._progress is not None else 0
        return {"epoch": self.sampler.epoch, "seed": self.sampler.seed, "batches_done": int(done),
                "n_batches": len(self.sampler)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("seed", self.sampler.seed) != self.sampler.seed:
            raise ValueError(f"the checkpoint's sampler seed {state['seed']} differs from the "
                             f"configured seed {self.sampler.seed}: the resumed epoch would differ")
        if state.get("epoch") == self.sampler.epoch and state.get("batches_done", 0) < len(self.sampler):
            self.sampler.start = int(state["batches_done"])


class ListDataModule(pl.LightningDataModule):
    """Serves batches of whole requests for train / val / test (what ``conf/data`` builds).

    Training batches follow the batching keys (budget, pooling scope, capping, shuffling);
    evaluation batches hold whole requests in storage order with scope ``request``.
    Under DDP each rank gets its own disjoint shard of whole batches (the trainer must run with
    ``use_distributed_sampler=False``: the group-aware sampler does the sharding itself).

    Args:
        source: a data source (``.load() -> Splits``): ``SimulatedSource``, ``LetorSource``,
            ``ClickLogSource``. Loaded once, on first use.
        splits: already loaded ``Splits`` instead of a source.
        budget: impressions per training batch.
        scope: ranking-term pooling scope: ``request``, ``session``, ``user``, ``user_window``.
        window: window length for ``user_window``.
        max_unit_size: cap on a unit's impressions (negatives dropped at random).
        reweight_negatives: weight the kept negatives of capped units ``1 / keep rate`` in the
            loss (default: the pointwise loss stays unbiased and exports need no correction).
        eval_budget: impressions per evaluation batch.
        shuffle: shuffle units each epoch.
        seed: sampler seed.
        num_workers: DataLoader workers (0 is usually fastest: batches are tensor gathers).
    """

    def __init__(self, source=None, *, splits=None, budget: int = 4096, scope: str = "request",
                 window: float | None = None, max_unit_size: int | None = 512,
                 reweight_negatives: bool = True, eval_budget: int = 16384,
                 shuffle: bool = True, seed: int = 0, num_workers: int = 0):
        super().__init__()
        if (source is None) == (splits is None):
            raise ValueError("ListDataModule needs exactly one of source= and splits=")
        self.source, self._splits = source, splits
        self.budget, self.scope, self.window = budget, scope, window
        self.max_unit_size = None if max_unit_size is None else min(max_unit_size, budget)
        self.reweight_negatives = bool(reweight_negatives)
        self.eval_budget, self.shuffle, self.seed, self.num_workers = eval_budget, shuffle, seed, num_workers
        self._neg_keep_rate: float | None = None
        if splits is not None:
            self._check()

    @property
    def splits(self):
        """The loaded ``Splits`` (the source is read on first access)."""
        if self._splits is None:
            self._splits = self.source.load()
            self._check()
        return self._splits

    def _check(self) -> None:
        # fail before training, not in the middle of the first epoch; the share of negatives the
        # sampler keeps is a property of the data and the cap, the same every epoch
        self._neg_keep_rate = self.train_sampler(epoch=0).neg_keep_rate

    @property
    def schema(self):
        return self.splits.schema

    @property
    def neg_keep_rate(self) -> float:
        _ = self.splits
        return float(self._neg_keep_rate)

    def model_data(self) -> dict[str, Any]:
        """What a model trained on this data records (the ``data`` argument of ``HybridRanker``)."""
        train = self.splits.train
        return {"schema": self.schema.to_dict(),
                "base_rate": float((train.label > 0).float().mean()) if train.n_impressions else None,
                "neg_keep_rate": self.neg_keep_rate,
                "reweight_negatives": self.reweight_negatives}

    def eval_chunks(self, split: str, max_rows: int | None = None) -> Iterator[ListData]:
        """The requests of a split (``train``, ``val``, ``test``) as ``ListData`` pieces of whole
        requests of at most ``max_rows`` impressions (default: the whole split at once)."""
        data = getattr(self.splits, split)
        if max_rows is None:
            yield data
        else:
            yield from data.chunks(max_rows)

    def _world(self) -> tuple[int, int]:
        trainer = self.trainer
        if trainer is None:
            return 1, 0
        return trainer.world_size, trainer.global_rank

    def train_sampler(self, epoch: int) -> GroupBatchSampler:
        world, rank = self._world()
        sampler = GroupBatchSampler(
            self.splits.train, budget=self.budget, scope=self.scope, window=self.window,
            max_unit_size=self.max_unit_size, shuffle=self.shuffle, seed=self.seed,
            num_replicas=world, rank=rank,
        )
        sampler.set_epoch(epoch)
        return sampler

    def train_dataloader(self) -> DataLoader:
        epoch = self.trainer.current_epoch if self.trainer is not None else 0
        ds = ListDataset(self.splits.train, scope=self.scope, window=self.window,
                         max_unit_size=self.max_unit_size, seed=self.seed,
                         reweight_negatives=self.reweight_negatives)
        return ResumableLoader(ds, self.train_sampler(epoch), progress=self._batches_done,
                               num_workers=self.num_workers)

    def _batches_done(self) -> int:
        """Batches of the current epoch already trained on (read when a checkpoint is saved)."""
        if self.trainer is None:
            return 0
        return self.trainer.fit_loop.epoch_loop.batch_progress.current.processed

    def eval_dataloader(self, data: ListData) -> DataLoader:
        world, rank = self._world()
        budget = max(self.eval_budget, int(data.lengths.max()))
        sampler = GroupBatchSampler(data, budget=budget, scope="request", shuffle=False,
                                    num_replicas=world, rank=rank)
        return DataLoader(ListDataset(data), sampler=sampler, batch_size=None, collate_fn=_identity,
                          num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        return self.eval_dataloader(self.splits.val)

    def test_dataloader(self) -> DataLoader:
        return self.eval_dataloader(self.splits.test)


def _identity(batch):
    return batch
