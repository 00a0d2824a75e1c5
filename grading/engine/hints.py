"""Where student code failed, and the likely cause of well-known mistakes.

``student_frame`` finds the innermost traceback frame in a student package, so a message can say
``data_parallel/comm.py:57 (in average_gradients)`` instead of a bare ``IndexError``. ``likely_cause`` matches an
error (type, message, file) against the mistakes students make most often; the raw message is always shown
next to its hint. ``format_error`` is the one way a student exception is reported, wherever it was caught:
``RankContext.record`` (through ``case_run.describe_error``) and every probe helper that catches one itself
(``describe_exception``: the helpers of ``grading/problems/probe_helpers.py``, probes that keep an error as data).
"""
from __future__ import annotations

import functools
import re
import traceback
from pathlib import Path

from common.regions import STUDENT_PACKAGES, parse_regions

# (file prefix or "", regex on "Type: message", hint)
_EXCEPTION_HINTS: list[tuple[str, re.Pattern, str]] = [
    ("pipeline/pipe.py", re.compile(r"size of tensor a \(\d+\) must match|shape .* (mismatch|invalid)|"
                                    r"mat1 and mat2 shapes cannot be multiplied"),
     "a late-binding closure in Pipe.forward: a function defined in the loop reads the loop variables when the "
     "worker runs it, not when it was submitted; bind them as default arguments (lambda x=x, j=j: ...)"),
    ("pipeline/", re.compile(r"TimeoutError|Empty"),
     "a task that was never submitted, or received from the wrong stage: receive exactly what the wave submitted"),
    ("", re.compile(r"Default process group has not been initialized|process group.*not.*initiali[sz]ed"),
     "torch.distributed is used before setup_process_group joined the group (or on another group)"),
    ("", re.compile(r"a leaf Variable that requires grad is being used in an in-place operation"),
     "an in-place change of a parameter outside torch.no_grad()"),
    ("", re.compile(r"Trying to backward through the graph a second time"),
     "a tensor reused across steps keeps an old graph: detach it or rebuild it each step"),
    ("", re.compile(r"element \d+ of tensors does not require grad"),
     "the graph was cut: a .detach(), .data or torch.no_grad() between the input and the loss"),
    ("", re.compile(r"the communication library refused the call: two of its tensors differ in size"),
     "the tensors of one collective call do not fit each other on this rank (the two sizes it names): in "
     "reduce_scatter and all_gather every chunk has the same size on every rank (pad a flat buffer to a multiple "
     "of the world size)"),
]
_LIBRARY_CHECK = re.compile(r"Check failed: .*sizes\(\).*\((?P<a>\d+) vs\. (?P<b>\d+)\)")
# A C++ log prefix the communication library puts before its message ("[rank2]:[F1205 18:36:15.19 Foo.cpp:2216] ",
# "[/path/to/pair.cc:553] "): a source path of the library's, not of the student's code.
_LIBRARY_PREFIX = re.compile(r"(?:\[rank\d+\]:)?\[(?:[A-Z]\d{4} [\d:.]+ )?[^\]\s]*\.(?:cpp|cc|h|hpp):\d+\]\s*")


def student_frame(tb: traceback.StackSummary | list, root: Path | str | None = None) -> str:
    """``"path:line (in function)"`` of the innermost frame inside a student region, else of the innermost frame
    in a student package (provided code such as a helper the region called), or "" when there is none.

    ``tb`` is ``traceback.extract_tb(exc.__traceback__)`` (innermost frame last); paths are shown
    relative to ``root`` (default: the current directory, the kit copy).
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


def likely_cause(kind: str, message: str, where: str = "") -> str:
    """A "likely cause: ..." sentence for a known failure shape, or "" when none is known."""
    text = f"{kind}: {message}"
    for prefix, pattern, hint in _EXCEPTION_HINTS:
        if where.startswith(prefix) and pattern.search(text):
            return f"likely cause: {hint}"
    return ""


def self_contained(message: str) -> str:
    """``message`` whose first line no longer ends at a colon: the next non-empty line is joined onto it.

    torch's ``load_state_dict`` error opens with "Error(s) in loading state_dict for Net:" and lists the details
    on the following lines; a grade table shows the first line only, so
    ``"Error(s) ... for Net:\n\tMissing key(s) in state_dict: "b". "`` becomes
    ``"Error(s) ... for Net: Missing key(s) in state_dict: "b"."``. Any other message comes back unchanged.
    """
    lines = message.split("\n")
    if not lines[0].rstrip().endswith(":"):
        return message
    for k, line in enumerate(lines[1:], start=1):
        if line.strip():
            return "\n".join([f"{lines[0].rstrip()} {line.strip()}", *lines[k + 1:]])
    return message


def format_error(kind: str, message: str, where: str = "") -> str:
    """``"Type: message (at path:line (in fn))"``, plus ``"\nlikely cause: ..."`` when one is known.

    ``where`` is ``student_frame``'s answer ("" when no student frame was found: no location is shown). A
    message whose first line ends at a colon gets its details joined onto that line (``self_contained``).
    """
    message, check = _plain_library_check(_LIBRARY_PREFIX.sub("", self_contained(message)).rstrip())
    text = f"{kind}: {message}" + (f" (at {where})" if where else "") + (f"\nlibrary check: {check}" if check else "")
    hint = likely_cause(kind, message, where)
    return text + (f"\n{hint}" if hint else "")


def _plain_library_check(message: str) -> tuple[str, str]:
    """(``message``, "") or, when it is a communication library's failed size assertion (gloo's ``Check failed:
    EXPR (A vs. B).``), (the same in plain words, the assertion: a later line, which ``grade -v`` shows)."""
    match = _LIBRARY_CHECK.match(message)
    if not match or "\n" in message:
        return message, ""
    return (f"the communication library refused the call: two of its tensors differ in size ({match['a']} vs. "
            f"{match['b']} elements)"), message


def describe_exception(exc: BaseException, limit: int | None = None, root: Path | str | None = None) -> str:
    """``format_error`` of a caught exception: its type, message (cut to ``limit`` characters), the student
    file and line it came from (relative to ``root``, default the current directory) and the likely cause."""
    message = str(exc)
    return format_error(type(exc).__name__, message[:limit] if limit else message,
                        student_frame(traceback.extract_tb(exc.__traceback__), root))
