"""Post-hoc calibrators on click logits, and the negative-downsampling correction.

A calibrator maps the model's click logit ``z`` (after the downsampling correction, if any) to a
calibrated pCTR. It is fitted on validation ``(logit, click)`` pairs, never on training data
(docs/CONVENTIONS.md §7.1). Three are provided, all pure torch (no scikit-learn at runtime):

- :class:`IdentityCalibrator` (``none``): ``p = σ(z)``.
- :class:`ShiftCalibrator` (``shift``, intercept only): ``p = σ(z + b)``: one parameter, the
  model's level corrected and its every other property kept; what few clicks can support.
- :class:`PlattCalibrator` (``platt``, Platt scaling on logits): ``p = σ(a·z + b)``, ``a, b``
  minimise the log loss (Newton's method, float64; Platt 1999), the slope shrunk toward 1 by a
  prior whose weight is fixed in clicks (so it matters when clicks are few). A slope ``a <= 0``
  would reverse the model's order: it is refused. With ``b = 0`` it would be temperature scaling
  (Guo et al. 2017).
- :class:`IsotonicCalibrator`: pool-adjacent-violators on the sorted logits (Zadrozny & Elkan
  2002), predicted by linear interpolation between the centres of the pooled blocks, constant
  beyond the first / last centre, clipped to ``[eps, 1 - eps]``.

Common interface: ``fit(logits, clicks, weights=None) -> self``, ``predict_proba(logits) -> p``,
``to_dict()`` (JSON-able, with ``"name"``), :func:`calibrator_from_dict`, and ``module()``: a
``torch.nn.Module`` mapping ``[B]`` logits to ``[B]`` probabilities, traceable by TorchScript and
exportable to ONNX (no training-only code, no Python-side state).

Negative downsampling (He et al. 2014): when training kept each negative with probability ``w``
and did *not* re-weight the kept ones, the model's odds are ``1 / w`` times too high; the
correction ``q = p / (p + (1 - p) / w)`` is the same as adding ``log w`` to the logit
(:func:`downsampling_correction`, :func:`correction_shift`). :func:`resolve_correction` decides,
from the ``correction: auto|always|never`` option, whether an export applies it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

__all__ = [
    "Calibrator", "IdentityCalibrator", "ShiftCalibrator", "PlattCalibrator", "IsotonicCalibrator",
    "AutoCalibrator", "NotRankingError", "compare_score_distributions", "level_stability",
    "CALIBRATORS", "calibrator_from_dict", "downsampling_correction", "correction_shift",
    "resolve_correction", "CORRECTIONS",
]

CORRECTIONS = ("auto", "always", "never")


# ----------------------------------------------------------------------------------------------
# Negative-downsampling correction
# ----------------------------------------------------------------------------------------------
def downsampling_correction(p, w: float):
    """Undo the CTR inflation of negative downsampling: ``q = p / (p + (1 - p) / w)``.

    Equivalently ``logit(q) = logit(p) + log(w)``. Works on floats, numpy arrays and tensors.

    Args:
        p: predicted probability of a model trained with negatives kept at rate ``w``.
        w: the negative keep rate, ``0 < w <= 1`` (1: nothing dropped, ``q = p``).

    Returns:
        The corrected probability, same type as ``p``.

    >>> round(downsampling_correction(0.5, 0.1), 6)   # odds 1 -> 0.1
    0.090909
    """
    _check_rate(w)
    return p / (p + (1 - p) / w)


def correction_shift(w: float) -> float:
    """The logit shift of the correction, ``log(w)`` (0 when nothing was dropped)."""
    _check_rate(w)
    return math.log(w)


def _check_rate(w: float) -> None:
    if not (isinstance(w, int | float) and 0 < w <= 1):
        raise ValueError(f"negative keep rate must lie in (0, 1], got {w!r}")


def resolve_correction(mode: str, neg_keep_rate: float, loss_reweighted: bool) -> bool:
    """Whether to apply the downsampling correction.

    Args:
        mode: ``"auto"``: apply iff negatives were dropped (``neg_keep_rate < 1``) and the loss
            did *not* re-weight the kept negatives by ``1 / w`` (with re-weighting the pointwise
            loss is already an unbiased estimate of the full-data loss, so correcting again would
            under-predict by the factor ``w`` in odds). ``"always"``: apply whenever
            ``neg_keep_rate < 1``. ``"never"``: do not apply.
        neg_keep_rate: the share of negatives the training sampler kept.
        loss_reweighted: whether the kept negatives carried weight ``1 / w`` in the loss.
    """
    if mode not in CORRECTIONS:
        raise ValueError(f"correction must be one of {CORRECTIONS}, got {mode!r}")
    _check_rate(float(neg_keep_rate))
    dropped = float(neg_keep_rate) < 1.0
    if mode == "never" or not dropped:
        return False
    return mode == "always" or not loss_reweighted


# ----------------------------------------------------------------------------------------------
# Calibrators
# ----------------------------------------------------------------------------------------------
def _fit_inputs(logits, clicks, weights) -> tuple[Tensor, Tensor, Tensor]:
    z = torch.as_tensor(logits).reshape(-1).double()
    y = (torch.as_tensor(clicks).reshape(-1) > 0).double()
    if z.shape != y.shape:
        raise ValueError(f"logits and clicks differ in length: {z.numel()} vs {y.numel()}")
    if z.numel() == 0:
        raise ValueError("cannot fit a calibrator on zero impressions")
    if not bool(torch.isfinite(z).all()):
        raise ValueError(f"logits hold {int((~torch.isfinite(z)).sum())} non-finite value(s)")
    w = torch.ones_like(z) if weights is None else torch.as_tensor(weights).reshape(-1).double()
    if w.shape != z.shape or bool((w < 0).any()) or not bool(torch.isfinite(w).all()):
        raise ValueError("weights must be finite, >= 0 and one per logit")
    return z, y, w


class NotRankingError(ValueError):
    """The fitted map would reverse the model's order (its scores rank clicks in reverse)."""


