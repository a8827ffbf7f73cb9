"""``calibrator=auto``: keep the model's own pCTR unless a calibrator clearly helps where it will
be used. :class:`AutoCalibrator` applies the rules of :mod:`hybridrank.serving.calibration.rules`
in order and keeps their evidence as its decision record."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from hybridrank.serving.calibration.calibrators import (
    CALIBRATORS,
    Calibrator,
    IdentityCalibrator,
    calibrator_from_dict,
    fit_inputs,
)
from hybridrank.serving.calibration.rules import (
    assign_folds,
    best_candidate,
    clicks_refusal,
    compare_score_distributions,
    cross_fit,
    held_out_logloss,
    log_loss_rows,
    ranking_check,
    refit,
    request_index,
    request_times,
    resemblance_overrule,
    significance,
    stability_check,
    stability_overrule,
)

__all__ = ["AutoCalibrator"]


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
       (:func:`~.rules.stability_check`, Cochran's Q at 5 %): a gap that moves with time would be
       carried from one period into another, so the identity is kept; so it is when the export
       already follows a level trend (``moved``), whose test found the level moving on more rows;
    5. with the scored data's scores (``reference``), checks that the calibration split resembles
       them (:func:`~.rules.compare_score_distributions`); when it does not, the identity is kept
       (``on_mismatch="identity"``) or the check is only reported (``"warn"``).

    Among the candidates that pass, the largest improvement wins; it is refitted on the whole
    split. Every decision and its evidence are in :meth:`to_dict` (export metadata) and
    :meth:`describe` (one console line). Each rule is a named function of
    :mod:`~hybridrank.serving.calibration.rules`; :meth:`fit` calls them in this order.

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
        z, y, w = fit_inputs(logits, clicks, weights)
        shift = None if moved is None else torch.as_tensor(moved).reshape(-1).double()
        if shift is not None and shift.numel() != z.numel():
            raise ValueError(f"moved has {shift.numel()} entries for {z.numel()} logits")
        request, n_requests = request_index(groups, z.numel())
        times = None if order is None else request_times(order, request, n_requests)
        folds = assign_folds(request, n_requests, self.folds, times=times, seed=self.seed)  # rule 1
        clicks_total = float((w * y).sum())
        base = log_loss_rows(torch.sigmoid(z), y)
        results: dict[str, dict] = {"none": {"cv_logloss": held_out_logloss(base, w, folds)}}
        ranking = ranking_check(z, y)                                                      # rule 3
        for name in self.candidates:
            cls = CALIBRATORS[name]
            refusal = clicks_refusal(clicks_total, cls.n_params, self.min_clicks_per_param)  # rule 2
            if refusal is not None:
                results[name] = {"refused": refusal}
                continue
            oof, failed = cross_fit(cls, z, y, w, folds)                          # rules 1 and 3
            if failed is not None:
                results[name] = failed
                continue
            results[name] = significance(base, log_loss_rows(oof, y), w, folds, self.z)  # rule 2
        best = best_candidate(results)
        stability = stability_check(z, y, w, folds, shift) if folds.forward else None       # rule 4
        best = _overrule(results, best, stability_overrule(stability))
        resemblance = None
        if reference is not None:                                                          # rule 5
            zs = z if serving is None else torch.as_tensor(serving).reshape(-1).double()
            resemblance = compare_score_distributions(
                zs, torch.as_tensor(reference).reshape(-1), calibration_requests=n_requests,
                scored_requests=int(reference_requests or n_requests))
        best = _overrule(results, best, resemblance_overrule(resemblance, self.on_mismatch))
        chosen: Calibrator = IdentityCalibrator()
        if best != "none":
            fitted, refused = refit(CALIBRATORS[best], z, y, w)
            if fitted is None:  # the whole split disagrees with its folds: keep the model
                results[best]["refused"] = refused
                best = "none"
            else:
                chosen = fitted
        self.chosen = chosen
        self.decision = {"chosen": best, "rule": f"improvement > {self.z:g} x se; {folds.scheme}; "
                         f">= {self.min_clicks_per_param:g} clicks per parameter",
                         "requests": n_requests, "clicks": clicks_total, "candidates": results,
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



def _overrule(results: dict[str, dict], best: str, reason: str | None) -> str:
    """Record ``reason`` against the current winner and fall back to the identity (a no-op when
    there is no reason or no winner); returns the winner left."""
    if best == "none" or reason is None:
        return best
    results[best]["overruled"] = reason
    return "none"


CALIBRATORS["auto"] = AutoCalibrator
