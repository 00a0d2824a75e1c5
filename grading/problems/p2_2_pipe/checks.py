"""Problem 2.2 checks: ``Pipe.forward`` on the provided ``StageWorkers`` threads.

The probe runs the student's ``Pipe`` over the grader's layers with the schedule replaced by a lookup in recorded
waves (``swaps``), so a broken 2.1 schedule costs nothing here. The criteria compare outputs and gradients with
the plain sequential model (``reference.py``) and the workers' recorded events with ``Expected.events``.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import torch
from torch import nn

from grading.check import (HIDDEN, PUBLIC, CheckFailed, LoadClock, Recorded, SplitRun, SubProblem, Swap, apply,
                          assert_state_close, assert_tensor_close, describe, describe_exception, expect)
from grading.problems.probe_helpers import OPTIMIZER_IMPORTS, stage_devices
from grading.problems.p2_2_pipe import ID, TITLE
from grading.problems.p2_2_pipe import reference as ref
from grading.problems.p2_2_pipe.hints import late_binding_hint

Config = tuple[int, int, int]                       # (stages, rows, split_size)
Schedule = tuple[int, int]                          # (microbatches, stages): one clock_cycles call


@dataclass(frozen=True)
class Inputs:
    """What the split-dependent probe parts run on: Pipe forwards, and the seed of their batches."""

    forward: tuple[Config, ...]
    data_seed: int = 0


@dataclass(frozen=True)
class Expected:
    """The recorded schedule (the 2.1 stand-in) and a correct forward's StageWorkers events."""

    waves: dict[Schedule, list[list[tuple[int, int]]]]
    events: dict[Schedule, list[tuple[str, int]]]


STAGE_TIMEOUT_S = 8.0    # a lost result becomes a TimeoutError, not a hang (x the machine's load: never a correct Pipe)
EDGE_FORWARD_CONFIGS: list[Config] = [(3, 7, 2), (2, 5, 8), (2, 8, 3)]     # a smaller last one; split > batch
# Every other probe uses even splits, so a Pipe that mishandles a smaller last micro-batch loses only
# 2.2.forward_uneven.
EVENT_CONFIGS: list[Config] = [(3, 8, 2), (2, 6, 2)]                       # 4 and 3 micro-batches
BACKWARD_CONFIG: Config = (3, 8, 2)
SGD_CONFIG: Config = (2, 8, 4)
REPEATS = 3
OTHER_CONFIGS: list[Config] = [(3, 8, 2), (3, 4, 4), (2, 4, 4), BACKWARD_CONFIG, SGD_CONFIG]   # repeated, no_grad, ...

PROBLEM = SubProblem(ID, TITLE, __package__,
                     inputs=Inputs(forward=((1, 8, 4), (2, 8, 4), (3, 8, 2), (3, 6, 1))),   # even splits
                     expected_type=Expected, expected_in_ranks=(PUBLIC, HIDDEN))   # waves for the schedule stand-in

P_DEVICES = "devices"
P_FORWARD = "forward"    # a split part: recorded once per split
P_EDGE_FORWARD = "edge_forward"
P_REPEATED = "repeated"
P_NO_GRAD = "no_grad"
P_OUTPUT_DEVICE = "output_device"
P_MOVES = "device_moves"
P_EVENTS = "events"
P_STAGE_EXCEPTION = "stage_exception"
P_BACKWARD = "backward"
P_SGD = "sgd"


def schedule_of(config: Config) -> Schedule:
    """The ``clock_cycles(microbatches, stages)`` call a Pipe of ``config`` makes."""
    stages, rows, split = config
    return math.ceil(rows / split), stages


def schedules(inputs: Inputs) -> list[Schedule]:
    """Every schedule the probe's Pipes need on ``inputs`` (the recorded waves cover exactly these)."""
    configs = [*inputs.forward, *EDGE_FORWARD_CONFIGS, *EVENT_CONFIGS, *OTHER_CONFIGS]
    return sorted({schedule_of(c) for c in configs})


def swaps(*expected: Expected) -> list[Swap]:
    """The swaps of this case: the schedule replays the recorded waves of ``expected`` (every split's)."""
    table = {key: waves for e in expected for key, waves in e.waves.items()}
    return [Swap("pipeline.schedule", "clock_cycles", lambda: _recorded_schedule(table),
                 "2.2 is judged apart from the student's clock_cycles (2.1)")]