class Calibrator:
    """Base class: logits in, probabilities out. Subclasses set ``name`` and ``n_params`` (the
    number of fitted parameters ``auto`` asks clicks for)."""

    name = "base"
    n_params = 0

    def fit(self, logits, clicks, weights=None) -> Calibrator:
        raise NotImplementedError

    def predict_proba(self, logits) -> Tensor:
        """``[N]`` float64 calibrated probabilities of ``[N]`` logits."""
        with torch.no_grad():
            return self.module().double()(torch.as_tensor(logits).double())

    def module(self) -> nn.Module:
        """A ``torch.nn.Module`` mapping ``[B]`` logits to ``[B]`` probabilities."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.to_dict()})"


class _Sigmoid(nn.Module):
    def forward(self, z: Tensor) -> Tensor:
        return torch.sigmoid(z)


class _Affine(nn.Module):
    def __init__(self, a: float, b: float):
        super().__init__()
        self.register_buffer("a", torch.tensor(float(a)))
        self.register_buffer("b", torch.tensor(float(b)))

    def forward(self, z: Tensor) -> Tensor:
        return torch.sigmoid(z * self.a.to(z.dtype) + self.b.to(z.dtype))


class IdentityCalibrator(Calibrator):
    """``none``: the model's own probability ``σ(z)``; fitting does nothing."""

    name = "none"

    def fit(self, logits=None, clicks=None, weights=None) -> IdentityCalibrator:
        return self

    def module(self) -> nn.Module:
        return _Sigmoid()

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> IdentityCalibrator:
        return cls()


class ShiftCalibrator(Calibrator):
    """Intercept only: ``p = σ(z + b)``, ``b`` minimising the log loss (1-D Newton, float64).

    The model's level is corrected; its ranking, its spread and everything a monotone map could
    break are kept. Solves ``Σ w (y - σ(z + b)) = 0`` (predicted clicks = observed clicks), with a
    tiny ridge on ``b`` so a split without clicks gives a finite answer.

    >>> z = torch.zeros(1000); y = (torch.arange(1000) < 200).double()
    >>> round(ShiftCalibrator().fit(z, y).b, 3)    # logit(0.2)
    -1.386
    """

    name = "shift"
    n_params = 1

    def __init__(self, l2: float = 1e-6, b: float = 0.0):
        self.l2, self.b = float(l2), float(b)

    def fit(self, logits, clicks, weights=None) -> ShiftCalibrator:
        z, y, w = _fit_inputs(logits, clicks, weights)
        wn = w / w.sum()
        b = 0.0
        for _ in range(100):
            p = torch.sigmoid(z + b)
            grad = float((wn * (p - y)).sum()) + self.l2 * b
            hess = float((wn * p * (1 - p)).sum()) + self.l2
            step = max(-5.0, min(5.0, grad / hess))
            b -= step
            if abs(step) < 1e-12:
                break
        self.b = b
        return self

    def module(self) -> nn.Module:
        return _Affine(1.0, self.b)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "b": self.b, "l2": self.l2}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ShiftCalibrator:
        return cls(l2=float(d.get("l2", 1e-6)), b=float(d["b"]))


