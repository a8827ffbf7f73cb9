"""Training throughput, side by side in one run: impressions per second, the median of timed epochs.

For every combination of device (``cpu``; ``cuda`` where present), precision, batch budget,
scorer and loss, on one simulated log, after a warm-up epoch of each path:

- **floor**: the compute alone, a plain loop (``training_step`` + backward + Adam) over batches
  built beforehand and already on the device: what no data path can beat;
- **plain loop**: the same loop over the data module's live batches (batch building included);
- **Lightning**: the ``Trainer`` epoch that ``hybridrank-train`` runs (its logging, hooks and
  loop), with the share of the epoch spent waiting for the next batch and the ratio to the plain
  loop (what the framework costs): the plain epochs run between the Lightning ones, and the ratio
  is the median over these pairs (a machine whose speed drifts during the run slows both alike);
- **peak memory**: the device's peak allocated memory during the Lightning epoch (CUDA only).

The model is built from the shipped configs (``model=<scorer> loss=<loss>``), as
``hybridrank-train`` builds it; the position tower is off (the simulator's position is a feature).
Timings are wall-clock: run it on an idle machine and compare rows of one run, not runs.

Usage::

    python -m benchmarks.train                                  # cpu, 4,096, mlp, bce
    python -m benchmarks.train --devices cpu,cuda --precisions 32-true,bf16-mixed \\
        --budgets 4096,65536 --scorers mlp,dcnv2 --losses bce,bce_lambdaloss --users 27500
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import time
from dataclasses import dataclass

import pytorch_lightning as pl
import torch

from benchmarks import common as C
from benchmarks.grid import compose_config
from hybridrank.cli.train import build_model
from hybridrank.data.datamodule import ListDataModule
from hybridrank.data.sources import SimulatedSource


class DataWait(pl.Callback):
    """Per training epoch ``(seconds, seconds waiting for a batch, impressions)``: the wait is the
    time between one batch's end and the next one's start (fetching the batch)."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.total = self.wait = 0.0
        self.n = 0
        self.epochs: list[tuple[float, float, int]] = []

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def on_train_epoch_start(self, trainer, module):
        self._sync()
        self.t0 = self.t_end = time.perf_counter()
        self.wait, self.n = 0.0, 0
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.wait += time.perf_counter() - self.t_end
        self.n += len(batch)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.t_end = time.perf_counter()

    def on_train_epoch_end(self, trainer, module):
        self._sync()
        self.total = time.perf_counter() - self.t0
        self.epochs.append((self.total, self.wait, self.n))
        self.peak = torch.cuda.max_memory_allocated() if self.cuda else None


@dataclass
class Row:
    device: str
    precision: str
    budget: int
    scorer: str
    loss: str
    floor: float
    plain: float
    lightning: float
    ratio: float  # the median over epoch pairs of Lightning's rate / the plain loop's
    wait_share: float
    peak_mib: float | None


def _autocast(device: str, precision: str):
    if precision.startswith("bf16"):
        return torch.autocast(device_type=device, dtype=torch.bfloat16)
    if precision.startswith("16"):
        return torch.autocast(device_type=device, dtype=torch.float16)
    return contextlib.nullcontext()


def _steps(model, batches, device: str, precision: str) -> tuple[float, int]:
    """Seconds and impressions of one pass of plain training steps over ``batches``."""
    opt = model.configure_optimizers()
    opt = opt["optimizer"] if isinstance(opt, dict) else opt
    model.train()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t, n = time.perf_counter(), 0
    for i, b in enumerate(batches):
        with _autocast(device, precision):
            loss = model.training_step(b, i)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        n += len(b)
    sync()
    return time.perf_counter() - t, n


