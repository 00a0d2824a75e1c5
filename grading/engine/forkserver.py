"""Warm rank processes: fork servers that import torch once and fork the ranks of a grading run.

A fresh ``python -m grading.engine.worker`` spends seconds importing torch before milliseconds of probing. A
grading run (``grade``, each submission of ``batch``) therefore starts two fork servers, for even and odd ranks
(one with ``GRADING_FORKSERVERS=1``, to hold the libraries once where memory is scarce: ``server_count``),
each ``python -m grading.engine.forkserver`` under ``OMP_NUM_THREADS=1`` (single-threaded): it imports torch,
then forks a rank per request::

    launcher ──request (spec, rank, key, environment, kit, logs)──▶ server r % 2 ──fork──▶ rank r of the case
             ◀──────────────── pid, later its exit status ───────────┘

``serve`` is the server's loop, ``ForkServers`` the launcher's handle (one JSON object a line each way over a
socket pair). A forked rank is a fresh process for everything the sandbox gives it: its own session, its log
files, the key on a new stdin pipe, the environment a cold rank would get now
(``grading.startup.adopt_environment``), new random seeds, every kit module imported from the kit copy the
request names (the server's ``grading`` modules are dropped: a server holds library modules only, and nothing of
one case reaches another), then ``worker.main``. Each server has its own ``PYTHONHASHSEED``, so neighbouring ranks
differ in hash order as fresh interpreters do. A server is the *subreaper* of its ranks: what a rank
double-forks away is re-parented to it and swept (``psutil``) after the case. ``PR_SET_PDEATHSIG`` ties the
server to the launcher and (``sandbox``) the ranks to the server.

A forked rank ends with ``os._exit`` after the worker has written its results and ``done`` marker and flushed
its streams: the documented end of a child after ``fork()`` (``multiprocessing`` ends its fork and forkserver
children so), since the code below the fork is the server's loop. A stray non-daemon thread ends with it.

*Preloads* (``Case.preload``, ``grading.startup``): before forking a case's ranks each server imports those it
has not imported yet, once. A server that a preload leaves with a second thread could fork a held lock: it
refuses (``error``), is replaced, and the run preloads no more; a failed import is left to the rank. Where CUDA
is visible nothing is preloaded (a library that touches the driver before ``fork`` breaks the ranks' CUDA).
"""
from __future__ import annotations

import contextlib
import ctypes
import importlib
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

import psutil

from grading.engine.sandbox import freeze_and_kill, signal_group
from grading.startup import SERVER_IMPORTS, adopt_environment

SERVER_KIT_ENV = "GRADING_FORKSERVER_KIT"     # the folder the server was started in (it leaves a rank's sys.path)
START_TIMEOUT_S = 120.0
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36


# ------------------------------------------------------------------------------------------ server side
def descendants(pid: int) -> list[int]:
    """Pids of every process below ``pid`` (a live one) in the process tree."""
    return [child.pid for child in psutil.Process(pid).children(recursive=True)]


def _in_rank(request: dict, control: socket.socket, key_pipe: int) -> int:
    """In a freshly forked rank: become what a cold worker would be (module docstring); run the worker."""
    os.setsid()
    control.close()
    os.dup2(key_pipe, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        log = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if request["append"] else os.O_TRUNC), 0o644)
        os.dup2(log, fd)
        os.close(log)
    os.closerange(3, 1 << 16)
    os.chdir(request["cwd"])
    server_kit, hash_seed = os.environ.get(SERVER_KIT_ENV, ""), os.environ.get("PYTHONHASHSEED")
    adopt_environment({**request["env"], **({"PYTHONHASHSEED": hash_seed} if hash_seed else {})})  # our hashes' seed
    for name in [name for name in sys.modules if name == "grading" or name.startswith("grading.")]:
        del sys.modules[name]
    sys.path[:] = [request["cwd"], *(entry for entry in sys.path if entry not in ("", server_kit, request["cwd"]))]
    importlib.invalidate_caches()
    random.seed()
    sys.modules["torch"].seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    from grading.engine import worker
    sys.argv = [worker.__file__, request["spec"], str(request["rank"])]      # as a cold worker sees it
    return worker.main(sys.argv[1:])


