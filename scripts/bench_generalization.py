"""Defaults judged on many randomly built click logs ("worlds"), not on one simulator.

Every world (:mod:`hybridrank.data.worlds`) is drawn from a seed: its column names, feature kinds,
click rate (0.3-15 %), list lengths (2-200), true position curve, logging policy (random order or
sorted by a noisy relevance estimate with some exploration), drift over time and the structure of
its true scorer. Each world's log is written to parquet and trained on **through the command
line** (``hybridrank-train data=clicklog`` with the world's column map, one ``-m`` multirun per
world over the variants), with the shipped defaults unless a variant says otherwise. The test
split is the one the CLI makes (by time: the latest 20 % of sessions), scored by the export
(``hybridrank.cli.export.export``, as ``hybridrank-export input=...``) with ``calibrator=auto`` and
``calibrator=none``.

Per world and variant it reports, against the world's truth:

- ``excess``: expected test log loss at the logged slots minus the Bayes limit (cross-entropy of
  the predictions against ``true_p`` minus its entropy: noise-free given the predictions);
- ``ndcg_gap``: NDCG@10 of the oracle minus the model's, with the true slot-1 CTR as linear gain
  (ranking candidates by what they are worth in the top slot; the position-free score);
- ``pcoc_ref``: PCOC of the position-free pCTR (the export's ``pctr``: the tower's reference
  slot, a position-as-feature model scored with its position set to 1, or the ``blind`` variant's
  one score, position neither a feature nor a tower) against ``true_p_ref``;
  ``pcoc_ref_none``: the same without the calibrator; ``pcoc_drift``: the floor drift sets on
  it, the PCOC of a perfect model that cannot see time (the test rows' truth with the world's
  drift replaced by its mean over the training rows; 1 without drift); ``pcoc_floor``: drift and
  the clicks together, the same perfect time-blind model with its level fitted to the training
  clicks (the best a model fitted to this log can expect without following the level's trend);
  ``pcoc_static``: ``pcoc_ref`` exported with ``level_trend.mode=off``, and ``trend``: the
  level trend the export applied (logit per day; empty when its tests did not pass);
- ``offset_err``: the largest error of the tower's offsets for slots 2..min(10, longest list);
- ``slot_err``: the same offsets as an auction uses them, on this model's scores: the largest
  ``|log(PCOC_j / PCOC_1)|`` over those slots, where ``PCOC_j`` compares ``sigmoid(logit(pctr) +
  offset_j)`` (no calibrator) with the true CTR in slot ``j`` over the test candidates. A model
  that cannot resolve all of an item's relevance is calibrated with offsets flatter than the
  truth's (averaging over what it cannot see flattens a logit shift), so ``offset_err`` can be
  large where the slot CTRs it implies are right;
- ``auto``: what ``calibrator=auto`` chose, and ``d_ll``: test log loss (clicks) with it minus
  without it, with its standard error over requests (``d_ll_se``);
- ``welfare``: welfare of a GSP replay (3 slots, the world's true slot curve as slot factors, bids
  from the log) as a share of the oracle allocation's;
- ``epochs`` and ``stop``: how many epochs ran and why training stopped.

Beside them a plainly specified factorization machine (``scripts/reference_fm.py``: L2 on the rows
a batch uses, Adam 1e-3, early stopping) trained on the same train / validation rows.

    python scripts/bench_generalization.py --worlds 24 --seed0 1000 [--variants default,tower,...]
        [--size small] [--family longtail] [--explore-shares 0,0.01,0.05,0.1] [--pin FIELD=VALUE ...]
    python scripts/bench_generalization.py --tables results/generalization.json [more.json ...]

The results go to ``results/generalization.json`` (``--out``); ``--tables`` prints the world and
aggregate tables of saved results (docs/BENCHMARKS.md, "Generalization", quotes them). Seeds
from 1000 on were not used to choose any default (tuning used seeds below 100).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from reference_fm import fit_reference_fm  # noqa: E402

from hybridrank.data.readers import ColumnMap  # noqa: E402
from hybridrank.data.sources import split_frame  # noqa: E402
from hybridrank.data.worlds import (  # noqa: E402
    FAMILIES,
    TIME_ORIGIN,
    TRUTH_COLUMNS,
    World,
    draw_world,
    drift_logit,
    simulate_world,
)

#: name -> (hydra overrides, position as a feature?)
VARIANTS: dict[str, tuple[list[str], bool]] = {
    # position listed as a feature, so position_bias=auto stands aside: the click-log default
    # until 2026-11-27; the tables keep its name
    "default": ([], True),
    # default scorer and loss + tower: what position_bias=auto builds on a click log since then
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

def _clicklog_split() -> dict[str, Any]:
    """The split of the shipped conf/data/clicklog.yaml (what the CLI runs use), for the
    reference FM's train / validation rows."""
    from importlib.resources import files

    from omegaconf import OmegaConf

    node = OmegaConf.load(str(files("hybridrank.conf") / "data" / "clicklog.yaml"))
    return dict(OmegaConf.to_container(node.source.split))


