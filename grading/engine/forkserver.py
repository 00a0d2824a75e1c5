"""Warm rank processes: fork servers that have imported torch once and fork the ranks of grading runs.

A fresh ``python -m grading.engine.worker`` spends seconds importing torch
before milliseconds of probing. Instead, a grading run starts two *fork
servers*, one for even and one for odd ranks (``python -m
grading.engine.forkserver``, with ``OMP_NUM_THREADS=1`` so it stays
single-threaded; the launcher's side is ``grading.engine.forkservers``); each
imports torch, then, on request, forks a rank:

    launcher ──request (spec, rank, key, run id, kit, log paths)──▶ server r % 2 ──fork──▶ rank r of the case
             ◀──────────────── pid, later its exit status ───────────┘

The forked child is a fresh process for everything the sandbox gives it: its
own session (process group), stdout/stderr to its files, the run's signing
key on a new stdin pipe, the environment a cold rank would get at that moment
(the launcher's, with the run marker; not the server's), its own
``random`` seed, then ``worker.main`` exactly as a cold start runs it
(limits, network namespace, group, probe). It holds no descriptor of the
server. It imports every kit module itself, from the kit copy the request
names: the server's own ``grading`` modules are dropped and that copy leads
``sys.path`` and ``PYTHONPATH``. So a server holds library modules only, never
kit, student or probe code, and nothing of one case or submission reaches
another. The two servers are started with their own ``PYTHONHASHSEED`` each,
so neighbouring ranks of a case differ in hash order as fresh interpreters do
(a set iterated in hash order diverges between ranks 0 and 1); a third
server would cost an interpreter and its imports for no new check. The
server is the *subreaper* of its ranks: a daemon that double-forks and calls
setsid is re-parented to it, and ``sweep`` kills every
descendant after a case; ``PR_SET_PDEATHSIG`` ties the server to the
launcher and the ranks to the server. A grading run (``grade``, each
submission of ``batch``) starts its own servers, cold or forked by a zygote
that imported everything once (``grading.engine.zygote``: a batch's, or the
test session's); a test session may also keep one set for the kit copies it
grades.

*Preloads.* A case names the library modules its ranks import (``Case.preload``:
``torch._dynamo``, which the first ``torch.optim`` optimizer imports, transformers'
GPT-2, DeepSpeed: each a second or more per rank). Before forking that case's
ranks, each server imports those it has not imported yet, once; a rank then
finds them in ``sys.modules`` exactly as if it had imported them at its start.
A server that a preload leaves with a second thread refuses to fork
(``error``). A failed preload is ignored: the rank imports the module itself and
meets the same error there. Where CUDA is visible nothing is preloaded
(``preloads_allowed``): a library that touches the driver before ``fork`` would
break the ranks' CUDA.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import random
import select
import signal
import socket
import sys

from grading.engine.environment import adopt_environment
from grading.engine.sandbox import freeze_and_kill

PRELOAD = ("torch",)                 # imported by every server before the first fork
SERVER_KIT_ENV = "GRADING_FORKSERVER_KIT"     # the folder the server was started in (it leaves a rank's sys.path)
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36


def parent_of(pid: int) -> int | None:
    """The parent pid of process ``pid`` (from /proc), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def threads() -> int:
    """How many threads this process has (a process that forks must have one)."""
    return len(os.listdir("/proc/self/task"))


def _descendants(root: int) -> list[int]:
    """Pids of every process below ``root`` in the process tree (by /proc parent links)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        ppid = parent_of(int(name))
        if ppid is not None:
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


def _use_environment(env: dict[str, str]) -> None:
    """In a rank: the launcher's environment ``env`` replaces the server's (as a cold rank gets it), except
    ``PYTHONHASHSEED``, which keeps stating the seed this process's hashes were made with (the server's)."""
    hash_seed = os.environ.get("PYTHONHASHSEED")
    adopt_environment({**env, **({"PYTHONHASHSEED": hash_seed} if hash_seed is not None else {})})


def _use_kit(kit: str, server_kit: str) -> None:
    """In a rank: import kit modules from the copy ``kit`` only (the server's ``grading`` modules are dropped and
    its folder ``server_kit`` leaves ``sys.path``), as a cold worker started there would."""
    for name in [name for name in sys.modules if name == "grading" or name.startswith("grading.")]:
        del sys.modules[name]
    sys.path[:] = [kit, *(entry for entry in sys.path if entry not in ("", server_kit, kit))]
    os.environ["PYTHONPATH"] = kit
    importlib.invalidate_caches()


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
            server_kit = os.environ.get(SERVER_KIT_ENV, "")
            _use_environment(request["env"])
            _use_kit(request["cwd"], server_kit)
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


def _preload(modules: list[str]) -> None:
    """Import each of ``modules`` not imported yet; an import that fails is left to the rank that needs it."""
    for name in modules:
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the rank imports it again and reports what goes wrong there
            sys.modules.pop(name, None)


def serve(fd: int, tied_to_parent: bool = True) -> None:
    """The server loop on the control socket ``fd`` (one JSON object per line each way). It ends, sweeping its
    ranks, when the launcher closes the socket (or exits); ``tied_to_parent``: also killed when its parent dies
    (a cold server's parent is the launcher; a zygote's child outlives its zygote)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if tied_to_parent:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    control = socket.socket(fileno=fd)
    for name in PRELOAD:
        __import__(name)
    count = threads()
    ranks: set[int] = set()

    def send(message: dict) -> None:
        control.sendall((json.dumps(message) + "\n").encode())
    if count != 1:
        send({"error": f"the fork server has {count} threads after its imports"})
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
            if request["op"] == "preload":
                _preload(request["modules"])
                count = threads()
                if count != 1:
                    send({"error": f"the fork server has {count} threads after preloading {request['modules']}"})
                    return
                send({"preloaded": request["modules"]})
            elif request["op"] == "spawn":
                pid = _start_rank(request, control)
                ranks.add(pid)
                send({"spawned": pid})
            elif request["op"] == "sweep":
                send({"swept": _sweep(os.getpid())})



if __name__ == "__main__":
    serve(int(sys.argv[1]))
