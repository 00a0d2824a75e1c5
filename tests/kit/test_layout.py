"""The shape of the code: layers that import one way, no import cycle (function size: test_function_size.py).

Read from the source with ``ast`` (nothing is imported), so a cycle that only
bites at import time in some order is still found. Every import counts: at
module level, inside a function, under ``TYPE_CHECKING`` (a type-only import
still ties the two modules together for a reader), and ``importlib.import_module``
/ ``__import__`` of a constant name. The dependency rule follows imports through
every in-repo module, so ``project -> common -> grading`` is caught like a direct
import. The one edge left out of the graph is a module importing a package it
lives in (``grading.engine.x`` -> ``grading.engine``): that package is being
imported already.
"""
from __future__ import annotations

import ast
import sys
import textwrap
from fnmatch import fnmatch
from pathlib import Path

import pytest

from common import ROOT
from common.regions import STUDENT_PACKAGES

pytestmark = pytest.mark.kit

PACKAGES = ("common", "grading", "project")
IN_REPO = (*PACKAGES, *STUDENT_PACKAGES)       # every in-repo package an import chain may pass through
# ARCHITECTURE.md: dependencies run one way. A module of a key reaches no module of its value's packages, directly
# or through any chain of in-repo imports; ``common`` lies below both sides. (grading may import project only
# where the README documents it: nowhere today, so no exception is listed.)
NEVER_REACHES = {"project": ("grading",), "grading": ("project",), "common": ("grading", "project"),
                 **{package: ("common", "grading", "project") for package in STUDENT_PACKAGES}}
# grading's layers, then common below them: a module of a layer may import its own layer and those to its right.
# ``grading.check``: the one surface through which the problem folders import kit and engine (SURFACE_EXEMPT).
LAYERS = ("grading.commands", "grading.problems", "grading.check", "grading.kit", "grading.engine", "grading.sandbox",
          "common")


