"""The worker processes of a benchmark and how the parent talks to them.

Three workers (``Pool``) stay up for the whole run, so no measurement pays for a process start, an import or a
rendezvous; only those a command names work, the others wait on their pipe. They are started by
``project.launch.spawn_ranks``, run ``project.bench.tasks.serve`` and meet over file stores in the run folder.
"""
from __future__ import annotations

from pathlib import Path

from common.rank_watch import STILL_LIMIT_S
from common.startup import GPT2_IMPORTS
from project.bench.tasks import serve
from project.launch import RankError, Ranks, file_rendezvous, spawn_ranks

BenchError = RankError   # a worker raised, died or timed out; the message holds its traceback or the reason


class Pool:
    """Start the ``solo`` and ``pair`` workers; ``call`` sends one command to the ranks of a role::

        solo      rank 0 of its own 1-rank group   (world size 1, pipeline stages, LoRA/PEFT)
        pair[0]   rank 0 of a 2-rank group         (world size 2, DDP, flat all-reduce, GPipe stage 0)
        pair[1]   rank 1 of a 2-rank group         (...                                  GPipe stage 1)

    ``threads``: torch intra-op threads per worker (0 keeps torch's default).
    ``timeout_s`` bounds every reply (and the start); workers that all wait at once for
    ``rank_watch.STILL_LIMIT_S`` end a reply early, naming where each waits. ``student_setup``: the
    workers join their groups with the student's ``setup_process_group``
    (else with ``torch.distributed`` directly: Problem 1 unwritten). Use as a
    context manager, or call ``close()``.
    """

    def __init__(self, folder: Path, threads: int, timeout_s: float = 600.0, student_setup: bool = True):
        self.folder = Path(folder)
        self.threads, self.timeout_s, self.student_setup = threads, timeout_s, student_setup
        self.ranks: dict[str, Ranks] = {}
        self.info: dict[str, list[dict]] = {}
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        for role, world_size in (("solo", 1), ("pair", 2)):
            args = (role, str(self.folder), self.threads, self.student_setup)
            watch_dir = self.folder / f"ranks_{role}"       # stack dumps and collective calls (the watchdog's)
            watch_dir.mkdir(parents=True, exist_ok=True)
            self.ranks[role] = spawn_ranks(serve, world_size, file_rendezvous(self.folder, f"store_{role}"), args,
                                           name=f"bench-{role}", preload=GPT2_IMPORTS, watch_dir=watch_dir)
            self.ranks[role].still_limit_s = STILL_LIMIT_S
        for role in ("solo", "pair"):
            self.info[role] = self.ranks[role].replies("start", self.timeout_s)

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
            self.ranks[role].send(message)
        return {role: self.ranks[role].replies(message[0], self.timeout_s) for role, message in commands.items()}

    def restart(self) -> None:
        """Stop every worker (killing stuck ones) and start fresh ones."""
        self.close()
        self._start()

    def close(self) -> None:
        """Ask the workers to stop; kill those that do not within a few seconds."""
        for ranks in self.ranks.values():
            ranks.send(None)
        for ranks in self.ranks.values():
            ranks.close(grace_s=10.0)
        self.ranks = {}

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