class PlattCalibrator(Calibrator):
    """Platt scaling on logits: ``p = σ(a·z + b)`` with ``(a, b)`` minimising the log loss.

    Fitted by damped Newton steps in float64 (two parameters: the Hessian is 2 × 2), starting
    from the identity ``a = 1, b = 0``; a tiny ridge ``l2`` on ``(a - 1, b)`` keeps the fit
    finite when the validation data are separable. ``a = 1 / T`` is the inverse temperature.

    The slope has a Gaussian prior ``a ~ N(1, slope_prior_sd²)`` on the scale of the *summed*
    log-likelihood: its pull is that of a fixed number of observations, negligible with thousands
    of clicks and decisive with a few dozen, where a free slope is mostly noise. A fitted slope
    ``a <= 0`` means the scores rank clicks in reverse: :class:`NotRankingError` is raised (a
    calibrator is a monotone increasing map; one that reversed the model's order would silently
    reverse every auction).

    Args:
        l2: ridge strength (per impression).
        slope_prior_sd: standard deviation of the slope's prior around 1 (None: no prior).
        max_iter, tol: Newton iterations and the stopping tolerance on the step.
        a, b: initial / loaded parameters.
    """

    name = "platt"
    n_params = 2

    def __init__(self, l2: float = 1e-6, slope_prior_sd: float | None = 0.5, max_iter: int = 100,
                 tol: float = 1e-10, a: float = 1.0, b: float = 0.0):
        self.l2, self.max_iter, self.tol = float(l2), int(max_iter), float(tol)
        self.slope_prior_sd = None if slope_prior_sd is None else float(slope_prior_sd)
        if self.slope_prior_sd is not None and not self.slope_prior_sd > 0:
            raise ValueError(f"slope_prior_sd must be > 0 (or None), got {slope_prior_sd}")
        self.a, self.b = float(a), float(b)
        self.fitted = False

    @staticmethod
    def _objective(theta: Tensor, z: Tensor, y: Tensor, w: Tensor, ridge: Tensor) -> Tensor:
        s = theta[0] * z + theta[1]
        nll = (w * (torch.nn.functional.softplus(s) - y * s)).sum() / w.sum()
        d = theta - torch.tensor([1.0, 0.0], dtype=theta.dtype)
        return nll + 0.5 * (ridge * d * d).sum()

    def fit(self, logits, clicks, weights=None) -> PlattCalibrator:
        z, y, w = _fit_inputs(logits, clicks, weights)
        if not 0 < float((w * y).sum()) < float(w.sum()):
            raise ValueError("Platt calibration needs both clicks and non-clicks")
        x = torch.stack([z, torch.ones_like(z)], dim=1)        # [N, 2]
        wn = w / w.sum()
        identity = torch.tensor([1.0, 0.0], dtype=torch.float64)
        prior = 0.0 if self.slope_prior_sd is None else 1.0 / (self.slope_prior_sd ** 2 * float(w.sum()))
        ridge = torch.tensor([self.l2 + prior, self.l2], dtype=torch.float64)
        theta = identity.clone()
        f = self._objective(theta, z, y, w, ridge)
        for _ in range(self.max_iter):
            p = torch.sigmoid(x @ theta)
            grad = x.T @ (wn * (p - y)) + ridge * (theta - identity)
            hess = (x.T * (wn * p * (1 - p))) @ x + torch.diag(ridge)
            step = torch.linalg.solve(hess, grad)
            t = 1.0
            while True:  # backtracking: never accept a step that raises the loss
                cand = theta - t * step
                fc = self._objective(cand, z, y, w, ridge)
                if fc <= f + 1e-4 * t * float(grad @ -step) or t < 1e-8:
                    break
                t *= 0.5
            theta, f = cand, fc
            if float((t * step).abs().max()) < self.tol:
                break
        if not float(theta[0]) > 0:
            raise NotRankingError(
                f"Platt slope a = {float(theta[0]):.3g} <= 0: the model's scores rank clicks in "
                f"reverse on this data; a calibrator must not reverse the model's order")
        self.a, self.b = float(theta[0]), float(theta[1])
        self.fitted = True
        return self

    def module(self) -> nn.Module:
        return _Affine(self.a, self.b)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "a": self.a, "b": self.b, "l2": self.l2,
                "slope_prior_sd": self.slope_prior_sd}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PlattCalibrator:
        out = cls(l2=float(d.get("l2", 1e-6)), slope_prior_sd=d.get("slope_prior_sd"),
                  a=float(d["a"]), b=float(d["b"]))
        out.fitted = True
        return out


class _Interp(nn.Module):
    """Linear interpolation on knots ``(x, y)``, constant outside, clipped to ``[eps, 1 - eps]``.

    The segment of each logit is ``searchsorted(x, z, right=True)``; under ONNX export (which has
    no searchsorted operator) the same index is computed as ``sum(z >= x)``, an ``O(B·K)``
    comparison that only basic ONNX operators express.
    """

    def __init__(self, x: Tensor, y: Tensor, eps: float):
        super().__init__()
        self.register_buffer("x", x.double().clone())
        self.register_buffer("y", y.double().clone())
        self.eps = float(eps)

    def forward(self, z: Tensor) -> Tensor:
        x = self.x.to(z.dtype)
        y = self.y.to(z.dtype)
        k = x.shape[0]
        if torch.onnx.is_in_onnx_export():
            idx = (z.unsqueeze(-1) >= x).to(torch.int64).sum(-1)
        else:
            idx = torch.searchsorted(x, z.contiguous(), right=True)
        hi = idx.clamp(1, k - 1) if k > 1 else idx.clamp(0, 0)
        lo = (hi - 1).clamp(min=0)
        x0, x1, y0, y1 = x[lo], x[hi], y[lo], y[hi]
        width = x1 - x0
        t = torch.where(width > 0, (z - x0) / torch.where(width > 0, width, torch.ones_like(width)),
                        torch.zeros_like(z))
        p = y0 + t.clamp(0.0, 1.0) * (y1 - y0)
        return p.clamp(self.eps, 1.0 - self.eps)


