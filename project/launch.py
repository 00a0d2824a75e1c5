"""Starting rank processes and joining their group: the one launcher of the runners and the benchmarks.

Every rank process of the kit is started by ``spawn_ranks``, with a socket back to the parent for its reply;
``launch`` is the entry points' front end (a torchrun rank, one rank in this process, or spawned ranks that meet
over a file store). A rank joins its group with ``project.devices.join_group``; how it starts (forked by the fork
server the grader forks its ranks from, or a fresh interpreter) is ``project.rank_start``'s, and what it runs is
``main`` here; how its ranks are watched until they end (limits, the still watchdog, a failure's grace) is
``common.rank_launch``'s, the core the grader's launcher shares, and how a failed or stuck run is reported, the rank
at fault first, is ``common.run_faults``'.
"""
from __future__ import annotations

import argparse
import contextlib
import faulthandler
import importlib
import json
import os
import signal
import socket
import sys
import tempfile
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable

from common import call_log
from common.rank_launch import Limits, peer_grace, supervise
from common.rank_reports import ending
from common.rank_watch import DUMP_SIGNAL, STILL_LIMIT_S, RankWatch
from common.regions import STUDENT_PACKAGES
from common.run_faults import failed_run, stuck_run
from project.cli import RankError, torchrun_rank
from project.config import RunConfig
from project.devices import RankEnv, resolve_backend
from project.output import write_json
from project.rank_start import (RankProcess, RankStart, freeze_what_is_loaded, rank_session, rank_start_method,
                                start_rank)
from project.rank_start import start_rank_server as _start_server


def _reply(conn: Connection, message: tuple) -> None:
    with contextlib.suppress(OSError):   # the parent has gone or stopped listening
        conn.send(message)


def _rank_main(target: Callable, env: RankEnv, args: tuple, start: RankStart, watch_dir: str | None) -> None:
    try:
        start.adopt()
        if watch_dir is not None:        # where the launcher's watchdog reads this rank's stack and calls
            import torch.distributed

            stack = open(Path(watch_dir) / f"rank{env.rank}.stack", "w")   # noqa: SIM115 - open for the rank's life
            faulthandler.register(DUMP_SIGNAL, file=stack, all_threads=True)
            call_log.install(Path(watch_dir) / f"calls{env.rank}.txt", STUDENT_PACKAGES, torch.distributed)
        value = target(env, *args)
    except BaseException:   # noqa: BLE001 - reported to the parent, which decides
        _reply(env.conn, ("error", traceback.format_exc()))
        raise SystemExit(1) from None
    _reply(env.conn, ("ok", value))


def main(argv: list[str]) -> int:
    """A rank (``project.rank_start.start_rank``): ``argv`` is ``[RANK, FD]``, FD the rank's end of its socket to
    the parent, which sends the parent's ``sys.path``, then what to run: ``(target, world_size, init_method, args,
    RankStart, watch_dir)``. Runs ``_rank_main``; returns the exit code (1 when the target failed)."""
    conn = Connection(int(argv[1]))
    sys.path[:] = conn.recv()                   # before unpickling the target: its module imports from there
    target, world_size, init_method, args, start, watch_dir = conn.recv()
    rank = int(argv[0])
    try:
        _rank_main(target, RankEnv(rank, world_size, rank, world_size, init_method, conn), args, start, watch_dir)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


class _Member:
    """Spawned rank ``rank`` as ``common.rank_launch.supervise`` sees it: its process and the parent's end of its
    socket, on which it replies ``("ok", value)`` or ``("error", traceback)``; ending without a reply is its error."""

    def __init__(self, rank: int, proc: RankProcess, conn: Connection):
        self.rank, self.pid, self.proc, self.conn = rank, proc.pid, proc, conn

    def poll(self) -> int | None:
        return self.proc.poll()

    def said(self) -> tuple[str, Any] | None:
        if self.conn.poll():
            try:
                return self.conn.recv()
            except (EOFError, OSError):
                pass
        elif self.proc.poll() is None:
            return None
        self.proc.wait(1)
        return "died", ending(self.proc.poll())

    def wakers(self) -> list:
        return [self.conn, *self.proc.wakers()]

    def signal_group(self, sig: int) -> None:
        self.proc.signal_group(sig)


