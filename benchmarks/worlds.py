"""The world harness: draw worlds of a family, split them, train variants, score against the truth.

A world (:mod:`hybridrank.data.worlds`) is a click log drawn from a seed with its truth. For each
seed :func:`run_family` writes the world to parquet, trains each variant on it as
``hybridrank-train data=clicklog`` would (the world's column map as overrides,
:func:`benchmarks.grid.run_grid`) and scores it against the truth, with the reference FM
(:func:`reference_row`, the same train / validation rows; ``--grid``: the best of :data:`GRID` by
validation log loss). Two ways to score a variant:

- ``--score export`` (the default): the test split (the CLI's: the latest 20 % of sessions)
  exported with ``calibrator=auto`` and ``none`` (:func:`evaluate_run`): what a user serves,
  level trend, position diagnosis and auction welfare included;
- ``--score model``: the kept checkpoint itself on the test split, no calibrator or trend
  (:func:`model_row`), with per-request sums of the excess so that two variants compare with a
  paired standard error (:func:`paired_table`), and LightGBM binary as the variant ``lgbm``.

:func:`world_table`, :func:`aggregate`, :func:`against_table` and :func:`paired_table` print the
rows (docs/BENCHMARKS.md, "Generalization", says how to read them). Seeds from 1000 on were not
used to choose any default::

    python -m benchmarks.worlds --worlds 24 --seed0 1000 [--variants default,tower,...] [--size small]
        [--family longtail] [--explore-shares 0,0.01,0.05,0.1] [--pin FIELD=VALUE ...] [--extra OVERRIDE ...]
    python -m benchmarks.worlds --family longtail --worlds 10 --seed0 8800 --score model --grid \
        --variant fm="model=fm;loss=bce" --variant lgbm= --out results/longtail.json
    python -m benchmarks.worlds --tables results/generalization.json [more.json ...]   # saved results
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import polars as pl

from benchmarks import common as C
from benchmarks.baselines import fit_lightgbm, fit_reference_fm
from benchmarks.common import RESULTS, logit, per_request_se, sigmoid, xent
from benchmarks.grid import compose_config, kept_model, load_splits, run_grid

#: name -> (hydra overrides, position as a feature?)
VARIANTS: dict[str, tuple[list[str], bool]] = {
    # position listed as a feature, so position_bias=auto stands aside (the tables' "default")
    "default": ([], True),
    # the default scorer and loss with the position tower (what position_bias=auto builds on a click log)
    "tower": (["position_bias=tower"], False),
    # nothing overridden, position not a feature: whatever the shipped click-log config does
    "shipped": ([], False),
    # position neither a feature nor a tower: a position-blind model, what a log read naively gives
    "blind": (["position_bias=none"], False),
    "fm": (["model=fm", "loss=bce"], True),
    "fm_tower": (["model=fm", "loss=bce", "position_bias=tower"], False),
}
for _m in ("mlp", "linear", "fm", "deepfm", "dcnv2", "list_aware"):
    for _l in ("bce", "bce_softmax", "jrc"):
        VARIANTS[f"{_m}+{_l}+feature"] = ([f"model={_m}", f"loss={_l}"], True)
        VARIANTS[f"{_m}+{_l}+tower"] = ([f"model={_m}", f"loss={_l}", "position_bias=tower"], False)
#: the variant name of LightGBM binary (``--score model`` only)
LGBM = "lgbm"
#: the reference FM's grid (``--grid``): per-example L2 on the rows used x Adam learning rate
GRID = [{"l2": l2, "lr": lr} for l2 in (1e-4, 1e-2, 0.1, 0.3, 1.0) for lr in (1e-3, 3e-3)]


#: the item of a ``--variant`` that lists the position among the numeric features (not an override)
POSITION_FEATURE = "position=feature"


def parse_variant(text: str) -> tuple[str, tuple[list[str], bool]]:
    """``NAME=OVERRIDE;OVERRIDE`` (``;`` separates overrides, which may hold commas): a variant of
    the shipped click-log run, position not a feature unless an item reads ``position=feature``.

    >>> parse_variant("mlp_f=loss=bce;position=feature")
    ('mlp_f', (['loss=bce'], True))
    """
    name, sep, rest = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--variant: expected NAME=OVERRIDE;OVERRIDE, got {text!r}")
    items = [o for o in rest.split(";") if o]
    return name, ([o for o in items if o != POSITION_FEATURE], POSITION_FEATURE in items)


def _clicklog_split() -> dict[str, Any]:
    """The split of the shipped conf/data/clicklog.yaml (what the runs use), for the reference FM's
    train / validation rows and the floors."""
    from importlib.resources import files

    from omegaconf import OmegaConf

    node = OmegaConf.load(str(files("hybridrank.conf") / "data" / "clicklog.yaml"))
    return dict(OmegaConf.to_container(node.source.split))


SPLIT = _clicklog_split()


@dataclass
class PreparedWorld:
    """A world written to ``dir`` (``log.parquet``, ``world.json``, ``test.parquet`` and
    ``test_slot1.parquet``: the test rows with every position set to 1), its split, its floors
    and ``offsets``, the test rows' request boundaries."""

    world: Any  # hybridrank.data.worlds.World
    dir: Path
    train: pl.DataFrame
    val: pl.DataFrame
    test: pl.DataFrame
    pcoc_drift: float
    pcoc_floor: float
    offsets: np.ndarray


def split_world(world) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """A world's (train, val, test) frames under :data:`SPLIT`, the runs' own split."""
    from hybridrank.data.readers import ColumnMap
    from hybridrank.data.splits import split_frame

    return split_frame(world.frame, ColumnMap(**world.columns), **SPLIT)


