"""Calibration on known-truth simulated lists: BCE and the calibration-compatible hybrids stay
calibrated, pure softmax CE does not (it cannot even see the intercept).

Lists of 10 impressions, features ``x``, true ``p = σ(w·x + b)`` at a ~5 % base rate, clicks drawn
from p. A linear scorer is trained full-batch with plain torch; ECE (15 quantile bins,
``Σ_b n_b / n |mean p_b - mean y_b|``) and PCOC (``Σ p / Σ y``) are computed inline on a large
held-out set so that the click noise floor of the ECE is ~0.002.
"""

from __future__ import annotations

import pytest
import torch

from hybridrank.losses import HybridLoss, click_logit

D, LIST_LEN = 6, 10


def _simulate(n_lists: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    w_true = torch.tensor([1.0, -0.8, 0.6, 0.5, -0.4, 0.3])
    x = torch.randn(n_lists, LIST_LEN, D, generator=gen)
    p = torch.sigmoid(x @ w_true - 3.6)
    y = (torch.rand(n_lists, LIST_LEN, generator=gen) < p).float()
    return x, y, p


def _ece(p: torch.Tensor, y: torch.Tensor, bins: int = 15) -> float:
    order = torch.argsort(p)
    p, y = p[order], y[order]
    edges = torch.linspace(0, p.numel(), bins + 1).long()
    total = 0.0
    for lo, hi in zip(edges[:-1].tolist(), edges[1:].tolist()):
        if hi > lo:
            total += (hi - lo) / p.numel() * abs(p[lo:hi].mean().item() - y[lo:hi].mean().item())
    return total


def _train(loss: HybridLoss, x, y, steps: int = 300) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Linear(D, loss.n_outputs)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    mask = torch.ones(y.shape, dtype=torch.bool)
    for _ in range(steps):
        opt.zero_grad()
        out = model(x)
        total, _ = loss(out if loss.n_outputs == 2 else out.squeeze(-1), y, mask=mask)
        total.backward()
        opt.step()
    return model


def _evaluate(model: torch.nn.Module, x, y) -> tuple[float, float]:
    with torch.no_grad():
        p = torch.sigmoid(click_logit(model(x))).flatten()
    y = y.flatten()
    return _ece(p, y), (p.sum() / y.sum()).item()


HYBRIDS = {
    "bce+calibrated_softmax": {"calibrated_softmax": {"weight": 0.5}},
    "rcr": {"rcr": {"weight": 0.5}},
    "jrc": {"jrc": {"weight": 0.5}},
}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Small full-batch steps: one intra-op thread is much faster than two on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def sim():
    x, y, _ = _simulate(3000, seed=1)
    x_test, y_test, _ = _simulate(10000, seed=2)
    return x, y, x_test, y_test


@pytest.fixture(scope="module")
def bce_result(sim):
    x, y, x_test, y_test = sim
    return _evaluate(_train(HybridLoss(1.0), x, y), x_test, y_test)


@pytest.mark.slow
def test_simulated_base_rate(sim):
    _, y, _, y_test = sim
    assert 0.03 < y.mean().item() < 0.10 and 0.03 < y_test.mean().item() < 0.10


@pytest.mark.slow
def test_bce_is_calibrated(bce_result):
    ece, pcoc = bce_result
    assert ece < 0.01
    assert 0.9 < pcoc < 1.1


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(HYBRIDS))
def test_calibration_compatible_hybrids_stay_calibrated(name, sim, bce_result):
    x, y, x_test, y_test = sim
    ece, pcoc = _evaluate(_train(HybridLoss(0.5, terms=HYBRIDS[name]), x, y), x_test, y_test)
    assert ece <= 3 * bce_result[0] + 0.005, (name, ece, bce_result[0])
    assert 0.75 < pcoc < 1.25, (name, pcoc)


@pytest.mark.slow
def test_pure_softmax_is_miscalibrated(sim, bce_result):
    x, y, x_test, y_test = sim
    ece, pcoc = _evaluate(_train(HybridLoss(0.0, terms={"softmax": {}}), x, y), x_test, y_test)
    assert ece > 4 * bce_result[0] + 0.01, (ece, bce_result[0])
    assert not 0.5 < pcoc < 2.0, pcoc
