"""One runner for grids of hydra overrides: ``train(cfg)`` in-process over override sets x seeds.

Every benchmark trains hybridrank here, with :func:`hybridrank.cli.train.train` (what
``hybridrank-train`` runs) on a config composed in-process: :func:`train_run` (one run; its result
is what ``metrics.json`` holds; :func:`kept_model` loads its kept checkpoint) and :func:`run_grid`
(named override sets x seeds). :func:`grid_table` sets the runs side by side, mean
± std over seeds, with ``train``'s reference rows (the oracle where the truth is known, the base rate).

    python -m benchmarks.grid --set request=data.scope=request --set session=data.scope=session \\
        --seeds 0 1 2 --keys test/ndcg@10 test/logloss -- loss=bce_softmax trainer.max_epochs=3

A set is ``NAME=OVERRIDES`` (several overrides in one quoted argument, separated by spaces); the
overrides after ``--`` apply to every run. Writes every run's figures as JSON with ``--out``.
"""

from __future__ import annotations

import argparse
import shlex
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks import common as C

#: settings of every benchmark run: no progress bar, no logger, no bootstrap intervals
QUIET_RUN = ("trainer.enable_progress_bar=false", "logger=none", "intervals.n_boot=0")
DEFAULT_KEYS = ("test/ndcg@10", "test/logloss", "test/ece", "test/pcoc", "val/logloss", "training.epochs")


def compose_config(overrides: Sequence[str], name: str = "config"):
    """The project config ``name`` (``config``: train's, ``export``, ``eval``) with ``overrides``,
    composed in-process (as the tests do)."""
    from hydra import compose, initialize_config_module

    from hybridrank.cli.train import CONF_MODULE

    with initialize_config_module(CONF_MODULE, version_base="1.3"):
        return compose(name, overrides=list(overrides))


def load_splits(overrides: Sequence[str]):
    """The ``Splits`` of the data config selected by ``overrides`` (loaded once, shared by runs)."""
    import hydra

    cfg = compose_config(["paths.output_dir=unused", *overrides])  # nothing is written
    return hydra.utils.instantiate(cfg.data.source).load()


def train_run(overrides: Sequence[str], out_dir: str | Path, *, splits=None) -> dict[str, Any]:
    """One ``train(cfg)`` run into ``out_dir`` (:data:`QUIET_RUN` first, then ``overrides``);
    its result dict. ``splits``: already loaded data shared by several runs."""
    from hybridrank.cli.train import train

    return train(compose_config([f"paths.output_dir={out_dir}", *QUIET_RUN, *overrides]), splits=splits)


def kept_model(result: Mapping[str, Any]):
    """The kept checkpoint of a :func:`train_run` result as a ``HybridRanker`` on the CPU, in eval
    mode (``predict_split`` scores a split with it under any convention)."""
    from hybridrank.models.ranker import HybridRanker

    if not result.get("best_checkpoint"):
        raise RuntimeError("train() kept no checkpoint; the benchmark needs callbacks=default")
    return HybridRanker.load_from_checkpoint(result["best_checkpoint"], map_location="cpu", weights_only=True).eval()


def run_grid(sets: Mapping[str, Sequence[str]], seeds: Sequence[int] | None = (0,), *,
             base: Sequence[str] = (), out_dir: str | Path | None = None, splits=None,
             progress: Callable[[dict], None] | None = None) -> list[dict[str, Any]]:
    """Train every override set with every seed; one row per run, in order.

    Args:
        sets: ``{name: overrides}``; a run's overrides are ``base``, the set's, then ``seed=<s>``.
        seeds: training seeds (``None``: the config's own seed, no ``seed=`` override).
        out_dir: keep each run under ``out_dir/<name>[/seed<s>]`` (checkpoints included); None:
            temporary folders, removed after each run.
        splits: already loaded data shared by every run.
        progress: called with each row as it is done.

    Returns:
        ``[{"name", "seed", "overrides", "seconds", "result"}]``, ``result`` the dict of
        :func:`hybridrank.cli.train.train` (``metrics.json``).
    """
    rows = []
    for name, overrides in sets.items():
        for seed in (None,) if seeds is None else seeds:
            ov = [*base, *overrides, *([] if seed is None else [f"seed={seed}"])]
            t0 = time.perf_counter()
            with tempfile.TemporaryDirectory(prefix="hybridrank-grid-") as tmp:
                sub = [] if seed is None else [f"seed{seed}"]
                result = train_run(ov, Path(tmp) if out_dir is None else Path(out_dir, name, *sub), splits=splits)
            rows.append({"name": name, "seed": seed, "overrides": ov,
                         "seconds": time.perf_counter() - t0, "result": result})
            if progress is not None:
                progress(rows[-1])
    return rows


def figure(result: Mapping[str, Any], key: str) -> float | None:
    """One figure of a run's result: ``test/...`` and ``val/...`` from those dicts, any other key
    a dotted path (``training.epochs``, ``fit_seconds``); None where the run has none."""
    if "/" in key:
        node = (result.get(key.split("/", 1)[0]) or {}).get(key)
    else:
        node = result
        for part in key.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
    return None if node is None else float(node)


def grid_table(rows: Sequence[Mapping[str, Any]], keys: Sequence[str] = DEFAULT_KEYS, digits: int = 4) -> str:
    """The sets side by side (mean ± std over their seeds), then the reference rows of the runs'
    test splits (``oracle (true pCTR)``, ``base rate``), once per distinct figure set."""
    names = list(dict.fromkeys(r["name"] for r in rows))
    table = []
    for name in names:
        runs = [r for r in rows if r["name"] == name]
        cells = []
        for k in keys:
            vals = [v for v in (figure(r["result"], k) for r in runs) if v is not None]
            cells.append(C.fmt_ms(vals, digits) if vals else "-")
        table.append([name, len(runs), *cells])
    seen = []
    for r in rows:
        for ref, figs in (r["result"].get("reference") or {}).items():
            cells = [C.fmt_ms([figs[k.removeprefix("test/")]], digits) if k.startswith("test/")
                     and k.removeprefix("test/") in figs else "-" for k in keys]
            if (ref, cells) not in seen:
                seen.append((ref, cells))
                table.append([f"*{ref}*", "-", *cells])
    return C.markdown_table(["set", "runs", *keys], table)


def parser() -> argparse.ArgumentParser:
    p = C.parser("benchmarks.grid", __doc__)
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="NAME=OVERRIDES", required=True,
                   help="a named override set (repeat the option); overrides separated by spaces")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--keys", nargs="+", default=list(DEFAULT_KEYS), help="figures of metrics.json to show")
    p.add_argument("--out", type=Path, default=None, help="write every run's figures here (JSON)")
    p.add_argument("base", nargs="*", help="hydra overrides for every run (after --)")
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    sets = {}
    for text in args.sets:
        name, sep, overrides = text.partition("=")
        if not sep or not name:
            raise SystemExit(f"--set: expected NAME=OVERRIDES, got {text!r}")
        sets[name] = shlex.split(overrides)
    C.quiet()

    def progress(row: dict) -> None:
        figs = ", ".join(f"{k} {v:.4f}" for k in args.keys if (v := figure(row["result"], k)) is not None)
        print(f"  {row['name']} seed {row['seed']}: {figs} ({row['seconds']:.0f} s)", flush=True)

    rows = run_grid(sets, args.seeds, base=args.base, progress=progress)
    print("\n" + grid_table(rows, args.keys))
    if args.out is not None:
        C.write_json(args.out, {"base": args.base, "keys": args.keys, "rows": rows})
        print(f"JSON: {args.out}")


if __name__ == "__main__":
    main()
