"""A command (``python -m MODULE ARGS``) as a zygote forks it: the child's side (the launcher's side is
``grading.engine.kit_command``).

A zygote (``grading.engine.zygote``) has imported torch and the library
preloads once; asked for a command, it forks a *waiter* that leads a new
session and forks the command::

    launcher ──argv, folder, env, stdio fds, a status pipe──▶ zygote ──fork──▶ waiter ──fork──▶ command

The command then starts as a new interpreter would: its own argv, working
folder, environment and stdio; ``sys.path`` as that folder and the command's
``PYTHONPATH`` make it; no module of a kit copy imported (the zygote's own
``grading`` modules are dropped, so the command imports its folder's, whatever
kit copy or version that is); fresh ``random`` seeds; torch's thread count of
a new interpreter; its own command line in ``ps`` (cut to the room the zygote
keeps, ``TITLE_ROOM``); and it ends as one (non-daemon threads joined,
``atexit`` run, streams flushed). The waiter ignores the stops a session gets
(SIGTERM, SIGINT, SIGHUP: the command answers them) and writes the command's
exit status (``-N`` for signal N, as ``subprocess`` gives it) to the status
pipe. A zygote refuses a command whose ``PYTHON*`` start-up settings (read
once by a new interpreter) differ from its own: the launcher then starts it
cold.
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from grading.engine.environment import adopt_environment

TITLE_ROOM = " " * 2048              # a zygote's last argument: room for a forked command's title (``set_title``)
_STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def startup_settings(env: dict[str, str]) -> dict[str, str]:
    """The ``PYTHON*`` variables of ``env`` that a new interpreter reads once at start-up (``PYTHONHASHSEED`` and
    ``PYTHONPATH`` apart: a zygote has its own seed, and a forked command's path is built from its own
    ``PYTHONPATH``)."""
    return {k: v for k, v in env.items() if k.startswith("PYTHON") and k not in ("PYTHONHASHSEED", "PYTHONPATH")}


def library_path() -> list[str]:
    """This interpreter's ``sys.path`` without its first entry and its ``PYTHONPATH`` entries: where the libraries
    are (the standard library, site-packages), the same for every command."""
    own = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    return [p for p in sys.path[1:] if os.path.abspath(p) not in own]


def refusal(request: dict, settings: dict[str, str]) -> str | None:
    """Why a zygote started with the start-up ``settings`` must not fork the command ``request``, or None."""
    env = request.get("env")
    if not isinstance(env, dict) or not isinstance(request.get("args"), list) or \
            not isinstance(request.get("cwd"), str) or not isinstance(request.get("module"), str):
        return "a malformed command"
    if startup_settings(env) != settings:
        return "other start-up settings"
    return None


def run_in_child(request: dict, stdio: list[int], status: int, libraries: list[str]) -> None:
    """In a zygote's new child (which leads a new session): fork the command and wait for it; write its exit
    status to ``status`` and exit. ``libraries``: the zygote's ``library_path()``. Never returns."""
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for number in _STOPS:                      # a stop for the session is the command's to answer
            signal.signal(number, signal.SIG_IGN)
        pid = os.fork()
        if pid == 0:
            os.close(status)
            _run_command(request, stdio, libraries)   # never returns
        for fd in stdio:
            os.close(fd)
        set_title([sys.executable, "-m", __name__, "waits for", str(pid)])
        _, wait_status = os.waitpid(pid, 0)
        os.write(status, f"{os.waitstatus_to_exitcode(wait_status)}\n".encode())
    finally:
        os._exit(0)


def _run_command(request: dict, stdio: list[int], libraries: list[str]) -> None:
    """Become ``python -m MODULE ARGS`` as ``request`` describes it, then end as an interpreter ends."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)      # as a new interpreter has them
        for number in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(number, signal.SIG_DFL)
        for target, fd in enumerate(stdio):
            os.dup2(fd, target)
        for fd in set(stdio) - {0, 1, 2}:
            os.close(fd)
        env = request["env"]
        os.chdir(request["cwd"])
        adopt_environment(env)
        _fresh_modules(libraries, env)
        set_title([sys.executable, "-m", request["module"], *request["args"]])
        _fresh_state(env)
        code = _main(request["module"], request["args"])
    finally:
        _finish(code)


def _fresh_modules(libraries: list[str], env: dict[str, str]) -> None:
    """``sys.path`` as ``python -m`` in this folder with ``env`` builds it; every module imported from outside
    the libraries (the zygote's own ``grading``) dropped, so the command imports its own."""
    import importlib
    own = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.getcwd(), *own, *libraries]
    importlib.invalidate_caches()
    roots = tuple(os.path.join(os.path.abspath(p), "") for p in libraries if p)
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if file and not os.path.abspath(file).startswith(roots):
            del sys.modules[name]


def set_title(argv: list[str]) -> None:
    """Show ``argv`` as this process's command line (``ps``, ``/proc/<pid>/cmdline``), cut to the room the
    original one had (a zygote keeps ``TITLE_ROOM`` spare); Python holds copies of its own argv, not this memory."""
    import ctypes
    with open("/proc/self/stat", "rb") as handle:
        fields = handle.read().rsplit(b")", 1)[1].split()
    start, end = int(fields[45]), int(fields[46])         # arg_start, arg_end: fields 48 and 49 of proc(5)
    room = end - start
    if room <= 1:
        return
    title = b"\0".join(arg.encode(errors="replace") for arg in argv)[:room - 1]
    ctypes.memmove(start, title.ljust(room, b"\0"), room)


def _fresh_state(env: dict[str, str]) -> None:
    """What a new interpreter would differ in: random seeds, torch's thread count."""
    import random
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if "torch" in sys.modules:                      # the zygote imported it under OMP_NUM_THREADS=1
        sys.modules["torch"].set_num_threads(fresh_threads(env))


def fresh_threads(env: dict[str, str]) -> int:
    """The intra-op thread count torch starts with in a new interpreter with ``env`` (as ATen's
    ``intraop_default_num_threads``): ``MKL_NUM_THREADS``, else ``OMP_NUM_THREADS``, else one per physical core."""
    for name in ("MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        value = env.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    cores = set()
    for topology in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/topology"):
        try:
            cores.add(((topology / "physical_package_id").read_text(), (topology / "core_id").read_text()))
        except OSError:
            pass
    return len(cores) or os.cpu_count() or 1


def _main(module: str, args: list[str]) -> int:
    """Run ``module`` as ``__main__`` with ``args``; its exit code as the interpreter would give it."""
    import runpy
    import traceback
    sys.argv = ["-m", *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        traceback.print_exc()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # noqa: BLE001 - printed as the interpreter prints an uncaught exception
        traceback.print_exc()
        return 1
    return 0


def _finish(code: int) -> None:
    """End as an interpreter ends: join non-daemon threads, run ``atexit``, flush the streams; exit ``code``."""
    import atexit
    import threading
    try:
        threading._shutdown()                     # what Py_Finalize does first
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    finally:
        os._exit(code & 0xFF)
