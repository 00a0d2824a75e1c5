"""Watching the rank processes of one run until they end: the supervision core of both launchers.

A launcher starts its ranks its own way (``project.launch``: ``multiprocessing`` with a pipe per rank;
``grading.engine.launch``: fork server sessions or cold workers, with its fork servers on top) and hands them to
``supervise`` as ``RankProcess`` handles. ``supervise`` waits for them under the run's ``Limits``:

    limit_s on a clock ─┐  still_limit_s: every waiting rank idle (RankWatch) ─┐  a failed rank: its peers' grace ─┐
                        └──────────────────────────── the watch ends ◀─────────┴───────────────────────────────────┘
    progress line every progress_s (where each waiting rank is)   a finished rank still there after linger_s: killed

and says how each rank ended (``Supervised``: exit code, what it said, whether it finished). Which rank is at fault
is judged from what the ranks said (``common.rank_reports``: a rank's own error against a peer's symptom, which
also sets the grace, ``peer_grace``) and their collective calls (``common.call_log.parting``).
"""
from __future__ import annotations

import math
import signal
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from common.rank_reports import is_symptom
from common.rank_watch import DUMP_SIGNAL, PROGRESS_S, SAMPLE_S, RankWatch
from common.regions import STUDENT_PACKAGES

# How long the other ranks may still report after a rank failed (``peer_grace``): a symptom of another rank's
# failure waits for that rank's report, a rank's own fault only for reports under way.
PEER_GRACE_S = 5.0
OWN_GRACE_S = 1.0
STACK_DUMP_WAIT_S = 1.0       # how long the ranks still running at a limit get to write their stack dumps


class RankProcess(Protocol):
    """One rank process as ``supervise`` sees it, however it was started."""

    rank: int
    pid: int

    def poll(self) -> int | None:
        """The exit code (negative: killed by that signal), or None while it runs."""

    def said(self) -> tuple[str, Any] | None:
        """What the rank has reported so far: ``("ok", value)`` once it finished its work, ``("error", text)``
        when it failed (text: its traceback, or how it died), None while it says nothing."""

    def wakers(self) -> list:
        """What becomes ready when the rank may have news (objects ``multiprocessing.connection.wait`` takes);
        [] when it can only be polled."""

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the rank (and to what it started, where it leads a process group)."""


def peer_grace(report: str) -> float:
    """How long a failed rank's peers may still report: ``PEER_GRACE_S`` after a symptom of another rank's failure
    (the rank at fault reports next), ``OWN_GRACE_S`` after a rank's own fault."""
    return PEER_GRACE_S if is_symptom(report) else OWN_GRACE_S


@dataclass(frozen=True)
class Limits:
    """What ends a watch (``supervise``) and what it says meanwhile; every limit is off by default."""

    limit_s: float | None = None
    """Seconds on ``clock`` after which the watch ends (``Supervised.timed_out``)."""
    clock: Callable[[], float] | None = None
    """Seconds elapsed so far (``common.cpus.LoadClock.elapsed``); default: wall time of this watch."""
    still_limit_s: float | None = None
    """Seconds for which every waiting rank may use no CPU (``RankWatch.still_s``) before the watch ends."""
    stacks: dict[int, Path] | None = None
    """Rank -> the file its stack dumps go to: needed for the still limit and progress lines."""
    progress: Callable[[RankWatch, list[int], float], None] | None = None
    """Called with the watch, the waiting ranks and the seconds counted so far, every ``progress_s``."""
    progress_s: float = PROGRESS_S
    progress_since: float | None = None
    """``time.monotonic()`` from which progress counts wall time (first line no sooner than a second into the
    watch); None: it counts the still time of the waiting ranks, and a rank that works starts it again."""
    grace: Callable[[str], float] | None = None
    """Seconds the others may still report after a rank failed with this report (``peer_grace``); None: a failed
    rank ends nothing."""
    linger_s: float | None = None
    """A rank that finished is waited for until it exits, and killed ``linger_s`` after it finished; None: a
    finished rank is done, its exit not waited for."""
    poll_s: float | None = None
    """Longest sleep between looks at the ranks (None: until one of their ``wakers`` is ready)."""
    dump_stacks: bool = False
    """At the time or still limit, ask the ranks still running for a stack dump (``DUMP_SIGNAL``) on the way out."""

    def __post_init__(self):
        for name in ("limit_s", "still_limit_s", "linger_s", "poll_s"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"Limits.{name} must be >= 0 or None, not {value}")
        if (self.still_limit_s is not None or self.progress is not None) and self.stacks is None:
            raise ValueError("Limits.stacks is needed for still_limit_s and progress")