SPLIT = _clicklog_split()


# ----------------------------------------------------------------------------------------------
# a world on disk and its split
# ----------------------------------------------------------------------------------------------
def _columns(world: World, position_feature: bool) -> dict[str, Any]:
    cols = dict(world.columns)
    num = [c for c in cols["numeric"] if c != cols["position"]]
    cols["numeric"] = num + ([cols["position"]] if position_feature else [])
    return cols


def _overrides(world: World, path: Path, position_feature: bool) -> list[str]:
    cols = _columns(world, position_feature)
    # exploration traffic marked in the log is mapped, as a user with such traffic would
    cols["explore"] = world.extra.get("explore")
    out = ["data=clicklog", f"data.source.path={path}", "intervals.n_boot=0"]
    for key in ("request", "label", "session", "user", "time", "position", "item", "bid", "true_p",
                "explore"):
        out.append(f"data.source.columns.{key}={cols[key] if cols[key] is not None else 'null'}")
    out.append("data.source.columns.numeric=[" + ",".join(cols["numeric"]) + "]")
    out.append("data.source.columns.categorical=[" + ",".join(cols["categorical"]) + "]")
    return out


def prepare_world(seed: int, size: str, work: Path, pins: Mapping[str, Any] | None = None,
                  family: str = "base") -> dict[str, Any]:
    world = simulate_world(draw_world(seed, size=size, family=family, **dict(pins or {})))
    wdir = work / f"world{seed}"
    wdir.mkdir(parents=True, exist_ok=True)
    world.write(wdir)
    cm = ColumnMap(**{k: v for k, v in world.columns.items()})
    train, val, test = split_frame(world.frame, cm, **SPLIT)
    pos = world.columns["position"]
    test.write_parquet(wdir / "test.parquet")
    test.with_columns(pl.lit(1, dtype=test[pos].dtype).alias(pos)).write_parquet(wdir / "test_slot1.parquet")
    return {"world": world, "dir": wdir, "train": train, "val": val, "test": test,
            "pcoc_drift": drift_floor(world, train, test), "pcoc_floor": floor(world, train, test)}


def drift_floor(world: World, train: pl.DataFrame, test: pl.DataFrame) -> float:
    """PCOC at slot 1 of a perfect model that cannot see time: the truth of the test rows with
    the world's drift replaced by its mean over the training rows (what a time-blind model
    learns): how much of a ``pcoc_ref`` miss the drift alone accounts for (not a bound on an
    imperfect model, whose own level error can land on either side); exactly 1 without drift."""
    tcol, logit = world.columns["time"], TRUTH_COLUMNS["logit"]

    def drift(frame: pl.DataFrame) -> np.ndarray:
        return drift_logit(world.spec, world.params["drift_sign"], world.params["drift_phase"],
                           frame[tcol].to_numpy() - TIME_ORIGIN)

    z = test[logit].to_numpy()
    blind = z - drift(test) + float(np.mean(drift(train)))
    return float(np.sum(1 / (1 + np.exp(-blind))) / np.sum(1 / (1 + np.exp(-z))))


