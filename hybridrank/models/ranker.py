"""The ``LightningModule``: it builds its scorer, owns the loss, and is the one scoring path.

:class:`HybridRanker` receives its parts as configs (what ``conf/model`` holds: ``scorer``,
``loss``, ``optimizer``, ``scheduler``, ``metrics``) plus ``data``, what it was trained on (the
:class:`~hybridrank.data.schema.Schema` with its value policies, the base rate, the negative keep rate).
It builds the scorer itself from the schema's feature sizes and ``loss.n_outputs`` and keeps all of
it in its hyper-parameters, so ``HybridRanker.load_from_checkpoint(path)`` is the one way to get a
trained model back, with nothing else to pass.

Scoring (one path for everything downstream of the scorer): :meth:`HybridRanker.predict` maps flat
impressions to the click logit (and the raw outputs: both logits of a two-output JRC head);
``forward`` is its click logit, :meth:`HybridRanker.predict_split` runs it over a split in chunks of
whole requests. Validation and test metrics, exports, portable (TorchScript / ONNX) models and the
benchmarks all call these; the click logit of raw outputs is :meth:`HybridLoss.click_logit`.
"""

from __future__ import annotations

import copy
import functools
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

import hydra
import pytorch_lightning as pl
import torch
from omegaconf import DictConfig, ListConfig, OmegaConf
from torch import nn

from hybridrank.lists import Batch, ListData, gather_lists
from hybridrank.losses import HybridLoss
from hybridrank.metrics.list_metrics import ListMetrics
from hybridrank.models.optim import SPARSE_MIN_ELEMENTS
from hybridrank.models.position import position_obstacle, resolve_tower
from hybridrank.models.regularisation import EMBEDDING_L2_MODES, embedding_penalty, frequency_penalty, row_weights
from hybridrank.models.scorers import column_tables, shift_click_logit
from hybridrank.models.unseen import UNSEEN_DROPOUT, drop_unseen, probability_tables

__all__ = ["HybridRanker", "serve"]

log = logging.getLogger(__name__)

#: Keys of the ``data`` hyper-parameter (what a model was trained on).
DATA_KEYS = ("schema", "base_rate", "neg_keep_rate", "reweight_negatives", "fingerprint")
MAX_FIELD_VALUES = 100_000  # per calibration field (metrics.fields): sums per value are kept


