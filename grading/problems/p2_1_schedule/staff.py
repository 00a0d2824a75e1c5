"""Staff only (never released): the 2.1 answers, hidden inputs and hidden criteria.

``clock_cycles`` and ``schedule`` are also the 2.2 staff's recorded waves
(``grading.problems.p2_2_pipe.staff``): keep their signatures.
"""
from __future__ import annotations

import random
from collections.abc import Iterator

from grading.problems.p2_1_schedule import checks
from grading.problems.p2_1_schedule.checks import Expected, Inputs


def clock_cycles(microbatches: int, stages: int) -> Iterator[list[tuple[int, int]]]:
    """The answer of 2.1: for k = 0 .. m+n-2 the tasks (i, j) with i + j == k, by increasing j."""
    for k in range(microbatches + stages - 1 if microbatches else 0):
        yield [(k - j, j) for j in range(stages) if 0 <= k - j < microbatches]


def schedule(microbatches: int, stages: int) -> list[list[tuple[int, int]]]:
    """``clock_cycles`` as a list of waves (the form probes record)."""
    return list(clock_cycles(microbatches, stages))


def expected(inputs: Inputs) -> Expected:
    """The waves of every main clock_cycles call of ``inputs``."""
    return Expected(waves={key: schedule(*key) for key in inputs.schedules})


def hidden_inputs(rng: random.Random) -> Inputs:
    """Secret sizes: more micro-batches than stages, more stages than micro-batches, and one stage."""
    return Inputs(schedules=((rng.randint(8, 14), rng.randint(4, 9)), (rng.randint(2, 4), rng.randint(8, 12)),
                             (rng.randint(9, 16), 1)))


HIDDEN_KIND = "more micro-batches than stages, more stages than micro-batches, and one stage"
HIDDEN_POINTS = {checks.check_schedule: 1}