class Ranks:
    """Handles of spawned rank processes: ``procs[r]`` and the parent's end of rank r's socket ``conns[r]``; with a
    ``watch_dir``, the folder where each rank leaves its stack dumps and its collective calls (``_rank_main``)."""

    def __init__(self, name: str, procs: list[RankProcess], conns: list[Connection], watch_dir: Path | None = None,
                 session=None):
        self.name, self.procs, self.conns, self.watch_dir, self.session = name, procs, conns, watch_dir, session
        self.still_limit_s: float | None = None        # see ``replies``

    def send(self, message: Any) -> None:
        """Send ``message`` to every rank (ranks that are gone are skipped)."""
        for conn in self.conns:
            _reply(conn, message)

    def replies(self, what: str, timeout_s: float | None = None) -> list:
        """One ``("ok", value)`` reply from every rank: the values, in rank order.

        Watches all ranks at once (``common.rank_launch.supervise``) and raises RankError naming ``what`` when a
        rank replied with an error or died, or when a rank gave no answer
        within ``timeout_s`` (None: no limit). A failure waits for the other ranks' reports (``PEER_GRACE_S``
        after a symptom of another rank's failure, ``OWN_GRACE_S`` after a rank's own fault: ``peer_grace``), so
        that the message's first line names the rank at fault judged from all of them (``_failure``), not the first
        to report. With a ``watch_dir`` and ``still_limit_s`` set, ranks that all wait at once (``RankWatch``) get
        a line on stderr every ``PROGRESS_S`` saying where they are, and after ``still_limit_s`` the run ends with a
        RankError naming where each rank waits and the call on which their collective calls part.
        """
        watched = self.watch_dir is not None and self.still_limit_s is not None
        out = supervise([_Member(r, proc, conn) for r, (proc, conn) in enumerate(zip(self.procs, self.conns))],
                        Limits(limit_s=timeout_s, grace=peer_grace,
                               still_limit_s=self.still_limit_s if watched else None,
                               stacks={r: self.watch_dir / f"rank{r}.stack" for r in range(len(self.procs))}
                               if watched else None,
                               progress=self._progress if watched else None))
        if out.failures:
            raise self._failure(what, out.failures)
        if out.stuck:
            raise self._stuck(what, out.watch, out.waiting, out.still_s)
        if out.timed_out:
            raise RankError(f"{what}: {self.name} rank {out.waiting[0]} gave no answer within {timeout_s:g} s")
        return [end.said for end in out.ends]

    def _progress(self, watch: RankWatch, waiting: list[int], still_s: float) -> None:
        print(watch.progress_line(f"{self.name}s waiting", still_s, waiting), file=sys.stderr, flush=True)

    def _failure(self, what: str, failures: dict[int, str]) -> RankError:
        """The RankError for ``failures`` (rank -> its traceback, or how it died): ``common.run_faults.failed_run``,
        after ``what`` failed."""
        return RankError(self._prefix(what) + failed_run(failures, self._logs(),
                                                          "rank" if self.name == "rank" else f"{self.name} rank"))

    def _stuck(self, what: str, watch: RankWatch, pending: list[int], still_s: float) -> RankError:
        """The RankError for ranks ``pending`` that all waited ``still_s`` seconds: where each waits, and the call
        on which their collective calls part (``common.run_faults.stuck_run``)."""
        return RankError(self._prefix(what) + stuck_run(watch.places(pending), still_s, self._logs(),
                                                         f"--timeout {self.still_limit_s:g}",
                                                         "" if self.name == "rank" else f"{self.name} "))

    def _prefix(self, what: str) -> str:
        return "" if what == self.name else f"{what}: "

    def _logs(self) -> dict[int, list[call_log.Call]]:
        """Every rank's logged collective calls ({} without a ``watch_dir``)."""
        if self.watch_dir is None:
            return {}
        return {r: call_log.read(self.watch_dir / f"calls{r}.txt") for r in range(len(self.procs))}

    def wait(self, timeout_s: float | None = None) -> list:
        """Every rank's return value, in rank order, once all have finished; the processes are joined.

        Raises RankError (as ``replies``) when a rank fails or the ranks are stuck; the other ranks are stopped
        then.
        """
        try:
            values = self.replies(self.name, timeout_s)
        except BaseException:
            self.close(grace_s=5.0, stop=True)
            raise
        self.close(grace_s=60.0)   # their work is done: only interpreter shutdown is left
        return values

    def close(self, grace_s: float = 10.0, stop: bool = False) -> None:
        """Join every rank for up to ``grace_s`` seconds (``stop``: terminate them first); kill the rest, and what
        they left running (their fork server session sweeps it as it ends)."""
        for proc in self.procs:
            if stop and proc.poll() is None:
                proc.signal_group(signal.SIGTERM)
        for proc in self.procs:
            proc.wait(grace_s)
            if proc.poll() is None:
                proc.signal_group(signal.SIGKILL)
                proc.wait(5)
        for conn in self.conns:
            conn.close()
        if self.session is not None:
            self.session.close()


