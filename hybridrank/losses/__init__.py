"""The loss catalogue: pure functions over padded lists, one pairwise builder, ``HybridLoss``.

Shapes and mask (written once here; every docstring of the package uses them):

- ``logits [G, L]``: one score per impression, ``G`` lists of at most ``L`` impressions
  (``[G, L, 2]`` for JRC: the no-click and click logits ``z_0, z_1``). Always logits, never
  probabilities.
- ``labels [G, L]``: float graded labels (clicks 0/1, LETOR 0..label_max).
- ``mask [G, L]``: bool, True where a real impression sits. Padding is never marked by a label
  value, and its content (logits, labels, weights, even NaN) never reaches a value or a gradient.
- ``weights [G, L]`` (optional): impression weights, e.g. 1 / keep-rate of down-sampled
  negatives. Each loss says how it uses them (BCE: weighted mean; pairs: ``w_i w_j``; softmax-type:
  target ``w_i y_i``).
- A list is a row ``g``; a *pair* of list g is ``(i, j)`` with ``mask_i & mask_j & y_i > y_j``
  (built only in :func:`valid_pairs`).

Every loss is ``name_loss(logits, labels, *, mask, weights=None, reduction="mean", **options)``
with named options only. Computation runs in at least float32 (half inputs are upcast; padding
fills are finite per dtype, never ``inf - inf``).

Reductions (so that mixing weights mean something):

- BCE: mean over real impressions (weighted: ``Σ w l / Σ w``).
- pairwise: mean over the pairs of a list, then mean over lists that have a pair.
- listwise and calibrated: mean over lists that have something to learn.
- ``reduction="none"`` returns the ``[G]`` per-list values (per-list sums for BCE), which sum to
  ``reduction="sum"``; ``"mean"`` divides that sum by the number of lists counted (BCE: by the
  impression weight).

Degenerate-case contract (tested for every loss): a list has *something to learn* when it holds
two real impressions with different labels (hence at least one positive). Lists without a
positive, with a single item, with all labels equal, or fully masked contribute exactly 0 and do
not enter the mean; a batch where no list has anything to learn gives 0 with finite (zero)
gradients, never NaN. Exceptions, each by design: BCE counts every real impression; calibrated
softmax (with ``anchor_label > 0``) counts every non-empty list, because the anchor gives even a
click-less list a target; JRC with its default ``reduction_scope="batch"`` (the paper's and
EasyRec's averaging) is a mean over every real impression like BCE, and with ``"list"`` counts
lists with both a click and a non-click.

The pCTR link is ``σ(logit)`` everywhere (:meth:`HybridLoss.click_logit`); every term that
claims calibration is calibrated for that link (calibrated softmax uses ``log σ(s)`` as its
scores by default, see :func:`calibrated_softmax_loss`).

Randomness: ListMLE orders tied labels at random at every call (torch's global generator, or a
``seed``); nothing else is random.

Bad input (shape/dtype mismatch, non-bool mask, non-float labels, wrong number of outputs, and in
``HybridLoss`` labels outside ``[0, label_max]`` or NaN) raises ``ValueError`` naming the argument.
"""

from hybridrank.losses.calibrated import calibrated_softmax_loss, jrc_loss, rcr_loss
from hybridrank.losses.hybrid import LOSSES, HybridLoss, click_logit
from hybridrank.losses.listwise import (
    approx_ndcg_loss,
    listmle_loss,
    neural_ndcg_loss,
    position_aware_listmle_loss,
    softmax_loss,
)
from hybridrank.losses.pairwise import (
    PAIR_WEIGHTS,
    hinge_kernel,
    hinge_loss,
    lambda_loss,
    lambdarank_loss,
    logistic_kernel,
    pairwise_loss,
    ranknet_loss,
    valid_pairs,
)
from hybridrank.losses.pointwise import bce_loss, pointwise_target

__all__ = [
    "HybridLoss",
    "LOSSES",
    "PAIR_WEIGHTS",
    "click_logit",
    "bce_loss",
    "pointwise_target",
    "pairwise_loss",
    "valid_pairs",
    "logistic_kernel",
    "hinge_kernel",
    "ranknet_loss",
    "hinge_loss",
    "lambdarank_loss",
    "lambda_loss",
    "softmax_loss",
    "listmle_loss",
    "position_aware_listmle_loss",
    "approx_ndcg_loss",
    "neural_ndcg_loss",
    "calibrated_softmax_loss",
    "rcr_loss",
    "jrc_loss",
]
