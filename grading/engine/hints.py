"""Where student code failed, in a rank: the frame of a caught exception inside a student region.

``student_frame`` finds the innermost traceback frame in a student region (else package), so a message can say
``data_parallel/comm.py:57 (in average_gradients)`` instead of a bare ``IndexError``. ``describe_exception`` tells a
caught exception as ``common.error_words.format_error`` does (the one way a student exception is reported,
wherever it was caught: ``RankContext.record`` through ``case_run.describe_error``, and every probe helper that
catches one itself: the helpers of ``grading/problems/probe_helpers.py``, probes that keep an error as data).
"""
from __future__ import annotations

import functools
import traceback
from pathlib import Path

from common.error_words import format_error
from common.rank_reports import library_of
from common.regions import STUDENT_PACKAGES, parse_regions


def student_frame(tb: traceback.StackSummary | list, root: Path | str | None = None) -> str:
    """``"path:line (in function)"`` of the innermost frame inside a student region, else of the innermost frame
    in a student package (provided code such as a helper the region called), or "" when there is none.

    ``tb`` is ``traceback.extract_tb(exc.__traceback__)`` (innermost frame last); paths are shown
    relative to ``root`` (default: the current directory, the grading copy).
    """
    root = Path(root or Path.cwd()).resolve()
    found = []
    for frame in reversed(list(tb)):
        try:
            rel = Path(frame.filename).resolve().relative_to(root).as_posix()
        except (ValueError, OSError):
            continue
        if rel.split("/")[0] in STUDENT_PACKAGES:
            where = f"{rel}:{frame.lineno} (in {frame.name})"
            if _in_region(root / rel, frame.lineno):
                return where
            found.append(where)
    return found[0] if found else ""


@functools.lru_cache(maxsize=64)
def _region_lines(path: Path, mtime_ns: int) -> tuple[tuple[int, int], ...]:
    """(first, last) body line of every student region of the file ``path`` (as it was at ``mtime_ns``)."""
    try:
        regions = parse_regions(path.read_text(), path.name)
    except (OSError, ValueError):
        return ()
    return tuple((r.begin_line + 1, r.end_line - 1) for r in regions)


def _in_region(path: Path, line: int | None) -> bool:
    try:
        spans = _region_lines(path, path.stat().st_mtime_ns)
    except OSError:
        return False
    return line is not None and any(first <= line <= last for first, last in spans)


def library_frame(tb: traceback.StackSummary | list) -> str:
    """The library that raised an exception, named by module (``torch.distributed``, ``transformers``), when its
    innermost frame ``tb`` (``traceback.extract_tb``) is a library's; else ""."""
    frames = list(tb)
    return library_of(frames[-1].filename) if frames else ""


def describe_exception(exc: BaseException, limit: int | None = None, root: Path | str | None = None) -> str:
    """``format_error`` of a caught exception: its type, message (cut to ``limit`` characters), the student
    file and line it came from (relative to ``root``, default the current directory) and the likely cause."""
    message, tb = str(exc), traceback.extract_tb(exc.__traceback__)
    return format_error(type(exc).__name__, message[:limit] if limit else message, student_frame(tb, root),
                        library_frame(tb))