def start_rank_server(world_size: int, preload: tuple[str, ...] = ()) -> None:
    """Start, now, the fork server that a coming ``spawn_ranks`` of ``world_size`` ranks forks them from, so
    that its imports (torch, ``preload``) overlap the caller's own preparation (checks, reading data).

    Returns at once. Does nothing for one rank, under torchrun, or where ranks start fresh
    (``project.rank_start``). Raises ConfigError for a bad ``KIT_RANK_START``.
    """
    if world_size > 1 and torchrun_env() is None and rank_start_method() == "forkserver":
        _start_server(preload)


def spawn_ranks(target: Callable, world_size: int, init_method: str | None, args: tuple = (), name: str = "rank",
                preload: tuple[str, ...] = (), watch_dir: Path | None = None) -> Ranks:
    """Start ``world_size`` rank processes; rank r runs ``target(RankEnv(r, world_size, r, world_size,
    init_method, conn), *args)`` and its return value (or traceback) goes back over its pipe.

    Returns at once with the handles (``Ranks``). ``target`` and ``args`` must
    be picklable. Each rank starts as ``rank_start_method`` says (``project.rank_start.start_rank``), with this
    process's current environment, working folder and ``sys.path``; ``preload`` names library modules worth
    importing once for all ranks (``common.startup``). Each rank ends after its reply: ``("ok", value)``
    or ``("error", traceback)``. A rank that serves commands (the benchmark's
    workers) replies over ``env.conn`` in the same format. With ``watch_dir`` (an existing folder) every rank
    registers a stack dump on ``rank_watch.DUMP_SIGNAL`` and logs its collective calls there (``Ranks``).
    """
    target, session = _importable(target), rank_session(preload)
    procs, conns = [], []
    for rank in range(world_size):
        parent, child = socket.socketpair()
        with child:
            try:
                procs.append(start_rank(rank, child.fileno(), session))
            except (OSError, RuntimeError):         # a server gone meanwhile: this rank starts fresh
                procs.append(start_rank(rank, child.fileno(), None))
        conn = Connection(parent.detach())
        _reply(conn, list(sys.path))                # a rank that died at once: its end tells why
        _reply(conn, (target, world_size, init_method, args, RankStart.here(),
                      None if watch_dir is None else str(watch_dir)))
        conns.append(conn)
    return Ranks(name, procs, conns, watch_dir, session)


def _importable(target: Callable) -> Callable:
    """``target``; one defined in the script run as ``__main__`` (``python project/run_data_parallel.py``) as the
    same function imported under the script's module name, which a rank can import (as ``multiprocessing`` re-imports
    the main module in the processes it spawns)."""
    if getattr(target, "__module__", None) != "__main__":
        return target
    main_module = sys.modules["__main__"]
    spec = getattr(main_module, "__spec__", None)
    if spec is not None:
        name = spec.name
    else:
        script = Path(main_module.__file__).resolve().relative_to(Path(__file__).resolve().parent.parent)
        name = ".".join(script.with_suffix("").parts)
    return getattr(importlib.import_module(name), target.__qualname__)


