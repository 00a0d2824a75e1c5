"""The worker processes of a benchmark and how the parent talks to them.

Three processes stay up for the whole run, so no measurement pays for a
process start, an import or a rendezvous::

    solo      rank 0 of its own 1-rank group   (world size 1, pipeline stages, LoRA/PEFT)
    pair[0]   rank 0 of a 2-rank group         (world size 2, DDP, flat all-reduce, GPipe stage 0)
    pair[1]   rank 1 of a 2-rank group         (...                                  GPipe stage 1)

Only the processes named by a command work; the others wait on their pipe
(no CPU). Groups meet over file stores in the run folder (no port).
"""
from __future__ import annotations

import multiprocessing
import time
from pathlib import Path


class BenchError(RuntimeError):
    """A worker raised, died or timed out; the message holds its traceback or the reason."""


def _child(role: str, rank: int, world_size: int, init_method: str, folder: str, threads: int, conn) -> None:
    from project.bench.tasks import serve

    serve(role, rank, world_size, init_method, folder, threads, conn)


class Pool:
    """Start the ``solo`` and ``pair`` workers; ``call`` sends one command to the ranks of a role.

    ``threads``: torch intra-op threads per worker (0 keeps torch's default).
    ``timeout_s`` bounds every reply (and the start). Use as a context
    manager, or call ``close()``.
    """

    def __init__(self, folder: Path, threads: int, timeout_s: float = 600.0):
        self.folder = Path(folder)
        self.threads, self.timeout_s = threads, timeout_s
        self.procs: dict[str, list] = {}
        self.conns: dict[str, list] = {}
        self.info: dict[str, list[dict]] = {}
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        for role, world_size in (("solo", 1), ("pair", 2)):
            store = self.folder / f"store_{role}_{time.monotonic_ns()}"
            self.procs[role], self.conns[role] = [], []
            for rank in range(world_size):
                parent, child = context.Pipe()
                proc = context.Process(target=_child, name=f"bench-{role}{rank}", daemon=True,
                                       args=(role, rank, world_size, f"file://{store.resolve()}",
                                             str(self.folder), self.threads, child))
                proc.start()
                child.close()
                self.procs[role].append(proc)
                self.conns[role].append(parent)
        for role in ("solo", "pair"):
            self.info[role] = self._collect(role, "start")

    def _collect(self, role: str, what: str) -> list:
        results, errors = [], []
        deadline = time.monotonic() + self.timeout_s
        for rank, conn in enumerate(self.conns[role]):
            if not conn.poll(max(0.0, deadline - time.monotonic())):
                raise BenchError(f"{what}: {role} rank {rank} gave no answer within {self.timeout_s:g} s")
            try:
                status, value = conn.recv()
            except (EOFError, OSError):
                code = self.procs[role][rank].exitcode
                raise BenchError(f"{what}: {role} rank {rank} died (exit code {code})") from None
            if status == "ok":
                results.append(value)
            else:
                errors.append(f"{role} rank {rank}:\n{value}")
        if errors:
            raise BenchError(f"{what} failed on " + "\n".join(errors))
        return results

    def call(self, role: str, command: str, **kwargs) -> list:
        """Send ``(command, kwargs)`` to every rank of ``role`` and return their results, rank by rank.

        Raises BenchError when a rank raised (its traceback is in the message),
        died, or did not answer in time; the pool should then be restarted.
        """
        return self.call_both({role: (command, kwargs)})[role]

    def call_both(self, commands: dict[str, tuple[str, dict]]) -> dict[str, list]:
        """Send ``{role: (command, kwargs)}`` to those roles at once, then collect: ``{role: results}``.

        For untimed work only (set-up, checks): the roles run concurrently.
        """
        for role, message in commands.items():
            for conn in self.conns[role]:
                conn.send(message)
        return {role: self._collect(role, message[0]) for role, message in commands.items()}

    def restart(self) -> None:
        """Stop every worker (killing stuck ones) and start fresh ones."""
        self.close()
        self._start()

    def close(self) -> None:
        """Ask the workers to stop; kill those that do not within a few seconds."""
        for conns in self.conns.values():
            for conn in conns:
                try:
                    conn.send(None)
                except (BrokenPipeError, OSError):
                    pass
        for procs in self.procs.values():
            for proc in procs:
                proc.join(10)
                if proc.is_alive():
                    proc.kill()
                    proc.join(5)
        for conns in self.conns.values():
            for conn in conns:
                conn.close()
        self.procs, self.conns = {}, {}

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