def prepare_world(seed: int, work: Path, *, size: str = "small", family: str = "base",
                  pins: Mapping[str, Any] | None = None) -> PreparedWorld:
    """Draw world ``seed`` (``pins``: :func:`~hybridrank.data.worlds.draw_world` keywords), write
    it under ``work/world<seed>`` and split it."""
    from hybridrank.data.worlds import draw_world, simulate_world

    world = simulate_world(draw_world(seed, size=size, family=family, **dict(pins or {})))
    wdir = work / f"world{seed}"
    wdir.mkdir(parents=True, exist_ok=True)
    world.write(wdir)
    train, val, test = split_world(world)
    pos = world.columns["position"]
    test.write_parquet(wdir / "test.parquet")
    test.with_columns(pl.lit(1, dtype=test[pos].dtype).alias(pos)).write_parquet(wdir / "test_slot1.parquet")
    return PreparedWorld(world, wdir, train, val, test, drift_floor(world, train, test), floor(world, train, test),
                         _offsets(test[world.columns["request"]]))


def world_drift(world, frame: pl.DataFrame) -> np.ndarray:
    """The world's true drift (logit) at each row's time."""
    from hybridrank.data.worlds import TIME_ORIGIN, drift_logit

    return drift_logit(world.spec, world.params["drift_sign"], world.params["drift_phase"],
                       frame[world.columns["time"]].to_numpy() - TIME_ORIGIN)


def drift_floor(world, train: pl.DataFrame, test: pl.DataFrame) -> float:
    """PCOC at slot 1 of a perfect model that cannot see time: the truth of the test rows with
    the world's drift replaced by its mean over the training rows (what a time-blind model
    learns): how much of a ``pcoc_ref`` miss the drift alone accounts for; 1 without drift."""
    z = test["true_logit"].to_numpy()
    blind = z - world_drift(world, test) + float(np.mean(world_drift(world, train)))
    return float(np.sum(1 / (1 + np.exp(-blind))) / np.sum(1 / (1 + np.exp(-z))))


def level_shift(z: np.ndarray, clicks: float, tol: float = 1e-12) -> float:
    """The shift ``c`` with ``sum sigmoid(z + c) = clicks`` (Newton; the sum rises with c)."""
    if not 0 < clicks < z.size:
        raise ValueError(f"need 0 < clicks < rows, got {clicks} clicks on {z.size} rows")
    c = math.log(clicks / float(np.sum(1 / (1 + np.exp(-z)))))
    for _ in range(100):
        p = 1 / (1 + np.exp(-(z + c)))
        step = (clicks - float(p.sum())) / float((p * (1 - p)).sum())
        c += step
        if abs(step) < tol:
            break
    return c


def floor(world, train: pl.DataFrame, test: pl.DataFrame) -> float:
    """PCOC at slot 1 of the best a time-blind model can do with these clicks: the truth, its
    drift replaced by the training mean, its level fitted to the training clicks (``Σ σ(logit +
    c) = clicks`` over the training rows at their logged slots). Drift and the clicks' sampling
    noise together; a world whose floor lies outside [0.97, 1.03] leaves little room for the
    [0.95, 1.05] band."""
    mean_drift = float(np.mean(world_drift(world, train)))
    z_train = logit(train["true_p"].to_numpy()) - world_drift(world, train) + mean_drift
    clicks = float((train[world.columns["label"]].to_numpy() > 0).sum())
    if not 0 < clicks < train.height:
        return math.nan
    c = level_shift(z_train, clicks)
    ref = test["true_p_ref"].to_numpy()
    return float(np.sum(sigmoid(logit(ref) - world_drift(world, test) + mean_drift + c)) / ref.sum())


def world_overrides(world, path: Path, position_feature: bool) -> list[str]:
    """``data=clicklog`` on ``path`` with the world's column map; position a numeric feature or
    not; marked exploration traffic mapped, as a user with such traffic would; missing numerics
    (a world's ``missing_share``) read under ``nan_policy=indicator``."""
    cols = dict(world.columns)
    cols["numeric"] = [c for c in cols["numeric"] if c != cols["position"]] + (
        [cols["position"]] if position_feature else [])
    cols["explore"] = world.extra.get("explore")
    out = ["data=clicklog", f"data.source.path={path}", "intervals.n_boot=0"]
    for key in ("request", "label", "session", "user", "time", "position", "item", "bid", "true_p", "explore"):
        out.append(f"data.source.columns.{key}={cols[key] if cols[key] is not None else 'null'}")
    out.append("data.source.columns.numeric=[" + ",".join(cols["numeric"]) + "]")
    out.append("data.source.columns.categorical=[" + ",".join(cols["categorical"]) + "]")
    if world.spec.missing_share:  # what the error on missing values names first
        out.append("data.source.nan_policy=indicator")
    return out


def train_variants(w: PreparedWorld, variants: Mapping[str, tuple[list[str], bool]], extra: Sequence[str] = (),
                   splits=None) -> dict[str, dict]:
    """Train each variant (``{name: (overrides, position as a feature?)}``) on the world's log
    (runs kept under ``w.dir/runs/<variant>``; ``splits``: the loaded data, shared by every run);
    ``{variant: run_grid row}``."""
    sets = {v: [*world_overrides(w.world, w.dir / "log.parquet", feature), *overrides, *extra]
            for v, (overrides, feature) in variants.items()}
    return {row["name"]: row for row in run_grid(sets, None, out_dir=w.dir / "runs", splits=splits)}


def export_scores(checkpoint: str, inp: Path, out: Path, calibrator: str, *extra: str) -> tuple[pl.DataFrame, dict]:
    """``hybridrank-export`` in-process: (scores frame, metadata)."""
    from hybridrank.cli.export import export
    from hybridrank.serving.export import read_scores

    export(compose_config([f"checkpoint={checkpoint}", f"input={inp}", f"output={out}", f"calibrator={calibrator}",
                           f"paths.output_dir={out.parent}", *extra], name="export"))
    return read_scores(out)


def _offsets(keys: pl.Series) -> np.ndarray:
    from hybridrank.metrics.request_stats import request_offsets

    return request_offsets(keys)[0].astype(np.int64)


