"""Hyper-parameter searches of ``hybridrank-train``: checks before, a line per trial, a summary after.

``hybridrank-train hparams_search=default`` (``conf/hparams_search/``) runs hydra's Optuna
sweeper: each trial trains one setting and returns ``optimized_metric`` (a validation metric),
which the sampler uses to choose the next. :class:`SweepReport`, a hydra callback that
``conf/hydra/default.yaml`` attaches to every command, does three things around any multirun of
``hybridrank-train`` (a search, or a grid such as ``-m loss=bce,bce_softmax``):

- before the first trial, :func:`check_sweep` refuses a test metric as ``optimized_metric``, a
  sweeper ``direction`` that contradicts the metric, and a search-space key that is not a key of
  the config (with the nearest keys as the fix), each as one error message;
- after each trial, one progress line: the trial (its run folder's number), its settings, its
  validation value and the best so far;
- at the end, :func:`summarize_sweep` reads every trial's ``metrics.json`` and names the best
  trial by validation value, with its settings, run folder and test figures: a table on the
  console and ``search_summary.json`` in the sweep folder. The test figures are reported, never
  used to choose.

``python -m hybridrank.cli.search SWEEP_DIR`` prints the summary of a sweep folder (also of an
interrupted one: it reads what the trials left on disk).
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, ListConfig, OmegaConf

from hybridrank.atomic import write_json
from hybridrank.cli._app import abort

__all__ = ["SweepReport", "check_sweep", "metric_direction", "summarize_sweep", "format_summary",
           "SUMMARY_FILE", "INSTALL_HINT"]

SUMMARY_FILE = "search_summary.json"
#: how to install the Optuna sweeper plugin (the `search` extra of pyproject.toml)
INSTALL_HINT = "pip install 'hybridrank[search]'"
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
#: metric names (the part after ``val/``, before any ``@``) by the direction that improves them
LOWER_IS_BETTER = ("logloss", "ne", "ece", "f_ece", "loss", "brier")
HIGHER_IS_BETTER = ("ndcg", "gauc", "auc", "map", "mrr", "precision", "recall")
#: the test figures the summary table shows for every trial
TEST_COLUMNS = ("logloss", "ndcg@10", "gauc", "ece", "pcoc")


# ----------------------------------------------------------------------------------------------
# checks before the first trial
# ----------------------------------------------------------------------------------------------
def metric_direction(name: str) -> str | None:
    """``"minimize"`` or ``"maximize"``: the direction that improves the metric ``name``
    (``val/logloss``, ``val/ndcg@10``...); None when neither does (PCOC is best at 1) or the
    name is not known.

    >>> metric_direction("val/logloss"), metric_direction("val/ndcg@10"), metric_direction("val/pcoc")
    ('minimize', 'maximize', None)
    """
    base = name.split("/", 1)[-1].split("@", 1)[0]
    if base in LOWER_IS_BETTER or base.startswith("loss"):
        return "minimize"
    if base in HIGHER_IS_BETTER:
        return "maximize"
    return None


def _sweeper_direction(sweeper: Mapping[str, Any]) -> Any:
    direction = sweeper.get("direction")
    if isinstance(direction, ListConfig | list | tuple):
        return [str(getattr(d, "name", d)) for d in direction]
    return None if direction is None else str(getattr(direction, "name", direction))


def _search_overrides(config: DictConfig) -> list[str]:
    """The search space as override strings: ``hydra.sweeper.params`` and the command line's
    sweep overrides (``key=a,b``, ``key=interval(...)``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = config.hydra.sweeper.get("params") or {}
    out = [f"{k}={v}" for k, v in params.items()]
    task = list(config.hydra.overrides.get("task") or [])
    parser = OverridesParser.create()
    out += [t for t, o in zip(task, parser.parse_overrides(task)) if o.is_sweep_override()]
    return out


def search_keys(config: DictConfig) -> list[str]:
    """The config keys (and config groups) a sweep varies, in the order given."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(_search_overrides(config))
    return list(dict.fromkeys(o.key_or_group for o in parsed))


def _flat_keys(node: Any, prefix: str = "") -> Iterable[str]:
    if isinstance(node, Mapping):
        for k, v in node.items():
            key = f"{prefix}{k}"
            yield key
            yield from _flat_keys(v, key + ".")


def _unknown_key_message(key: str, config: DictConfig) -> str:
    plain = OmegaConf.to_container(config, resolve=False)
    plain.pop("hydra", None)
    keys = list(_flat_keys(plain))
    last = key.rsplit(".", 1)[-1]
    near = [k for k in keys if k.rsplit(".", 1)[-1] == last]
    near = near or difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    hint = f"did you mean {' or '.join(near[:3])}? " if near else ""
    return (f"the search space (hydra.sweeper.params or a sweep on the command line) names {key!r}, "
            f"which is not a key of the config: {hint}(hybridrank-train --cfg job prints every key)")


def _check_space(config: DictConfig) -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    choices = config.hydra.runtime.get("choices") or {}
    missing = object()
    for o in OverridesParser.create().parse_overrides(_search_overrides(config)):
        key = o.key_or_group
        if o.is_add() or o.is_force_add() or o.is_delete():
            continue  # `+key` / `++key` add a key, `~key` deletes one: nothing to look up
        if key in choices:  # a config group: every option it names must exist
            if not o.is_sweep_override() or o.value_type.name not in ("CHOICE_SWEEP", "RANGE_SWEEP"):
                continue
            options = _group_options(key)
            bad = [v for v in o.sweep_string_iterator() if options is not None and v not in options]
            if bad:
                raise ValueError(f"the search space names {', '.join(map(repr, bad))} for the config group "
                                 f"{key!r}, which has no such option (options: {', '.join(options)})")
            continue
        value = OmegaConf.select(config, key, default=missing, throw_on_resolution_failure=False,
                                 throw_on_missing=False)
        if value is missing:
            raise ValueError(_unknown_key_message(key, config))


def _group_options(group: str) -> list[str] | None:
    try:
        from hydra.core.global_hydra import GlobalHydra

        return sorted(GlobalHydra.instance().config_loader().get_group_options(group))
    except Exception:  # noqa: BLE001 - outside a hydra app: the launcher's composition checks it
        return None


def check_sweep(config: DictConfig) -> None:
    """Refuse a sweep of ``hybridrank-train`` that would select on the wrong thing.

    Raises ``ValueError`` (one message naming the fix) when ``optimized_metric`` is a test metric
    (a sweep ranks its trials by it: selecting on test makes the test figures optimistic), when
    an optimizing sweeper has no ``optimized_metric``, a direction that contradicts it or several
    directions, and when a search-space key is not a key of the config or a group option does
    not exist. Checked on the multirun's config, before the first trial.
    """
    metric = config.get("optimized_metric")
    sweeper = config.hydra.sweeper
    optimizing = "direction" in sweeper or sweeper.get("_target_") != BASIC_SWEEPER
    if metric is not None and str(metric).startswith("test/"):
        raise ValueError(f"optimized_metric={metric}: a sweep ranks its trials by this value and must "
                         f"never select on the test split; use a validation metric "
                         f"(optimized_metric=val/{str(metric).removeprefix('test/')})")
    if optimizing:
        if not metric:
            raise ValueError("a search needs optimized_metric, the validation metric it minimises or "
                             "maximises (optimized_metric=val/logloss)")
        direction = _sweeper_direction(sweeper)
        if isinstance(direction, list):
            if len(direction) != 1:
                raise ValueError(f"hydra.sweeper.direction={direction}: hybridrank-train returns one "
                                 "value (optimized_metric); give one direction")
            direction = direction[0]
        better = metric_direction(str(metric))
        if direction is not None and better is None and str(metric).split("/", 1)[-1].startswith("pcoc"):
            raise ValueError(f"optimized_metric={metric} is best at 1, neither at its minimum nor its "
                             "maximum: search on val/logloss (or val/ece) instead")
        if direction is not None and better is not None and direction != better:
            raise ValueError(f"optimized_metric={metric} improves when it goes the other way: set "
                             f"hydra.sweeper.direction={better} (the config has {direction})")
    _check_space(config)


# ----------------------------------------------------------------------------------------------
# reading a sweep folder
# ----------------------------------------------------------------------------------------------
def _number(text: str) -> Any:
    """An override's value as a number where it is one (``1e-05`` included)."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def _override_key(text: str) -> tuple[str, str]:
    key, _, value = text.partition("=")
    return key.lstrip("+~"), value


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


def _read_trial(folder: Path, metric: str | None) -> dict[str, Any]:
    hydra_cfg = OmegaConf.load(folder / ".hydra" / "hydra.yaml").hydra
    overrides = [str(o) for o in OmegaConf.load(folder / ".hydra" / "overrides.yaml")]
    trial: dict[str, Any] = {"trial": int(hydra_cfg.job.num), "run_dir": str(folder),
                             "overrides": overrides}
    path = folder / "metrics.json"
    if not path.is_file():
        trial["status"] = "no metrics.json (failed or interrupted)"
        return trial
    result = json.loads(path.read_text())
    value = result.get("optimized_metric")
    if value is None and metric:
        value = (result.get("val") or {}).get(metric)
    trial.update(status="finished", value=value, val_epoch=result.get("val_epoch"),
                 best_checkpoint=result.get("best_checkpoint"), test=result.get("test") or {},
                 reference=result.get("reference") or {})
    rows = ((result.get("intervals") or {}).get("rows") or {}).get("this model")
    if rows:
        trial["test_intervals"] = {f"test/{k}": v for k, v in rows.items()}
    return trial


def summarize_sweep(sweep_dir: str | Path, *, optimized_metric: str | None = None,
                    direction: str | None = None, keys: Sequence[str] = (),
                    write: bool = True) -> dict[str, Any]:
    """The summary of a sweep folder: every trial's settings, validation value and test figures,
    and the best trial by validation value.

    Trials are the sub-folders with hydra's ``.hydra/`` record; each one's ``metrics.json`` gives
    its value (``optimized_metric``) and test figures; one without it (failed, interrupted) is
    listed without a value. A trial's ``params`` are the overrides of the search keys
    (``keys``, ``hydra.sweeper.params``, the keys of Optuna's ``optimization_results.yaml``) and
    any override whose value differs between trials.

    Args:
        sweep_dir: the sweep folder (``multirun/train/<date>/<time>``).
        optimized_metric, direction: default: the trials' ``optimized_metric`` and the sweeper's
            direction (else the metric's own: :func:`metric_direction`).
        keys: the search keys (:func:`search_keys`), where known.
        write: write ``search_summary.json`` into the folder.

    Returns:
        ``{"sweep_dir", "optimized_metric", "direction", "search_space", "n_trials",
        "n_finished", "trials": [...], "best": trial or None}``; a trial is ``{"trial",
        "run_dir", "params", "status", "value", "val_epoch", "best_checkpoint", "test",
        "reference", "overrides"}``.
    """
    sweep_dir = Path(sweep_dir).resolve()
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"no such sweep folder: {sweep_dir}")
    folders = [p for p in sweep_dir.iterdir() if (p / ".hydra" / "hydra.yaml").is_file()]
    if not folders:
        raise ValueError(f"{sweep_dir} holds no trial folder (sub-folders with .hydra/hydra.yaml): "
                         "not a hydra sweep folder")
    first = OmegaConf.load(sorted(folders)[0] / ".hydra" / "config.yaml")
    first_hydra = OmegaConf.load(sorted(folders)[0] / ".hydra" / "hydra.yaml").hydra
    metric = optimized_metric or first.get("optimized_metric")
    sweeper = first_hydra.sweeper
    space = {str(k): str(v) for k, v in (sweeper.get("params") or {}).items()}
    if direction is None:
        found = _sweeper_direction(sweeper)
        direction = found[0] if isinstance(found, list) else found
    direction = direction or (metric_direction(metric) if metric else None)
    trials = sorted((_read_trial(p, metric) for p in folders), key=lambda t: t["trial"])
    # the settings that make a trial: the search keys, and any override that differs between trials
    given = [dict(map(_override_key, t["overrides"])) for t in trials]
    values: dict[str, set[str]] = {}
    for g in given:
        for key, value in g.items():
            values.setdefault(key, set()).add(value)
    searched = list(dict.fromkeys([*keys, *space]))
    results = sweep_dir / "optimization_results.yaml"  # Optuna's: every searched key
    if results.is_file():
        searched += [str(k) for k in OmegaConf.load(results).get("best_params") or {} if k not in searched]
    varied = searched + [k for k, v in values.items() if k not in searched
                         and (len(v) > 1 or any(k not in g for g in given))]
    for t, g in zip(trials, given):
        t["params"] = {k: _number(g[k]) for k in varied if k in g}
    scored = [t for t in trials if _finite(t.get("value"))]
    best = None
    if scored and direction in ("minimize", "maximize"):
        pick = min if direction == "minimize" else max
        best = pick(scored, key=lambda t: (t["value"], t["trial"]) if direction == "minimize"
                    else (t["value"], -t["trial"]))
    summary = {"sweep_dir": str(sweep_dir), "optimized_metric": metric, "direction": direction,
               "search_space": space, "n_trials": len(trials), "n_finished": len(scored),
               "selected_on": "validation (optimized_metric); test figures are reported only",
               "best": best, "trials": trials}
    if write:
        write_json(sweep_dir / SUMMARY_FILE, summary)
    return summary


