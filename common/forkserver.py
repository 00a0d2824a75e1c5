"""Warm processes: a fork server imports torch once and, per launcher connection, forks a *session* that forks ranks.

    launcher ──connect──▶ server ──fork──▶ session ──fork per request──▶ rank (or a whole grade: ``main_warm``)
             ◀──────── pid, later its exit status (one JSON object a line each way) ─┘

The one way a warm rank starts, for the grader and the entry points alike: ``serve`` is the server (``python -m
common.forkserver``), ``ServerSession`` the launcher's end of a session. The entry points keep one server per
launching process (``project.rank_start``); the grader keeps a run's servers, with their hash seeds, preloads and
pools, in ``grading.engine.run_servers``.
"""
from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import json
import os
import random
import secrets
import select
import signal
import socket
import struct
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

import psutil

from common.process_tree import descendants, freeze_and_kill, signal_group
from common.settings import SERVER_KIT_ENV     # the folder the server was started in (it leaves a rank's sys.path)
from common.startup import SERVER_IMPORTS, adopt_environment, collect_as_python_does, collect_less

KIT_PACKAGES = ("grading", "common")           # imported afresh by every child from the folder it names
START_TIMEOUT_S = 120.0
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36


# ------------------------------------------------------------------------------------------ server side
def _in_child(request: dict, control: socket.socket, stdin: int, streams: list[int]) -> int:
    """In a freshly forked child: become what a cold ``python -m MODULE ARGV`` would be (its own session, the
    ``streams`` the launcher sent as stdout and stderr, and as file descriptor 3 a third one where it sent one, the
    key on ``stdin``, the launcher's environment, new random seeds, ``KIT_PACKAGES`` imported afresh from the
    request's folder, or from its ``path`` where it names the launcher's ``sys.path``) and run
    ``MODULE.main(ARGV)``: a rank's worker, an entry point's rank, or a grade (``main_warm``)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)    # dies with its session
    os.setsid()
    control.close()
    for fd, stream in zip((0, 1, 2, 3), (stdin, *streams)):
        os.dup2(stream, fd)
    os.closerange(1 + len(streams), 1 << 16)
    os.chdir(request["cwd"])
    server_kit, hash_seed = os.environ.get(SERVER_KIT_ENV, ""), os.environ.get("PYTHONHASHSEED")
    adopt_environment({**request["env"], **({"PYTHONHASHSEED": hash_seed} if hash_seed else {})})  # our hashes' seed
    for name in [name for name in sys.modules if name.partition(".")[0] in KIT_PACKAGES]:
        del sys.modules[name]
    sys.path[:] = request.get("path") or \
        [request["cwd"], *(entry for entry in sys.path if entry not in ("", server_kit, request["cwd"]))]
    importlib.invalidate_caches()
    random.seed()
    sys.modules["torch"].seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    collect_as_python_does()
    module = importlib.import_module(request["module"])
    sys.argv = [module.__file__, *request["argv"]]                   # as a cold process sees it
    try:
        return module.main(request["argv"])
    except SystemExit as exc:                                         # argparse's --help and usage errors
        return exc.code if isinstance(exc.code, int) else 1


def _start_child(request: dict, control: socket.socket, streams: list[int]) -> int:
    """Fork the child ``request`` asks for, hand it the key and close our copies of ``streams``; return its pid (in
    the child this never returns)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            os.close(write_end)
            code = _in_child(request, control, read_end, streams)
        except BaseException:  # noqa: BLE001 - reported through the exit code and, as a cold process does, a traceback
            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):          # a log over its size limit
                    stream.flush()
            os._exit(code if isinstance(code, int) else 70)    # a forked child's documented end (as multiprocessing's)
    for stream in (read_end, *streams):
        os.close(stream)
    try:
        os.write(write_end, request["key"].encode())
    finally:
        os.close(write_end)
    return pid


def _same_pid_namespace(control: socket.socket) -> bool:
    """Whether the process at the other end of ``control`` runs as this server's user in this server's PID
    namespace (a launcher, a grade), not a rank (``grading.sandbox.isolation``: another PID namespace, or the
    unprivileged user it switched to): a rank that reached the server could otherwise have a process started
    outside its view."""
    try:
        pid, uid, _ = struct.unpack("3i", control.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                              struct.calcsize("3i")))
        return pid > 0 and uid == os.geteuid() and \
            os.readlink(f"/proc/{pid}/ns/pid") == os.readlink("/proc/self/ns/pid")
    except (OSError, AttributeError):              # AttributeError: no SO_PEERCRED (not Linux)
        return False


