"""The ``LightningDataModule`` of every source: a thin shell around a :class:`~hybridrank.data.source.
Source` and the one batch builder (:class:`~hybridrank.data.stream.BatchStream`)."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import polars
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from hybridrank.data.period_levels import PeriodCheck, check_periods
from hybridrank.data.readers import ColumnMap, request_key_expr
from hybridrank.data.sampler import POOLING_SCOPES, negative_counts
from hybridrank.data.source import Source, Splits
from hybridrank.data.sources import SplitsSource
from hybridrank.data.splits import SPLITS
from hybridrank.data.stream import BatchStream
from hybridrank.lists import ListData

__all__ = ["ListDataModule", "ResumableLoader", "DEVICE_BATCHES"]

log = logging.getLogger(__name__)

#: Values of ``data.device_batches``: where batches are built when training on an accelerator.
DEVICE_BATCHES = ("auto", True, False)

# BatchStream's __len__ is this rank's exact batch count and loader workers build disjoint batches
# of it, so Lightning's generic warning about an IterableDataset with __len__ does not apply.
warnings.filterwarnings("ignore", message=r"Your `IterableDataset` has `__len__` defined",
                        category=UserWarning)


class ResumableLoader(DataLoader):
    """A DataLoader over a training :class:`BatchStream` that resumes in the middle of an epoch.

    Lightning stores ``state_dict()`` in every checkpoint (the loader is "stateful") and hands it
    back through ``load_state_dict`` on resume; the stream then skips the batches the interrupted
    run had already trained on (planned, not collated). The epoch's batches themselves are a
    function of ``(seed, epoch)``, so the resumed run sees exactly the batches the uninterrupted
    run would have seen.

    Args:
        stream: the training :class:`BatchStream`, its epoch set.
        progress: returns how many batches of the current epoch have been trained on.
    """

    def __init__(self, stream: BatchStream, progress: Callable[[], int] | None = None,
                 num_workers: int = 0):
        super().__init__(stream, batch_size=None, collate_fn=_identity, num_workers=num_workers)
        self.stream = stream
        self.epoch = stream.epoch
        self._progress = progress

    def state_dict(self) -> dict[str, Any]:
        done = self._progress() if self._progress is not None else 0
        try:
            n = len(self.stream)
        except TypeError:  # a several-chunk source: known only as it streams
            n = None
        return {"epoch": self.epoch, "seed": self.stream.seed, "batches_done": int(done),
                "n_batches": n}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("seed", self.stream.seed) != self.stream.seed:
            raise ValueError(f"the checkpoint's sampler seed {state['seed']} differs from the "
                             f"configured seed {self.stream.seed}: the resumed epoch would differ")
        done, n = int(state.get("batches_done", 0)), state.get("n_batches")
        if state.get("epoch") == self.epoch and done > 0 and (n is None or done < n):
            self.stream.start = done


#: the smallest batch ``min_batches`` shrinks the budget to (impressions)
MIN_FITTED_BUDGET = 512


def fitted_budget(train_rows: int, budget: int, min_batches: int,
                  max_unit_size: int | None) -> int:
    """The training batch budget for a split of ``train_rows`` impressions: ``budget``, or less so
    that an epoch has at least ``min_batches`` batches, never under :data:`MIN_FITTED_BUDGET` nor
    under ``max_unit_size`` (every capped unit must fit one batch). ``min_batches=0`` or
    ``max_unit_size=None`` (units of any size): ``budget``.

    >>> fitted_budget(20_000, 4096, 32, 512)     # 625 impressions: 32 batches an epoch
    625
    >>> fitted_budget(9_000, 4096, 32, 512)      # never under 512
    512
    >>> fitted_budget(1_000_000, 4096, 32, 512)  # a large log keeps the budget
    4096
    """
    if not min_batches or max_unit_size is None:
        return budget
    return min(budget, max(MIN_FITTED_BUDGET, max_unit_size, -(-train_rows // min_batches)))


class ListDataModule(pl.LightningDataModule):
    """Serves batches of whole requests for train / val / test (what ``conf/data`` builds), for
    every source: in memory (one chunk) or streamed (many).

    Training batches follow the batching keys (budget, pooling scope, capping, shuffling);
    evaluation batches hold whole requests in storage order with scope ``request``.
    Under DDP each rank gets its own disjoint shard of whole batches (the trainer must run with
    ``use_distributed_sampler=False``: the batch builder shards by itself).

    The first use runs one pass over the training rows (:meth:`model_data`): the source fits its
    schema there (unless it has one) and each chunk's training requests are counted for the
    negative keep rate (:func:`~hybridrank.data.sampler.negative_counts`).

    Args:
        source: a :class:`~hybridrank.data.source.Source`: ``SimulatedSource``, ``LetorSource``,
            ``ClickLogSource``, ``StreamingClickLogSource``.
        splits: already loaded ``Splits`` instead of a source.
        budget: impressions per training batch, at most (see ``min_batches``).
        min_batches: a small training split gets smaller batches, so that an epoch has at least
            this many (0, the default here: ``budget`` as given; the shipped config,
            ``conf/batching/default.yaml``, sets 32). After the first pass over the training rows the
            budget becomes ``min(budget, max(MIN_FITTED_BUDGET, max_unit_size,
            ceil(rows / min_batches)))``; with capping off (``max_unit_size=None``) it stays as
            given. Why: at 4,096 impressions a 20k-impression log has five steps an epoch, and
            early stopping (counted in epochs) ends training after a few dozen steps; on small
            logs smaller batches gave lower test log loss for every scorer (docs/BENCHMARKS.md,
            "Batch size on small logs"). Logs over ``budget * min_batches`` impressions keep
            ``budget``. Under DDP the count is over all ranks together (each rank gets its
            share of the batches).
        scope: ranking-term pooling scope: ``request``, ``session``, ``user``, ``user_window``.
        window: window length for ``user_window``.
        max_unit_size: cap on a unit's impressions (negatives dropped at random).
        reweight_negatives: weight the kept negatives of capped units ``1 / keep rate`` in the
            loss (default: the pointwise loss stays unbiased and exports need no correction).
        eval_budget: impressions per evaluation batch.
        shuffle: shuffle units (and chunks) each epoch.
        seed: sampler seed.
        num_workers: DataLoader workers (0 is usually fastest in memory: batches are tensor
            gathers; a streamed log reads its next chunk in a thread anyway, ``prefetch``).
        device_batches: build batches on the training device (``device``): ``"auto"`` (default)
            when training on an accelerator with ``num_workers=0`` and, on CUDA, a one-chunk split
            taking at most half the free device memory; ``True`` always (an error with loader
            workers); ``False`` never (batches built on the host, copied to the device every
            step). On the device, each split of an in-memory source is copied there once and stays
            for the run: it costs its size (:attr:`ListData.nbytes`, logged) in device memory; a
            streamed log holds one chunk there, two while the next is prefetched. The batches are
            exactly those built on the host (:class:`~hybridrank.data.stream.BatchStream`).
        device: where batches are built when ``device_batches`` allows (None: the trainer's root
            device, the CPU without a trainer).
        prefetch: a streamed log reads (and copies) its next chunk in a background thread while
            the current one trains; two chunks are then in memory. ``"auto"`` (default): when
            training on an accelerator (the CPU is free while the device computes), not on the
            CPU, where torch's threads already use the cores and the reading thread only competes
            with them (streamed training at 3.24M impressions on 2 cores: 8.9 s an epoch without,
            9.9-11.7 s with); ``True`` / ``False``: always / never.
    """

    def __init__(self, source: Source | None = None, *, splits: Splits | None = None,
                 budget: int = 4096, min_batches: int = 0, scope: str = "request",
                 window: float | None = None,
                 max_unit_size: int | None = 512, reweight_negatives: bool = True,
                 eval_budget: int = 16384, shuffle: bool = True, seed: int = 0,
                 num_workers: int = 0, device_batches: str | bool = "auto",
                 device: torch.device | str | None = None, prefetch: str | bool = "auto"):
        super().__init__()
        if (source is None) == (splits is None):
            raise ValueError("ListDataModule needs exactly one of source= and splits=")
        if splits is not None:
            source = SplitsSource(splits)
        if not isinstance(source, Source):
            raise TypeError(f"ListDataModule: source must be a hybridrank.data.sources.Source "
                            f"(SimulatedSource, LetorSource, ClickLogSource, "
                            f"StreamingClickLogSource), got {type(source).__name__}")
        if scope not in POOLING_SCOPES:
            raise ValueError(f"unknown sampler scope {scope!r}; choose one of {POOLING_SCOPES}")
        if budget < 1:
            raise ValueError(f"sampler budget must be positive, got {budget}")
        if isinstance(min_batches, bool) or not isinstance(min_batches, int) or min_batches < 0:
            raise ValueError(f"data.min_batches must be a whole number >= 0 (0: off), got "
                             f"{min_batches!r}")
        self.source = source
        #: the budget as configured; ``budget`` is what training uses (``min_batches``)
        self.max_budget, self.min_batches = int(budget), int(min_batches)
        self.budget, self.scope, self.window = int(budget), scope, window
        self.max_unit_size = None if max_unit_size is None else min(int(max_unit_size), self.budget)
        self.reweight_negatives = bool(reweight_negatives)
        self.eval_budget, self.shuffle, self.seed = int(eval_budget), shuffle, int(seed)
        if isinstance(device_batches, str):
            device_batches = {"true": True, "false": False}.get(device_batches.lower(),
                                                                device_batches.lower())
        if not (device_batches == "auto" or isinstance(device_batches, bool)):
            raise ValueError(f"data.device_batches must be auto, true or false, got "
                             f"{device_batches!r}")
        self.num_workers = num_workers
        self.device_batches = device_batches
        self.device = None if device is None else torch.device(device)
        if isinstance(prefetch, str):
            prefetch = {"true": True, "false": False}.get(prefetch.lower(), prefetch.lower())
        if not (prefetch == "auto" or isinstance(prefetch, bool)):
            raise ValueError(f"data.prefetch must be auto, true or false, got {prefetch!r}")
        self.prefetch = prefetch
        self._resident: dict = {}  # device copies of one-chunk splits, kept for the run
        self._model_data: dict[str, Any] | None = None
        self._value_counts: dict[str, np.ndarray] | None = None
        #: the click levels of the periods (:mod:`hybridrank.data.period_levels`), set by model_data
        self.period_check: PeriodCheck | None = None
        self.split_rows: dict[str, int] | None = None
        self.split_requests: dict[str, int] | None = None
        self._tally: RequestValueTally | None = None
        if splits is not None:  # fail now, not in the middle of the first epoch
            self.model_data()

    @property
    def splits(self) -> Splits:
        """Every split whole (a one-chunk source; :meth:`Source.load`)."""
        self.model_data()
        return self.source.load()

    @property
    def schema(self):
        self.model_data()
        return self.source.schema

    @property
    def neg_keep_rate(self) -> float:
        return float(self.model_data()["neg_keep_rate"])

    def model_data(self) -> dict[str, Any]:
        """What a model trained on this data records (the ``data`` argument of ``HybridRanker``):
        schema, base rate, negative keep rate and the data's fingerprint. One pass over the
        training rows (cached); with ``fit_rows`` the rates are those of the fitted rows."""
        if self._model_data is None:
            counts = [0, 0]  # negatives, negatives kept

            def count(requests: ListData) -> None:
                neg, kept = negative_counts(requests, self.scope, self.window, self.max_unit_size,
                                            budget=self.budget)
                counts[0] += neg
                counts[1] += kept

            # a several-chunk source: which requests hold which value, tallied during this pass,
            # so that value_counts() needs no second pass over the training rows
            tally = None
            if not self.source.one_chunk:  # (the layout first: some sources learn their columns there)
                columns = self.source.columns_for_fit()
                hashed = {c for c, p in (self.source.vocab or {}).items() if p.hashed}
                if set(columns.categorical) - hashed:
                    tally = RequestValueTally(columns, skip=hashed)
            stats = self.source.scan(on_train=count, on_train_frame=tally.add if tally else None)
            complete = stats.get("complete", True)   # False: a partial pass (fit_rows)
            self._tally = tally if complete else None
            self.source.check_splits(SPLITS)
            self._check_periods()
            rows, pos = stats["train"]["rows"], stats["train"]["positives"]
            if complete:
                self.budget = fitted_budget(int(rows), self.max_budget, self.min_batches,
                                            self.max_unit_size)
                if self.budget < self.max_budget:
                    log.info("data: %s training impressions: batches of %s impressions "
                             "(data.budget %s, data.min_batches %s)", f"{rows:,}",
                             f"{self.budget:,}", f"{self.max_budget:,}", self.min_batches)
            #: impressions per split (None after a partial pass, ``fit_rows``)
            self.split_rows = {s: int(stats[s]["rows"]) for s in SPLITS} if complete else None
            #: requests per split (None after a partial pass)
            self.split_requests = {s: int(stats[s]["requests"]) for s in SPLITS} if complete else None
            self._model_data = {
                "schema": self.source.schema.to_dict(),
                "base_rate": pos / rows if rows else None,
                "neg_keep_rate": counts[1] / counts[0] if counts[0] else 1.0,
                "reweight_negatives": self.reweight_negatives,
                "fingerprint": self.source.fingerprint(),
            }
        return self._model_data

    def _check_periods(self) -> None:
        """Warn when validation cannot show the test period's click level (a one-chunk source
        with request times: :func:`~hybridrank.data.period_levels.check_periods`)."""
        if not self.source.one_chunk:
            return
        splits = self.source.load()
        self.period_check = check_periods(splits.train, splits.val, splits.test)
        message = self.period_check.message if self.period_check is not None else None
        if message:
            log.warning("%s", message)
            warnings.warn(message, UserWarning, stacklevel=3)

    def value_counts(self) -> dict[str, np.ndarray]:
        """Occurrences of each code of each vocabulary categorical in the training requests:
        ``{column: [V + 1] int64}``, the number of requests whose rows hold the code (a value
        repeated within a request counts once: a user column repeats on every row of its request,
        an item column rarely does). Code 0 is missing or out of vocabulary; hashed columns are
        left out. What the model's unseen-value dropout is set from
        (:mod:`hybridrank.models.unseen`). Cached; free for a one-chunk source, one more read of
        the training rows for a streamed one."""
        if self._value_counts is None:
            schema = self.schema
            cols = [(j, c, v) for j, (c, v) in enumerate(zip(schema.categorical, schema.vocab_sizes,
                                                              strict=True)) if c in schema.vocab]
            tallied = self._tally.counts(schema) if self._tally is not None else None
            self._tally = None
            if tallied is not None:
                self._value_counts = tallied
                return tallied
            counts = {c: np.zeros(v + 1, dtype=np.int64) for _, c, v in cols}
            for part in (self.eval_chunks("train") if cols else ()):
                request = part.request_of_row().numpy()
                cat = part.cat.numpy()
                starts = part.offsets[:-1].numpy()[part.lengths.numpy() > 0]
                same_request = request[1:] == request[:-1]
                for j, c, v in cols:
                    codes = cat[:, j]
                    if np.array_equal(codes[1:][same_request], codes[:-1][same_request]):
                        # one value per request (a user, a query): its first row stands for it
                        counts[c] += np.bincount(codes[starts], minlength=v + 1)
                        continue
                    # (request, code) pairs, each once. The keys are already grouped by request,
                    # so a stable sort (timsort on runs) and a comparison of neighbours is ~50x
                    # faster than np.unique's hash on a million rows
                    keys = np.sort(request * (v + 1) + codes, kind="stable")
                    first = np.ones(keys.size, dtype=bool)
                    np.not_equal(keys[1:], keys[:-1], out=first[1:])
                    counts[c] += np.bincount(keys[first] % (v + 1), minlength=v + 1)
            self._value_counts = counts
        return self._value_counts

    def eval_chunks(self, split: str, max_rows: int | None = None) -> Iterator[ListData]:
        """The requests of a split (``train``, ``val``, ``test``) as ``ListData`` pieces of whole
        requests of at most ``max_rows`` impressions (None: each chunk of the source whole)."""
        self.model_data()
        yield from self.source.chunks(split, max_rows)

    def _world(self) -> tuple[int, int]:
        trainer = self.trainer
        if trainer is None:
            return 1, 0
        return trainer.world_size, trainer.global_rank

    def batch_device(self, split: str = "train") -> torch.device | None:
        """Where the batches of ``split`` are built (None: on the host, and Lightning copies them
        to the training device): ``device`` (default the trainer's root device) as
        ``device_batches`` allows (see the class docstring)."""
        if self.device_batches is False:
            return None
        device = self._training_device()
        if device.type == "cpu":
            return device
        if self.num_workers:
            if self.device_batches is True:
                raise ValueError(
                    f"data.device_batches=true builds batches on {device}, which DataLoader "
                    f"workers (data.num_workers={self.num_workers}) cannot do: set "
                    f"data.num_workers=0, or data.device_batches=auto")
            return None
        resident = any(key[1] == split and key[2] == str(device) for key in self._resident)
        if (self.device_batches == "auto" and device.type == "cuda" and self.source.one_chunk
                and not resident):  # once there, a split stays (its own size is not free)
            data = self.source.read_chunk(self.source.layout()[0], split)
            free = torch.cuda.mem_get_info(device)[0]
            if data is not None and data.nbytes > free // 2:
                log.info("data: the %s split (%.1f MB) takes more than half the free memory of "
                         "%s (%.1f MB): its batches are built on the host", split,
                         data.nbytes / 2**20, device, free / 2**20)
                return None
        return device

    def teardown(self, stage: str) -> None:
        """Frees the device copies of the splits."""
        self._resident.clear()

    def _stream(self, split: str, **kwargs) -> BatchStream:
        world, rank = self._world()
        return BatchStream(self.source, split=split, num_replicas=world, rank=rank,
                           device=self.batch_device(split), prefetch=self.prefetches(),
                           resident=self._resident, **kwargs)

    def prefetches(self) -> bool:
        """Does a streamed log read its next chunk in a background thread (``prefetch``; auto:
        when the training device, ``device`` or the trainer's root device, is not the CPU)?"""
        if self.prefetch != "auto":
            return self.prefetch
        return self._training_device().type != "cpu"

    def _training_device(self) -> torch.device:
        """``device``, else the trainer's root device, else the CPU (no trainer)."""
        if self.device is not None:
            return self.device
        trainer = self.trainer
        return trainer.strategy.root_device if trainer is not None else torch.device("cpu")

    def _epoch(self) -> int:
        return self.trainer.current_epoch if self.trainer is not None else 0

    def train_stream(self, epoch: int = 0) -> BatchStream:
        """The training batches of ``epoch`` for this process."""
        self.model_data()
        stream = self._stream("train", budget=self.budget, scope=self.scope, window=self.window,
                              max_unit_size=self.max_unit_size,
                              reweight_negatives=self.reweight_negatives, shuffle=self.shuffle,
                              seed=self.seed)
        stream.set_epoch(epoch)
        if self.source.one_chunk:
            len(stream)  # plan the epoch now: packing errors surface before the first batch
        return stream

    def train_dataloader(self) -> DataLoader:
        return ResumableLoader(self.train_stream(self._epoch()), progress=self._batches_done,
                               num_workers=self.num_workers)

    def _batches_done(self) -> int:
        """Batches of the current epoch already trained on (read when a checkpoint is saved)."""
        if self.trainer is None:
            return 0
        return self.trainer.fit_loop.epoch_loop.batch_progress.current.processed

    def eval_dataloader(self, split: str) -> DataLoader:
        self.model_data()
        stream = self._stream(split, budget=self.eval_budget, scope="request", max_unit_size=None,
                              shuffle=False, seed=self.seed, fit_longest=True,
                              equal_batches=False)
        stream.set_epoch(0)
        return DataLoader(stream, batch_size=None, collate_fn=_identity,
                          num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        return self.eval_dataloader("val")

    def test_dataloader(self) -> DataLoader:
        return self.eval_dataloader("test")


class RequestValueTally:
    """How many training requests hold each value of each categorical column, gathered chunk by
    chunk during the schema's pass over a several-chunk source (chunks hold whole requests, so the
    per-chunk counts add up), for :meth:`ListDataModule.value_counts` without a second pass.

    The values are tallied before any vocabulary exists; :meth:`counts` maps them to codes. That
    is exact unless two distinct values of one request both land on code 0 (out of vocabulary),
    where the code-0 count would take that request twice: it cannot happen when every tallied
    value is in the vocabulary (missing values count as one value) or when the column holds one
    value per request (a user); otherwise :meth:`counts` returns None and the caller makes the pass.
    """

    _COMPACT = 8  # per-chunk tables merged every this many chunks (bounded memory)

    def __init__(self, columns: ColumnMap, skip: Iterable[str] = ()):
        self.key = request_key_expr(columns)
        self.columns = [c for c in columns.categorical if c not in set(skip)]   # skip: hashed ones
        self.tables: dict[str, list[polars.DataFrame]] = {c: [] for c in self.columns}
        self.one_per_request = dict.fromkeys(self.columns, True)
        self.absent: set[str] = set()

    def add(self, frame: polars.DataFrame) -> None:
        """Add a chunk's validated training frame (whole requests)."""
        here = [c for c in self.columns if c in frame.columns]
        self.absent.update(c for c in self.columns if c not in frame.columns)   # derived later
        req = frame.select(self.key.alias("__r"), *here)   # values as read: codes() maps them later
        n_req = req["__r"].n_unique()
        for c in here:
            # per value, the requests holding it; they sum to the (request, value) pairs
            counts = req.group_by(c).agg(polars.col("__r").n_unique().cast(polars.Int64).alias("n"))
            if int(counts["n"].sum()) != n_req:
                self.one_per_request[c] = False
            parts = self.tables[c]
            parts.append(counts)
            if len(parts) >= self._COMPACT:
                self.tables[c] = [self._merged(parts)]

    @staticmethod
    def _merged(parts: list[polars.DataFrame]) -> polars.DataFrame:
        t = polars.concat(parts, how="vertical_relaxed")
        return t.group_by(t.columns[0]).agg(polars.col("n").sum())

    def counts(self, schema) -> dict[str, np.ndarray] | None:
        """``{column: [V + 1] int64}`` for the schema's vocabulary columns, as
        :meth:`ListDataModule.value_counts` defines them; None where the tally cannot be exact."""
        out = {}
        for c, v in zip(schema.categorical, schema.vocab_sizes, strict=True):
            if c not in schema.vocab:
                continue
            if c not in self.tables or c in self.absent:
                return None
            t = self._merged(self.tables[c]) if self.tables[c] else polars.DataFrame(
                {c: polars.Series([], dtype=polars.String), "n": polars.Series([], dtype=polars.Int64)})
            codes = schema.codes(c, t[c])
            if not self.one_per_request[c] and bool(((codes == 0) & t[c].is_not_null().to_numpy()).any()):
                return None
            out[c] = np.bincount(codes, weights=t["n"].to_numpy(), minlength=v + 1).astype(np.int64)
        return out


def _identity(batch):
    return batch