def serve(scorer: nn.Module, loss: HybridLoss, num: torch.Tensor, cat: torch.Tensor,
          request: torch.Tensor | None = None, position: torch.Tensor | None = None,
          position_bias: nn.Module | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The scoring path, written once: raw scorer outputs and the loss's click logit of them.

    :meth:`HybridRanker.predict` and the portable (TorchScript / ONNX) models both call it. With a
    position-bias tower and a ``position``, the tower's offset is added to the click-logit output
    (the last one: the single logit, or JRC's click logit ``z_1``); without a position the result
    is the serving score, the logit at the tower's reference position.

    Returns:
        ``(logit [B], outputs [B, n_outputs])``.
    """
    out = scorer(num, cat, request)
    if position_bias is not None and position is not None:
        bias = position_bias(position).to(out.dtype).unsqueeze(-1)
        out = torch.cat([out[:, :-1], out[:, -1:] + bias], dim=1)
    return loss.click_logit(out), out


def _plain(node: Any) -> Any:
    """A DictConfig / ListConfig as plain containers (resolved); anything else as it is."""
    if isinstance(node, DictConfig | ListConfig):
        return OmegaConf.to_container(node, resolve=True)
    return node


def _is_plain(v: Any) -> bool:
    """Plain data (what a checkpoint can hold and ``weights_only`` loading can read back)."""
    if v is None or isinstance(v, str | int | float | bool):
        return True
    if isinstance(v, Mapping):
        return all(isinstance(k, str) and _is_plain(x) for k, x in v.items())
    if isinstance(v, list | tuple):
        return all(_is_plain(x) for x in v)
    return False


def _is_config(node: Any) -> bool:
    return isinstance(node, Mapping) and "_target_" in node


def _build(node: Any, what: str) -> Any:
    """Instantiate a ``_target_`` config; pass anything else (an object, a callable) through."""
    if _is_config(node):
        return hydra.utils.instantiate(node, _convert_="all")
    if isinstance(node, Mapping):
        raise ValueError(f"{what}: a config mapping needs a _target_, got keys {sorted(node)}")
    return node


class HybridRanker(pl.LightningModule):
    """Trains a scorer with a weighted pointwise + ranking loss; reports NDCG and calibration.

    Args:
        scorer: the scorer config (``_target_`` + ``_partial_: true`` + options; built with
            ``n_numeric``, ``vocab_sizes`` from ``data["schema"]``, ``n_outputs=loss.n_outputs``
            and ``base_rate``), or a factory taking those keywords, or a built ``nn.Module``.
        loss: a :class:`~hybridrank.losses.HybridLoss` config, or the loss itself.
        optimizer: a config / partial taking the parameters (default Adam, lr 1e-3).
        scheduler: optional config / partial taking the optimizer.
        metrics: :class:`~hybridrank.metrics.list_metrics.ListMetrics` config (``_target_`` optional) or its
            keyword arguments: the conventions of every metric the model reports. Its ``fields``
            is a list of categorical feature names to calibrate by (``f_ece@{name}``; the number
            of values comes from the schema).
        position_bias: optional position-bias tower config (:class:`~hybridrank.models.position.PositionBias`):
            training and validation add ``bias(logged position)`` to the click logit, serving
            (``forward``, exports, portable models) scores at the tower's reference position.
            The data must have positions, and position must not also be a feature.
        data: what the model is trained on: ``schema`` (:meth:`Schema.to_dict`, value policies
            included), ``base_rate`` (train click rate, starts the output bias),
            ``neg_keep_rate`` (share of negatives the sampler kept) and ``reweight_negatives``
            (whether kept negatives were weighted ``1 / keep rate`` in the loss: then exports need
            no down-sampling correction, docs/EXPORT.md), ``fingerprint`` (the files and split
            it was trained on, :mod:`hybridrank.data.fingerprint`: exports that re-read the
            training data check it).
        config: the resolved run config, kept for provenance (exports copy it into their metadata).
        monitor: the metric a scheduler steps on.
        embedding_l2: weight of the L2 penalty on the embedding rows each batch uses, added to
            the training loss; 0 turns it off. Presets per scorer in ``conf/model``.
        embedding_l2_mode: how a row's L2 is counted. ``per_impression`` (the default here):
            every use of the row (:func:`~hybridrank.models.regularisation.embedding_penalty`), so a
            row is shrunk in proportion to its data. ``frequency`` (the presets in
            ``conf/model``): once per training request holding it, divided by how many hold it
            (:func:`~hybridrank.models.regularisation.frequency_penalty`): a prior worth
            ``embedding_l2`` impressions on every row, so rare ids are shrunk most; the counts
            come from the datamodule's ``value_counts()`` (or :meth:`set_value_counts`).
        unseen_dropout: ``good_turing`` (default): in training batches, replace vocabulary codes
            by 0 (out of vocabulary) at the Good-Turing rate of unseen values, rare values most
            (:mod:`hybridrank.models.unseen`), so code 0's embedding row is trained for the values
            serving will meet for the first time; the counts come from the datamodule's
            ``value_counts()`` (or :meth:`set_value_counts`). ``off``: codes as they are. A
            boolean is read as ``good_turing`` (true) / ``off`` (false), as YAML reads a bare
            ``off``. Presets per scorer in ``conf/model``.
        sparse_tables: ``auto`` (default): the scorer's id tables
            (:func:`~hybridrank.models.scorers.column_tables`) give sparse gradients when the
            optimizer updates rows lazily (:class:`~hybridrank.models.optim.LazyAdam`, the presets
            in ``conf/optimizer``) on one device (not under DDP, even with one process) without
            gradient clipping, so a step reads and writes only the rows its batch uses; tables of
            fewer than :data:`~hybridrank.models.optim.SPARSE_MIN_ELEMENTS` weights stay dense
            (their dense step is cheaper). ``true``: every table sparse (an error saying why
            not, where it cannot be); ``false``: dense gradients always.

    Built from configs (as ``hybridrank-train`` does), a checkpoint is self-contained:
    ``HybridRanker.load_from_checkpoint(path)``. Parts given as Python objects are not stored;
    pass them again to ``load_from_checkpoint`` (Lightning's rule for non-serialisable arguments).
    """

    def __setattr__(self, name: str, value: Any) -> None:
        # Lightning names the running hook on the module around every hook call, ~44 times a
        # training step; nn.Module.__setattr__ spends ~2 us on each, checking whether the value
        # is a parameter, buffer or submodule, which a hook's name never is (~0.08 ms a step, a
        # quarter of Lightning's own per-step cost measured on a trivial model)
        if name == "_current_fx_name" and (value is None or type(value) is str):
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    def __init__(self, scorer: Any, loss: Any, optimizer: Any = None, scheduler: Any = None,
                 metrics: Any = None, position_bias: Any = None,
                 data: Mapping[str, Any] | None = None,
                 config: Mapping[str, Any] | None = None, monitor: str = "val/logloss",
                 embedding_l2: float = 0.0, unseen_dropout: str = "good_turing",
                 embedding_l2_mode: str = "per_impression", sparse_tables: str | bool = "auto"):
        super().__init__()
        # position_bias=auto (when: position_known): the tower, unless the data has no display
        # position or uses it as a feature; decided here so that the checkpoint stores the outcome
        data = _plain(dict(data)) if data is not None else None
        tower, self.position_bias_note = resolve_tower(_plain(position_bias), (data or {}).get("schema"))
        if self.position_bias_note:
            log.info("position_bias=auto: no position tower (%s)", self.position_bias_note)
        args = {"scorer": _plain(scorer), "loss": _plain(loss), "optimizer": _plain(optimizer),
                "scheduler": _plain(scheduler), "metrics": _plain(metrics),
                "position_bias": tower, "data": data,
                "config": _plain(config), "monitor": monitor, "embedding_l2": float(embedding_l2),
                "embedding_l2_mode": str(embedding_l2_mode), "sparse_tables": sparse_tables,
                # YAML 1.1 reads a bare `off` as false (and `on` as true)
                "unseen_dropout": ({True: "good_turing", False: "off"}[unseen_dropout]
                                   if isinstance(unseen_dropout, bool) else str(unseen_dropout))}
        if args["unseen_dropout"] not in UNSEEN_DROPOUT:
            raise ValueError(f"unseen_dropout must be one of {list(UNSEEN_DROPOUT)}, got "
                             f"{unseen_dropout!r}")
        unknown = sorted(set(args["data"] or {}) - set(DATA_KEYS))
        if unknown:
            raise ValueError(f"HybridRanker data: unknown keys {unknown}; known {list(DATA_KEYS)}")
        # configs and plain values are stored; built objects are not (see the class docstring)
        self.save_hyperparameters({k: v for k, v in args.items() if _is_plain(v)})
        # the loggers get the hyperparameters without the vocabularies (logged_hparams): they stay
        # in the checkpoint. Lightning's own call wrote them to hparams.yaml through OmegaConf
        # twice a run: 1.2 s of a 2.2 s tiny run at 3.3k ids, ~12 s at 100k ids
        self._log_hyperparams = False
        self.loss: HybridLoss = _build(args["loss"], "loss")
        if not isinstance(self.loss, HybridLoss):
            raise ValueError(f"loss must build a hybridrank.losses.HybridLoss, got {type(self.loss)}")
        self.data_info = dict(args["data"] or {})
        # True only while refit_offsets runs its pass (the validation hooks then feed the tower)
        self._refitting_offsets = False
        self.scorer = self._build_scorer(args["scorer"])
        n_out = getattr(self.scorer, "n_outputs", None)
        if n_out is not None and n_out != self.loss.n_outputs:
            raise ValueError(
                f"the loss needs {self.loss.n_outputs} output(s) per impression but the scorer has "
                f"{n_out} (JRC needs two: build the scorer with n_outputs=loss.n_outputs)")
        self.position_bias = _build(args["position_bias"], "position_bias")
        if self.position_bias is not None:
            self._check_position_bias()
            # DDP must not copy rank 0's buffers over the tower's before every step: each rank's
            # sums are its own (the update all-reduces them), the rest every rank computes alike
            self._ddp_params_and_buffers_to_ignore = [
                f"position_bias.{name}" for name, _ in self.position_bias.named_buffers()]
        self.optimizer_factory = _build(args["optimizer"], "optimizer")
        self.scheduler_factory = _build(args["scheduler"], "scheduler")
        self.metric_config = dict(args["metrics"] or {})
        self.metric_fields = self._resolve_fields(self.metric_config.get("fields") or ())
        self.monitor = monitor
        self.embedding_l2 = float(embedding_l2)
        if self.embedding_l2 < 0:
            raise ValueError(f"embedding_l2 must be >= 0, got {embedding_l2}")
        if self.embedding_l2 > 0 and getattr(self.scorer, "vocab_sizes", ()) and not column_tables(self.scorer):
            raise ValueError(f"embedding_l2 needs the scorer's per-column embedding tables (an "
                             f"nn.ModuleList of nn.Embedding, one per categorical column); "
                             f"{type(self.scorer).__name__} has none")
        self.embedding_l2_mode = args["embedding_l2_mode"]
        if self.embedding_l2_mode not in EMBEDDING_L2_MODES:
            raise ValueError(f"embedding_l2_mode must be one of {list(EMBEDDING_L2_MODES)}, got "
                             f"{embedding_l2_mode!r}")
        # per categorical column the frequency-aware L2's row weights (1 / training count), set
        # with the unseen-value dropout's counts (setup / set_value_counts); not in checkpoints
        self._row_weights: list[torch.Tensor | None] | None = None
        self.unseen_dropout = args["unseen_dropout"]
        if sparse_tables not in ("auto", True, False):
            raise ValueError(f"sparse_tables must be auto, true or false, got {sparse_tables!r}")
        self.sparse_tables = sparse_tables
        # per categorical column its drop probabilities (None: nothing dropped), set from the
        # training counts before the fit (setup / set_value_counts); not saved in checkpoints
        self._unseen_tables: list[torch.Tensor | None] | None = None
        self.unseen_report: dict[str, dict[str, float]] | None = None
        self.val_metrics = self.new_metrics()
        self.test_metrics = self.new_metrics()

    # --- construction ---------------------------------------------------------------------------
    def _build_scorer(self, node: Any) -> nn.Module:
        if isinstance(node, nn.Module):
            return node
        factory = _build(node, "scorer")
        if isinstance(factory, nn.Module):  # a config without _partial_
            return factory
        schema = self.data_info.get("schema")
        if schema is None:
            raise ValueError("HybridRanker needs data={'schema': ...} to build its scorer from a "
                             "config (the feature sizes come from the data)")
        base = self.data_info.get("base_rate")
        return factory(n_numeric=len(self.schema.feature_names),
                       vocab_sizes=list(self.schema.vocab_sizes),
                       n_outputs=self.loss.n_outputs,
                       base_rate=None if base is None else float(base))

    def _check_position_bias(self) -> None:
        if not isinstance(self.position_bias, nn.Module):
            raise ValueError(f"position_bias must build an nn.Module, got {self.position_bias!r}")
        schema = self.data_info.get("schema")
        obstacle = None if schema is None else position_obstacle(schema)
        if obstacle:
            raise ValueError(f"{obstacle}: map a position column in the data config "
                             f"(columns.position) that is not among the numeric features "
                             f"(simulator: data.source.position_feature=false), or train without "
                             f"a tower (position_bias=auto or none)")

    def _resolve_fields(self, names) -> dict[str, tuple[int, int]]:
        """``{name: (column of ListData.cat, number of codes)}`` of the calibration fields."""
        if isinstance(names, str):
            names = [names]
        if not names:
            return {}
        schema = self.schema
        if schema is None:
            raise ValueError("metrics.fields needs the data schema (data={'schema': ...})")
        out = {}
        for name in names:
            if name not in schema.categorical:
                raise ValueError(f"metrics.fields: {name!r} is not a categorical feature; "
                                 f"categorical features: {list(schema.categorical)} (positions "
                                 f"are calibrated by metrics.positions)")
            j = schema.categorical.index(name)
            size = schema.vocab_sizes[j] + 1  # code 0: out of vocabulary / missing
            if size > MAX_FIELD_VALUES:
                raise ValueError(f"metrics.fields: {name!r} has {size:,} codes; field calibration "
                                 f"keeps sums per value, so choose a field with at most "
                                 f"{MAX_FIELD_VALUES:,} (category, device, ...)")
            out[name] = (j, size)
        return out

    @property
    def metric_conventions(self) -> dict[str, Any]:
        """The metric conventions (``ks``, ``gain``, ``bins`` ...): the metrics config without its
        target and fields, as :func:`~hybridrank.metrics.request_stats.flat_stats` takes them."""
        return {k: v for k, v in self.metric_config.items()
                if k not in ("_target_", "_partial_", "fields")}

    def new_metrics(self) -> ListMetrics:
        """A fresh :class:`ListMetrics` with this model's metric conventions and fields."""
        return ListMetrics(fields={n: size for n, (_, size) in self.metric_fields.items()},
                           **self.metric_conventions)

    @property
    def field_columns(self) -> dict[str, int]:
        """``{field: column of ListData.cat}`` of the calibration fields (``metrics.fields``)."""
        return {n: j for n, (j, _) in self.metric_fields.items()}

    def field_codes(self, cat: torch.Tensor, index: torch.Tensor,
                    mask: torch.Tensor) -> dict[str, torch.Tensor] | None:
        """``[G, L]`` codes of the calibration fields from flat ``cat [N, C]``."""
        if not self.metric_fields:
            return None
        return {n: gather_lists(cat[:, j], index, mask) for n, j in self.field_columns.items()}

    @property
    def schema(self):
        """The :class:`~hybridrank.data.schema.Schema` the model reads data with (None if not given)."""
        from hybridrank.data.schema import Schema

        return Schema.coerce(self.data_info.get("schema"))

    # --- the one scoring path -------------------------------------------------------------------
    def predict(self, num: torch.Tensor, cat: torch.Tensor, request: torch.Tensor | None = None,
                position: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Score flat impressions.

        Args:
            num: ``[B, F]`` standardised numeric features. cat: ``[B, C]`` categorical codes.
            request: ``[B]`` request index of each row (rows of a request adjacent), for
                list-aware scorers; others ignore it.
            position: ``[B]`` logged display positions, for models with a position-bias tower:
                given, the score is the click logit at that position (training, validation);
                None, the serving score at the tower's reference position. Ignored otherwise.

        Returns:
            ``(logit [B], outputs [B, n_outputs])``: the click logit (``σ(logit)`` is the model's
            pCTR) and the raw scorer outputs (two-output JRC heads: no-click, click).
        """
        return serve(self.scorer, self.loss, num, cat, request, position, self.position_bias)

    def forward(self, num: torch.Tensor, cat: torch.Tensor,
                request: torch.Tensor | None = None) -> torch.Tensor:
        """``[B]`` click logit: the serving path (what portable exports trace)."""
        return self.predict(num, cat, request)[0]

    @torch.no_grad()
    def predict_split(self, data: ListData, *, chunk_rows: int = 65536,
                      at_logged_position: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logit [N], outputs [N, n_outputs])`` of every impression of a split, storage order.

        Runs in eval mode in chunks of whole requests of about ``chunk_rows`` impressions (a
        list-aware scorer always sees whole requests), on the model's device; float32 on CPU.
        ``at_logged_position``: with a position-bias tower, score each impression at its logged
        position (what its label was drawn at) instead of the serving reference position.
        """
        was_training = self.training
        self.eval()
        device = self.device
        logits, outs = [], []
        logged = at_logged_position and self.position_bias is not None
        if logged and data.position is None:
            raise ValueError("at_logged_position needs data with positions")
        try:
            for part in data.chunks(chunk_rows):
                position = part.position.to(device) if logged else None
                z, out = self.predict(part.num.to(device), part.cat.to(device),
                                      part.request_of_row().to(device), position)
                logits.append(z.float().cpu())
                outs.append(out.float().cpu())
        finally:
            self.train(was_training)
        if not logits:
            return torch.zeros(0), torch.zeros(0, self.loss.n_outputs)
        return torch.cat(logits), torch.cat(outs)

    # --- unseen-value dropout ---------------------------------------------------------------------
    def set_value_counts(self, counts: Mapping[str, Any]) -> dict[str, dict[str, float]]:
        """Set the unseen-value dropout from the training occurrences of each code of each
        vocabulary column (``{column: [V + 1] counts}``, requests holding the code:
        ``ListDataModule.value_counts``; hashed columns left out); returns its report (per column
        the Good-Turing share, the share already at code 0, the share dropped).
        A no-op report ``{}`` under ``unseen_dropout=off``. The same counts give the row weights
        of the frequency-aware embedding L2 (``embedding_l2_mode=frequency``)."""
        if self._frequency_l2:
            schema = self.schema
            self._row_weights = row_weights(counts, schema.categorical, schema.vocab_sizes)
            if schema.categorical and all(w is None for w in self._row_weights):
                log.warning("embedding_l2_mode=frequency: no value counts for any categorical "
                            "column, so no embedding row is penalised")
        if self.unseen_dropout == "off":
            self._unseen_tables, self.unseen_report = None, {}
            return {}
        schema = self.schema
        sizes = dict(zip(schema.categorical, schema.vocab_sizes, strict=True))
        for c, v in counts.items():
            if c not in sizes:
                raise ValueError(f"value counts for {c!r}, which is not a categorical feature "
                                 f"{list(schema.categorical)}")
            if len(v) != sizes[c] + 1:
                raise ValueError(f"value counts of {c!r}: {len(v)} codes, the schema has "
                                 f"{sizes[c] + 1} (code 0 and {sizes[c]} values)")
        tables, report = probability_tables(counts, schema.categorical)
        self._unseen_tables = tables if any(t is not None for t in tables) else None
        self.unseen_report = report
        for c, info in report.items():
            log.info("unseen-value dropout %s: %.2f %% of training occurrences to code 0 "
                     "(Good-Turing share of unseen values %.2f %%, already at code 0 %.2f %%)", c,
                     100 * info["dropped"], 100 * info["good_turing"], 100 * info["already"])
        return report

    def setup(self, stage: str) -> None:
        if stage == "fit" and self.position_bias is not None and self._trainer is not None:
            # a large log diagnoses a sample of its requests from the first epoch on
            requests = getattr(self._trainer.datamodule, "split_requests", None) or {}
            if requests.get("train"):
                self.position_bias.plan_diagnosis(requests["train"])
        if stage != "fit" or self.unseen_report is not None:
            return
        if self.unseen_dropout == "off" and not self._frequency_l2:
            self.set_value_counts({})
            return
        dm = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        counts = getattr(dm, "value_counts", None)
        if counts is None or self.data_info.get("schema") is None:
            if self._frequency_l2:
                raise ValueError("embedding_l2_mode=frequency needs the training value counts: "
                                 "train with a ListDataModule, call set_value_counts before the "
                                 "fit, or set model.embedding_l2_mode=per_impression")
            log.info("unseen-value dropout off: the training data gives no value counts (a "
                     "ListDataModule does; or call set_value_counts before the fit)")
            self.unseen_report = {}
            return
        self.set_value_counts(counts())

    @property
    def _frequency_l2(self) -> bool:
        return self.embedding_l2 > 0 and self.embedding_l2_mode == "frequency"

    def _embedding_penalty(self, cat: torch.Tensor, request: torch.Tensor) -> torch.Tensor:
        """The embedding L2 of a training batch under ``embedding_l2_mode`` (unweighted)."""
        if self.embedding_l2_mode == "per_impression":
            return embedding_penalty(self.scorer, cat)
        weights = self._row_weights
        if weights is None:  # a step outside a fit (whose setup sets the counts or refuses)
            if not getattr(self, "_warned_counts", False):
                import warnings

                self._warned_counts = True
                warnings.warn("embedding_l2_mode=frequency: no value counts (the fit's setup sets "
                              "them from the datamodule's value_counts(); or call "
                              "set_value_counts): the embedding L2 is left out of this step",
                              stacklevel=3)
            return cat.new_zeros((), dtype=torch.float32)
        if any(w is not None and w.device != cat.device for w in weights):
            weights = self._row_weights = [None if w is None else w.to(cat.device) for w in weights]
        return frequency_penalty(self.scorer, cat, request, weights)

    def _training_codes(self, batch: Batch) -> torch.Tensor:
        tables, cat = self._unseen_tables, batch.cat
        if tables is None:
            return cat
        if any(t is not None and t.device != cat.device for t in tables):
            tables = self._unseen_tables = [None if t is None else t.to(cat.device) for t in tables]
        # draws from (run seed, step, rank): the same after a mid-epoch resume, on CPU and GPU
        rank = self._trainer.global_rank if self._trainer is not None else 0
        seed = (torch.initial_seed() * 1_000_003 + self.global_step * 8_191 + rank) % (1 << 63)
        g = torch.Generator().manual_seed(seed)
        return drop_unseen(cat, tables, batch.request, generator=g, n_requests=batch.mask.shape[0])

    # --- training and evaluation steps ----------------------------------------------------------
    @property
    def _uses_positions(self) -> bool:
        return self.position_bias is not None

    def _batch_positions(self, batch: Batch) -> torch.Tensor | None:
        if not self._uses_positions:
            return None
        if batch.position is None:
            raise ValueError("the position-bias tower needs positions in every batch; the data "
                             "has none (map columns.position)")
        return batch.position

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        positions = self._batch_positions(batch)
        cat = self._training_codes(batch)
        z, out = self.predict(batch.num, cat, batch.request, positions)
        if positions is not None:  # the tower's per-slot sums (its exact update runs per epoch)
            self._accumulate_offsets(batch, positions, z.detach(), self.global_step)
            out = self.position_bias.drop_offsets(out, positions)
        logits = gather_lists(out, batch.rank_index, batch.rank_mask)
        labels = gather_lists(batch.label, batch.rank_index, batch.rank_mask)
        weights = None
        if batch.weight is not None:
            weights = gather_lists(batch.weight, batch.rank_index, batch.rank_mask)
        total, parts = self.loss(logits, labels, mask=batch.rank_mask, weights=weights)
        if self.embedding_l2 > 0:
            l2 = self._embedding_penalty(cat, batch.request)
            total = total + self.embedding_l2 * l2
            parts = {**parts, "l2": l2}
        if self._logs_this_step():
            n = len(batch)
            self.log("train/loss", total, batch_size=n, prog_bar=True)
            for name, value in parts.items():
                self.log(f"train/loss_{name}", value, batch_size=n)
        return total

    def _logs_this_step(self) -> bool:
        """Whether this training step's losses are logged: on the steps whose logs Lightning writes
        (every ``trainer.log_every_n_steps``) and on an epoch's last batch (the epoch line's
        ``train/loss``). Each ``self.log`` call costs Lightning a walk over its result collection
        (profiled: a fifth of a CPU step at the default scorer), so the other steps skip it."""
        trainer = self._trainer
        if trainer is None:
            return False
        every = max(int(trainer.log_every_n_steps or 1), 1)
        return (self.global_step + 1) % every == 0 or bool(trainer.is_last_batch)

    def logged_hparams(self) -> dict[str, Any]:
        """The hyperparameters the loggers get: all of them, the schema's vocabularies replaced by
        their sizes (the checkpoint keeps the vocabularies)."""
        hp = copy.deepcopy(dict(self.hparams_initial))
        schema = (hp.get("data") or {}).get("schema")
        if isinstance(schema, dict) and isinstance(schema.get("vocab"), dict):
            schema["vocab"] = {k: f"{len(v)} values (in the checkpoint)"
                               for k, v in schema["vocab"].items()}
        return hp

    def on_fit_start(self) -> None:
        for logger in self.loggers:
            logger.log_hyperparams(self.logged_hparams())

    def _accumulate_offsets(self, batch: Batch, positions: torch.Tensor, z: torch.Tensor,
                            step: int) -> None:
        """Add a batch to the tower's per-slot sums: ``z`` the logits at the logged positions,
        ``step`` seeds the bootstrap weights."""
        self.position_bias.accumulate(
            positions, z - self.position_bias(positions), batch.label, batch.weight, batch.request,
            step, explore=getattr(batch, "explore", None),
            propensity=getattr(batch, "propensity", None), lists=(batch.index, batch.mask))

    def _eval_step(self, batch: Batch, metrics: ListMetrics) -> None:
        # labels were drawn at the logged positions: validation scores there (for a model with a
        # position-bias tower; the serving score is the same at the reference position)
        z = self.predict(batch.num, batch.cat, batch.request, self._batch_positions(batch))[0]
        z = z.float()
        positions = None
        if batch.position is not None:
            positions = gather_lists(batch.position, batch.index, batch.mask)
        metrics.update(gather_lists(z, batch.index, batch.mask),
                       gather_lists(batch.label, batch.index, batch.mask), mask=batch.mask,
                       positions=positions,
                       fields=self.field_codes(batch.cat, batch.index, batch.mask))

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        if self._refitting_offsets:  # refit_offsets: the kept model's sums, no metrics
            positions = self._batch_positions(batch)
            z = self.predict(batch.num, batch.cat, batch.request, positions)[0]
            self._accumulate_offsets(batch, positions, z, self.global_step + 1 + batch_idx)
            return
        self._eval_step(batch, self.val_metrics)

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self._eval_step(batch, self.test_metrics)

    def _log_metrics(self, stage: str, metrics: ListMetrics) -> None:
        values = metrics.compute()
        # compute() has already summed the states of every rank: the values are global and equal
        # on all ranks. sync_dist with max is exact on equal values (a mean could round) and tells
        # Lightning the epoch-level values are synced (no sync_dist warning per metric under DDP).
        self.log_dict({f"{stage}/{k}": v.float() for k, v in values.items()
                       if isinstance(v, torch.Tensor) and v.numel() == 1},
                      sync_dist=True, reduce_fx="max")
        metrics.reset()

    def on_validation_epoch_end(self) -> None:
        if self._refitting_offsets:
            self._update_position_bias()
            return
        self._log_metrics("val", self.val_metrics)

    def _update_position_bias(self) -> None:
        """The tower's exact per-slot step from the sums of the training data seen since the last
        one (all-reduced under DDP); logs how far the offsets moved."""
        if self.position_bias is None:
            return
        trainer = self._trainer
        reduce = None
        if trainer is not None and trainer.world_size > 1:
            def reduce(t: torch.Tensor) -> torch.Tensor:
                return trainer.strategy.reduce(t, reduce_op="sum")
        step = self.position_bias.update(reduce)
        if step is None:
            return
        change, ref_step = step
        # the reference slot's own step goes to the relevance intercept (identical on every rank)
        if not shift_click_logit(self.scorer, ref_step) and not getattr(self, "_warned_shift", False):
            import warnings

            self._warned_shift = True
            warnings.warn(f"{type(self.scorer).__name__} has no click-output bias (a 'head' Linear): "
                          "the position tower's reference step is left to the gradient steps, "
                          "which converge more slowly", stacklevel=2)
        if trainer is not None and not self._refitting_offsets:
            self.log("train/position_offset_change", float(change), sync_dist=False)

    def refit_offsets(self, trainer: pl.Trainer, dataloader: Any, *,
                      limit_batches: int | float | None = None) -> float | None:
        """One more exact per-slot update of the position tower's offsets from this model's logits.

        The per-epoch updates sum logits gathered while the weights still move; a kept model's own
        logits spread more. This pass runs the model as it is, in eval mode, over ``dataloader``
        (e.g. the training split, ``datamodule.eval_dataloader("train")``: every rank its shard,
        the sums all-reduced as in training), adds every batch to the tower's per-slot sums at its
        logged positions, and takes one exact step (the reference slot's step to the relevance
        intercept; bootstrap replicates and diagnosis recomputed). No metric is computed or
        logged. The pass is ``trainer.validate`` (devices, precision and DDP as in validation;
        the bootstrap weights of batch ``i`` seeded by ``global_step + 1 + i``).

        Args:
            trainer: the trainer the model was fitted with (or one like it).
            dataloader: batches of whole requests with positions.
            limit_batches: how many batches to read (an int, or a share as Lightning's
                ``limit_*_batches``); default the trainer's ``limit_val_batches``. The trainer's
                own setting is restored afterwards.

        Returns:
            The largest move of an offset (logit), or None when no slot was updated.
        """
        if self.position_bias is None:
            raise ValueError("refit_offsets needs a position-bias tower (model.position_bias)")
        limit = trainer.limit_val_batches
        if limit_batches is not None:
            trainer.limit_val_batches = limit_batches
        self._refitting_offsets = True
        try:
            trainer.validate(self, dataloaders=dataloader, verbose=False)
        finally:
            self._refitting_offsets = False
            trainer.limit_val_batches = limit
        change = float(self.position_bias.last_change)
        return None if math.isnan(change) else change

    def on_validation_epoch_start(self) -> None:
        # before validation (and so before the checkpoint of this epoch): validation and the
        # checkpoint see the offsets fitted to this epoch's training data
        trainer = self._trainer
        if trainer is not None and trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._update_position_bias()

    def on_train_epoch_end(self) -> None:
        # without a validation loop the update happens here (a no-op when validation ran)
        self._update_position_bias()

    def on_test_epoch_end(self) -> None:
        self._log_metrics("test", self.test_metrics)

    def _sparse_gradients(self, opt: torch.optim.Optimizer) -> None:
        """Give the scorer's id tables sparse gradients under ``sparse_tables`` (see the class
        docstring) for the optimizer ``opt``; dense ones otherwise."""
        trainer = self._trainer
        why = None
        if not getattr(opt, "sparse_rows", False):
            why = f"{type(opt).__name__} takes dense gradients (LazyAdam takes sparse ones)"
        elif trainer is not None and not isinstance(trainer.strategy, pl.strategies.SingleDeviceStrategy):
            why = f"{type(trainer.strategy).__name__} reduces dense gradients"
        elif trainer is not None and trainer.gradient_clip_val:
            why = "gradient clipping reads dense gradients"
        if self.sparse_tables is True and why is not None:
            raise ValueError(f"model.sparse_tables=true: {why}; set it to auto or false")
        sparse = self.sparse_tables is not False and why is None
        for tables in column_tables(self.scorer):
            for t in tables:
                # auto: the tables large enough for the lazy step to cost less than a dense one
                t.sparse = sparse and (self.sparse_tables is True
                                       or t.weight.numel() >= SPARSE_MIN_ELEMENTS)

    def configure_optimizers(self):
        factory: Callable[..., torch.optim.Optimizer] = (
            self.optimizer_factory or (lambda params: torch.optim.Adam(params, lr=1e-3)))
        opt = factory(self.parameters())
        self._sparse_gradients(opt)
        if self.scheduler_factory is None:
            return opt
        # `interval` (a key of the scheduler config, not an argument of the scheduler): when
        # Lightning steps it, after each epoch (default) or each optimizer step (warm-up)
        make, interval = self.scheduler_factory, "epoch"
        if isinstance(make, functools.partial) and "interval" in make.keywords:
            keywords = dict(make.keywords)
            interval = keywords.pop("interval")
            make = functools.partial(make.func, *make.args, **keywords)
        if interval not in ("epoch", "step"):
            raise ValueError(f"model.scheduler.interval must be 'epoch' or 'step', got {interval!r}")
        return {"optimizer": opt, "lr_scheduler": {"scheduler": make(opt), "monitor": self.monitor,
                                                   "interval": interval}}

