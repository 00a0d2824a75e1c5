"""The fork servers of one grading run (``common.forkserver`` is one server and its handle).

A grading run keeps ``server_count`` servers (``GRADING_FORKSERVERS``). Rank r of a case whose ranks' string
hash orders must differ (``distinct_hashes``) is forked by server r % 2; the ranks of any other case by the first
server alone (only it imports the case's libraries). Where one is kept, the second is started for a case that
needs it and stopped before a case without that need has the first import more
(``ForkServers.stop_unneeded_server``).
``batch`` shares its servers with its grades through ``POOL_ENV``
(``ForkServers.pool_env``).
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path

from common.settings import SERVERS_ENV as SERVERS_ENV     # re-exported: tests name run_servers.SERVERS_ENV
from common.settings import POOL_ENV, SERVER_KIT_ENV, settings_from
from grading.sandbox.isolation import rank_environment
from common.forkserver import Server, ServerSession


def pool_addresses(pool: str) -> list[str]:
    """The servers' addresses that a ``POOL_ENV`` value (``pool_env``) names."""
    return [address.replace("@", "\0", 1) for address in pool.split(",") if address]


def server_count(env: dict[str, str] | None = None) -> int:
    """How many fork servers a grading run keeps, from ``GRADING_FORKSERVERS`` in ``env`` (default
    ``os.environ``): ``2`` (the default: the second server, which the cases whose ranks must differ in hash seed
    need, is kept between them) or ``1`` (for Gradescope's small containers; ``run_autograder`` sets it: the
    second is started for such a case, ``ForkServers.stop_unneeded_server``; ``common.settings``). Raises
    ValueError for any other value (an empty one means the default)."""
    return settings_from(os.environ if env is None else env).fork_servers


