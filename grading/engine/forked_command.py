"""A kit command (``python -m grading ...``) forked by a zygote instead of started as a new interpreter.

``batch`` grades each submission in its own ``python -m grading grade``
process; started cold, each imports torch again (about 3 s of CPU) before it
grades. ``start`` asks the zygote of slot 0 named in the environment
(``GRADING_ZYGOTES``, see ``grading.engine.zygote``) to fork the command
instead; the zygote has imported torch and the library preloads once::

    batch ──argv, cwd, env, stdio fds, a status pipe──▶ zygote ──fork──▶ waiter (new session) ──fork──▶ command

The command is then a new process as a cold one is: its own session (the
waiter leads it, so killing the process group stops both), its own argv,
working folder, environment and stdio, its own command line in ``ps`` (cut
to the room the zygote keeps), a fresh ``random`` seed, torch's
thread count of a new interpreter (``OMP_NUM_THREADS`` or one per core), and
the usual end (non-daemon threads joined, ``atexit`` run, streams flushed).
The waiter reports the command's exit status (``-N`` for signal N, as
``subprocess``) on the status pipe. The kit's own modules it has not imported
yet are imported from the kit copy on disk; the zygote refuses a command whose
working folder is not its kit copy, when a kit module it holds changed on disk
since it started, or when the command's ``PYTHON*`` start-up settings differ
from its own: the command then starts cold (``subprocess.Popen``), with the
same result. Nothing is forked where no zygote is named (CUDA visible, cold
ranks asked for).
"""
from __future__ import annotations

import hashlib
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

START_TIMEOUT_S = 10.0
TITLE_ROOM = " " * 2048              # a zygote's last argument: room for a forked command's title (``set_title``)
_STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_UNSET = "-"                         # no exit status written: the waiter was killed with the command


def kit_root() -> Path:
    """The kit copy whose ``grading`` package this process runs."""
    return Path(__file__).resolve().parents[2]


def kit_digests() -> dict[str, str]:
    """File -> sha256 of every kit module this process has imported (what a forked command inherits)."""
    root, found = kit_root(), {}
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if file and Path(file).resolve().is_relative_to(root):
            found[str(Path(file).resolve())] = _digest(Path(file))
    return found


def _digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return ""


def startup_settings(env: dict[str, str]) -> dict[str, str]:
    """The ``PYTHON*`` variables of ``env`` that a new interpreter reads once at start-up (``PYTHONHASHSEED`` and
    ``PYTHONPATH`` apart: a zygote has its own seed, and the kit copy is first on the path either way)."""
    return {k: v for k, v in env.items() if k.startswith("PYTHON") and k not in ("PYTHONHASHSEED", "PYTHONPATH")}


def refusal(request: dict, settings: dict[str, str], digests: dict[str, str]) -> str | None:
    """Why a zygote started with ``settings`` holding kit modules ``digests`` must not fork ``request``, or None."""
    env, cwd = request.get("env"), request.get("cwd")
    if not isinstance(env, dict) or not isinstance(request.get("args"), list) or not isinstance(cwd, str) or \
            not isinstance(request.get("module"), str):
        return "a malformed command"
    if Path(cwd).resolve() != kit_root():
        return "another kit copy"
    if env.get("PYTHONPATH", "") not in ("", str(kit_root())) or startup_settings(env) != settings:
        return "other start-up settings"
    if any(_digest(Path(file)) != digest for file, digest in digests.items()):
        return "the kit changed since the zygote started"
    return None


def run_in_child(request: dict, stdio: list[int], status: int) -> None:
    """In a zygote's new child (which leads a new session): fork the command and wait for it; write its exit
    status to ``status`` and exit. Never returns."""
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for number in _STOPS:                      # a stop for the session is the command's to answer
            signal.signal(number, signal.SIG_IGN)
        pid = os.fork()
        if pid == 0:
            os.close(status)
            _run_command(request, stdio)          # never returns
        for fd in stdio:
            os.close(fd)
        set_title([sys.executable, "-m", __name__, "waits for", str(pid)])
        _, wait_status = os.waitpid(pid, 0)
        os.write(status, f"{os.waitstatus_to_exitcode(wait_status)}\n".encode())
    finally:
        os._exit(0)


def _run_command(request: dict, stdio: list[int]) -> None:
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
        os.environ.clear()
        os.environ.update(env)
        sys.path[0] = os.getcwd()
        set_title([sys.executable, "-m", request["module"], *request["args"]])
        _fresh_state(env)
        code = _main(request["module"], request["args"])
    finally:
        _finish(code)


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


class ForkedProcess:
    """A command a zygote forked: ``pid`` leads its session; ``wait`` and ``returncode`` as ``subprocess.Popen``."""

    def __init__(self, pid: int, status: int, args: list[str]):
        self.pid, self.args, self.returncode = pid, args, None
        self._status = status
        self._read = b""

    def poll(self) -> int | None:
        """The exit status if the command has ended, else None."""
        return self.returncode if self.returncode is not None else self._collect(0.0)

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the command to end; its exit status. Raises ``subprocess.TimeoutExpired`` after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if self._collect(left) is None and deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def _collect(self, timeout: float | None) -> int | None:
        """Read what the waiter wrote within ``timeout``; the exit status once the pipe ends."""
        if not select.select([self._status], [], [], timeout)[0]:
            return None
        chunk = os.read(self._status, 64)
        if chunk:
            self._read += chunk
            return None
        os.close(self._status)
        text = self._read.decode().strip() or _UNSET
        # killed together with its waiter (the process group): no status came; report SIGKILL as subprocess would
        self.returncode = int(text) if text.lstrip("-").isdigit() else -signal.SIGKILL
        return self.returncode


def start(module: str, args: list[str], cwd: Path, env: dict[str, str], stdin: int, stdout: int,
          stderr: int) -> ForkedProcess | subprocess.Popen:
    """``python -m MODULE ARGS`` in ``cwd`` with ``env`` and the given stdio file descriptors (stdin may be
    ``subprocess.DEVNULL``), in its own session:
    forked by the zygote ``env`` names (slot 0) when it accepts, else started cold with ``subprocess.Popen``."""
    from grading.engine import zygote
    folder = env.get(zygote.ZYGOTES_ENV)
    if folder:
        read, write = os.pipe()
        null = os.open(os.devnull, os.O_RDONLY) if stdin == subprocess.DEVNULL else None
        try:
            request = {"module": module, "args": [str(a) for a in args], "cwd": str(Path(cwd).resolve()),
                       "env": dict(env)}
            pid = zygote.request_command(Path(folder), 0, request, [stdin if null is None else null, stdout, stderr,
                                                                    write], START_TIMEOUT_S)
        finally:
            os.close(write)
            if null is not None:
                os.close(null)
        if pid is not None:
            return ForkedProcess(pid, read, [module, *args])
        os.close(read)
    return subprocess.Popen([sys.executable, "-m", module, *map(str, args)], cwd=cwd, env=env, stdin=stdin,
                            stdout=stdout, stderr=stderr, start_new_session=True)
