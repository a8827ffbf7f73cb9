"""hybridrank's hydra configs, installed as the package ``hybridrank.conf`` (read through
``pkg://hybridrank.conf``). Edit the YAML files.

Importing the package (hydra does, to read the configs) registers the resolver
``${hybridrank.real_data:}`` that ``paths.data_dir`` uses: the shared real data folder
(:func:`real_data_dir`), and ``${hybridrank.scaled_lr:lr,budget,reference,rule}``, the
learning rate of large batches (:func:`scaled_lr`) that ``trainer=gpu`` uses.
"""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import OmegaConf

#: the environment variable that points at the shared real data (LETOR, MSLR, Open Bandit)
REAL_DATA_ENV = "HYBRIDRANK_REAL_DATA"


def real_data_dir() -> str:
    """``$HYBRIDRANK_REAL_DATA``; else ``shared/data`` beside the checkout (``../shared/data``
    relative to the repository, wherever the command runs); else, for an installed wheel,
    ``../shared/data`` relative to the working directory."""
    env = os.environ.get(REAL_DATA_ENV)
    if env:
        return env
    repo = Path(__file__).resolve().parents[1]  # conf/ sits at the repository's top level
    if (repo / "pyproject.toml").is_file():
        return str(repo.parent / "shared" / "data")
    return "../shared/data"


#: ``rule`` -> exponent ``p`` of :func:`scaled_lr`
LR_RULES = {"none": 0.0, "sqrt": 0.5, "linear": 1.0}


def scaled_lr(lr: float, budget: int, reference: int = 4096, rule: str = "sqrt") -> float:
    """The learning rate for batches of ``budget`` impressions: ``lr * (budget / reference) ** p``.

    ``p`` is 0.5 for ``rule="sqrt"`` (square-root scaling, the rule that keeps Adam's update
    noise per impression seen about constant), 1 for ``linear`` (the SGD rule), 0 for ``none``.
    At ``budget == reference`` it returns ``lr`` exactly. ``${hybridrank.scaled_lr:lr,budget,
    reference,rule}`` in a config (conf/trainer/gpu.yaml).

    Args:
        lr: the learning rate at the reference budget.
        budget: impressions per training batch (``data.budget``).
        reference: the budget ``lr`` was chosen at (the CPU preset's 4,096).
        rule: ``sqrt``, ``linear`` or ``none``.

    Returns:
        The scaled learning rate.
    """
    if rule not in LR_RULES:
        raise ValueError(f"hybridrank.scaled_lr: rule must be one of {list(LR_RULES)}, got {rule!r}")
    for name, value in (("lr", lr), ("budget", budget), ("reference", reference)):
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ValueError(f"hybridrank.scaled_lr: {name} must be a number > 0, got {value!r}")
    if budget == reference or rule == "none":
        return float(lr)
    return float(lr) * (float(budget) / float(reference)) ** LR_RULES[rule]


if not OmegaConf.has_resolver("hybridrank.real_data"):
    OmegaConf.register_new_resolver("hybridrank.real_data", real_data_dir)
if not OmegaConf.has_resolver("hybridrank.scaled_lr"):
    OmegaConf.register_new_resolver("hybridrank.scaled_lr", scaled_lr)
