"""Post-hoc calibrators on click logits: ``none``, ``shift``, ``platt``, ``isotonic``.

A calibrator maps the model's click logit ``z`` (after the downsampling correction, if any) to a
calibrated pCTR. It is fitted on validation ``(logit, click)`` pairs, never on training data
(docs/CONVENTIONS.md §7.1). Four are provided, all pure torch (no scikit-learn at runtime):

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
exportable to ONNX (no training-only code, no Python-side state). ``auto``, the choice among
them on held-out data, is :class:`~hybridrank.serving.calibration.auto.AutoCalibrator`; it adds
itself to :data:`CALIBRATORS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

__all__ = [
    "Calibrator", "IdentityCalibrator", "ShiftCalibrator", "PlattCalibrator", "IsotonicCalibrator",
    "NotRankingError", "CALIBRATORS", "calibrator_from_dict", "fit_inputs",
]


def fit_inputs(logits, clicks, weights) -> tuple[Tensor, Tensor, Tensor]:
    """The checked float64 ``(z, y, w)`` every fit reads: ``[N]`` logits, 0/1 clicks (``> 0``) and
    weights (default 1). Raises ``ValueError`` naming the problem: lengths that differ, no rows,
    a non-finite logit, a negative or non-finite weight."""
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
        z, y, w = fit_inputs(logits, clicks, weights)
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
        z, y, w = fit_inputs(logits, clicks, weights)
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
        z, y, w = (t.numpy() for t in fit_inputs(logits, clicks, weights))
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

