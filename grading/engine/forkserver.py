"""Warm rank processes: fork servers that have imported torch once and fork every rank of a grading run.

A fresh ``python -m grading.engine.worker`` spends seconds importing torch
before milliseconds of probing. Instead, a grading run starts one *fork
server* per rank index (``python -m grading.engine.forkserver``, in the kit
copy under test, with ``OMP_NUM_THREADS=1`` so it stays single-threaded);
each imports torch and the worker module, then, on request, forks a rank:

    launcher ──request (spec, rank, key, run id, log paths)──▶ server r ──fork──▶ rank r of the case
             ◀─────────────── pid, later its exit status ───────┘

The forked child is a fresh process for everything the sandbox gives it: its
own session (process group), stdout/stderr to its files, the run's signing
key on a new stdin pipe, the run marker in its environment, its own
``random`` seed, then ``worker.main`` exactly as a cold start runs it
(limits, network namespace, group, probe). It holds no descriptor of the
server. Nothing of one case or submission reaches another: the servers never
import student or probe code, a run's servers belong to that run (one kit
copy), and each rank index has its own server, started with its own
``PYTHONHASHSEED``, so ranks of a case differ in hash order as fresh
interpreters do. The server is the *subreaper* of its ranks: a daemon that
double-forks and calls setsid is re-parented to it, and ``sweep`` kills every
descendant after a case; ``PR_SET_PDEATHSIG`` ties the server to the
launcher and the ranks to the server.
"""
from __future__ import annotations

import ctypes
import json
import os
import random
import secrets
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from grading.engine.sandbox import freeze_and_kill

PRELOAD = ("torch",)                 # imported by every server before the first fork
START_TIMEOUT_S = 120.0
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36


# ------------------------------------------------------------------------------------------ server side
def _descendants(root: int) -> list[int]:
    """Pids of every process below ``root`` in the process tree (by /proc parent links)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as handle:
                ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _sweep(me: int) -> list[int]:
    """Stop every descendant until no new one appears, then kill them all (``sandbox.freeze_and_kill``)."""
    return freeze_and_kill(lambda: _descendants(me))


def _reseed() -> None:
    """Draw new seeds, as a fresh interpreter does (``random``, torch's default generator, numpy's global one)."""
    random.seed()
    if "torch" in sys.modules:
        sys.modules["torch"].seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def _start_rank(request: dict, control: socket.socket) -> int:
    """Fork one rank for ``request``; in the child this never returns."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:                                           # the rank
        code = 70
        try:
            os.setsid()
            control.close()
            os.close(write_end)
            os.dup2(read_end, 0)
            for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
                log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(log, fd)
                os.close(log)
            os.closerange(3, 1 << 16)
            os.chdir(request["cwd"])
            os.environ.update(request["env"])
            _reseed()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            from grading.engine import worker
            sys.argv = [worker.__file__, request["spec"], str(request["rank"])]      # as a cold worker sees it
            code = worker.main(sys.argv[1:])
        except BaseException:  # noqa: BLE001 - report through the exit code; the worker logged what it could
            pass
        os._exit(code if isinstance(code, int) else 70)
    os.close(read_end)
    try:
        os.write(write_end, request["key"].encode())
    finally:
        os.close(write_end)
    return pid


def serve(fd: int) -> None:
    """The server loop on the inherited control socket ``fd`` (one JSON object per line each way)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    control = socket.socket(fileno=fd)
    for name in PRELOAD:
        __import__(name)
    from grading.engine import worker  # noqa: F401 - preloaded for the children
    threads = len(os.listdir("/proc/self/task"))
    ranks: set[int] = set()

    def send(message: dict) -> None:
        control.sendall((json.dumps(message) + "\n").encode())
    if threads != 1:
        send({"error": f"the fork server has {threads} threads after its imports"})
        return
    send({"ready": os.getpid()})
    buffer = b""
    while True:
        while True:                                        # reap: ranks report, adopted orphans vanish
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid in ranks:
                ranks.discard(pid)
                send({"exit": pid, "code": os.waitstatus_to_exitcode(status)})
        ready, _, _ = select.select([control], [], [], 0.02)
        if not ready:
            continue
        chunk = control.recv(65536)
        if not chunk:
            _sweep(os.getpid())
            return
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            request = json.loads(line)
            if request["op"] == "spawn":
                pid = _start_rank(request, control)
                ranks.add(pid)
                send({"spawned": pid})
            elif request["op"] == "sweep":
                send({"swept": _sweep(os.getpid())})


# ------------------------------------------------------------------------------------------ launcher side
class ForkServer:
    """One server process (see the module docstring), driven over a socket pair by the launcher."""

    def __init__(self, cwd: Path, env: dict[str, str]):
        ours, theirs = socket.socketpair()
        self._socket = ours
        self._buffer = b""
        self._ready = False
        self.exits: dict[int, int] = {}
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

    def spawn(self, spec: Path, rank: int, key: bytes, env: dict[str, str], stdout: Path, stderr: Path,
              cwd: Path) -> int:
        """Fork rank ``rank`` of the case whose spec is ``spec``; return its pid."""
        self.wait_ready()
        self._socket.sendall((json.dumps({"op": "spawn", "spec": str(spec), "rank": rank, "key": key.decode(),
                                          "env": env, "stdout": str(stdout), "stderr": str(stderr),
                                          "cwd": str(cwd)}) + "\n").encode())
        reply = self._next(lambda m: "spawned" in m, 30.0)
        if reply is None:
            raise RuntimeError("the fork server did not start the rank")
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


class ForkServers:
    """The fork servers of one grading run (one kit copy): one per rank index, started when first needed."""

    def __init__(self, cwd: Path, env: dict[str, str] | None = None):
        self.cwd = Path(cwd).resolve()
        self.env = dict(os.environ if env is None else env)
        self.env["PYTHONPATH"] = str(self.cwd)
        self.env["OMP_NUM_THREADS"] = self.env.get("OMP_NUM_THREADS") or "1"
        self._servers: dict[int, ForkServer] = {}

    def server(self, rank: int) -> ForkServer:
        """The server that forks rank ``rank`` (a dead one is replaced); it may still be importing."""
        current = self._servers.get(rank)
        if current is None or not current.alive():
            env = {**self.env, "PYTHONHASHSEED": str(secrets.randbelow(2 ** 32))}
            self._servers[rank] = ForkServer(self.cwd, env)
        return self._servers[rank]

    def warm_up(self, ranks: int = 2) -> None:
        """Start the servers of ranks 0 .. ``ranks``-1 now, in the background (their imports overlap the caller's
        own work); nothing waits for them here."""
        for rank in range(ranks):
            self.server(rank)

    def close(self) -> None:
        for server in self._servers.values():
            server.close()
        self._servers.clear()

    def __enter__(self) -> ForkServers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
