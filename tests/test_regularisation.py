"""The embedding L2 penalties (``hybridrank.models.scorers``): per impression and frequency-aware,
against brute-force loops, the prior the frequency-aware one adds up to over an epoch, and the
model's use of the datamodule's counts."""

from __future__ import annotations

import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from hybridrank.data.datamodule import ListDataModule
from hybridrank.data.simulate import simulate_clicklog
from hybridrank.data.sources import SIM_COLUMNS_MAP, ClickLogSource
from hybridrank.losses import HybridLoss
from hybridrank.models.ranker import HybridRanker
from hybridrank.models.regularisation import embedding_penalty, frequency_penalty, row_weights
from hybridrank.models.scorers import (
    DCNv2Scorer,
    DeepFMScorer,
    FMScorer,
    LinearScorer,
    MLPScorer,
)

pytestmark = pytest.mark.usefixtures("one_thread")

SIZES = [7, 3, 12]


def _scorers():
    torch.manual_seed(0)
    return [MLPScorer(2, SIZES, hidden=(4,), emb_dim=4), LinearScorer(2, SIZES),
            FMScorer(2, SIZES, emb_dim=3), DeepFMScorer(2, SIZES, emb_dim=3, hidden=(4,)),
            DCNv2Scorer(2, SIZES, hidden=(4,), emb_dim=4)]


def _batch(seed: int, n: int = 40):
    g = torch.Generator().manual_seed(seed)
    cat = torch.stack([torch.randint(0, v + 1, (n,), generator=g) for v in SIZES], dim=1)
    request = torch.sort(torch.randint(0, 9, (n,), generator=g)).values  # rows of a request adjacent
    counts = [torch.randint(0, 6, (v + 1,), generator=g) for v in SIZES]
    return cat, request, counts


def _rows(scorer, j: int, code: int) -> float:
    """Brute force: the squared norm of code ``code``'s rows in every table of column ``j``."""
    total = 0.0
    for module in scorer.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == len(SIZES) \
                and all(isinstance(t, torch.nn.Embedding) for t in module):
            total += float((module[j].weight[code].detach().double() ** 2).sum())
    return total


@pytest.mark.parametrize("k", range(5))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_penalties_equal_brute_force_loops(k, seed):
    scorer = _scorers()[k]
    cat, request, counts = _batch(seed)
    n = cat.shape[0]
    # per impression: every row of every impression
    ref = sum(_rows(scorer, j, int(cat[i, j])) for i in range(n) for j in range(len(SIZES))) / n
    assert embedding_penalty(scorer, cat).item() == pytest.approx(ref, rel=1e-5)
    # frequency-aware: each (request, code) pair once, over max(count, 1); column 1 unweighted
    weights = [1.0 / c.double().clamp(min=1) for c in counts]
    ref = 0.0
    for j in (0, 2):
        pairs = {(int(request[i]), int(cat[i, j])) for i in range(n)}
        ref += sum(_rows(scorer, j, c) * float(weights[j][c]) for _, c in pairs)
    w = [weights[0].float(), None, weights[2].float()]
    assert frequency_penalty(scorer, cat, request, w).item() == pytest.approx(ref / n, rel=1e-5)
    # without a request index every row is its own request
    ref = sum(_rows(scorer, j, int(cat[i, j])) * float(weights[j][int(cat[i, j])])
              for i in range(n) for j in (0, 2)) / n
    assert frequency_penalty(scorer, cat, None, w).item() == pytest.approx(ref, rel=1e-5)


