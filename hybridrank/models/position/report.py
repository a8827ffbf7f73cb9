"""What a position tower reports: its offsets with intervals, the serving level's interval, and
whether the position effect is identified, in plain words (the train report and the export
metadata; JSON-safe dicts).

Identification is a property of the design; precision is reported beside it: an identified effect
is IMPRECISE when an offset's interval is wide, and UNRELIABLE when the traffic the offsets were
fitted on holds fewer than :data:`MIN_IDENTIFYING_CLICKS` clicks in the reference slot (its
intervals cannot be trusted either). An effect that is not identified (or whose identification
could not be measured) gets no precision verdict (``precise: null``): its intervals are narrow
about whatever the offsets absorbed, which is no evidence about the position effect.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from hybridrank.models.position.diagnosis import RankDiagnosis, Traffic, rank_evidence
from hybridrank.models.position.estimators import SlotSums, percentile_interval

#: what these functions read: a :class:`~hybridrank.models.position.tower.PositionBias` (typed as
#: its base class: the tower imports this module, and an import back would close a circle)
PositionBias = torch.nn.Module

__all__ = ["MIN_IDENTIFYING_CLICKS", "PRECISE_HALF_WIDTH", "PRECISION_SLOTS", "identifiability",
           "level_interval", "report"]

#: half-width (logit) of the widest offset interval among slots 2..PRECISION_SLOTS above which an
#: identified position effect is reported as imprecise (0.25 logit: the pCTR at some slot is
#: uncertain by about x1.28 either way)
PRECISE_HALF_WIDTH = 0.25
PRECISION_SLOTS = 10
#: fewest clicks of the traffic the offsets were fitted on (all of it, exploration requests, or
#: propensity-weighted) in the reference slot for the offsets and their intervals to count as
#: reliable: below it a ratio of click counts is noise, and a monotone projection of it can make
#: its bootstrap intervals look narrow (measured: 1 % exploration, ~5 clicks: every offset
#: projected to 0, intervals [0, 0]). It is a floor on precision, not a test of identification:
#: a random-order log with few clicks identifies the effect and estimates it poorly, and reads
#: the same whether its requests are marked as exploration or not
MIN_IDENTIFYING_CLICKS = 20

_HOW = {Traffic.EXPLORATION: "exploration requests (shown in random order)",
        Traffic.PROPENSITY: "inverse-propensity weighted impressions"}
_WHAT = {Traffic.ALL: "the log", Traffic.EXPLORATION: "the exploration requests",
         Traffic.PROPENSITY: "the propensity-weighted traffic"}


def identifiability(tower: PositionBias) -> dict[str, Any]:
    """Is the position effect identified by this data? The evidence of the last update and a
    verdict in plain words.

    ``identified``: True with identifying traffic (exploration or propensities) or a logged slot
    independent of the model's relevance; False when the slot follows the relevance and nothing
    randomises it; None when nothing could be measured. ``too_few_clicks``: identified, but the
    fitted traffic holds fewer than :data:`MIN_IDENTIFYING_CLICKS` clicks in the reference slot.
    """
    d = RankDiagnosis.read(tower.last_diagnosis)
    ev = rank_evidence(d)
    corr = ev.correlation
    share = d.exploration / d.requests if d.requests else 0.0
    mode = Traffic(int(tower.fitted_on))
    fit = SlotSums.of(tower.last_fit_sums)
    ref_clicks = float(fit.clicks[tower.reference_position - 1])
    few = ref_clicks < MIN_IDENTIFYING_CLICKS
    if mode is not Traffic.ALL:
        verdict, identified = f"identified by {_HOW[mode]}", True
        if not few:
            verdict += "; intervals reflect how much of it there is"
    elif corr is None:
        verdict, identified = "unknown: no request with three or more impressions to measure", None
    elif ev.sorted_policy:
        verdict, identified = (
            f"NOT identified: the logged slot is related to the model's own relevance estimate "
            f"(mean within-request rank correlation {corr:.2f}) and no exploration traffic or "
            f"propensities are mapped; the offsets absorb whatever relevance the features do "
            f"not explain, and the position-free pCTR rests on the ASSUMPTION that the features "
            f"explain the logging order (map an exploration column or propensities)"), False
        if tower.dropout:
            verdict += (f"; the relevance model trained with {tower.dropout:.0%} of the "
                        f"offsets replaced by their mean (position_bias.dropout), so as not to "
                        f"compensate for them")
    else:
        verdict, identified = (f"identified: the logged slot is independent of the model's "
                               f"relevance (mean within-request rank correlation {corr:.2f})"), True
    few = bool(identified) and few
    if few:
        verdict += (
            f"; but UNRELIABLE: {_WHAT[mode]} hold {ref_clicks:.0f} click(s) in the reference slot "
            f"({float(fit.clicks.sum()):.0f} in all; fewer than {MIN_IDENTIFYING_CLICKS}): "
            f"offsets from so few clicks are mostly noise and their intervals are not to be "
            f"trusted; the position-free pCTR rests on them (more randomised traffic, or a "
            f"longer log)")
    return {"identified": identified, "verdict": verdict, "estimated_from": mode.label,
            "too_few_clicks": few,
            "identifying_clicks": float(fit.clicks.sum()),
            "identifying_clicks_reference": ref_clicks,
            "rank_correlation": corr, "rank_correlation_se": ev.se, "requests_measured": ev.requests,
            "exploration_share": share}


def level_interval(tower: PositionBias) -> dict[str, Any] | None:
    """The serving level's percentile interval, or None (no bootstrap, or none yet).

    The position-free pCTR is the reference slot's click probability: its level (the relevance
    intercept) rests on the clicks through the same rule as the offsets (the pooled
    reference-slot logit, or every click given the offsets with identifying traffic). Each
    bootstrap replicate's level by that rule, minus the estimate's, gives ``[lo, hi]`` (logit;
    pooled, the hull with the reference slot's own clicks' interval, as the offsets' intervals):
    the true level lies in ``[estimate + lo, estimate + hi]`` at ``1 - alpha``, so at small click
    rates the true top-slot CTR is within about ``x[e^lo, e^hi]`` of the pCTR's. It measures the
    clicks' sampling error given the relevance model, not the model's own error, nor drift after
    the log. Given the true relevance (70 fresh random-order worlds; docs/BENCHMARKS.md, "What the
    clicks allow") it held the truth in 65 of 70 (small and 400k impressions; 61 of 70 with
    exploration marked).
    """
    bounds = torch.stack([tower.level_lower, tower.level_upper])
    if not tower.n_boot or int(tower.updates) == 0 or bool(torch.isnan(bounds).any()):
        return None
    lo, hi = (float(v) for v in bounds)
    return {"interval_logit": [lo, hi], "ctr_factor": [math.exp(lo), math.exp(hi)],
            "alpha": tower.alpha,
            "method": ("percentiles of the bootstrap replicates' serving level minus the estimate's"
                       + ("; the hull with the reference slot's own clicks" if tower.pool else ""))}


def _offset_bounds(tower: PositionBias) -> tuple[list[float | None], list[float | None]]:
    """The offsets' interval of the last update (the replicates' percentiles when a state dict
    without it was loaded); None per slot without a bootstrap."""
    if not tower.n_boot or int(tower.updates) == 0:
        return [None] * tower.max_position, [None] * tower.max_position
    q = torch.stack([tower.offset_lower, tower.offset_upper])
    if bool(torch.isnan(q).all()):
        q = percentile_interval(tower.boot_offset, tower.alpha)
    return q[0].tolist(), q[1].tolist()


def report(tower: PositionBias) -> dict[str, Any]:
    """Offsets with bootstrap intervals, the data behind each and the identifiability verdict
    (JSON-safe), for the train report and the export metadata."""
    seen = tower.estimated.tolist()
    lo, hi = _offset_bounds(tower)
    ref = tower.reference_position - 1
    ident = identifiability(tower)
    widths = [(h - l) / 2 for j, (s, l, h) in enumerate(zip(seen, lo, hi))
              if s and j != ref and j < PRECISION_SLOTS and l is not None and h is not None]
    ident["widest_half_width"] = max(widths) if widths else None
    ident["precise"] = None if not widths else max(widths) <= PRECISE_HALF_WIDTH
    if ident["identified"] is not True:
        # narrow intervals around a confounded (or unmeasured) quantity are not precision:
        # they measure the clicks' noise about what the offsets absorbed, not the position
        # effect, so no verdict is given (``widest_half_width`` still says how wide they are)
        ident["precise"] = None
    elif ident["too_few_clicks"]:  # its verdict says so already; narrow intervals prove nothing
        ident["precise"] = False
    elif ident["precise"] is False:
        hw = max(widths)
        ident["verdict"] += (
            f"; but IMPRECISE: the widest {100 * (1 - tower.alpha):.0f} % interval of slots "
            f"2-{PRECISION_SLOTS} spans "
            f"+-{hw:.2f} logit (the pCTR at that slot uncertain by about x{math.exp(hw):.2f} "
            f"either way); more identifying traffic (randomised requests, clicks) narrows it")
    last, fit = SlotSums.of(tower.last_sums), SlotSums.of(tower.last_fit_sums)
    last_change = float(tower.last_change)
    return {
        "reference_position": tower.reference_position, "max_position": tower.max_position,
        "tail": tower.tail, "monotone": tower.monotone, "pool": tower.pool, "refit": tower.refit,
        "dropout": tower.dropout, "dropout_when": tower.dropout_when,
        # whether the rule drops offsets as of the last update (with not_identified: whether
        # that update read the effect as NOT identified)
        "dropout_active": bool(tower.dropout) and (tower.dropout_when == "always"
                                                   or tower.confounded()),
        "estimator": ("per-slot exact update each epoch (regression-EM step)"
                      + (", pooled toward a curve in log(slot) (empirical Bayes)" if tower.pool else "")),
        "logit_offsets": tower.offsets(),
        "lower": [None if not s or j == ref else v for j, (s, v) in enumerate(zip(seen, lo))],
        "upper": [None if not s or j == ref else v for j, (s, v) in enumerate(zip(seen, hi))],
        "estimated": seen,
        "impressions": last.count.tolist(), "clicks": last.clicks.tolist(),
        # the traffic the offsets were fitted on (all, exploration, or propensity-weighted)
        "fit_impressions": fit.count.tolist(), "fit_clicks": fit.clicks.tolist(),
        "tail_impressions": float(tower.last_tail),
        "updates": int(tower.updates),
        "last_change": None if math.isnan(last_change) else last_change,
        "identifiability": ident,
        "serving_level": level_interval(tower),
        "interval": {"n_boot": tower.n_boot, "alpha": tower.alpha,
                     "method": ("online Poisson bootstrap over requests, given the relevance model"
                                + ("; the hull of the pooled and the per-slot percentile intervals"
                                   if tower.pool else ""))},
    }
