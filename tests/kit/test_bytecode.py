"""``grading.kit.bytecode``: a grading copy's ranks load its modules compiled, and never code of another text.

Each check imports in a new interpreter, as a rank would; ``python -v`` says whether a module came from its
``.pyc`` ("code object from ...") or was compiled from its source.
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from common import ROOT
from grading.kit import bytecode
from grading.kit.submission import RANK_PACKAGES, build_grading_copy

pytestmark = pytest.mark.kit


def _package(root: Path, text: str) -> Path:
    """``root/pkg/mod.py`` holding ``text`` (and an empty ``__init__.py``); returns the module's path."""
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "mod.py").write_text(text)
    return root / "pkg" / "mod.py"


def _import(root: Path, module: str = "pkg.mod") -> tuple[str, bool]:
    """(what ``import MODULE`` in a new interpreter in ``root`` printed, on stdout or as an error; whether the
    module was loaded from its ``.pyc``)."""
    done = subprocess.run([sys.executable, "-v", "-c", f"import {module}"], cwd=root, capture_output=True,
                          text=True, timeout=60)
    pyc = importlib.util.cache_from_source(str(root / (module.replace(".", "/") + ".py")))
    error = done.stderr[done.stderr.find("Traceback"):] if done.returncode else ""
    return done.stdout + error, f"code object from '{pyc}'" in done.stderr


def test_a_grading_copy_carries_bytecode_for_what_ranks_import_only(tmp_path):
    copy = tmp_path / "kit"
    build_grading_copy(ROOT, ROOT, copy)
    for package in RANK_PACKAGES:
        for source in (copy / package).rglob("*.py"):
            assert Path(importlib.util.cache_from_source(str(source))).is_file(), source
    assert not list((copy / "tests").rglob("*.pyc")) and not list((copy / "project").rglob("*.pyc"))
    assert _import(copy, "data_parallel.dataset") == ("", True)


def test_an_import_runs_the_text_the_file_holds_even_after_an_edit(tmp_path):
    source = _package(tmp_path, "VALUE = 1\nprint(VALUE)\n")
    assert bytecode.write_bytecode(tmp_path, ("pkg",)) == 2
    assert _import(tmp_path) == ("1\n", True)
    source.write_text("VALUE = 2\nprint(VALUE)\n")          # same size, edited after the bytecode was written
    assert _import(tmp_path) == ("2\n", False)


def test_the_same_path_with_another_text_gets_its_own_bytecode(tmp_path):
    """Kept by the whole text: a second copy whose file differs (a student's region) never runs the first's code,
    and a copy with the first's text again gets it back (from what this process kept)."""
    for name, text in (("a", "print('first')\n"), ("b", "print('second')\n"), ("c", "print('first')\n")):
        _package(tmp_path / name, text)
        bytecode.write_bytecode(tmp_path / name, ("pkg",))
        assert _import(tmp_path / name) == (text[7:-3] + "\n", True), name


def test_a_traceback_names_the_file_of_the_copy_that_ran(tmp_path):
    """Bytecode kept from one copy and written into another still reports the other's path and line."""
    text = "def boom():\n    raise ValueError('x')\n"
    for name in ("one", "two"):
        _package(tmp_path / name, text)
        bytecode.write_bytecode(tmp_path / name, ("pkg",))
    done = subprocess.run([sys.executable, "-c", "import pkg.mod; pkg.mod.boom()"], cwd=tmp_path / "two",
                          capture_output=True, text=True, timeout=60)
    assert f'File "{tmp_path / "two" / "pkg" / "mod.py"}", line 2, in boom' in done.stderr, done.stderr


def test_a_file_that_does_not_compile_gets_none_and_its_import_fails_as_before(tmp_path):
    source = _package(tmp_path, "def broken(:\n")
    assert bytecode.write_bytecode(tmp_path, ("pkg",)) == 1              # __init__.py only
    assert not Path(importlib.util.cache_from_source(str(source))).exists()
    out, from_pyc = _import(tmp_path)
    assert "SyntaxError" in out and not from_pyc


def test_nothing_is_written_where_python_keeps_bytecode_elsewhere(tmp_path, monkeypatch):
    _package(tmp_path / "kit", "X = 1\n")
    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path / "prefix"))
    assert bytecode.write_bytecode(tmp_path / "kit", ("pkg",)) == 0
    assert not list(tmp_path.rglob("*.pyc"))
