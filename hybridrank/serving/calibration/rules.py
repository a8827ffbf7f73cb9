"""The rules of ``calibrator=auto``, each a named pure function.

:meth:`~hybridrank.serving.calibration.auto.AutoCalibrator.fit` is these rules in order; what
they return is the decision record written to the export's metadata.

1. **Cross-fitting by request** (:func:`assign_folds`, :func:`cross_fit`): folds never cut a
   request; with request times they are blocks of time, each predicted by a fit on the blocks
   before it, else random folds.
2. **Clicks per parameter and significance** (:func:`clicks_refusal`, :func:`significance`,
   :func:`best_candidate`): a candidate needs ``min_clicks_per_param`` clicks per fitted
   parameter, and its held-out log-loss improvement over the identity must exceed ``z`` standard
   errors of the paired per-request difference; the largest such improvement wins.
3. **Monotone, never reversing** (:func:`cross_fit` turns a
   :class:`~hybridrank.serving.calibration.calibrators.NotRankingError` into a refusal,
   :func:`ranking_check` flags scores that rank clicks worse than chance).
4. **A gap that moves with time is not carried forward** (:func:`stability_check`,
   :func:`stability_overrule`).
5. **The calibration split must resemble the scored data** (:func:`compare_score_distributions`,
   :func:`resemblance_overrule`).

Shapes: ``[N]`` impressions of the calibration split, ``[R]`` its requests. Every log loss is
per impression, probabilities clipped to ``[1e-7, 1 - 1e-7]`` (:func:`log_loss_rows`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from hybridrank.metrics.ranking import auc
from hybridrank.serving.calibration.calibrators import Calibrator, NotRankingError
from hybridrank.serving.level_trend import level_stability

__all__ = [
    "Folds", "request_index", "request_times", "assign_folds", "cross_fit", "log_loss_rows",
    "held_out_logloss", "clicks_refusal", "significance", "best_candidate", "ranking_check",
    "stability_check", "stability_overrule", "compare_score_distributions", "resemblance_overrule",
    "refit",
]


# --- rule 1: cross-fitting by request ---------------------------------------------------------
@dataclass(frozen=True)
class Folds:
    """Cross-fitting folds by request.

    Attributes:
        request: ``[N]`` each impression's request, ``0 .. R - 1``.
        of_group: ``[R]`` the fold of every request.
        k: the number of folds.
        forward: True: the folds are blocks of time and fold ``j`` is predicted by a fit on the
            folds before it (fold 0 is never scored); False: random folds, each predicted by a fit
            on the others.
        scheme: the scheme in words (the decision's ``rule``).
    """

    request: Tensor
    of_group: Tensor
    k: int
    forward: bool
    scheme: str

    @property
    def of_row(self) -> Tensor:
        """``[N]`` the fold of every impression (its request's)."""
        return self.of_group[self.request]

    @property
    def scored_rows(self) -> Tensor:
        """``[N]`` bool: the impressions some fit predicts (all but the first block forward)."""
        fold = self.of_row
        return fold > 0 if self.forward else torch.ones_like(fold, dtype=torch.bool)

    @property
    def scored_groups(self) -> Tensor:
        """``[R]`` bool: the requests some fit predicts."""
        return self.of_group > 0 if self.forward else torch.ones(self.of_group.numel(), dtype=torch.bool)

    def splits(self) -> Iterator[tuple[Tensor, Tensor]]:
        """``(train [N], test [N])`` bool masks of every fold that is predicted."""
        fold = self.of_row
        for j in range(1 if self.forward else 0, self.k):
            yield ((fold < j) if self.forward else (fold != j)), fold == j


def request_index(groups, n: int) -> tuple[Tensor, int]:
    """``(request [N], R)``: each impression's request as ``0 .. R - 1`` from its ``groups`` id.

    Without ``groups`` every impression is its own request, with a warning: impressions of one
    request are correlated, so the noise is then underestimated.

    >>> request_index(torch.tensor([7, 3, 7, 9]), 4)
    (tensor([1, 0, 1, 2]), 3)
    """
    if groups is None:
        warnings.warn("AutoCalibrator.fit without groups: folds and noise by impression", stacklevel=3)
        g = torch.arange(n)
    else:
        g = torch.as_tensor(groups).reshape(-1)
        if g.numel() != n:
            raise ValueError(f"groups has {g.numel()} entries for {n} logits")
    uniq, request = torch.unique(g, return_inverse=True)
    return request, int(uniq.numel())


def request_times(order, request: Tensor, n_requests: int) -> Tensor:
    """``[R]`` float64: each request's time, the earliest ``order`` among its impressions.

    >>> request_times(torch.tensor([5., 2., 4.]), torch.tensor([0, 1, 0]), 2)
    tensor([4., 2.], dtype=torch.float64)
    """
    o = torch.as_tensor(order).reshape(-1).double()
    if o.numel() != request.numel():
        raise ValueError(f"order has {o.numel()} entries for {request.numel()} logits")
    out = np.full(n_requests, np.inf)
    np.minimum.at(out, request.numpy(), o.numpy())
    return torch.from_numpy(out)


def assign_folds(request: Tensor, n_requests: int, k: int, *, times: Tensor | None = None,
                 seed: int = 0) -> Folds:
    """Folds by request: blocks of time when ``times`` are given, else random.

    With ``times`` (``[R]``), request ``r`` of time rank ``rank_r`` (ties in storage order) goes to
    fold ``rank_r · k // R``: ``k`` blocks of (nearly) equal request counts, each predicted by a
    fit on the blocks before it. Without, a seeded permutation deals the requests out in turn.

    Args:
        request: ``[N]`` each impression's request (:func:`request_index`).
        n_requests: ``R``, at least ``k``.
        k: the number of folds.
        times: ``[R]`` one time per request, or None.
        seed: the random permutation's seed.

    >>> f = assign_folds(torch.tensor([0, 0, 1, 2, 3]), 4, 2, times=torch.tensor([3., 2., 1., 0.]))
    >>> f.of_group.tolist(), f.scored_rows.tolist(), f.forward
    ([1, 1, 0, 0], [True, True, True, False, False], True)
    """
    if n_requests < k:
        raise ValueError(f"auto: {n_requests} request(s) cannot make {k} folds")
    if times is None:
        fold = torch.empty(n_requests, dtype=torch.long)
        perm = torch.randperm(n_requests, generator=torch.Generator().manual_seed(seed))
        fold[perm] = torch.arange(n_requests) % k
        return Folds(request, fold, k, False, f"{k} random folds by request")
    rank = torch.empty(n_requests, dtype=torch.long)
    rank[torch.argsort(times.double(), stable=True)] = torch.arange(n_requests)
    return Folds(request, rank * k // n_requests, k, True,
                 f"{k} time blocks of requests, each predicted by a fit on the blocks before it")


def cross_fit(calibrator: type[Calibrator], z: Tensor, y: Tensor, w: Tensor, folds: Folds
              ) -> tuple[Tensor | None, dict[str, str] | None]:
    """Out-of-fold predictions of one candidate: every scored fold predicted by a fresh fit on
    its training folds (rule 1); a fit that would reverse the model's order refuses (rule 3).

    Returns:
        ``(p [N], None)``, rows no fit predicts (the first time block) at the identity's
        ``σ(z)``; or ``(None, record)``: ``{"refused": "refused: ..."}`` when a fold's fit is
        :class:`NotRankingError`, ``{"error": ...}`` when it fails otherwise (a fold without
        clicks).
    """
    oof = torch.sigmoid(z)
    for train, test in folds.splits():
        if not bool(test.any()):
            continue
        try:
            fitted = calibrator().fit(z[train], y[train], w[train])
        except NotRankingError as e:
            return None, {"refused": f"refused: {e}"}
        except ValueError as e:
            return None, {"error": str(e)}
        oof[test] = fitted.predict_proba(z[test])
    return oof, None


# --- rule 2: clicks per parameter, significance -----------------------------------------------
def log_loss_rows(p: Tensor, y: Tensor) -> Tensor:
    """``[N]`` log loss of every impression, ``p`` clipped to ``[1e-7, 1 - 1e-7]``."""
    p = p.clamp(1e-7, 1 - 1e-7)
    return -(y * torch.log(p) + (1 - y) * torch.log1p(-p))


def held_out_logloss(loss: Tensor, w: Tensor, folds: Folds) -> float:
    """The weighted mean of ``loss [N]`` over the scored impressions."""
    we = w * folds.scored_rows
    return float((we * loss).sum() / we.sum())


def clicks_refusal(clicks: float, n_params: int, per_param: float) -> str | None:
    """Why a calibrator of ``n_params`` parameters may not be fitted on ``clicks`` clicks (it
    needs ``per_param`` per parameter), or None when it may.

    >>> clicks_refusal(150.0, 2, 100.0)
    '150 clicks < 200 (2 parameter(s) x 100)'
    >>> clicks_refusal(200.0, 2, 100.0) is None
    True
    """
    need = per_param * n_params
    if clicks < need:
        return f"{clicks:.0f} clicks < {need:.0f} ({n_params} parameter(s) x {per_param:g})"
    return None


def significance(base: Tensor, loss: Tensor, w: Tensor, folds: Folds, z: float) -> dict[str, Any]:
    """Does a candidate beat the identity by more than ``z`` standard errors on held-out rows?

    Per scored request ``r`` the weighted log-loss sum difference ``d_r = Σ_i w_i (base_i -
    loss_i)``; with ``W`` the scored weight, ``improvement = Σ d_r / W`` and
    ``se = sd(d) · sqrt(R') / W`` over the ``R'`` scored requests (infinite with one); the
    candidate ``passes`` when ``improvement > z · se`` (one-sided).

    Args:
        base: ``[N]`` the identity's log loss per impression. loss: ``[N]`` the candidate's
            out-of-fold log loss. w: ``[N]`` weights. folds: the cross-fitting folds.
        z: how many standard errors the improvement must exceed.

    Returns:
        ``{"cv_logloss", "improvement", "se", "passes"}``.
    """
    scored = folds.scored_rows
    we = w * scored
    d = torch.zeros(folds.of_group.numel(), dtype=torch.float64).index_add_(
        0, folds.request, torch.where(scored, w * (base - loss), torch.zeros_like(w)))
    d = d[folds.scored_groups]
    gain = float(d.sum() / we.sum())
    se = float(d.std(unbiased=True) * math.sqrt(d.numel()) / we.sum()) if d.numel() > 1 else math.inf
    return {"cv_logloss": float((we * loss).sum() / we.sum()), "improvement": gain, "se": se,
            "passes": bool(gain > z * se)}


def best_candidate(results: dict[str, dict[str, Any]]) -> str:
    """The passing candidate with the largest positive improvement (the first on a tie), else
    ``"none"``.

    >>> best_candidate({"none": {}, "shift": {"improvement": 0.002, "passes": True},
    ...                 "platt": {"improvement": 0.004, "passes": False}, "isotonic": {"refused": "-"}})
    'shift'
    """
    best, best_gain = "none", 0.0
    for name, record in results.items():
        if record.get("passes") and record["improvement"] > best_gain:
            best, best_gain = name, record["improvement"]
    return best


# --- rule 3: a model that does not rank --------------------------------------------------------
def ranking_check(z: Tensor, y: Tensor) -> dict[str, Any]:
    """Do the scores rank the split's clicks? Their AUC against chance.

    The AUC (:func:`hybridrank.metrics.ranking.auc`: unweighted, ties counted 1/2) is flagged as
    *not ranking* when it lies below 0.5 by more than two standard errors under chance,
    ``se = sqrt((n₁ + n₀ + 1) / (12 n₁ n₀))`` (the Mann-Whitney null).

    Returns:
        ``{"auc", "se_under_chance", "verdict"}`` (``auc`` None and no ``se_under_chance`` with a
        single class).

    >>> ranking_check(torch.arange(200.), (torch.arange(200) < 20).double())["verdict"]  # clicks at the bottom
    "the scores rank this split's clicks WORSE than chance: the model is not ranking"
    """
    ranking: dict[str, Any] = {"auc": None}
    not_ranking = False
    n1, n0 = float((y > 0).sum()), float((y <= 0).sum())
    if n1 > 0 and n0 > 0:
        ranking["auc"] = float(auc(z, y))
        se_auc = math.sqrt((n1 + n0 + 1) / (12 * n1 * n0))
        not_ranking = ranking["auc"] < 0.5 - 2 * se_auc
        ranking["se_under_chance"] = se_auc
    ranking["verdict"] = ("the scores rank this split's clicks WORSE than chance: the model is "
                          "not ranking" if not_ranking else "ranks better than chance"
                          if ranking["auc"] is not None else "undefined (one class)")
    return ranking


# --- rule 4: a level that moves with time --------------------------------------------------------
def stability_check(z: Tensor, y: Tensor, w: Tensor, folds: Folds, moved: Tensor | None = None
                    ) -> dict[str, Any]:
    """The level's stability over the folds' time blocks, read on the model's own logits.

    :func:`~hybridrank.serving.level_trend.level_stability` of ``z - moved`` (the gaps before a
    time-dependent shift the export already added), plus ``level_trend_applied``: whether
    ``moved`` varies, i.e. the export follows a level trend whose own test found the level moving.

    Args:
        z, y, w: ``[N]`` logits (after ``moved``), clicks, weights. folds: time-block folds.
        moved: ``[N]`` the shift already in ``z``, or None.
    """
    own = z if moved is None else z - moved
    stability = level_stability(own, y, w, folds.of_row, folds.k)
    stability["level_trend_applied"] = bool(moved is not None and moved.numel()
                                            and float(moved.max() - moved.min()) > 0)
    return stability


def stability_overrule(stability: dict[str, Any] | None) -> str | None:
    """Why a fitted map must not be carried into another period, or None.

    A level gap that Cochran's Q finds moving over the split's time blocks would be carried from
    one period into another; so would one the export's level trend found moving on more rows
    (``level_trend_applied``), whatever this split's Q says.

    >>> stability_overrule({"stable": True, "level_trend_applied": False}) is None
    True
    >>> stability_overrule({"stable": False, "p_value": 0.001, "level_trend_applied": False})
    "the model's miscalibration changes over time within the calibration split (Cochran's Q p = 0.001)"
    """
    if stability is None:
        return None
    if stability.get("stable") is False:
        return (f"the model's miscalibration changes over time within the calibration split "
                f"(Cochran's Q p = {stability['p_value']:.3g})")
    if stability["level_trend_applied"]:
        return ("the click level drifts over the log (the export follows a level trend): a map "
                "fitted on the calibration split's miscalibration would carry that period's gap "
                "into the scored one")
    return None


# --- rule 5: the calibration split must resemble the scored data ---------------------------------
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


def resemblance_overrule(resemblance: dict[str, Any] | None, on_mismatch: str) -> str | None:
    """Why the identity must be kept because the scored data look different, or None
    (``on_mismatch="warn"`` only reports the comparison).

    >>> resemblance_overrule({"verdict": "differs"}, "identity")
    'the calibration split does not resemble the scored data'
    >>> resemblance_overrule({"verdict": "differs"}, "warn") is None
    True
    """
    if resemblance is not None and resemblance["verdict"] == "differs" and on_mismatch == "identity":
        return "the calibration split does not resemble the scored data"
    return None


# --- the winner ---------------------------------------------------------------------------------
def refit(calibrator: type[Calibrator], z: Tensor, y: Tensor, w: Tensor
          ) -> tuple[Calibrator | None, str | None]:
    """The winner refitted on the whole split: ``(fitted, None)``, or ``(None, reason)`` when the
    whole split's fit would reverse the model's order (its folds agreed, the split does not)."""
    try:
        return calibrator().fit(z, y, w), None
    except NotRankingError as e:
        return None, f"refused on the whole split: {e}"