def _ndcg10(score: np.ndarray, gain: np.ndarray, offsets: np.ndarray) -> float:
    """Mean NDCG@10 with linear gain over requests (ties averaged), via hybridrank.metrics."""
    import torch

    from hybridrank.lists import gather_lists, pad_index
    from hybridrank.metrics.ranking import ndcg

    index, mask = pad_index(torch.from_numpy(np.diff(offsets)))
    s = gather_lists(torch.from_numpy(score.astype(np.float64)), index, mask)
    g = gather_lists(torch.from_numpy(gain.astype(np.float64)), index, mask)
    return float(ndcg(s, g, mask=mask, k=10, gain="linear"))


def _welfare(frame: pl.DataFrame, score: np.ndarray, truth: np.ndarray, world, request: str, bid: str) -> float:
    from hybridrank.serving.auction import replay_auctions

    base = float(np.mean(truth))
    factors = [1.0] + [float(sigmoid(math.log(base / (1 - base)) + world.offsets[j]) / base) for j in (2, 3)]
    # the replay wants factors that never rise with the slot (GSP gives slot 1 the highest eCPM)
    factors = np.minimum.accumulate(np.minimum(np.array(factors), 1.0))
    res = replay_auctions(frame[bid].to_numpy(), score, request_ids=frame[request].to_numpy(),
                          true_pctr=truth, slots=3, slot_factors=factors, mechanism="gsp")
    return float(res.model.welfare.sum() / max(res.oracle.welfare.sum(), 1e-300))


def slot_ctr_error(z_model: np.ndarray, z_true: np.ndarray, offsets: np.ndarray, true_offsets: np.ndarray) -> float:
    """``slot_err``: the largest ``|log(PCOC_j / PCOC_1)|`` over slots ``j >= 2``, where ``PCOC_j``
    is ``sum sigmoid(z_model + offsets[j - 1]) / sum sigmoid(z_true + true_offsets[j - 1])`` over
    the candidates: how far the slot CTRs a model's offsets imply are from the truth's, its level
    aside. A model that cannot resolve all of an item's relevance is calibrated with offsets
    flatter than the truth's, so ``offset_err`` can be large where the slot CTRs are right."""
    pcoc = [float(sigmoid(z_model + b).sum() / sigmoid(z_true + t).sum()) for b, t in zip(offsets, true_offsets)]
    return float(max(abs(math.log(pc / pcoc[0])) for pc in pcoc[1:]))


def unseen_rows(seen: pl.Series, items: pl.Series, pctr: np.ndarray, p_ref: np.ndarray) -> dict[str, Any]:
    """``new_share``: the share of test impressions whose item id is not in ``seen`` (the training
    rows' items; compared as strings); ``pcoc_new`` / ``pcoc_seen``: PCOC at the reference slot on
    those and on the others (None where there are none)."""
    new = _unseen(seen, items)
    out: dict[str, Any] = {"new_share": float(new.mean())}
    for name, m in (("pcoc_new", new), ("pcoc_seen", ~new)):
        out[name] = float(pctr[m].sum() / p_ref[m].sum()) if m.any() else None
    return out


def _unseen(seen: pl.Series, values: pl.Series) -> np.ndarray:
    """Which of ``values`` are not among ``seen`` (compared as strings)."""
    return ~np.isin(values.cast(pl.String).to_numpy(), seen.cast(pl.String).unique().to_numpy())


def truth_figures(w: PreparedWorld, logged: np.ndarray, ref: np.ndarray, *, per_request: bool = False) -> dict:
    """Predictions on the test rows (``w.test``'s order) against the truth: ``excess`` (expected
    log loss at the logged slots minus the Bayes limit), ``ndcg_gap`` (the oracle's NDCG@10 minus
    that of ``ref``, the position-free pCTR, the true slot-1 CTR as linear gain), ``pcoc_ref`` and
    the world's floors (``pcoc_drift``: :func:`drift_floor`, ``pcoc_floor``: :func:`floor`).
    ``per_request`` adds the test log loss against the clicks (``ll``; ``base_ll``: the training
    click rate's), the excess on users unseen / seen in training and ``req_excess``, the excess
    summed per request (:func:`paired_table`)."""
    test, cols = w.test, w.world.columns
    p_true, p_ref = test["true_p"].to_numpy(), test["true_p_ref"].to_numpy()
    excess = xent(logged, p_true) - xent(p_true, p_true)
    out = {"excess": float(excess.mean()), "pcoc_ref": float(ref.sum() / p_ref.sum()),
           "ndcg_gap": _ndcg10(p_ref, p_ref, w.offsets) - _ndcg10(ref, p_ref, w.offsets),
           "pcoc_drift": w.pcoc_drift, "pcoc_floor": w.pcoc_floor}
    if per_request:
        y = (test[cols["label"]].to_numpy() > 0).astype(np.float64)
        base = float((w.train[cols["label"]].to_numpy() > 0).mean())
        new = _unseen(w.train[cols["user"]], test[cols["user"]])
        out.update(ll=float(xent(logged, y).mean()), base_ll=float(xent(np.full_like(y, base), y).mean()),
                   new_user_share=float(new.mean()), n_test=int(y.size),
                   req_excess=[round(float(v), 7) for v in np.add.reduceat(excess, w.offsets[:-1])],
                   **{k: float(excess[m].mean()) if m.any() else None
                      for k, m in (("excess_new", new), ("excess_seen", ~new))})
    return out


def _training(run: Mapping[str, Any]) -> dict[str, Any]:
    """How a run trained: ``epochs``, ``best_epoch``, ``stop`` (``criterion`` when early stopping
    acted) and its ``seconds``."""
    training = run["result"].get("training", {})
    stop = str(training.get("stopped_because"))
    return {"epochs": training.get("epochs"), "best_epoch": training.get("best_epoch"),
            "stop": "criterion" if stop.startswith("early stopping") else stop, "seconds": round(run["seconds"], 1)}


