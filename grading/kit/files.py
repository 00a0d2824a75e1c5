"""Atomic file writes: the one helper every writer of the kit uses (grader, entry points, benchmarks).

A reader never sees a half-written file: the content goes to a temporary
name in the same folder (same file system), is flushed to disk, then
``os.replace``-d onto the final name in one step. A crash or a full disk
leaves the previous file (or none) and at most a ``.*.tmp`` leftover, never
a torn one. Plain standard library, so ``project`` may import it too.
"""
from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path


def _scratch(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on a clean exit it replaces ``path`` in one step.

    Whatever the block writes to the yielded path (a file, ``torch.save``, a
    whole folder) appears under ``path`` only if the block finishes; on an
    exception the temporary is removed and ``path`` is left as it was.
    ``path``'s folder must exist.
    """
    path = Path(path)
    scratch = _scratch(path)
    try:
        yield scratch
        if scratch.is_file():
            with open(scratch, "rb") as handle:
                os.fsync(handle.fileno())
        os.replace(scratch, path)
    except BaseException:
        if scratch.is_dir() and not scratch.is_symlink():
            import shutil
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                scratch.unlink()
        raise


def atomic_write(path: str | os.PathLike, data: bytes | str) -> Path:
    """Write ``data`` (bytes, or text as UTF-8) to ``path`` atomically; return ``path`` as a Path."""
    payload = data.encode() if isinstance(data, str) else data
    with atomic_path(path) as scratch:
        with open(scratch, "wb") as handle:
            handle.write(payload)
    return Path(path)
