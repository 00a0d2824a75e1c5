"""The launcher's side of warm rank processes: start, drive and stop the fork servers of a grading run.

See ``grading.engine.forkserver`` for what a server is and what a forked rank
gets. ``ForkServers`` holds the two servers (even and odd ranks), started when first
needed; ``ForkServer`` talks to one of them over a socket pair (one JSON object
per line each way: preload, spawn, sweep; ready, preloaded, spawned, exit,
swept, error). A server is a cold ``python -m grading.engine.forkserver``, or
a child of a zygote where the environment names zygotes; ``Zygotes`` starts
them (``grading.engine.zygote``).
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from grading.engine.forkserver import SERVER_KIT_ENV
from grading.engine.zygote import ZYGOTES_ENV, request_server, socket_path

START_TIMEOUT_S = 120.0


class ForkServer:
    """One server process (see the module docstring), driven over a socket pair by the launcher."""

    def __init__(self, cwd: Path, env: dict[str, str], index: int = 0):
        """Start the server of slot ``index``: forked by the zygote of that slot where ``env`` names zygotes
        (``grading.engine.zygote``) and it agrees, else a cold ``python -m grading.engine.forkserver``."""
        ours, theirs = socket.socketpair()
        self._socket = ours
        self._buffer = b""
        self._ready = False
        self.exits: dict[int, int] = {}
        self.preloaded: set[str] = set()           # modules already asked for (the server imports each once)
        self.proc: subprocess.Popen | None = None
        zygotes = env.get(ZYGOTES_ENV)
        self.pid = request_server(Path(zygotes), index, theirs, START_TIMEOUT_S) if zygotes else None
        self.from_zygote = self.pid is not None
        if self.pid is None:
            self.proc = subprocess.Popen([sys.executable, "-m", "grading.engine.forkserver", str(theirs.fileno())],
                                         cwd=cwd, env=env, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         start_new_session=True)
            self.pid = self.proc.pid
        theirs.close()

    def wait_ready(self) -> None:
        """Block until the server has imported what it preloads (it starts in the background); raise
        RuntimeError when it cannot."""
        if self._ready:
            return
        reply = self._next(lambda m: "ready" in m or "error" in m, START_TIMEOUT_S)
        if reply is None or "error" in reply:
            self.close()
            raise RuntimeError((reply or {}).get("error") or "the fork server did not start")
        self._ready = True

    def _messages(self, timeout_s: float) -> list[dict]:
        ready, _, _ = select.select([self._socket], [], [], timeout_s)
        if not ready:
            return []
        chunk = self._socket.recv(65536)
        if not chunk:
            raise RuntimeError("the fork server exited")
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        return [json.loads(line) for line in lines]

    def _next(self, wanted, timeout_s: float) -> dict | None:
        """The next message that ``wanted`` accepts (exit reports seen meanwhile are kept); None at the timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for message in self._messages(max(0.0, deadline - time.monotonic())):
                if "exit" in message:
                    self.exits[message["exit"]] = message["code"]
                if wanted(message):
                    return message
        return None

    def preload(self, modules: tuple[str, ...] | list[str]) -> bool:
        """Ask the server to import those of ``modules`` it has not been asked for; returns at once, True when it
        asked (then ``preload_done`` waits for the server's answer)."""
        wanted = [name for name in modules if name not in self.preloaded]
        if not wanted:
            return False
        self.wait_ready()
        self._socket.sendall((json.dumps({"op": "preload", "modules": wanted}) + "\n").encode())
        self.preloaded.update(wanted)
        return True

    def preload_done(self) -> str:
        """Wait until the server has done what ``preload`` asked; "" when it can still fork, else why not."""
        try:
            reply = self._next(lambda m: "preloaded" in m or "error" in m, START_TIMEOUT_S)
        except (OSError, RuntimeError) as exc:
            return str(exc)
        return "the fork server did not finish its preloads" if reply is None else reply.get("error", "")

    def spawn(self, spec: Path, rank: int, key: bytes, env: dict[str, str], stdout: Path, stderr: Path,
              cwd: Path) -> int:
        """Fork rank ``rank`` of the case whose spec is ``spec``; return its pid."""
        self.wait_ready()
        self._socket.sendall((json.dumps({"op": "spawn", "spec": str(spec), "rank": rank, "key": key.decode(),
                                          "env": env, "stdout": str(stdout), "stderr": str(stderr),
                                          "cwd": str(cwd)}) + "\n").encode())
        reply = self._next(lambda m: "spawned" in m or "error" in m, START_TIMEOUT_S)
        if reply is None or "error" in reply:
            raise RuntimeError((reply or {}).get("error") or "the fork server did not start the rank")
        return reply["spawned"]

    def poll(self) -> dict[int, int]:
        """Exit codes reported so far (pid -> code, negative for a signal)."""
        try:
            for message in self._messages(0.0):
                if "exit" in message:
                    self.exits[message["exit"]] = message["code"]
        except RuntimeError:
            pass
        return self.exits

    def sweep(self) -> list[int]:
        """Kill every process the server's ranks left behind (re-parented to it); return their pids.

        A server that is gone (a rank killed it: its parent) sweeps nothing; its ranks died with it
        (``PR_SET_PDEATHSIG``) and what they started is left to the run marker's sweep.
        """
        try:
            self._socket.sendall(b'{"op": "sweep"}\n')
            reply = self._next(lambda m: "swept" in m, 30.0)
        except (OSError, RuntimeError):
            return []
        return reply["swept"] if reply else []

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        try:                                       # a zygote's child: its zygote reaps it, so gone means gone
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True

    def close(self) -> None:
        """Stop the server and everything under it (idempotent)."""
        try:
            self._socket.close()
        except OSError:
            pass
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            return
        deadline = time.monotonic() + 10
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.01)


