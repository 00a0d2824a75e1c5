"""The launcher's side of zygotes (``grading.engine.zygote``): start them for a ``batch`` or a test session, restart
the dead, name them in a grading run's environment, stop them."""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from grading.engine.forked_command import TITLE_ROOM
from grading.engine.forkserver import PRELOAD
from grading.engine.forkservers import START_TIMEOUT_S, ForkServers, cuda_visible, running, server_env
from grading.engine.zygote import ZYGOTES_ENV, request_zygote, socket_path


class _Zygote:
    """One zygote process: started as ``python -m grading.engine.zygote`` (``proc``), or forked by another zygote
    and serving as long as this process holds ``alive``, the write end of its pipe."""

    def __init__(self, pid: int, proc: subprocess.Popen | None = None, alive: int | None = None):
        self.pid, self.proc, self.alive_fd = pid, proc, alive

    def alive(self) -> bool:
        return running(self.pid, self.proc)

    def stop(self) -> None:
        if self.alive_fd is not None:
            os.close(self.alive_fd)
            self.alive_fd = None
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.proc is not None:
            self.proc.wait()


class Zygotes:
    """The zygotes of a ``batch`` or a test session (``grading.engine.zygote``): one per server slot, listening in
    a new temporary folder, started from the kit copy ``cwd`` (importing ``imports`` besides torch; default:
    every preload) or, where ``source`` names the folder of running zygotes, forked by those (ready at once,
    holding what they imported; a slot whose source does not answer is started). The grading runs whose
    environment holds ``env()`` get their servers from them. None are started without ``start`` or where CUDA is
    visible (``env()`` is then empty)."""

    READY_TIMEOUT_S = 10.0

    def __init__(self, cwd: Path, start: bool = True, imports: tuple[str, ...] | None = None,
                 source: Path | None = None):
        self.folder: Path | None = None
        self._imports = (*PRELOAD, *imports) if imports is not None else ()     # none named: the zygote's default
        self._source = source
        self._zygotes: list[_Zygote] = []
        self._lock = threading.Lock()
        if not start or cuda_visible():
            return
        self.cwd = Path(cwd).resolve()
        self.folder = Path(tempfile.mkdtemp(prefix="grading-zygotes-"))
        self._env = server_env(self.cwd, {k: v for k, v in os.environ.items() if k != ZYGOTES_ENV})
        self._zygotes = [self._start(index) for index in range(ForkServers.SERVERS)]
        self._wait_listening(range(ForkServers.SERVERS))

    def _wait_listening(self, indices) -> None:
        """Until the zygotes ``indices`` listen (they listen first and import after), at most READY_TIMEOUT_S."""
        deadline = time.monotonic() + self.READY_TIMEOUT_S
        while time.monotonic() < deadline and not all(socket_path(self.folder, i).exists() for i in indices):
            time.sleep(0.01)

    def _start(self, index: int) -> _Zygote:
        path = socket_path(self.folder, index)
        path.unlink(missing_ok=True)                       # a dead zygote's socket
        if self._source is not None:
            alive, alive_w = os.pipe()
            pid = request_zygote(self._source, index, path, alive, START_TIMEOUT_S)
            os.close(alive)
            if pid is not None:
                return _Zygote(pid, alive=alive_w)
            os.close(alive_w)
        proc = subprocess.Popen([sys.executable, "-m", "grading.engine.zygote", str(path), *self._imports, TITLE_ROOM],
                                cwd=self.cwd, env={**self._env, "PYTHONHASHSEED": str(secrets.randbelow(2 ** 32))},
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        return _Zygote(proc.pid, proc=proc)

    def pids(self) -> list[int]:
        """The zygotes' process ids, slot by slot."""
        return [zygote.pid for zygote in self._zygotes]

    def env(self) -> dict[str, str]:
        """What a grading run's environment needs to use these zygotes; a zygote that died (a rank may kill its
        server's parent) is started again first."""
        with self._lock:                                   # batch threads ask side by side
            dead = [index for index, zygote in enumerate(self._zygotes) if not zygote.alive()]
            for index in dead:
                self._zygotes[index].stop()
                self._zygotes[index] = self._start(index)
            self._wait_listening(dead)
        return {ZYGOTES_ENV: str(self.folder)} if self.folder else {}

    def close(self) -> None:
        """Stop the zygotes (the servers they forked end with their runs) and remove their folder."""
        for zygote in self._zygotes:
            zygote.stop()
        self._zygotes.clear()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def __enter__(self) -> Zygotes:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