def _recorded_schedule(table: dict):
    """Stand-in for ``clock_cycles``: replays recorded waves (a table lookup, no schedule computed)."""
    recorded = Recorded(table, "clock_cycles")

    def clock_cycles(microbatches: int, stages: int):
        for wave in recorded(microbatches, stages):
            yield [(i, j) for i, j in wave]
    return clock_cycles


def _stages(count: int, layers: list | None = None) -> list:
    """The grader's layers cut into ``count`` stages, each moved to its device (``stage_devices``)."""
    layers = ref.build_layers(0) if layers is None else layers
    return [stage.to(device) for stage, device in zip(ref.stage_layers(layers, count), stage_devices(count))]


def _returned(out):
    """A Pipe's output detached on the CPU when it is the stated tensor, else a sentence naming what came back."""
    if isinstance(out, torch.Tensor):
        return out.detach().cpu()
    what = describe(out)
    if isinstance(out, (list, tuple)) and out:
        what += f" of {len(out)} {', '.join(sorted({describe(item) for item in out}))}"
    return f"Pipe.forward returned {what}, expected one tensor (the last stage's outputs joined with torch.cat)"


def _pipe_run(Pipe, stages: int, rows: int, split: int, seed: int = 0) -> dict:
    """One forward of a fresh Pipe over the grader's layers on ``batch(rows, seed)``; output (CPU) and its device."""
    x = ref.batch(rows, seed)[0]
    with Pipe(_stages(stages), stage_devices(stages), split) as pipe:
        out = pipe(x)
    return {"output": _returned(out), "device": str(out.device) if isinstance(out, torch.Tensor) else ""}


# ================================================================ probe
def _forwards(Pipe, configs, seed: int = 0) -> list[dict]:
    """``_pipe_run`` of each config (``(stages, rows, split_size)``), on batches of ``seed``."""
    return [_pipe_run(Pipe, *c, seed=seed) for c in configs]


def _repeated_outputs(Pipe) -> list:
    """The outputs of REPEATS calls of one Pipe (3 stages, split_size 2) on batch k of 8 rows for call k."""
    outputs = []
    with Pipe(_stages(3), stage_devices(3), 2) as pipe:
        for k in range(REPEATS):
            outputs.append(_returned(pipe(ref.batch(8, k)[0])))
    return outputs


def _no_grad_output(Pipe) -> dict:
    """A Pipe (3 stages, split_size 2) called under ``torch.no_grad()``: its output, and whether it requires grad."""
    with Pipe(_stages(3), stage_devices(3), 2) as pipe, torch.no_grad():
        out = pipe(ref.batch(8)[0])
    return {"output": _returned(out), "requires_grad": getattr(out, "requires_grad", None)}


def _output_devices(Pipe) -> dict:
    """The device of a Pipe's output (3 stages), and of a Pipe's over stages on [cpu, meta] whose meta stage moves
    its input itself.

    One micro-batch (split_size == batch): one task per cycle; where the meta stage's input ends up is
    2.2.moves_in_worker's, so only the result's device is at stake.
    """
    found = _pipe_run(Pipe, 3, 4, 4)
    torch.manual_seed(0)
    stages = [nn.Linear(ref.IN_FEATURES, ref.HIDDEN),
              ref.MovesItsInput(nn.Linear(ref.HIDDEN, ref.OUT_FEATURES, device="meta"), "meta")]
    with Pipe(stages, ["cpu", "meta"], 4) as pipe:
        try:
            out = pipe(ref.batch(4)[0])
        except NotImplementedError as exc:
            if "meta" not in str(exc):
                raise
            raise RuntimeError("the result was moved off the last stage's device (meta): "
                               f"{describe_exception(exc)}") from None
    if not isinstance(out, torch.Tensor):
        raise TypeError(_returned(out))
    return {"device": found["device"], "output": found["output"], "meta_device": str(out.device),
            "meta_shape": list(out.shape)}


def _device_moves(Pipe) -> dict:
    """Which threads move tensors to the second stage's device (meta here; cuda:1 on GPUs), and on which device
    that stage receives its input; one micro-batch (split_size == batch), so one task per cycle and only the move
    is at stake."""
    threads, real_to = [], torch.Tensor.to

    def recording_to(tensor, *args, **kwargs):
        if tensor.device.type != "meta" and any(str(a) == "meta" for a in (*args, *kwargs.values())):
            threads.append(threading.current_thread().name)
        return real_to(tensor, *args, **kwargs)
    torch.manual_seed(0)
    second = ref.InputDevices(nn.Linear(ref.HIDDEN, ref.OUT_FEATURES, device="meta"))
    stages = [nn.Linear(ref.IN_FEATURES, ref.HIDDEN), second]
    failure = ""
    with Pipe(stages, ["cpu", "meta"], 4) as pipe:
        workers = [t.name for t in pipe.workers.threads]
        torch.Tensor.to = recording_to
        try:
            pipe(ref.batch(4)[0])
        except Exception as exc:  # noqa: BLE001 - judged by the other criteria; the moves are recorded
            failure = describe_exception(exc, limit=300)
        finally:
            torch.Tensor.to = real_to
    return {"threads": threads, "workers": workers, "failure": failure, "received": list(second.received)}


