"""Start a command (``python -m grading grade ...``) forked by a zygote where there is one, else as a new
interpreter: the launcher's side of ``grading.engine.forked_command``.

``batch`` grades each submission in its own ``python -m grading grade``
process; started cold, each imports torch again (about 3 s of CPU) before it
grades. ``start`` asks the zygote of slot 0 that the environment names
(``GRADING_ZYGOTES``) to fork it instead, and falls back to
``subprocess.Popen`` where none is named (CUDA visible, cold ranks asked
for), none answers, or it refuses (other ``PYTHON*`` start-up settings):
either way a process of its own, in a session of its own, with the same result.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from grading.engine.zygote import ZYGOTES_ENV, request_command

START_TIMEOUT_S = 10.0


class ForkedProcess:
    """A command a zygote forked: ``pid`` leads its session (its waiter); ``wait`` and ``returncode`` as
    ``subprocess.Popen``'s."""

    def __init__(self, pid: int, status: int, args: list[str]):
        self.pid, self.args, self.returncode = pid, args, None
        self._status = status
        self._read = b""

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
        text = self._read.decode().strip()
        # no status: the waiter was killed with the command (SIGKILL to the group), as subprocess would report it
        self.returncode = int(text) if text.lstrip("-").isdigit() else -signal.SIGKILL
        return self.returncode


def start(module: str, args: list[str], cwd: Path, env: dict[str, str], stdin: int, stdout: int,
          stderr: int) -> ForkedProcess | subprocess.Popen:
    """``python -m MODULE ARGS`` in ``cwd`` with ``env`` and the given stdio file descriptors (stdin may be
    ``subprocess.DEVNULL``), in a session of its own: forked by the zygote ``env`` names when it accepts, else
    started cold with ``subprocess.Popen``."""
    args = [str(arg) for arg in args]
    folder = env.get(ZYGOTES_ENV)
    if folder:
        read, write = os.pipe()
        null = os.open(os.devnull, os.O_RDONLY) if stdin == subprocess.DEVNULL else None
        try:
            request = {"module": module, "args": args, "cwd": str(Path(cwd).resolve()), "env": dict(env)}
            pid = request_command(Path(folder), 0, request, [stdin if null is None else null, stdout, stderr, write],
                                  START_TIMEOUT_S)
        finally:
            os.close(write)
            if null is not None:
                os.close(null)
        if pid is not None:
            return ForkedProcess(pid, read, [module, *args])
        os.close(read)
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=cwd, env=env, stdin=stdin, stdout=stdout,
                            stderr=stderr, start_new_session=True)
