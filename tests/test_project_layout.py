"""The shape of ``project/``: no import cycle, a contract on every public function,
one launcher and one place that joins a process group. Read from the source (no module is run)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
from common import ROOT

pytestmark = pytest.mark.kit

PROJECT = ROOT / "project"
MODULES = {(".".join(p.relative_to(ROOT).with_suffix("").parts)).removesuffix(".__init__"): p
           for p in sorted(PROJECT.rglob("*.py"))}


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _imports(name: str, path: Path) -> set[str]:
    """The project modules ``name`` imports anywhere (module level or inside functions)."""
    found = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in found if m in MODULES and m != name}


def test_project_has_no_import_cycle():
    graph = {name: _imports(name, path) - {"project"} for name, path in MODULES.items()}
    state: dict[str, int] = {}   # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for dep in sorted(graph[name]):
            if state.get(dep) == 1:
                cycle = path[path.index(dep):] + [dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep, [*path, dep])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_every_public_function_states_its_contract():
    missing = []
    for name, path in MODULES.items():
        def walk(nodes, prefix=""):
            for node in nodes:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                    if ast.get_docstring(node) is None:
                        missing.append(f"{name}.{prefix}{node.name}")
                elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                    if ast.get_docstring(node) is None:
                        missing.append(f"{name}.{node.name}")
                    walk(node.body, f"{node.name}.")
        walk(_tree(path).body)
    assert not missing, f"public functions without a docstring: {missing}"


def _uses(path: Path, names: set[str]) -> set[str]:
    """Which of ``names`` the module imports or calls as an attribute (e.g. ``dist.init_process_group``)."""
    used = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            used |= {a.name for a in node.names} & names
        elif isinstance(node, ast.ImportFrom) and node.module:
            used |= ({node.module} | {a.name for a in node.names}) & names
        elif isinstance(node, ast.Attribute) and node.attr in names:
            used.add(node.attr)
    return used


def test_rank_processes_start_in_one_launcher_and_join_their_group_in_one_place():
    """The launcher is ``project.launch`` plus how its ranks start (``project.rank_start``, used by it alone: a
    session of the fork server the grader's ranks start from, or a fresh interpreter); a rank joins its group in
    ``project.devices`` alone."""
    starters = {"multiprocessing", "torch.multiprocessing", "start_processes", "Process", "get_context", "Popen",
                "ServerSession", "start_server"}
    joiners = {"init_process_group", "setup_process_group"}
    assert {name for name, p in MODULES.items() if _uses(p, starters)} == {"project.rank_start"}
    assert {name for name, p in MODULES.items() if "project.rank_start" in _imports(name, p)} == {"project.launch"}
    assert {name for name, p in MODULES.items() if _uses(p, joiners)} == {"project.devices"}


def test_train_lib_is_gone_and_nothing_imports_it():
    assert "project.train_lib" not in MODULES
    readers = [p for p in [*ROOT.glob("scripts/*.py"), *ROOT.glob("tests/test_*.py"), *MODULES.values()]
               if "train_lib" in p.read_text() and p.name != Path(__file__).name]
    assert not readers, readers