def _preload(modules: list[str]) -> str:
    """Import each of ``modules`` not imported yet (a failure is left to the rank that needs it); return why this
    process must not fork now ("" when it may)."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the rank imports it again and reports what goes wrong there
            sys.modules.pop(name, None)
    gc.freeze()           # what is imported now is never walked again, here or in a child (no page copied for it)
    threads = psutil.Process().num_threads()
    return "" if threads == 1 else f"the fork server has {threads} threads after preloading {modules}"


def _session(control: socket.socket) -> None:
    """Serve one launcher's connection ``control`` (in a process of its own, forked per connection): fork its ranks
    and report their exits; it ends, killing them and what they left behind (re-parented to it), when the
    launcher closes the socket."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

    def send(message: dict) -> None:
        control.sendall((json.dumps(message) + "\n").encode())
    try:
        send({"ready": os.getpid(), "python": sys.executable})
        children, buffer, streams = set(), b"", []
        while True:
            with contextlib.suppress(ChildProcessError):       # reap: ranks report, adopted orphans vanish
                while (reaped := os.waitpid(-1, os.WNOHANG))[0]:
                    if reaped[0] in children:
                        children.discard(reaped[0])
                        send({"exit": reaped[0], "code": os.waitstatus_to_exitcode(reaped[1])})
            if not select.select([control], [], [], 0.02)[0]:
                continue
            chunk, received, _flags, _address = socket.recv_fds(control, 65536, 3)
            if not chunk:
                break
            *lines, buffer = (buffer + chunk).split(b"\n")
            streams += received                     # a request's stdout and stderr come with its first bytes
            for request in map(json.loads, lines):
                children.add(pid := _start_child(request, control, streams))
                send({"spawned": pid})
                streams = []
    finally:                                               # a launcher gone mid-send: still sweep
        freeze_and_kill(lambda: descendants(os.getpid()))


