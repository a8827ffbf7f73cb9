"""Helpers shared by the benchmark scripts (not part of the installed package).

- where the real data lives and how the MQ2008 folds are built from the parts S1..S5;
- the one way the scripts train a hybridrank model: :func:`train_hybrid`, which composes the
  config and calls :func:`hybridrank.cli.train.train` (what ``hybridrank-train`` runs), on data
  it loads or on already loaded splits shared by several runs;
- the one LightGBM fitter, :func:`fit_lightgbm` (``binary`` / ``lambdarank``, early stopping on
  the validation part), and :func:`require_lightgbm`: a missing optional dependency is an error;
- scoring any model's flat logits with :func:`hybridrank.evaluation.evaluate_logits` under several
  metric conventions, so LightGBM and hybridrank rows share one code path;
- mean ± std formatting and rewriting one marked section of ``docs/BENCHMARKS.md``, only when
  asked (``--write-docs``, :func:`add_docs_options`) and only after a complete run
  (:func:`write_docs`).

The scripts run as ``python scripts/<name>.py`` from the repository root; they import this module
as ``_common`` (Python puts the script's folder on ``sys.path``).
"""

from __future__ import annotations

import logging
import math
import os
import platform
import re
import statistics
import tempfile
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "BENCHMARKS.md"
RESULTS = ROOT / "results"


def data_root() -> Path:
    """The shared data folder: ``$HYBRIDRANK_REAL_DATA``, else ``../shared/data`` next to the repo."""
    env = os.environ.get("HYBRIDRANK_REAL_DATA")
    root = Path(env) if env else ROOT.parent / "shared" / "data"
    if not (root / "letor" / "MQ2008").is_dir():
        raise SystemExit(f"MQ2008 not found under {root}/letor/MQ2008; set HYBRIDRANK_REAL_DATA "
                         "to the shared data folder")
    # the hydra data configs read the same variable
    os.environ["HYBRIDRANK_REAL_DATA"] = str(root)
    return root


def mq2008_fold(k: int) -> tuple[list[str], str, str]:
    """Fold ``k`` (1..5) of MQ2008 as (train parts, val part, test part).

    Fold k trains on the three parts after k - 1 (cyclically), validates on the next one and tests
    on the last: Fold1 = (S1, S2, S3 | S4 | S5), Fold2 = (S2, S3, S4 | S5 | S1), ...
    """
    if not 1 <= k <= 5:
        raise ValueError(f"MQ2008 has folds 1..5, got {k}")
    d = data_root() / "letor" / "MQ2008"
    parts = [str(d / f"S{(k - 1 + i) % 5 + 1}.txt") for i in range(5)]
    return parts[:3], parts[3], parts[4]


def fold_overrides(k: int) -> list[str]:
    """Hydra overrides that point ``data=letor_mq2008`` at fold ``k``'s parts."""
    train, val, test = mq2008_fold(k)
    return ["data=letor_mq2008", f"data.source.train=[{','.join(train)}]",
            f"data.source.val={val}", f"data.source.test={test}"]


def parse_folds(text: str) -> list[int]:
    """``"1-5"``, ``"1,3"``, ``"2"`` -> a sorted list of fold numbers."""
    out: set[int] = set()
    for piece in text.split(","):
        piece = piece.strip()
        if "-" in piece:
            a, b = piece.split("-", 1)
            out.update(range(int(a), int(b) + 1))
        elif piece:
            out.add(int(piece))
    bad = sorted(f for f in out if not 1 <= f <= 5)
    if bad or not out:
        raise SystemExit(f"--folds: folds are 1..5, got {text!r}")
    return sorted(out)