def _worker_events(Pipe) -> list:
    """The StageWorkers events (``[kind, stage]``) of one forward of each of EVENT_CONFIGS."""
    found = []
    for stages, rows, split in EVENT_CONFIGS:
        with Pipe(_stages(stages), stage_devices(stages), split) as pipe:
            pipe(ref.batch(rows)[0])
            found.append([[str(kind), int(stage)] for kind, stage in pipe.workers.events])
    return found


def _stage_exception(Pipe) -> dict:
    """A Pipe whose second of 3 stages raises: what reached the caller, the threads in which the stage ran, the
    Pipe's workers, and the threads it started that are still alive after it was closed."""
    before = set(threading.enumerate())
    stages = _stages(3)
    stages[1] = failing = ref.FailingStage()
    outcome = ["no exception", ""]
    with Pipe(stages, stage_devices(3), 2) as pipe:
        workers = [t.name for t in pipe.workers.threads]
        try:
            pipe(ref.batch(8)[0])
        except Exception as exc:  # noqa: BLE001
            outcome = [type(exc).__name__, str(exc), describe_exception(exc)]
    alive = [t.name for t in threading.enumerate() if t not in before and t.is_alive()]
    return {"outcome": outcome, "alive": alive, "called_in": failing.called_in, "workers": workers}


def _backward_grads(Pipe) -> dict:
    """The gradients of the input and of every layer after one backward through a Pipe of BACKWARD_CONFIG."""
    stages, rows, split = BACKWARD_CONFIG
    layers = ref.build_layers(0)
    inputs, targets = ref.batch(rows)
    inputs.requires_grad_(True)
    with Pipe(_stages(stages, layers), stage_devices(stages), split) as pipe:
        ref.loss_fn(pipe(inputs), targets).backward()
    grads = {name: (p.grad.detach().cpu() if p.grad is not None else None)
             for name, p in nn.Sequential(*layers).named_parameters()}
    return {"input": inputs.grad, "params": grads}


def _sgd_params(Pipe) -> dict:
    """The layers' parameters after ``ref.SGD_STEPS`` SGD steps through a Pipe of SGD_CONFIG."""
    stages, rows, split = SGD_CONFIG
    layers = ref.build_layers(0)
    with Pipe(_stages(stages, layers), stage_devices(stages), split) as pipe:
        optimizer = torch.optim.SGD(pipe.parameters(), lr=ref.LEARNING_RATE)
        for step in range(ref.SGD_STEPS):
            inputs, targets = ref.batch(rows, step)
            optimizer.zero_grad()
            ref.loss_fn(pipe(inputs), targets).backward()
            optimizer.step()
    return {name: p.detach().cpu().clone() for name, p in nn.Sequential(*layers).named_parameters()}


def probe_pipe(ctx) -> None:
    """Pipe forward/backward with recorded waves as the schedule; the runtime's events; errors; devices.

    Without two GPUs every stage is on ``cpu`` (``stage_devices``), each still on its own worker thread. Moves
    between devices are seen there too, through a second stage on ``meta``: it notes the device of the input it
    receives, and the probe notes which thread moved a tensor there.
    """
    from pipeline import runtime
    apply(swaps(*PROBLEM.shipped_expected(ctx)))
    runtime.DEFAULT_TIMEOUT = STAGE_TIMEOUT_S * LoadClock.slowdown(recent=True)
    from pipeline.pipe import Pipe

    ctx.record(P_DEVICES, lambda: {n: stage_devices(n) for n in (1, 2, 3)})
    PROBLEM.each_split(ctx, lambda inputs: ctx.record(P_FORWARD, lambda: _forwards(Pipe, inputs.forward,
                                                                                   inputs.data_seed)))
    ctx.record(P_EDGE_FORWARD, lambda: _forwards(Pipe, EDGE_FORWARD_CONFIGS))
    ctx.record(P_REPEATED, lambda: _repeated_outputs(Pipe))
    ctx.record(P_NO_GRAD, lambda: _no_grad_output(Pipe))
    ctx.record(P_OUTPUT_DEVICE, lambda: _output_devices(Pipe))
    ctx.record(P_MOVES, lambda: _device_moves(Pipe))
    ctx.record(P_EVENTS, lambda: _worker_events(Pipe))
    ctx.record(P_STAGE_EXCEPTION, lambda: _stage_exception(Pipe))
    ctx.record(P_BACKWARD, lambda: _backward_grads(Pipe))
    ctx.record(P_SGD, lambda: _sgd_params(Pipe))


