"""The text of the reports: result tables, interval cells, the position offsets, comparisons.

Pure formatting of the figures of :mod:`hybridrank.evaluation.figures` (and of a position tower's
report): ``hybridrank-train``'s result table (:func:`format_table`), ``hybridrank-eval``'s
(:func:`format_calibration_report`), ``hybridrank-compare``'s (:func:`format_comparison`), and the
cells they share (:func:`interval_cell`). The console scripts print these strings as they are.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from hybridrank.evaluation.figures import COMPARE_METRICS, TABLE_COLUMNS, Comparison, compare_figures
from hybridrank.metrics.uncertainty import format_interval

__all__ = ["BOUNDED_AT_ZERO", "ONE_SIDED_MARK", "OUTSIDE_MARK", "interval_cell", "format_table",
           "format_offsets", "level_sentence", "summary_row", "format_calibration_report",
           "format_comparison", "compare_scores"]

#: metrics that cannot be negative and are biased upwards on finite data (docs/CONVENTIONS.md §5.2)
BOUNDED_AT_ZERO = ("ece", "f_ece@")
ONE_SIDED_MARK = "⁺"  # a one-sided interval [0, upper]
OUTSIDE_MARK = "†"    # the point lies outside its percentile interval


def interval_cell(metric: str, estimate: float | None, lower: float | None, upper: float | None,
                  note: str = "") -> tuple[str, str | None]:
    """One table cell ``estimate [lower, upper]`` and the footnote it needs (None if none).

    - no interval: ``0.1234 [no interval]`` and the reason (e.g. most resamples have no click);
    - a statistic bounded at 0 (ECE, F-ECE) whose point lies below its percentile interval (the
      resamples' values are biased upwards, the point can sit at the bound): the one-sided
      interval ``[0, upper]``, marked ``⁺``;
    - any other point outside its interval: marked ``†``.

    >>> interval_cell("ece", 0.0, 0.0009, 0.0531)
    ('0.0000 [0, 0.0531]⁺', '⁺')
    >>> interval_cell("ndcg@10", 0.5, 0.45, 0.55)
    ('0.5000 [0.4500, 0.5500]', None)
    """
    if estimate is None or math.isnan(estimate):
        return "n/a", None
    if lower is None or upper is None:
        return f"{estimate:.4f} [no interval]", note or "no interval"
    if estimate < lower and metric.startswith(BOUNDED_AT_ZERO):
        return f"{estimate:.4f} [0, {upper:.4f}]{ONE_SIDED_MARK}", ONE_SIDED_MARK
    if not lower <= estimate <= upper:
        return f"{estimate:.4f} [{lower:.4f}, {upper:.4f}]{OUTSIDE_MARK}", OUTSIDE_MARK
    return f"{estimate:.4f} [{lower:.4f}, {upper:.4f}]", None


def format_table(result: Mapping[str, Any], columns=TABLE_COLUMNS) -> str:
    """A small Markdown table: the model's test metrics and the reference rows.

    ``result`` as :func:`~hybridrank.evaluation.figures.final_figures` returns it (or
    ``hybridrank-train``'s ``metrics.json``). With ``result["intervals"]`` every cell is
    ``estimate [lower, upper]`` (bootstrap over test requests, :func:`interval_cell`), a line says
    how many requests and positives they rest on, and footnotes say why a cell has no interval or
    a one-sided one.
    """
    lines = ["| model | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    rows = [("this model", {k.removeprefix("test/"): v for k, v in result.get("test", {}).items()})]
    rows += list(result.get("reference", {}).items())
    iv = result.get("intervals") or {}
    missing: dict[str, list[str]] = {}  # reason -> cells
    marks: set[str] = set()
    for name, values in rows:
        cells = []
        for c in columns:
            ci = iv.get("rows", {}).get(name, {}).get(c)
            if c not in values or math.isnan(values[c]):
                cells.append("n/a")
            elif ci:
                note = iv.get("notes", {}).get(name, {}).get(c, "")
                text, foot = interval_cell(c, values[c], ci[1], ci[2], note)
                cells.append(text)
                if foot in (ONE_SIDED_MARK, OUTSIDE_MARK):
                    marks.add(foot)
                elif foot:
                    missing.setdefault(foot, []).append(f"{name} {c}")
            else:
                cells.append(f"{values[c]:.4f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if iv:
        lines.append(f"\n{100 * (1 - iv['alpha']):.0f} % bootstrap intervals over "
                     f"{iv['n_requests']:,} test requests ({iv['n_positives']:,} clicks / positive "
                     f"labels; {iv['n_boot']} resamples, seed {iv['seed']}).")
        if ONE_SIDED_MARK in marks:
            lines.append(f"{ONE_SIDED_MARK} ECE is >= 0 and biased upwards on finite data: where the "
                         "point lies below the percentile interval of its resamples, the cell shows "
                         "the one-sided interval [0, upper].")
        if OUTSIDE_MARK in marks:
            lines.append(f"{OUTSIDE_MARK} the point lies outside the percentile interval of its "
                         "resamples (a skewed statistic): read the interval as its spread only.")
        for reason, where in missing.items():
            lines.append(f"[no interval] {', '.join(where)}: {reason}.")
    return "\n".join(lines)


def format_offsets(report: Mapping[str, Any], max_rows: int = 10) -> str:
    """The position tower's offsets with their intervals (:meth:`PositionBias.report`), one line
    per slot (the first ``max_rows`` estimated slots) and a line on the tail and convergence."""
    ref = report["reference_position"]
    lines = [f"\nposition offsets (logit, relative to slot {ref}; {report['interval']['n_boot']} "
             f"bootstrap replicates over requests, {100 * (1 - report['interval']['alpha']):.0f} %):"]
    shown = 0
    for j, off in enumerate(report["logit_offsets"]):
        if shown >= max_rows:
            break
        if not report["estimated"][j]:
            continue
        lo, hi = report["lower"][j], report["upper"][j]
        iv = f" [{lo:+.3f}, {hi:+.3f}]" if lo is not None else ""
        lines.append(f"  slot {j + 1:>3}: {off:+.3f}{iv}  ({report['impressions'][j]:,.0f} impressions, "
                     f"{report['clicks'][j]:,.0f} clicks)")
        shown += 1
    n_est = sum(report["estimated"])
    if n_est > shown:
        lines.append(f"  ... {n_est - shown} more slot(s) in metrics.json")
    if report.get("tail_impressions"):
        lines.append(f"  {report['tail_impressions']:,.0f} impressions past max_position="
                     f"{report['max_position']} share its offset")
    if report.get("last_change") is not None:
        lines.append(f"  {report['updates']} updates; the last moved an offset by at most "
                     f"{report['last_change']:.4f}")
    level = report.get("serving_level")
    if level:
        lines.append("  " + level_sentence(level))
    ident = report.get("identifiability") or {}
    if ident.get("verdict"):
        lines.append(f"  position effect {ident['verdict']}")
    return "\n".join(lines)


def level_sentence(level: Mapping[str, Any]) -> str:
    """One line on the serving level's interval (:meth:`PositionBias.level_interval`)."""
    lo, hi = level["ctr_factor"]
    return (f"serving level: the true top-slot CTR lies within pctr x [{lo:.2f}, {hi:.2f}] "
            f"({100 * (1 - level['alpha']):.0f} %; the clicks' sampling error given the model, "
            f"not the model's own error nor drift)")


def summary_row(name: str, s: Mapping[str, Any]) -> str:
    """``| name | logloss | ECE | PCOC |`` of a calibration summary (5 decimals, PCOC 4)."""
    pc = "n/a" if s.get("pcoc") is None else f"{s['pcoc']:.4f}"
    return f"| {name} | {s['logloss']:.5f} | {s['ece']:.5f} | {pc} |"


def format_calibration_report(result: Mapping[str, Any]) -> str:
    """``hybridrank-eval``'s table: every row's metrics with intervals, their footnotes, each
    row's log loss paired against ``before``; without intervals the summaries' log loss, ECE
    and PCOC. ``result`` as :func:`hybridrank.cli.export.evaluate` returns it."""
    lines = []
    iv = result.get("intervals")
    if iv:
        cols = tuple(next(iter(iv["rows"].values())))
        lines.append(f"| {result['split']} split | " + " | ".join(cols) + " |\n"
                     + "|---" * (len(cols) + 1) + "|")
        feet: dict[str, list[str]] = {}
        for name, row in iv["rows"].items():
            cells = []
            for c in cols:
                note = iv.get("notes", {}).get(name, {}).get(c, "")
                text, foot = interval_cell(c, *row[c], note)
                cells.append(text)
                if foot:
                    feet.setdefault(foot, []).append(f"{name} {c}")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        for foot, where in feet.items():
            if foot == ONE_SIDED_MARK:
                lines.append(f"{foot} ECE is >= 0 and biased upwards: a point below its percentile "
                             f"interval gets the one-sided [0, upper] ({', '.join(where)})")
            elif foot == OUTSIDE_MARK:
                lines.append(f"{foot} point outside its percentile interval ({', '.join(where)})")
            else:
                lines.append(f"[no interval] {', '.join(where)}: {foot}")
        for name, row in iv["paired"].items():
            d = row["logloss"]
            lines.append(f"{name} - before, log loss: {d['diff']:+.5f} [{d['lower']:+.5f}, "
                         f"{d['upper']:+.5f}] ({d['verdict']})")
        lines.append(f"{100 * (1 - iv['alpha']):.0f} % bootstrap intervals over "
                     f"{iv['n_requests']:,} requests, {iv['n_positives']:,} positives")
    else:
        lines.append(f"| {result['split']} split | logloss | ECE | PCOC |\n|---|---|---|---|")
        lines += [summary_row(name, s) for name, s in result["summaries"].items()]
    return "\n".join(lines)


def format_comparison(c: Comparison) -> str:
    """``hybridrank-compare``'s Markdown report: each file's metrics with intervals, and every
    file after the first paired with the first (difference, interval, two-sided p-value)."""
    names, have, alpha = c.names, c.metrics, c.alpha
    s0 = c.stats[names[0]]
    lines = [f"{s0.n_requests:,} requests, {c.n_impressions:,} impressions, {s0.n_positives:,} positive "
             f"labels; {100 * (1 - alpha):g} % percentile bootstrap intervals over requests "
             f"({c.n_boot} resamples, seed {c.seed}).", "",
             "| scores | " + " | ".join(have) + " |", "|---" * (len(have) + 1) + "|"]
    for n in names:
        lines.append(f"| {n} | " + " | ".join(format_interval(c.intervals[n][m], 4) for m in have) + " |")
    if len(names) > 1:
        lines += ["", f"Paired with `{names[0]}` (difference = row - `{names[0]}`, same resamples):",
                  "", "| scores | " + " | ".join(have) + " |", "|---" * (len(have) + 1) + "|"]
        for n in names[1:]:
            cells = []
            for m in have:
                d = c.paired[n][m]
                cells.append(d.verdict if d.p_value is None else
                             f"{d.diff:+.4g} [{d.lower:+.4g}, {d.upper:+.4g}], p = {d.p_value:.3g}"
                             + (" *" if d.p_value < alpha else ""))
            lines.append(f"| {n} | " + " | ".join(cells) + " |")
        lines += ["", f"`*`: significant at {100 * alpha:g} % (two-sided paired bootstrap)."]
    return "\n".join(lines)


def compare_scores(frames: Mapping[str, Any], *, score: str = "pctr", label: str = "label",
                   request: str = "request_id", metrics=COMPARE_METRICS, n_boot: int = 1000,
                   alpha: float = 0.05, seed: int = 0, empty: str = "skip") -> str:
    """A Markdown report of score frames (:func:`format_comparison` of
    :func:`~hybridrank.evaluation.figures.compare_figures`, same arguments).

    Args:
        frames: name -> score frame (request id, label, score columns; the same requests and
            labels in every frame, rows sorted by request).
        score: the probability column (``pctr``); it is also the ranking score.
        metrics: which to report; n_boot, alpha, seed: the bootstrap; empty: NDCG's policy for
            requests without a positive label.
    """
    return format_comparison(compare_figures(frames, score=score, label=label, request=request,
                                             metrics=metrics, n_boot=n_boot, alpha=alpha,
                                             seed=seed, empty=empty))
