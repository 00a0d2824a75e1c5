"""Problem 4.3 (rank side): a save's file accesses in one order on every run, and their log.

Between two collectives the ranks run side by side, so a rank that reads another rank's file before a
collective that follows the write finds it on some runs and misses it on others: its grade would change from
run to run. While a save runs (``FileOrder.saving``), each of its file accesses in the save's folder waits until
every lower rank has left the same *stretch* (the part of the call between two of its collectives). Within a
stretch, rank 0's accesses all come first, then rank 1's, and so on, so such a read gives the same answer on
every run (a lower rank's file of this stretch is there, a higher rank's is not yet), and the log
(``FileOrder.log``, read by ``races``) names it: "rank 0 read shard_00001.pt before rank 1 wrote it".

An access is an ``open`` of a path in the folder (read, or write when opened for writing), a ``torch.save`` to
one, a rename, a removal, or a listing of the folder (a ``stat`` is none: its races stay unordered); a
collective is any ``torch.distributed`` call that ``order_collectives`` wraps. Ranks tell each other where
they are through one small file each in ``folder``.
"""
from __future__ import annotations

import os
import sys
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from grading.check import student_frame
from grading.problems.p4_3_checkpoint.damage import COLLECTIVES

WAIT_S = 30.0                 # the longest an access waits for a lower rank, then it fails with the reason
_LEFT = 10 ** 9               # the stretch a rank is in once its save call has returned
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class OrderTimeout(RuntimeError):
    """An access waited ``WAIT_S`` for a lower rank that never reached its next collective."""


class FileOrder:
    """Orders rank ``rank``'s file accesses in the folder of the running save after the lower ranks' (above).

    ``folder`` (shared by the ranks, private to the grader's phase) holds each rank's position. Create it and
    call ``install()`` before the submission's module is imported.
    """

    def __init__(self, rank: int, world_size: int, folder: Path):
        self.rank, self.world_size = rank, world_size
        self.log: list[list] = []             # [call, stretch, "read" | "write", name in the folder, where]
        self._directory: Path | None = None
        self._call, self._stretch = 0, 0
        Path(folder).mkdir(parents=True, exist_ok=True)
        self._files = [os.open(Path(folder) / f"rank{r}", os.O_RDWR | os.O_CREAT, 0o600) for r in range(world_size)]
        self._publish()

    def install(self) -> None:
        """Watch this process's file accesses (an audit hook) and its ``torch.save`` calls."""
        import torch
        real_save = torch.save

        def save(obj, f, *args, **kwargs):
            if isinstance(f, (str, os.PathLike)):
                self.access("write", f)
            return real_save(obj, f, *args, **kwargs)
        torch.save = save
        sys.addaudithook(self._audit)

    @contextmanager
    def saving(self, directory: Path) -> Iterator[None]:
        """Order the accesses in ``directory`` while the block (one ``save_sharded`` call on every rank) runs."""
        self._call, self._stretch, self._directory = self._call + 1, 0, Path(directory).resolve()
        self._publish()
        try:
            yield
        finally:
            self._directory, self._stretch = None, _LEFT
            self._publish()

    def collective(self) -> None:
        """This rank enters a collective: a new stretch begins."""
        if self._directory is not None:
            self._stretch += 1
            self._publish()

    def access(self, kind: str, path) -> None:
        """Rank ``rank`` is about to ``kind`` ("read" or "write") ``path``: when it is in the watched folder,
        wait for the lower ranks to leave this stretch, then log it."""
        if self._directory is None or isinstance(path, int):
            return
        try:
            path = Path(os.fsdecode(path)).resolve()
            name = path.relative_to(self._directory).as_posix()
        except (ValueError, OSError, TypeError):
            return
        where = student_frame(traceback.StackSummary.extract(traceback.walk_stack(None), lookup_lines=False)[::-1])
        self._wait_for_lower_ranks(kind, name, where)
        self.log.append([self._call, self._stretch, kind, name, where])

    def _wait_for_lower_ranks(self, kind: str, name: str, where: str) -> None:
        deadline = time.monotonic() + WAIT_S
        for other in range(self.rank):
            while self._position(other) <= (self._call, self._stretch):
                if time.monotonic() > deadline:
                    raise OrderTimeout(
                        f"rank {self.rank} waited {WAIT_S:.0f} s to {kind} {name} for rank {other} to reach its next "
                        "collective (the grader runs the ranks' file accesses between two collectives in rank "
                        "order): a rank that waits for another rank's file needs a collective after the write")
                time.sleep(0.001)

    def _publish(self) -> None:
        os.pwrite(self._files[self.rank], f"{self._call:010d} {self._stretch:010d}".encode(), 0)

    def _position(self, rank: int) -> tuple[int, int]:
        text = os.pread(self._files[rank], 21, 0).decode()
        return (int(text[:10]), int(text[11:])) if len(text) == 21 else (0, 0)

    def _audit(self, event: str, args: tuple) -> None:
        if self._directory is None:
            return
        if event == "open":
            path, mode, flags = args
            writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool(flags & _WRITE_FLAGS)
            self.access("write" if writes else "read", path)
        elif event == "os.rename":
            self.access("write", args[0])
            self.access("write", args[1])
        elif event == "os.remove":
            self.access("write", args[0])
        elif event in ("os.listdir", "os.scandir"):
            self.access("read", args[0] if args[0] is not None else ".")


def order_collectives(order: FileOrder, names: tuple[str, ...] = COLLECTIVES) -> None:
    """Wrap each ``torch.distributed`` function of ``names`` so that ``order`` sees every collective the
    submission enters; call before the submission is imported (a name it binds at import is the wrapper)."""
    import torch.distributed as dist

    for name in names:
        real = getattr(dist, name, None)
        if real is None:
            continue

        def entered(*args, _real=real, **kwargs):
            order.collective()
            return _real(*args, **kwargs)
        setattr(dist, name, entered)


def races(logs: list[list[list]]) -> list[str]:
    """The reads of one rank of a file that another rank writes in the same stretch of the same save call, in
    words (``logs[r]``: rank r's ``FileOrder.log``); empty when there are none."""
    found = []
    for reader, log in enumerate(logs):
        for call, stretch, kind, name, where in log:
            if kind != "read":
                continue
            for writer, other in enumerate(logs):
                write = next((w for w in other if writer != reader and w[:4] == [call, stretch, "write", name]), None)
                if write is None:
                    continue
                first = "the read came first" if reader < writer else "here the write came first, by luck"
                found.append(f"rank {reader} read {name} at {where or 'a line outside the student files'} while rank "
                             f"{writer} wrote it at {write[4] or 'a line outside the student files'}, with no "
                             f"collective between ({first}): a rank may read another rank's file only after a "
                             "collective that follows the write")
    return found