def _server_env(cwd: Path, base) -> dict[str, str]:
    """The environment a fork server or a zygote starts in: ``base``, the kit copy ``cwd`` on ``PYTHONPATH`` and
    named as the server's kit, and one OpenMP thread unless set (importing torch then starts no thread)."""
    env = dict(base)
    env.update({"PYTHONPATH": str(cwd), SERVER_KIT_ENV: str(cwd), "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS") or "1"})
    return env


def _cuda_visible() -> bool:
    """Whether this (launcher) process sees a CUDA device; preloads stay off there (see the module docstring)."""
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


class ForkServers:
    """The fork servers of a grading run, started when first needed in ``cwd`` (a kit copy whose ``grading`` runs
    them): ``SERVERS`` of them, rank r forked by server r % ``SERVERS``. Their ranks may belong to any kit copy
    (see ``grading.engine.forkserver``).
    """

    SERVERS = 2

    def __init__(self, cwd: Path, env: dict[str, str] | None = None):
        self.cwd = Path(cwd).resolve()
        self.env = _server_env(self.cwd, os.environ if env is None else env)
        self._servers: dict[int, ForkServer] = {}
        self.preloads_allowed = not _cuda_visible()
        self.refused = ""                          # why preloading stopped for this run ("" while it works)

    def server(self, rank: int) -> ForkServer:
        """The server that forks rank ``rank`` (a dead one is replaced); it may still be importing."""
        index = rank % self.SERVERS
        current = self._servers.get(index)
        if current is None or not current.alive():
            if current is not None:
                current.close()
            env = {**self.env, "PYTHONHASHSEED": str(secrets.randbelow(2 ** 32))}
            self._servers[index] = ForkServer(self.cwd, env, index)
        return self._servers[index]

    def preload(self, world_size: int, modules: tuple[str, ...]) -> None:
        """Have the servers of ranks 0 .. ``world_size``-1 import ``modules`` (see the module docstring), side by
        side, and wait for them; nothing where CUDA is visible. A server that a preload left unable to fork is
        replaced by a fresh one, and the run preloads nothing more (``refused`` says why)."""
        if not (self.preloads_allowed and modules):
            return
        asked = [index for index in range(min(world_size, self.SERVERS)) if self.server(index).preload(modules)]
        for index in asked:
            error = self._servers[index].preload_done()
            if error:
                self.preloads_allowed, self.refused = False, error
                self._servers.pop(index).close()

    def warm_up(self, ranks: int = 2) -> None:
        """Start the servers of ranks 0 .. ``ranks``-1 now, in the background (their imports overlap the caller's
        own work); nothing waits for them here."""
        for rank in range(min(ranks, self.SERVERS)):
            self.server(rank)

    def close(self) -> None:
        for server in self._servers.values():
            server.close()
        self._servers.clear()

    def __enter__(self) -> ForkServers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Zygotes:
    """The zygotes of a ``batch`` or a test session (``grading.engine.zygote``): one per server slot, started from
    the kit copy ``cwd``, listening in a new temporary folder. The grading runs whose environment holds ``env()``
    get their servers from them. None are started without ``start`` or where CUDA is visible (``env()`` is then
    empty)."""

    READY_TIMEOUT_S = 10.0

    def __init__(self, cwd: Path, start: bool = True):
        self.folder: Path | None = None
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()
        if not start or _cuda_visible():
            return
        self.cwd = Path(cwd).resolve()
        self.folder = Path(tempfile.mkdtemp(prefix="grading-zygotes-"))
        self._env = _server_env(self.cwd, {k: v for k, v in os.environ.items() if k != ZYGOTES_ENV})
        self._procs = [self._start(index) for index in range(ForkServers.SERVERS)]
        self._wait_listening(range(ForkServers.SERVERS))

    def _wait_listening(self, indices) -> None:
        """Until the zygotes ``indices`` listen (they listen first and import after), at most READY_TIMEOUT_S."""
        deadline = time.monotonic() + self.READY_TIMEOUT_S
        while time.monotonic() < deadline and not all(socket_path(self.folder, i).exists() for i in indices):
            time.sleep(0.01)

    def _start(self, index: int) -> subprocess.Popen:
        path = socket_path(self.folder, index)
        path.unlink(missing_ok=True)                       # a dead zygote's socket
        return subprocess.Popen([sys.executable, "-m", "grading.engine.zygote", str(path)], cwd=self.cwd,
                                env={**self._env, "PYTHONHASHSEED": str(secrets.randbelow(2 ** 32))},
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)

    def env(self) -> dict[str, str]:
        """What a grading run's environment needs to use these zygotes; a zygote that died (a rank may kill its
        server's parent) is started again first."""
        with self._lock:                                   # batch threads ask side by side
            dead = [index for index, proc in enumerate(self._procs) if proc.poll() is not None]
            for index in dead:
                self._procs[index] = self._start(index)
            self._wait_listening(dead)
        return {ZYGOTES_ENV: str(self.folder)} if self.folder else {}

    def close(self) -> None:
        """Stop the zygotes (servers they forked for runs still going end with them) and remove their folder."""
        for proc in self._procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        self._procs.clear()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def __enter__(self) -> Zygotes:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