def evaluate_run(w: PreparedWorld, name: str, run: Mapping[str, Any], position_feature: bool) -> dict[str, Any]:
    """The ``--score export`` row of variant ``name`` (its :func:`train_variants` row ``run``):

    - :func:`truth_figures` of the export without calibrator; ``excess_auto`` with ``auto``;
    - ``pcoc_ref``: PCOC of the position-free pCTR (a tower's reference slot, a position-as-feature
      model at position 1, a blind model's one score) against ``true_p_ref``; ``pcoc_ref_none``
      without the calibrator, ``pcoc_static`` with ``level_trend.mode=off``, ``trend`` the level
      trend the export applied (logit per day);
    - ``offset_err``: the largest error of the tower's offsets of slots 2..min(10, longest list),
      ``offsets_covered``, ``slot_err`` (:func:`slot_ctr_error`), the diagnosis (``identified``,
      ``precise``, ``rank_corr``) and the serving level's interval (``level_lo``, ``level_hi``,
      ``level_covered``);
    - ``auto``: what ``calibrator=auto`` chose; ``d_ll`` ± ``d_ll_se``: test log loss with it minus
      without it, SE over requests; ``welfare``: a GSP replay's (3 slots, the true slot curve, the
      logged bids) as a share of the oracle allocation's; :func:`unseen_rows`; :func:`_training`.
    """
    world, test, cols = w.world, w.test, w.world.columns
    ckpt = run["result"]["best_checkpoint"]
    row: dict[str, Any] = {"variant": name, **_training(run)}
    scratch = w.dir / "scores"
    scratch.mkdir(exist_ok=True)
    tag = name.replace("+", "_")
    key = ["request_id", "item_id"]  # the export's names for the mapped request and item columns
    keys = test.select(pl.col(cols["request"]).alias("request_id"), pl.col(cols["item"]).alias("item_id"))

    def scores(inp: str, suffix: str, calibrator: str, *extra: str) -> tuple[pl.DataFrame, dict]:
        return export_scores(ckpt, w.dir / inp, scratch / f"{tag}_{suffix}.parquet", calibrator, *extra)

    def aligned(frame: pl.DataFrame, column: str = "pctr") -> np.ndarray:
        """An exported column in the order of the test rows."""
        out = keys.join(frame, on=key, how="left", maintain_order="left")[column]
        assert out.null_count() == 0, f"{name}: test rows without an exported {column}"
        return out.to_numpy()

    auto, meta = scores("test.parquet", "auto", "auto")
    none = scores("test.parquet", "none", "none")[0]
    p_ref, y = test["true_p_ref"].to_numpy(), test[cols["label"]].to_numpy()
    if position_feature:  # the position-free pCTR is the score at slot 1
        logged_auto, logged_none = aligned(auto), aligned(none)
        ref_auto = aligned(scores("test_slot1.parquet", "s1", "auto")[0])
        ref_none = aligned(scores("test_slot1.parquet", "s1n", "none")[0])
        ref_static = aligned(scores("test_slot1.parquet", "s1s", "auto", "level_trend.mode=off")[0])
    else:  # a tower's reference slot; a position-blind model scores every slot alike
        at = "pctr_at_position" if "pctr_at_position" in auto.columns else "pctr"
        logged_auto, logged_none = aligned(auto, at), aligned(none, at)
        ref_auto, ref_none = aligned(auto), aligned(none)
        ref_static = aligned(scores("test.parquet", "static", "auto", "level_trend.mode=off")[0])
        info = meta.get("position_bias") or {}
        learned = np.asarray(info.get("logit_offsets", []), dtype=np.float64)
        top = int(min(10, world.spec.max_len, learned.size))
        if top >= 2:
            row["offset_err"] = float(np.max(np.abs(learned[1:top] - world.offsets[2:top + 1])))
            row["offsets"] = [round(float(v), 3) for v in learned[:top]]
            row["true_offsets"] = [round(float(v), 3) for v in world.offsets[1:top + 1]]
            lo, hi = info.get("lower") or [], info.get("upper") or []
            inside = [lo[j] <= world.offsets[j + 1] <= hi[j] for j in range(1, top)
                      if j < len(lo) and lo[j] is not None and hi[j] is not None]
            row["offsets_covered"] = f"{sum(inside)}/{len(inside)}" if inside else None
            row["slot_err"] = slot_ctr_error(logit(ref_none), logit(p_ref), learned[:top],
                                             np.asarray(world.offsets[1:top + 1]))
        if info.get("serving_level"):  # its coverage is read below, against pcoc_ref_none
            row["level_lo"], row["level_hi"] = info["serving_level"]["interval_logit"]
        ident = info.get("identifiability") or {}
        row.update(identified=ident.get("identified"), precise=ident.get("precise"),
                   rank_corr=ident.get("rank_correlation"))
    row.update(truth_figures(w, logged_none, ref_none))
    row["excess_auto"] = truth_figures(w, logged_auto, ref_auto)["excess"]
    row["pcoc_ref"] = float(ref_auto.sum() / p_ref.sum())
    row["pcoc_ref_none"] = float(ref_none.sum() / p_ref.sum())
    row["pcoc_static"] = float(ref_static.sum() / p_ref.sum())
    if "level_lo" in row:
        # held when the true level, about the estimate's minus log PCOC at a small click rate,
        # lies in [estimate + lo, estimate + hi]
        row["level_covered"] = bool(-row["level_hi"] <= math.log(row["pcoc_ref_none"]) <= -row["level_lo"])
    trend = meta.get("level_trend") or {}
    row["trend"] = trend.get("slope_per_day") if trend.get("applied") else None
    row["trend_verdict"] = trend.get("verdict")
    ll_auto, ll_none = xent(logged_auto, y), xent(logged_none, y)
    row["d_ll"] = float(np.mean(ll_auto - ll_none))
    row["d_ll_se"] = per_request_se(ll_auto - ll_none, w.offsets)
    cal = meta.get("calibrator") or {}
    row["auto"] = (cal.get("chosen") or {}).get("name", cal.get("name"))
    row["welfare"] = _welfare(test, ref_auto, p_ref, world, cols["request"], cols["bid"])
    row.update(unseen_rows(w.train[cols["item"]], test[cols["item"]], ref_auto, p_ref))
    return row