@pytest.mark.parametrize("k", range(5))
def test_the_row_sum_and_the_lookup_give_one_penalty_and_one_gradient(k):
    """Small dense tables sum the penalty per row, sparse ones by looking the batch's rows up
    (:func:`weighted_square_norms`): the same values and the same gradients, row for row."""
    cat, request, counts = _batch(3)
    weights = [(1.0 / c.double().clamp(min=1)).float() for c in counts]

    def run(sparse: bool):
        scorer = _scorers()[k]
        tables = [t for m in scorer.modules() if isinstance(m, torch.nn.Embedding) for t in [m]]
        for t in tables:
            t.sparse = sparse
        values = [embedding_penalty(scorer, cat), frequency_penalty(scorer, cat, request, weights)]
        (values[0] + 3.0 * values[1]).backward()
        grads = [t.weight.grad.to_dense() if t.weight.grad is not None else torch.zeros_like(t.weight)
                 for t in tables]
        return [v.item() for v in values], grads

    (dense_values, dense_grads), (sparse_values, sparse_grads) = run(False), run(True)
    assert dense_values == pytest.approx(sparse_values, rel=1e-6)
    for a, b in zip(dense_grads, sparse_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert any(g.abs().sum() > 0 for g in dense_grads)


def test_frequency_penalty_is_a_prior_over_an_epoch():
    """Summed over the batches of an epoch (whole requests, any batching) and multiplied by each
    batch's size, the penalty is ``Σ_rows ||row||²`` over every row the training data holds:
    each row's total is its own, whatever its frequency."""
    scorer = _scorers()[2]
    g = torch.Generator().manual_seed(5)
    lengths = torch.randint(1, 6, (60,), generator=g)
    request = torch.repeat_interleave(torch.arange(60), lengths)
    cat = torch.stack([torch.randint(1, v + 1, (request.numel(),), generator=g) for v in SIZES], dim=1)
    cat[torch.randint(0, request.numel(), (5,), generator=g), 0] = 0  # a few at code 0 too
    counts = {f"c{j}": np.zeros(v + 1, dtype=np.int64) for j, v in enumerate(SIZES)}
    for r in range(60):
        for j in range(len(SIZES)):
            for code in set(cat[request == r, j].tolist()):
                counts[f"c{j}"][code] += 1
    weights = row_weights(counts, [f"c{j}" for j in range(len(SIZES))], SIZES)
    expect = sum(_rows(scorer, j, c) for j in range(len(SIZES)) for c in range(SIZES[j] + 1)
                 if counts[f"c{j}"][c] > 0)
    for cuts in ([0, 60], [0, 7, 30, 31, 60], list(range(0, 61, 4))):
        total = 0.0
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            rows = (request >= lo) & (request < hi)
            total += rows.sum().item() * frequency_penalty(scorer, cat[rows], request[rows] - lo, weights).item()
        assert total == pytest.approx(expect, rel=1e-5)


def test_frequency_penalty_gradient_touches_only_the_batch_rows():
    scorer = _scorers()[2]
    cat = torch.tensor([[1, 2, 3], [1, 2, 4]])
    weights = [torch.full((v + 1,), 0.5) for v in SIZES]
    frequency_penalty(scorer, cat, torch.tensor([0, 1]), weights).backward()
    grad = scorer.fields.tables[2].weight.grad
    used = torch.zeros(SIZES[2] + 1, dtype=torch.bool)
    used[[3, 4]] = True
    assert (grad[~used] == 0).all() and (grad[used].abs().sum(1) > 0).all()
    # the gradient of w ||row||² / B is 2 w row / B
    row = scorer.fields.tables[2].weight[3]
    torch.testing.assert_close(grad[3], 2 * 0.5 * row.detach() / 2)


def test_row_weights_and_bad_input():
    w = row_weights({"a": [0, 2, 5], "b": np.array([1, 1])}, ["a", "b", "h"], [2, 1, 9])
    torch.testing.assert_close(w[0], torch.tensor([1.0, 0.5, 0.2]))
    torch.testing.assert_close(w[1], torch.tensor([1.0, 1.0]))
    assert w[2] is None
    with pytest.raises(ValueError, match=r"value counts for \['x'\], which are not categorical"):
        row_weights({"x": [1, 2]}, ["a"], [1])
    with pytest.raises(ValueError, match="value counts of 'a': need 3 non-negative counts"):
        row_weights({"a": [1, 2]}, ["a"], [2])
    with pytest.raises(ValueError, match="need 3 non-negative counts"):
        row_weights({"a": [1, -2, 0]}, ["a"], [2])
    with pytest.raises(ValueError, match="2 weight tables for 3 categorical columns"):
        frequency_penalty(_scorers()[0], _batch(0)[0], None, [None, None])


# ----------------------------------------------------------------------------------------------
# the model
# ----------------------------------------------------------------------------------------------
def _datamodule(tmp_path):
    df = simulate_clicklog(n_users=60, seed=3)
    df.write_parquet(tmp_path / "log.parquet")
    split = {"by": "hash", "key": "request", "val": 0.1, "test": 0.1, "seed": 0}
    source = ClickLogSource(str(tmp_path / "log.parquet"), SIM_COLUMNS_MAP.to_dict(), split=split,
                            vocab={"hash_buckets": {"item_category": 8}})
    return ListDataModule(source, budget=512)


def _model(schema, **kw):
    return HybridRanker({"_target_": "hybridrank.models.scorers.FMScorer", "_partial_": True, "emb_dim": 4},
                        HybridLoss(point_weight=1.0), data={"schema": schema.to_dict(), "base_rate": 0.05},
                        unseen_dropout="off", **kw)


def test_the_model_weighs_rows_by_the_datamodule_counts(tmp_path):
    dm = _datamodule(tmp_path)
    counts, schema = dm.value_counts(), dm.schema
    model = _model(schema, embedding_l2=0.5, embedding_l2_mode="frequency")
    assert model.hparams["embedding_l2_mode"] == "frequency"
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_train_batches=2,
                         limit_val_batches=1)
    trainer.fit(model, datamodule=dm)
    weights = model._row_weights
    for j, name in enumerate(schema.categorical):
        if name in counts:  # 1 / count, unseen codes as once
            expect = 1.0 / np.maximum(counts[name], 1)
            np.testing.assert_allclose(weights[j].numpy(), expect, rtol=1e-6)
        else:  # the hashed column
            assert weights[j] is None
    batch = next(iter(dm.train_dataloader()))
    manual = frequency_penalty(model.scorer, batch.cat, batch.request, weights)
    assert model._embedding_penalty(batch.cat, batch.request).item() == pytest.approx(manual.item())
    # per impression: the old penalty, whatever the counts
    model.embedding_l2_mode = "per_impression"
    assert model._embedding_penalty(batch.cat, batch.request).item() == pytest.approx(
        embedding_penalty(model.scorer, batch.cat).item())


