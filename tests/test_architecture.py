"""The package's layering: sub-packages by concept, imports pointing one way, no circles.

Every ``hybridrank`` import of every module (lazy ones inside functions included) is read with
``ast`` and checked against the layer order of docs/ARCHITECTURE.md: a module may import its own
sub-package and the layers below it, never a layer above.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "hybridrank"

#: lower number = lower layer; a module imports only its own layer's package and lower layers
LAYERS = {
    "lists": 0, "_dcg": 0, "atomic": 0, "_lazy": 0,
    "conf": 0,  # the configs (conf/, installed as hybridrank.conf) and their data-folder resolver
    "data": 1, "losses": 1,
    "metrics": 2,
    "models": 3,
    "serving": 4,
    "evaluation": 5,
    "cli": 6,
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _unit(module: str) -> str | None:
    """The layer unit of ``hybridrank.<unit>...`` (None for the package root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    me = _module_name(path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("hybridrank")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = me.split(".")[: len(me.split(".")) - node.level + (1 if path.name == "__init__.py" else 0)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.startswith("hybridrank"):
                out.append((node.lineno, name))
    return out


MODULES = sorted(p for p in PKG.rglob("*.py") if "conf" not in p.relative_to(PKG).parts[:1])


def test_every_unit_has_a_layer():
    units = {_unit(_module_name(p)) for p in MODULES} - {None}
    assert units <= set(LAYERS), f"modules outside the layer table: {units - set(LAYERS)}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PKG)))
def test_imports_point_down(path):
    me = _unit(_module_name(path))
    if me is None:  # hybridrank/__init__.py re-exports everything (lazily)
        return
    for line, name in _imports(path):
        other = _unit(name)
        if other is None:
            assert name == "hybridrank" and me != "lists", f"{path.name}:{line} imports the package root"
            continue
        assert LAYERS[other] < LAYERS[me] or other == me, (
            f"{path.relative_to(PKG)}:{line} imports {name}: layer {other} ({LAYERS[other]}) is not "
            f"below {me} ({LAYERS[me]})")


def test_importing_the_package_or_a_reader_does_not_import_torch():
    """The lazy re-exports keep ``import hybridrank`` (and the readers, score-file tools) cheap:
    no torch, no Lightning until a model is used."""
    import subprocess
    import sys

    code = ("import sys, hybridrank, hybridrank.data, hybridrank.data.libsvm, hybridrank.data.readers, "
            "hybridrank.data.worlds; print(sorted(m for m in ('torch', 'pytorch_lightning') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
