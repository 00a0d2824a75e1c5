"""Arithmetic of the benchmark: no torch, no I/O, so the tests can recompute every number.

A *run* is ``steps`` training steps of one variant on the fixed workload (``run_time``). The one statistic, defined
here and nowhere else (``STEP_TIME``, ``RATIO``, ``REPEATS``: the console, ``performance_summary.json`` and the
figures quote these words, the handout says the same):

- a variant's step time ``step_time_ms`` is the median over repeats of (run time / steps) (``step_time_ms``);
- a ratio (``speedup``, ``speedup_m<M>``, ...) is the quotient of two step times, ``step_time_ms(numerator) /
  step_time_ms(denominator)`` (``time_ratio``, key ``value``), so it equals what a reader computes from the two
  printed step times. It is not the median of the per-repeat ratios: those (key ``per_repeat``) show the spread;
- repeats are numbered from 1 (the untimed warm-up run is repeat 0); a per-repeat list holds repeat 1 first.
"""
from __future__ import annotations

import statistics
from typing import Sequence

Stamps = Sequence[Sequence[float]]   # one (start, end) pair per step

STEP_TIME = "step_time_ms: the median over repeats of (run time / steps)"
RATIO = ("a ratio (e.g. speedup): the quotient of two step_time_ms, so it equals what you compute from the two "
         "printed step times; per-repeat ratios show the spread")
REPEATS = "repeats are numbered from 1 (the untimed warm-up is repeat 0); a per-repeat list holds repeat 1 first"
FIRST_REPEAT = 1


def run_time(ranks: Sequence[Stamps]) -> float:
    """Seconds of a run: the sum over steps of the slowest rank's step duration.

    ``ranks[r][s] == (start, end)`` of step ``s`` on rank ``r``. Raises
    ValueError when there are no ranks, no steps, or the ranks disagree on
    the number of steps.
    """
    if not ranks or not ranks[0]:
        raise ValueError("run_time needs at least one rank with at least one step")
    steps = len(ranks[0])
    if any(len(r) != steps for r in ranks):
        raise ValueError(f"ranks recorded different numbers of steps: {[len(r) for r in ranks]}")
    return sum(max(r[s][1] - r[s][0] for r in ranks) for s in range(steps))


def step_times(ranks: Sequence[Stamps]) -> list[float]:
    """Per-step seconds (slowest rank) of a run, in step order."""
    return [max(r[s][1] - r[s][0] for r in ranks) for s in range(len(ranks[0]))]


def paired_ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """``numerators[i] / denominators[i]`` for each repeat ``i`` (equal lengths required)."""
    if len(numerators) != len(denominators):
        raise ValueError(f"unpaired series: {len(numerators)} vs {len(denominators)} repeats")
    return [a / b for a, b in zip(numerators, denominators)]


def step_time_ms(run_times: Sequence[float], steps: int) -> float:
    """Milliseconds per step: the median over repeats of ``run time / steps`` (the benchmark's one step time)."""
    return 1000.0 * median(run_times) / steps


def time_ratio(numerators: Sequence[float], denominators: Sequence[float]) -> dict:
    """``{"value": v, "per_repeat": [...]}`` of two variants' run times (one per repeat, same steps, repeat 1 first).

    ``value`` is ``median(numerators) / median(denominators)``: the quotient
    of the two step times (``step_time_ms``), so a ratio printed next to them
    is the one a reader computes from them (``RATIO``). ``per_repeat`` is each
    repeat's own ratio, the spread; its median is not ``value``.
    """
    return {"value": median(numerators) / median(denominators),
            "per_repeat": paired_ratios(numerators, denominators)}


def median(values: Sequence[float]) -> float:
    """The median (mean of the middle two for an even count); ValueError when empty."""
    if not values:
        raise ValueError("median of no values")
    return float(statistics.median(values))


def lower_median(values: Sequence[float]) -> float:
    """The lower middle value (one of ``values``, so the run it came from can be shown); ValueError when empty."""
    if not values:
        raise ValueError("median of no values")
    return float(statistics.median_low(values))


def rotation(names: Sequence[str], repeat: int) -> list[str]:
    """The order of the variants in repeat ``repeat``: the list rotated by ``repeat`` places.

    With two variants this alternates A,B / B,A, so a slow drift of the
    machine favours neither.
    """
    k = repeat % len(names)
    return list(names[k:]) + list(names[:k])


def theoretical_bubble(microbatches: int, stages: int) -> float:
    """GPipe's idle fraction with equal stage times: ``(K - 1) / (M + K - 1)``."""
    if microbatches < 1 or stages < 1:
        raise ValueError(f"need microbatches >= 1 and stages >= 1, got {microbatches}, {stages}")
    return (stages - 1) / (microbatches + stages - 1)


def measured_bubble(tasks: Sequence[dict], stages: int) -> float:
    """Idle fraction of ``stages`` stages over the span of ``tasks`` (dicts with ``stage``, ``start``, ``end``).

    ``1 - sum(busy time) / (stages * (last end - first start))``: the share
    of the stage-time rectangle in which a stage computed nothing.
    """
    if not tasks:
        raise ValueError("measured_bubble needs at least one task")
    span = max(t["end"] for t in tasks) - min(t["start"] for t in tasks)
    busy = sum(t["end"] - t["start"] for t in tasks)
    return 1.0 - busy / (stages * span) if span > 0 else 0.0
