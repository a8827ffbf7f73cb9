"""Calibration metrics on predicted click probabilities, and the formulas over sums they share.

Every function takes probabilities ``p`` and ``labels`` of one shape (flat ``[N]`` or padded
``[G, L]``) and an optional boolean ``mask`` of that shape, keyword-only as in every metric and
loss (``log_loss(p, labels, *, mask=None)``; True = a real impression, see the glossary in
:mod:`hybridrank.lists`). Labels are binarised, ``y = label > 0`` (docs/CONVENTIONS.md §5).
All sums are taken in float64. NaN in ``p`` or ``labels`` raises ``ValueError`` naming the argument;
so does ``p`` outside ``[0, 1]``.

Every metric here is a formula over sums (``*_from_sums``: log loss, NE, PCOC, and the one
``|predicted - observed|`` gap behind ECE and F-ECE), written once: the pure functions below apply
it to the sums of their input, :class:`~hybridrank.metrics.list_metrics.ListMetrics` to its
streaming states and :class:`~hybridrank.metrics.per_request.RequestStats` to (re-weighted)
totals of per-request sums. The formulas are vectorised over leading dimensions (one row per
bootstrap replicate) and return ``(value, defined)``.

Binning (ECE and reliability tables), ``B`` bins over ``n`` impressions:

- ``"uniform"``: bin ``min(floor(p * B), B - 1)``, so p = 0 is in bin 0 and p = 1 in bin ``B - 1``.
- ``"quantile"`` (equal mass): sort p ascending; an impression whose p has ``r`` impressions with a
  strictly smaller p goes to bin ``floor(r * B / n)``. Without ties this is ``B`` equal-count bins
  (sizes differ by at most one); a block of tied p always shares one bin (the bin of its first
  member), so the result never depends on storage order. p = 0 lands in bin 0; p = 1 lands in the
  last non-empty bin (bin ``B - 1`` unless more than ``n / B`` impressions tie at p = 1, in which
  case the bins between stay empty).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "EPS",
    "bce",
    "logloss_from_sums",
    "ne_from_sums",
    "pcoc_from_sums",
    "gap_from_sums",
    "table_from_sums",
    "field_table_from_sums",
    "log_loss",
    "normalized_entropy",
    "pcoc",
    "pcoc_by_position",
    "field_ece",
    "pcoc_interval",
    "ece",
    "reliability_table",
    "bin_index",
    "check_binning",
    "safe_div",
    "ReliabilityTable",
    "PositionCalibration",
]

EPS = 1e-7
"""Probabilities are clipped to ``[EPS, 1 - EPS]`` inside the log loss."""

_BINNINGS = ("quantile", "uniform")


class ReliabilityTable(NamedTuple):
    """Per-bin calibration summary, each field ``[B]``; empty bins have count 0 and NaN means."""

    count: Tensor
    mean_p: Tensor
    mean_y: Tensor


class PositionCalibration(NamedTuple):
    """PCOC per display position, each field ``[P]`` over the distinct positions present."""

    position: Tensor
    count: Tensor
    sum_p: Tensor
    positives: Tensor
    pcoc: Tensor


def _flat(p: Tensor, labels: Tensor, mask: Tensor | None, name: str = "p") -> tuple[Tensor, Tensor]:
    """Validated float64 ``p`` and binary ``y``, both ``[n]``, over the real impressions."""
    if p.shape != labels.shape:
        raise ValueError(f"{name} and labels must have one shape, got {tuple(p.shape)} and "
                         f"{tuple(labels.shape)}")
    if mask is not None:
        if mask.shape != p.shape or mask.dtype != torch.bool:
            raise ValueError(f"mask must be a bool tensor of shape {tuple(p.shape)}")
        p, labels = p[mask], labels[mask]
    p = p.reshape(-1).double()
    labels = labels.reshape(-1)
    if bool(torch.isnan(p).any()):
        raise ValueError(f"{name} contains NaN")
    if bool(((p < 0) | (p > 1)).any()):
        raise ValueError(f"{name} must lie in [0, 1]")
    if labels.is_floating_point() and bool(torch.isnan(labels).any()):
        raise ValueError("labels contains NaN")
    return p, (labels > 0).double()


def check_binning(bins: int, binning: str) -> None:
    """Raise ``ValueError`` naming the option unless ``binning`` is known and ``bins`` a positive int."""
    if binning not in _BINNINGS:
        raise ValueError(f"binning must be one of {_BINNINGS}, got {binning!r}")
    if not isinstance(bins, int) or bins < 1:
        raise ValueError(f"bins must be a positive int, got {bins!r}")


def bce(p: Tensor, y: Tensor) -> Tensor:
    """Binary cross-entropy of each float64 probability, clipped to ``[EPS, 1 - EPS]``.

    >>> round(float(bce(torch.tensor([0.5], dtype=torch.float64), torch.tensor([1.0]))), 6)
    0.693147
    """
    q = p.clamp(EPS, 1 - EPS)
    return -(y * torch.log(q) + (1 - y) * torch.log1p(-q))


def safe_div(num: Tensor, den: Tensor) -> tuple[Tensor, Tensor]:
    """``num / den`` where ``den > 0`` (0 elsewhere, never NaN), and that flag: the ``(value,
    defined)`` pair of every formula over sums.

    >>> safe_div(torch.tensor([1.0, 1.0]), torch.tensor([4.0, 0.0]))
    (tensor([0.2500, 0.0000]), tensor([ True, False]))
    """
    ok = den > 0
    return torch.where(ok, num / torch.where(ok, den, torch.ones_like(den)), torch.zeros_like(num)), ok


def logloss_from_sums(ll: Tensor, n: Tensor) -> tuple[Tensor, Tensor]:
    """Log loss ``sum bce / n`` from the summed :func:`bce` and the impressions; defined if n > 0."""
    return safe_div(ll, n)


def ne_from_sums(ll: Tensor, n: Tensor, positives: Tensor) -> tuple[Tensor, Tensor]:
    """Normalized entropy ``(ll / n) / H(positives / n)``; defined when both classes occur."""
    ok = (positives > 0) & (positives < n)
    q = torch.where(ok, positives / torch.where(n > 0, n, torch.ones_like(n)), torch.full_like(n, 0.5))
    h = -(q * torch.log(q) + (1 - q) * torch.log1p(-q))
    return torch.where(ok, ll / torch.where(ok, n, torch.ones_like(n)) / h, torch.zeros_like(ll)), ok


def pcoc_from_sums(sum_p: Tensor, positives: Tensor) -> tuple[Tensor, Tensor]:
    """PCOC ``sum p / positives``; defined when there is a positive."""
    return safe_div(sum_p, positives)


def gap_from_sums(sum_p: Tensor, sum_y: Tensor, count: Tensor) -> tuple[Tensor, Tensor]:
    """``sum_c |sum_p_c - sum_y_c| / sum_c n_c`` over cells ``c`` (the last dimension).

    With calibration bins as cells this is the ECE, ``sum_b (n_b / n) |mean_p_b - mean_y_b|``; with
    the values of a field it is the field-level ECE. Defined when the cells hold an impression.
    """
    return safe_div((sum_p - sum_y).abs().sum(-1), count.sum(-1))


def _defined(value_ok: tuple[Tensor, Tensor], message: str) -> Tensor:
    """The scalar value of a formula, or ``ValueError(message)`` where it is undefined."""
    value, ok = value_ok
    if not bool(ok):
        raise ValueError(message)
    return value


def _n(p: Tensor) -> Tensor:
    return torch.tensor(float(p.numel()), dtype=torch.float64, device=p.device)


def log_loss(p: Tensor, labels: Tensor, *, mask: Tensor | None = None) -> Tensor:
    """Mean binary cross-entropy of predicted probabilities.

    ``-(1/n) sum_i [y_i log q_i + (1 - y_i) log(1 - q_i)]`` with ``q = clip(p, 1e-7, 1 - 1e-7)``.

    Args:
        p: ``[N]`` or ``[G, L]`` probabilities in ``[0, 1]``.
        labels: same shape; ``y = label > 0``.
        mask: optional bool, same shape; only True entries count.

    Returns:
        float64 scalar.

    >>> round(float(log_loss(torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0]))), 6)
    0.693147
    """
    p, y = _flat(p, labels, mask)
    return _defined(logloss_from_sums(bce(p, y).sum(), _n(p)), "log_loss of zero impressions")


def normalized_entropy(p: Tensor, labels: Tensor, *, mask: Tensor | None = None) -> Tensor:
    """Normalized entropy: log loss divided by the entropy of the base rate (He et al. 2014).

    ``NE = log_loss / H(ybar)`` with ``H(q) = -q log q - (1 - q) log(1 - q)``, natural logs.
    Below 1 means better than always predicting the base rate. Raises ``ValueError`` when the base
    rate is 0 or 1 (H = 0).

    Args:
        p, labels, mask: as in :func:`log_loss`.

    Returns:
        float64 scalar.

    >>> round(float(normalized_entropy(torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0]))), 6)
    1.0
    """
    p, y = _flat(p, labels, mask)
    return _defined(ne_from_sums(bce(p, y).sum(), _n(p), y.sum()),
                    "normalized_entropy undefined: labels have a single class")


def pcoc(p: Tensor, labels: Tensor, *, mask: Tensor | None = None) -> Tensor:
    """Predicted CTR over observed CTR, ``sum(p) / sum(y)``; 1.0 is perfect.

    Raises ``ValueError`` when there is no positive label (the ratio is undefined).

    Args:
        p, labels, mask: as in :func:`log_loss`.

    Returns:
        float64 scalar.

    >>> round(float(pcoc(torch.tensor([0.2, 0.4, 0.6]), torch.tensor([0.0, 1.0, 0.0]))), 6)
    1.2
    """
    p, y = _flat(p, labels, mask)
    return _defined(pcoc_from_sums(p.sum(), y.sum()), "pcoc undefined: no positive label")


def pcoc_by_position(
    p: Tensor, labels: Tensor, positions: Tensor, *, mask: Tensor | None = None
) -> PositionCalibration:
    """PCOC per display position (any integer slice id works the same way).

    ``pcoc_j = sum_{i: pos_i = j} p_i / sum_{i: pos_i = j} y_i``. Positions without a positive
    get ``+inf`` (flagged by ``positives == 0``) rather than raising: deep positions often have no
    click.

    Args:
        p, labels, mask: as in :func:`log_loss`.
        positions: integer tensor of the same shape as ``p``.

    Returns:
        :class:`PositionCalibration` over the sorted distinct positions.

    >>> p, y = torch.tensor([.2, .3, .5]), torch.tensor([1., 0., 1.])
    >>> r = pcoc_by_position(p, y, torch.tensor([1, 2, 1]))
    >>> r.position.tolist(), [round(v, 6) for v in r.pcoc.tolist()]
    ([1, 2], [0.35, inf])
    """
    if positions.shape != p.shape:
        raise ValueError("positions must have the shape of p")
    pos = positions[mask] if mask is not None else positions.reshape(-1)
    p, y = _flat(p, labels, mask)
    uniq, inv = torch.unique(pos, return_inverse=True)
    m = uniq.numel()
    return field_table_from_sums(uniq, torch.bincount(inv, minlength=m).double(),
                                 torch.bincount(inv, weights=p, minlength=m),
                                 torch.bincount(inv, weights=y, minlength=m))


def field_table_from_sums(values: Tensor, count: Tensor, sum_p: Tensor,
                          positives: Tensor) -> PositionCalibration:
    """The per-value table of the values seen (``count > 0``): impressions, predicted clicks,
    clicks and PCOC (``+inf`` for a value without clicks), from per-value sums ``[V]``."""
    seen = count > 0
    ratio = torch.where(positives > 0, sum_p / positives.clamp_min(1), torch.inf)
    return PositionCalibration(values[seen.to(values.device)], count[seen], sum_p[seen],
                               positives[seen], ratio[seen])


def field_ece(
    p: Tensor, labels: Tensor, values: Tensor, *, mask: Tensor | None = None
) -> Tensor:
    """Field-level ECE: the ECE whose bins are the values of a field (position, category, device).

    ``F-ECE = (1/n) sum_v |sum_{i: field_i = v} p_i - sum_{i: field_i = v} y_i|``, the
    impression-weighted mean of ``|mean p - click rate|`` per value. It is 0 when every value's
    predicted clicks match its observed clicks, whatever the global PCOC; a model that is globally
    calibrated but over-predicts one category and under-predicts another shows here and not in
    the global ECE of pCTR bins. Values without clicks count with their full predicted mass.

    Args:
        p, labels, mask: as in :func:`log_loss`. values: integer field codes, the shape of ``p``.

    >>> p, y = torch.tensor([.2, .2, .3, .3]), torch.tensor([1., 0., 0., 0.])
    >>> round(float(field_ece(p, y, torch.tensor([0, 0, 1, 1]))), 6)  # (|.4 - 1| + |.6 - 0|) / 4
    0.3
    """
    r = pcoc_by_position(p, labels, values, mask=mask)
    return gap_from_sums(r.sum_p, r.positives, r.count)[0]


def pcoc_interval(sum_p, positives, alpha: float = 0.05) -> tuple[Tensor, Tensor]:
    """Exact (Garwood) ``1 - alpha`` interval of PCOC = ``sum_p / clicks`` per slice.

    The predicted mass ``sum_p`` is fixed by the model; the clicks are treated as Poisson with an
    unknown mean ``mu`` (a slight over-statement of the variance of a sum of Bernoulli clicks, so
    the interval is conservative). The Garwood interval ``[mu_lo, mu_hi]`` of ``mu`` gives PCOC in
    ``[sum_p / mu_hi, sum_p / mu_lo]``; a slice without clicks has upper bound ``+inf``.

    >>> lo, hi = pcoc_interval(torch.tensor([10.0]), torch.tensor([10.0]))
    >>> round(float(lo), 3), round(float(hi), 3)
    (0.544, 2.085)
    """
    from scipy.stats import chi2

    sum_p = torch.as_tensor(sum_p, dtype=torch.float64)
    k = torch.as_tensor(positives, dtype=torch.float64).numpy()
    mu_lo = torch.from_numpy(np.where(k > 0, chi2.ppf(alpha / 2, 2 * k) / 2, 0.0))
    mu_hi = torch.from_numpy(chi2.ppf(1 - alpha / 2, 2 * k + 2) / 2)
    lower = sum_p / mu_hi
    upper = torch.where(mu_lo > 0, sum_p / mu_lo.clamp_min(1e-300), torch.inf)
    return lower, upper


def bin_index(p: Tensor, bins: int = 15, binning: str = "quantile") -> Tensor:
    """``[n]`` int64 calibration bin of each probability of a flat ``[n]`` tensor (module rules)."""
    check_binning(bins, binning)
    if binning == "uniform":
        return (p * bins).floor().long().clamp_(0, bins - 1)
    n = p.numel()
    sp, order = torch.sort(p)
    ar = torch.arange(n, device=p.device)
    new = torch.ones(n, dtype=torch.bool, device=p.device)
    new[1:] = sp[1:] != sp[:-1]
    first = torch.where(new, ar, 0).cummax(0).values  # items with a strictly smaller p
    out = torch.empty_like(order)
    out[order] = first * bins // max(n, 1)
    return out


def _bin_sums(idx: Tensor, p: Tensor, y: Tensor, bins: int) -> tuple[Tensor, Tensor, Tensor]:
    count = torch.bincount(idx, minlength=bins).double()
    return count, torch.bincount(idx, p, minlength=bins), torch.bincount(idx, y, minlength=bins)


def table_from_sums(count: Tensor, sum_p: Tensor, sum_y: Tensor) -> ReliabilityTable:
    """The reliability table of per-bin impressions, summed p and positives."""
    safe = count.clamp_min(1)
    nan = torch.full_like(count, float("nan"))
    return ReliabilityTable(count, torch.where(count > 0, sum_p / safe, nan),
                            torch.where(count > 0, sum_y / safe, nan))


def ece(
    p: Tensor, labels: Tensor, *, bins: int = 15, binning: str = "quantile",
    mask: Tensor | None = None,
) -> Tensor:
    """Expected calibration error over ``bins`` bins.

    ``ECE = sum_b (n_b / n) |mean_p_b - mean_y_b|``, bins as in the module docstring
    (``"quantile"``: equal mass, the default; ``"uniform"``: equal width).

    Args:
        p, labels, mask: as in :func:`log_loss`.
        bins: number of bins ``B``.
        binning: ``"quantile"`` or ``"uniform"``.

    Returns:
        float64 scalar.

    >>> p, y = torch.tensor([0.1, 0.3, 0.6, 0.8]), torch.tensor([0., 0., 1., 1.])
    >>> round(float(ece(p, y, bins=2)), 6)   # (|0.4 - 0| + |1.4 - 2|) / 4
    0.25
    """
    check_binning(bins, binning)
    p, y = _flat(p, labels, mask)
    if p.numel() == 0:
        raise ValueError("ece of zero impressions")
    count, sum_p, sum_y = _bin_sums(bin_index(p, bins, binning), p, y, bins)
    return gap_from_sums(sum_p, sum_y, count)[0]


def reliability_table(
    p: Tensor, labels: Tensor, bins: int = 15, binning: str = "quantile", *,
    mask: Tensor | None = None,
) -> ReliabilityTable:
    """Reliability diagram data: per bin the count, mean predicted p and observed rate.

    Args:
        p, labels, mask: as in :func:`log_loss`.
        bins, binning: as in :func:`ece`.

    Returns:
        :class:`ReliabilityTable` with ``[B]`` fields; ``ece`` equals
        ``sum(count * |mean_p - mean_y|) / sum(count)`` over the non-empty bins.
    """
    check_binning(bins, binning)
    p, y = _flat(p, labels, mask)
    return table_from_sums(*_bin_sums(bin_index(p, bins, binning), p, y, bins))
