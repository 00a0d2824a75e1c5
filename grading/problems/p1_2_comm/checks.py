"""Problem 1.2 checks: ``setup_process_group``, ``average_gradients``, ``train_step``.

The probe joins a 2-rank gloo group through the student's ``setup_process_group`` (its parts and judges are in
``setup_checks.py``), records the averaged gradients of a small model on each rank's shard, then runs
``train_step`` with the averaging replaced by a serial recomputation (``SWAPS``), so ``train_step`` is judged
apart from ``average_gradients``. The criteria compare with serial global-batch gradients and SGD computed in
the grader (``reference.py``); nothing is stored as expected data.
"""
from __future__ import annotations

import copy
import datetime
from dataclasses import dataclass

import torch

from grading.check import (CheckFailed, SplitRun, SubProblem, Swap, apply, assert_ranks_close, assert_state_close,
                          describe, expect)
from grading.problems.probe_helpers import OPTIMIZER_IMPORTS, factor_hint
from grading.problems.p1_2_comm import ID, TITLE, setup_checks
from grading.problems.p1_2_comm import reference as ref
from grading.problems.p1_2_comm.setup_checks import NOT_CALLED, PG_TIMEOUT_S


@dataclass(frozen=True)
class Inputs:
    """What the averaged-gradient part runs on: the number of ranks, the model's and the batch's seeds."""

    world_size: int = 2
    model_seed: int = 0
    batch_seed: int = 0


PROBLEM = SubProblem(ID, TITLE, __package__, inputs=Inputs())

P_GRADS = "grads"        # split parts: recorded once per split
P_ALL_REDUCE_CALLS = "all_reduce_calls"    # the all_reduce calls of that split's average_gradients
P_TRAIN_STEP = "train_step"


