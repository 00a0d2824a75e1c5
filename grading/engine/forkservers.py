"""The launcher's side of warm rank processes: start, drive and stop the fork servers of a grading run.

See ``grading.engine.forkserver`` for what a server is and what a forked rank
gets. ``ForkServers`` holds the two servers (even and odd ranks), started when first
needed; ``ForkServer`` talks to one of them over a socket pair (one JSON object
per line each way: preload, spawn, sweep; ready, preloaded, spawned, exit,
swept, error). A server is a cold ``python -m grading.engine.forkserver``, or
a child of a zygote where the environment names zygotes (``grading.engine.zygote``;
``grading.engine.zygotes`` starts them).
"""
from __future__ import annotations

import json
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from grading.engine.forkserver import SERVER_KIT_ENV
from grading.engine.zygote import ZYGOTES_ENV, request_server

START_TIMEOUT_S = 120.0


class ForkServer:
    """One server process (see the module docstring), driven over a socket pair by the launcher."""

    def __init__(self, cwd: Path, env: dict[str, str], index: int = 0):
        """Start the server of slot ``index``: forked by the zygote of that slot where ``env`` names zygotes
        (``grading.engine.zygote``) and it agrees, else a cold ``python -m grading.engine.forkserver``."""
        ours, theirs = socket.socketpair()
        self._socket = ours
        self._buffer = b""
        self._inbox: list[dict] = []                # replies received but not yet asked for, in order
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

    def _receive(self, timeout_s: float) -> None:
        """Read what the server sent within ``timeout_s``: exit reports go to ``exits``, every other message to the
        inbox. Nothing read is dropped: one read may hold a reply and an exit sent after it (a rank that fails at
        once, read by a launcher the machine's load held back)."""
        ready, _, _ = select.select([self._socket], [], [], timeout_s)
        if not ready:
            return
        chunk = self._socket.recv(65536)
        if not chunk:
            raise RuntimeError("the fork server exited")
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        for message in map(json.loads, lines):
            if "exit" in message:
                self.exits[message["exit"]] = message["code"]
            else:
                self._inbox.append(message)

    def _next(self, wanted, timeout_s: float) -> dict | None:
        """The next reply that ``wanted`` accepts (replies before it that it does not accept are discarded: each
        request has one); None at the timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            while self._inbox:
                message = self._inbox.pop(0)
                if wanted(message):
                    return message
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self._receive(remaining)

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
            self._receive(0.0)
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
        return running(self.pid, self.proc)

    def fileno(self) -> int:
        """The launcher's end of the socket (readable when the server has sent something: ``select`` on it)."""
        return self._socket.fileno()

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


def running(pid: int, proc: subprocess.Popen | None) -> bool:
    """Whether a process still runs: one this process started (``proc``), or one a zygote forked (``pid``: the
    zygote reaps it, so gone means gone)."""
    if proc is not None:
        return proc.poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def server_env(cwd: Path, base) -> dict[str, str]:
    """The environment a fork server or a zygote starts in: ``base``, the kit copy ``cwd`` on ``PYTHONPATH`` and
    named as the server's kit, and one OpenMP thread unless set (importing torch then starts no thread)."""
    env = dict(base)
    env.update({"PYTHONPATH": str(cwd), SERVER_KIT_ENV: str(cwd), "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS") or "1"})
    return env


def cuda_visible() -> bool:
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
        self.env = server_env(self.cwd, os.environ if env is None else env)
        self._servers: dict[int, ForkServer] = {}
        self.preloads_allowed = not cuda_visible()
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


def wait_for_news(servers: list[ForkServer], at_most_s: float) -> None:
    """Return as soon as one of ``servers`` has sent something (a rank's exit: a finished case is noticed at
    once, not at the next poll) or after ``at_most_s``."""
    try:
        select.select(list({id(server): server for server in servers}.values()), [], [], at_most_s)
    except (OSError, ValueError):          # a socket already closed: the caller polls again after the interval
        time.sleep(at_most_s)
