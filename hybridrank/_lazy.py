"""Lazy re-exports for package ``__init__`` files (PEP 562).

``import hybridrank`` (or ``hybridrank.data.libsvm``) must not import torch and Lightning: a
reader, a score-file tool or a test in a memory-limited child process should pay only for what it
uses. A package lists its public names and the module defining each; the module is imported on
first access, and the value is cached in the package namespace.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(namespace: dict[str, Any], exports: Mapping[str, str]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for a package whose public ``name`` lives in ``exports[name]``.

    >>> ns = {"__name__": "pkg"}
    >>> get, names = lazy_exports(ns, {"sqrt": "math"})
    >>> get("sqrt")(4.0), "sqrt" in ns
    (2.0, True)
    """
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
