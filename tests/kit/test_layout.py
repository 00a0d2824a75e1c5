"""The shape of the code (issues 19, 36): layers that import one way, no import cycle, small modules.

Read from the source with ``ast`` (nothing is imported), so a cycle that only
bites at import time in some order is still found. Every import counts: at
module level, inside a function, and under ``TYPE_CHECKING`` (a type-only
import still ties the two modules together for a reader). The one edge left
out is a module importing a package it lives in (``grading.engine.x`` ->
``grading.engine``): that package is being imported already.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from grading import KIT_ROOT

pytestmark = pytest.mark.kit

PACKAGES = ("grading", "project")
MAX_LINES = 350
# modules whose one concept needs more room (at most ONE_CONCEPT_MAX_LINES), and why
ONE_CONCEPT = {"grading.problems.p2_2_pipe.checks": "one case: Pipe's probe and the criteria that read its parts"}
ONE_CONCEPT_MAX_LINES = 450
# grading's layers: a module of a layer may import its own layer and those to its right.
LAYERS = ("grading.commands", "grading.problems", "grading.kit", "grading.engine")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((KIT_ROOT / package).rglob("*.py")):
            rel = path.relative_to(KIT_ROOT)
            if "pristine" in rel.parts or "__pycache__" in rel.parts:
                continue
            name = ".".join(rel.with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The kit modules that module ``name`` imports (anywhere in its code), resolved to known names; not the
    packages ``name`` itself lives in."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            targets.add(base)
            targets.update(f"{base}.{alias.name}" for alias in node.names)
    return {t for t in targets if t in known and t != name and not name.startswith(t + ".")}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def _layer(name: str) -> int | None:
    return next((k for k, layer in enumerate(LAYERS) if name == layer or name.startswith(layer + ".")), None)


def test_no_import_cycle_in_grading_or_project():
    graph = _graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt] if nxt in stack else [node, nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2
    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_project_never_imports_the_grader_engine():
    """The student-facing entry points share modules with the grader (``grading.startup``, ``grading.rank_reports``)
    that import nothing of the kit; none of them imports the engine."""
    graph = _graph()
    offenders = {name: sorted(t for t in targets if t.startswith("grading.engine"))
                 for name, targets in graph.items() if name.startswith("project")}
    assert not {k: v for k, v in offenders.items() if v}
    assert graph["grading.startup"] == set() and graph["grading.rank_reports"] == set()


def test_grading_never_imports_project():
    offenders = {name: sorted(t for t in targets if t.startswith("project"))
                 for name, targets in _graph().items() if name.startswith("grading")}
    assert not {k: v for k, v in offenders.items() if v}


def test_grading_layers_import_downwards_only():
    """commands -> problems -> kit -> engine: the engine knows nothing of the kit, the kit nothing of commands."""
    wrong = []
    for name, targets in _graph().items():
        mine = _layer(name)
        if mine is None:
            continue
        for target in targets:
            theirs = _layer(target)
            if theirs is not None and theirs < mine:
                wrong.append(f"{name} imports {target}")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_module_over_the_size_limit():
    modules = _modules()
    long = {name: n for name, path in modules.items() if (n := len(path.read_text().splitlines()))
            > (ONE_CONCEPT_MAX_LINES if name in ONE_CONCEPT else MAX_LINES)}
    assert not long, f"modules over {MAX_LINES} lines ({ONE_CONCEPT_MAX_LINES} for ONE_CONCEPT): {long}"
    assert set(ONE_CONCEPT) <= set(modules), sorted(set(ONE_CONCEPT) - set(modules))


def test_no_two_modules_named_apart_by_a_plural():
    """``forkserver`` next to ``forkservers`` says nothing about which holds what: name the concept instead."""
    pairs = []
    for name in _modules():
        package, _, stem = name.rpartition(".")
        pairs += [f"{name} / {package}.{stem}{end}" for end in ("s", "es") if f"{package}.{stem}{end}" in _modules()]
    assert not pairs, pairs