def measure(splits, device: str, precision: str, budget: int, scorer: str, loss: str,
            warmup: int, repeats: int = 3) -> Row:
    """One row: each path's median over ``repeats`` timed epochs after ``warmup`` epochs."""
    cfg = compose_config([f"model={scorer}", f"loss={loss}", "position_bias=none", "paths.output_dir=.",
                          f"data.budget={budget}"])
    dm = ListDataModule(splits=splits, budget=budget, max_unit_size=min(512, budget),
                        device=device, device_batches=device != "cpu")
    cuda = device == "cuda"

    def fresh_model():
        torch.manual_seed(0)
        m = build_model(cfg, dm).to(device)
        m.set_value_counts(dm.value_counts())  # unseen-value dropout, as a fit sets it up
        return m

    # the plain loops run under the determinism setting the Lightning epoch runs with (the
    # shipped trainer.deterministic: Trainer sets it process-wide, so without this the first
    # row's plain loops would run without it and later rows' with it)
    torch.use_deterministic_algorithms(bool(cfg.trainer.deterministic))
    # floor: every batch of an epoch built first, on the device
    model = fresh_model()
    batches = list(dm.train_stream(0))
    for _ in range(warmup):
        _steps(model, batches, device, precision)
    floor_s, n = _median([_steps(model, batches, device, precision) for _ in range(repeats)])
    del batches
    # the plain loop over live batches and the Lightning epochs, interleaved: a plain epoch after
    # each Lightning one (outside its timing), so that the shared machine's speed drifting during
    # the run hits both alike; the ratio is the median over these pairs
    plain_model = fresh_model()
    for e in range(warmup):
        _steps(plain_model, dm.train_stream(e), device, precision)
    plain: list[tuple[float, int]] = []

    class Interleave(pl.Callback):
        def on_train_epoch_end(self, trainer, module):
            if trainer.current_epoch >= warmup:
                with torch.enable_grad():
                    plain.append(_steps(plain_model, dm.train_stream(trainer.current_epoch), device, precision))

    model = fresh_model()
    wait = DataWait(cuda)
    # the shipped trainer settings that act on a training epoch; no checkpoints, no validation
    shipped = {k: cfg.trainer[k] for k in ("deterministic", "log_every_n_steps",
                                           "use_distributed_sampler", "reload_dataloaders_every_n_epochs")}
    trainer = pl.Trainer(accelerator="gpu" if cuda else "cpu", devices=1, precision=precision,
                         max_epochs=warmup + repeats, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                         num_sanity_val_steps=0, callbacks=[wait, Interleave()], **shipped)
    trainer.fit(model, datamodule=dm)
    timed = wait.epochs[warmup:]  # (seconds, wait, impressions) of each timed Lightning epoch
    ratios = sorted((nl / tl) / (npl / tp) for (tl, _, nl), (tp, npl) in zip(timed, plain, strict=True))
    total, waited, n_l = sorted(timed)[(repeats - 1) // 2]  # the median epoch
    plain_s, n_p = _median(plain)
    return Row(device, precision, budget, scorer, loss, n / floor_s, n_p / plain_s, n_l / total,
               ratios[(repeats - 1) // 2], waited / total, None if wait.peak is None else wait.peak / 2**20)


def _median(timings: list[tuple[float, int]]) -> tuple[float, int]:
    """The median ``(seconds, impressions)`` of timed passes (the lower middle one of an even count)."""
    return sorted(timings)[(len(timings) - 1) // 2]


def parser() -> argparse.ArgumentParser:
    ap = C.parser("benchmarks.train", __doc__)
    ap.add_argument("--users", type=int, default=9200, help="simulated users (9,200 ~ 1M impressions)")
    ap.add_argument("--devices", default="cpu", help="comma-separated: cpu, cuda")
    ap.add_argument("--precisions", default="32-true", help="comma-separated Lightning precisions")
    ap.add_argument("--budgets", default="4096", help="comma-separated impressions per batch")
    ap.add_argument("--scorers", default="mlp", help="comma-separated conf/model options")
    ap.add_argument("--losses", default="bce", help="comma-separated conf/loss options")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--warmup", type=int, default=1, help="warm-up epochs before the timed ones")
    ap.add_argument("--repeats", type=int, default=3, help="timed epochs per path; the median is reported")
    return ap


def main(argv: list[str] | None = None) -> None:
    a = parser().parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    devices = a.devices.split(",")
    if "cuda" in devices and not torch.cuda.is_available():
        raise SystemExit("--devices cuda: this machine has no CUDA device")
    t = time.perf_counter()
    splits = SimulatedSource(n_users=a.users, seed=0, split={"by": "time", "val": 0.0001,
                                                             "test": 0.0001}).load()
    load_s = time.perf_counter() - t
    rows = [measure(splits, d, p, int(b), s, lo, a.warmup, a.repeats) for d, p, b, s, lo in itertools.product(
        devices, a.precisions.split(","), a.budgets.split(","), a.scorers.split(","),
        a.losses.split(","))]
    name = {"cpu": f"cpu ({torch.get_num_threads()} threads)"}
    if torch.cuda.is_available():
        name["cuda"] = f"cuda ({torch.cuda.get_device_name()})"
    print(f"\nsimulated log: {splits.train.n_impressions:,} training impressions in "
          f"{splits.train.n_requests:,} requests (simulate + load: {load_s:.1f} s); torch "
          f"{torch.__version__}; the median of {a.repeats} timed epoch(s) after {a.warmup} warm-up epoch(s)\n")
    print("| device | precision | budget | scorer | loss | floor imp/s | plain loop imp/s | "
          "Lightning imp/s | Lightning / plain | data wait | peak MiB |")
    print("|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        peak = "—" if r.peak_mib is None else f"{r.peak_mib:,.0f}"
        print(f"| {name.get(r.device, r.device)} | {r.precision} | {r.budget:,} | {r.scorer} | {r.loss} | "
              f"{r.floor:,.0f} | {r.plain:,.0f} | {r.lightning:,.0f} | {r.ratio:.2f} | "
              f"{100 * r.wait_share:.0f} % | {peak} |")


if __name__ == "__main__":
    main()