def _drift(world: World, frame: pl.DataFrame) -> np.ndarray:
    return drift_logit(world.spec, world.params["drift_sign"], world.params["drift_phase"],
                       frame[world.columns["time"]].to_numpy() - TIME_ORIGIN)


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-12, 1 - 1e-12)
    return np.log(p / (1 - p))


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def level_shift(logit: np.ndarray, clicks: float, tol: float = 1e-12) -> float:
    """The shift ``c`` with ``sum sigmoid(logit + c) = clicks`` (Newton; the sum rises with c)."""
    if not 0 < clicks < logit.size:
        raise ValueError(f"need 0 < clicks < rows, got {clicks} clicks on {logit.size} rows")
    c = math.log(clicks / float(np.sum(1 / (1 + np.exp(-logit)))))
    for _ in range(100):
        p = 1 / (1 + np.exp(-(logit + c)))
        step = (clicks - float(p.sum())) / float((p * (1 - p)).sum())
        c += step
        if abs(step) < tol:
            break
    return c


def floor(world: World, train: pl.DataFrame, test: pl.DataFrame) -> float:
    """PCOC at slot 1 of the best a time-blind model can do with these clicks: the truth, its
    drift replaced by the training mean, and its level fitted to the training clicks (``Σ
    σ(logit + c) = clicks`` over the training rows at their logged slots). Drift and the clicks'
    sampling noise together; a world whose floor lies outside [0.97, 1.03] leaves little room
    for the [0.95, 1.05] band (scripts/bench_offsets.py has the clicks' part alone)."""
    mean_drift = float(np.mean(_drift(world, train)))
    z_train = _logit(train[TRUTH_COLUMNS["true_p"]].to_numpy()) - _drift(world, train) + mean_drift
    clicks = float((train[world.columns["label"]].to_numpy() > 0).sum())
    if not 0 < clicks < train.height:
        return math.nan
    c = level_shift(z_train, clicks)
    ref = test[TRUTH_COLUMNS["p_ref"]].to_numpy()
    blind = _logit(ref) - _drift(world, test) + mean_drift + c
    return float(np.sum(1 / (1 + np.exp(-blind))) / ref.sum())


# ----------------------------------------------------------------------------------------------
# training through the command line
# ----------------------------------------------------------------------------------------------
def train_variants(w: dict[str, Any], variants: Sequence[str], timeout: float,
                   extra: Sequence[str] = ()) -> dict[str, dict]:
    """One ``hybridrank-train -m`` per position mode (the column map differs), over the variants."""
    out: dict[str, dict] = {}
    conf = w["dir"] / "conf" / "experiment"
    conf.mkdir(parents=True, exist_ok=True)
    for feature in (True, False):
        names = [v for v in variants if VARIANTS[v][1] is feature]
        if not names:
            continue
        for v in names:
            lines = [f"  - override /{o.split('=')[0]}: {o.split('=')[1]}\n" for o in VARIANTS[v][0]]
            (conf / f"gen_{_safe(v)}.yaml").write_text(
                "# @package _global_\n" + ("defaults:\n" + "".join(lines) if lines else ""))
        sweep = w["dir"] / ("runs_feature" if feature else "runs_tower")
        cmd = ["hybridrank-train", "-m", f"--config-dir={w['dir'] / 'conf'}",
               f"hydra.sweep.dir={sweep}", "hydra.sweep.subdir=${hydra.job.num}",
               *_overrides(w["world"], w["dir"] / "log.parquet", feature), *extra,
               "experiment=" + ",".join(f"gen_{_safe(v)}" for v in names)]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if proc.returncode != 0:
            raise RuntimeError(f"hybridrank-train failed on {w['dir']}:\n{proc.stderr[-4000:]}")
        elapsed = time.perf_counter() - t0
        for k, v in enumerate(names):  # jobs are numbered in the order of the sweep's values
            run = sweep / str(k)
            metrics = json.loads((run / "metrics.json").read_text())
            out[v] = {"metrics": metrics, "run": run, "feature": feature,
                      "seconds_share": elapsed / len(names)}
    return out


