"""Start N rank processes for one check, bounded in time, and collect what happened.

Each rank is a fresh process in its own session (process group): forked by the
run's fork server (``grading.engine.forkserver``: torch already imported), or
a cold ``python -m grading.engine.worker``; either way it runs the same
``worker.main``, with stdout/stderr going to files (a chatty submission cannot
block a pipe). Ranks rendezvous over a private file store inside the run folder, so
no port is ever fixed. At the case's limit (counted on an idle machine's
clock, ``LoadClock``, so a busy machine does not turn a slow correct rank into
a timeout) every live rank is asked for a Python stack dump (faulthandler on
SIGUSR1), then killed with its whole process group.

Each run also gets (see ``grading.engine.sandbox``) per-rank resource limits, a
private network and PID namespace shared by its ranks where the platform
allows, a marker variable in every rank's environment so leftovers can be
found and killed, and a random key, sent over stdin, with which the worker
signs the result files it writes.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from grading.engine import sandbox
from grading.engine.forkservers import ForkServer, ForkServers, wait_for_news
from grading.engine.results import is_finished

STDERR_TAIL_CHARS = 2000
STACK_DUMP_WAIT_S = 1.0
POLL_S = 0.05                 # the longest a finished case waits to be noticed when nothing wakes the launcher


@dataclass
class RankOutcome:
    """How one rank ended: exit code, the exception it reported, its stack if it was stuck."""

    rank: int
    returncode: int | None          # None: killed at the limit
    finished: bool                  # the worker reached its end and wrote its 'done' marker
    error: str = ""                 # traceback of an exception outside ctx.record (from the worker)
    stack: str = ""                 # faulthandler dump (stuck or crashed ranks)
    stderr_tail: str = ""


@dataclass
class LaunchResult:
    """Everything the parent needs to judge a run: per-rank outcomes and where results lie."""

    out_dir: Path
    world_size: int
    ranks: list[RankOutcome] = field(default_factory=list)
    timed_out: bool = False
    wall_s: float = 0.0
    limit_s: float = 0.0            # the case's limit, in load-discounted seconds (see LoadClock)
    key: bytes = b""                # the run's signing key (parts.log HMACs); b"": accept unsigned files
    sandbox_note: str = ""          # why namespaces were not used ("" when they were)
    leftovers: list[int] = field(default_factory=list)   # pids found by the run marker and killed
    lost: str = ""                  # why no result of this run counts (a rank killed its fork server)

    @property
    def ok(self) -> bool:
        return not self.timed_out and not self.lost and all(r.finished and r.returncode == 0 for r in self.ranks)

    def failure(self) -> str:
        """One human-readable reason why the run did not finish cleanly ("" when it did)."""
        if self.ok:
            return ""
        reasons = [self.lost] if self.lost else []
        if self.timed_out:
            stuck = [r for r in self.ranks if r.returncode is None]
            reasons.append(f"timed out after {self.wall_s:.0f} s (the limit of {self.limit_s:.0f} s, counted on an "
                           f"idle machine's clock) with rank(s) "
                           f"{', '.join(str(r.rank) for r in stuck) or '?'} still running")
            for r in stuck:
                if r.stack:
                    reasons.append(f"rank {r.rank} was stuck at:\n{_last_frames(r.stack)}")
        for r in self.ranks:
            if r.returncode is None:
                continue
            if r.error:
                reasons.append(f"rank {r.rank} failed: {_last_line(r.error)}")
            elif not r.finished or r.returncode != 0:
                how = _describe_exit(r.returncode)
                detail = _last_frames(r.stack) if r.stack else r.stderr_tail.strip()[-600:]
                reasons.append(f"rank {r.rank} {how} before finishing" + (f":\n{detail}" if detail else ""))
        return "\n".join(reasons)


_SIGNAL_HINTS = {"SIGXCPU": " (CPU time limit reached)", "SIGKILL": " (killed; out of memory?)",
                 "SIGXFSZ": " (file size limit reached)"}


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "was killed"
    if code < 0:
        try:
            name = signal.Signals(-code).name
            return f"died from signal {name}{_SIGNAL_HINTS.get(name, '')}"
        except ValueError:
            return f"died from signal {-code}"
    return f"exited with code {code}"


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else text


def _last_frames(stack: str, keep: int = 6) -> str:
    """The innermost frames of the first thread in a faulthandler dump (most recent call first)."""
    lines = stack.strip().splitlines()
    frames = [line for line in lines if line.strip().startswith("File ")]
    return "\n".join(frames[:keep]) if frames else stack.strip()[-600:]


class LoadClock:
    """Seconds since creation as an idle machine would count them: wall time divided by how busy the machine is.

    Sampled from ``/proc/loadavg`` (runnable tasks right now, this process excluded) against the CPUs this
    process may use: with 8 runnable tasks on 2 cores everything runs about 4 times slower, so 4 wall seconds
    count as 1. A limit on this clock cuts a hang (sleeping ranks accrue time as fast as on an idle machine)
    without also cutting a correct submission that a busy machine slows down: no verdict depends on load.
    """

    def __init__(self):
        self._last = time.monotonic()
        self._elapsed = 0.0

    @staticmethod
    def slowdown() -> float:
        """How many times slower than on an idle machine a runnable process runs now (>= 1)."""
        try:
            runnable = int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
            cpus = len(os.sched_getaffinity(0))
        except (OSError, ValueError, IndexError, AttributeError):
            return 1.0
        return max(1.0, (runnable - 1) / max(1, cpus))

    @classmethod
    def typical_slowdown(cls) -> float:
        """The slowdown now or over the last minute, whichever is worse: to scale a limit set once (>= 1)."""
        try:
            recent = float(Path("/proc/loadavg").read_text().split()[0]) / max(1, len(os.sched_getaffinity(0)))
        except (OSError, ValueError, IndexError, AttributeError):
            recent = 1.0
        return max(cls.slowdown(), recent, 1.0)

    def elapsed(self) -> float:
        """Load-discounted seconds so far (call it often: each call weighs the time since the last one)."""
        now = time.monotonic()
        self._elapsed += (now - self._last) / self.slowdown()
        self._last = now
        return self._elapsed


def pick_backend(world_size: int, requested: str = "auto") -> str:
    """``nccl`` when asked, or when ``auto`` and every rank can have its own GPU; else ``gloo``."""
    if requested != "auto":
        return requested
    try:
        import torch
        if torch.cuda.is_available() and torch.cuda.device_count() >= world_size:
            return "nccl"
    except ImportError:
        pass
    return "gloo"


def launch(target: str, world_size: int, *, cwd: Path, out_dir: Path, args: dict | None = None,
           timeout_s: float = 60.0, init_group: bool = True, backend: str = "gloo",
           pg_timeout_s: float | None = None, env: dict | None = None,
           limits: sandbox.Limits | None = None, servers: ForkServers | None = None,
           preload: tuple[str, ...] = ()) -> LaunchResult:
    """Run ``target`` ("package.module:function") in ``world_size`` rank processes.

    Each rank calls ``function(ctx)`` with a ``grading.engine.results.RankContext``;
    with ``init_group`` the default process group is set up first (``backend``,
    file-store rendezvous in ``out_dir``, collective timeout ``pg_timeout_s``,
    default: half the wall limit). ``cwd`` is the kit copy whose code is
    imported. ``limits`` bounds each rank (default:
    ``sandbox.default_limits(timeout_s)``). With ``servers`` (the run's fork
    servers, for ``cwd``) the ranks are forked warm; without, or with an
    ``env`` of its own, each is a cold ``python -m grading.engine.worker``:
    the same worker either way. ``preload``: library modules the servers
    import before forking (``ForkServers.preload``; a speed hint, ignored
    cold). ``out_dir`` must not exist yet.
    Never raises for anything a rank does: crashes, hangs and exceptions are
    reported in the LaunchResult; no process of the run survives it.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True)
    limits = limits if limits is not None else sandbox.default_limits(timeout_s)
    key, run_id = secrets.token_hex(32).encode(), secrets.token_hex(8)
    namespaces = sandbox.Namespaces(network=limits.network)
    spec = {"target": target, "world_size": world_size, "args": args or {}, "init_group": init_group,
            "backend": backend, "store": str(out_dir / "store"),
            "pg_timeout_s": pg_timeout_s if pg_timeout_s is not None else max(30.0, timeout_s / 2),
            "run_id": run_id, "limits": sandbox.limits_to_spec(limits), "namespaces": namespaces.paths}
    (out_dir / "spec.json").write_text(json.dumps(spec))
    warm = servers if env is None else None
    ranks: list[_Rank] = []
    spawned: list[float] = []
    cold_reasons: list[str] = []
    start = time.monotonic()
    timed_out, codes, preload_s = False, [], 0.0
    try:
        if warm is not None:
            warm.preload(world_size, preload)
        preload_s = time.monotonic() - start
        for rank in range(world_size):
            spawned.append(time.time())
            files = (out_dir / f"rank{rank}.stdout", out_dir / f"rank{rank}.stderr")
            forked = None
            if warm is not None:
                try:
                    forked = _Rank.forked(warm.server(rank), out_dir / "spec.json", rank, key, run_id, files, cwd)
                except (OSError, RuntimeError) as exc:     # a server that cannot fork: this rank starts cold
                    cold_reasons.append(f"rank {rank}: {exc}")
            ranks.append(forked or _Rank.cold(out_dir / "spec.json", rank, key, run_id, files, cwd, env))
        clock = LoadClock()
        while running := [r for r in ranks if r.poll() is None]:
            if clock.elapsed() > timeout_s:
                timed_out = True
                break
            wait_for_news([r.server for r in running if r.server is not None], POLL_S)   # cold ranks: polled
        if timed_out:
            for r in ranks:
                if r.poll() is None:
                    r.signal_group(signal.SIGUSR1)
            time.sleep(STACK_DUMP_WAIT_S)
        codes = [r.poll() if not timed_out or r.poll() is not None else None for r in ranks]
    finally:
        for r in ranks:                # kill stragglers and anything they spawned
            r.signal_group(signal.SIGKILL)
        for r in ranks:
            r.wait(10)
        servers_used = {id(r.server): r.server for r in ranks if r.server}.values()
        lost = "" if all(server.alive() for server in servers_used) else (
            "a rank killed the process that started it (its fork server), which ends every rank of the run at an "
            "unpredictable point: no result of this run is counted")
        leftovers = [pid for server in servers_used for pid in server.sweep()]   # setsid'ed or double-forked away
        namespaces.close()
        leftovers += sandbox.kill_marked(run_id)          # what left the process groups (setsid, double fork)
    result = LaunchResult(out_dir, world_size, timed_out=timed_out, wall_s=time.monotonic() - start,
                          limit_s=timeout_s, key=key,
                          sandbox_note=namespaces.reason, leftovers=leftovers, lost=lost)
    (out_dir / "launch.json").write_text(json.dumps({"spawned": spawned, "wall_s": result.wall_s,
                                                     "preload_s": preload_s, "warm": warm is not None,
                                                     "started_cold": cold_reasons}))
    for rank, code in enumerate(codes):
        rank_dir = out_dir / f"rank{rank}"
        result.ranks.append(RankOutcome(
            rank=rank, returncode=code,
            finished=is_finished(rank_dir, key, rank),
            error=_read(rank_dir / "error.txt", tail=8000), stack=_read(out_dir / f"rank{rank}.stack", tail=20000),
            stderr_tail=_read(out_dir / f"rank{rank}.stderr", tail=STDERR_TAIL_CHARS)))
    return result


