"""Ending process trees: signalling a rank's process group and sweeping everything a run left behind.

A process that keeps forking could outrun a plain scan-and-kill; ``freeze_and_kill`` stops (SIGSTOP) scan after scan
before it kills, so that nothing found can fork again. Used by the fork servers' sessions (``common.forkserver``:
their descendants) and the grader's sandbox (a run's marked processes, a case's PID namespace).
"""
from __future__ import annotations

import contextlib
import os
import signal
from typing import Callable

import psutil


def descendants(pid: int) -> list[int]:
    """Pids of every process below ``pid`` (a live one) in the process tree."""
    return [child.pid for child in psutil.Process(pid).children(recursive=True)]


def signal_group(pid: int, sig: int) -> None:
    """Send ``sig`` to the process group that ``pid`` leads (nothing when it is gone)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def freeze_and_kill(find: Callable[[], list[int]], rounds: int = 20) -> list[int]:
    """Stop (SIGSTOP) every pid ``find()`` names, scan after scan until a scan finds no new one (a process that
    keeps forking cannot outrun the sweep), then SIGKILL them all; return their pids."""
    stopped: list[int] = []
    for _ in range(rounds):
        fresh = [pid for pid in find() if pid not in stopped]
        if not fresh:
            break
        for pid in fresh:
            try:
                os.kill(pid, signal.SIGSTOP)
            except (ProcessLookupError, PermissionError):
                continue
            stopped.append(pid)
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return stopped