def _safe(name: str) -> str:
    return name.replace("+", "_")


# ----------------------------------------------------------------------------------------------
# scoring and the figures
# ----------------------------------------------------------------------------------------------
def _export(checkpoint: str, inp: Path, out: Path, calibrator: str, *extra: str) -> tuple[pl.DataFrame, dict]:
    from hydra import compose, initialize_config_module

    from hybridrank.cli.export import export
    from hybridrank.serving.export import read_scores

    with initialize_config_module("hybridrank.conf", version_base="1.3"):
        cfg = compose("export", overrides=[f"checkpoint={checkpoint}", f"input={inp}", f"output={out}",
                                           f"calibrator={calibrator}", f"paths.output_dir={out.parent}",
                                           *extra])
    export(cfg)
    return read_scores(out)


def _xent(q: np.ndarray, p: np.ndarray) -> np.ndarray:
    q = np.clip(q, 1e-7, 1 - 1e-7)
    return -(p * np.log(q) + (1 - p) * np.log1p(-q))


def _ndcg10(score: np.ndarray, gain: np.ndarray, offsets: np.ndarray) -> float:
    """Mean NDCG@10 with linear gain over requests (ties averaged), via hybridrank.metrics."""
    import torch

    from hybridrank.lists import gather_lists, pad_index
    from hybridrank.metrics.ranking import ndcg

    index, mask = pad_index(torch.from_numpy(np.diff(offsets)))
    s = gather_lists(torch.from_numpy(score.astype(np.float64)), index, mask)
    g = gather_lists(torch.from_numpy(gain.astype(np.float64)), index, mask)
    return float(ndcg(s, g, mask=mask, k=10, gain="linear"))


def _offsets(frame: pl.DataFrame, request: str) -> np.ndarray:
    sizes = frame.group_by(request, maintain_order=True).len()["len"].to_numpy()
    return np.concatenate([[0], np.cumsum(sizes.astype(np.int64))]).astype(np.int64)


def _per_request_se(diff: np.ndarray, offsets: np.ndarray) -> float:
    """Standard error of a mean per impression, from per-request sums (requests independent)."""
    sums = np.add.reduceat(diff, offsets[:-1]) if diff.size else np.zeros(0)
    n, r = diff.size, sums.size
    if r < 2:
        return math.nan
    return float(np.std(sums, ddof=1) * math.sqrt(r) / n)


def _welfare(frame: pl.DataFrame, score: np.ndarray, truth: np.ndarray, world: World,
             request: str, bid: str) -> float:
    from hybridrank.serving.auction import replay_auctions

    base = float(np.mean(truth))
    off = world.offsets
    factors = [1.0] + [float((1 / (1 + np.exp(-(math.log(base / (1 - base)) + off[j])))) / base)
                       for j in (2, 3)]
    # the replay wants factors that never rise with the slot (GSP gives slot 1 the highest eCPM)
    factors = np.minimum.accumulate(np.minimum(np.array(factors), 1.0))
    res = replay_auctions(frame[bid].to_numpy(), score, request_ids=frame[request].to_numpy(),
                          true_pctr=truth, slots=3, slot_factors=factors, mechanism="gsp")
    return float(res.model.welfare.sum() / max(res.oracle.welfare.sum(), 1e-300))


