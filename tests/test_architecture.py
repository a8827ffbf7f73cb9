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
    "lists": 0, "_dcg": 0, "atomic": 0, "_lazy": 0, "_device": 0,
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


# ----------------------------------------------------------------------------------------------
# No import circles between the package's modules
# ----------------------------------------------------------------------------------------------
def _import_graph(pkg: Path) -> dict[str, dict[str, str]]:
    """``{module: {imported module: "file:line"}}`` of the modules inside ``pkg``.

    Every import counts: module level, inside functions (lazy), under ``TYPE_CHECKING``. Absolute
    and relative imports are resolved; ``from package import submodule`` is an edge to the
    submodule, ``from module import name`` one to the module. Imports from outside ``pkg`` are
    left out.
    """
    root = pkg.name
    files = {}
    for path in sorted(pkg.rglob("*.py")):
        parts = list(path.relative_to(pkg.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        files[".".join(parts)] = path
    graph: dict[str, dict[str, str]] = {m: {} for m in files}
    for me, path in files.items():
        package = me if path.name == "__init__.py" else me.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    name = ".".join(base + ([node.module] if node.module else []))
                else:
                    name = node.module or ""
                subs = [f"{name}.{a.name}" for a in node.names if f"{name}.{a.name}" in files]
                targets = subs or [name]
            for name in targets:
                if name == root or name.startswith(root + "."):
                    while name not in files:  # ``import a.b.c`` of a name inside a module
                        name = name.rpartition(".")[0]
                    if name != me:
                        graph[me].setdefault(name, f"{path.relative_to(pkg.parent)}:{node.lineno}")
    return graph


def _import_cycles(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """One cycle ``[a, b, ..., a]`` per strongly connected component of more than one module
    (Tarjan's algorithm, iterative); the cycle is a shortest way back to the component's first
    module (breadth-first inside the component)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.add(m)
                    if m == node:
                        break
                if len(component) > 1:
                    components.append(component)
    cycles = []
    for component in components:
        first = min(component)
        came_from: dict[str, str] = {}
        queue = [first]
        while queue and first not in came_from:
            node = queue.pop(0)
            for child in sorted(graph[node]):
                if child in component and child not in came_from:
                    came_from[child] = node
                    queue.append(child)
        path, node = [first], came_from[first]
        while node != first:
            path.append(node)
            node = came_from[node]
        cycles.append([first, *reversed(path[1:]), first])
    return sorted(cycles)


def _describe(cycle: list[str], graph: dict[str, dict[str, str]]) -> str:
    return " -> ".join(cycle) + "  (" + ", ".join(
        graph[a][b] for a, b in zip(cycle, cycle[1:])) + ")"


def test_no_import_circles():
    """No module imports, directly or through others, a module that imports it (lazy imports and
    ``TYPE_CHECKING`` ones included): each concept sits above the ones it uses."""
    graph = _import_graph(PKG)
    cycles = _import_cycles(graph)
    assert not cycles, "import circles:\n" + "\n".join(_describe(c, graph) for c in cycles)


def test_import_circle_check_finds_lazy_and_relative_circles(tmp_path):
    """The check on a made-up package: a three-module circle closed by a lazy relative import, a
    two-module one under ``TYPE_CHECKING``, and imports that form no circle."""
    files = {
        "__init__.py": "",
        "a.py": "from pkg.b import f\n",
        "b.py": "def f():\n    from .sub import c\n    return c\n",
        "sub/__init__.py": "",
        "sub/c.py": "import pkg.a\nimport os\n",
        "d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import e\n",
        "e.py": "from . import d, leaf\n",
        "leaf.py": "import pkg\nfrom pkg.a import f\n",
    }
    for name, text in files.items():
        (tmp_path / "pkg" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / name).write_text(text)
    graph = _import_graph(tmp_path / "pkg")
    assert graph["pkg.b"] == {"pkg.sub.c": "pkg/b.py:2"}
    assert graph["pkg.leaf"] == {"pkg": "pkg/leaf.py:1", "pkg.a": "pkg/leaf.py:2"}
    assert _import_cycles(graph) == [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"], ["pkg.d", "pkg.e", "pkg.d"]]
    assert _describe(["pkg.d", "pkg.e", "pkg.d"], graph) == \
        "pkg.d -> pkg.e -> pkg.d  (pkg/d.py:3, pkg/e.py:1)"


def test_every_package_ships_in_the_wheel():
    """A package directory missing from pyproject's explicit ``packages`` list is left out of a
    regular (non-editable) install, which then fails at its first import."""
    import tomllib

    listed = set(tomllib.loads((PKG.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {_module_name(p) for p in PKG.rglob("__init__.py")} | {"hybridrank.conf"}
    assert found - listed == set(), f"packages missing from pyproject.toml: {sorted(found - listed)}"
    assert listed - found == set(), f"pyproject.toml lists packages that do not exist: {sorted(listed - found)}"