@dataclass
class RankEnd:
    """How one rank ended: its exit code (None: still running when the watch ended), whether it finished its work
    (``said`` "ok"), and what it said (its value, or the text of its failure)."""

    rank: int
    code: int | None
    finished: bool = False
    said: Any = None


@dataclass
class Supervised:
    """How a watch ended: per rank (``ends``), the ranks that failed (rank -> their report, arrival order), the
    ranks still waiting at the end (not finished, not failed), ``timed_out`` (ended by the clock's limit), ``stuck``
    (ended by the still limit, every waiting rank having idled ``still_s`` seconds) and the ``watch`` that judged
    it (None without stacks)."""

    ends: list[RankEnd]
    failures: dict[int, str] = field(default_factory=dict)
    waiting: list[int] = field(default_factory=list)
    timed_out: bool = False
    stuck: bool = False
    still_s: float = 0.0
    watch: RankWatch | None = None


def supervise(procs: Sequence[RankProcess], limits: Limits) -> Supervised:
    """Wait for the rank processes ``procs`` until every one has finished or failed (with ``limits.linger_s``:
    until every one has exited), or a limit of ``limits`` ends the watch; say how each ended.

    A rank failed when it says so (``RankProcess.said``); a failure ends the watch ``limits.grace(report)``
    seconds later (the other ranks' reports arrive meanwhile; the still limit is not judged then). Never kills
    a rank except a lingering one: ending the others is the caller's.
    """
    return _Watch(procs, limits).run()


