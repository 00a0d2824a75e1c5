"""How a rank process starts: forked from a fork server on a CPU-only machine, a fresh interpreter elsewhere.

Where no GPU is visible ``project.launch`` forks ranks from ``multiprocessing``'s fork server, which imported torch
and the caller's ``preload`` modules (``common.startup``) once; a forked rank is still a new process, sharing no
state with its parent or the other ranks. ``KIT_RANK_START`` overrides the choice (``rank_start_method``).
"""
from __future__ import annotations

import atexit
import gc
import multiprocessing
import os
from dataclasses import dataclass

import psutil
import torch

from common.settings import RANK_START_ENV as RANK_START_ENV     # re-exported: tests name rank_start.RANK_START_ENV
from common.settings import settings
from common.startup import SERVER_IMPORTS, adopt_environment
from project.cli import ConfigError
from project.devices import gpu_count

_FRESH_THREADS = torch.get_num_threads()   # a fresh interpreter's intra-op threads (read before anyone sets them)


def rank_start_method() -> str:
    """How ranks start in this process: ``forkserver`` where no GPU is visible, else ``spawn``.

    ``KIT_RANK_START`` (``auto``, ``spawn`` or ``forkserver``) overrides
    ``auto``; another value raises ConfigError naming the choices.
    """
    try:
        choice = settings().rank_start          # common.settings checks it is one of auto, spawn, forkserver
    except ValueError as exc:                   # entry points print a ConfigError without a traceback
        raise ConfigError(str(exc)) from None
    if choice == "auto":
        return "spawn" if gpu_count() else "forkserver"
    return choice


def rank_context(preload: tuple[str, ...] = ()):
    """The ``multiprocessing`` context to start ranks from (``rank_start_method``).

    For ``forkserver`` the server is started here if it is not running, and
    imports ``preload`` then; a running server keeps what it imported (the
    list decides speed, never results).
    """
    method = rank_start_method()
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        _ensure_server(context, preload)
    return context


def _ensure_server(context, preload: tuple[str, ...]) -> None:
    from multiprocessing import forkserver

    context.set_forkserver_preload([*SERVER_IMPORTS, *preload])
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"   # the server's environment: importing torch starts no OpenMP thread
    try:
        forkserver.ensure_running()
    finally:
        if saved is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = saved
    atexit.unregister(_stop_server)
    atexit.register(_stop_server)


def fork_servers() -> list[psutil.Process]:
    """This process's ``multiprocessing`` fork servers: its children started as ``multiprocessing.forkserver``."""
    found = []
    for child in psutil.Process().children():
        try:
            if any("multiprocessing.forkserver" in part for part in child.cmdline()):
                found.append(child)
        except psutil.Error:            # ended meanwhile
            continue
    return found


def _stop_server() -> None:
    """Stop this process's fork server as it exits. Left alone, the server would shut its interpreter down on
    its own (seconds, with torch, transformers and DeepSpeed imported) while holding this process's stdout and
    stderr open, which a caller reading them to the end would wait for. SIGTERM ends it at once (the server
    does not handle it); its ranks have ended before."""
    for server in fork_servers():
        try:
            server.terminate()
            server.wait(10)
        except psutil.Error:
            pass


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
        torch thread count (a forked rank has its fork server's environment and a single thread; a spawned one
        already has both); then ``freeze_what_is_loaded``."""
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