def _rank_env(cwd: Path, env: dict | None, run_id: str) -> dict[str, str]:
    """A rank's environment, cold or forked: ``env`` (default: this process's, as it is now), the kit copy
    ``cwd`` on ``PYTHONPATH``, one OpenMP thread unless set, fault handler on, the run marker."""
    child_env = dict(os.environ if env is None else env)
    child_env["PYTHONPATH"] = str(Path(cwd).resolve())
    child_env.setdefault("OMP_NUM_THREADS", "1")
    child_env["PYTHONFAULTHANDLER"] = "1"
    child_env[sandbox.RUN_MARKER] = run_id
    return child_env


class _Rank:
    """One rank process, cold (a child of ours) or forked by a fork server (a child of the server)."""

    def __init__(self, pid: int, proc: subprocess.Popen | None = None, server: ForkServer | None = None):
        self.pid, self.proc, self.server = pid, proc, server

    @classmethod
    def cold(cls, spec: Path, rank: int, key: bytes, run_id: str, files: tuple[Path, Path], cwd: Path,
             env: dict | None) -> _Rank:
        """A fresh ``python -m grading.engine.worker SPEC RANK``; the key goes over its stdin."""
        child_env = _rank_env(cwd, env, run_id)
        with open(files[0], "wb") as stdout, open(files[1], "wb") as stderr:
            proc = subprocess.Popen([sys.executable, "-m", "grading.engine.worker", str(spec), str(rank)],
                                    cwd=cwd, env=child_env, stdin=subprocess.PIPE, stdout=stdout, stderr=stderr,
                                    start_new_session=True)
        _send_key(proc, key)
        return cls(proc.pid, proc=proc)

    @classmethod
    def forked(cls, server: ForkServer, spec: Path, rank: int, key: bytes, run_id: str,
               files: tuple[Path, Path], cwd: Path) -> _Rank:
        """A rank forked by ``server`` (the key goes over the new process's stdin pipe), with the environment a
        cold rank would get now (not the server's)."""
        pid = server.spawn(spec, rank, key, _rank_env(cwd, None, run_id), files[0], files[1], Path(cwd).resolve())
        return cls(pid, server=server)

    def poll(self) -> int | None:
        """The exit code (negative: killed by that signal), or None while it runs."""
        if self.proc is not None:
            return self.proc.poll()
        code = self.server.poll().get(self.pid)
        if code is None and not self.server.alive():
            return -signal.SIGKILL                   # its server died, and it with it (PR_SET_PDEATHSIG)
        return code

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the rank's process group (it leads its own session)."""
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def wait(self, timeout_s: float) -> None:
        """Wait (bounded) until the rank has exited and been reaped."""
        deadline = time.monotonic() + timeout_s
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)


def _send_key(proc: subprocess.Popen, key: bytes) -> None:
    """Hand the run key to a fresh rank over its stdin, then close the pipe."""
    try:
        proc.stdin.write(key + b"\n")
    except OSError:
        pass
    finally:
        try:
            proc.stdin.close()
        except OSError:
            pass


def _read(path: Path, tail: int | None = None) -> str:
    try:
        with open(path, "rb") as handle:
            if tail is not None:
                handle.seek(0, os.SEEK_END)
                handle.seek(max(0, handle.tell() - tail))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""