CASE = PROBLEM.case("p2_pipe", probe_pipe, init_group=False, timeout_s=180, preload=OPTIMIZER_IMPORTS,
                    split_parts=(P_FORWARD,))


# ================================================================ criteria
def _check_output(run: SplitRun, what: str, got: dict, config: Config, seed: int = 0) -> None:
    """``got["output"]`` equals the plain model's output on ``batch(rows, seed)``; a failure names a late-binding
    closure when the output is what one gives on the recorded schedule of ``config``."""
    stages, rows, split = config
    expect(not isinstance(got["output"], str), f"{what}: {got['output']}")
    try:
        assert_tensor_close(what, got["output"], ref.sequential_forward(rows, seed), atol=1e-5, rtol=1e-4)
    except CheckFailed as failure:
        waves = run.expected.waves.get(schedule_of(config))
        raise CheckFailed(f"{failure}{late_binding_hint(got['output'], waves, stages, rows, split, seed)}") from None


def _check_repeated_and_no_grad(run: SplitRun) -> None:
    outputs = run.part(P_REPEATED)
    expect(isinstance(outputs, list) and len(outputs) == REPEATS, f"repeated calls: got {describe(outputs)}")
    for k, out in enumerate(outputs):
        _check_output(run, f"Pipe output of call {k + 1} of {REPEATS} on one Pipe (3 stages, batch 8, split_size 2)",
                      {"output": out}, (3, 8, 2), k)
    got = run.part(P_NO_GRAD)
    _check_output(run, "Pipe output under torch.no_grad()", got, (3, 8, 2))
    expect(got["requires_grad"] is False, "Pipe output under torch.no_grad() requires grad: it built a graph")


@CASE.criterion("2.2.forward", "Pipe output equals the plain model (1-3 stages, repeated calls, no_grad)",
                points=3, reads=(P_FORWARD, P_REPEATED, P_NO_GRAD), public_only=(_check_repeated_and_no_grad,))
def check_pipe_forward(run: SplitRun) -> None:
    inputs = run.inputs
    for (stages, rows, size), got in zip(inputs.forward, run.part(P_FORWARD)):
        _check_output(run, f"Pipe output ({stages} stage(s), batch {rows}, split_size {size})", got,
                      (stages, rows, size), inputs.data_seed)


@CASE.criterion("2.2.forward_uneven", "Pipe output with a smaller last micro-batch, and split_size > batch",
                points=1, reads=(P_EDGE_FORWARD,))
def check_pipe_forward_uneven(run: SplitRun) -> None:
    for (stages, rows, size), got in zip(EDGE_FORWARD_CONFIGS, run.part(P_EDGE_FORWARD)):
        _check_output(run, f"Pipe output ({stages} stage(s), batch {rows}, split_size {size})", got,
                      (stages, rows, size))


@CASE.criterion("2.2.output_on_last_device", "Pipe output is on the last stage's device", points=1,
                reads=(P_DEVICES, P_OUTPUT_DEVICE))
def check_pipe_device(run: SplitRun) -> None:
    devices = run.part(P_DEVICES)[3]
    got = run.part(P_OUTPUT_DEVICE)
    expect(not isinstance(got["output"], str), f"Pipe with stages on {devices}: {got['output']}")
    expect(got["device"] == devices[-1], f"Pipe output (stages on {devices}, a cpu input) is on {got['device']}, "
           f"expected the last stage's device {devices[-1]}")
    expect(got["meta_device"] == "meta" and got["meta_shape"] == [4, ref.OUT_FEATURES],
           f"Pipe with stages on [cpu, meta] and a cpu input: output on {got['meta_device']} with shape "
           f"{got['meta_shape']}, expected on meta with shape [4, {ref.OUT_FEATURES}]")


@CASE.criterion("2.2.moves_in_worker", "each task moves its input to its stage's device inside the worker",
                points=1, reads=(P_MOVES,))
