"""The ``LightningModule``: scorer + :class:`~hybridrank.losses.HybridLoss` + metrics per stage.

One shared step: score the flat impressions of a batch, gather the scores into the rank lists for
the loss and into the request lists for the metrics. Everything downstream of the scorer (metrics,
export) uses the click logit ``click_logit(out)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytorch_lightning as pl
import torch
from torch import nn

from .lists import Batch, gather_lists
from .losses import HybridLoss, click_logit
from .metrics import ListMetrics

__all__ = ["HybridRanker"]


class HybridRanker(pl.LightningModule):
    """Trains a scorer with a weighted pointwise + ranking loss and reports NDCG and calibration.

    Args:
        scorer: maps ``(num [B, F], cat [B, C])`` to ``[B, loss.n_outputs]`` logits.
        loss: the hybrid loss.
        optimizer: a partial taking the parameters (hydra ``_partial_: true``).
        scheduler: optional partial taking the optimizer.
        metrics: keyword arguments of :class:`~hybridrank.metrics.ListMetrics`.
        schema: the data schema as a dict (feature names, vocabularies, scaler), kept in checkpoints.
        config: the resolved run config, kept in checkpoints so exports can rebuild the scorer.
        neg_keep_rate: share of negatives the training sampler kept (1.0: none dropped).
        neg_weighted: whether kept negatives were re-weighted by 1 / keep-rate in the loss (then
            the scores need no down-sampling correction at export; see docs/EXPORT.md).
        monitor: the metric a scheduler steps on (e.g. ``val/logloss``).
    """

    def __init__(self, scorer: nn.Module, loss: HybridLoss,
                 optimizer: Callable[..., torch.optim.Optimizer] | None = None,
                 scheduler: Callable[..., Any] | None = None,
                 metrics: Mapping[str, Any] | None = None,
                 schema: Mapping[str, Any] | None = None,
                 config: Mapping[str, Any] | None = None,
                 neg_keep_rate: float = 1.0,
                 neg_weighted: bool = True,
                 monitor: str = "val/logloss"):
        super().__init__()
        self.save_hyperparameters(ignore=["scorer", "loss", "optimizer", "scheduler"])
        n_out = getattr(scorer, "n_outputs", None)
        if n_out is not None and n_out != loss.n_outputs:
            raise ValueError(
                f"the loss needs {loss.n_outputs} output(s) per impression but the scorer has {n_out}"
                " (JRC needs two: build the scorer with n_outputs=loss.n_outputs)"
            )
        self.scorer = scorer
        self.loss = loss
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.monitor = monitor
        metric_kwargs = dict(metrics or {})
        self.val_metrics = ListMetrics(**metric_kwargs)
        self.test_metrics = ListMetrics(**metric_kwargs)

    def forward(self, num: torch.Tensor, cat: torch.Tensor) -> torch.Tensor:
        """``[B, n_outputs]`` raw scorer outputs."""
        return self.scorer(num, cat)

    def click_logits(self, batch: Batch) -> torch.Tensor:
        """``[B]`` pCTR logit of every impression of the batch."""
        out = self(batch.num, batch.cat)
        return click_logit(out, n_outputs=out.shape[-1])

    def _outputs(self, batch: Batch) -> torch.Tensor:
        out = self(batch.num, batch.cat)
        return out.squeeze(-1) if out.shape[-1] == 1 else out

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        out = self._outputs(batch)
        logits = gather_lists(out, batch.rank_index, batch.rank_mask)
        labels = gather_lists(batch.label, batch.rank_index, batch.rank_mask)
        weights = None
        if batch.weight is not None:
            weights = gather_lists(batch.weight, batch.rank_index, batch.rank_mask)
        total, parts = self.loss(logits, labels, mask=batch.rank_mask, weights=weights)
        n = len(batch)
        self.log("train/loss", total, batch_size=n, prog_bar=True)
        for name, value in parts.items():
            self.log(f"train/loss_{name}", value, batch_size=n)
        return total

    def _eval_step(self, batch: Batch, metrics) -> None:
        z = self.click_logits(batch).float()
        logits = gather_lists(z, batch.index, batch.mask)
        labels = gather_lists(batch.label, batch.index, batch.mask)
        positions = None
        if batch.position is not None:
            positions = gather_lists(batch.position, batch.index, batch.mask)
        metrics.update(logits, labels, batch.mask, positions=positions)

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self._eval_step(batch, self.val_metrics)

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self._eval_step(batch, self.test_metrics)

    def _log_metrics(self, stage: str, metrics) -> None:
        values = metrics.compute()
        self.log_dict({f"{stage}/{k}": v.float() for k, v in values.items()
                       if isinstance(v, torch.Tensor) and v.numel() == 1})
        metrics.reset()

    def on_validation_epoch_end(self) -> None:
        self._log_metrics("val", self.val_metrics)

    def on_test_epoch_end(self) -> None:
        self._log_metrics("test", self.test_metrics)

    def configure_optimizers(self):
        factory = self.optimizer_factory or (lambda params: torch.optim.Adam(params, lr=1e-3))
        opt = factory(self.parameters())
        if self.scheduler_factory is None:
            return opt
        sched = self.scheduler_factory(opt)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "monitor": self.monitor}}


@torch.no_grad()
def predict_logits(scorer: nn.Module, data, *, chunk: int = 65536) -> torch.Tensor:
    """``[N]`` pCTR logits of every impression of a split, in storage order, in chunks."""
    was_training = scorer.training
    scorer.eval()
    device = next(scorer.parameters()).device
    out = []
    for s in range(0, data.n_impressions, chunk):
        num = data.num[s:s + chunk].to(device)
        cat = data.cat[s:s + chunk].to(device)
        z = scorer(num, cat)
        out.append(click_logit(z, n_outputs=z.shape[-1]).float().cpu())
    scorer.train(was_training)
    return torch.cat(out) if out else torch.zeros(0)


def evaluate_logits(data, logits: torch.Tensor, **metric_kwargs) -> dict[str, float]:
    """Metrics of flat ``[N]`` logits on a split, ranking within requests (one-shot)."""
    from .lists import pad_index

    index, mask = pad_index(data.lengths)
    metric = ListMetrics(**metric_kwargs)
    positions = None if data.position is None else gather_lists(data.position, index, mask)
    metric.update(gather_lists(logits.float(), index, mask), gather_lists(data.label, index, mask),
                  mask, positions=positions)
    return {k: float(v) for k, v in metric.compute().items()
            if isinstance(v, torch.Tensor) and v.numel() == 1}