def evaluate_run(w: dict[str, Any], name: str, run: dict, scratch: Path) -> dict[str, Any]:
    world: World = w["world"]
    test: pl.DataFrame = w["test"]
    cols = world.columns
    req, item, label, bid = cols["request"], cols["item"], cols["label"], cols["bid"]
    metrics = run["metrics"]
    ckpt = metrics["best_checkpoint"]
    stop = str(metrics.get("training", {}).get("stopped_because"))
    row: dict[str, Any] = {"variant": name, "epochs": metrics.get("training", {}).get("epochs"),
                           "best_epoch": metrics.get("training", {}).get("best_epoch"),
                           "stop": "criterion" if stop.startswith("early stopping") else stop,
                           "seconds": round(run["seconds_share"], 1), "pcoc_drift": w.get("pcoc_drift"),
                           "pcoc_floor": w.get("pcoc_floor")}
    key = ["request_id", "item_id"]  # the export's names for the mapped request and item columns
    truth = test.select(pl.col(req).alias("request_id"), pl.col(item).alias("item_id"), "true_p",
                        "true_p_ref", pl.col(label).alias("click"), pl.col(bid).alias("bid_log"))
    auto, meta = _export(ckpt, w["dir"] / "test.parquet", scratch / f"{_safe(name)}_auto.parquet", "auto")
    none, _ = _export(ckpt, w["dir"] / "test.parquet", scratch / f"{_safe(name)}_none.parquet", "none")
    a = auto.join(truth, on=key, how="left", maintain_order="left")
    n = none.join(truth, on=key, how="left", maintain_order="left")
    assert a["true_p"].null_count() == 0 and a.height == test.height
    offsets = _offsets(a, "request_id")
    p_true, p_ref, y = a["true_p"].to_numpy(), a["true_p_ref"].to_numpy(), a["click"].to_numpy()
    if run["feature"]:
        logged_auto, logged_none = a["pctr"].to_numpy(), n["pctr"].to_numpy()
        s1, _ = _export(ckpt, w["dir"] / "test_slot1.parquet", scratch / f"{_safe(name)}_s1.parquet", "auto")
        s1n, _ = _export(ckpt, w["dir"] / "test_slot1.parquet", scratch / f"{_safe(name)}_s1n.parquet", "none")
        s1 = s1.join(truth.select(key), on=key, how="right", maintain_order="right")
        ref_auto = s1["pctr"].to_numpy()
        ref_none = s1n.join(truth.select(key), on=key, how="right", maintain_order="right")["pctr"].to_numpy()
        st, _ = _export(ckpt, w["dir"] / "test_slot1.parquet", scratch / f"{_safe(name)}_s1s.parquet", "auto",
                        "level_trend.mode=off")
        ref_static = st.join(truth.select(key), on=key, how="right", maintain_order="right")["pctr"].to_numpy()
    else:
        # a position-blind model (no tower, position not a feature) scores every slot alike
        at = "pctr_at_position" if "pctr_at_position" in a.columns else "pctr"
        logged_auto, logged_none = a[at].to_numpy(), n[at].to_numpy()
        ref_auto, ref_none = a["pctr"].to_numpy(), n["pctr"].to_numpy()
        st, _ = _export(ckpt, w["dir"] / "test.parquet", scratch / f"{_safe(name)}_static.parquet", "auto",
                        "level_trend.mode=off")
        ref_static = st.join(truth.select(key), on=key, how="left", maintain_order="left")["pctr"].to_numpy()
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
            row["slot_err"] = slot_ctr_error(_logit(ref_none), _logit(p_ref), learned[:top],
                                             np.asarray(world.offsets[1:top + 1]))
        level = info.get("serving_level")
        if level:  # the serving level's interval; its coverage is read below, against pcoc_ref_none
            row["level_lo"], row["level_hi"] = level["interval_logit"]
        ident = info.get("identifiability") or {}
        row["identified"] = ident.get("identified")
        row["precise"] = ident.get("precise")
        row["rank_corr"] = ident.get("rank_correlation")
    bayes = float(np.mean(_xent(p_true, p_true)))
    row["excess"] = float(np.mean(_xent(logged_none, p_true))) - bayes
    row["excess_auto"] = float(np.mean(_xent(logged_auto, p_true))) - bayes
    oracle = _ndcg10(p_ref, p_ref, offsets)
    row["ndcg_gap"] = oracle - _ndcg10(ref_none, p_ref, offsets)
    row["pcoc_ref"] = float(ref_auto.sum() / p_ref.sum())
    row["pcoc_ref_none"] = float(ref_none.sum() / p_ref.sum())
    row["pcoc_static"] = float(ref_static.sum() / p_ref.sum())  # without the level trend
    if "level_lo" in row:
        # held when the true level, about the estimate's minus log PCOC at a small click rate,
        # lies in [estimate + lo, estimate + hi]
        row["level_covered"] = bool(-row["level_hi"] <= math.log(row["pcoc_ref_none"]) <= -row["level_lo"])
    trend = meta.get("level_trend") or {}
    row["trend"] = trend.get("slope_per_day") if trend.get("applied") else None
    row["trend_verdict"] = trend.get("verdict")
    ll_auto, ll_none = _xent(logged_auto, y), _xent(logged_none, y)
    row["d_ll"] = float(np.mean(ll_auto - ll_none))
    row["d_ll_se"] = _per_request_se(ll_auto - ll_none, offsets)
    cal = meta.get("calibrator") or {}
    row["auto"] = (cal.get("chosen") or {}).get("name", cal.get("name"))
    row["welfare"] = _welfare(a, ref_auto, p_ref, world, "request_id", "bid_log")
    row.update(_unseen_rows(w, a["item_id"], ref_auto, p_ref))
    return row