def check_moves_in_worker(run: SplitRun) -> None:
    got = run.part(P_MOVES)
    raised = f" (the forward raised {got['failure']})" if got["failure"] else ""
    expect(got["received"], f"Pipe with stages on [cpu, meta]: the second stage was never called{raised}")
    wrong = sorted(set(got["received"]) - {"meta"})
    expect(not wrong, f"Pipe with stages on [cpu, meta]: the second stage received its input on {', '.join(wrong)}, "
           "expected on its device meta: each task moves its stage's own input (the previous stage's output) with "
           ".to(self.devices[j]) and passes the moved tensor to the stage (Tensor.to returns a new tensor)")
    expect(got["threads"], f"Pipe with stages on [cpu, meta]: no tensor was moved to the second stage's device{raised}")
    own = got["workers"][1]
    outside = sorted(set(got["threads"]) - {own})
    expect(not outside, f"Pipe with stages on [cpu, meta]: the second stage's input was moved to meta in thread(s) "
           f"{outside}, expected only that stage's own worker {own!r}: move the input inside the task submitted to "
           "its own stage (on GPUs the copy then runs on the stage's own device and stream)")


@CASE.criterion("2.2.wave_dispatch", "each clock cycle: all submits, then receives in the same order", points=3,
                reads=(P_EVENTS,))
def check_pipe_waves(run: SplitRun) -> None:
    found = run.part(P_EVENTS)
    expected = run.expected.events
    for k_config, config in enumerate(EVENT_CONFIGS):
        micro, stages = schedule_of(config)
        want = [list(event) for event in expected[micro, stages]]
        got = found[k_config] if isinstance(found, list) and k_config < len(found) else []
        if got == want:
            continue
        k = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]), min(len(got), len(want)))
        raise CheckFailed(f"StageWorkers events ({stages} stages, {micro} micro-batches): event {k} is "
                          f"{got[k] if k < len(got) else 'missing'}, expected "
                          f"{want[k] if k < len(want) else 'nothing more'}; each clock cycle must submit all its "
                          f"tasks before receiving any, then receive them in the same order.\n"
                          f"got      {got[:12]}...\nexpected {want[:12]}...")


@CASE.criterion("2.2.stage_exception", "a stage's exception reaches the caller; no thread left alive", points=2,
                reads=(P_STAGE_EXCEPTION,))
def check_pipe_exception(run: SplitRun) -> None:
    got = run.part(P_STAGE_EXCEPTION)
    kind, message, described = (list(got["outcome"]) + [""])[:3]
    expect(kind == "ValueError" and ref.FailingStage.MESSAGE in message,
           f"a stage raising ValueError('{ref.FailingStage.MESSAGE}') must surface in the caller of Pipe.forward; "
           f"the caller got {described or kind}")
    expect(got["called_in"] and set(got["called_in"]) <= set(got["workers"]),
           f"the failing stage ran in thread(s) {got['called_in']}, expected the Pipe's worker threads "
           f"{got['workers']} (run every stage call through self.workers.submit)")
    expect(not got["alive"], f"threads still alive after the failing Pipe was closed: {got['alive']}")


@CASE.criterion("2.2.backward", "input/parameter gradients and 3 SGD steps equal the plain model", points=3,
                reads=(P_BACKWARD, P_SGD))
def check_pipe_backward(run: SplitRun) -> None:
    stages, rows, size = BACKWARD_CONFIG
    want_input, want_params = ref.sequential_gradients(rows)
    got = run.part(P_BACKWARD)
    where = f"({stages} stages, batch {rows}, split_size {size})"
    expect(got["input"] is not None, f"Pipe backward {where}: the input got no gradient (detached between stages?)")
    assert_tensor_close(f"Pipe backward {where}: input gradient", got["input"], want_input, atol=1e-6, rtol=1e-4)
    for name, grad in got["params"].items():
        expect(grad is not None, f"Pipe backward {where}: parameter '{name}' got no gradient "
               "(detached between stages?)")
    assert_state_close(f"Pipe backward {where}: gradient of", got["params"], want_params, atol=1e-6, rtol=1e-4)
    stages, rows, size = SGD_CONFIG
    assert_state_close(f"Pipe training ({stages} stages, batch {rows}, split_size {size}): after {ref.SGD_STEPS} "
                       "SGD steps, parameter", run.part(P_SGD), ref.sequential_sgd(rows), atol=1e-6, rtol=1e-4)

