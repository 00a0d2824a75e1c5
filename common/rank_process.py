"""One rank process: ``MODULE.main(ARGV)`` forked by a fork server session (``common.forkserver``) or run by a fresh
interpreter, the same code either way; the handle both launchers start and watch (``project.launch``,
``grading.engine.launch``; ``common.rank_launch.supervise`` reads it).
"""
from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

from common.forkserver import ServerSession
from common.process_tree import signal_group

CHANNEL_FD = 3          # the descriptor a forked rank finds its channel on (a fresh one is told its own number)


class RankProcess:
    """Rank ``rank``'s process ``pid``: a child of a fork server ``session``, or ``proc``, a child of ours."""

    def __init__(self, rank: int, pid: int, session: ServerSession | None = None,
                 proc: subprocess.Popen | None = None):
        self.rank, self.pid, self.session, self.proc = rank, pid, session, proc

    @classmethod
    def start(cls, rank: int, module: str, argv: list[str], *, cwd: Path, env: dict[str, str],
              streams: tuple[int, int], session: ServerSession | None = None, key: bytes = b"",
              channel: int | None = None, path: list[str] | None = None) -> RankProcess:
        """Run ``MODULE.main(ARGV)`` in ``cwd`` with ``env``, stdout and stderr on the open files ``streams``, ``key``
        on its stdin: forked by ``session`` (importing from ``path``, default ``cwd`` first), or, without one, a
        fresh interpreter (importing from ``cwd`` and ``env``'s ``PYTHONPATH``), in a session of its own either way.
        ``channel`` (an open descriptor) is passed on too, and the number it has there is appended to ARGV.
        Raises OSError or RuntimeError where ``session`` cannot fork it."""
        extra = () if channel is None else (channel,)
        if session is not None:
            argv = argv if channel is None else [*argv, str(CHANNEL_FD)]
            return cls(rank, session.start(module, argv, cwd, env, (*streams, *extra), key, path), session=session)
        argv = argv if channel is None else [*argv, str(channel)]
        proc = subprocess.Popen([sys.executable, "-c", f"import sys; from {module} import main; "
                                 "sys.exit(main(sys.argv[1:]))", *argv], cwd=cwd, env=env, stdin=subprocess.PIPE,
                                stdout=streams[0], stderr=streams[1], pass_fds=extra, start_new_session=True)
        for send in (lambda: proc.stdin.write(key + b"\n"), proc.stdin.close):
            with contextlib.suppress(OSError):       # a rank that died at once: its exit tells why
                send()
        return cls(rank, proc.pid, proc=proc)

    def poll(self) -> int | None:
        """The exit code (negative: killed by that signal), or None while it runs."""
        if self.proc is not None:
            return self.proc.poll()
        code = self.session.poll().get(self.pid)
        if code is None and not self.session.alive():
            return -signal.SIGKILL                   # its session died, and it with it (PR_SET_PDEATHSIG)
        return code

    def wakers(self) -> list:
        """Its session's socket (readable when the server reports an exit); a fresh rank is polled."""
        return [self.session] if self.session is not None else []

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the rank's process group (it leads its own session)."""
        signal_group(self.pid, sig)

    def wait(self, timeout_s: float) -> None:
        """Wait (bounded) until the rank has exited and been reaped."""
        deadline = time.monotonic() + timeout_s
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
