"""Zygotes: a process that has imported torch and every library preload once, and forks a fresh fork server for
each grading run that asks.

A grading run starts two fork servers (``grading.engine.forkserver``), and each
imports torch and the preloads its cases name: seconds of CPU per server, paid
again by every ``grade`` of a ``batch`` and by every ``grade`` a test runs.
Where ``GRADING_ZYGOTES`` names a folder, a run's ``ForkServers`` instead asks
the zygote listening there for server slot i (``zygote<i>.sock``) for a server:
the zygote forks a child that serves the run's socket (sent over the Unix
socket), exactly the server loop a cold server runs::

    grade ──socket pair end──▶ zygote i (torch + preloads, one thread) ──fork──▶ server i of this run ──▶ ranks

A zygote imports torch and the library preloads it was started with
(``python -m grading.engine.zygote SOCKET [MODULE ...]``; default: every tuple
in ``grading.engine.preloads``); a server imports what else its run asks for.
Asked for a *zygote* instead (``request_zygote``: a socket path and the read
end of a pipe), it forks one that listens there, holding everything it
imported, and serves until the asker closes the pipe's other end or exits,
then removes its socket (and the folder, once empty) (the kit's test workers
fork their zygotes from one master set this way).
Asked for a *command* (``request_command``: ``python -m grading grade ...``
with its folder, environment and stdio), it forks it in a new session
(``grading.engine.forked_command``; ``batch`` starts each submission's grade
so, ``grading.engine.kit_command``, instead of a new interpreter importing
torch again). What a zygote forks (a server, a zygote, a command) goes on
only once the requester, having read its pid, sends ``GO``: a requester that
gave up waiting starts its own, cold, and the request the zygote reads late
then never runs a second copy (two servers on one run's socket, two graders
writing one submission's results).
A zygote holds library modules only, like a server; it never preloads for a
run, never forks a rank and never runs kit, student or probe code itself (a
command's kit code runs in the forked child), so nothing of one run reaches
another: each run's servers are new processes, and what a
run's preloads add stays in its own server. A server ends with its run (the
launcher closes its socket), not with the zygote: a rank that kills its
server's parent (the zygote) ends no run; later runs start their servers cold
until ``Zygotes`` starts that zygote again. The zygote is the subreaper of
its servers: a process a killed server leaves behind is re-parented to it (and
reaped by it), so it stays findable below the zygote (the kit's adversarial
tests look there for leaks), never below init. Each zygote has its own
``PYTHONHASHSEED`` (neighbouring ranks differ in hash order as with cold
servers). A zygote refuses a run whose ``forkserver`` / ``sandbox`` source
differs from its own (a kit copy of another version); a refused, dead or
missing zygote only means the run starts its servers cold (``ForkServer``).
``batch`` starts zygotes for its submissions, the kit's test session for its
``grade`` runs (``grading.engine.zygotes.Zygotes``); nothing is started where CUDA is
visible (preloads there could touch the driver before ``fork``).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import select
import signal
import socket
import sys
from pathlib import Path

from grading.engine import forked_command, forkserver, sandbox
from grading.engine.preloads import DEEPSPEED_IMPORTS, GPT2_IMPORTS, OPTIMIZER_IMPORTS

ZYGOTES_ENV = "GRADING_ZYGOTES"          # a folder with one listening zygote<i>.sock per server slot
GO = b"g"                                # the requester got the pid and still wants what was forked
IMPORTS = tuple(dict.fromkeys((*forkserver.PRELOAD, *OPTIMIZER_IMPORTS, *GPT2_IMPORTS, *DEEPSPEED_IMPORTS)))


def socket_path(folder: Path, index: int) -> Path:
    """Where the zygote of server slot ``index`` listens."""
    return Path(folder) / f"zygote{index}.sock"


@functools.cache
def server_source_digest() -> str:
    """A digest of the code a forked server runs (the server loop and its sandbox helpers), as this process first
    read it: a zygote serves only runs whose kit copy has the same code."""
    digest = hashlib.sha256()
    for module in (forkserver, sandbox):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()


def _request(folder: Path, index: int, fds: list[int], what: dict, timeout_s: float) -> int | None:
    """Send the zygote of slot ``index`` in ``folder`` the request ``what`` (with this kit's digest) and ``fds``; the
    pid it forked, or None when there is no zygote there, it refused or it did not answer within ``timeout_s``.
    The pid is answered with ``GO``: what the zygote forked starts only then, so a request this process gave up on
    (and so starts itself, cold) never also runs forked when the zygote reads it late."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout_s)
            conn.connect(str(socket_path(folder, index)))
            request = json.dumps({**what, "digest": server_source_digest()}).encode() + b"\n"
            socket.send_fds(conn, [request], fds)
            reply = b""
            while not reply.endswith(b"\n"):
                chunk = conn.recv(4096)
                if not chunk:
                    return None
                reply += chunk
            pid = json.loads(reply).get("pid")
            if not isinstance(pid, int):
                return None
            conn.sendall(GO)
    except (OSError, ValueError):
        return None
    return pid


def request_server(folder: Path, index: int, theirs: socket.socket, timeout_s: float) -> int | None:
    """Ask the zygote of slot ``index`` in ``folder`` to fork a server for the socket ``theirs``; its pid, or None
    when there is no zygote there, it refused (another kit version) or it did not answer within ``timeout_s``."""
    return _request(folder, index, [theirs.fileno()], {}, timeout_s)


def request_command(folder: Path, index: int, request: dict, fds: list[int], timeout_s: float) -> int | None:
    """Ask the zygote of slot ``index`` in ``folder`` to fork the command ``request`` describes
    (``grading.engine.forked_command``) with ``fds`` (stdin, stdout, stderr, the status pipe's write end); the pid
    of the command's waiter, or None when there is no zygote there, it refused or it did not answer."""
    return _request(folder, index, fds, request, timeout_s)


def request_zygote(folder: Path, index: int, path: Path, alive: int, timeout_s: float) -> int | None:
    """Ask the zygote of slot ``index`` in ``folder`` to fork a zygote listening on ``path`` that serves until
    the write end of the pipe whose read end is ``alive`` is closed (its requester exits); its pid, or None."""
    return _request(folder, index, [alive], {"zygote": str(path)}, timeout_s)


def _in_child(listener: socket.socket, conn: socket.socket, alive: int | None) -> None:
    """In a zygote's new child: drop the zygote's sockets and pipe end, lead a new session, and go on only once
    the requester sends ``GO`` (EOF instead: it gave up and started its own; exit). No time limit: a requester
    that read the pid sends GO at once or closes the connection, however loaded the machine."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)          # the zygote's own (``main``) is not the child's
    listener.close()
    if alive is not None:
        os.close(alive)
    os.setsid()                                            # its own process group, as a cold server's
    try:
        conn.settimeout(None)
        go = conn.recv(len(GO)) == GO
    except OSError:
        go = False
    conn.close()
    if not go:
        os._exit(0)


def _fork_server(fd: int, listener: socket.socket, conn: socket.socket, alive: int | None) -> int:
    """Fork the server for a run's socket ``fd``; in the child this never returns."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            _in_child(listener, conn, alive)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the server reaps its ranks itself
            forkserver.serve(fd, tied_to_parent=False)    # a rank that kills the zygote ends no run
        except BaseException:  # noqa: BLE001 - the run sees its socket close and reports the server gone
            code = 70
        os._exit(code)
    os.close(fd)
    return pid


def _fork_command(request: dict, fds: list[int], listener: socket.socket, conn: socket.socket,
                  alive: int | None) -> int:
    """Fork the waiter of the command ``request`` (``grading.engine.forked_command``); in the child this never
    returns."""
    pid = os.fork()
    if pid == 0:
        try:
            _in_child(listener, conn, alive)
        except BaseException:  # noqa: BLE001 - the requester reads no status: the command did not run
            os._exit(70)
        forked_command.run_in_child(request, fds[:3], fds[3], _COMMAND_CONTEXT[1])
    for fd in fds:
        os.close(fd)
    return pid


def _fork_zygote(path: str, fd: int, listener: socket.socket, conn: socket.socket, alive: int | None) -> int:
    """Fork a zygote that listens on ``path`` and serves until the pipe ``fd`` ends; in the child this never
    returns. It holds what this zygote imported, so it is ready at once. When the pipe ends (its requester is
    gone, however it went) it removes its socket, and the socket's folder once that is empty."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            _in_child(listener, conn, alive)
            _serve(_listen(path), fd)
            _leave(Path(path))
        except BaseException:  # noqa: BLE001 - the requester finds no zygote listening and starts its own
            code = 70
        os._exit(code)
    os.close(fd)
    return pid


def _listen(path: str) -> socket.socket:
    """A zygote's listening socket at ``path``; this process becomes the subreaper of what it forks."""
    ctypes.CDLL(None, use_errno=True).prctl(forkserver._PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    return listener


def _leave(path: Path) -> None:
    """Remove this zygote's socket ``path``, and its folder if nothing else is left there (the last zygote of a
    set whose owner exited without closing them)."""
    path.unlink(missing_ok=True)
    try:
        path.parent.rmdir()
    except OSError:
        pass


def _serve(listener: socket.socket, alive: int | None) -> None:
    """Fork a server (or a zygote) for each request on ``listener``; return when the pipe ``alive`` ends."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)         # what ends is reaped by the kernel
    digest = server_source_digest()
    while True:
        if alive is not None and alive in select.select([listener, alive], [], [])[0]:
            return                                         # whoever asked for this zygote is gone
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(10.0)                          # a requester that stops mid-request blocks no other
            try:
                message, fds, _, _ = socket.recv_fds(conn, 65536, 4)
                while message and not message.endswith(b"\n"):      # a command's environment may be long
                    chunk = conn.recv(65536)
                    message += chunk if chunk else b"\n"
            except OSError:
                continue
            try:
                request = json.loads(message.split(b"\n", 1)[0])
                wanted = request.get("digest")
            except (ValueError, AttributeError):
                request, wanted = {}, None
            why = _refusal(request, fds) if wanted == digest else "not a request from a kit copy with this fork server"
            if why:
                for fd in fds:
                    os.close(fd)
                reply = {"refused": why}
            elif "module" in request:
                reply = {"pid": _fork_command(request, fds, listener, conn, alive)}
            elif "zygote" in request:
                reply = {"pid": _fork_zygote(str(request["zygote"]), fds[0], listener, conn, alive)}
            else:
                reply = {"pid": _fork_server(fds[0], listener, conn, alive)}
            try:
                conn.sendall(json.dumps(reply).encode() + b"\n")
            except OSError:
                pass


def _refusal(request: dict, fds: list[int]) -> str | None:
    """Why this zygote does not serve ``request`` with ``fds``, or None."""
    if "module" in request:
        if len(fds) != 4:
            return "a command needs stdin, stdout, stderr and a status pipe"
        return forked_command.refusal(request, _COMMAND_CONTEXT[0])
    return None if len(fds) == 1 else "one file descriptor expected"


_COMMAND_CONTEXT: tuple[dict[str, str], list[str]] = ({}, [])   # start-up settings, library path (set by main)


def main(path: str, imports: list[str] | tuple[str, ...] = IMPORTS) -> None:
    """Listen on ``path`` at once (runs that connect early wait), import torch and ``imports`` (default: every
    library preload), then fork a server (or a zygote) for each request; exit when the process that started
    the zygote exits (``PR_SET_PDEATHSIG``: SIGTERM, on which it removes its socket, and the folder once empty,
    and exits)."""
    signal.signal(signal.SIGTERM, lambda signum, frame: (_leave(Path(path)), os._exit(0)))
    ctypes.CDLL(None, use_errno=True).prctl(forkserver._PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    listener = _listen(path)     # what a dead server leaves stays below the zygote
    forkserver._preload([*forkserver.PRELOAD, *imports])   # a failed import is left to the run that needs it
    if forkserver.threads() != 1:          # a thread could hold a lock at fork: serve nobody
        return
    global _COMMAND_CONTEXT
    _COMMAND_CONTEXT = (forked_command.startup_settings(dict(os.environ)), forked_command.library_path())
    _serve(listener, None)


if __name__ == "__main__":
    main(sys.argv[1], [name for name in sys.argv[2:] if name.strip()] or IMPORTS)   # blank: a title's room
