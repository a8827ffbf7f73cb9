"""Import allRank's loss functions for side-by-side benchmarks, without its heavy dependencies.

allRank (``pip install --no-deps allrank``) keeps its losses in ``allrank.models.losses``, but the
import chain behind them pulls in ``torchvision`` (data transforms), ``gcsfs`` and
``google.auth`` (Google Cloud paths) and ``pkg_resources`` (resource files), none of which a loss
uses. :func:`load_allrank_losses` puts small stand-in modules under those names *only when the
real ones are missing*, imports the losses, and returns them. It is a benchmarking aid of the
``scripts/`` folder: never imported by the package, never a dependency.

Import ``hybridrank`` (and with it torch, Lightning, torchmetrics) *before* calling it: those
libraries probe for ``torchvision`` on import, and must see the real state of the environment,
not a stand-in.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Any

#: Modules allRank imports at module level but its loss functions never use.
_STANDINS = ("torchvision", "torchvision.transforms", "gcsfs", "google", "google.auth",
             "pkg_resources")


def _standin(name: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__["__allrank_shim__"] = True

    def __getattr__(attr: str) -> Any:  # any name a module-level import asks for
        if attr.startswith("__"):
            raise AttributeError(attr)
        return type(attr, (), {"__init__": lambda self, *a, **k: None})

    mod.__getattr__ = __getattr__  # type: ignore[attr-defined]
    mod.__path__ = []  # a package, so that ``import google.auth`` finds a parent
    return mod


def _missing(name: str) -> bool:
    if name in sys.modules:
        return False
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):
        return True


def load_allrank_losses() -> types.ModuleType | None:
    """``allrank.models.losses`` if allRank is installed, else None.

    Stand-ins are registered only for the missing modules named in ``_STANDINS`` and removed
    again after the import, so nothing outside allRank ever sees them.
    """
    if importlib.util.find_spec("allrank") is None:
        return None
    added = [n for n in _STANDINS if _missing(n)]
    for name in added:
        sys.modules[name] = _standin(name)
    try:
        return importlib.import_module("allrank.models.losses")
    finally:
        for name in added:
            sys.modules.pop(name, None)
