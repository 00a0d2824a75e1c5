"""Staff only (never released): the 2.1 answers, hidden inputs and hidden criteria."""
from __future__ import annotations

from collections.abc import Iterator


def clock_cycles(microbatches: int, stages: int) -> Iterator[list[tuple[int, int]]]:
    """The answer of 2.1: for k = 0 .. m+n-2 the tasks (i, j) with i + j == k, by increasing j."""
    for k in range(microbatches + stages - 1 if microbatches else 0):
        yield [(k - j, j) for j in range(stages) if 0 <= k - j < microbatches]


def schedule(microbatches: int, stages: int) -> list[list[tuple[int, int]]]:
    """``clock_cycles`` as a list of waves (the form probes record)."""
    return list(clock_cycles(microbatches, stages))
