"""Where each rank of a run is, and whether any of them still makes progress: the watchdog of every launcher.

A rank that waits (in a collective, a receive, a sleep or a poll loop) uses next to no CPU time, however busy the
machine is; a rank that computes uses plenty, even on a loaded machine. ``RankWatch`` samples each rank's CPU time
(its whole process tree) and tells how long every rank has been waiting at once (``still_s``), and asks the ranks
for a Python stack dump (faulthandler, registered on ``DUMP_SIGNAL`` by each rank) to say where each one is
(``places``, ``progress_line``). The grader's launcher and the entry points' (``project.launch``) end a run whose
ranks all wait for longer than their limit, and print where the ranks are while they wait.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil

from common.files import read_regular
from common.rank_reports import dump_place

DUMP_SIGNAL = signal.SIGUSR1
PROGRESS_S = 30.0       # how often a waiting run says where its ranks are
SAMPLE_S = 1.0          # how often CPU times are sampled
BUSY_SHARE = 0.02       # a rank that used more than this share of one CPU since the last sample made progress
DUMP_WAIT_S = 0.5       # how long a rank gets to write its stack dump
# How long every rank of a run may wait at once before a launcher ends the run as stuck (the entry points'
# ``--timeout`` default); above the 30 s a rank of Problem 4.3's check waits for its turn to touch a file.
STILL_LIMIT_S = 45.0


class RankWatch:
    """The ranks of one run: ``pids[r]`` is rank r's process (its children count as its own), ``stacks[r]`` the
    file its stack dumps are written to."""

    def __init__(self, pids: dict[int, int], stacks: dict[int, Path], packages: tuple[str, ...]):
        self.pids, self.stacks, self.packages = dict(pids), dict(stacks), packages
        now = time.monotonic()
        self._cpu = {rank: self._cpu_s(pid) for rank, pid in self.pids.items()}
        self._sampled = self._busy_at = now

    def still_s(self, ranks: list[int] | None = None) -> float:
        """Seconds for which every one of ``ranks`` (default all; ranks that have ended are left out) has been
        waiting, sampled now if the last sample is ``SAMPLE_S`` old."""
        now = time.monotonic()
        if now - self._sampled >= SAMPLE_S:
            watched = self.pids if ranks is None else {r: self.pids[r] for r in ranks if r in self.pids}
            busy = False
            for rank, pid in watched.items():
                cpu = self._cpu_s(pid)
                if cpu is not None and cpu - (self._cpu.get(rank) or 0.0) > BUSY_SHARE * (now - self._sampled):
                    busy = True
                self._cpu[rank] = cpu
            if busy:
                self._busy_at = now
            self._sampled = now
        return now - self._busy_at

    def places(self, ranks: list[int] | None = None) -> dict[int, str]:
        """Where each of ``ranks`` (default all) is now: ``"barrier (data_parallel/checkpoint.py:104)"``, the
        torch.distributed function it waits in (else its function) and its frame in the student's code
        (``common.rank_reports.student_place``); ``"outside your code"`` when its stack shows none, ``"no stack
        dump"`` when it wrote none."""
        ranks = list(self.pids) if ranks is None else ranks
        sizes = {rank: _size(self.stacks.get(rank)) for rank in ranks}
        for rank in ranks:
            _signal(self.pids[rank])
        deadline = time.monotonic() + DUMP_WAIT_S
        while time.monotonic() < deadline and not all(_size(self.stacks.get(r)) > sizes[r] for r in ranks):
            time.sleep(0.02)
        time.sleep(0.05)                     # a dump that has started is written in full by now
        return {rank: self._place(rank, sizes[rank]) for rank in ranks}

    def _place(self, rank: int, offset: int) -> str:
        dump = read_from(self.stacks.get(rank), offset)
        if not dump.strip():
            return "no stack dump"
        op, where = dump_place(dump, self.packages)
        if not where:
            return "outside your code"
        path_line, _, function = where.partition(" (in ")
        return f"{op or function.rstrip(')')} ({path_line})"

    def progress_line(self, name: str, elapsed_s: float, ranks: list[int] | None = None) -> str:
        """``"p4_checkpoint: 60 s; rank 1 in save_sharded (data_parallel/checkpoint.py:107), rank 0 in barrier
        (data_parallel/checkpoint.py:104)"``: ``name``, the seconds so far and where each rank is."""
        places = self.places(ranks)
        return f"{name}: {elapsed_s:.0f} s; " + ", ".join(f"rank {r} in {p}" for r, p in sorted(places.items()))

    @staticmethod
    def _cpu_s(pid: int) -> float | None:
        """CPU seconds of ``pid`` and its live descendants, or None when it has ended."""
        try:
            process = psutil.Process(pid)
            tree = [process, *process.children(recursive=True)]
        except psutil.Error:
            return None
        total = 0.0
        for member in tree:
            try:
                times = member.cpu_times()
                total += times.user + times.system
            except psutil.Error:
                continue
        return total


def read_from(path: Path | None, offset: int, limit: int = 200_000) -> str:
    """At most ``limit`` bytes, as text, of a file a rank writes, from byte ``offset`` on; "" when it is missing, a
    symlink or not a regular file (``common.files.read_regular``)."""
    try:
        return read_regular(path, offset, limit).decode("utf-8", "replace") if path is not None else ""
    except OSError:
        return ""


def _size(path: Path | None) -> int:
    try:
        return os.path.getsize(path) if path is not None else 0
    except OSError:
        return 0


def _signal(pid: int) -> None:
    """Ask for a stack dump every process of ``pid``'s tree that handles ``DUMP_SIGNAL`` (its ``SigCgt`` mask in
    ``/proc``): a process that does not, a rank's subprocess or a rank that unregistered its handler, would be
    ended by the signal. Where ``/proc`` cannot be read (macOS) only ``pid`` itself is asked."""
    try:
        tree = [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]
    except psutil.Error:
        return
    for member in tree:
        catches = _catches(member)
        if catches or (catches is None and member == pid):
            try:
                os.kill(member, DUMP_SIGNAL)
            except (ProcessLookupError, PermissionError):
                pass


def _catches(pid: int) -> bool | None:
    """Whether ``pid`` has a handler for ``DUMP_SIGNAL``; None when ``/proc`` does not say."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (int(DUMP_SIGNAL) - 1) & 1)
    except (OSError, ValueError, IndexError):
        return None
    return None
