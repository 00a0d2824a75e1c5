"""Bytecode for a grading copy: its ranks load the copy's modules compiled, instead of each compiling them again.

A grading copy is new for every grade and has no ``__pycache__``; every rank
imports the worker, its case's checks and the student packages from it, and
would compile each of them from source: Python writes no bytecode under
``PYTHONDONTWRITEBYTECODE``, and where it may, ranks that start together each
compile before any has written it.

``write_bytecode`` gives the copy's ``.py`` files under the packages named
a *checked-hash* ``.pyc`` (PEP 552): an import uses it only if the hash of
the ``.py`` file next to it, read at import time, is the one it was
compiled from, so a file changed afterwards (a test editing a region, say)
is compiled from its new text as before. A file compiled once is kept in
this process (by path in the copy and the whole source text, never by its
64-bit hash alone, which a crafted file could match), so later copies of
the same kit cost one write a file. What a rank then runs is the same code
object an import would have compiled; a rank never shares anything else.
"""
from __future__ import annotations

import importlib.util
import py_compile
import sys
from pathlib import Path

MAX_KEPT = 4096                              # files kept compiled in this process (a few MB of bytecode)
_KEPT: dict[tuple[str, bytes], bytes] = {}   # (path in the copy, source text) -> the .pyc file's bytes


def write_bytecode(root: Path, packages: tuple[str, ...]) -> int:
    """Write a checked-hash ``.pyc`` into ``__pycache__`` for every ``.py`` file under ``root/<package>``; return
    how many were written.

    A file that does not compile gets none (its import reports the error, as before); nothing is written
    where Python keeps bytecode outside the source tree (``sys.pycache_prefix``). Never raises for a file.
    """
    if sys.pycache_prefix is not None:
        return 0
    root, written = Path(root), 0
    for package in packages:
        for source in sorted((root / package).rglob("*.py")):
            try:
                written += _write_one(root, source)
            except (OSError, ValueError, RecursionError, MemoryError, py_compile.PyCompileError):
                continue
    return written


def _write_one(root: Path, source: Path) -> int:
    """Write ``source``'s ``.pyc`` (compiled now, or kept from an earlier copy); 1 if written."""
    data = source.read_bytes()
    key = (source.relative_to(root).as_posix(), data)
    target = Path(importlib.util.cache_from_source(str(source)))
    kept = _KEPT.get(key)
    if kept is not None:
        target.parent.mkdir(exist_ok=True)
        target.write_bytes(kept)
        return 1
    py_compile.compile(str(source), cfile=str(target), doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    if len(_KEPT) >= MAX_KEPT:
        _KEPT.clear()
    _KEPT[key] = target.read_bytes()
    return 1