def load_test_split(w: PreparedWorld, position_feature: bool = False,
                    data_overrides: Sequence[str] = ()) -> tuple[Any, np.ndarray]:
    """The world's ``Splits`` as the runs load them (the position a feature or not, then the
    runs' own ``data.`` overrides), and for each row of ``w.test`` its row in the loaded test
    split (matched on request and item)."""
    splits = load_splits([*world_overrides(w.world, w.dir / "log.parquet", position_feature), *data_overrides])
    return splits, test_order(w, splits.test)


def data_overrides(overrides: Sequence[str]) -> tuple[str, ...]:
    """The overrides of a variant that change how its data loads (``data.`` keys): variants
    share one loaded split only where these agree.

    >>> data_overrides(["loss=bce", "data.source.nan_policy=fill", "data.budget=512"])
    ('data.source.nan_policy=fill', 'data.budget=512')
    """
    return tuple(o for o in overrides if o.lstrip("+~").startswith("data."))


def test_order(w: PreparedWorld, test) -> np.ndarray:
    """For each row of ``w.test``, its row in ``test`` (``ListData`` of the same rows in storage
    order), matched on request and item."""
    cols = w.world.columns
    keys = pl.DataFrame({"r": np.repeat(np.asarray(test.request_key), test.lengths.numpy()),
                         "i": np.asarray(test.item_key)}).with_row_index("k")
    frame = w.test.select(pl.col(cols["request"]).alias("r"), pl.col(cols["item"]).alias("i"))
    keys = keys.with_columns(pl.col("r").cast(frame["r"].dtype), pl.col("i").cast(frame["i"].dtype))
    order = frame.join(keys, on=["r", "i"], how="left", maintain_order="left")["k"]
    if order.null_count() or len(order) != test.n_impressions:
        raise RuntimeError(f"world {w.world.spec.seed}: the loaded test split does not match the test rows")
    return order.to_numpy()


def model_row(w: PreparedWorld, name: str, run: Mapping[str, Any], splits, order: np.ndarray) -> dict[str, Any]:
    """The ``--score model`` row of variant ``name``: its kept checkpoint on the loaded test split
    (``splits``, ``order``: :func:`load_test_split`), at the logged slots (a tower's offsets
    added) and at the reference slot, no calibrator or level trend: :func:`truth_figures` with
    ``per_request``, ``val_ll`` and :func:`_training`."""
    result = run["result"]
    model = kept_model(result)
    tower = model.position_bias is not None
    if model.schema is not None and w.world.columns["position"] in model.schema.columns.numeric:
        # the position is a feature: its reference-slot score reads the test rows at slot 1, as
        # LightGBM's row does (test_slot1.parquet: the same rows, every position 1)
        logged = sigmoid(model.predict_split(splits.test, at_logged_position=tower)[0].double().numpy())[order]
        at1 = model.schema.read(pl.read_parquet(w.dir / "test_slot1.parquet"), "test at slot 1")
        ref = sigmoid(model.predict_split(at1)[0].double().numpy())[test_order(w, at1)]
    else:
        logged, ref = (sigmoid(z) for z in logits_on_test(model, splits, order))
    return {"variant": name, **truth_figures(w, logged, ref, per_request=True), "tower": tower,
            "val_ll": float(result["val"]["val/logloss"]), **_training(run)}


