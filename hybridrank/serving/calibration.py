"""Post-hoc calibrators on click logits, and the negative-downsampling correction.

A calibrator maps the model's click logit ``z`` (after the downsampling correction, if any) to a
calibrated pCTR. It is fitted on validation ``(logit, click)`` pairs, never on training data
(CONVENTIONS.md §4). Three are provided, all pure torch (no scikit-learn at runtime):

- :class:`IdentityCalibrator` (``none``): ``p = σ(z)``.
- :class:`PlattCalibrator` (``platt``, Platt scaling on logits): ``p = σ(a·z + b)``, ``a, b``
  minimise the log loss (Newton's method, float64; Platt 1999). With ``b = 0`` it would be
  temperature scaling (Guo et al. 2017); the intercept also fixes a shifted base rate.
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
    "Calibrator", "IdentityCalibrator", "PlattCalibrator", "IsotonicCalibrator", "AutoCalibrator",
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


class Calibrator:
    """Base class: logits in, probabilities out. Subclasses set ``name``."""

    name = "base"

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


class PlattCalibrator(Calibrator):
    """Platt scaling on logits: ``p = σ(a·z + b)`` with ``(a, b)`` minimising the log loss.

    Fitted by damped Newton steps in float64 (two parameters: the Hessian is 2 × 2), starting
    from the identity ``a = 1, b = 0``; a tiny ridge ``l2`` on ``(a - 1, b)`` keeps the fit
    finite when the validation data are separable. ``a = 1 / T`` is the inverse temperature.

    Args:
        l2: ridge strength (per impression).
        max_iter, tol: Newton iterations and the stopping tolerance on the step.
        a, b: initial / loaded parameters.
    """

    name = "platt"

    def __init__(self, l2: float = 1e-6, max_iter: int = 100, tol: float = 1e-10,
                 a: float = 1.0, b: float = 0.0):
        self.l2, self.max_iter, self.tol = float(l2), int(max_iter), float(tol)
        self.a, self.b = float(a), float(b)
        self.fitted = False

    @staticmethod
    def _objective(theta: Tensor, z: Tensor, y: Tensor, w: Tensor, l2: float) -> Tensor:
        s = theta[0] * z + theta[1]
        nll = (w * (torch.nn.functional.softplus(s) - y * s)).sum() / w.sum()
        return nll + 0.5 * l2 * ((theta[0] - 1) ** 2 + theta[1] ** 2)

    def fit(self, logits, clicks, weights=None) -> PlattCalibrator:
        z, y, w = _fit_inputs(logits, clicks, weights)
        if not 0 < float((w * y).sum()) < float(w.sum()):
            raise ValueError("Platt calibration needs both clicks and non-clicks")
        x = torch.stack([z, torch.ones_like(z)], dim=1)        # [N, 2]
        wn = w / w.sum()
        identity = torch.tensor([1.0, 0.0], dtype=torch.float64)
        theta = identity.clone()
        f = self._objective(theta, z, y, w, self.l2)
        for _ in range(self.max_iter):
            p = torch.sigmoid(x @ theta)
            grad = x.T @ (wn * (p - y)) + self.l2 * (theta - identity)
            hess = (x.T * (wn * p * (1 - p))) @ x + self.l2 * torch.eye(2, dtype=theta.dtype)
            step = torch.linalg.solve(hess, grad)
            t = 1.0
            while True:  # backtracking: never accept a step that raises the loss
                cand = theta - t * step
                fc = self._objective(cand, z, y, w, self.l2)
                if fc <= f + 1e-4 * t * float(grad @ -step) or t < 1e-8:
                    break
                t *= 0.5
            theta, f = cand, fc
            if float((t * step).abs().max()) < self.tol:
                break
        self.a, self.b = float(theta[0]), float(theta[1])
        self.fitted = True
        return self

    def module(self) -> nn.Module:
        return _Affine(self.a, self.b)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "a": self.a, "b": self.b, "l2": self.l2}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PlattCalibrator:
        out = cls(l2=float(d.get("l2", 1e-6)), a=float(d["a"]), b=float(d["b"]))
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
class AutoCalibrator(Calibrator):
    """``auto``: keep the model's own pCTR unless a calibrator clearly helps on held-out data.

    A calibrator fitted on a small validation split can make things worse (Platt fitted on 100
    requests of a real log raised test ECE 3x; isotonic raised log loss). ``auto`` cross-fits every
    candidate on the calibration split: ``folds`` folds **by request** (no request's impressions on
    both sides), out-of-fold predictions, and the paired per-request difference of held-out log
    loss against the identity. A candidate is kept only if its mean improvement exceeds ``z``
    standard errors of that difference (a one-sided test, ``z = 2`` ≈ 2.3 % false adoptions);
    among those, the largest improvement wins; otherwise the identity stays. The winner is then
    refitted on the whole split. The decision and every candidate's figures are in
    :meth:`to_dict` (and so in export metadata).

    Args:
        candidates: calibrator names (``platt``, ``isotonic``) to consider besides ``none``.
        folds: cross-fitting folds (>= 2).
        z: how many standard errors an improvement must exceed.
        seed: the fold assignment's seed.
        chosen, decision: set when loading.

    >>> g = torch.Generator().manual_seed(0)
    >>> z = torch.randn(20_000, generator=g)
    >>> y = (torch.rand(20_000, generator=g) < torch.sigmoid(3 * z + 1)).double()  # mis-scaled
    >>> AutoCalibrator().fit(z, y, groups=torch.arange(20_000) // 10).chosen.name in ("platt", "isotonic")
    True
    """

    name = "auto"

    def __init__(self, candidates=("platt", "isotonic"), folds: int = 5, z: float = 2.0,
                 seed: int = 0, chosen: Calibrator | None = None, decision: dict | None = None):
        unknown = sorted(set(candidates) - (set(CALIBRATORS) - {"auto", "none", "temperature"}))
        if unknown:
            raise ValueError(f"auto: unknown candidates {unknown}; choose from platt, isotonic")
        if int(folds) < 2:
            raise ValueError(f"auto: folds must be >= 2, got {folds}")
        self.candidates, self.folds, self.z, self.seed = tuple(candidates), int(folds), float(z), int(seed)
        self.chosen: Calibrator = chosen or IdentityCalibrator()
        self.decision = dict(decision or {})

    @staticmethod
    def _nll(p: Tensor, y: Tensor) -> Tensor:
        p = p.clamp(1e-7, 1 - 1e-7)
        return -(y * torch.log(p) + (1 - y) * torch.log1p(-p))

    def fit(self, logits, clicks, weights=None, groups=None) -> AutoCalibrator:
        """Cross-fit the candidates and keep the winner (or the identity).

        Args:
            logits, clicks, weights: as every calibrator.
            groups: ``[N]`` request id of every impression (folds never cut a request). Without
                them every impression is its own group (a warning: impressions of one request are
                correlated, so the noise is then underestimated).
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
        perm = torch.randperm(n_groups, generator=torch.Generator().manual_seed(self.seed))
        fold = torch.empty(n_groups, dtype=torch.long)
        fold[perm] = torch.arange(n_groups) % self.folds
        fold_of = fold[gid]
        base = self._nll(torch.sigmoid(z), y)
        results: dict[str, dict] = {"none": {"cv_logloss": float((w * base).sum() / w.sum())}}
        best, best_gain = "none", 0.0
        for name in self.candidates:
            oof = torch.empty_like(z)
            ok = True
            for k in range(self.folds):
                train, test = fold_of != k, fold_of == k
                try:
                    cal = CALIBRATORS[name]().fit(z[train], y[train], w[train])
                except ValueError as e:  # e.g. a fold without clicks
                    results[name] = {"error": str(e)}
                    ok = False
                    break
                oof[test] = cal.predict_proba(z[test])
            if not ok:
                continue
            loss = self._nll(oof, y)
            # paired per-request differences of the weighted log-loss sums, mean per impression
            d = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, gid, w * (base - loss))
            gain = float(d.sum() / w.sum())
            se = float(d.std(unbiased=True) * math.sqrt(n_groups) / w.sum()) if n_groups > 1 else math.inf
            adopt = gain > self.z * se
            results[name] = {"cv_logloss": float((w * loss).sum() / w.sum()), "improvement": gain,
                             "se": se, "passes": bool(adopt)}
            if adopt and gain > best_gain:
                best, best_gain = name, gain
        self.chosen = IdentityCalibrator() if best == "none" else CALIBRATORS[best]().fit(z, y, w)
        self.decision = {"chosen": best, "rule": f"improvement > {self.z:g} x se, {self.folds} "
                         "folds by request", "requests": n_groups, "candidates": results}
        return self

    def module(self) -> nn.Module:
        return self.chosen.module()

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "chosen": self.chosen.to_dict(), "decision": self.decision,
                "candidates": list(self.candidates), "folds": self.folds, "z": self.z,
                "seed": self.seed}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AutoCalibrator:
        return cls(candidates=tuple(d.get("candidates", ("platt", "isotonic"))),
                   folds=int(d.get("folds", 5)), z=float(d.get("z", 2.0)),
                   seed=int(d.get("seed", 0)), chosen=calibrator_from_dict(d["chosen"]),
                   decision=d.get("decision"))


CALIBRATORS["auto"] = AutoCalibrator
