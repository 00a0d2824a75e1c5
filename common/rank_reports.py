"""What a failed rank reported, read the same way by the grader and by the entry points: one source.

``is_symptom`` tells a report of another rank's failure from a rank's own fault, ``rank_at_fault`` picks the rank
whose failure explains the others', ``ending`` says how a rank that did not finish ended, and ``student_place``
(``traceback_line`` and ``dump_place`` on a rank's text) says where in the student's code a rank was; ``headline``,
``located`` and ``library_of`` are the one way an error's first line, its place and the library that raised it are
written. The grader's engine builds its messages on these (``grading.engine.peers``),
the entry points their ``RankError`` (``project.launch``).
"""
from __future__ import annotations

import functools
import os
import re
import signal

from common.files import read_regular
from common.regions import parse_regions

# What a rank reports when the fault lies with another rank (gloo and NCCL wording, torch's collective checks,
# a rank the communication library stopped).
_SYMPTOM = re.compile(
    r"Connection closed by peer|Connection reset by peer|Read error|Write error|Broken pipe|"
    r"Timed out waiting \d+ms for (?:recv|send)|Application timeout caused pair closure|Socket Timeout|"
    r"failed to pass monitoredBarrier|Detected mismatch between collectives|"
    r"NCCL (?:error|communicator was aborted)|Watchdog caught collective operation timeout|DistBackendError|"
    r"ncclRemoteError|ncclSystemError|Received data size doesn't match|gloo/transport|"
    r"stopped by the communication library")
# A frame in a traceback ("File ..., line N, in fn") or a faulthandler dump ("File ..., line N in fn").
FRAME = _FRAME = re.compile(r'File "([^"]+)", line (\d+),? in (\S+)')
_C10D = "torch/distributed/distributed_c10d.py"


def is_symptom(text: str) -> bool:
    """True when an error's text is what a rank reports about another rank's failure (a closed connection, a
    timeout, a collective mismatch, an abort by the communication library), not a fault of its own code."""
    return bool(_SYMPTOM.search(text))


def rank_at_fault(failures: dict[int, str]) -> int:
    """Of ranks that failed (rank -> what it reported: a traceback, or how it ended), the one whose failure
    explains the others: the lowest rank whose report is not a symptom (``is_symptom``), else the lowest."""
    own = [rank for rank, text in failures.items() if not is_symptom(text)]
    return min(own or failures)


_SIGNAL_HINTS = {"SIGXCPU": " (CPU time limit reached)", "SIGKILL": " (killed; out of memory?)",
                 "SIGXFSZ": " (file size limit reached)"}
_GLOO_DATA_SIZE = "Received data size doesn't match expected size"


def ending(code: int | None, stack: str = "", stderr_tail: str = "", packages: tuple[str, ...] = ()) -> str:
    """How a rank that did not finish ended, in plain words, from its exit ``code`` (None: still running at the
    time limit; negative: the signal that ended it), its last faulthandler ``stack`` (where in ``packages`` it
    was, ``dump_place``) and the end of its stderr: "was stopped by the communication library (SIGABRT) in
    all_reduce at data_parallel/comm.py:69 (in average_gradients)", "died from signal SIGKILL (killed; out of
    memory?)", "exited with code 1 before finishing"."""
    op, where = dump_place(stack, packages) if stack else ("", "")
    place = (f" in {op}" if op else "") + (f" at {where}" if where else "")
    if code is None:
        return f"was still running at the time limit{' (stuck' + place + ')' if place else ''}"
    if code == -signal.SIGABRT:
        why = (": the data it received did not match the size its call expected (the ranks called collectives "
               "with different shapes or in a different order)" if _GLOO_DATA_SIZE in stderr_tail else "")
        return f"was stopped by the communication library (SIGABRT){place}{why}"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        return f"died from signal {name}{_SIGNAL_HINTS.get(name, '')}{place}"
    return f"exited with code {code} before finishing{place}"