def serve(listener_fd: int) -> None:
    """The server on the listening socket ``listener_fd``: import ``SERVER_IMPORTS``; then, per connection, import
    what its request's ``preload`` names and fork a ``_session`` for it. A preload that leaves it with a second
    thread ends it, with that error as the answer (it must not fork again); it is killed when its starter dies."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    collect_less()                          # it imports the libraries; its sessions fork, hold and sweep
    listener = socket.socket(fileno=listener_fd)
    if _preload(list(SERVER_IMPORTS)):
        return
    while True:
        with contextlib.suppress(ChildProcessError):       # reap the sessions that ended
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        if not select.select([listener], [], [], 0.5)[0]:
            continue
        control = listener.accept()[0]
        if not _same_pid_namespace(control):        # a rank in its own namespaces: it may not leave them this way
            control.close()
            continue
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            control.settimeout(30.0)      # the request: one line (a launcher sends nothing more before the answer)
            modules = json.loads(control.makefile("rb").readline())["preload"]
            control.settimeout(None)
            if error := _preload(modules):
                control.sendall((json.dumps({"error": error}) + "\n").encode())
                return
            if os.fork() == 0:
                code = 70
                try:
                    listener.close()
                    _session(control)
                    code = 0
                finally:
                    os._exit(code)                          # a forked child's documented end
        control.close()


# ------------------------------------------------------------------------------------------ launcher side
def start_server(cwd: Path, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    """Start a ``python -m common.forkserver`` in ``cwd`` with ``env``, listening at a new abstract socket
    address: (its process, the address). It imports in the background; a connection waits for it."""
    address = "\0kit-forkserver-" + secrets.token_hex(8)
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(address)
        listener.listen(64)
        proc = subprocess.Popen([sys.executable, "-m", "common.forkserver", str(listener.fileno())],
                                cwd=cwd, env=env, pass_fds=(listener.fileno(),), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    return proc, address


class Server:
    """One fork server of a launcher: started in ``cwd`` when first asked for (``address``), with the environment
    ``env()`` returns then, started again when it has ended, and stopped with everything under it (``stop``)."""

    def __init__(self, cwd: Path, env: Callable[[], dict[str, str]]):
        self.cwd, self.env = cwd, env
        self.proc: subprocess.Popen | None = None
        self._address = ""

    def address(self) -> str:
        """Where the server listens: a running one's, else a new one's (``start_server``)."""
        if not self.running:
            self.proc, self._address = start_server(self.cwd, self.env())
        return self._address

    @property
    def running(self) -> bool:
        """Whether the server's process runs now."""
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """Kill the server's process group (its sessions and their ranks end with it) and reap it; idempotent."""
        if self.proc is not None:
            signal_group(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
            self.proc = None


class ServerSession:
    """A launcher's session with a server (module docstring): a process the server forked for this connection,
    which forks the ranks asked for and ends, sweeping them, when the connection closes."""

    def __init__(self, address: str, preload: tuple[str, ...] = ()):
        """Ask the server at ``address`` (OSError when none listens there) for a session, forked once it has imported
        ``preload``; it may still be importing (``ready`` waits)."""
        self._socket = socket.socket(socket.AF_UNIX)
        try:
            self._socket.connect(address)
            self._socket.sendall((json.dumps({"preload": list(preload)}) + "\n").encode())
        except OSError:
            self._socket.close()
            raise
        self._buffer, self._inbox, self._gone = b"", [], False
        self.pid = 0                                # the session's process, once it is ready
        self.exits: dict[int, int] = {}

    def _receive(self, timeout_s: float) -> None:
        """Read what the session sent within ``timeout_s``: exit reports into ``exits``, replies into the inbox, in
        order (one read may hold a reply and an exit sent after it)."""
        if not select.select([self._socket], [], [], timeout_s)[0]:
            return
        try:
            chunk = self._socket.recv(65536)
        except OSError:
            chunk = b""
        if not chunk:
            self._gone = True
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

    def ready(self) -> None:
        """Wait until the session is ready; RuntimeError (and the session closed) when it does not come: the
        server's error, the timeout, or the server gone."""
        if not self.pid:
            try:
                answer = self.reply("ready")
                if answer["python"] != sys.executable:
                    raise RuntimeError(f"the fork server runs {answer['python']}, not {sys.executable}")
                self.pid = answer["ready"]
            except RuntimeError:
                self.close()
                raise

    def start(self, module: str, argv: list[str], cwd: Path, env: dict[str, str], streams: tuple[int, ...],
              key: bytes = b"", path: list[str] | None = None) -> int:
        """Once the session is ready, fork ``MODULE.main(ARGV)`` as ``python -m MODULE ARGV`` runs it, in ``cwd`` with
        ``env``, on the open files ``streams`` (stdout, stderr, and optionally a third one, its descriptor 3) with
        ``key`` on its stdin, importing from ``path`` (default: ``cwd`` first, then the server's path); return its
        pid."""
        self.ready()
        request = (json.dumps({"module": module, "argv": argv, "cwd": str(cwd), "env": env, "key": key.decode(),
                               **({"path": path} if path else {})}) + "\n").encode()
        sent = socket.send_fds(self._socket, [request], list(streams))
        self._socket.sendall(request[sent:])
        return self.reply("spawned")["spawned"]

    def poll(self) -> dict[int, int]:
        """Exit codes reported so far (pid -> code, negative for a signal)."""
        with contextlib.suppress(RuntimeError, ValueError):      # gone (or closed): ``alive`` says so
            self._receive(0.0)
        return self.exits

    def alive(self) -> bool:
        """Whether the session still serves (a session killed from outside the ranks' view does not)."""
        self.poll()
        return not self._gone

    def fileno(self) -> int:
        """The launcher's end of the socket: readable when the server has sent something (a rank's exit)."""
        return self._socket.fileno()

    def close(self) -> None:
        """End the session and wait (bounded) until it has killed its ranks and what they left behind, and ended
        (idempotent). A session that is gone (a rank killed it) sweeps nothing: its ranks died with it
        (``PR_SET_PDEATHSIG``), the run marker finds the rest."""
        self._gone = True
        self._socket.close()
        deadline = time.monotonic() + 10.0
        while self.pid and time.monotonic() < deadline:
            try:
                if psutil.Process(self.pid).status() == psutil.STATUS_ZOMBIE:
                    return
            except psutil.Error:
                return
            time.sleep(0.01)


if __name__ == "__main__":
    serve(int(sys.argv[1]))