def add_docs_options(parser) -> None:
    """``--write-docs`` (rewrite this script's sections of docs/BENCHMARKS.md after a complete
    run); ``--no-docs``, the old opt-out, is accepted and ignored (not writing is the default)."""
    import argparse

    parser.add_argument("--write-docs", action="store_true",
                        help="rewrite this script's section(s) of docs/BENCHMARKS.md; only a "
                             "complete run (the default settings: every fold and model, no "
                             "--quick) may")
    parser.add_argument("--no-docs", action="store_true", help=argparse.SUPPRESS)


def check_docs_request(args, incomplete: Sequence[str]) -> None:
    """Before any work: ``--write-docs`` with settings that cannot make the full tables is an
    error naming them (``incomplete``: the settings that differ from a complete run)."""
    if getattr(args, "write_docs", False) and incomplete:
        raise SystemExit(f"--write-docs: a partial run does not replace the published tables "
                         f"({'; '.join(incomplete)}); drop --write-docs, or run the complete "
                         f"benchmark")


def write_docs(args, sections: Mapping[str, str], *, failures: Sequence[str] = ()) -> None:
    """Rewrite the ``sections`` of docs/BENCHMARKS.md when ``--write-docs`` was given and the run
    had no failed row; otherwise say that the docs were left as they are."""
    if not getattr(args, "write_docs", False):
        print("docs/BENCHMARKS.md not touched (--write-docs rewrites it after a complete run)")
        return
    if failures:
        raise SystemExit(f"--write-docs: not written, {len(failures)} row(s) failed: "
                         f"{', '.join(failures)}")
    for name, body in sections.items():
        write_section(name, body, path=DOCS)
    print(f"updated {DOCS}")


def quiet() -> None:
    """Silence Lightning's per-run chatter (the scripts print their own progress)."""
    import pytorch_lightning  # noqa: F401  (it sets its loggers' levels on import: import first)

    for name in ("pytorch_lightning", "lightning", "lightning.pytorch", "lightning_fabric",
                 "hybridrank"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")


def compose_config(overrides: Sequence[str]):
    """The project config with ``overrides``, composed in-process (as the tests do)."""
    from hydra import compose, initialize_config_module

    from hybridrank.cli.train import CONF_MODULE

    with initialize_config_module(CONF_MODULE, version_base="1.3"):
        return compose("config", overrides=list(overrides))


class HybridRun(NamedTuple):
    """What :func:`train_hybrid` returns."""

    result: dict[str, Any]  # the dict of hybridrank.cli.train.train
    splits: Any             # the data (Splits) the model was trained and scored on
    z_val: torch.Tensor     # [N] pCTR logits of the kept checkpoint on val, storage order
    z_test: torch.Tensor    # the same on test
    model: Any              # the kept checkpoint's HybridRanker (CPU, eval mode)


def train_hybrid(overrides: Sequence[str], *, splits=None, keep_dir: str | Path | None = None
                 ) -> HybridRun:
    """Train one hybridrank model with :func:`hybridrank.cli.train.train`: the scripts' one way
    to train.

    ``splits``: already loaded data (``Splits``, e.g. from :func:`load_splits`) shared by several
    runs, so their train times exclude the load (``result["fit_seconds"]`` is ``trainer.fit``:
    training epochs plus the per-epoch validation that drives early stopping and the checkpoint
    choice, the counterpart of LightGBM's boosting with early stopping); None: the config's
    data, loaded for this run and returned read with the model's schema. ``result`` is the dict
    of ``train`` (``val`` of the kept epoch, ``val_epoch``, ``test``, ...). The logits are the
    kept checkpoint's pCTR logits (``HybridRanker.load_from_checkpoint`` and its one scoring path
    ``predict_split``), for scoring with :func:`evaluate` under any convention. Runs write into a
    temporary folder unless ``keep_dir``.
    """
    import hydra

    from hybridrank.cli.train import train
    from hybridrank.models.ranker import HybridRanker

    with tempfile.TemporaryDirectory(prefix="hybridrank-bench-") as tmp:
        out = Path(keep_dir) if keep_dir is not None else Path(tmp)
        cfg = compose_config([f"paths.output_dir={out}", "trainer.enable_progress_bar=false",
                              "logger=none", "intervals.n_boot=0", *overrides])
        result = train(cfg, splits=splits)
        best = result.get("best_checkpoint")
        if not best:
            raise RuntimeError("train() kept no checkpoint; the benchmark needs callbacks=default")
        model = HybridRanker.load_from_checkpoint(best, map_location="cpu", weights_only=True).eval()
    if splits is None:
        splits = hydra.utils.instantiate(cfg.data.source, _partial_=True)(schema=model.schema).load()
    return HybridRun(result, splits, model.predict_split(splits.val)[0],
                     model.predict_split(splits.test)[0], model)


#: The metric conventions the LETOR tables report (docs/CONVENTIONS.md §4, §5).
BASE_METRICS = dict(ks=(1, 3, 5, 10), gain="exp", ties="average", bins=15, binning="quantile")


def evaluate(data, logits: torch.Tensor, empties: Iterable[str] = ("skip", "zero")
             ) -> dict[str, dict[str, float]]:
    """``{empty: metrics}`` of flat ``[N]`` logits on a split, one entry per empty-list policy."""
    from hybridrank.evaluation.figures import evaluate_logits

    return {e: evaluate_logits(data, logits, empty=e, **BASE_METRICS) for e in empties}


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value); NaNs are ignored."""
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return math.nan, math.nan
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)


def fmt_ms(values: Sequence[float], digits: int = 3) -> str:
    m, s = mean_std(values)
    if math.isnan(m):
        return "n/a"
    return f"{m:.{digits}f} ± {s:.{digits}f}" if len(values) > 1 else f"{m:.{digits}f}"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def machine() -> str:
    """One line naming the machine: CPU model, core count, torch threads, Python."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} CPU(s) visible, torch {torch.__version__} with "
            f"{torch.get_num_threads()} thread(s), Python {platform.python_version()}")