class _SerialGradients:
    """Stand-in for ``average_gradients``: swaps this rank's share of each grad for the global-batch one.

    A copy of the model recomputes, at the current parameters, the gradient
    of this rank's shard (``shard``) and of the whole global batch
    (``batch``), both set by the probe before each ``train_step``; each
    existing grad becomes ``grad - shard gradient + global gradient``. That
    is what averaging gives when every rank's grad is the same history plus
    its own shard's gradient (so a missing ``zero_grad`` still shows), with
    no communication: a different computation, not a solution.
    """

    def __init__(self):
        self.batch: tuple[torch.Tensor, torch.Tensor] | None = None
        self.shard: tuple[torch.Tensor, torch.Tensor] | None = None

    def _gradients(self, model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> list:
        scratch = copy.deepcopy(model)            # the student's model keeps its own gradients
        scratch.zero_grad(set_to_none=True)
        ref.loss_fn(scratch(inputs), targets).backward()
        return [p.grad for p in scratch.parameters()]

    def __call__(self, model: torch.nn.Module) -> None:
        local, serial = self._gradients(model, *self.shard), self._gradients(model, *self.batch)
        with torch.no_grad():
            for mine, own, full in zip(model.parameters(), local, serial):
                if mine.grad is not None and own is not None:
                    mine.grad.add_(full - own)


SWAPS = [Swap("data_parallel.comm", "average_gradients", _SerialGradients,
              "1.2.train_step_* are judged apart from the student's average_gradients")]


# ---------------------------------------------------------------- probe
def probe_comm(ctx) -> None:
    """Student setup (grader fallback), then average_gradients and an isolated train_step.

    A spawn of the hidden inputs alone (their own world size) joins the grader's
    group and records only the averaged gradients (and their all_reduce calls):
    setup and train_step are ``PROBLEM.on_public_spawn``, which that spawn skips.
    """
    import torch.distributed as dist

    calls = {"all_reduce": 0, "init_timeout": NOT_CALLED, "init_env": NOT_CALLED, "dry_run": False}
    real_all_reduce = dist.all_reduce

    def counting_all_reduce(*args, **kwargs):
        calls["all_reduce"] += 1
        return real_all_reduce(*args, **kwargs)
    recording_init = setup_checks.recording_init(dist.init_process_group, calls)
    # before comm binds any name; both public spellings of the function
    dist.all_reduce, dist.init_process_group = counting_all_reduce, recording_init
    dist.distributed_c10d.init_process_group = recording_init
    from data_parallel import comm

    timeout = datetime.timedelta(seconds=PG_TIMEOUT_S)
    PROBLEM.on_public_spawn(ctx, lambda: setup_checks.record_setup(ctx, comm, calls, real_all_reduce, timeout))
    if not dist.is_initialized():            # the student's setup failed (or is not graded in this spawn)
        dist.init_process_group("gloo", init_method=f"file://{ctx.store}.grader", rank=ctx.rank,
                                world_size=ctx.world_size, timeout=timeout)

    def grads(inputs: Inputs):
        model = ref.GradProbeNet(seed=inputs.model_seed)
        batch_inputs, targets = ref.batch(0, inputs.batch_seed)
        rank_inputs, rank_targets = (ref.shard(t, ctx.rank, ctx.world_size) for t in (batch_inputs, targets))
        ref.backward_then_freeze(model, rank_inputs, rank_targets)     # frozen.weight: frozen, holding a grad
        calls["all_reduce"] = 0
        comm.average_gradients(model)
        return ref.grads_of(model)

    def record_grads(inputs: Inputs):
        ctx.record(P_GRADS, lambda: grads(inputs))
        ctx.record(P_ALL_REDUCE_CALLS, lambda: calls["all_reduce"])
    PROBLEM.each_split(ctx, record_grads)

    def train():
        serial = apply(SWAPS)["data_parallel.comm.average_gradients"]
        model = ref.GradProbeNet(seed=0)
        optimizer = torch.optim.SGD(model.parameters(), lr=ref.LEARNING_RATE)
        losses, loss_calls = [], []

        def loss_fn(output, target):          # ref.loss_fn, counted: was the given loss_fn used?
            loss_calls.append(1)
            return ref.loss_fn(output, target)
        for step in range(ref.TRAIN_STEPS):
            inputs, targets = ref.batch(step)
            shard = (ref.shard(inputs, ctx.rank, ctx.world_size), ref.shard(targets, ctx.rank, ctx.world_size))
            serial.batch, serial.shard = (inputs, targets), shard
            losses.append(comm.train_step(model, optimizer, *shard, loss_fn))
        return {"losses": losses, "params": ref.params_of(model), "loss_fn_calls": len(loss_calls)}
    PROBLEM.on_public_spawn(ctx, lambda: ctx.record(P_TRAIN_STEP, train))     # train_step has no hidden criterion


CASE = PROBLEM.case("p1_comm_2rank", probe_comm, world_size=PROBLEM.inputs.world_size, init_group=False,
                    timeout_s=90, preload=OPTIMIZER_IMPORTS, split_parts=(P_GRADS, P_ALL_REDUCE_CALLS))


# ---------------------------------------------------------------- criteria
# The setup_process_group criteria judge the dry runs and the join that setup_checks records.
CASE.criterion("1.2.setup", "setup_process_group joins as given (nccl: own GPU first); init_method=None: env://, "
               "MASTER_* kept", points=2,
               reads=(setup_checks.P_SETUP, setup_checks.P_SETUP_DEFAULT, setup_checks.P_SETUP_ENV,
                      setup_checks.P_SETUP_NCCL, setup_checks.P_SETUP_CPU_BACKEND))(setup_checks.check_setup)
CASE.criterion("1.2.setup_timeout_default", "setup_process_group: timeout=None means 60 s, timedelta(0) is kept",
               points=1, reads=(setup_checks.P_SETUP_DEFAULT, setup_checks.P_SETUP_ZERO))(
    setup_checks.check_setup_timeout_default)


@CASE.criterion("1.2.grads_2rank", "2-rank averaged grads equal serial global-batch grads, a frozen param's too",
                points=3, reads=(P_GRADS,))
def check_grads(run: SplitRun) -> None:
    """Every rank's averaged gradients equal the serial gradients of the global batch, those of a parameter
    frozen after the backward (``requires_grad=False``, holding a grad) included."""
    inputs = run.inputs
    expected = ref.serial_gradients(seed=inputs.model_seed, step=0, batch_seed=inputs.batch_seed)
    assert_ranks_close(f"average_gradients ({run.world_size} ranks): rank {{rank}} grad of", run.parts(P_GRADS),
                       expected, hint=lambda got: factor_hint(got, expected, run.world_size)
                       + _frozen_hint(got, expected), atol=1e-6, rtol=1e-5)


def _frozen_hint(got, expected: dict) -> str:
    """A likely cause when only the frozen parameter's grad differs: it was skipped for its requires_grad."""
    if not isinstance(got, dict):
        return ""
    differs = {name for name, want in expected.items() if not _close(got.get(name), want)}
    if differs != {ref.FROZEN_WITH_GRAD}:
        return ""
    return (f"\nlikely cause: '{ref.FROZEN_WITH_GRAD}' was skipped; it has requires_grad=False but still holds a "
            ".grad, and every parameter whose .grad is not None is averaged, whatever its requires_grad")


def _close(got, want) -> bool:
    """Both None, or tensors of one shape within the grads criterion's tolerance."""
    if want is None or got is None:
        return got is None and want is None
    return (isinstance(got, torch.Tensor) and got.shape == want.shape
            and torch.allclose(got.double(), want.double(), atol=1e-6, rtol=1e-5))


@CASE.criterion("1.2.unused_grads_none", "parameters without grad keep grad None", points=1, reads=(P_GRADS,))
def check_unused_grads_none(run: SplitRun) -> None:
    inputs = run.inputs
    expected = ref.serial_gradients(seed=inputs.model_seed, step=0, batch_seed=inputs.batch_seed)
    for rank in range(run.world_size):
        got = run.part(P_GRADS, rank)
        expect(isinstance(got, dict), f"rank {rank}: gradients missing")
        for name, ref_grad in expected.items():
            if ref_grad is None:
                expect(got.get(name) is None, f"average_gradients: rank {rank} gave parameter '{name}' a "
                       f"gradient ({describe(got.get(name))}); parameters whose grad is None must stay None")


@CASE.criterion("1.2.uses_all_reduce", "average_gradients uses torch.distributed.all_reduce", points=1,
                reads=(P_GRADS, P_ALL_REDUCE_CALLS))
def check_uses_all_reduce(run: SplitRun) -> None:
    for rank in range(run.world_size):
        run.part(P_GRADS, rank)     # only meaningful once average_gradients runs
        calls = run.part(P_ALL_REDUCE_CALLS, rank)
        expect(isinstance(calls, int) and calls >= 1,
               f"average_gradients: rank {rank} never called torch.distributed.all_reduce")


@CASE.criterion("1.2.train_step_updates", "3 train_step updates (with the given loss_fn) equal serial SGD on the "
                "global batch", points=3, reads=(P_TRAIN_STEP,))
def check_train_step_updates(run: SplitRun) -> None:
    records = [run.part(P_TRAIN_STEP, rank) for rank in range(run.world_size)]   # a stub fails before the reference
    expected, _ = ref.serial_sgd(seed=0)
    for rank, got in enumerate(records):
        expect(isinstance(got, dict), f"rank {rank}: train_step results missing")
        try:
            assert_state_close(f"train_step: rank {rank} after {ref.TRAIN_STEPS} steps, parameter", got["params"],
                               expected, atol=1e-6, rtol=1e-5)
        except CheckFailed as failure:
            unused = got.get("loss_fn_calls") == 0
            raise CheckFailed(f"{failure}" + ("\nlikely cause: the loss was not computed with the given loss_fn "
                                              "(train_step never called it; the probe's loss_fn has the MSE's "
                                              "value but another gradient)" if unused else "")) from None


@CASE.criterion("1.2.train_step_loss", "train_step returns the local loss as a float", points=1, reads=(P_TRAIN_STEP,))
def check_train_step_loss(run: SplitRun) -> None:
    records = [run.part(P_TRAIN_STEP, rank) for rank in range(run.world_size)]
    _, losses = ref.serial_sgd(seed=0)
    for rank, record in enumerate(records):
        got = record["losses"]
        for step, value in enumerate(got):
            expect(type(value) is float, f"train_step: rank {rank} step {step} returned {describe(value)}, "
                   "expected a Python float")
        # Only the first step's value: later ones depend on the updates, judged by train_step_updates.
        want = losses[0][rank]
        expect(abs(got[0] - want) <= 1e-5 * max(1.0, abs(want)), f"train_step: rank {rank} returned loss "
               f"{got[0]:.6g} on its first step, expected this rank's local loss {want:.6g}")

