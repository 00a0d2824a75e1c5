"""How a rank process starts: forked by a fork server on a CPU-only Linux machine, a fresh interpreter elsewhere.

Every rank of the entry points runs ``project.launch.main`` (``RANK_MAIN``). Where no GPU is visible it is forked
by this process's fork server (``common.forkserver``, the server the grader forks its ranks from), which imported
torch and the callers' ``preload`` modules (``common.startup``) once; a forked rank is still a new process (its own
session, seeds and environment), sharing no state with its parent or the other ranks. Where a GPU is visible (CUDA
must not be initialised before a fork) or outside Linux it is a fresh interpreter. ``KIT_RANK_START`` overrides the
choice (``rank_start_method``).
"""
from __future__ import annotations

import atexit
import gc
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch

from common import ROOT
from common.forkserver import Server, ServerSession
from common.rank_process import RankProcess
from common.settings import RANK_START_ENV as RANK_START_ENV     # re-exported: tests name rank_start.RANK_START_ENV
from common.settings import settings
from common.startup import adopt_environment
from project.cli import ConfigError
from project.devices import gpu_count

RANK_MAIN = "project.launch"        # the module whose ``main(["RANK", "FD"])`` every rank runs
SERVER_MODULE = "common.forkserver"
_FRESH_THREADS = torch.get_num_threads()   # a fresh interpreter's intra-op threads (read before anyone sets them)


def rank_start_method() -> str:
    """How ranks start in this process: ``forkserver`` on Linux where no GPU is visible, else ``spawn``.

    ``KIT_RANK_START`` (``auto``, ``spawn`` or ``forkserver``) overrides
    ``auto``; another value raises ConfigError naming the choices.
    """
    try:
        choice = settings().rank_start          # common.settings checks it is one of auto, spawn, forkserver
    except ValueError as exc:                   # entry points print a ConfigError without a traceback
        raise ConfigError(str(exc)) from None
    if choice == "auto":
        return "spawn" if gpu_count() or not sys.platform.startswith("linux") else "forkserver"
    return choice


def _with_the_kit_importable() -> dict[str, str]:
    """This process's environment with the kit's folder first on ``PYTHONPATH``, for a fresh interpreter that
    must import ``common`` and ``project`` wherever it starts."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


class _Server:
    """This process's fork server (``common.forkserver.Server``): started when first needed (in the kit's folder, one
    OpenMP thread, no output), stopped as this process exits (it dies with it in any case), and a session opened
    ahead of the coming ranks."""

    def __init__(self):
        # importing torch starts no OpenMP thread
        self.server = Server(ROOT, lambda: {**_with_the_kit_importable(), "OMP_NUM_THREADS": "1"})
        self.ahead: tuple[ServerSession, frozenset[str]] | None = None

    def open_ahead(self, preload: tuple[str, ...]) -> None:
        """Ask for a session forked once the server has imported ``preload``; the next ``session`` takes it."""
        if self.ahead is None or not set(preload) <= self.ahead[1]:
            if self.ahead is not None:
                self.ahead[0].close()
            atexit.unregister(self.stop)
            atexit.register(self.stop)
            self.ahead = (ServerSession(self.server.address(), preload), frozenset(preload))

    def session(self, preload: tuple[str, ...]) -> ServerSession:
        """A session of the server that has imported ``preload``: the one opened ahead where it has, else a new one.
        RuntimeError when the server cannot give one (the caller starts its ranks fresh)."""
        self.open_ahead(preload)
        session, self.ahead = self.ahead[0], None
        session.ready()
        return session

    def stop(self) -> None:
        """Stop the server and what it forked (its sessions end with it)."""
        if self.ahead is not None:
            self.ahead[0].close()
            self.ahead = None
        atexit.unregister(self.stop)
        self.server.stop()


_SERVER = _Server()


def start_rank_server(preload: tuple[str, ...] = ()) -> None:
    """Start this process's fork server now, if ranks start forked here (``rank_start_method``), and have it import
    ``preload`` (a running server keeps what it imported: the list decides speed, never results). Returns at once."""
    if rank_start_method() == "forkserver":
        _SERVER.open_ahead(preload)


def fork_servers() -> list[psutil.Process]:
    """This process's fork servers: its children running ``common.forkserver``."""
    found = []
    for child in psutil.Process().children():
        try:
            if SERVER_MODULE in child.cmdline():
                found.append(child)
        except psutil.Error:            # ended meanwhile
            continue
    return found


def start_rank(rank: int, channel: int, session: ServerSession | None) -> RankProcess:
    """Start rank ``rank``: ``RANK_MAIN.main([RANK, FD])`` with the open socket ``channel`` as its descriptor FD,
    this process's stdout and stderr (whatever ``sys.stdout`` is now), working folder, environment and
    ``sys.path``; forked by ``session``, or, without one, a fresh interpreter."""
    env = dict(os.environ) if session is not None else _with_the_kit_importable()
    return RankProcess.start(rank, RANK_MAIN, [str(rank)], cwd=Path.cwd(), env=env, streams=(1, 2), session=session,
                             channel=channel, path=list(sys.path))


def rank_session(preload: tuple[str, ...]) -> ServerSession | None:
    """The session that forks the coming ranks (``start_rank``), or None where they start fresh: by
    ``rank_start_method``, or because the server could not give one (its error goes to stderr)."""
    if rank_start_method() != "forkserver":
        return None
    try:
        return _SERVER.session(preload)
    except (OSError, RuntimeError) as exc:
        print(f"the ranks start as fresh interpreters: the fork server gave none ({exc})", file=sys.stderr)
        _SERVER.stop()
        return None


@dataclass(frozen=True)
class RankStart:
    """What a rank takes from its parent at its start: the environment and a fresh interpreter's torch threads."""

    environ: dict[str, str]
    threads: int

    @classmethod
    def here(cls) -> RankStart:
        """This (launching) process's environment now, and the thread count a fresh interpreter gets here."""
        return cls(dict(os.environ), _FRESH_THREADS)

    def adopt(self) -> None:
        """In the rank: take the parent's environment (``adopt_environment``: ``tempfile``'s folder included) and
        torch thread count (a forked rank has its fork server's single thread; a fresh one already has both); then
        ``freeze_what_is_loaded``."""
        adopt_environment(self.environ)
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        freeze_what_is_loaded()


def freeze_what_is_loaded() -> None:
    """In a rank process, before its work: the objects alive now (the imported libraries, mostly) are left out
    of every later garbage collection (``gc.freeze``).

    A full collection walks every tracked object and writes to each one's header: in a rank forked from a
    server that imported torch, transformers and DeepSpeed, that is half a million objects whose pages the
    kernel must copy first. What a rank's work leaves behind is still collected."""
    gc.freeze()