def write_section(name: str, body: str, path: Path = DOCS) -> None:
    """Replace the text between ``<!-- BEGIN name -->`` and ``<!-- END name -->`` in ``path``.

    A missing section is appended at the end (under a ``## name`` heading); the rest of the file
    is left as it is, so hand-written prose around the generated tables survives reruns.
    """
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    block = f"{begin}\n{body.strip()}\n{end}"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = text.rstrip() + f"\n\n## {name}\n\n{block}\n"
    path.write_text(text)


def require_lightgbm(models: Iterable[str]):
    """``lightgbm`` when LightGBM rows (``lgbm_*`` models) are asked for, None when none are.

    A missing optional dependency is an error, not a table without its LightGBM rows.
    """
    wanted = [m for m in models if m.startswith("lgbm_")]
    if not wanted:
        return None
    try:
        import lightgbm
    except ImportError:
        raise SystemExit(f"LightGBM is not installed, and the rows {wanted} need it: "
                         "pip install -e '.[bench]' (or leave them out with --models)") from None
    return lightgbm


def summarize(per_fold: Mapping[int, Mapping[str, float]], keys: Sequence[str]) -> dict:
    """``{key: {"mean", "std", "folds"}}`` over folds."""
    out = {}
    for k in keys:
        vals = [float(m[k]) for m in per_fold.values() if k in m]
        mu, sd = mean_std(vals)
        out[k] = {"mean": mu, "std": sd, "folds": vals}
    return out


# ----------------------------------------------------------------------------------------------
# shared data, LightGBM (categorical features as LightGBM categories), bootstrap statistics
# ----------------------------------------------------------------------------------------------
def load_splits(overrides: Sequence[str]):
    """The ``Splits`` of the data config selected by ``overrides`` (loaded once, shared by runs)."""
    import hydra

    cfg = compose_config(["paths.output_dir=unused", *overrides])  # nothing is written
    return hydra.utils.instantiate(cfg.data.source).load()