def file_rendezvous(folder: Path, name: str) -> str:
    """A ``file://`` init method over a fresh store file ``<folder>/<name>_<ns>`` (no port needed).

    ``folder`` is created: a file store in a missing folder would make every rank wait forever.
    """
    Path(folder).mkdir(parents=True, exist_ok=True)
    return f"file://{(Path(folder) / f'{name}_{time.monotonic_ns()}').resolve()}"


def torchrun_env() -> RankEnv | None:
    """This process's rank when started by torchrun (``RANK``/``WORLD_SIZE``/``LOCAL_*`` variables), else None."""
    started = torchrun_rank()
    if started is None:
        return None
    rank, world_size = started
    return RankEnv(rank, world_size, int(os.environ.get("LOCAL_RANK", rank)),
                   int(os.environ.get("LOCAL_WORLD_SIZE", world_size)), "env://")


def world_of(args: argparse.Namespace) -> tuple[int, int, str]:
    """``(world_size, local_ranks, backend)`` of this launch: torchrun's sizes, else ``--world_size``.

    The backend is ``--backend`` resolved (``resolve_backend``; ConfigError for nccl without enough GPUs).
    """
    env = torchrun_env()
    world_size, local_ranks = (env.world_size, env.local_world_size) if env else (args.world_size, args.world_size)
    return world_size, local_ranks, resolve_backend(args.backend, local_ranks)


def launch(target: Callable[..., None], world_size: int, folder: Path, args: tuple = (),
           preload: tuple[str, ...] = (), still_limit_s: float = STILL_LIMIT_S) -> None:
    """Run ``target(env, *args)`` on every rank of this run and return when all are done.

    Under torchrun this process is one rank (rendezvous ``env://``). Else one
    rank runs in this process, or ``world_size`` ranks are spawned
    (``spawn_ranks``, with ``preload``) and meet over a file store in
    ``folder``. A failing spawned rank raises RankError here, with its
    traceback; spawned ranks that all wait for ``still_limit_s`` seconds
    (a rank disagreement) raise RankError naming where each waits
    (``Ranks.replies``). A run that is merely slow is not ended.
    """
    env = torchrun_env()
    if env is not None:
        freeze_what_is_loaded()
        target(env, *args)
        return
    Path(folder).mkdir(parents=True, exist_ok=True)     # a store in a missing folder: every rank waits forever
    store = Path(folder) / "rendezvous"
    store.unlink(missing_ok=True)
    init_method = f"file://{store.resolve()}"
    try:
        if world_size == 1:
            target(RankEnv(0, 1, 0, 1, init_method), *args)
        else:
            with tempfile.TemporaryDirectory(prefix="ranks-") as watch_dir:
                ranks = spawn_ranks(target, world_size, init_method, args, preload=preload, watch_dir=Path(watch_dir))
                ranks.still_limit_s = still_limit_s
                ranks.wait()
    finally:
        store.unlink(missing_ok=True)


def launch_and_summarise(target: Callable[[RankEnv, RunConfig, Any], None], config: RunConfig, data: Any,
                         summarise: Callable[[list[dict]], dict], preload: tuple[str, ...] = ()) -> dict | None:
    """Clear old metrics in ``config.out_dir``, ``launch`` ``target(env, config, data)`` on ``config.world_size``
    ranks (each writes ``metrics_rank<r>.json`` there; ranks all waiting for ``config.timeout`` seconds end the
    run), then write and return ``summary.json``: ``summarise`` of every rank's metrics, rank 0's first (None in
    torchrun processes other than rank 0).
    """
    env, folder = torchrun_env(), config.out_dir
    if env is None or env.rank == 0:
        for old in [*folder.glob("metrics_rank*.json"), folder / "summary.json"]:
            old.unlink(missing_ok=True)
    launch(target, config.world_size, folder, (config, data), preload, config.timeout)
    if env is not None and env.rank != 0:
        return None
    summary = summarise([json.loads((folder / f"metrics_rank{r}.json").read_text())
                         for r in range(config.world_size)])
    write_json(folder / "summary.json", summary)
    return summary
