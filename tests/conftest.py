"""Shared test fixtures: hypothesis profiles, the real-data folder, composing the hydra configs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("ci", max_examples=100, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=20, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "default"))

if os.environ.get("PYTEST_XDIST_WORKER"):
    # several workers share the cores (pyproject's ``-n auto``): one intra-op torch thread each, and
    # for the processes they start. Two threads per worker on a 2-core machine oversubscribe it and
    # made the suite slower than one process; one thread each took it from ~290 s to ~180 s.
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op torch thread for a test module of small tensors (``pytestmark =
    pytest.mark.usefixtures("one_thread")``): on a busy 2-core machine a second thread costs more
    in synchronisation than it gains on tensors this small. The previous count is restored."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def real_data() -> Path:
    """The shared real-data folder (``HYBRIDRANK_REAL_DATA``); tests using it skip without it."""
    root = os.environ.get("HYBRIDRANK_REAL_DATA")
    if not root:
        pytest.skip("HYBRIDRANK_REAL_DATA is not set: real-data tests need the shared data folder "
                    "(CI sets it to ../shared/data)")
    path = Path(root)
    if not (path / "letor").is_dir():
        pytest.fail(f"HYBRIDRANK_REAL_DATA={root} does not hold letor/ (see data/README.md)")
    return path


def _compose(name: str = "config", *overrides: str):
    # the configs as installed (hybridrank.conf), exactly what the console scripts read
    with initialize_config_module("hybridrank.conf", version_base="1.3"):
        return compose(name, overrides=list(overrides))


@pytest.fixture(scope="session")
def compose_cfg():
    """``compose_cfg(name, *overrides)``: a project config (``config``, ``export``, ``eval``)
    composed in-process with hydra overrides, as the console scripts would."""
    return _compose


#: the shared small run (:func:`small_run`): the simulator's default log at 150 users, one epoch,
#: field calibration by item category, 60 bootstrap resamples for the intervals
SMALL_RUN = ("data.source.n_users=150", "trainer.max_epochs=1", "trainer.enable_progress_bar=false",
             "model.metrics.fields=[item_category]", "intervals.n_boot=60")


@pytest.fixture(scope="session")
def _small_run(tmp_path_factory):
    from hybridrank.cli.train import train

    out = tmp_path_factory.mktemp("small_run")
    cfg = _compose("config", f"paths.output_dir={out}", *SMALL_RUN)
    result = train(cfg)
    return {"result": result, "cfg": cfg, "out": out, "ckpt": Path(result["best_checkpoint"])}


@pytest.fixture
def small_run(_small_run):
    """One small model trained once per session in-process through the hydra config
    (:data:`SMALL_RUN`), for the tests that need a trained run rather than their own settings:
    ``{"result", "cfg", "out", "ckpt"}`` (``train``'s result, the composed config, the run folder,
    the kept checkpoint). A copy of the result each time; tests write only under their own
    ``tmp_path``, never into the run folder."""
    import copy

    return {**_small_run, "result": copy.deepcopy(_small_run["result"])}


@pytest.fixture(scope="session")
def cli_server():
    """The console scripts served by a fork server (tests/cli_server.py): a command pays the
    imports once per session instead of once per call. None where
    ``HYBRIDRANK_TEST_REAL_PROCESSES=1`` (then the real executables run)."""
    import cli_server as server_module

    server = server_module.start()
    yield server
    if server is not None:
        server.close()