def slot_ctr_error(z_model: np.ndarray, z_true: np.ndarray, offsets: np.ndarray,
                   true_offsets: np.ndarray) -> float:
    """``slot_err``: the largest ``|log(PCOC_j / PCOC_1)|`` over slots ``j >= 2``, where ``PCOC_j``
    is ``sum sigmoid(z_model + offsets[j - 1]) / sum sigmoid(z_true + true_offsets[j - 1])`` over
    the candidates: how far the slot CTRs a model's offsets imply are from the truth's, its level
    aside (``z_model``: the model's position-free logits; ``z_true``: the true ones)."""
    pcoc = [float(_sigmoid(z_model + b).sum() / _sigmoid(z_true + t).sum())
            for b, t in zip(offsets, true_offsets)]
    return float(max(abs(math.log(pc / pcoc[0])) for pc in pcoc[1:]))


def _unseen_rows(w: dict[str, Any], items: pl.Series, pctr: np.ndarray, p_ref: np.ndarray) -> dict[str, Any]:
    """``new_share``: the share of test impressions whose item id no training row holds;
    ``pcoc_new`` / ``pcoc_seen``: PCOC at the reference slot on those and on the others."""
    seen = w["train"][w["world"].columns["item"]].cast(pl.String).unique().to_numpy()
    new = ~np.isin(items.cast(pl.String).to_numpy(), seen)
    out: dict[str, Any] = {"new_share": float(new.mean())}
    for name, m in (("pcoc_new", new), ("pcoc_seen", ~new)):
        out[name] = float(pctr[m].sum() / p_ref[m].sum()) if m.any() else None
    return out


def reference_row(w: dict[str, Any]) -> dict[str, Any]:
    world: World = w["world"]
    cols = dict(world.columns)
    cols["numeric"] = [c for c in cols["numeric"] if c != cols["position"]]
    t0 = time.perf_counter()
    predict = fit_reference_fm(w["train"], w["val"], cols)
    test = w["test"]
    p_true, p_ref = test["true_p"].to_numpy(), test["true_p_ref"].to_numpy()
    logged, ref = predict(test, slot=None), predict(test, slot=1)
    offsets = _offsets(test, cols["request"])
    bayes = float(np.mean(_xent(p_true, p_true)))
    return {"variant": "reference FM", "pcoc_drift": w.get("pcoc_drift"), "pcoc_floor": w.get("pcoc_floor"),
            "excess": float(np.mean(_xent(logged, p_true))) - bayes,
            "ndcg_gap": _ndcg10(p_ref, p_ref, offsets) - _ndcg10(ref, p_ref, offsets),
            "pcoc_ref": float(ref.sum() / p_ref.sum()), "epochs": getattr(predict, "epochs", None),
            **_unseen_rows(w, test[w["world"].columns["item"]], ref, p_ref),
            "welfare": _welfare(test, ref, p_ref, world, cols["request"], cols["bid"]),
            "seconds": round(time.perf_counter() - t0, 1)}