class ForkServers:
    """The fork servers of a grading run, for any grading copy (module docstring): rank r is forked by a session of
    server r % ``holders(distinct_hashes)``. The servers are this run's own, started when first needed in ``cwd``
    (a grading copy
    whose ``grading`` runs them; ``env``: the environment they start from, default this process's, of which they
    keep what a rank may see (``isolation.rank_environment``: a forked rank's ``/proc/self/environ`` is its
    server's); ``server_count`` of them),
    or those of ``pool`` (``POOL_ENV``'s value: a ``batch``'s, shared by its grades) while they answer.

    ``distinct_hashes``: the case's ranks must differ in string hash order, as the fresh interpreters of ``torchrun`` do
    (a case whose ranks must agree on their collectives: one that iterates a set of names on one rank in another
    order than on the next is caught), so they are spread over two servers even where one is kept."""

    def __init__(self, cwd: Path, env: dict[str, str] | None = None, pool: str = ""):
        self.cwd = Path(cwd).resolve()
        base = dict(os.environ if env is None else env)
        self.pool = pool_addresses(pool)
        self.servers = len(self.pool) or server_count(base)
        self.env = {**rank_environment(base), "PYTHONPATH": str(self.cwd), SERVER_KIT_ENV: str(self.cwd),
                    "OMP_NUM_THREADS": base.get("OMP_NUM_THREADS") or "1"}   # importing torch starts no thread
        self._started: dict[int, Server] = {}      # this run's own servers
        self._sessions: dict[int, ServerSession] = {}
        self._preloaded: set[str] = set()          # what the first server was asked to import so far
        self.preloads_allowed: bool | None = None   # decided at the first preload: not where CUDA is visible
        self.refused = ""                          # why preloading stopped for this run ("" while it works)

    def holders(self, distinct_hashes: bool = False) -> int:
        """How many servers fork the ranks of a case: two with ``distinct_hashes``, else the first alone."""
        return 2 if distinct_hashes else 1

    @property
    def running(self) -> int:
        """How many of this run's own servers run now (a pool's are not counted)."""
        return sum(server.running for server in self._started.values())

    def address(self, index: int) -> str:
        """Where server ``index`` listens: the pool's, else this run's own (started, or restarted, here)."""
        if index < len(self.pool):
            return self.pool[index]
        if index not in self._started:
            self._started[index] = Server(self.cwd, self._seeded_env)
        return self._started[index].address()

    def _seeded_env(self) -> dict[str, str]:
        """A server's environment at its (re)start: its own hash seed, as each fresh interpreter has."""
        return {**self.env, "PYTHONHASHSEED": str(secrets.randbelow(2**32))}

    def session(self, rank: int, distinct_hashes: bool = False) -> ServerSession:
        """The session that forks rank ``rank`` (one that ended is replaced); its server may still be importing."""
        index = rank % self.holders(distinct_hashes)
        if index not in self._sessions or not self._sessions[index].alive():
            self._open(index)
        return self._sessions[index]

    def _open(self, index: int, preload: tuple[str, ...] = ()) -> None:
        """A new session of server ``index`` (the one before it closed), forked once the server has imported
        ``preload``. A server that does not answer (a pool's that ended, or ours before we saw it end) is left
        for one of this run's own."""
        if old := self._sessions.pop(index, None):
            old.close()
        try:
            self._sessions[index] = ServerSession(self.address(index), preload)
        except OSError:
            self._leave(index)
            self._sessions[index] = ServerSession(self.address(index), preload)

    def _leave(self, index: int) -> None:
        """Use server ``index`` no more: the pool is left, and this run's own server stopped (``address`` starts a
        new one)."""
        self.pool = []
        self._stop(index)

    def _stop(self, index: int) -> None:
        """Stop this run's own server ``index`` and everything under it, if it runs."""
        if index in self._started:
            self._started.pop(index).stop()

    def stop_unneeded_server(self, distinct_hashes: bool, preload: tuple[str, ...] = ()) -> None:
        """Before a case: with one server kept, a case that needs no ``distinct_hashes`` and that has the first
        server import libraries it has not imported yet (``preload``) stops the second server a case before
        started, so that the libraries are held once (what one server saves); nothing otherwise."""
        extra = self.servers
        if distinct_hashes or extra >= 2 or set(preload) <= self._preloaded or \
                extra not in self._sessions and extra not in self._started:
            return
        if session := self._sessions.pop(extra, None):
            session.close()
        self._stop(extra)

    def preload(self, world_size: int, modules: tuple[str, ...], distinct_hashes: bool = False) -> None:
        """Start the sessions of ranks 0 .. ``world_size``-1 (``distinct_hashes``: as ``session`` spreads them) from
        servers that have imported ``modules`` (side by side), and wait for them. Nothing where CUDA is visible. A
        server that a preload left unable to fork has ended and is left; the run preloads nothing more (``refused``)."""
        if self.preloads_allowed is None:
            import torch
            self.preloads_allowed = not torch.cuda.is_available()
        if not (self.preloads_allowed and modules):
            return
        indexes = range(min(world_size, self.holders(distinct_hashes)))
        for index in indexes:
            self._open(index, modules)
        self._preloaded.update(modules)
        for index in indexes:                        # all servers import side by side; then wait for each
            try:
                self._sessions[index].ready()
            except RuntimeError as exc:
                self.preloads_allowed, self.refused = False, str(exc)
                self._sessions.pop(index)
                self._leave(index)

    def warm_up(self, ranks: int = 2) -> None:
        """Start the sessions of ranks 0 .. ``ranks``-1 now (the servers' imports overlap the caller's own work)."""
        for rank in range(min(ranks, self.servers)):
            self.session(rank)

    def pool_env(self) -> dict[str, str]:
        """``POOL_ENV`` naming these servers (started now), for other processes' grading runs to share them."""
        addresses = [self.address(index) for index in range(self.servers)]
        return {POOL_ENV: ",".join(address.replace("\0", "@", 1) for address in addresses)}

    def close(self) -> None:
        """End every session, then stop this run's own servers and everything under them."""
        for session in self._sessions.values():
            session.close()
        self._sessions.clear()
        for index in list(self._started):
            self._stop(index)

    def __enter__(self) -> ForkServers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
