"""Staff only (never released): the 1.1 answers, hidden inputs and hidden criteria."""
from __future__ import annotations

import random

from grading.problems.p1_1_partition import checks
from grading.problems.p1_1_partition.checks import DEFAULT_SEED, Expected, Inputs


def partition_indices(size: int, world_size: int, seed: int = DEFAULT_SEED) -> list[list[int]]:
    """The answer of 1.1: shuffle with random.Random(seed), then contiguous slices in rank order."""
    order = list(range(size))
    random.Random(seed).shuffle(order)
    base, extra = divmod(size, world_size)
    parts, start = [], 0
    for rank in range(world_size):
        length = base + (1 if rank < extra else 0)
        parts.append(order[start:start + length])
        start += length
    return parts


def expected(inputs: Inputs) -> Expected:
    """The parts of every call the criteria compare with on ``inputs``, and of the loader's recorded calls."""
    return Expected(partitions={call: partition_indices(*call) for call in checks.partition_calls(inputs)},
                    loader={call: partition_indices(*call) for call in checks.loader_calls()})


def hidden_inputs(rng: random.Random) -> Inputs:
    """Four calls of secret sizes, world sizes and seeds, and one with more ranks than items (empty parts)."""
    calls = [(rng.randint(20, 400), rng.randint(2, 8), rng.randint(10_000, 99_999)) for _ in range(4)]
    calls.append((rng.randint(3, 9), rng.randint(10, 13), rng.randint(10_000, 99_999)))     # empty parts
    return Inputs(partitions=tuple(calls))


HIDDEN_KIND = "other sizes, world sizes and seeds, and more ranks than items (empty parts)"
HIDDEN_POINTS = {checks.check_exact: 1}