def logits_on_test(model, splits, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A model's logits of the loaded test split in the order of ``w.test``'s rows (``splits``,
    ``order``: :func:`load_test_split`): at the logged slots (a tower's offsets added) and at the
    reference slot (a tower's position-free score; a position-blind model's one score)."""
    tower = model.position_bias is not None
    logged = model.predict_split(splits.test, at_logged_position=tower)[0].double().numpy()[order]
    ref = model.predict_split(splits.test)[0].double().numpy()[order]
    return logged, ref


def lightgbm_row(w: PreparedWorld, splits, order: np.ndarray) -> dict[str, Any]:
    """LightGBM binary (:func:`benchmarks.baselines.fit_lightgbm`, early stopped on validation log
    loss) with ``log(position)`` a feature, scored at the logged slots and at slot 1: the
    ``--score model`` row of the variant ``lgbm``."""
    import torch

    def with_position(data, slot1: bool = False):
        log_pos = torch.zeros(data.n_impressions) if slot1 else data.position.float().log()
        return replace(data, num=torch.cat([data.num, log_pos[:, None]], dim=1))

    t0 = time.perf_counter()
    test, at1, val = with_position(splits.test), with_position(splits.test, True), with_position(splits.val)
    both = SimpleNamespace(**{k: torch.cat([getattr(test, k), getattr(at1, k)])
                              for k in ("num", "cat", "label", "lengths")})
    r = fit_lightgbm("binary", SimpleNamespace(train=with_position(splits.train), val=val, test=both))
    p, n = sigmoid(r["z_test"].double().numpy()), test.n_impressions
    y_val = (val.label.numpy() > 0).astype(np.float64)
    return {"variant": LGBM, **truth_figures(w, p[:n][order], p[n:][order], per_request=True),
            "best_iteration": r["best_iteration"], "seconds": round(time.perf_counter() - t0, 1),
            "val_ll": float(xent(sigmoid(r["z_val"].double().numpy()), y_val).mean())}


def reference_row(w: PreparedWorld, grid: Sequence[Mapping[str, float]] | None = None,
                  per_request: bool = False) -> dict[str, Any]:
    """The reference FM's row, trained on the world's train / validation rows; with ``grid``
    (settings of :func:`~benchmarks.baselines.fit_reference_fm`), the setting of lowest
    validation log loss (``setting``)."""
    cols = dict(w.world.columns)
    cols["numeric"] = [c for c in cols["numeric"] if c != cols["position"]]
    t0 = time.perf_counter()
    fits = [(dict(g), fit_reference_fm(w.train, w.val, cols, **g)) for g in (grid or [{}])]
    setting, predict = min(fits, key=lambda f: f[1].best_val_log_loss)
    p_ref, ref = w.test["true_p_ref"].to_numpy(), predict(w.test, slot=1)
    return {"variant": "reference FM", **truth_figures(w, predict(w.test, slot=None), ref, per_request=per_request),
            "setting": setting, "val_ll": float(predict.best_val_log_loss), "epochs": predict.epochs,
            **unseen_rows(w.train[cols["item"]], w.test[cols["item"]], ref, p_ref),
            "welfare": _welfare(w.test, ref, p_ref, w.world, cols["request"], cols["bid"]),
            "seconds": round(time.perf_counter() - t0, 1)}


def run_world(seed: int, variants: Mapping[str, tuple[list[str], bool]], work: Path, *, size: str = "small",
              family: str = "base", pins: Mapping[str, Any] | None = None, extra: Sequence[str] = (),
              reference: bool = True, score: str = "export", grid: Sequence[Mapping[str, float]] | None = None
              ) -> dict[str, Any]:
    """One world's result: ``{"seed", "describe", "spec", "impressions", "rows", "seconds"}``."""
    t0 = time.perf_counter()
    w = prepare_world(seed, work, size=size, family=family, pins=pins)
    trained = {v: spec for v, spec in variants.items() if v != LGBM}
    if score == "model":
        # the data loaded the runs' way: the position a feature or not, and each variant's own
        # data overrides (a run given loaded splits reads no data config of its own)
        keys = {v: (spec[1], data_overrides([*spec[0], *extra])) for v, spec in trained.items()}
        if LGBM in variants:
            keys[LGBM] = (False, data_overrides(extra))
        loaded, runs = {}, {}
        for key in dict.fromkeys(keys.values()):
            loaded[key] = load_test_split(w, *key)
            group = {v: spec for v, spec in trained.items() if keys[v] == key}
            runs.update(train_variants(w, group, extra, splits=loaded[key][0]))
        t_train = time.perf_counter() - t0
        rows = [lightgbm_row(w, *loaded[keys[v]]) if v == LGBM else model_row(w, v, runs[v], *loaded[keys[v]])
                for v in variants]
    else:
        runs = train_variants(w, trained, extra)
        t_train = time.perf_counter() - t0
        rows = [evaluate_run(w, v, runs[v], feature) for v, (_, feature) in variants.items()]
    if reference:
        rows.append(reference_row(w, grid, per_request=score == "model"))
    return {"seed": seed, "describe": w.world.spec.describe(), "spec": w.world.spec.to_dict(),
            "impressions": w.world.frame.height, "rows": rows,
            "seconds": {"train": round(t_train, 1), "total": round(time.perf_counter() - t0, 1)}}


def resolve_variants(variants: Sequence[str] | Mapping[str, tuple[list[str], bool]],
                     score: str = "export") -> dict[str, tuple[list[str], bool]]:
    """``{name: (overrides, position as a feature?)}`` of names of :data:`VARIANTS` (or of such a
    mapping), checked against ``score``: only ``model`` scores the LightGBM variant."""
    if not isinstance(variants, Mapping):
        unknown = [v for v in variants if v not in VARIANTS]
        if unknown:
            raise ValueError(f"unknown variants {unknown}; known: {sorted(VARIANTS)}")
        variants = {v: VARIANTS[v] for v in variants}
    if score != "model" and LGBM in variants:
        raise ValueError(f"the variant {LGBM} (LightGBM) is scored with score='model'")
    return dict(variants)


def run_family(family: str = "base", seeds: Sequence[int] = range(1000, 1024),
               variants: Sequence[str] | Mapping[str, tuple[list[str], bool]] = ("default", "tower", "fm", "fm_tower"),
               *, size: str = "small", pins: Mapping[str, Any] | None = None,
               explore_shares: Sequence[float] | None = None, extra: Sequence[str] = (), reference: bool = True,
               score: str = "export", grid: Sequence[Mapping[str, float]] | None = None, work: Path | None = None,
               progress: Callable[[dict], None] | None = None) -> list[dict[str, Any]]:
    """Draw one world of ``family`` per seed and score every variant on it (:func:`run_world`).

    Args:
        family: a world family (:data:`hybridrank.data.worlds.FAMILIES`: ``base``, ``longtail``).
        seeds: world seeds. variants: names of :data:`VARIANTS`, or ``{name: (overrides, position
            as a feature?)}`` (:func:`parse_variant`; ``lgbm``: LightGBM, with ``score="model"``).
        size: ``tiny`` or ``small``. pins: world fields fixed for every world (``draw_world``
            keywords, e.g. ``{"logging": "random"}``).
        explore_shares: the confounded-logging family: worlds sorted by a noisy relevance estimate,
            each with the next of these exploration shares, the exploration requests marked.
        extra: hydra overrides for every run. reference: add the reference FM's row (``grid``:
            its best setting of these). score: ``export`` (:func:`evaluate_run`) or ``model``
            (:func:`model_row`).
        work: keep the worlds and runs here (default: a temporary folder).
        progress: called with each world's result as it is done.

    Returns:
        One result per world (:func:`run_world`), for the tables.
    """
    variants = resolve_variants(variants, score)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, seed in enumerate(seeds):
            shares = {"logging": "sorted", "explore_share": explore_shares[i % len(explore_shares)],
                      "mark_explore": True} if explore_shares else {}
            results.append(run_world(seed, variants, Path(work or tmp), size=size, family=family,
                                     pins={**(pins or {}), **shares}, extra=extra, reference=reference,
                                     score=score, grid=grid))
            if progress is not None:
                progress(results[-1])
    return results


#: slot CTRs "within 0.1": ``slot_err <= 0.1`` (a CTR ratio off by about 10 %), the scale of the
#: offsets' 0.1-logit criterion, so that the two columns compare
SLOT_TOL = 0.1
COLS = ("excess", "ndcg_gap", "pcoc_ref", "pcoc_ref_none", "pcoc_static", "trend", "pcoc_drift", "pcoc_floor",
        "offset_err", "slot_err", "offsets_covered", "identified", "precise", "auto", "d_ll", "welfare",
        "new_share", "pcoc_new", "pcoc_seen", "epochs", "stop")


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def world_table(results: Sequence[Mapping[str, Any]]) -> str:
    """One line per world and variant, the columns :data:`COLS`."""
    lines = ["| world | variant | " + " | ".join(COLS) + " |", "|---" * (len(COLS) + 2) + "|"]
    for r in results:
        for row in r["rows"]:
            cells = [_fmt(row.get(c)) for c in COLS]
            if row.get("d_ll") is not None and row.get("d_ll_se") is not None:
                cells[COLS.index("d_ll")] = f"{row['d_ll']:+.5f} ± {row['d_ll_se']:.5f}"
            lines.append(f"| {r['seed']} | {row['variant']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _by_variant(results: Sequence[Mapping[str, Any]]) -> dict[str, list[dict]]:
    """``{variant: [row, ...]}``, each row with its world's result under ``_world``."""
    by: dict[str, list[dict]] = {}
    for r in results:
        for row in r["rows"]:
            by.setdefault(row["variant"], []).append({**row, "_world": r})
    return by


def aggregate(results: Sequence[Mapping[str, Any]]) -> str:
    """Per variant: medians, and the worlds meeting each target (identifiable worlds: random
    order, or exploration marked in a column the model is given)."""
    lines = ["| variant | worlds | median excess | median NDCG gap | PCOC@ref in [0.95, 1.05] | "
             "... where the drift floor is in [0.97, 1.03] | ... where the floor (drift and clicks) is | "
             "offsets within 0.1 | offsets within 0.2 | slot CTRs within 0.1 (slot_err) | "
             "level interval holds the truth | diagnosis fired (unidentifiable / identifiable) | "
             "auto > 1 SE worse | median welfare | stopped on criterion |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def share(pred, pool) -> str:
        pool = [x for x in pool if pred(x) is not None]
        return f"{sum(1 for x in pool if pred(x))}/{len(pool)}" if pool else "-"

    def median(key: str, rows) -> str:
        values = [x[key] for x in rows if x.get(key) is not None]
        return _fmt(float(np.median(values))) if values else "-"

    def within(key: str, tol: float):
        return lambda x: None if x.get(key) is None else x[key] <= tol

    def fired(x):
        return None if x.get("identified") is None else not x["identified"]

    def in_band(x):
        return None if x.get("pcoc_ref") is None else 0.95 <= x["pcoc_ref"] <= 1.05

    for name, rows in _by_variant(results).items():
        spec = [x["_world"]["spec"] for x in rows]
        identifiable = [x for x, s in zip(rows, spec)
                        if s["explore_share"] == 1.0 or (s["explore_share"] > 0 and s["mark_explore"])]
        unidentifiable = [x for x in rows if x not in identifiable]
        steady = [x for x in identifiable if x.get("pcoc_drift") is not None and 0.97 <= x["pcoc_drift"] <= 1.03]
        reachable = [x for x in identifiable if x.get("pcoc_floor") is not None and 0.97 <= x["pcoc_floor"] <= 1.03]
        lines.append(
            f"| {name} | {len(rows)} | {median('excess', rows)} | {median('ndcg_gap', rows)} | "
            f"{share(in_band, identifiable)} | {share(in_band, steady)} | {share(in_band, reachable)} | "
            f"{share(within('offset_err', 0.1), identifiable)} | {share(within('offset_err', 0.2), identifiable)} | "
            f"{share(within('slot_err', SLOT_TOL), identifiable)} | "
            f"{share(lambda x: x.get('level_covered'), identifiable)} | "
            f"{share(fired, unidentifiable)} / {share(fired, identifiable)} | "
            f"{share(lambda x: None if x.get('d_ll') is None else x['d_ll'] > x['d_ll_se'], rows)} | "
            f"{median('welfare', rows)} | "
            f"{share(lambda x: None if x.get('stop') is None else x['stop'] == 'criterion', rows)} |")
    return "\n".join(lines)


def _pairs(results: Sequence[Mapping[str, Any]], variant: str, base: str) -> list[tuple[dict, dict]]:
    """``(row of variant, row of base)`` on each world where both ran."""
    out = []
    for r in results:
        rows = {row["variant"]: row for row in r["rows"]}
        if variant in rows and base in rows:
            out.append((rows[variant], rows[base]))
    return out


def against_table(results: Sequence[Mapping[str, Any]], against: str = "reference FM") -> str:
    """Each variant against the row ``against`` on the same worlds: excess within 1.02x of its,
    NDCG@10 gap within 0.005 of its, and the ratio of the excesses."""
    lines = [f"| variant | excess within 1.02× of `{against}` | NDCG@10 within 0.005 | "
             "excess ratio, median (range) |", "|---|---|---|---|"]
    for name in _by_variant(results):
        pairs = _pairs(results, name, against)
        if name == against or not pairs:
            continue
        ratios = [a["excess"] / b["excess"] if b["excess"] > 0 else math.inf for a, b in pairs]
        near = sum(a["ndcg_gap"] - b["ndcg_gap"] <= 0.005 for a, b in pairs)
        lines.append(f"| {name} | {sum(x <= 1.02 for x in ratios)}/{len(pairs)} | {near}/{len(pairs)} | "
                     f"{np.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |")
    return "\n".join(lines)


def baseline_of(name: str, names: Iterable[str]) -> str | None:
    """The variant ``name`` is compared with: the longest other variant ``BASE`` with ``name`` =
    ``BASE_suffix``, or None.

    >>> baseline_of("fm_old", ["fm", "fm_old"]), baseline_of("list_aware_old", ["list_aware", "list_aware_old"])
    ('fm', 'list_aware')
    >>> baseline_of("list_aware", ["list_aware", "mlp"]) is None
    True
    """
    bases = [b for b in names if b != name and name.startswith(b + "_")]
    return max(bases, key=len) if bases else None


def paired_table(results: Sequence[Mapping[str, Any]]) -> str:
    """Each variant ``BASE_suffix`` against ``BASE`` (``fm_old`` against ``fm``, ``list_aware_old``
    against ``list_aware``: :func:`baseline_of`) on the worlds both ran with ``--score model``: the
    mean and range of the excess ratio, the worlds where it is worse / better by two standard
    errors of the paired difference over requests, the mean difference of the NDCG@10 gaps and
    the epochs."""
    lines = ["| variant | worlds | excess ratio to baseline: mean (min-max) | worse / better by 2 SE | "
             "NDCG@10 gap minus baseline's: mean | epochs: mean (baseline's) |", "|---|---|---|---|---|---|"]
    names = _by_variant(results)
    for name in names:
        base = baseline_of(name, names)
        pairs = [(a, b) for a, b in (_pairs(results, name, base) if base else [])
                 if "req_excess" in a and "req_excess" in b]
        if not pairs:
            continue
        ratios = [a["excess"] / b["excess"] for a, b in pairs]
        worse = better = 0
        for a, b in pairs:
            d, n = np.asarray(a["req_excess"]) - np.asarray(b["req_excess"]), a["n_test"]
            se = float(np.std(d, ddof=1) * math.sqrt(d.size) / n)
            worse += d.sum() / n > 2 * se
            better += d.sum() / n < -2 * se
        epochs = [np.nanmean([float(x.get("epochs") or np.nan) for x in side]) for side in zip(*pairs)]
        lines.append(f"| {name} | {len(pairs)} | {np.mean(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) | "
                     f"{worse} / {better} | {np.mean([a['ndcg_gap'] - b['ndcg_gap'] for a, b in pairs]):+.4f} | "
                     f"{epochs[0]:.1f} ({epochs[1]:.1f}) |")
    return "\n".join(lines)


def tables(results: Sequence[Mapping[str, Any]], against: str = "reference FM") -> str:
    """The aggregate table, then the comparisons the rows allow (:func:`against_table` where the
    ``against`` row ran; :func:`paired_table` where there are ``--score model`` pairs)."""
    out = "## Aggregate\n\n" + aggregate(results)
    if any(row["variant"] == against for r in results for row in r["rows"]):
        out += f"\n\n## Against {against}\n\n" + against_table(results, against)
    paired = paired_table(results)
    if paired.count("\n") > 1:
        out += "\n\n## Paired over test requests\n\n" + paired
    return out


def _variants(text: str) -> list[str]:
    names = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown variants {unknown}; known: {sorted(VARIANTS)}")
    return names


def parser() -> argparse.ArgumentParser:
    from hybridrank.data.worlds import FAMILIES

    ap = C.parser("benchmarks.worlds", __doc__)
    ap.add_argument("--worlds", type=int, default=24)
    ap.add_argument("--seed0", type=int, default=1000)
    ap.add_argument("--size", default="small", choices=("tiny", "small"))
    ap.add_argument("--family", default="base", choices=FAMILIES,
                    help="world family: base, or longtail (heavy-tailed user activity, users unseen before "
                         "the test period, dense item side features, user x item latent interactions)")
    ap.add_argument("--pin", nargs="*", default=[], metavar="FIELD=VALUE", type=C.parse_pin,
                    help="pin world fields (draw_world keywords), e.g. logging=random n_impressions=400000")
    ap.add_argument("--explore-shares", type=lambda t: [float(x) for x in t.split(",")], default=None,
                    help="worlds sorted by a noisy relevance estimate, each with the next of these shares "
                         "of exploration requests (e.g. 0.05,0.1), marked in a column")
    ap.add_argument("--variants", type=_variants, default=None,
                    help="variants of VARIANTS, comma-separated (default: default,tower,fm,fm_tower, or none "
                         "when --variant is given)")
    ap.add_argument("--variant", type=parse_variant, action="append", default=[], metavar="NAME=OVERRIDE;...",
                    help="a variant of the shipped click-log run with these overrides (repeatable); "
                         f"an item {POSITION_FEATURE} lists the position among the numeric features "
                         f"(no tower); {LGBM}= is LightGBM binary (--score model)")
    ap.add_argument("--score", choices=("export", "model"), default="export",
                    help="export: the exported pCTR (calibrator, level trend, welfare); model: the kept "
                         "checkpoint alone, with per-request sums for paired comparisons")
    ap.add_argument("--no-reference", action="store_true", help="skip the reference FM")
    ap.add_argument("--grid", action="store_true", help="the reference FM's best setting of GRID by validation "
                                                        "log loss (10 fits per world)")
    ap.add_argument("--extra", nargs="*", default=[], help="hydra overrides for every run")
    ap.add_argument("--keep", type=Path, default=None, help="keep the worlds and runs here")
    ap.add_argument("--out", type=Path, default=RESULTS / "generalization.json",
                    help="the results (JSON), rewritten after each world")
    ap.add_argument("--tables", nargs="+", type=Path, default=None, metavar="JSON",
                    help="print the tables of saved --out files (merged), run nothing")
    ap.add_argument("--against", default="reference FM", help="the row the other variants are compared with")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    a = parser().parse_args(argv)
    if a.tables:
        results = [r for path in a.tables for r in json.loads(path.read_text())["results"]]
        print(world_table(results) + "\n\n" + tables(results, a.against))
        return 0
    names = a.variants or ([] if a.variant else ["default", "tower", "fm", "fm_tower"])
    try:
        variants = resolve_variants({**{v: VARIANTS[v] for v in names}, **dict(a.variant)}, a.score)
    except ValueError as e:
        raise SystemExit(f"benchmarks.worlds: {e}") from None
    C.quiet()
    t_all, results = time.perf_counter(), []

    def progress(result: dict) -> None:
        results.append(result)
        print(f"# {result['describe']} ({result['seconds']['total']:.0f} s)", flush=True)
        print(world_table([result]), flush=True)
        C.write_json(a.out, {"results": results, "variants": {k: v[0] for k, v in variants.items()},
                             "seconds": time.perf_counter() - t_all})

    run_family(a.family, range(a.seed0, a.seed0 + a.worlds), variants, size=a.size,
               pins=dict(a.pin), extra=a.extra, reference=not a.no_reference,
               explore_shares=a.explore_shares, score=a.score, grid=GRID if a.grid else None, work=a.keep,
               progress=progress)
    print("\n" + tables(results, a.against))
    print(f"\n{len(results)} worlds in {(time.perf_counter() - t_all) / 60:.1f} min; {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
