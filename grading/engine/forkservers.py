"""The launcher's side of warm rank processes: start, drive and stop the fork servers of a grading run.

See ``grading.engine.forkserver`` for what a server is and what a forked rank
gets. ``ForkServers`` holds the two servers (even and odd ranks), started when first
needed; ``ForkServer`` talks to one of them over a socket pair (one JSON object
per line each way: preload, spawn, sweep; ready, preloaded, spawned, exit,
swept, error).
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

START_TIMEOUT_S = 120.0


class ForkServer:
    """One server process (see the module docstring), driven over a socket pair by the launcher."""

    def __init__(self, cwd: Path, env: dict[str, str]):
        ours, theirs = socket.socketpair()
        self._socket = ours
        self._buffer = b""
        self._ready = False
        self.exits: dict[int, int] = {}
        self.preloaded: set[str] = set()           # modules already asked for (the server imports each once)
        self.proc = subprocess.Popen([sys.executable, "-m", "grading.engine.forkserver", str(theirs.fileno())],
                                     cwd=cwd, env=env, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
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
        return self.proc.poll() is None

    def close(self) -> None:
        """Stop the server and everything under it (idempotent)."""
        try:
            self._socket.close()
        except OSError:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


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
        self.env = dict(os.environ if env is None else env)
        self.env["PYTHONPATH"] = str(self.cwd)
        self.env[SERVER_KIT_ENV] = str(self.cwd)
        self.env["OMP_NUM_THREADS"] = self.env.get("OMP_NUM_THREADS") or "1"
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
            self._servers[index] = ForkServer(self.cwd, env)
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
