"""How a pipeline run cuts its batches, said exactly, and where its stage timeline lives.

``Pipe`` takes a micro-batch *size*; the entry points and the benchmark take a micro-batch *count* ``n_chunk``, and
refuse up front a count that a batch does not really give (``check_n_chunk``), so the count a run reports is the
count that ran. ``check_schedule`` checks the student's ``clock_cycles`` (Problem 2.1) before ``Pipe`` walks it.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable

from torch import nn

from project.cli import ConfigError, UniformError

SCHEDULE_CONTRACT = ("Problem 2.1's contract: an iterable of cycles (a generator or a list), each a list of "
                     "(microbatch, stage) tuples of ints, every task exactly once, each after (i, j - 1) and "
                     "(i - 1, j), in m + n - 1 cycles")


def split_size(batch_size: int, n_chunk: int) -> int:
    """The micro-batch size that cuts ``batch_size`` rows into ``n_chunk`` micro-batches."""
    return math.ceil(batch_size / n_chunk)


def count(rows: int, size: int) -> int:
    """Micro-batches ``torch.split`` makes of ``rows`` rows with micro-batches of ``size``."""
    return math.ceil(rows / size)


def check_n_chunk(batch_size: int, n_chunk: int) -> None:
    """Raise ConfigError unless ``n_chunk`` micro-batches is what a batch of ``batch_size`` rows really gives.

    ``split_size = ceil(batch / n_chunk)`` gives exactly ``n_chunk`` micro-batches only when
    ``ceil(batch / split_size) == n_chunk``: a batch of 9 with ``n_chunk`` 4 gives ``split_size`` 3, so 3
    micro-batches (``torch.chunk`` behaves the same way). The last, smaller batch of an epoch may still run fewer.
    """
    if n_chunk > batch_size:
        raise ConfigError(f"--n_chunk {n_chunk} is more than --batch_size {batch_size}: a micro-batch needs a row")
    actual = count(batch_size, split_size(batch_size, n_chunk))
    if actual != n_chunk:
        fits = [m for m in range(1, batch_size + 1) if count(batch_size, split_size(batch_size, m)) == m]
        near = sorted(fits, key=lambda m: abs(m - n_chunk))[:3]
        raise ConfigError(f"--n_chunk {n_chunk} with --batch_size {batch_size}: micro-batches of "
                          f"ceil({batch_size}/{n_chunk}) = {split_size(batch_size, n_chunk)} rows make {actual} "
                          f"micro-batches, not {n_chunk}; choose e.g. {', '.join(map(str, sorted(near)))}")


def stage_timeline(net: nn.Module) -> list:
    """The list a pipeline wrapper appends one ``{stage, task_index, start, end}`` per stage task to.

    ``Pipe``: its workers' ``timeline``; ``ModelParallel``: its own ``timeline``.
    """
    workers = getattr(net, "workers", None)
    return workers.timeline if workers is not None else net.timeline


def _kind(value: object) -> str:
    """``None``, or the type's name with an article: ``a generator``, ``an int``."""
    if value is None:
        return "None"
    name = type(value).__name__
    return f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name}"


def schedule_problem(clock_cycles: Callable, m: int, n: int) -> str | None:
    """What is wrong with what ``clock_cycles(m, n)`` yields (a phrase such as ``yielded a generator as cycle 0, not
    a list``), or None when it keeps the contract of ``pipeline/schedule.py``.

    The contract checked: an iterable of cycles; each cycle a ``list`` of
    ``(i, j)`` tuples of two ints with ``0 <= i < m``, ``0 <= j < n``; every
    task exactly once; ``(i, j)`` in a later cycle than ``(i, j - 1)`` (its
    input) and ``(i - 1, j)`` (its stage busy); at most ``m + n - 1`` cycles
    (at most that many are drawn, so a runaway generator stops). An exception
    that ``clock_cycles`` raises propagates.
    """
    result = clock_cycles(m, n)
    try:
        cycles = iter(result)
    except TypeError:
        return f"returned {_kind(result)}, not an iterable of cycles (a generator or a list)"
    ran: dict[tuple[int, int], int] = {}   # task -> its cycle
    for k, cycle in enumerate(itertools.islice(cycles, m + n)):
        if k == m + n - 1:
            return f"yielded more than {m + n - 1} cycles"
        if not isinstance(cycle, list):
            return f"yielded {_kind(cycle)} as cycle {k}, not a list (Pipe walks a cycle twice)"
        for task in cycle:
            if not (isinstance(task, tuple) and len(task) == 2 and all(type(x) is int for x in task)):
                return f"put {_kind(task)} {task!r:.60} in cycle {k}, not a (microbatch, stage) tuple of two ints"
            i, j = task
            if not (0 <= i < m and 0 <= j < n):
                return f"put task {task} in cycle {k}, outside 0 <= microbatch < {m}, 0 <= stage < {n}"
            if task in ran:
                return f"put task {task} in cycle {ran[task]} and again in cycle {k}"
            for before, why in (((i, j - 1), "its input"), ((i - 1, j), "its stage's previous task")):
                if min(before) >= 0 and ran.get(before, k) >= k:
                    return f"put task {task} in cycle {k}, not after task {before} ({why})"
            ran[task] = k
    missing = [(i, j) for i in range(m) for j in range(n) if (i, j) not in ran]
    return f"never yielded task {missing[0]} ({len(missing)} of {m * n} tasks missing)" if missing else None


def check_schedule(clock_cycles: Callable, n_chunk: int, stages: int) -> None:
    """Raise UniformError (one line) unless ``clock_cycles(m, stages)`` keeps its contract for every micro-batch
    count ``m`` of a run cut into at most ``n_chunk`` micro-batches (``n_chunk`` first, then down to 1)::

        pipeline/schedule.py: clock_cycles(4, 2) yielded a generator as cycle 0, not a list (Pipe walks a cycle
        twice); Problem 2.1's contract: an iterable of cycles (a generator or a list), each a list of ...

    It checks the properties the contract states, never a computed schedule. Unchecked, a broken schedule would
    fail later and elsewhere (a cycle that is a generator leaves ``Pipe``'s second walk empty: a dtype error in
    the loss).
    """
    for m in range(n_chunk, 0, -1):
        problem = schedule_problem(clock_cycles, m, stages)
        if problem is not None:
            raise UniformError(f"pipeline/schedule.py: clock_cycles({m}, {stages}) {problem}; {SCHEDULE_CONTRACT}")
