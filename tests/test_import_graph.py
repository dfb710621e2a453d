"""The package's import graph: every module imports, and no two modules reach each other, nor two packages
(DESIGN.md: imports only point down). Counted from the source, so imports inside functions and
``importlib.import_module("anysr...")`` count as much as the ones at the top of a file: a cycle is a layering
decision to make, not an import to hide."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "anysr"
# DESIGN.md's layers, top first: a package imports only packages in layers below its own (or its own layer's
# siblings, without a cycle).
LAYERS = (
    ("anysr.cli", "anysr.__main__", "anysr.train", "anysr.test", "anysr.plugins"),
    ("anysr.options",),
    ("anysr.engine",),
    ("anysr.models",),
    ("anysr.archs", "anysr.losses", "anysr.metrics"),
    ("anysr.data",),
    ("anysr.accelerators",),
    ("anysr.ops",),
    ("anysr.atomic", "anysr.tree", "anysr.registry", "anysr.presets", "anysr.errors", "anysr.download",
     "anysr.dataset_sources", "anysr"),
)
# modules that exist to wrap an optional dependency
OPTIONAL = {"anysr.accelerators.xla": "torch_xla", "anysr.accelerators.xla_torchax": "torchax"}
NOT_IMPORTED = {"anysr.__main__"}  # runs the CLI when imported


def _modules() -> dict[str, Path]:
    mods = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _owner(name: str, mods: dict[str, Path]) -> str | None:
    """The module a dotted name lives in (``anysr.a.b.func`` -> ``anysr.a.b``)."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """module -> the anysr modules it imports anywhere in its source (functions included, and string names of
    modules, as ``importlib.import_module`` and lazy export tables use them). A submodule's import of its own
    parent package is left out: Python imports the parent first in any case."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        targets: list[str] = []
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(parent + ([base] if base else []))
                targets += [base] + [f"{base}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in mods:
                targets.append(node.value)
        for target in targets:
            dep = _owner(target, mods) if target.startswith("anysr") else None
            if dep and dep != mod and not (mod.startswith(dep + ".") and mods[dep].name == "__init__.py"):
                graph[mod].add(dep)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_graph_sees_imports_inside_functions() -> None:
    graph = import_graph()
    assert "anysr.options" in graph["anysr.cli"]  # imported inside the command functions
    assert "anysr.accelerators.base" in graph["anysr.accelerators"]  # named in the lazy export table


def test_no_import_cycles() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles (in-function imports included):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_imports_point_down_the_layers() -> None:
    rank = {pkg: depth for depth, layer in enumerate(LAYERS) for pkg in layer}
    top = {m: ".".join(m.split(".")[:2]) for m in _modules()}
    assert set(top.values()) <= set(rank), f"packages missing from LAYERS: {set(top.values()) - set(rank)}"
    upward = [f"{mod} -> {dep}" for mod, deps in import_graph().items() for dep in sorted(deps)
              if rank[top[dep]] < rank[top[mod]]]
    assert not upward, "imports that point up DESIGN.md's layers:\n" + "\n".join(upward)


@pytest.mark.parametrize("name", sorted(set(_modules()) - NOT_IMPORTED))
def test_every_module_imports(name: str) -> None:
    needs = OPTIONAL.get(name)
    if needs and importlib.util.find_spec(needs) is None:
        pytest.skip(f"{name} wraps {needs}, not installed here")
    importlib.import_module(name)



def package_graph(graph: dict[str, set[str]], packages: set[str] | None = None) -> dict[str, set[str]]:
    """The module graph folded onto packages: a module counts as its package (``anysr.data.degradation.jpeg`` ->
    ``anysr.data.degradation``; ``packages``: the names that are packages, by default the ones with an
    ``__init__.py``). The modules directly under ``anysr/`` stay separate nodes (they are DESIGN.md's top and bottom
    layers, not one room). A package importing its own sub-package is an edge like any other, so ``data`` importing
    ``data.degradation`` while ``data.degradation`` imports ``data.transforms`` is a loop."""
    if packages is None:
        packages = {m for m, path in _modules().items() if path.name == "__init__.py"}

    def node(mod: str) -> str:
        package = mod if mod in packages else mod.rpartition(".")[0]
        return mod if package == "anysr" else package

    folded: dict[str, set[str]] = {}
    for mod, deps in graph.items():
        folded.setdefault(node(mod), set()).update(node(d) for d in deps)
    for pkg, deps in folded.items():
        deps.discard(pkg)
    return folded


def test_package_graph_finds_a_loop_through_a_sub_package() -> None:
    packages = {"anysr", "anysr.data", "anysr.data.degradation"}
    graph = {"anysr.data": {"anysr.data.degradation.b"}, "anysr.data.degradation.b": {"anysr.data.c"},
             "anysr.data.c": {"anysr.errors"}, "anysr.data.degradation": set(), "anysr.errors": set(),
             "anysr.cli": {"anysr.data"}}
    folded = package_graph(graph, packages)
    assert folded["anysr.data"] == {"anysr.data.degradation", "anysr.errors"}
    assert folded["anysr.data.degradation"] == {"anysr.data"}
    assert folded["anysr.cli"] == {"anysr.data"}  # modules under anysr/ stay themselves
    assert cycles(folded) == [["anysr.data", "anysr.data.degradation"]]
    graph["anysr.data.degradation.b"] = {"anysr.errors"}
    assert cycles(package_graph(graph, packages)) == []


def test_no_package_level_import_cycles() -> None:
    found = cycles(package_graph(import_graph()))
    assert not found, ("package-level import cycles (a module counted as its package):\n"
                       + "\n".join(" <-> ".join(c) for c in found))


def test_recognition_modules_keep_their_former_names() -> None:
    """archs/recognition/ holds weight recognition; ``anysr.archs.recognise`` (and recognise_util, layouts)
    still import, as the same modules."""
    for name in ("recognise", "recognise_util", "layouts"):
        old = importlib.import_module(f"anysr.archs.{name}")
        assert old is importlib.import_module(f"anysr.archs.recognition.{name}")
    from anysr.archs.recognise import register_recogniser  # noqa: PLC0415 - the former path, as code wrote it

    assert register_recogniser is importlib.import_module("anysr.archs.recognition.recognise").register_recogniser