class IsotonicCalibrator(Calibrator):
    """Isotonic regression of clicks on logits (pool adjacent violators), interpolated.

    Fitting: aggregate the validation pairs by unique logit (weighted click sum and count), run
    PAV over them in increasing logit order so block means are non-decreasing, and keep one knot
    per block at ``(weighted mean logit of the block, block click rate)``. Prediction: linear
    interpolation between consecutive knots, the end knot's rate beyond the ends, clipped to
    ``[eps, 1 - eps]`` so downstream logs and eCPMs stay finite.

    Args:
        eps: probability clip.
        x, y: knots when loading.
    """

    name = "isotonic"
    n_params = 10  # a step function: ``auto`` asks it for ten times the clicks of one parameter

    def __init__(self, eps: float = 1e-6, x=None, y=None):
        self.eps = float(eps)
        self.x = None if x is None else torch.as_tensor(x, dtype=torch.float64)
        self.y = None if y is None else torch.as_tensor(y, dtype=torch.float64)

    def fit(self, logits, clicks, weights=None) -> IsotonicCalibrator:
        z, y, w = (t.numpy() for t in _fit_inputs(logits, clicks, weights))
        keep = w > 0
        if not keep.all():
            z, y, w = z[keep], y[keep], w[keep]
        if z.size == 0:
            raise ValueError("isotonic calibration: every weight is zero")
        uz, inv = np.unique(z, return_inverse=True)
        sw = np.bincount(inv, weights=w, minlength=uz.size)
        swy = np.bincount(inv, weights=w * y, minlength=uz.size)
        bw, bwy, bwz = _pav(sw, swy, uz * sw)
        self.x = torch.from_numpy(bwz / bw)
        self.y = torch.from_numpy(bwy / bw)
        return self

    def _check(self) -> None:
        if self.x is None:
            raise RuntimeError("IsotonicCalibrator is not fitted")

    def module(self) -> nn.Module:
        self._check()
        return _Interp(self.x, self.y, self.eps)

    @property
    def n_knots(self) -> int:
        self._check()
        return int(self.x.numel())

    def to_dict(self) -> dict[str, Any]:
        self._check()
        return {"name": self.name, "eps": self.eps, "x": self.x.tolist(), "y": self.y.tolist()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> IsotonicCalibrator:
        return cls(eps=float(d.get("eps", 1e-6)), x=list(d["x"]), y=list(d["y"]))


def _pav(w: np.ndarray, wy: np.ndarray, wz: np.ndarray) -> tuple[np.ndarray, ...]:
    """Pool adjacent violators over values already sorted by logit, with strictly rising means.

    Each input entry is a block (weight, weighted click sum, weighted logit sum). SciPy's PAVA
    (``scipy.optimize.isotonic_regression``, compiled, O(n)) finds the blocks of the weighted
    isotonic fit of the click rates; it pools a block with its predecessor while the
    predecessor's mean is not below it, and a last pass merges any neighbours whose summed means
    still tie after rounding, so the output means strictly increase. Returns the block sums.
    """
    from scipy.optimize import isotonic_regression  # scipy's import is slow; only fits need it

    starts = isotonic_regression(wy / w, weights=w, increasing=True).blocks[:-1]
    sums = [np.add.reduceat(a, starts) for a in (w, wy, wz)]
    mean = sums[1] / sums[0]
    rising = np.flatnonzero(np.r_[True, mean[1:] > mean[:-1]])
    if rising.size == mean.size:
        return tuple(sums)
    return tuple(np.add.reduceat(a, rising) for a in sums)


#: Calibrators by config / metadata name (a plain dict: no eval / globals dispatch).
#: ``temperature`` is the name exports written before version 0.2 give Platt scaling.
CALIBRATORS: dict[str, type[Calibrator]] = {
    "none": IdentityCalibrator,
    "shift": ShiftCalibrator,
    "platt": PlattCalibrator,
    "temperature": PlattCalibrator,
    "isotonic": IsotonicCalibrator,
}


def calibrator_from_dict(d: Mapping[str, Any]) -> Calibrator:
    """Rebuild a calibrator from its :meth:`Calibrator.to_dict` form (e.g. export metadata)."""
    name = d.get("name")
    if name not in CALIBRATORS:
        raise ValueError(f"unknown calibrator {name!r}; known: {sorted(CALIBRATORS)}")
    return CALIBRATORS[name].from_dict(d)


# ----------------------------------------------------------------------------------------------
# Choosing a calibrator on held-out data
# ----------------------------------------------------------------------------------------------
def compare_score_distributions(calibration: Tensor, scored: Tensor, *, calibration_requests: int,
                                scored_requests: int, max_ratio: float = 1.25,
                                ks_floor: float = 0.1) -> dict[str, Any]:
    """Does the calibration split look like the data that will be scored? (From scores alone.)

    Compares the model's serving logits on both: the mean pCTR (their ratio) and the whole
    distribution (two-sample Kolmogorov-Smirnov distance). Impressions of one request are
    correlated, so the KS noise level is taken from the request counts: the verdict is
    ``"differs"`` when the mean pCTRs differ by more than ``max_ratio`` either way, or the KS
    distance exceeds ``max(ks_floor, 1.36 · sqrt(1/R_cal + 1/R_scored))`` (the 5 % critical value
    with requests as the unit).

    >>> a = torch.linspace(-4, -1, 1000)
    >>> compare_score_distributions(a, a + 1.0, calibration_requests=100, scored_requests=100)["verdict"]
    'differs'
    """
    zc, zs = calibration.double().reshape(-1), scored.double().reshape(-1)
    if zc.numel() == 0 or zs.numel() == 0:
        raise ValueError("cannot compare empty score samples")
    mc, ms = float(torch.sigmoid(zc).mean()), float(torch.sigmoid(zs).mean())
    both = torch.cat([zc, zs]).sort().values
    cdf_c = torch.searchsorted(zc.sort().values, both, right=True).double() / zc.numel()
    cdf_s = torch.searchsorted(zs.sort().values, both, right=True).double() / zs.numel()
    ks = float((cdf_c - cdf_s).abs().max())
    limit = max(ks_floor, 1.36 * math.sqrt(1.0 / max(calibration_requests, 1) + 1.0 / max(scored_requests, 1)))
    ratio = ms / mc if mc > 0 else math.inf
    reasons = []
    if not 1 / max_ratio <= ratio <= max_ratio:
        reasons.append(f"mean pCTR {ms:.4g} on the scored data vs {mc:.4g} on the calibration split "
                       f"(ratio {ratio:.3g}, allowed {1 / max_ratio:.3g}-{max_ratio:.3g})")
    if ks > limit:
        reasons.append(f"score distributions differ (KS distance {ks:.3f} > {limit:.3f})")
    return {"verdict": "differs" if reasons else "resembles", "reasons": reasons,
            "mean_pctr": {"calibration": mc, "scored": ms}, "ks": ks, "ks_limit": limit,
            "impressions": {"calibration": int(zc.numel()), "scored": int(zs.numel())},
            "requests": {"calibration": int(calibration_requests), "scored": int(scored_requests)}}


def _auc(z: Tensor, y: Tensor) -> float | None:
    """Rank AUC of logits against clicks (ties count half); None with a single class."""
    pos = y > 0
    n1, n0 = int(pos.sum()), int((~pos).sum())
    if n1 == 0 or n0 == 0:
        return None
    order = torch.argsort(z)
    _, inv, counts = torch.unique_consecutive(z[order], return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).double()
    mid = ends - (counts.double() - 1) / 2
    ranks = mid[inv]
    r_pos = float(ranks[pos[order]].sum())
    return (r_pos - n1 * (n1 + 1) / 2) / (n1 * n0)


class AutoCalibrator(Calibrator):
    """``auto``: keep the model's own pCTR unless a calibrator clearly helps, and can be trusted
    to help where it will be used.

    A calibrator fitted on a small validation split can make things worse (Platt fitted on 100
    requests of a real log raised test ECE 3x; another model ranked worse than random and Platt
    reversed its order). ``auto`` therefore

    1. **cross-fits** every candidate on the calibration split: folds **by request** (no request's
       impressions on both sides); with request times (``order``) the folds are blocks of time
       and each is predicted by a fit on the blocks *before* it (forward chaining: what a
       calibrator fitted on the past does to the next period), else random folds;
    2. keeps a candidate only if its mean held-out log-loss improvement over the identity exceeds
       ``z`` standard errors of the paired per-request difference (one-sided; ``z = 2``), and the
       split has at least ``min_clicks_per_param`` clicks per fitted parameter (shift 1, Platt 2,
       isotonic 10);
    3. refuses maps that would reverse the model's order (Platt slope ``<= 0``), and flags a model
       whose scores rank the split's clicks worse than chance (AUC below 0.5 by more than two
       standard errors) as not ranking;
    4. with request times, tests that the model's miscalibration is the same in every time block
       (:func:`level_stability`, Cochran's Q at 5 %): a gap that moves with time would be carried
       from one period into another, so the identity is kept; so it is when the export already
       follows a level trend (``moved``), whose test found the level moving on more rows;
    5. with the scored data's scores (``reference``), checks that the calibration split resembles
       them (:func:`compare_score_distributions`); when it does not, the identity is kept
       (``on_mismatch="identity"``) or the check is only reported (``"warn"``).

    Among the candidates that pass, the largest improvement wins; it is refitted on the whole
    split. Every decision and its evidence are in :meth:`to_dict` (export metadata) and
    :meth:`describe` (one console line).

    Args:
        candidates: calibrator names (``shift``, ``platt``, ``isotonic``) besides ``none``.
        folds: cross-fitting folds (>= 2).
        z: how many standard errors an improvement must exceed.
        min_clicks_per_param: clicks the split must hold per fitted parameter.
        on_mismatch: ``"identity"`` or ``"warn"`` when the scored data look different.
        seed: the random fold assignment's seed.
        chosen, decision: set when loading.

    >>> g = torch.Generator().manual_seed(0)
    >>> z = torch.randn(20_000, generator=g)
    >>> y = (torch.rand(20_000, generator=g) < torch.sigmoid(3 * z + 1)).double()  # mis-scaled
    >>> AutoCalibrator().fit(z, y, groups=torch.arange(20_000) // 10).chosen.name in ("platt", "isotonic")
    True
    """

    name = "auto"

    def __init__(self, candidates=("shift", "platt", "isotonic"), folds: int = 5, z: float = 2.0,
                 min_clicks_per_param: float = 100.0, on_mismatch: str = "identity", seed: int = 0,
                 chosen: Calibrator | None = None, decision: dict | None = None):
        unknown = sorted(set(candidates) - (set(CALIBRATORS) - {"auto", "none", "temperature"}))
        if unknown:
            raise ValueError(f"auto: unknown candidates {unknown}; choose from shift, platt, isotonic")
        if int(folds) < 2:
            raise ValueError(f"auto: folds must be >= 2, got {folds}")
        if on_mismatch not in ("identity", "warn"):
            raise ValueError(f"auto: on_mismatch must be 'identity' or 'warn', got {on_mismatch!r}")
        self.candidates, self.folds, self.z, self.seed = tuple(candidates), int(folds), float(z), int(seed)
        self.min_clicks_per_param, self.on_mismatch = float(min_clicks_per_param), on_mismatch
        self.chosen: Calibrator = chosen or IdentityCalibrator()
        self.decision = dict(decision or {})

    @staticmethod
    def _nll(p: Tensor, y: Tensor) -> Tensor:
        p = p.clamp(1e-7, 1 - 1e-7)
        return -(y * torch.log(p) + (1 - y) * torch.log1p(-p))

    def _folds(self, gid: Tensor, n_groups: int, order: Tensor | None) -> tuple[Tensor, str]:
        """Fold of every group: random, or blocks of time (``order``: one time per group)."""
        fold = torch.empty(n_groups, dtype=torch.long)
        if order is None:
            perm = torch.randperm(n_groups, generator=torch.Generator().manual_seed(self.seed))
            fold[perm] = torch.arange(n_groups) % self.folds
            return fold, f"{self.folds} random folds by request"
        rank = torch.empty(n_groups, dtype=torch.long)
        rank[torch.argsort(order.double(), stable=True)] = torch.arange(n_groups)
        fold = rank * self.folds // n_groups
        return fold, (f"{self.folds} time blocks of requests, each predicted by a fit on the "
                      f"blocks before it")

    def fit(self, logits, clicks, weights=None, groups=None, order=None, reference=None,
            serving=None, reference_requests: int | None = None, moved=None) -> AutoCalibrator:
        """Cross-fit the candidates and keep the winner (or the identity).

        Args:
            logits, clicks, weights: as every calibrator (logits where the labels were drawn).
            groups: ``[N]`` request id of every impression (folds never cut a request). Without
                them every impression is its own group (a warning: impressions of one request are
                correlated, so the noise is then underestimated).
            order: ``[N]`` time of every impression's request (constant within a request), for
                folds in time order; None: random folds.
            reference: serving logits of (a sample of) the data that will be scored, for the
                resemblance check; ``reference_requests`` its number of requests. None: no check.
            serving: serving logits of the calibration split (default ``logits``; they differ for a
                model with a position tower, whose ``logits`` are at the logged positions).
            moved: ``[N]`` a time-dependent shift already added to ``logits`` (the export's level
                trend), or None. The stability test (rule 4) reads the gaps of the model's own
                logits, before it: a level that moved over the log keeps the identity whether or
                not the trend follows it. Measured: on a drifting world whose trend the export
                followed, the detrended gaps looked stable, ``auto`` fitted a shift, and test log
                loss rose by 3 standard errors (docs/BENCHMARKS.md, "Level drift"). A ``moved``
                that varies (a trend applied, with request times) keeps the identity by itself:
                the trend's test read the training and validation rows and found the level
                moving, while the split's own Q test has a few hundred clicks. Measured: world
                7842 (a linear drift, 657 validation clicks, Q p = 0.12): Platt adopted at 2.2
                standard errors raised test log loss by 4 (docs/BENCHMARKS.md, "auto and the level
                trend").
        """
        z, y, w = _fit_inputs(logits, clicks, weights)
        if groups is None:
            import warnings

            warnings.warn("AutoCalibrator.fit without groups: folds and noise by impression",
                          stacklevel=2)
            g = torch.arange(z.numel())
        else:
            g = torch.as_tensor(groups).reshape(-1)
            if g.numel() != z.numel():
                raise ValueError(f"groups has {g.numel()} entries for {z.numel()} logits")
        uniq, gid = torch.unique(g, return_inverse=True)
        n_groups = int(uniq.numel())
        if n_groups < self.folds:
            raise ValueError(f"auto: {n_groups} request(s) cannot make {self.folds} folds")
        group_order = None
        if order is not None:
            o = torch.as_tensor(order).reshape(-1).double()
            if o.numel() != z.numel():
                raise ValueError(f"order has {o.numel()} entries for {z.numel()} logits")
            group_order = _group_min(o, gid, n_groups)
        fold, scheme = self._folds(gid, n_groups, group_order)
        fold_of = fold[gid]
        forward = group_order is not None
        evaluated = fold_of > 0 if forward else torch.ones_like(fold_of, dtype=torch.bool)
        clicks_total = float((w * y).sum())
        base = self._nll(torch.sigmoid(z), y)
        we = w * evaluated
        results: dict[str, dict] = {"none": {"cv_logloss": float((we * base).sum() / we.sum())}}
        auc = _auc(z, y)
        ranking: dict[str, Any] = {"auc": auc}
        not_ranking = False
        if auc is not None:
            n1, n0 = float((y > 0).sum()), float((y <= 0).sum())
            se_auc = math.sqrt((n1 + n0 + 1) / (12 * n1 * n0))  # under AUC = 0.5
            not_ranking = auc < 0.5 - 2 * se_auc
            ranking["se_under_chance"] = se_auc
        ranking["verdict"] = ("the scores rank this split's clicks WORSE than chance: the model is "
                              "not ranking" if not_ranking else "ranks better than chance"
                              if auc is not None else "undefined (one class)")
        best, best_gain = "none", 0.0
        for name in self.candidates:
            cls = CALIBRATORS[name]
            need = self.min_clicks_per_param * cls.n_params
            if clicks_total < need:
                results[name] = {"refused": f"{clicks_total:.0f} clicks < {need:.0f} "
                                            f"({cls.n_params} parameter(s) x {self.min_clicks_per_param:g})"}
                continue
            oof = torch.empty_like(z)
            error = None
            for k in range(1 if forward else 0, self.folds):
                train = (fold_of < k) if forward else (fold_of != k)
                test = fold_of == k
                if not bool(test.any()):
                    continue
                try:
                    cal = cls().fit(z[train], y[train], w[train])
                except NotRankingError as e:
                    error = f"refused: {e}"
                    break
                except ValueError as e:  # e.g. a fold without clicks
                    error = str(e)
                    break
                oof[test] = cal.predict_proba(z[test])
            if error is not None:
                results[name] = {"refused" if error.startswith("refused") else "error": error}
                continue
            loss = self._nll(oof, y)
            # paired per-request differences of the weighted log-loss sums, mean per impression
            d = torch.zeros(n_groups, dtype=torch.float64).index_add_(
                0, gid, torch.where(evaluated, w * (base - loss), torch.zeros_like(w)))
            ev_groups = fold > 0 if forward else torch.ones(n_groups, dtype=torch.bool)
            d = d[ev_groups]
            gain = float(d.sum() / we.sum())
            se = float(d.std(unbiased=True) * math.sqrt(d.numel()) / we.sum()) if d.numel() > 1 else math.inf
            adopt = gain > self.z * se
            results[name] = {"cv_logloss": float((we * loss).sum() / we.sum()), "improvement": gain,
                             "se": se, "passes": bool(adopt)}
            if adopt and gain > best_gain:
                best, best_gain = name, gain
        stability = None
        if forward:  # the level gap per time block: a map fitted on a moving gap does not transfer
            shift = None if moved is None else torch.as_tensor(moved).reshape(-1).double()
            own = z if shift is None else z - shift
            stability = level_stability(own, y, w, fold_of, self.folds)
            # a trend already applied is a test of the same question on more rows (the training
            # and validation ones) that found the level moving, whatever this split's Q says
            stability["level_trend_applied"] = bool(shift is not None and shift.numel()
                                                    and float(shift.max() - shift.min()) > 0)
            if best != "none" and stability.get("stable") is False:
                results[best]["overruled"] = (f"the model's miscalibration changes over time within the "
                                              f"calibration split (Cochran's Q p = {stability['p_value']:.3g})")
                best = "none"
            elif best != "none" and stability["level_trend_applied"]:
                results[best]["overruled"] = (
                    "the click level drifts over the log (the export follows a level trend): a map "
                    "fitted on the calibration split's miscalibration would carry that period's gap "
                    "into the scored one")
                best = "none"
        resemblance = None
        if reference is not None:
            zs = z if serving is None else torch.as_tensor(serving).reshape(-1).double()
            resemblance = compare_score_distributions(
                zs, torch.as_tensor(reference).reshape(-1), calibration_requests=n_groups,
                scored_requests=int(reference_requests or n_groups))
            if resemblance["verdict"] == "differs" and best != "none" and self.on_mismatch == "identity" \
                    and not results[best].get("overruled"):
                results[best]["overruled"] = "the calibration split does not resemble the scored data"
                best = "none"
        chosen = IdentityCalibrator()
        if best != "none":
            try:
                chosen = CALIBRATORS[best]().fit(z, y, w)
            except NotRankingError as e:  # the whole split disagrees with its folds: keep the model
                results[best]["refused"] = f"refused on the whole split: {e}"
                best = "none"
        self.chosen = chosen
        self.decision = {"chosen": best, "rule": f"improvement > {self.z:g} x se; {scheme}; "
                         f">= {self.min_clicks_per_param:g} clicks per parameter",
                         "requests": n_groups, "clicks": clicks_total, "candidates": results,
                         "ranking": ranking, "stability": stability, "resemblance": resemblance}
        return self

    def describe(self) -> str:
        """One line: what was chosen and why (for the console)."""
        d = self.decision
        if not d:
            return f"auto: {self.chosen.name} (not fitted here)"
        parts = []
        for name, r in d.get("candidates", {}).items():
            if name == "none":
                continue
            if "improvement" in r:
                mark = "passes" if r.get("passes") else "not significant"
                if r.get("overruled"):
                    mark = "overruled"
                parts.append(f"{name} {r['improvement']:+.5f} ± {r['se']:.5f} ({mark})")
            else:
                parts.append(f"{name} {r.get('refused') or r.get('error')}")
        line = (f"calibrator auto chose {d['chosen']} on {d['requests']:,} requests / "
                f"{d['clicks']:,.0f} clicks: " + "; ".join(parts))
        st = d.get("stability")
        if st and st.get("stable") is not None:
            line += (f"; level over time: {'stable' if st['stable'] else 'MOVING'} "
                     f"(p = {st['p_value']:.3g})")
            if st.get("level_trend_applied"):
                line += "; the export follows a level trend (the level drifts), so auto keeps the identity"
            if st.get("trending"):
                line += (f"; level TRENDING: the click level moved {st['trend']:+.3f} ± "
                         f"{st['trend_se']:.3f} logit per time block of the calibration split "
                         f"(p = {st['trend_p']:.3g}); a model that cannot see time learns the "
                         f"average level, so pCTR scored after this log may be off by about that "
                         f"much per block of time")
        res = d.get("resemblance")
        if res:
            line += f"; calibration split vs scored data: {res['verdict']}"
            if res["reasons"]:
                line += " (" + "; ".join(res["reasons"]) + ")"
        if (d.get("ranking") or {}).get("verdict", "").startswith("the scores rank"):
            line += "; WARNING: " + d["ranking"]["verdict"]
        return line

    def module(self) -> nn.Module:
        return self.chosen.module()

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "chosen": self.chosen.to_dict(), "decision": self.decision,
                "candidates": list(self.candidates), "folds": self.folds, "z": self.z,
                "min_clicks_per_param": self.min_clicks_per_param, "on_mismatch": self.on_mismatch,
                "seed": self.seed}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AutoCalibrator:
        return cls(candidates=tuple(d.get("candidates", ("platt", "isotonic"))),
                   folds=int(d.get("folds", 5)), z=float(d.get("z", 2.0)),
                   min_clicks_per_param=float(d.get("min_clicks_per_param", 0.0)),
                   on_mismatch=d.get("on_mismatch", "identity"),
                   seed=int(d.get("seed", 0)), chosen=calibrator_from_dict(d["chosen"]),
                   decision=d.get("decision"))


