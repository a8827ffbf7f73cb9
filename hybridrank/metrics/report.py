"""Calibration reports: numbers (JSON) and figures (PNG) before and after a calibrator.

:func:`stats_summary` gathers, from the per-request statistics of one set of predictions
(:mod:`hybridrank.metrics.request_stats`, the engine the intervals of a report resample too), the
log loss, ECE, PCOC, the reliability table (quantile bins, docs/CONVENTIONS.md §5.2), PCOC by position and
by field value; :func:`calibration_summary` does the same for flat predictions. :func:`write_report`
writes several summaries (e.g. ``{"before": ..., "after": ...}``) as ``calibration.json``,
``reliability.png`` (mean predicted vs observed rate per bin, with counts, diagonal drawn),
``pcoc_by_position.png`` and, per calibration field, ``field_calibration_{field}.png`` (PCOC per
value with exact Poisson intervals; the field-level ECE in the legend).

matplotlib is optional (the ``export`` / ``dev`` extras); it is imported only when a figure is
drawn, and drawn with the Agg canvas directly (no pyplot global state, no display needed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from hybridrank.atomic import atomic_path, write_json
from hybridrank.metrics.builders import flat_stats
from hybridrank.metrics.calibration import PositionCalibration, pcoc_interval
from hybridrank.metrics.per_request import RequestStats

__all__ = ["calibration_summary", "stats_summary", "plot_reliability", "plot_pcoc_by_position",
           "plot_field_calibration", "write_report"]

MAX_PLOTTED_VALUES = 30
"""A field calibration figure shows the values with the most impressions, at most this many."""


def _num(x) -> float | None:
    v = float(x)
    return v if math.isfinite(v) else None


def _by_value(r: PositionCalibration, f_ece: float | None, alpha: float) -> dict[str, Any]:
    lower, upper = pcoc_interval(r.sum_p, r.positives, alpha)
    return {"value": r.position.tolist(), "count": r.count.long().tolist(),
            "positives": r.positives.long().tolist(), "mean_p": (r.sum_p / r.count).tolist(),
            "pcoc": [_num(v) for v in r.pcoc.tolist()],
            "pcoc_lower": [_num(v) for v in lower.tolist()],
            "pcoc_upper": [_num(v) for v in upper.tolist()],
            "f_ece": f_ece}


def stats_summary(stats: RequestStats, *, field_labels: Mapping[str, Any] | None = None,
                  alpha: float = 0.05) -> dict[str, Any]:
    """Calibration numbers of one set of predictions from its per-request statistics.

    Every number is the engine's point estimate (or per-cell totals) of ``stats``, so a report's
    figures and its bootstrap intervals rest on the same statistics.

    Args:
        stats: with calibration columns (:func:`~hybridrank.metrics.builders.flat_stats`);
            positions and fields give the per-value tables.
        field_labels: ``{name: callable code -> str}`` naming the codes in the output.
        alpha: per-value PCOC intervals are exact ``1 - alpha`` Poisson intervals on the clicks
            (:func:`~hybridrank.metrics.calibration.pcoc_interval`).

    Returns:
        JSON-able dict: ``n``, ``positives``, ``logloss``, ``ece``, ``pcoc`` (None if no click),
        ``bins``, ``binning``, ``reliability`` (lists ``count``, ``mean_p``, ``mean_y`` per bin;
        empty bins dropped), ``pcoc_by_position`` (lists ``position``, ``count``, ``positives``,
        ``mean_p``, ``pcoc``, ``pcoc_lower``, ``pcoc_upper``, None where a position has no click,
        and the field-level ECE ``f_ece`` over the positions 1..P of the conventions) when the
        statistics have positions, and ``fields``: per field the same lists keyed ``value`` (plus
        ``label``) and its ``f_ece``.
    """
    pt = stats.point()
    if not pt.get("n_impressions"):
        raise ValueError("a calibration summary needs statistics with calibration columns and at "
                         "least one impression")
    out: dict[str, Any] = {
        "n": int(pt["n_impressions"]), "positives": int(pt["n_positives"]),
        "logloss": pt["logloss"], "ece": pt["ece"], "pcoc": pt["pcoc"],
        "bins": stats.conventions.get("bins"), "binning": stats.conventions.get("binning"),
    }
    t = stats.reliability()
    keep = t.count > 0
    out["reliability"] = {"count": t.count[keep].long().tolist(), "mean_p": t.mean_p[keep].tolist(),
                          "mean_y": t.mean_y[keep].tolist()}
    if "position" in stats.values:
        r = _by_value(stats.field_table("position"), pt.get("f_ece@position"), alpha)
        out["pcoc_by_position"] = {"position": r.pop("value"), **r}
    names = [n for n in stats.values if n != "position"]
    if names:
        out["fields"] = {}
        for name in names:
            r = _by_value(stats.field_table(name), pt.get(f"f_ece@{name}"), alpha)
            label = (field_labels or {}).get(name) or str
            out["fields"][name] = {"value": r["value"], "label": [str(label(v)) for v in r["value"]],
                                   **{k: v for k, v in r.items() if k != "value"}}
    return out


def calibration_summary(p, labels, positions=None, *, bins: int = 15, binning: str = "quantile",
                        fields: Mapping[str, Any] | None = None,
                        field_labels: Mapping[str, Any] | None = None,
                        alpha: float = 0.05) -> dict[str, Any]:
    """:func:`stats_summary` of flat predictions (calibration needs no request structure).

    Args:
        p: ``[N]`` probabilities. labels: ``[N]`` (clicks are ``label > 0``).
        positions: ``[N]`` 1-based display positions, or None (the table covers 1..max).
        bins, binning: ECE / reliability bins (default 15 quantile bins).
        fields: ``{name: [N] int codes}`` of fields to calibrate by (category, device, ...).
        field_labels, alpha: as :func:`stats_summary`.
    """
    p = torch.as_tensor(p).reshape(-1).double()
    y = torch.as_tensor(labels).reshape(-1).double()
    if p.numel() == 0:
        raise ValueError("calibration_summary of zero impressions")
    pos = None if positions is None else torch.as_tensor(positions).reshape(-1)
    stats = flat_stats(p, y, torch.tensor([p.numel()]), p=p, position=pos,
                       positions=0 if pos is None else max(int(pos.max()), 0),
                       fields={n: torch.as_tensor(c).reshape(-1) for n, c in (fields or {}).items()},
                       include=(), auc=False, bins=bins, binning=binning)
    return stats_summary(stats, field_labels=field_labels, alpha=alpha)


def _figure(width: float = 6.0, height: float = 4.5):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("drawing calibration figures needs matplotlib: pip install "
                          "'hybridrank[export]' (or figures=false for the JSON only)") from None
    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    return fig


def plot_reliability(summaries: Mapping[str, Mapping[str, Any]], path: str | Path,
                     title: str = "Reliability diagram") -> Path:
    """Reliability diagram of several summaries on one figure, impressions per bin below.

    Top: mean predicted pCTR vs observed click rate per quantile bin, one line per summary, the
    diagonal ``y = x`` dashed. Bottom: impressions per bin. Written atomically as PNG.
    """
    fig = _figure(6.0, 6.0)
    ax, axc = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    hi = 0.0
    for name, s in summaries.items():
        r = s["reliability"]
        ax.plot(r["mean_p"], r["mean_y"], marker="o", ms=3, label=f"{name} (ECE {s['ece']:.4f})")
        axc.plot(r["mean_p"], r["count"], marker="o", ms=3, ls="none", label=name)
        hi = max(hi, *r["mean_p"], *r["mean_y"])
    hi = min(hi * 1.05, 1.0) or 1.0
    ax.plot([0, hi], [0, hi], ls="--", color="grey", lw=1, label="perfect calibration")
    ax.set_xlim(0, hi)
    ax.set_ylim(0, hi)
    ax.set_ylabel("observed click rate")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    axc.set_ylim(bottom=0)
    axc.set_xlabel("mean predicted pCTR per quantile bin")
    axc.set_ylabel("impressions")
    axc.grid(alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)


def plot_pcoc_by_position(summaries: Mapping[str, Mapping[str, Any]], path: str | Path,
                          title: str = "PCOC by position") -> Path:
    """PCOC (predicted / observed clicks) per display position, one line per summary; 1 dashed."""
    fig = _figure()
    ax = fig.subplots()
    for name, s in summaries.items():
        r = s.get("pcoc_by_position")
        if not r:
            continue
        pts = [(p, v) for p, v in zip(r["position"], r["pcoc"]) if v is not None]
        if pts:
            f_ece = f" (F-ECE {r['f_ece']:.4f})" if r.get("f_ece") is not None else ""
            ax.plot(*zip(*pts), marker="o", ms=3, label=f"{name}{f_ece}")
    ax.axhline(1.0, ls="--", color="grey", lw=1, label="PCOC = 1")
    ax.set_xlabel("position")
    ax.set_ylabel("PCOC = sum(pCTR) / clicks")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)


def plot_field_calibration(summaries: Mapping[str, Mapping[str, Any]], field: str,
                           path: str | Path, title: str | None = None) -> Path:
    """PCOC per value of one field with its exact Poisson interval, one series per summary.

    The values with the most impressions come first (at most :data:`MAX_PLOTTED_VALUES`); the
    legend carries each summary's field-level ECE. PCOC = 1 is dashed.
    """
    first = next(s["fields"][field] for s in summaries.values() if field in s.get("fields", {}))
    order = sorted(range(len(first["value"])), key=lambda i: -first["count"][i])[:MAX_PLOTTED_VALUES]
    keep = [first["value"][i] for i in order]
    names = [f"{first['label'][i]}\n(n={first['count'][i]:,})" for i in order]
    fig = _figure(max(6.0, 0.45 * len(keep) + 2), 4.5)
    ax = fig.subplots()
    series = [(n, s["fields"][field]) for n, s in summaries.items() if field in s.get("fields", {})]
    width = 0.7 / max(len(series), 1)
    for k, (name, r) in enumerate(series):
        at = {v: i for i, v in enumerate(r["value"])}
        xs, ys, lo, hi = [], [], [], []
        for x, v in enumerate(keep):
            i = at.get(v)
            if i is None or r["pcoc"][i] is None:
                continue
            xs.append(x - 0.35 + width * (k + 0.5))
            ys.append(r["pcoc"][i])
            lo.append(r["pcoc"][i] - r["pcoc_lower"][i])
            hi.append(r["pcoc_upper"][i] - r["pcoc"][i])
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", ms=3, capsize=2,
                    label=f"{name} (F-ECE {r['f_ece']:.4f})")
    ax.axhline(1.0, ls="--", color="grey", lw=1, label="PCOC = 1")
    ax.set_xticks(range(len(keep)))
    ax.set_xticklabels(names, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("PCOC = sum(pCTR) / clicks (95 % interval)")
    ax.set_title(title or f"Calibration by {field}")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    return path


def write_report(out_dir: str | Path, summaries: Mapping[str, Mapping[str, Any]], *,
                 extra: Mapping[str, Any] | None = None, figures: bool = True) -> dict[str, str]:
    """Write ``calibration.json`` (+ ``reliability.png``, ``pcoc_by_position.png``,
    ``field_calibration_{field}.png``) to ``out_dir``.

    Returns:
        name -> path of every file written.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "calibration.json"}
    write_json(paths["json"], {**(extra or {}), "summaries": dict(summaries)})
    if figures:
        paths["reliability"] = plot_reliability(summaries, out_dir / "reliability.png")
        if any(s.get("pcoc_by_position") for s in summaries.values()):
            paths["pcoc_by_position"] = plot_pcoc_by_position(
                summaries, out_dir / "pcoc_by_position.png")
        for field in dict.fromkeys(f for s in summaries.values() for f in s.get("fields", {})):
            paths[f"field_{field}"] = plot_field_calibration(
                summaries, field, out_dir / f"field_calibration_{field}.png")
    return {k: str(v) for k, v in paths.items()}
