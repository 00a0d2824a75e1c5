"""The shape of the code (issue 19): layers that import one way, no import cycle, small modules.

Read from the source with ``ast`` (nothing is imported), so a cycle that only
bites at import time in some order is still found.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from grading import KIT_ROOT

pytestmark = pytest.mark.kit

PACKAGES = ("grading", "project")
MAX_LINES = 350
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
    """The kit modules that module ``name`` imports (at any depth of its code), resolved to known names."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):          # imports only for type checkers never run
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            node.body = []
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
    return {t for t in targets if t in known and t != name}


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
    # a package importing its own submodule is not a cycle (``grading`` -> ``grading.x`` -> ``grading``)
    real = [c for c in cycles if not any(a.startswith(b + ".") or b.startswith(a + ".") for a, b in zip(c, c[1:]))]
    assert not real, "import cycles:\n" + "\n".join(" -> ".join(c) for c in real)


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
    long = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_the_test_order_names_only_test_files_that_exist():
    """``tests/kit/conftest.py`` orders the run longest first; a renamed or removed file must leave its list."""
    from tests.kit.conftest import LONGEST_FIRST
    missing = [path for path in LONGEST_FIRST if not (KIT_ROOT / path).is_file()]
    assert not missing and len(set(LONGEST_FIRST)) == len(LONGEST_FIRST), missing
