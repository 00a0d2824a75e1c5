"""Start the rank processes of one check, bounded in time, and say how each ended (``case_run.LaunchResult``).

Each rank is a fresh process in its own session, forked by a fork server (``common.forkserver``) or a cold
interpreter running the same ``grading.engine.worker.main`` (``common.rank_process``), its stdout and stderr in
files, meeting the others over a file store in the run folder (no port), in the sandbox (``grading.sandbox``),
signing its results with the run's key. The ranks are watched until they end by
``common.rank_launch.supervise``, the core the entry points' launcher (``project.launch``) shares; what the
grader adds on top is how they start (its fork servers, cold workers), the sandbox, signed records and phases.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from common.process_tree import freeze_and_kill
from common.rank_launch import Limits, supervise
from common.rank_process import RankProcess
from common.rank_watch import PROGRESS_S, STILL_LIMIT_S, RankWatch, read_from
from grading.sandbox import isolation
from grading.sandbox.limits import RUN_MARKER, Namespaces, default_limits, kill_marked
from grading.engine.case_run import LaunchResult, RankOutcome
from common.cpus import LoadClock
from grading.engine.run_servers import ForkServers
from grading.engine.recording import DONE_MARKER, is_finished, rank_key

WORKER = "grading.engine.worker"      # the module whose ``main`` every rank runs, cold or forked
STDERR_TAIL_CHARS = 2000
POLL_S = 0.05                 # the longest a finished case waits to be noticed when nothing wakes the launcher
LINGER_S = 2.0                # how long a finished rank may take to exit by itself (_Phase.run)


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def pick_backend(world_size: int, requested: str = "auto") -> str:
    """``nccl`` when asked, or when ``auto`` and every rank can have its own GPU; else ``gloo``."""
    if requested != "auto":
        return requested
    import torch
    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world_size else "gloo"


def launch(target: str, world_size: int, *, cwd: Path, out_dir: Path, args: dict | None = None,
           timeout_s: float = 60.0, init_group: bool = True, backend: str = "gloo",
           pg_timeout_s: float | None = None, servers: ForkServers | None = None,
           preload: tuple[str, ...] = (), next_phases: tuple[str, ...] = (),
           collective_checks: bool | tuple[bool, ...] = True,
           grader_root: Path | None = None, progress=_to_stderr, progress_s: float = PROGRESS_S,
           still_limit_s: float = STILL_LIMIT_S) -> LaunchResult:
    """Run ``target`` ("package.module:function") in ``world_size`` rank processes, then each of ``next_phases``.

    Each rank calls ``function(ctx)`` (a ``recording.RankContext``), after joining the default process group
    with ``init_group`` (``backend``, collective timeout ``pg_timeout_s``, default half the limit). ``cwd`` is the
    grading copy whose code is imported; ``default_limits`` bound each rank. With ``servers`` the ranks are
    forked warm (``preload``: what the servers import first); without, each is a cold worker. ``next_phases``: further
    targets, each run by new rank processes once every rank of the one before has finished and what it left
    running is killed; they sign into the same results and find the case's ``handoff`` folder
    (``RankContext.handoff_dir``). ``timeout_s`` bounds every phase together, on an idle machine's clock
    (``LoadClock``). With ``collective_checks`` (a flag, or one per phase: ValueError for another count) every
    process group checks each collective call against the other ranks' (torch's ``DebugLevel.DETAIL``): calls that
    differ fail at once on every rank, naming each rank's call (``grading.engine.peers`` reads them); with the first
    phase's, warm ranks differ in hash order as ``torchrun``'s do (``ForkServers``' ``distinct_hashes``).
    ``out_dir`` must not exist yet. Never raises for anything a rank does: crashes, hangs and exceptions are
    reported; no process of the run survives it. Each rank sees the machine as ``grading.sandbox.isolation.plan``
    allows: ``grader_root`` (the grader's own tree, default this module's) hidden, only its own folders writable;
    each signs with a key of its own (``recording.rank_key``). While the case runs longer than ``progress_s``,
    ``progress`` gets a line saying where each rank is, every ``progress_s``; a phase whose ranks all wait for
    ``still_limit_s`` (``rank_watch.RankWatch.still_s``) ends then, before its limit (``LaunchResult.still_s``).
    """
    targets = (target, *next_phases)
    checks = _per_phase(collective_checks, len(targets))
    out_dir = Path(out_dir)
    (out_dir / "handoff").mkdir(parents=True)
    limits = default_limits(timeout_s)
    key, run_id = secrets.token_hex(32).encode(), secrets.token_hex(8)
    view = isolation.plan(grader_root or isolation.GRADER_ROOT, Path(cwd), out_dir, world_size)
    namespaces = Namespaces(network=limits.network) if view["enabled"] else Namespaces.none()
    spec = {"world_size": world_size, "args": args or {}, "init_group": init_group, "backend": backend,
            "pg_timeout_s": pg_timeout_s if pg_timeout_s is not None else max(30.0, timeout_s / 2),
            "run_id": run_id, "limits": asdict(limits),
            "namespaces": namespaces.paths or {"refused": namespaces.reason},
            "isolation": view, "handoff": str(out_dir / "handoff")}
    distinct_hashes = checks[0] and world_size > 1
    phase = _Phase(out_dir, key, run_id, Path(cwd).resolve(), servers, distinct_hashes, namespaces,
                   _Watching(progress, progress_s, still_limit_s))
    start = time.monotonic()
    preload_s, server_gone = 0.0, ""
    try:
        if servers is not None:
            servers.stop_unneeded_server(distinct_hashes, preload)
            servers.preload(world_size, preload, distinct_hashes)
        preload_s = time.monotonic() - start
        server_gone = _run_phases(phase, spec, tuple(zip(targets, checks)), world_size, timeout_s)
    finally:
        phase.clean_up()
        namespaces.close()
    result = LaunchResult(out_dir, world_size, timed_out=phase.timed_out, wall_s=time.monotonic() - start,
                          limit_s=timeout_s, key=key, server_gone=server_gone, still_s=phase.still_s)
    _write_summary(out_dir / "launch.json", phase, result.wall_s, preload_s, warm=servers is not None)
    result.ranks.extend(_outcomes(phase, out_dir, key))
    return result


def _per_phase(collective_checks: bool | tuple[bool, ...], phases: int) -> tuple[bool, ...]:
    """``launch``'s ``collective_checks`` as one flag per phase; ValueError for a tuple of another length."""
    checks = (collective_checks,) * phases if isinstance(collective_checks, bool) else tuple(collective_checks)
    if len(checks) != phases:
        raise ValueError(f"collective_checks: {len(checks)} flags for {phases} phases")
    return checks


def _write_summary(path: Path, phase: _Phase, wall_s: float, preload_s: float, warm: bool) -> None:
    """``launch.json``: the ranks spawned, the wall and preload seconds, whether warm, why any rank started cold."""
    path.write_text(json.dumps({"spawned": phase.spawned, "wall_s": wall_s, "preload_s": preload_s, "warm": warm,
                                "started_cold": phase.cold_reasons}))


def _run_phases(phase: _Phase, spec: dict, targets: tuple[tuple[str, bool], ...], world_size: int,
                timeout_s: float) -> str:
    """Run each of ``targets`` (target, collective checks) in turn by new ranks until one does not finish cleanly;
    why a fork server was lost ("" when none was)."""
    out_dir, server_gone, clock = phase.out_dir, "", LoadClock()
    for number, (phase_target, checks) in enumerate(targets):
        suffix = str(number or "")
        store = str(out_dir / "shared" / f"store{suffix}")
        (out_dir / f"spec{suffix}.json").write_text(json.dumps({**spec, "target": phase_target, "store": store,
                                                                "collective_checks": checks}))
        for rank in range(world_size):            # a rank of this phase has finished once it says so again
            (out_dir / f"rank{rank}" / DONE_MARKER).unlink(missing_ok=True)
        phase.run(out_dir / f"spec{suffix}.json", world_size, clock, timeout_s, append=number > 0)
        server_gone = phase.clean_up()
        if phase.timed_out or server_gone or \
                not all(is_finished(out_dir / f"rank{r}", phase.key, r) for r in range(world_size)):
            break
    return server_gone


def _outcomes(phase: _Phase, out_dir: Path, key: bytes) -> list[RankOutcome]:
    """How each rank of the last phase ended, as its folder and streams tell."""
    outcomes = []
    for rank, code in enumerate(phase.codes):
        rank_dir = out_dir / f"rank{rank}"
        outcomes.append(RankOutcome(
            rank=rank, returncode=code, finished=is_finished(rank_dir, key, rank),
            error=isolation.read_rank_file(rank_dir / "error.txt", 8000),
            stack=phase.last_stack(rank),
            stderr_tail=isolation.read_rank_file(out_dir / f"rank{rank}.stderr", STDERR_TAIL_CHARS)))
    return outcomes


@dataclass(frozen=True)
class _Watching:
    """How a phase watches its ranks: ``say`` gets a progress line every ``every_s``; ranks that all wait for
    ``still_limit_s`` end the phase."""

    say: Callable[[str], None]
    every_s: float
    still_limit_s: float


class _Phase:
    """The ranks of one phase of a case at a time: start them, wait (bounded), kill what is left of them."""

    def __init__(self, out_dir: Path, key: bytes, run_id: str, cwd: Path, servers: ForkServers | None,
                 distinct_hashes: bool, namespaces: Namespaces, watching: _Watching):
        self.out_dir, self.key, self.run_id, self.cwd, self.servers = out_dir, key, run_id, cwd, servers
        self.watching = watching
        self.namespaces = namespaces                # the case's: whatever is left in its PID namespace is killed
        self.distinct_hashes = distinct_hashes      # ranks forked by servers of different hash seeds
        self.ranks: list[_Rank] = []
        self.codes: list[int | None] = []
        self.spawned: list[float] = []
        self.cold_reasons: list[str] = []
        self.timed_out = False
        self.still_s = 0.0                          # how long every rank had waited when the phase was ended early
        self.started = time.monotonic()
        self.stack_read: dict[int, int] = {}        # per rank: the end of its stack dumps that progress lines read

    def last_stack(self, rank: int) -> str:
        """Rank ``rank``'s stack dumps (``rank<r>.stack``) after those the progress lines read: its dump at the limit
        or when it crashed; the last 20,000 characters."""
        path = self.out_dir / f"rank{rank}.stack"
        return read_from(path, self.stack_read.get(rank, 0), 10 ** 7)[-20000:]

    def environment(self) -> dict[str, str]:
        """A rank's environment, cold or forked: what ``isolation.rank_environment`` keeps of this process's as it
        is now, the grading copy on ``PYTHONPATH``, one OpenMP thread unless set, no bytecode written, the fault
        handler on, the run marker."""
        child = {"OMP_NUM_THREADS": "1", **isolation.rank_environment(dict(os.environ))}
        return {**child, "PYTHONPATH": str(self.cwd), "PYTHONFAULTHANDLER": "1", "PYTHONDONTWRITEBYTECODE": "1",
                RUN_MARKER: self.run_id}

    def run(self, spec: Path, world_size: int, clock: LoadClock, timeout_s: float, append: bool) -> None:
        """Start the phase's ranks and wait until none runs, or the case's limit on ``clock``; set ``codes``.

        A rank has finished when its ``done`` marker is written, the worker's last act; one still there
        ``LINGER_S`` later (a cold interpreter that a stray non-daemon thread keeps alive) is killed. At the limit
        every live rank is asked for a Python stack dump (faulthandler on SIGUSR1); ``clean_up`` kills them.
        """
        self.ranks, self.spawned = [], []
        for rank in range(world_size):
            self.spawned.append(time.time())
            argv, started = [str(spec), str(rank)], None
            done = self.out_dir / f"rank{rank}" / DONE_MARKER
            with open(self.out_dir / f"rank{rank}.stdout", "ab" if append else "wb") as stdout, \
                    open(self.out_dir / f"rank{rank}.stderr", "ab" if append else "wb") as stderr:
                how = dict(cwd=self.cwd, env=self.environment(), streams=(stdout.fileno(), stderr.fileno()),
                           key=rank_key(self.key, rank))
                if self.servers is not None:
                    try:
                        started = _Rank.start(rank, WORKER, argv, session=self.servers.session(
                            rank, self.distinct_hashes), **how)
                    except (OSError, RuntimeError) as exc:     # a server that cannot fork: this rank starts cold
                        self.cold_reasons.append(f"rank {rank}: {exc}")
                started = started or _Rank.start(rank, WORKER, argv, **how)
                started.done = done
                self.ranks.append(started)
        out = supervise(self.ranks, Limits(
            limit_s=timeout_s, clock=clock.elapsed, still_limit_s=self.watching.still_limit_s,
            stacks={r.rank: self.out_dir / f"rank{r.rank}.stack" for r in self.ranks}, progress=self._say,
            progress_s=self.watching.every_s, progress_since=self.started, linger_s=LINGER_S, poll_s=POLL_S,
            dump_stacks=True))
        self.codes = [end.code for end in out.ends]    # at the limit: one that our stack dump signal ends still ran
        self.timed_out = out.timed_out or out.stuck
        if out.stuck:
            self.still_s = out.still_s

    def _say(self, watch: RankWatch, ranks: list[int], elapsed_s: float) -> None:
        """Give ``progress`` the line of where ``ranks`` are; their dumps are not the stack of their end."""
        self.watching.say(watch.progress_line(self.out_dir.name, elapsed_s, ranks))
        for rank in ranks:
            self.stack_read[rank] = _size(self.out_dir / f"rank{rank}.stack")

    def clean_up(self) -> str:
        """Kill the phase's ranks with whatever they started (their groups, what their servers adopted, what carries
        the run marker, what is left in the case's PID namespace: setsid, double forks); return why no result of
        the run counts ("" unless a rank killed its server). Idempotent."""
        for r in self.ranks:
            r.signal_group(signal.SIGKILL)
        for r in self.ranks:
            r.wait(10)
        sessions = {id(r.session): r.session for r in self.ranks if r.session}.values()
        server_gone = "" if all(session.alive() for session in sessions) else (
            "the process that started the ranks (a fork server) ended during the run, which ends every rank at an "
            "unpredictable point: no result of this run is counted")
        for session in sessions:                    # it ends, killing what the ranks left behind
            session.close()
        if self.ranks:
            kill_marked(self.run_id)
            freeze_and_kill(self.namespaces.members)
        self.ranks = []
        return server_gone


class _Rank(RankProcess):
    """One rank process whose worker writes ``done`` as its last act: a ``common.rank_launch.RankProcess``."""

    done: Path

    def said(self) -> tuple[str, None] | None:
        """("ok", None) once the rank wrote its ``done`` marker (whether it is genuine, the parent judges later)."""
        return ("ok", None) if self.done.exists() else None


def _size(path: Path) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