class _Watch:
    """The state of one ``supervise`` call: what each rank said, the grace, the progress lines."""

    def __init__(self, procs: Sequence[RankProcess], limits: Limits):
        self.procs, self.limits = procs, limits
        self.start = time.monotonic()
        self.clock = limits.clock or (lambda: time.monotonic() - self.start)
        self.said: dict[int, tuple[str, Any]] = {}
        self.failures: dict[int, str] = {}
        self.finished_at: dict[int, float] = {}
        self.grace_end = math.inf
        self.watch = None if limits.stacks is None else RankWatch(
            {p.rank: p.pid for p in procs}, limits.stacks, STUDENT_PACKAGES)
        self.lines = 0
        self.next_line = None if limits.progress_since is None else \
            max(limits.progress_since + limits.progress_s, self.start + 1.0)
        self.timed_out = self.stuck = False
        self.still_s = 0.0

    def run(self) -> Supervised:
        """Watch until the ranks are done or a limit ends it; then the stack dumps (at a limit) and the ends."""
        limits = self.limits
        while True:
            self._hear()
            running = [p for p in self.procs if p.poll() is None]
            waiting = [p.rank for p in running if p.rank not in self.said]
            if not (running if limits.linger_s is not None else waiting) or self._limit_reached(waiting):
                break
            if limits.linger_s is not None:
                self._kill_lingering(running)
            _wake(running if limits.linger_s is not None else [p for p in running if p.rank in waiting],
                  _timeout(limits, self.clock, self.grace_end))
        ends = [RankEnd(p.rank, p.poll(), self.said.get(p.rank, ("",))[0] == "ok",
                        self.said.get(p.rank, (None, None))[1]) for p in self.procs]
        if (self.timed_out or self.stuck) and limits.dump_stacks:
            self._dump_stacks([p for p, end in zip(self.procs, ends) if end.code is None])
        return Supervised(ends, self.failures, waiting, self.timed_out, self.stuck, self.still_s, self.watch)

    def _hear(self) -> None:
        """Take what each rank that has not spoken yet says now; a failure starts its peers' grace."""
        for p in self.procs:
            if p.rank in self.said:
                continue
            ended = p.poll() is not None           # before ``said``: a rank that said nothing before it ended
            news = p.said()
            if news is None:
                if ended:
                    self.said[p.rank] = ("ended", None)
                continue
            self.said[p.rank] = news
            if news[0] != "ok":
                self.failures[p.rank] = news[1]
                if self.limits.grace is not None:
                    self.grace_end = min(self.grace_end, time.monotonic() + self.limits.grace(news[1]))

    def _limit_reached(self, waiting: list[int]) -> bool:
        """Whether the grace, the time limit or the still limit ends the watch now (a progress line meanwhile)."""
        limits = self.limits
        if time.monotonic() >= self.grace_end:
            return True
        if limits.limit_s is not None and self.clock() > limits.limit_s:
            self.timed_out = True
            return True
        if self.watch is None or not waiting or self.grace_end != math.inf:
            return False
        still = self.watch.still_s(waiting)
        if limits.still_limit_s is not None and still >= limits.still_limit_s:
            self.stuck, self.still_s = True, still
            return True
        if limits.progress is not None:
            self._progress(waiting, still)
        return False

    def _progress(self, waiting: list[int], still: float) -> None:
        """A progress line every ``progress_s`` of still time, or of wall time from ``progress_since``."""
        limits = self.limits
        if self.next_line is None:
            if still >= limits.progress_s * (self.lines + 1):
                self.lines += 1
                limits.progress(self.watch, waiting, still)
            elif still < limits.progress_s:
                self.lines = 0
        elif time.monotonic() >= self.next_line:
            self.next_line += limits.progress_s
            limits.progress(self.watch, waiting, time.monotonic() - limits.progress_since)

    def _kill_lingering(self, running: list[RankProcess]) -> None:
        """Kill a rank that finished ``linger_s`` ago and still runs (a stray thread keeps its interpreter)."""
        now = time.monotonic()
        for p in running:
            if self.said.get(p.rank, ("",))[0] == "ok" and \
                    now - self.finished_at.setdefault(p.rank, now) > self.limits.linger_s:
                p.signal_group(signal.SIGKILL)

    @staticmethod
    def _dump_stacks(live: list[RankProcess]) -> None:
        """Ask the ranks still running at a limit for their stacks, and give them the time to write them."""
        for p in live:
            p.signal_group(DUMP_SIGNAL)
        if live:
            time.sleep(STACK_DUMP_WAIT_S)


def _timeout(limits: Limits, clock: Callable[[], float], grace_end: float) -> float | None:
    """How long the next wait may last: ``poll_s``, and no longer than the grace or the limit leave (the limit on a
    wall clock; a load-discounting one is read by the loop only)."""
    bounds = [limits.poll_s] if limits.poll_s is not None else []
    if limits.stacks is not None:                  # the still time is sampled every SAMPLE_S
        bounds.append(SAMPLE_S)
    if grace_end != math.inf:
        bounds.append(grace_end - time.monotonic())
    if limits.limit_s is not None and limits.clock is None:
        bounds.append(limits.limit_s - clock())
    return max(0.0, min(bounds)) if bounds else None


def _wake(procs: list[RankProcess], timeout_s: float | None) -> None:
    """Wait up to ``timeout_s`` (None: no limit) until one of ``procs``' wakers is ready."""
    wakers = list({id(w): w for p in procs for w in p.wakers()}.values())
    try:
        if wakers:
            wait(wakers, timeout_s)
            return
    except (OSError, ValueError):                  # a waker closed meanwhile (a fork server's socket)
        pass
    time.sleep(timeout_s if timeout_s is not None else 0.05)
