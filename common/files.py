"""Atomic file writes: the one helper every writer of the kit uses (grader, entry points, benchmarks).

A reader never sees a half-written file: the content goes to a temporary name in the same folder, is flushed to
disk, then ``os.replace``-d onto the final name in one step, so a crash or a full disk leaves the previous file
(or none) and at most a ``.*.tmp`` leftover. Appended logs (``metrics.jsonl``, the benchmark's ``runs.jsonl``)
are read with ``read_jsonl``.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
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


def read_jsonl(path: str | os.PathLike) -> tuple[list, list[str]]:
    """``(records, warnings)`` of a JSON-lines file, tolerant of what a killed or full-disk writer leaves.

    Blank lines are ignored. A line that is not JSON is skipped with one
    warning naming the file and the line: a torn final line (the writer was
    stopped mid-line) or a damaged line elsewhere; every other line is read.
    A missing or unreadable file gives no records and one warning.
    """
    path = Path(path)
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return [], [f"{path}: cannot read it ({exc.strerror or exc}); skipped"]
    records, warnings = [], []
    last = max((n for n, line in enumerate(lines) if line.strip()), default=-1)
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError:
            what = ("is torn (the run stopped while writing it)" if n == last
                    else "is not JSON (damaged)")
            warnings.append(f"{path}: line {n + 1} {what}; skipped it, read the rest")
    return records, warnings


def read_json(path: str | os.PathLike) -> tuple[object, str | None]:
    """``(data, None)`` of a JSON file, or ``(None, warning)`` when it is missing, unreadable or not JSON."""
    path = Path(path)
    try:
        return json.loads(path.read_text()), None
    except OSError as exc:
        return None, f"{path}: cannot read it ({exc.strerror or exc}); skipped"
    except ValueError as exc:
        return None, f"{path}: not valid JSON ({exc}); skipped"


def read_regular(path: str | os.PathLike, offset: int = 0, limit: int | None = None,
                 tail: int | None = None) -> bytes:
    """The bytes of a regular file another process (a rank: hostile) wrote, never through a link: from byte
    ``offset`` on, at most ``limit`` of them, or only its last ``tail`` bytes. OSError when it is missing, a
    symbolic link (a rank could point one at a file only the reader may read) or not a regular file (a pipe that
    would block the reader)."""
    with open(_open_regular(path, os.O_RDONLY), "rb") as stream:
        if tail is not None:
            offset = max(offset, stream.seek(0, os.SEEK_END) - tail)
        stream.seek(offset)
        return stream.read() if limit is None else stream.read(limit)


def append_regular(path: str | os.PathLike):
    """A line-buffered text stream appending to ``path`` (created if missing), never through a link; OSError where
    ``path`` is a symbolic link or not a regular file (a pipe a rank left there would block the writer)."""
    return open(_open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a", buffering=1, encoding="utf-8")


def _open_regular(path: str | os.PathLike, flags: int) -> int:
    """A descriptor of ``path`` opened with ``flags``, never following a link nor waiting on a pipe; OSError (the
    descriptor closed) where ``path`` is not a regular file."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
    except OSError:
        os.close(fd)
        raise
    return fd