def _modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root)
            if "pristine" in rel.parts or "__pycache__" in rel.parts:
                continue
            name = ".".join(rel.with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _by_name(node: ast.AST) -> str | None:
    """The constant module name of ``importlib.import_module("x")`` / ``import_module("x")`` / ``__import__("x")``."""
    if not isinstance(node, ast.Call) or not node.args or not isinstance(node.args[0], ast.Constant):
        return None
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    name = node.args[0].value
    return name if called in ("import_module", "__import__") and isinstance(name, str) else None


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The kit modules that module ``name`` imports (anywhere in its code), resolved to known names (a name that
    is not a module counts as the nearest module above it); not the packages ``name`` itself lives in."""
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
        elif by_name := _by_name(node):
            targets.add(by_name)
    resolved = set()
    for target in targets:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target:
            resolved.add(target)
    return {t for t in resolved if t != name and not name.startswith(t + ".")}


def _graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    modules = _modules(root, packages)
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def dependency_violations(root: Path = ROOT) -> list[str]:
    """Every import chain (``a -> b -> c``) by which a module reaches a package ``NEVER_REACHES`` forbids it, one
    shortest chain per (module, forbidden package); importing a module imports the packages above it too."""
    graph = _graph(root, IN_REPO)
    found = []
    for start in sorted(graph):
        forbidden = NEVER_REACHES.get(start.partition(".")[0], ())
        paths, queue, reported = {start: [start]}, [start], set()
        while queue:
            node = queue.pop(0)
            top = node.partition(".")[0]
            if top in forbidden and top not in reported:
                reported.add(top)
                found.append(" -> ".join(paths[node]))
            parents = [node.rsplit(".", k)[0] for k in range(1, node.count(".") + 1)]
            for nxt in sorted(graph.get(node, set()) | {p for p in parents if p in graph}):
                if nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    queue.append(nxt)
    return found


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


def test_dependencies_run_one_way():
    """project never reaches grading, grading never reaches project, common and the student packages reach
    neither, by any import anywhere in the code, directly or through other in-repo modules."""
    wrong = dependency_violations()
    assert not wrong, "imports against the dependency rule (ARCHITECTURE.md):\n" + "\n".join(wrong)


# what common/ may import besides the standard library: psutil reads the process trees the rank watchdog samples
COMMON_MAY_IMPORT = ("psutil",)


def test_common_imports_the_standard_library_only():
    outside = []
    for name, path in _modules(packages=("common",)).items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                       [node.module] if isinstance(node, ast.ImportFrom) and not node.level else [])
            outside += [f"{name} imports {target}" for target in targets
                        if target.partition(".")[0] not in (*sys.stdlib_module_names, "common", *COMMON_MAY_IMPORT)]
    assert not outside, outside


PLANTED = {   # a violation hidden the ways the checker must see through -> the chain it must report
    "function level": ({"project/run.py": "def main():\n    import grading.kit.seams\n"},
                       "project.run -> grading.kit.seams"),
    "TYPE_CHECKING, through common": (
        {"project/run.py": "from common import files\n",
         "common/files.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from grading.kit import seams\n"},
        "project.run -> common.files -> grading.kit"),
    "by name, relative": ({"project/run.py": "from .helpers import x\n",
                           "project/helpers.py": "import importlib\nx = importlib.import_module('grading.kit')\n"},
                          "project.run -> project.helpers -> grading.kit"),
    "grading reaches project": ({"grading/kit/seams.py": "def f():\n    __import__('project.run')\n"},
                                "grading.kit.seams -> project.run"),
}


@pytest.mark.parametrize("case", sorted(PLANTED))
def test_the_dependency_check_finds_a_planted_violation(tmp_path, case):
    files, chain = PLANTED[case]
    base = {f"{package}/__init__.py": "" for package in ("common", "grading", "grading/kit", "project")}
    for rel, text in {**base, "grading/kit/seams.py": "", "project/run.py": "", **files}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(textwrap.dedent(text))
    assert chain in dependency_violations(tmp_path)


def test_grading_layers_import_downwards_only():
    """commands -> problems -> check -> kit -> engine -> sandbox -> common: each knows nothing of the layers above
    it."""
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


def test_no_two_modules_named_apart_by_a_plural():
    """``forkserver`` next to ``forkservers`` says nothing about which holds what: name the concept instead."""
    pairs = []
    for name in _modules():
        package, _, stem = name.rpartition(".")
        pairs += [f"{name} / {package}.{stem}{end}" for end in ("s", "es") if f"{package}.{stem}{end}" in _modules()]
    assert not pairs, pairs


# The problem folders import the grader through ``grading.check`` only; these modules of grading/problems (names or
# patterns) may import the layers themselves, and why.
SURFACE_EXEMPT = {"grading.problems": "discovery: finds the folders and loads their cases for the commands",
                  "grading.problems.probe_helpers": "the folders' shared helpers, built on the layers",
                  "*.variants": "buggy variants, staff tooling over grading.commands.variants"}
BEHIND_THE_SURFACE = ("grading.kit", "grading.engine", "grading.sandbox", "grading.commands")


def surface_violations(root: Path = ROOT) -> list[str]:
    """``module imports target`` for every import (anywhere in its code, by name too) by which a module of
    grading/problems, other than ``SURFACE_EXEMPT``'s, reaches past ``grading.check`` into a layer."""
    modules = _modules(root, ("grading",))
    found = []
    for name, path in modules.items():
        if not name.startswith("grading.problems") or any(fnmatch(name, exempt) for exempt in SURFACE_EXEMPT):
            continue
        found += [f"{name} imports {target}" for target in sorted(_imports(name, path, set(modules)))
                  if target.startswith(tuple(f"{layer}." for layer in BEHIND_THE_SURFACE)) or
                  target in BEHIND_THE_SURFACE]
    return found


def test_problem_folders_import_the_grader_from_grading_check():
    wrong = surface_violations()
    assert not wrong, ("import these from grading.check (the check author's surface; add a name there when a "
                       "folder needs one):\n" + "\n".join(wrong))


SURFACE_PLANTED = {   # an import past the surface, hidden as the checker must still see it -> what it reports
    "function level": ("def probe(ctx):\n    from grading.kit import seams\n",
                       "grading.problems.p9_1_x.checks imports grading.kit.seams"),
    "plain import": ("import grading.engine.expect\n", "grading.problems.p9_1_x.checks imports grading.engine.expect"),
    "relative": ("from ...engine.expect import expect\n",
                 "grading.problems.p9_1_x.checks imports grading.engine.expect"),
    "by name": ("import importlib\nrubric = importlib.import_module('grading.engine.rubric')\n",
                "grading.problems.p9_1_x.checks imports grading.engine.rubric"),
}


@pytest.mark.parametrize("case", sorted(SURFACE_PLANTED))
def test_the_surface_check_finds_a_planted_import(tmp_path, case):
    text, found = SURFACE_PLANTED[case]
    files = {f"{package}/__init__.py": "" for package in ("grading", "grading/kit", "grading/engine",
                                                          "grading/problems", "grading/problems/p9_1_x")}
    files.update({"grading/kit/seams.py": "", "grading/engine/expect.py": "", "grading/engine/rubric.py": "",
                  "grading/check.py": "from grading.kit.seams import *\n",
                  "grading/problems/p9_1_x/variants.py": "from grading.kit import seams\n",      # exempt
                  "grading/problems/p9_1_x/checks.py": "from grading.check import expect\n" + text})
    for rel, body in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(body)
    wrong = surface_violations(tmp_path)
    assert found in wrong and all(line.startswith("grading.problems.p9_1_x.checks ") for line in wrong), wrong
