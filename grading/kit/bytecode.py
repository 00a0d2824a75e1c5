"""Bytecode for a grading copy: its ranks load the copy's modules compiled, instead of each compiling them again.

``write_bytecode`` gives the copy's ``.py`` files checked-hash ``.pyc`` files (PEP 552). What a rank then runs is
the same code object an import would have compiled; a rank never shares anything else.
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

    An import uses such a ``.pyc`` only if the hash of the ``.py`` file next to it, read at import time, is the
    one it was compiled from, so a file changed afterwards (a test editing a region, say) is compiled from its
    new text. A file that does not compile gets none (its import reports the error, as without one); nothing is written
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
    """Write ``source``'s ``.pyc`` (compiled now, or kept from an earlier copy); 1 if written.

    A kept ``.pyc`` is found by the path in the copy and the whole source text, never by its 64-bit hash alone,
    which a crafted file could match."""
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
