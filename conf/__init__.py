"""hybridrank's hydra configs, installed as the package ``hybridrank.conf`` (read through
``pkg://hybridrank.conf``). Edit the YAML files.

Importing the package (hydra does, to read the configs) registers the resolver
``${hybridrank.real_data:}`` that ``paths.data_dir`` uses: the shared real data folder
(:func:`real_data_dir`).
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


if not OmegaConf.has_resolver("hybridrank.real_data"):
    OmegaConf.register_new_resolver("hybridrank.real_data", real_data_dir)