# ----------------------------------------------------------------------------------------------
# reporting
# ----------------------------------------------------------------------------------------------
#: slot CTRs "within 0.1": ``slot_err <= 0.1`` (a CTR ratio off by about 10 %), the scale of the
#: offsets' 0.1-logit criterion, so that the two columns compare
SLOT_TOL = 0.1
COLS = ("excess", "ndcg_gap", "pcoc_ref", "pcoc_ref_none", "pcoc_static", "trend", "pcoc_drift",
        "pcoc_floor", "offset_err", "slot_err",
        "offsets_covered", "identified", "precise", "auto", "d_ll", "welfare", "new_share", "pcoc_new",
        "pcoc_seen", "epochs", "stop")


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def world_table(results: Sequence[Mapping[str, Any]]) -> str:
    lines = ["| world | variant | " + " | ".join(COLS) + " |", "|---" * (len(COLS) + 2) + "|"]
    for r in results:
        for row in r["rows"]:
            cells = [_fmt(row.get(c)) for c in COLS]
            if row.get("d_ll") is not None and row.get("d_ll_se") is not None:
                cells[COLS.index("d_ll")] = f"{row['d_ll']:+.5f} ± {row['d_ll_se']:.5f}"
            lines.append(f"| {r['seed']} | {row['variant']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def aggregate(results: Sequence[Mapping[str, Any]]) -> str:
    by: dict[str, list[dict]] = {}
    for r in results:
        for row in r["rows"]:
            by.setdefault(row["variant"], []).append({**row, "_world": r})
    lines = ["| variant | worlds | median excess | median NDCG gap | PCOC@ref in [0.95, 1.05] | "
             "... where the drift floor is in [0.97, 1.03] | ... where the floor (drift and clicks) is | "
             "offsets within 0.1 | offsets within 0.2 | slot CTRs within 0.1 (slot_err) | "
             "level interval holds the truth | "
             "diagnosis fired (unidentifiable / identifiable) | "
             "auto > 1 SE worse | median welfare | stopped on criterion |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, rows in by.items():
        def share(pred, pool=rows):
            pool = [x for x in pool if pred(x) is not None]
            ok = [x for x in pool if pred(x)]
            return f"{len(ok)}/{len(pool)}" if pool else "-"
        # random order, or exploration requests marked in a column the model is given
        identifiable = [x for x in rows if x["_world"]["spec"]["explore_share"] == 1.0
                        or (x["_world"]["spec"]["explore_share"] > 0
                            and x["_world"]["spec"]["mark_explore"])]
        unidentifiable = [x for x in rows if x not in identifiable]
        # where a model without time can reach the band at all
        steady = [x for x in identifiable if x.get("pcoc_drift") is not None
                  and 0.97 <= x["pcoc_drift"] <= 1.03]
        reachable = [x for x in identifiable if x.get("pcoc_floor") is not None
                     and 0.97 <= x["pcoc_floor"] <= 1.03]
        lines.append(
            f"| {name} | {len(rows)} | {_fmt(float(np.median([x['excess'] for x in rows])))} | "
            f"{_fmt(float(np.median([x['ndcg_gap'] for x in rows])))} | "
            f"{share(lambda x: 0.95 <= x['pcoc_ref'] <= 1.05, identifiable)} | "
            f"{share(lambda x: 0.95 <= x['pcoc_ref'] <= 1.05, steady)} | "
            f"{share(lambda x: 0.95 <= x['pcoc_ref'] <= 1.05, reachable)} | "
            f"{share(lambda x: None if x.get('offset_err') is None else x['offset_err'] <= 0.1, identifiable)} | "
            f"{share(lambda x: None if x.get('offset_err') is None else x['offset_err'] <= 0.2, identifiable)} | "
            f"{share(lambda x: None if x.get('slot_err') is None else x['slot_err'] <= SLOT_TOL, identifiable)} | "
            f"{share(lambda x: x.get('level_covered'), identifiable)} | "
            f"{share(lambda x: None if x.get('identified') is None else not x['identified'], unidentifiable)}"
            f" / {share(lambda x: None if x.get('identified') is None else not x['identified'], identifiable)} | "
            f"{share(lambda x: None if x.get('d_ll') is None else x['d_ll'] > x['d_ll_se'])} | "
            f"{_fmt(float(np.median([x['welfare'] for x in rows])))} | "
            f"{share(lambda x: None if x.get('stop') is None else x['stop'] == 'criterion')} |")
    return "\n".join(lines)


def _pin(text: str) -> tuple[str, Any]:
    key, _, value = text.partition("=")
    for cast in (int, float):
        try:
            return key, cast(value)
        except ValueError:
            pass
    return key, {"true": True, "false": False}.get(value.lower(), value)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worlds", type=int, default=24)
    ap.add_argument("--seed0", type=int, default=1000)
    ap.add_argument("--size", default="small", choices=("tiny", "small"))
    ap.add_argument("--family", default="base", choices=FAMILIES,
                    help="world family: base, or longtail (heavy-tailed user activity, users "
                         "unseen before the test period, dense item side features, user x item "
                         "latent interactions)")
    ap.add_argument("--variants", default="default,tower,fm,fm_tower")
    ap.add_argument("--no-reference", action="store_true", help="skip the reference FM")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per world's multirun")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "generalization.json")
    ap.add_argument("--keep", type=Path, default=None, help="keep the worlds and runs here")
    ap.add_argument("--extra", nargs="*", default=[], help="hydra overrides for every run")
    ap.add_argument("--pin", nargs="*", default=[], metavar="FIELD=VALUE",
                    help="pin world fields (draw_world keywords), e.g. logging=random")
    ap.add_argument("--explore-shares", default=None,
                    help="confounded-logging family: worlds sorted by a noisy relevance estimate, "
                         "each with the next of these exploration shares (e.g. 0,0.01,0.05,0.1), "
                         "the exploration requests marked in a column")
    ap.add_argument("--tables", nargs="+", type=Path, default=None, metavar="JSON",
                    help="print the world and aggregate tables of saved --out files (merged) "
                         "without running anything")
    a = ap.parse_args(argv)
    if a.tables:
        results = [r for path in a.tables for r in json.loads(path.read_text())["results"]]
        print(world_table(results))
        print("\n## Aggregate\n")
        print(aggregate(results))
        return 0
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {sorted(VARIANTS)}")
    results = []
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = a.keep or Path(tmp)
        pins = dict(_pin(x) for x in a.pin)
        shares = [float(x) for x in a.explore_shares.split(",")] if a.explore_shares else None
        for i, seed in enumerate(range(a.seed0, a.seed0 + a.worlds)):
            t0 = time.perf_counter()
            world_pins = dict(pins)
            if shares is not None:
                world_pins.update(logging="sorted", explore_share=shares[i % len(shares)], mark_explore=True)
            w = prepare_world(seed, a.size, work, world_pins, a.family)
            runs = train_variants(w, variants, a.timeout, a.extra)
            t_train = time.perf_counter() - t0
            scratch = w["dir"] / "scores"
            scratch.mkdir(exist_ok=True)
            rows = [evaluate_run(w, v, runs[v], scratch) for v in variants]
            if not a.no_reference:
                rows.append(reference_row(w))
            spec = w["world"].spec.to_dict()
            results.append({"seed": seed, "describe": w["world"].spec.describe(), "spec": spec,
                            "impressions": w["world"].frame.height, "rows": rows,
                            "seconds": {"train": round(t_train, 1),
                                        "total": round(time.perf_counter() - t0, 1)}})
            print(f"# {w['world'].spec.describe()} ({time.perf_counter() - t0:.0f} s)", flush=True)
            print(world_table(results[-1:]), flush=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"results": results, "variants": variants,
                                 "seconds": time.perf_counter() - t_all}, indent=1, default=str))
    print("\n## Aggregate\n")
    print(aggregate(results))
    print(f"\n{len(results)} worlds in {(time.perf_counter() - t_all) / 60:.1f} min; {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
