"""The one seam (issue 12): every isolation swap names a function that exists in the student module and that
the student code looks up through its module at call time, so the stand-in is what actually runs.

Runs the reference (the kit's own region bodies) in-process, with a recording wrapper installed by the same
``grading.kit.seams.apply`` the probes use, and restores the student modules afterwards.
"""
from __future__ import annotations

import importlib

import pytest
import torch

from grading.problems.p1_1_partition import checks as p1_1_partition
from grading.problems.p1_2_comm import checks as p1_2_comm
from grading.problems.p2_2_pipe import checks as p2_2_pipe
from grading.problems.p2_3_gpt2 import checks as p2_3_gpt2
from grading.problems.p1_2_comm import reference as p1_ref
from grading.problems.p2_2_pipe import reference as p2_ref
from grading.problems.p2_3_gpt2 import reference as gpt2_ref
from grading.kit.seams import Swap, apply

pytestmark = pytest.mark.kit


def _recording(swap: Swap, calls: list) -> Swap:
    """``swap`` with its stand-in wrapped so that every call (or construction) is recorded."""
    def make():
        stand_in = swap.make()

        def recorded(*args, **kwargs):
            calls.append(f"{swap.module}.{swap.name}")
            return stand_in(*args, **kwargs)
        return recorded
    return Swap(swap.module, swap.name, make, swap.why)


def _swapped_run(swaps, run) -> list[str]:
    """Apply ``swaps`` with recorders, call ``run(installed)``, restore the modules; return the recorded calls."""
    calls: list[str] = []
    originals = {(s.module, s.name): getattr(importlib.import_module(s.module), s.name) for s in swaps}
    try:
        installed = apply([_recording(s, calls) for s in swaps])
        run(installed)
    finally:
        for (module, name), value in originals.items():
            setattr(importlib.import_module(module), name, value)
    return calls


def test_partition_dataset_calls_its_swapped_helpers():
    from data_parallel.dataset import partition_dataset

    def run(_):
        batches = list(partition_dataset(0, 2, p1_1_partition.DATASET, 8, collate_fn=list))
        assert batches and batches[0][0].startswith("example")
    swaps = p1_1_partition.swaps(p1_1_partition.PROBLEM.expected_for("public"))
    calls = _swapped_run(swaps, run)
    assert set(calls) == {f"{s.module}.{s.name}" for s in swaps}


def test_train_step_calls_the_swapped_averaging():
    import torch.distributed as dist

    from data_parallel.comm import train_step
    stand_in = p1_2_comm.SWAPS[0].make()
    model = p1_ref.GradProbeNet(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=p1_ref.LEARNING_RATE)
    inputs, targets = p1_ref.batch(0)
    stand_in.batch, stand_in.shard = (inputs, targets), (inputs[:6], targets[:6])
    swap = Swap(p1_2_comm.SWAPS[0].module, p1_2_comm.SWAPS[0].name, lambda: stand_in, "test")
    assert not dist.is_initialized()          # the stand-in needs no process group
    calls = _swapped_run([swap], lambda _: train_step(model, optimizer, inputs[:6], targets[:6], p1_ref.loss_fn))
    assert calls == ["data_parallel.comm.average_gradients"]
    serial = p1_ref.GradProbeNet(0)
    p1_ref.loss_fn(serial(inputs), targets).backward()
    with torch.no_grad():
        for p in serial.parameters():
            if p.grad is not None:
                p -= p1_ref.LEARNING_RATE * p.grad
    for (name, got), want in zip(model.named_parameters(), serial.parameters()):
        assert torch.allclose(got, want, atol=1e-6), name      # one step equals serial SGD on the global batch


def test_pipe_runs_the_recorded_schedule():
    from pipeline.pipe import Pipe

    def run(_):
        with Pipe(p2_ref.stage_layers(p2_ref.build_layers(0), 3), ["cpu"] * 3, 2) as pipe:
            out = pipe(p2_ref.batch(8)[0])
        assert torch.allclose(out, p2_ref.sequential_forward(8), atol=1e-6)
    swaps = p2_2_pipe.swaps(p2_2_pipe.PROBLEM.expected_for("public"))
    assert _swapped_run(swaps, run) == ["pipeline.schedule.clock_cycles"]


def test_gpt2_pipeline_builds_the_swapped_pipe():
    from pipeline import gpt2

    def run(_):
        with gpt2.build_pipeline_gpt2(gpt2_ref.tiny_gpt2(), ["cpu", "cpu"], "pipeline_parallel", 2) as net:
            logits = net(gpt2_ref.gpt2_batch())
        assert torch.allclose(logits, gpt2_ref.gpt2_logits(), atol=1e-5)
    assert _swapped_run(p2_3_gpt2.SWAPS, run) == ["pipeline.pipe.Pipe"]