def dump_place(stack: str, packages: tuple[str, ...]) -> tuple[str, str]:
    """(collective, ``"path:line (in fn)"``) of the frame ``student_place`` picks in a faulthandler dump (innermost
    frame first), and the torch.distributed function called from it ("" when none); ("", "") when no thread shows
    a frame in one of the student's ``packages``."""
    for block in re.split(r"\n\s*\n", stack):
        frames = _FRAME.findall(block)
        depth = _student_depth(frames, packages)
        if depth is not None:
            path, line, function = frames[depth]
            inner = [f for p, _, f in frames[:depth] if p.endswith(_C10D)]
            return (inner[-1] if inner else ""), f"{package_path(path, packages)}:{line} (in {function})"
    return "", ""


def student_place(frames: list[tuple[str, int | str, str]], packages: tuple[str, ...]) -> str:
    """``"path:line (in fn)"`` of the frame where the student's code failed, the one rule of the grader and the
    entry points: of ``frames`` (``(path, line, function)``, innermost last, as a traceback lists them), the
    innermost inside a student region (a ``# BEGIN_STUDENT`` body of the file at ``path``), else the innermost in
    one of the student's ``packages`` (provided code, such as a helper the region called); "" when none. The path
    starts at the package ("data_parallel/comm.py")."""
    inner_first = list(frames)[::-1]
    depth = _student_depth(inner_first, packages)
    if depth is None:
        return ""
    path, line, function = inner_first[depth]
    return f"{package_path(path, packages)}:{line} (in {function})"


def _student_depth(frames: list[tuple[str, int | str, str]], packages: tuple[str, ...]) -> int | None:
    """The index in ``frames`` (innermost first) of the first frame inside a student region, else of the first in
    one of ``packages``; None when no frame is in one."""
    in_package = [k for k, (path, _, _) in enumerate(frames) if package_path(path, packages)]
    in_region = (k for k in in_package if _in_region(frames[k][0], int(frames[k][1]), packages))
    return next(in_region, in_package[0] if in_package else None)


# The student files whose regions ``student_place`` reads are at most this size (a path from a rank's report, which a
# hostile rank may point at a pipe, a device, a link or a huge file instead)
REGION_FILE_BYTES = 1 << 20


def _in_region(path: str, line: int, packages: tuple[str, ...]) -> bool:
    """Whether ``line`` of the file at ``path`` lies in the body of a student region. Only a regular file of at most
    ``REGION_FILE_BYTES`` whose real path lies in one of the student's ``packages`` is read
    (``common.files.read_regular``: never through a link, never waiting); anything else is no region."""
    real = os.path.realpath(path)
    if not package_path(real, packages):
        return False
    try:
        data = read_regular(real, limit=REGION_FILE_BYTES + 1)
    except OSError:
        return False
    spans = _region_spans(data, os.path.basename(real)) if len(data) <= REGION_FILE_BYTES else ()
    return any(first <= line <= last for first, last in spans)


@functools.lru_cache(maxsize=64)
def _region_spans(data: bytes, name: str) -> tuple[tuple[int, int], ...]:
    """(first, last) body line of every student region of a file's text ``data``; () when it parses as none."""
    try:
        regions = parse_regions(data.decode(), name)
    except ValueError:                    # UnicodeDecodeError too
        return ()
    return tuple((r.begin_line + 1, r.end_line - 1) for r in regions)


def traceback_line(text: str, packages: tuple[str, ...]) -> str:
    """A formatted traceback as one line: its exception's ``headline`` (``Type: message``) and, where it has one, the
    frame of the student's ``packages`` it failed in (``student_place``), plus the library's frame when the
    exception was raised inside a library (``library_of``):
    ``KeyError: 'w' (at data_parallel/comm.py:66 (in average_gradients))``,
    ``ValueError: not enough values to unpack (at tensor_parallel/gpt2.py:40 (in f); raised inside transformers)``."""
    exception, where, library = traceback_parts(text, packages)
    return headline(exception) + located(where, library)


