"""Problem 2.1 checks: ``clock_cycles`` (the GPipe schedule) and ``split_module``.

The probe records the student's schedules (bounded, so a runaway generator
stops) and ``split_module`` on layers placed on ``cpu`` and ``meta`` (real
tensors without data: distinct devices on a CPU-only machine). Schedules are
compared with the expected waves stored as data (``Expected.waves``, in this
folder's ``expected.json``; on the staff side also the hidden sizes' waves
from ``staff.py``); splits with the groups written below, by original layer
index.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from grading.check import CheckFailed, SplitRun, SubProblem, describe, describe_exception, describe_kind, expect
from grading.problems.probe_helpers import call_outcome
from grading.problems.p2_1_schedule import ID, TITLE

Schedule = tuple[int, int]                          # (microbatches, stages): one clock_cycles call


@dataclass(frozen=True)
class Inputs:
    """What the split-dependent probe part runs on: the main clock_cycles calls (m >= 1)."""

    schedules: tuple[Schedule, ...]


@dataclass(frozen=True)
class Expected:
    """The waves each main clock_cycles call must yield."""

    waves: dict[Schedule, list[list[tuple[int, int]]]]


PROBLEM = SubProblem(ID, TITLE, __package__,
                     inputs=Inputs(schedules=((1, 1), (3, 2), (2, 3), (4, 4), (5, 1), (1, 5), (6, 3), (3, 7))),
                     expected_type=Expected)

# (micro-batches, stages): edge cases judged by their own criterion, and calls that must raise
EDGE_SCHEDULE_CONFIGS = [(0, 1), (0, 3)]
BAD_SCHEDULE_ARGS = [(-1, 2), (3, 0), (2, -1), (0, 0)]

P_SCHEDULES = "schedules"    # a split part: recorded once per split
P_EDGE_SCHEDULES = "edge_schedules"
P_SCHEDULE_ERRORS = "schedule_errors"
P_SPLIT_PLAIN = "split_plain"
P_SPLIT_WITH_DEVICE = "split_with_device"
P_SPLIT_SPANNING = "split_spanning"
SPANNING_NAMES = ("Linear", "cpu", "meta")     # the spanning layer's class and devices, named by the error


# name -> (expected stage devices, expected stages as original layer indices); layers built in _split_layers
SPLIT_PLAIN = {
    "one cpu stage": (["cpu"], [[0, 1, 2]]),
    "cpu | meta | cpu": (["cpu", "meta", "cpu"], [[0, 1], [2, 3, 4], [5]]),
    "leading parameterless layer": (["meta", "cpu"], [[0, 1], [2, 3]]),
    "no parameters at all": (["cpu"], [[0, 1]]),
    "an empty Sequential": ([], []),
    "buffers but no parameters (BatchNorm1d on meta)": (["cpu", "meta"], [[0, 1], [2]]),
}
SPLIT_WITH_DEVICE = {
    "WithDevice(ReLU, meta) starts a meta stage": (["cpu", "meta"], [[0], [1, 2]]),
    "WithDevice moves a cpu Linear to meta": (["meta", "cpu"], [[0, 1], [2, 3]]),
}


def _split_layers(name: str) -> list:
    """The layers of split case ``name`` (child side: needs the student's WithDevice)."""
    import torch
    from torch import nn

    from pipeline.partition import WithDevice
    torch.manual_seed(0)
    meta = torch.device("meta")

    def lin(device="cpu"):
        return nn.Linear(3, 3, device=device)
    builders = {
        "one cpu stage": lambda: [lin(), nn.ReLU(), lin()],
        "cpu | meta | cpu": lambda: [lin(), nn.Tanh(), lin(meta), nn.ReLU(), lin(meta), lin()],
        "leading parameterless layer": lambda: [nn.ReLU(), lin(meta), lin(), nn.Tanh()],
        "no parameters at all": lambda: [nn.ReLU(), nn.Tanh()],
        "an empty Sequential": lambda: [],
        "buffers but no parameters (BatchNorm1d on meta)": lambda: [lin(), nn.BatchNorm1d(3, affine=False, device=meta),
                                                                    lin(meta)],
        "WithDevice(ReLU, meta) starts a meta stage": lambda: [lin(), WithDevice(nn.ReLU(), "meta"), lin(meta)],
        "WithDevice moves a cpu Linear to meta": lambda: [WithDevice(lin(), meta), lin(meta),
                                                          WithDevice(nn.Tanh(), "cpu"), lin()],
    }
    return builders[name]()


def _describe_split(layers, split_module) -> dict:
    """Run split_module on nn.Sequential(*layers); describe the result by the original layer indices."""
    from torch import nn

    from pipeline.partition import WithDevice
    index = {}
    for k, layer in enumerate(layers):
        index[id(layer)] = str(k)
        if isinstance(layer, WithDevice):
            index[id(layer.module)] = str(k)
            index[id(layer)] = f"{k} (the WithDevice wrapper itself)"
    partitions, devices = split_module(nn.Sequential(*layers))
    containers = [type(partitions).__name__, type(devices).__name__]
    groups, param_devices = [], []
    for partition in partitions:
        children = list(partition.children()) if isinstance(partition, nn.Module) else list(partition)
        groups.append([index.get(id(child), f"an unknown {type(child).__name__}") for child in children])
        param_devices.append(sorted({str(p.device) for child in children for p in child.parameters()}))
    return {"devices": [str(d) for d in devices], "groups": groups, "param_devices": param_devices,
            "types": [type(p).__name__ for p in partitions], "device_types": [type(d).__name__ for d in devices],
            "containers": containers}


def _is_task(task) -> bool:
    return isinstance(task, tuple) and len(task) == 2 and all(type(x) is int for x in task)


def _waves(clock_cycles, m: int, n: int):
    """The first m+n+5 waves of ``clock_cycles(m, n)`` as nested lists; or, as a string, what is wrong with the
    result's kind (an iterable, a generator or a list, of lists of (i, j) tuples of ints) or the error it raised
    (``describe_exception``, with the student file and line)."""
    try:
        cycles = clock_cycles(m, n)
        try:
            walk = iter(cycles)
        except TypeError:
            return f"returned {describe(cycles)}, expected the cycles (a generator that yields each, or a list)"
        waves = []
        for k, wave in enumerate(itertools.islice(walk, m + n + 5)):       # a runaway generator stops
            if not isinstance(wave, list) or not all(_is_task(task) for task in wave):
                return (f"yielded {describe_kind(wave)} as cycle {k}, expected a list of (microbatch, stage) tuples of "
                        "ints (Pipe walks each cycle twice)")
            waves.append([[i, j] for i, j in wave])
        return waves
    except Exception as exc:  # noqa: BLE001
        return f"raised {describe_exception(exc)}"


def _edge_waves(clock_cycles, m: int, n: int):
    """What ``clock_cycles(m, n)`` yields (its first m+n+5 waves, tasks as lists), whatever its kind (judged by
    ``_waves`` alone), or the error it raised as a string."""
    try:
        return [[list(task) for task in wave] if isinstance(wave, (list, tuple)) else describe_kind(wave)
                for wave in itertools.islice(clock_cycles(m, n), m + n + 5)]
    except Exception as exc:  # noqa: BLE001
        return f"raised {describe_exception(exc)}"


def probe_schedule_split(ctx) -> None:
    """Record the student's schedules (bounded), their errors, and split_module on CPU + meta layers."""
    import torch
    from torch import nn

    from pipeline import partition, schedule

    PROBLEM.each_split(ctx, lambda inputs: ctx.record(P_SCHEDULES, lambda: [_waves(schedule.clock_cycles, m, n)
                                                                            for m, n in inputs.schedules]))
    ctx.record(P_EDGE_SCHEDULES, lambda: [_edge_waves(schedule.clock_cycles, m, n)
                                          for m, n in EDGE_SCHEDULE_CONFIGS])
    ctx.record(P_SCHEDULE_ERRORS, lambda: [
        call_outcome(lambda m=m, n=n: list(itertools.islice(schedule.clock_cycles(m, n), 50)))
        for m, n in BAD_SCHEDULE_ARGS])

    for part, cases in ((P_SPLIT_PLAIN, SPLIT_PLAIN), (P_SPLIT_WITH_DEVICE, SPLIT_WITH_DEVICE)):
        def run(cases=cases):
            out = {}
            for name in cases:
                try:
                    out[name] = _describe_split(_split_layers(name), partition.split_module)
                except Exception as exc:  # noqa: BLE001
                    out[name] = describe_exception(exc)
            return out
        ctx.record(part, run)

    def spanning():
        torch.manual_seed(0)
        straddling = nn.Linear(3, 3)
        straddling.bias = nn.Parameter(torch.zeros(3, device="meta"))
        return call_outcome(lambda: partition.split_module(nn.Sequential(nn.Linear(3, 3), straddling)), message=True)
    ctx.record(P_SPLIT_SPANNING, spanning)


CASE = PROBLEM.case("p2_schedule_split", probe_schedule_split, init_group=False, timeout_s=60,
                    split_parts=(P_SCHEDULES,))


# ================================================================ criteria
def _compare_schedule(m: int, n: int, got, expected: list[list[tuple[int, int]]]) -> None:
    expect(not isinstance(got, str), f"clock_cycles({m}, {n}) {got}")
    want = [[list(task) for task in wave] for wave in expected]        # the probe records tasks as [i, j]
    if got == want:
        return
    if len(got) != len(want):
        raise CheckFailed(f"clock_cycles({m}, {n}) yielded {len(got)} cycle(s), expected {len(want)} "
                          f"(k = 0 .. m+n-2, never an empty cycle): got {got[:8]}")
    k = next(k for k in range(len(want)) if got[k] != want[k])
    raise CheckFailed(f"clock_cycles({m}, {n}) cycle {k} is {got[k]}, expected {want[k]} "
                      "(all (i, j) with i + j == k, by increasing j)")


@CASE.criterion("2.1.clock_cycles", "clock_cycles: every cycle's tasks for many (m >= 1, n)", points=3,
                reads=(P_SCHEDULES,))
def check_schedule(run: SplitRun) -> None:
    waves = run.expected.waves
    for (m, n), got in zip(run.inputs.schedules, run.part(P_SCHEDULES)):
        _compare_schedule(m, n, got, waves[m, n])


@CASE.criterion("2.1.clock_cycles_empty", "clock_cycles: nothing for zero micro-batches", points=1,
                reads=(P_EDGE_SCHEDULES,))
def check_schedule_empty(run: SplitRun) -> None:
    for (m, n), got in zip(EDGE_SCHEDULE_CONFIGS, run.part(P_EDGE_SCHEDULES)):
        expect(got == [], f"clock_cycles({m}, {n}) must yield nothing (zero micro-batches), "
               + (f"but it {got}" if isinstance(got, str) else f"got {got}"))


@CASE.criterion("2.1.clock_cycles_errors", "clock_cycles: ValueError for m < 0 or stages < 1", points=1,
                reads=(P_SCHEDULE_ERRORS,))
def check_schedule_errors(run: SplitRun) -> None:
    for (m, n), outcome in zip(BAD_SCHEDULE_ARGS, run.part(P_SCHEDULE_ERRORS)):
        expect(outcome == "ValueError", f"clock_cycles({m}, {n}) must raise ValueError, got {outcome}")


def _check_split(run: SplitRun, part: str, cases: dict) -> None:
    got_all = run.part(part)
    for name, (devices, groups) in cases.items():
        got = got_all.get(name) if isinstance(got_all, dict) else None
        label = f"split_module on '{name}'"
        expect(got is not None, f"{label}: no result")
        expect(not isinstance(got, str), f"{label} raised {got}")
        expect(got["containers"] == ["list", "list"], f"{label} returned ({got['containers'][0]}, "
               f"{got['containers'][1]}), expected (a list of nn.Sequential, a list of torch.device)")
        expect(all(t == "Sequential" for t in got["types"]),
               f"{label}: partitions must be nn.Sequential, got {got['types']}")
        expect(all(t == "device" for t in got["device_types"]),
               f"{label}: devices must be torch.device objects, got {got['device_types']}")
        want_groups = [[str(k) for k in group] for group in groups]
        expect(got["devices"] == devices and got["groups"] == want_groups,
               f"{label}: stages (original layer indices) {got['groups']} on {got['devices']}, "
               f"expected {want_groups} on {devices}")
        for k, (device, found) in enumerate(zip(devices, got["param_devices"])):
            expect(found in ([], [device]), f"{label}: stage {k} should hold parameters on {device} only, "
                   f"found {found}")


@CASE.criterion("2.1.split_module", "split_module groups consecutive layers by parameter device", points=2,
                reads=(P_SPLIT_PLAIN,))
def check_split_plain(run: SplitRun) -> None:
    _check_split(run, P_SPLIT_PLAIN, SPLIT_PLAIN)


@CASE.criterion("2.1.with_device", "split_module honours WithDevice (moves and unwraps the layer)", points=1,
                reads=(P_SPLIT_WITH_DEVICE,))
def check_split_with_device(run: SplitRun) -> None:
    _check_split(run, P_SPLIT_WITH_DEVICE, SPLIT_WITH_DEVICE)


@CASE.criterion("2.1.split_spanning", "split_module: ValueError for a layer spanning two devices", points=1,
                reads=(P_SPLIT_SPANNING,))
def check_split_spanning(run: SplitRun) -> None:
    outcome = run.part(P_SPLIT_SPANNING)
    expect(outcome.startswith("ValueError"), "split_module must raise ValueError for a layer whose parameters are "
           f"on cpu and meta, got {outcome}")
    missing = [name for name in SPANNING_NAMES if name not in outcome.partition(":")[2]]
    expect(not missing, f"split_module raised {outcome}: the message must name the layer's class and its devices "
           f"({', '.join(SPANNING_NAMES)}), and lacks {', '.join(missing)}")