def _cell(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.4g}" if abs(x) < 1e-3 or abs(x) >= 1e4 else f"{x:.4f}".rstrip("0").rstrip(".")
    return str(x)


def _short(key: str) -> str:
    """A column name: the key without the ``model.`` every model setting starts with."""
    return key.removeprefix("model.")


def format_summary(summary: Mapping[str, Any], columns: Sequence[str] = TEST_COLUMNS) -> str:
    """The summary as text: a Markdown table of the trials (best first by validation value; the
    test columns for reading, not choosing), then the best trial's settings, run folder and test
    figures (with their intervals where the run computed them)."""
    metric = summary.get("optimized_metric") or "value"
    trials = list(summary["trials"])
    keys = list(dict.fromkeys(k for t in trials for k in t.get("params", {})))
    sign = -1.0 if summary.get("direction") == "maximize" else 1.0
    trials.sort(key=lambda t: (not _finite(t.get("value")), sign * t["value"] if _finite(t.get("value"))
                               else 0.0, t["trial"]))
    best = summary.get("best")
    head = ["trial", *(_short(k) for k in keys), metric, *(f"test/{c}" for c in columns)]
    lines = [f"search summary: {summary['n_finished']} of {summary['n_trials']} trials finished, ranked "
             f"by {metric} ({summary.get('direction') or 'no direction'}); the test columns are for "
             "reading, never for choosing", "",
             "| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for t in trials:
        mark = " *" if best is not None and t["trial"] == best["trial"] else ""
        test = t.get("test") or {}
        value = t.get("value")
        cells = [f"{t['trial']}{mark}", *(_cell(t["params"].get(k, "")) for k in keys),
                 f"{value:.5f}" if _finite(value) else str(value if value is not None else t["status"])]
        cells += [f"{test[f'test/{c}']:.4f}" if _finite(test.get(f"test/{c}")) else "" for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
    if best is None:
        why = (f"{metric} has no direction that improves it" if not summary.get("direction")
               else "no trial finished with a finite value")
        lines.append(f"\nno best trial: {why}")
        return "\n".join(lines)
    iv = best.get("test_intervals") or {}
    figures = []
    for c in columns:
        k = f"test/{c}"
        if k in best["test"]:
            ci = iv.get(k)
            span = f" [{ci[1]:.4f}, {ci[2]:.4f}]" if ci and ci[1] is not None and ci[2] is not None else ""
            figures.append(f"{c} {best['test'][k]:.4f}{span}")
    params = " ".join(f"{k}={best['params'][k]}" for k in keys if k in best["params"])
    lines += ["", f"best trial: {best['trial']} (* above), {metric} = {best['value']:.6g} "
              f"(the kept epoch {best.get('val_epoch')})",
              f"  settings: {params or '(the config as given)'}",
              f"  run folder: {best['run_dir']} (checkpoint {best.get('best_checkpoint')})",
              f"  test: {', '.join(figures)}"]
    for name, ref in (best.get("reference") or {}).items():
        lines.append(f"  test, {name}: " + ", ".join(f"{c} {ref[c]:.4f}" for c in columns
                                                     if _finite(ref.get(c))))
    lines.append(f"  summary: {Path(summary['sweep_dir']) / SUMMARY_FILE}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# the hydra callback
# ----------------------------------------------------------------------------------------------
class SweepReport(Callback):
    """hydra callback of every multirun of ``hybridrank-train``: :func:`check_sweep` before the
    first trial, a progress line after each, :func:`summarize_sweep` at the end. Does nothing for
    single runs and for commands without ``optimized_metric`` (export, eval)."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.best: tuple[int, float] | None = None
        self.direction: str | None = None

    @staticmethod
    def _applies(config: DictConfig) -> bool:
        return "optimized_metric" in config and config.get("task_name", "train") == "train"

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not self._applies(config):
            return
        try:
            check_sweep(config)
        except ValueError as exc:  # hydra turns a callback's Exception into a warning
            raise abort(exc) from exc
        self.keys = search_keys(config)
        self.best = None
        direction = _sweeper_direction(config.hydra.sweeper)
        metric = config.get("optimized_metric")
        self.direction = (direction[0] if isinstance(direction, list) else direction) or \
            (metric_direction(metric) if metric else None)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        from hydra.core.utils import JobStatus
        from hydra.types import RunMode

        if not self._applies(config) or config.hydra.mode != RunMode.MULTIRUN:
            return

        num = int(config.hydra.job.num)
        total = config.hydra.sweeper.get("n_trials")
        keys = self.keys or [str(k) for k in (config.hydra.sweeper.get("params") or {})]
        given = dict(map(_override_key, job_return.overrides or []))
        params = " ".join(f"{k}={_cell(_number(given[k]))}" for k in keys if k in given)
        metric = config.get("optimized_metric") or "value"
        if job_return.status == JobStatus.COMPLETED:
            value = job_return.return_value
            if _finite(value):
                better = self.direction is not None and (
                    self.best is None or (value > self.best[1] if self.direction == "maximize"
                                          else value < self.best[1]))
                if better:
                    self.best = (num, float(value))
                shown = f"{metric} {value:.6g}"
            else:
                shown = f"{metric} {value} (not a finite number: never the best)"
                if (isinstance(value, float) and math.isnan(value) and "direction" in config.hydra.sweeper
                        and self.direction in ("minimize", "maximize")):
                    # Optuna 2.10 refuses a NaN and then fails the whole search on it: the sampler
                    # is told the worst value instead
                    job_return.return_value = math.inf if self.direction == "minimize" else -math.inf
                    shown += "; the sampler is told the worst value"
        else:
            shown = f"failed: {str(job_return._return_value).splitlines()[0][:200]}"
        best = f" | best so far: trial {self.best[0]} ({self.best[1]:.6g})" if self.best else ""
        sys.stdout.flush()
        print(f"[trial {num}{f' of {total}' if total else ''}] {params or '(no search key)'} | "
              f"{shown}{best}", flush=True)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if not self._applies(config):
            return
        sweep_dir = Path(str(config.hydra.sweep.dir))
        if not sweep_dir.is_dir():
            return
        direction = _sweeper_direction(config.hydra.sweeper)
        summary = summarize_sweep(sweep_dir, optimized_metric=config.get("optimized_metric"),
                                  direction=direction[0] if isinstance(direction, list) else direction,
                                  keys=self.keys)
        print("\n" + format_summary(summary), flush=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m hybridrank.cli.search SWEEP_DIR``: print (and write) a sweep's summary."""
    ap = argparse.ArgumentParser(prog="python -m hybridrank.cli.search",
                                 description="The summary of a hybridrank-train sweep folder.")
    ap.add_argument("sweep_dir", type=Path)
    ap.add_argument("--no-write", action="store_true", help=f"do not write {SUMMARY_FILE}")
    a = ap.parse_args(argv)
    print(format_summary(summarize_sweep(a.sweep_dir, write=not a.no_write)))
    return 0


if __name__ == "__main__":
    from hybridrank.cli._app import cli_errors

    raise SystemExit(cli_errors("python -m hybridrank.cli.search")(main)())