def lgbm_arrays(data) -> tuple[Any, Any, Any, list[int]]:
    """(features [N, F + C] float64, labels [N], group sizes [R], categorical column indices).

    Numeric features first, then the categorical codes (0 = out of vocabulary), which LightGBM
    treats as categorical features (its own category splits), so trees see the ids the
    embeddings see.
    """
    import numpy as np

    num = data.num.double().numpy()
    cat = data.cat.double().numpy() if data.cat is not None and data.cat.numel() else None
    x = num if cat is None else np.concatenate([num, cat], axis=1)
    cats = [] if cat is None else list(range(num.shape[1], x.shape[1]))
    return x, data.label.double().numpy(), data.lengths.long().numpy(), cats


def fit_lightgbm(objective: str, splits, params: Mapping[str, Any], *, max_rounds: int = 2000,
                 patience: int = 50) -> dict[str, Any]:
    """LightGBM ``binary`` (on label > 0, early stopping on the val log loss) or ``lambdarank``
    (graded labels, early stopping on the val NDCG@10), categorical ids as categorical features.

    ``params`` may hold ``categorical=False``: the id codes are then plain numeric columns.

    Returns ``{"fit_seconds"`` (Dataset construction + boosting with early stopping),
    ``"best_iteration", "z_val", "z_test"}``: raw scores, the logit for ``binary``.
    """
    import lightgbm as lgb
    import numpy as np

    params = dict(params)
    categorical = params.pop("categorical", True)
    x_tr, y_tr, g_tr, cats = lgbm_arrays(splits.train)
    cats = cats if categorical else []
    x_va, y_va, g_va, _ = lgbm_arrays(splits.val)
    t0 = time.perf_counter()
    if objective == "lambdarank":
        p = dict(objective="lambdarank", metric="ndcg", eval_at=[10], **params)
        train_set = lgb.Dataset(x_tr, y_tr, group=g_tr, categorical_feature=cats, free_raw_data=False)
        val_set = lgb.Dataset(x_va, y_va, group=g_va, reference=train_set, categorical_feature=cats)
    elif objective == "binary":
        p = dict(objective="binary", metric="binary_logloss", **params)
        train_set = lgb.Dataset(x_tr, (y_tr > 0).astype(np.float64), categorical_feature=cats,
                                free_raw_data=False)
        val_set = lgb.Dataset(x_va, (y_va > 0).astype(np.float64), reference=train_set,
                              categorical_feature=cats)
    else:
        raise ValueError(f"objective must be 'binary' or 'lambdarank', got {objective!r}")
    booster = lgb.train(p, train_set, num_boost_round=max_rounds, valid_sets=[val_set],
                        callbacks=[lgb.early_stopping(patience, verbose=False)])
    fit_seconds = time.perf_counter() - t0
    it = booster.best_iteration

    def score(data) -> torch.Tensor:
        raw = booster.predict(lgbm_arrays(data)[0], num_iteration=it, raw_score=True)
        return torch.from_numpy(np.asarray(raw, dtype=np.float64))

    return {"fit_seconds": fit_seconds, "best_iteration": int(it), "z_val": score(splits.val),
            "z_test": score(splits.test)}


def split_stats(data, logits: torch.Tensor, *, ks: Sequence[int] = (10,), empty: str = "skip"):
    """Per-request statistics of flat ``[N]`` logits on a split: the engine's
    :func:`hybridrank.metrics.request_stats.split_stats` (``ndcg@k``, ``map``, ``mrr``, ``auc``,
    ``gauc`` of the logits; ``logloss``, ``ne``, ``ece`` (15 quantile bins), ``pcoc``, ``ctr`` of
    ``sigmoid(logit)``) with the conventions of :func:`evaluate`."""
    from hybridrank.metrics.request_stats import split_stats as engine_stats

    return engine_stats(data, logits.double(), **{**BASE_METRICS, "ks": tuple(ks), "empty": empty})
