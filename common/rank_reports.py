"""What a failed rank reported, read the same way by the grader and by the entry points: one source.

``is_symptom`` tells a report of another rank's failure from a rank's own fault, ``rank_at_fault`` picks the rank
whose failure explains the others', and ``traceback_line`` / ``dump_place`` say where in the student's code a
rank was. The grader's engine builds its messages on these (``grading.engine.peers``), the entry points their
``RankError`` (``project.launch``).
"""
from __future__ import annotations

import re

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
_FRAME = re.compile(r'File "([^"]+)", line (\d+),? in (\S+)')
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


def dump_place(stack: str, packages: tuple[str, ...]) -> tuple[str, str]:
    """(collective, ``"path:line (in fn)"``) of the innermost frame in one of the student's ``packages`` in a
    faulthandler dump (innermost frame first), and the torch.distributed function called from it ("" when none);
    ("", "") when no thread shows such a frame. The path starts at the package ("data_parallel/comm.py")."""
    for block in re.split(r"\n\s*\n", stack):
        frames = _FRAME.findall(block)
        for depth, (path, line, function) in enumerate(frames):
            rel = _package_path(path, packages)
            if rel:
                inner = [f for p, _, f in frames[:depth] if p.endswith(_C10D)]
                return (inner[-1] if inner else ""), f"{rel}:{line} (in {function})"
    return "", ""


def traceback_line(text: str, packages: tuple[str, ...]) -> str:
    """A formatted traceback as one line: its exception (``Type: message``, first line) and, where it has one, its
    innermost frame in the student's ``packages``: ``KeyError: 'w' (at data_parallel/comm.py:66 (in
    average_gradients))``."""
    tail = [line for line in text.strip().splitlines() if line.strip() and not line.startswith(" ")]
    last = tail[-1].strip() if tail else text.strip()[:300]
    frames = _FRAME.findall(text)[::-1]       # a traceback lists its outermost frame first
    _, where = dump_place("\n".join(f'File "{p}", line {n} in {f}' for p, n, f in frames), packages)
    return last + (f" (at {where})" if where else "")


def _package_path(path: str, packages: tuple[str, ...]) -> str:
    """``path`` from its student package on ("data_parallel/comm.py"), or "" when it is not in one."""
    parts = path.split("/")
    for k in range(len(parts) - 1, -1, -1):
        if parts[k] in packages:
            return "/".join(parts[k:])
    return ""
