"""Problem 2.1: the GPipe clock-cycle schedule.

With ``m`` micro-batches and ``n`` stages, task ``(i, j)`` runs micro-batch
``i`` through stage ``j``. It can start once ``(i, j - 1)`` is done (the
stage's input) and ``(i - 1, j)`` is done (the stage is free), so every task
with ``i + j == k`` can run in clock cycle ``k``. For ``m = 3, n = 2``::

    cycle 0: [(0, 0)]
    cycle 1: [(1, 0), (0, 1)]
    cycle 2: [(2, 0), (1, 1)]
    cycle 3: [(2, 1)]

A cycle is a *wave*: its tasks sit on different stages, so they run at the
same time on different workers.
"""
from __future__ import annotations

from collections.abc import Iterable


def clock_cycles(microbatches: int, stages: int) -> Iterable[list[tuple[int, int]]]:
    """The GPipe schedule, one list of ``(microbatch, stage)`` tasks per clock cycle, in order.

    Cycle ``k``, for ``k = 0, 1, ..., microbatches + stages - 2``, is the
    list of all ``(i, j)`` with ``i + j == k``, ``0 <= i < microbatches``
    and ``0 <= j < stages``, ordered by increasing ``j``. Zero micro-batches
    give no cycle (not even an empty list); no cycle is ever empty. The
    cycles come as one iterable that ``Pipe`` walks once, in order: a
    generator (``yield`` each cycle: the natural way) and a list of the
    cycles are both fine. Each cycle itself is a ``list`` of ``(i, j)``
    tuples of ints (``Pipe`` walks a cycle twice, to submit and to receive,
    which a generator cannot do).

    Raises ValueError when ``microbatches < 0`` or ``stages < 1`` (when
    called, or at the latest when a generator is first advanced).
    """
    # BEGIN_STUDENT 2.1
    if microbatches < 0:
        raise ValueError(f"microbatches must be >= 0, got {microbatches}")
    if stages < 1:
        raise ValueError(f"stages must be >= 1, got {stages}")
    if microbatches == 0:
        return
    for k in range(microbatches + stages - 1):
        yield [(k - j, j) for j in range(max(0, k - microbatches + 1), min(k, stages - 1) + 1)]
    # END_STUDENT 2.1
