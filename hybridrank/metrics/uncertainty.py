"""Bootstrap confidence intervals over requests, and paired comparisons of score sets.

The resampling unit is the **request**: impressions of one request share a user, a context and a
slate, so they are not independent and resampling impressions would give intervals that are too
narrow. Every metric is a formula over sums of per-request statistics
(:class:`~hybridrank.metrics.per_request.RequestStats`, computed once; the point estimate is the
formula on the plain sums): a replicate draws resample counts ``c [R]`` (how often each request is
drawn), and the totals ``c @ X`` of a whole block of replicates come from **one matrix product**;
the metric formulas are vectorised over replicates. Quantile ECE keeps the full sample's bins in
every replicate (the definition is in :mod:`hybridrank.metrics.builders`).

A replicate where a metric is undefined (no valid list, no positive, a single class) is left out;
if more than ``alpha / 2`` of the replicates are undefined the interval is reported as not
computable, with the reason, and never as NaN. ECE is biased upwards (``|.|`` of noise), so its
interval sits above 0 even for a perfectly calibrated model: compare ECEs paired, not to 0.

The statistics builders are re-exported here, so ``hybridrank.metrics.uncertainty`` is the one import.

Reference: Efron & Tibshirani 1993, *An Introduction to the Bootstrap*, ch. 13 (percentile
intervals) and ch. 16 (bootstrap tests); Hanley & MacGibbon 2006 for the Poisson bootstrap.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hybridrank.metrics.builders import (
    calibration_stats,
    frame_stats,
    ranking_stats,
    ratio_stats,
    request_offsets,
)
from hybridrank.metrics.per_request import RequestStats, check_same_requests
from hybridrank.metrics.statistics import Statistic, ratio

__all__ = [
    "Statistic", "RequestStats", "Interval", "PairedResult", "ratio", "ratio_stats",
    "ranking_stats", "calibration_stats", "frame_stats", "request_offsets", "resample_counts",
    "bootstrap_replicates", "bootstrap", "paired_bootstrap", "compare_bootstrap", "check_same_requests",
    "format_interval", "interval_table",
]

_SCHEMES = ("multinomial", "poisson")
_BLOCK_ELEMS = 1 << 22  # resample counts held at once: replicates per block x requests


def resample_counts(n_requests: int, n_boot: int, *, seed: int = 0,
                    scheme: str = "multinomial") -> Iterator[np.ndarray]:
    """Blocks of bootstrap resample counts, ``[b, R]`` int64, ``n_boot`` rows in all.

    ``"multinomial"`` (Efron's bootstrap): each replicate draws ``R`` requests uniformly with
    replacement; row ``i`` counts how often each request was drawn (rows sum to ``R``).
    ``"poisson"``: independent ``Poisson(1)`` counts (rows sum to ``R`` only on average), the
    streaming-friendly approximation. The blocks, and so the counts, depend only on
    ``(n_requests, n_boot, seed, scheme)``.

    >>> sum(int(c.sum()) for c in resample_counts(5, 3, seed=1)) == 5 * 3
    True
    """
    if scheme not in _SCHEMES:
        raise ValueError(f"scheme must be one of {_SCHEMES}, got {scheme!r}")
    if not isinstance(n_boot, int) or n_boot < 1:
        raise ValueError(f"n_boot must be a positive int, got {n_boot!r}")
    if n_requests < 1:
        raise ValueError("cannot resample zero requests")
    rng = np.random.default_rng(seed)
    block = max(1, min(n_boot, _BLOCK_ELEMS // n_requests))
    done = 0
    while done < n_boot:
        b = min(block, n_boot - done)
        if scheme == "multinomial":
            draw = rng.integers(0, n_requests, size=(b, n_requests))
            draw += n_requests * np.arange(b)[:, None]
            yield np.bincount(draw.ravel(), minlength=b * n_requests).reshape(b, n_requests)
        else:
            yield rng.poisson(1.0, size=(b, n_requests))
        done += b


def _replicates(stats_list: Sequence[RequestStats], names: Sequence[str], n_boot: int, seed: int,
                scheme: str) -> list[dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Replicate values of the named metrics of several statistics under the SAME counts."""
    r = stats_list[0].n_requests
    names = list(dict.fromkeys(names))  # a repeated name would collect its replicates twice
    acc = [{n: ([], []) for n in names} for _ in stats_list]
    for counts in resample_counts(r, n_boot, seed=seed, scheme=scheme):
        w = torch.from_numpy(counts).to(torch.float64)
        for st, out in zip(stats_list, acc):
            for n, (v, ok) in st.values_of(w, names).items():
                out[n][0].append(v)
                out[n][1].append(ok)
    return [{n: (torch.cat(v).numpy(), torch.cat(ok).numpy()) for n, (v, ok) in out.items()}
            for out in acc]


def _names(stats: RequestStats, metrics: Sequence[str] | None) -> list[str]:
    names = list(stats.metrics) if metrics is None else list(dict.fromkeys(metrics))
    unknown = [n for n in names if n not in stats.metrics]
    if unknown:
        raise ValueError(f"unknown metric(s) {unknown}; available: {list(stats.metrics)}")
    return names


def _check_alpha(alpha: float) -> None:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")


def bootstrap_replicates(stats: RequestStats, *, n_boot: int = 1000, seed: int = 0,
                         scheme: str = "multinomial", metrics: Sequence[str] | None = None,
                         ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The bootstrap distribution: metric -> ``(values [n_boot], defined [n_boot])``.

    Replicate ``i`` is the metric of the totals ``counts[i] @ columns`` with ``counts`` from
    :func:`resample_counts` (same seed, same counts).
    """
    names = _names(stats, metrics)
    return _replicates([stats], names, n_boot, seed, scheme)[0]


@dataclass(frozen=True)
class Interval:
    """A point estimate with its bootstrap percentile interval (None where not computable)."""

    metric: str
    estimate: float | None
    lower: float | None
    upper: float | None
    alpha: float
    n_requests: int
    n_positives: int | None
    n_boot: int
    n_undefined: int
    note: str = ""

    def __str__(self) -> str:
        return format_interval(self)


def _percentile(v: np.ndarray, ok: np.ndarray, alpha: float, why: str) -> tuple[float | None, float | None, str]:
    bad = int((~ok).sum())
    if bad > alpha / 2 * v.shape[0]:
        return None, None, f"no interval: {bad} of {v.shape[0]} resamples undefined ({why})"
    lo, hi = np.quantile(v[ok], [alpha / 2, 1 - alpha / 2])
    note = f"{bad} of {v.shape[0]} resamples undefined ({why}), left out" if bad else ""
    return float(lo), float(hi), note


def bootstrap(stats: RequestStats, *, n_boot: int = 1000, alpha: float = 0.05, seed: int = 0,
              scheme: str = "multinomial", metrics: Sequence[str] | None = None) -> dict[str, Interval]:
    """Seeded percentile bootstrap intervals over requests for every metric of ``stats``.

    ``[q_{alpha/2}, q_{1 - alpha/2}]`` of the replicate values (Efron & Tibshirani 1993, §13.3).
    A metric undefined on the full sample gets ``estimate=None`` and the reason in ``note``.

    Args:
        stats: per-request statistics (``R`` requests). n_boot: replicates. alpha: 1 - level.
        seed, scheme: of :func:`resample_counts`. metrics: a subset of names (default all).

    Returns:
        metric name -> :class:`Interval`.

    >>> st = ratio_stats(np.arange(100.0), np.ones(100), name="mean")
    >>> iv = bootstrap(st, n_boot=200, seed=0)["mean"]
    >>> iv.lower < iv.estimate == 49.5 < iv.upper
    True
    """
    _check_alpha(alpha)
    names = _names(stats, metrics)
    reps = _replicates([stats], names, n_boot, seed, scheme)[0]
    return _intervals(stats, names, reps, alpha, n_boot)


def _intervals(stats: RequestStats, names, reps, alpha: float, n_boot: int) -> dict[str, Interval]:
    point = stats.point()
    out = {}
    for n in names:
        v, ok = reps[n]
        why = stats.metrics[n].undefined
        base = dict(metric=n, alpha=alpha, n_requests=stats.n_requests, n_positives=stats.n_positives,
                    n_boot=n_boot, n_undefined=int((~ok).sum()))
        if point[n] is None:
            out[n] = Interval(estimate=None, lower=None, upper=None, note=f"undefined: {why}", **base)
            continue
        lo, hi, note = _percentile(v, ok, alpha, why)
        out[n] = Interval(estimate=point[n], lower=lo, upper=hi, note=note, **base)
    return out

# --- paired comparison -----------------------------------------------------------------------


@dataclass(frozen=True)
class PairedResult:
    """Paired bootstrap comparison of one metric, ``diff = a - b`` on the same resamples."""

    metric: str
    a: float | None
    b: float | None
    diff: float | None
    lower: float | None
    upper: float | None
    p_value: float | None
    verdict: str
    alpha: float
    n_requests: int
    n_boot: int
    note: str = ""

    def __str__(self) -> str:
        if self.diff is None:
            return f"{self.metric}: {self.verdict}"
        ci = ("[no interval]" if self.lower is None
              else f"[{self.lower:+.4g}, {self.upper:+.4g}]")
        return f"{self.metric}: {self.diff:+.4g} {ci}, p = {self.p_value:.3g} ({self.verdict})"


def paired_bootstrap(a: RequestStats, b: RequestStats, *, n_boot: int = 1000, alpha: float = 0.05,
                     seed: int = 0, scheme: str = "multinomial",
                     metrics: Sequence[str] | None = None) -> dict[str, PairedResult]:
    """Is metric(a) - metric(b) different from 0? Both score sets on the SAME requests.

    Every replicate weights the requests of ``a`` and ``b`` with the same counts, so the
    request-level noise common to both cancels in the difference ``d* = m(a*) - m(b*)``. Interval:
    percentile of ``d*``. Two-sided p-value (Efron & Tibshirani 1993, §16.4), with the
    Monte-Carlo add-one correction so it is never 0:
    ``p = min(1, 2 (min(#{d* <= 0}, #{d* >= 0}) + 1) / (n + 1))`` over the ``n`` replicates where
    both are defined. ``verdict`` is "significant at 5 %" when ``p < alpha``.

    Args:
        a, b: statistics of two score sets (see :func:`check_same_requests`).
        metrics: names present in both (default: the common ones, in ``a``'s order).

    Returns:
        metric name -> :class:`PairedResult`.
    """
    _check_alpha(alpha)
    check_same_requests(a, b)
    if metrics is None:
        names = [n for n in a.metrics if n in b.metrics]
        if not names:
            raise ValueError("the two statistics share no metric")
    else:
        names = _names(a, metrics)
        _names(b, metrics)
    ra, rb = _replicates([a, b], names, n_boot, seed, scheme)
    return _paired(a, b, names, ra, rb, alpha, n_boot)


def _paired(a, b, names, ra, rb, alpha: float, n_boot: int) -> dict[str, PairedResult]:
    pa, pb = a.point(), b.point()
    level = f"{100 * alpha:g} %"
    out = {}
    for n in names:
        base = dict(metric=n, a=pa[n], b=pb[n], alpha=alpha, n_requests=a.n_requests, n_boot=n_boot)
        if pa[n] is None or pb[n] is None:
            why = a.metrics[n].undefined if pa[n] is None else b.metrics[n].undefined
            out[n] = PairedResult(diff=None, lower=None, upper=None, p_value=None,
                                  verdict=f"no comparison: undefined ({why})", note=why, **base)
            continue
        d = ra[n][0] - rb[n][0]
        ok = ra[n][1] & rb[n][1]
        why = f"{a.metrics[n].undefined} in a resample of one of the two"
        lo, hi, note = _percentile(d, ok, alpha, why)
        m = int(ok.sum())
        if lo is None:
            out[n] = PairedResult(diff=pa[n] - pb[n], lower=None, upper=None, p_value=None,
                                  verdict="no test: " + note, note=note, **base)
            continue
        tail = min(int((d[ok] <= 0).sum()), int((d[ok] >= 0).sum()))
        p = min(1.0, 2 * (tail + 1) / (m + 1))
        verdict = f"significant at {level}" if p < alpha else f"not significant at {level}"
        out[n] = PairedResult(diff=pa[n] - pb[n], lower=lo, upper=hi, p_value=p, verdict=verdict,
                              note=note, **base)
    return out


def compare_bootstrap(stats: Mapping[str, RequestStats], *, baseline: str | None = None,
                      n_boot: int = 1000, alpha: float = 0.05, seed: int = 0, scheme: str = "multinomial",
                      metrics: Sequence[str] | None = None,
                      ) -> tuple[dict[str, dict[str, Interval]], dict[str, dict[str, PairedResult]]]:
    """Intervals for several score sets (runs) on the same requests, and paired tests vs a baseline.

    One set of resample counts serves every run (drawn once), so each run's intervals equal
    :func:`bootstrap` with the same seed and each comparison equals :func:`paired_bootstrap`: the
    building block of benchmark tables.

    Args:
        stats: run name -> statistics, all on the same requests. baseline: the run the others are
            compared with (default the first). metrics: names every run has (default: the
            baseline's that all runs have).

    Returns:
        ``(intervals, paired)``: run -> metric -> :class:`Interval`, and for every run but the
        baseline, run -> metric -> :class:`PairedResult` of ``run - baseline``.
    """
    _check_alpha(alpha)
    if not stats:
        raise ValueError("no statistics to compare")
    runs = list(stats)
    base = runs[0] if baseline is None else baseline
    if base not in stats:
        raise ValueError(f"baseline {base!r} is not one of the runs {runs}")
    for r in runs:
        try:
            check_same_requests(stats[base], stats[r])
        except ValueError as e:
            raise ValueError(f"run {r!r} vs baseline {base!r}: {e}") from None
    if metrics is None:
        names = [n for n in stats[base].metrics if all(n in stats[r].metrics for r in runs)]
    else:
        names = list(dict.fromkeys(metrics))
        for r in runs:
            _names(stats[r], names)
    reps = dict(zip(runs, _replicates([stats[r] for r in runs], names, n_boot, seed, scheme)))
    intervals = {r: _intervals(stats[r], names, reps[r], alpha, n_boot) for r in runs}
    paired = {r: _paired(stats[r], stats[base], names, reps[r], reps[base], alpha, n_boot)
              for r in runs if r != base}
    return intervals, paired

def interval_table(stats: Mapping[str, RequestStats], *, metrics: Sequence[str],
                   baseline: str | None = None, n_boot: int = 1000, alpha: float = 0.05,
                   seed: int = 0) -> dict[str, Any]:
    """Bootstrap intervals of several score sets (rows) on the same requests, and paired tests.

    The building block of the report tables (``hybridrank-train``'s result table,
    ``hybridrank-eval``): every row's statistics are the ones its point estimates come from, and
    every row is resampled with the same request counts (:func:`compare_bootstrap`).

    Args:
        stats: row name -> statistics (e.g. :func:`~hybridrank.metrics.builders.split_stats`);
            baseline: the row the others are compared with (default the first); metrics: which to
            report (those the first row has).

    Returns:
        JSON-able ``{"rows": {row: {metric: [estimate, lower, upper]}}, "notes": {row: {metric:
        why its interval is missing or incomplete}}, "paired": {row: {metric:
        {"diff", "lower", "upper", "p_value", "verdict"}}}, "n_requests", "n_positives",
        "n_boot", "alpha", "seed"}``.
    """
    first = next(iter(stats.values()))
    names = [m for m in metrics if m in first.metrics]
    ivs, paired = compare_bootstrap(stats, baseline=baseline, n_boot=n_boot, alpha=alpha, seed=seed,
                                    metrics=names)
    return {"rows": {r: {m: [iv.estimate, iv.lower, iv.upper] for m, iv in d.items()}
                     for r, d in ivs.items()},
            # why an interval is missing or leaves resamples out (shown under report tables)
            "notes": {r: {m: iv.note for m, iv in d.items() if iv.note} for r, d in ivs.items()},
            "paired": {r: {m: {"diff": p.diff, "lower": p.lower, "upper": p.upper,
                               "p_value": p.p_value, "verdict": p.verdict} for m, p in d.items()}
                       for r, d in paired.items()},
            "n_requests": first.n_requests, "n_positives": first.n_positives,
            "n_boot": n_boot, "alpha": alpha, "seed": seed}


# --- formatting --------------------------------------------------------------------------------


def _decimals(half: float, est: float, digits: int | None) -> int:
    if digits is not None:
        return digits
    if half > 0:  # two significant digits of the half-width
        return int(min(6, max(0, 1 - np.floor(np.log10(half)))))
    if est != 0:  # a zero-width interval: four significant digits of the estimate
        return int(min(6, max(0, 3 - np.floor(np.log10(abs(est))))))
    return 3


def format_interval(iv: Interval, digits: int | None = 3, *, scale: float = 1.0, suffix: str = "") -> str:
    """``"0.516 [0.509, 0.523]"``; ``digits=None`` picks the decimals from the interval width.

    An undefined estimate prints ``"n/a (undefined: reason)"``; a missing interval prints the
    estimate and ``"[no interval]"``. ``scale`` multiplies the numbers (e.g. 100 for percent).

    >>> iv = Interval("ndcg@10", 0.5161, 0.5093, 0.5228, 0.05, 1000, 120, 1000, 0)
    >>> format_interval(iv)
    '0.516 [0.509, 0.523]'
    """
    if iv.estimate is None:
        return f"n/a ({iv.note})"
    d = _decimals(0.0 if iv.lower is None else abs(iv.upper - iv.lower) * scale / 2, iv.estimate * scale, digits)
    est = f"{iv.estimate * scale:.{d}f}{suffix}"
    if iv.lower is None:
        return f"{est} [no interval]"
    return f"{est} [{iv.lower * scale:.{d}f}, {iv.upper * scale:.{d}f}]"