def _start_rank(request: dict, control: socket.socket) -> int:
    """Fork one rank for ``request`` and hand it the key; return its pid (in the child this never returns)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            os.close(write_end)
            code = _in_rank(request, control, read_end)      # the worker flushed its streams, wrote its results
        except BaseException:  # noqa: BLE001 - reported through the exit code; the worker logged what it could
            pass
        os._exit(code if isinstance(code, int) else 70)    # a forked child's end (module docstring)
    os.close(read_end)
    try:
        os.write(write_end, request["key"].encode())
    finally:
        os.close(write_end)
    return pid


def _preload(modules: list[str]) -> str:
    """Import each of ``modules`` not imported yet (a failure is left to the rank that needs it); return why this
    process must not fork now ("" when it may)."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the rank imports it again and reports what goes wrong there
            sys.modules.pop(name, None)
    threads = psutil.Process().num_threads()
    return "" if threads == 1 else f"the fork server has {threads} threads after preloading {modules}"


def serve(fd: int) -> None:
    """The server loop on the control socket ``fd``: it ends, sweeping its ranks, when the launcher closes the
    socket, and is killed when the launcher dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    control = socket.socket(fileno=fd)

    def send(message: dict) -> None:
        control.sendall((json.dumps(message) + "\n").encode())
    error = _preload(list(SERVER_IMPORTS))
    send({"error": error} if error else {"ready": os.getpid()})
    ranks, buffer = set(), b""
    while not error:
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
        if not select.select([control], [], [], 0.02)[0]:
            continue
        chunk = control.recv(65536)
        if not chunk:
            freeze_and_kill(lambda: descendants(os.getpid()))
            return
        *lines, buffer = (buffer + chunk).split(b"\n")
        for request in map(json.loads, lines):
            if request["op"] == "preload":
                error = _preload(request["modules"])
                send({"error": error} if error else {"preloaded": request["modules"]})
            elif request["op"] == "spawn":
                ranks.add(pid := _start_rank(request, control))
                send({"spawned": pid})
            elif request["op"] == "sweep":
                send({"swept": freeze_and_kill(lambda: descendants(os.getpid()))})


# ------------------------------------------------------------------------------------------ launcher side
class ForkServer:
    """One server process (module docstring), driven over a socket pair by the launcher."""

    def __init__(self, cwd: Path, env: dict[str, str]):
        """Start a ``python -m grading.engine.forkserver`` in ``cwd`` with ``env``; it imports in the background."""
        ours, theirs = socket.socketpair()
        self._socket, self._buffer, self._inbox, self._ready = ours, b"", [], False
        self.exits: dict[int, int] = {}
        self.preloaded: set[str] = set()           # modules already asked for (the server imports each once)
        self.proc = subprocess.Popen([sys.executable, "-m", "grading.engine.forkserver", str(theirs.fileno())],
                                     cwd=cwd, env=env, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.pid = self.proc.pid
        theirs.close()

    def _receive(self, timeout_s: float) -> None:
        """Read what the server sent within ``timeout_s``: exit reports into ``exits``, replies into the inbox, in
        order (one read may hold a reply and an exit sent after it)."""
        if not select.select([self._socket], [], [], timeout_s)[0]:
            return
        chunk = self._socket.recv(65536)
        if not chunk:
            raise RuntimeError("the fork server exited")
        *lines, self._buffer = (self._buffer + chunk).split(b"\n")
        for message in map(json.loads, lines):
            if "exit" in message:
                self.exits[message["exit"]] = message["code"]
            else:
                self._inbox.append(message)

    def reply(self, kind: str, timeout_s: float = START_TIMEOUT_S) -> dict:
        """The next reply of ``kind`` (replies before it are dropped: each request has one). Raises RuntimeError
        with the server's ``error``, at the timeout, or when the server is gone."""
        deadline = time.monotonic() + timeout_s
        while True:
            while self._inbox:
                message = self._inbox.pop(0)
                if "error" in message:
                    raise RuntimeError(message["error"])
                if kind in message:
                    return message
            if (remaining := deadline - time.monotonic()) <= 0:
                raise RuntimeError(f"the fork server sent no '{kind}' in {timeout_s:.0f} s")
            self._receive(remaining)

    def ask(self, request: dict) -> None:
        """Send ``request`` once the server is ready (it may still be importing torch); RuntimeError if it is not."""
        if not self._ready:
            try:
                self.reply("ready")
            except RuntimeError:
                self.close()
                raise
            self._ready = True
        self._socket.sendall((json.dumps(request) + "\n").encode())

    def spawn(self, spec: Path, rank: int, key: bytes, env: dict[str, str], stdout: Path, stderr: Path,
              cwd: Path, append: bool = False) -> int:
        """Fork rank ``rank`` of the case whose spec is ``spec`` (logs appended to with ``append``); its pid."""
        self.ask({"op": "spawn", "spec": str(spec), "rank": rank, "key": key.decode(), "env": env,
                  "stdout": str(stdout), "stderr": str(stderr), "cwd": str(cwd), "append": append})
        return self.reply("spawned")["spawned"]

    def poll(self) -> dict[int, int]:
        """Exit codes reported so far (pid -> code, negative for a signal)."""
        with contextlib.suppress(RuntimeError):      # gone: ``alive`` says so
            self._receive(0.0)
        return self.exits

    def sweep(self) -> list[int]:
        """Kill every process the server's ranks left behind (re-parented to it); their pids. A server that is
        gone (a rank killed it) sweeps nothing: its ranks died with it, the run marker finds the rest."""
        try:
            self.ask({"op": "sweep"})
            return self.reply("swept", 30.0)["swept"]
        except (OSError, RuntimeError):
            return []

    def alive(self) -> bool:
        return self.proc.poll() is None

    def fileno(self) -> int:
        """The launcher's end of the socket: readable when the server has sent something (a rank's exit)."""
        return self._socket.fileno()

    def close(self) -> None:
        """Stop the server and everything under it (idempotent)."""
        self._socket.close()
        signal_group(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


SERVERS_ENV = "GRADING_FORKSERVERS"


def server_count(env: dict[str, str] | None = None) -> int:
    """How many fork servers a grading run keeps, from ``GRADING_FORKSERVERS`` in ``env`` (default
    ``os.environ``): ``2`` (the default: two ranks' preloads import side by side) or ``1`` (the libraries held
    once: a full grade of Problems 1-3 peaks near 670 MB of PSS instead of 970 MB, what Gradescope's 768 MB
    container needs; ``run_autograder`` sets it). With one server every rank shares its ``PYTHONHASHSEED``, so
    a bug that needs two ranks to iterate a set of strings in different orders goes unseen. Raises ValueError
    for any other value."""
    value = (os.environ if env is None else env).get(SERVERS_ENV, "2")
    if value not in ("1", "2"):
        raise ValueError(f"{SERVERS_ENV} must be 1 or 2, not {value!r}")
    return int(value)


class ForkServers:
    """The fork servers of a grading run, started when first needed in ``cwd`` (a kit copy whose ``grading`` runs
    them; ``env``: their environment, default this process's): rank r is forked by server r % ``servers``
    (``server_count``), for any kit copy (module docstring)."""

    def __init__(self, cwd: Path, env: dict[str, str] | None = None):
        self.cwd = Path(cwd).resolve()
        base = dict(os.environ if env is None else env)
        self.servers = server_count(base)
        self.env = {**base, "PYTHONPATH": str(self.cwd), SERVER_KIT_ENV: str(self.cwd),
                    "OMP_NUM_THREADS": base.get("OMP_NUM_THREADS") or "1"}   # importing torch starts no thread
        self._servers: dict[int, ForkServer] = {}
        self.preloads_allowed: bool | None = None   # decided at the first preload: not where CUDA is visible
        self.refused = ""                          # why preloading stopped for this run ("" while it works)

    def server(self, rank: int) -> ForkServer:
        """The server that forks rank ``rank`` (a dead one is replaced); it may still be importing."""
        index = rank % self.servers
        current = self._servers.get(index)
        if current is None or not current.alive():
            if current is not None:
                current.close()
            self._servers[index] = ForkServer(self.cwd, {**self.env, "PYTHONHASHSEED": str(secrets.randbelow(2**32))})
        return self._servers[index]

    def preload(self, world_size: int, modules: tuple[str, ...]) -> None:
        """Have the servers of ranks 0 .. ``world_size``-1 import ``modules`` side by side, and wait for them;
        nothing where CUDA is visible. A server that a preload left unable to fork is replaced, and the run
        preloads nothing more (``refused`` says why)."""
        if self.preloads_allowed is None:
            import torch
            self.preloads_allowed = not torch.cuda.is_available()
        if not (self.preloads_allowed and modules):
            return
        asked = []
        for index in range(min(world_size, self.servers)):
            server = self.server(index)
            if wanted := [name for name in modules if name not in server.preloaded]:
                server.ask({"op": "preload", "modules": wanted})
                server.preloaded.update(wanted)
                asked.append(index)
        for index in asked:                          # all servers import side by side; then wait for each
            try:
                self._servers[index].reply("preloaded")
            except (OSError, RuntimeError) as exc:
                self.preloads_allowed, self.refused = False, str(exc)
                self._servers.pop(index).close()

    def warm_up(self, ranks: int = 2) -> None:
        """Start the servers of ranks 0 .. ``ranks``-1 now (their imports overlap the caller's own work)."""
        for rank in range(min(ranks, self.servers)):
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