def test_frequency_mode_needs_counts_and_a_known_mode(tmp_path):
    dm = _datamodule(tmp_path)
    with pytest.raises(ValueError, match="embedding_l2_mode must be one of"):
        _model(dm.schema, embedding_l2=0.1, embedding_l2_mode="per_row")
    model = _model(dm.schema, embedding_l2=0.1, embedding_l2_mode="frequency")
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_train_batches=1)
    loader = dm.train_dataloader()  # batches without the datamodule: no counts to weigh rows by
    with pytest.raises(ValueError, match="embedding_l2_mode=frequency needs the training value counts"):
        trainer.fit(model, train_dataloaders=loader)
    # strength 0: nothing to weigh, no counts needed
    off = _model(dm.schema, embedding_l2=0.0, embedding_l2_mode="frequency")
    off.setup("fit")
    assert off._row_weights is None and off.unseen_report == {}


# ----------------------------------------------------------------------------------------------
# numeric inputs limited to the training range
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", range(5))
def test_numeric_clip_scores_an_outlier_as_the_edge_of_the_range(k):
    torch.manual_seed(1)
    scorer = type(_scorers()[k])(2, SIZES, numeric_clip=5.0)
    num = torch.tensor([[40.0, -0.3], [-1e6, 2.0], [5.0, -0.3], [-5.0, 2.0]])
    cat = torch.ones(4, len(SIZES), dtype=torch.long)
    out = scorer(num, cat)
    # an outlier scores as the bound itself; values inside the range are untouched
    torch.testing.assert_close(out[0], out[2])
    torch.testing.assert_close(out[1], out[3])
    inside = torch.tensor([[1.5, -0.3]])
    plain = type(scorer)(2, SIZES)
    plain.load_state_dict(scorer.state_dict())
    torch.testing.assert_close(scorer(inside, cat[:1]), plain(inside, cat[:1]))
    with pytest.raises(ValueError, match="numeric_clip must be > 0 or None"):
        type(scorer)(2, SIZES, numeric_clip=0.0)


def test_without_the_clip_a_cross_network_explodes_on_an_outlier():
    """The failure the clip prevents: DCN-v2's cross layers are a polynomial of degree
    n_cross + 1, so an input 100 standard deviations out moves the logit by orders of magnitude
    more than one at the bound does."""
    torch.manual_seed(2)
    free = DCNv2Scorer(2, SIZES, hidden=(4,), emb_dim=4)
    with torch.no_grad():
        free.head.weight.normal_(0, 0.1)
    clipped = DCNv2Scorer(2, SIZES, hidden=(4,), emb_dim=4, numeric_clip=5.0)
    clipped.load_state_dict(free.state_dict())
    cat = torch.ones(2, len(SIZES), dtype=torch.long)
    num = torch.tensor([[0.0, 0.0], [100.0, 0.0]])
    jump_free = (free(num, cat)[1] - free(num, cat)[0]).abs().item()
    jump_clip = (clipped(num, cat)[1] - clipped(num, cat)[0]).abs().item()
    assert jump_free > 1000 * jump_clip


def test_a_step_outside_a_fit_without_counts_warns_and_leaves_the_penalty_out(tmp_path):
    dm = _datamodule(tmp_path)
    model = _model(dm.schema, embedding_l2=10.0, embedding_l2_mode="frequency")
    batch = next(iter(dm.train_dataloader()))
    with pytest.warns(UserWarning, match="the embedding L2 is left out of this step"):
        total = model.training_step(batch, 0)
    plain = _model(dm.schema)
    plain.load_state_dict(model.state_dict())
    assert total.item() == pytest.approx(plain.training_step(batch, 0).item())
    model.set_value_counts(dm.value_counts())  # with the counts the penalty is there
    assert model.training_step(batch, 0).item() > total.item()
