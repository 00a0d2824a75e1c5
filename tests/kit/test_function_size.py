"""The shape of the code, function by function: none is longer than a screen.

Every function and method of ``project/``, ``grading/`` and ``common/`` (nested ones too) is at most
``MAX_LINES`` long, counted by ``ast`` from its ``def`` line to its last line (``end_lineno - lineno + 1``; its
decorators do not count). A function that must stay longer is named in ``EXCEPTIONS`` with the reason; an entry
whose function is gone or fits again fails the test too, so the list says only what is true today. Read from the
source (nothing is imported).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from common import ROOT
from tests.kit.test_layout import _modules

pytestmark = pytest.mark.kit

PACKAGES = ("project", "grading", "common")
MAX_LINES = 60
# "path/from/the/kit/root.py:qualified.name" -> why it stays longer than MAX_LINES
EXCEPTIONS: dict[str, str] = {}


def function_lengths(source: str) -> dict[str, int]:
    """``{qualified name: lines}`` of every function and method in ``source`` (``Class.method``, ``outer.inner``),
    from its ``def`` line to its last line, decorators left out."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found[prefix + child.name] = child.end_lineno - child.lineno + 1
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)
    visit(ast.parse(source), "")
    return found


def all_lengths(root: Path = ROOT) -> dict[str, int]:
    """``{"path.py:qualified.name": lines}`` for every function of ``PACKAGES`` under ``root`` (the modules
    ``test_layout`` walks)."""
    lengths = {}
    for path in _modules(root, PACKAGES).values():
        rel = path.relative_to(root).as_posix()
        lengths |= {f"{rel}:{name}": n for name, n in function_lengths(path.read_text()).items()}
    return lengths


def test_no_function_is_longer_than_60_lines():
    long = {name: n for name, n in all_lengths().items() if n > MAX_LINES and name not in EXCEPTIONS}
    found = ", ".join(f"{name} ({n})" for name, n in sorted(long.items()))
    assert not long, (f"functions over {MAX_LINES} lines (split each into parts named for what they do, or name it "
                      f"in EXCEPTIONS with the reason): {found}")


def test_every_exception_is_still_a_long_function():
    lengths = all_lengths()
    gone = sorted(name for name in EXCEPTIONS if name not in lengths)
    fits = sorted(f"{name} ({lengths[name]})" for name in EXCEPTIONS if lengths.get(name, 0) and
                  lengths[name] <= MAX_LINES)
    assert not gone, f"EXCEPTIONS names functions that no longer exist: drop them: {gone}"
    assert not fits, f"EXCEPTIONS names functions now at most {MAX_LINES} lines: drop them: {fits}"
    assert all(reason.strip() for reason in EXCEPTIONS.values()), "every exception says why"


def test_lengths_count_from_def_to_last_line_without_decorators():
    source = ("import functools\n\n\n@functools.cache\n@functools.wraps(print)\ndef f():\n    def g():\n"
              "        return 1\n    return g\n\n\nclass C:\n    @property\n    def m(self):\n        if self:\n"
              "            async def deep():\n                pass\n        return 2\n")
    assert function_lengths(source) == {"f": 4, "f.g": 2, "C.m": 5, "C.m.deep": 2}