def traceback_parts(text: str, packages: tuple[str, ...]) -> tuple[str, str, str]:
    """(the exception's text, ``Type: message`` with every line of the message; where the student's code failed
    (``student_place``), "" when no frame is in the student's ``packages``; the library that raised it, "" when
    its innermost frame is not a library's, with that frame when no frame of the student's is on the stack
    (``transformers at transformers/models/gpt2/modeling_gpt2.py:336 (in forward)``)) of a formatted traceback (its
    last exception, when exceptions are chained)."""
    lines = text.strip().splitlines()
    frames = [k for k, line in enumerate(lines) if _FRAME.search(line) and line.startswith(" ")]
    start = frames[-1] + 1 if frames else 0
    while start < len(lines) and (lines[start].startswith(" ") or not lines[start].strip()):
        start += 1                               # the last frame's source line and its ^^^ markers
    exception = "\n".join(lines[start:]) if start < len(lines) else text.strip()[:300]
    where = student_place(_FRAME.findall(text), packages)
    found = _FRAME.findall(text)[::-1]           # a traceback lists its outermost frame first
    library = library_of(found[0][0]) if found and not package_path(found[0][0], packages) else ""
    if library and not where:                   # no frame of the student's: the library's own frame says where
        path, line, function = found[0]
        library += f" at {_library_file(path) or path.rsplit('/', 1)[-1]}:{line} (in {function})"
    return exception, where, library


def headline(message: str) -> str:
    """The first line of an error message, whole: with the lines that continue its sentence (torch wraps "Expected
    parameter `tensor` of type torch.Tensor" / "but got <class 'list'> instead." over two lines) joined onto it,
    so a table that shows one line shows what the message says, and the location that follows it."""
    return split_headline(message)[0]


def split_headline(message: str) -> tuple[str, str]:
    """(``headline(message)``, the lines of ``message`` after those it joined)."""
    lines = message.strip().splitlines()
    first, used = (lines[0].strip() if lines else ""), 1
    for line in lines[1:4]:
        if not line.strip() or first.endswith((".", "!", "?", ":")) or len(first) > 400:
            break
        first, used = f"{first} {line.strip()}", used + 1
    return first, "\n".join(lines[used:]).strip("\n")


def located(where: str, library: str = "") -> str:
    """What follows an error's headline to say where it was raised: `` (at path:line (in fn))``, with ``; raised
    inside <library>`` when a library raised it below the student's frame ("" when neither is known)."""
    inside = f"raised inside {library}" if library else ""
    if where:
        return f" (at {where}" + (f"; {inside})" if inside else ")")
    return f" ({inside})" if inside else ""


# Where installed libraries live, and the libraries a student's call reaches (named after their module)
_INSTALLED = re.compile(r"/(?:site|dist)-packages/(.+)$")
_LIBRARIES = ("torch", "transformers", "deepspeed", "peft", "datasets", "tokenizers", "accelerate", "numpy")


def library_of(path: str) -> str:
    """The library a source file belongs to, named by module (``torch.distributed``, ``torch.nn``,
    ``transformers``), or "" for a file that is not a library's. torch is named with its sub-package."""
    path = path.replace("\\", "/")
    match = _INSTALLED.search(path)
    parts = match.group(1).split("/") if match else []
    if not parts:
        names = path.split("/")
        found = [k for k, name in enumerate(names[:-1]) if name in _LIBRARIES]
        parts = names[found[-1]:] if found else []
    if len(parts) < 2 or parts[0].endswith((".py", ".so")) or "." in parts[0]:
        return ""
    if parts[0] == "torch" and len(parts) > 2:
        return f"torch.{parts[1]}"
    return parts[0]


def _library_file(path: str) -> str:
    """An installed library's source file from its package on (``transformers/models/gpt2/modeling_gpt2.py``)."""
    match = _INSTALLED.search(path.replace("\\", "/"))
    return match.group(1) if match else ""


def package_path(path: str, packages: tuple[str, ...]) -> str:
    """``path`` from its student package on ("data_parallel/comm.py"), or "" when it is not in one."""
    parts = path.split("/")
    for k in range(len(parts) - 1, -1, -1):
        if parts[k] in packages:
            return "/".join(parts[k:])
    return ""