def level_stability(logits: Tensor, clicks: Tensor, weights: Tensor, block: Tensor,
                    n_blocks: int, alpha: float = 0.05) -> dict[str, Any]:
    """Is the model's miscalibration the same over time? Cochran's Q over time blocks.

    Per block ``k`` the level gap ``g_k``, the logit shift that matches the block's observed
    clicks, with its variance ``var_k`` (:func:`~hybridrank.serving.level_trend.block_gaps`);
    ``Q = Σ (g_k - ḡ)² / var_k`` (``ḡ`` the inverse-variance mean) is ``χ²(K - 1)`` when the gap
    is constant. A small p-value says the gap moves with time: a map fitted on this split would
    carry one period's gap into another. With three blocks or more, its one-degree-of-freedom
    part along time is reported too: ``trend`` (the inverse-variance weighted slope of the gap on
    the block's order, logit per block), ``trend_se``, ``trend_p`` (``χ²(1)``) and ``trending``
    (``trend_p < alpha``). It is reported, it decides nothing: a level that drifts one way is
    what a time-blind model's pCTR misses after the log ends.

    >>> z = torch.zeros(4000); y = (torch.arange(4000) % 10 == 0).double()
    >>> level_stability(z - 2.2, y, torch.ones(4000), torch.arange(4000) // 1000, 4)["stable"]
    True
    """
    from hybridrank.serving.level_trend import block_gaps, weighted_line

    seen, g, v = block_gaps(logits, clicks, weights, block, n_blocks)
    if len(g) < 2:
        return {"stable": None, "blocks": len(g)}
    # the blocks' own order (an empty one is skipped); with three blocks or more, the slope of
    # the gap along it is the one-degree-of-freedom part of Q that a one-way drift concentrates in
    line = weighted_line(seen.astype(np.float64), g, v)
    q, pval = line["q"], line["q_p"]
    out = {"stable": pval >= alpha, "q": q, "p_value": pval, "gaps": [round(float(x), 4) for x in g],
           "blocks": len(g)}
    if len(g) >= 3:
        out.update(trend=line["slope"], trend_se=line["slope_se"], trend_p=line["slope_p"],
                   trending=line["slope_p"] < alpha)
    return out


def _group_min(values: Tensor, gid: Tensor, n_groups: int) -> Tensor:
    """The smallest value in every group: ``[n_groups]`` float64."""
    out = np.full(n_groups, np.inf)
    np.minimum.at(out, gid.numpy(), values.double().numpy())
    return torch.from_numpy(out)


CALIBRATORS["auto"] = AutoCalibrator
