"""Problem 1.2 checks: ``setup_process_group``, ``average_gradients``, ``train_step``.

The probe joins a 2-rank gloo group through the student's
``setup_process_group`` (the grader's own group stands in when that fails),
records the averaged gradients of a small model on each rank's shard, then
runs ``train_step`` with the averaging replaced by a serial recomputation
(``SWAPS``), so ``train_step`` is judged apart from ``average_gradients``.
The criteria compare with serial global-batch gradients and SGD computed in
the grader (``reference.py``); nothing is stored as expected data. On the
staff side ``staff.py`` adds hidden inputs (3 or 4 ranks, other seeds) that
run in their own spawn, where the probe records only the averaged gradients.
"""
from __future__ import annotations

import copy
import datetime
import inspect
import os
from dataclasses import dataclass

import torch

from grading.kit.compare import assert_ranks_close, assert_state_close, describe
from grading.engine.expect import CheckFailed, expect
from grading.engine.rubric import SplitRun
from grading.kit.problem import SubProblem
from grading.kit.seams import Swap
from grading.problems.common import OPTIMIZER_IMPORTS, call_outcome, factor_hint
from grading.problems.p1_2_comm import ID, TITLE
from grading.problems.p1_2_comm import reference as ref


@dataclass(frozen=True)
class Inputs:
    """What the averaged-gradient part runs on: the number of ranks, the model's and the batch's seeds."""

    world_size: int = 2
    model_seed: int = 0
    batch_seed: int = 0


PROBLEM = SubProblem(ID, TITLE, __package__, inputs=Inputs())

PG_TIMEOUT_S = 30        # the process group's collective timeout: a lost peer becomes an error, not a hang
# setup_process_group must pass its arguments on: a backend string other than the default "gloo", a timeout
# other than the default 60 s, and a file:// URL while the environment holds an unusable MASTER_PORT (a group
# that ignores init_method and falls back to env:// fails at once instead of joining).
SETUP_BACKEND = "cpu:gloo"
UNUSABLE_PORT = "unusable-use-the-given-init_method"
DEFAULT_TIMEOUT_S = 60   # the contract's timeout when None is given
NOT_CALLED = "not called"    # setup_process_group did not reach dist.init_process_group
DRY_RUN_MESSAGE = "the grader stopped init_process_group here to read its arguments (a dry run)"

P_SETUP_DEFAULT = "setup_default_timeout"    # [outcome, timeout given] of a dry run of setup with timeout=None
P_SETUP = "setup"
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
        twin = copy.deepcopy(model)
        twin.zero_grad(set_to_none=True)
        ref.loss_fn(twin(inputs), targets).backward()
        return [p.grad for p in twin.parameters()]

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
    setup and train_step are ``PROBLEM.shared``, which that spawn skips.
    """
    import torch.distributed as dist

    from grading.kit import seams
    calls = {"all_reduce": 0, "init_timeout": NOT_CALLED, "dry_run": False}
    real_all_reduce, real_init = dist.all_reduce, dist.init_process_group

    def counting_all_reduce(*args, **kwargs):
        calls["all_reduce"] += 1
        return real_all_reduce(*args, **kwargs)

    def recording_init(*args, **kwargs):
        """init_process_group that notes the timeout it was given (None: torch's default); in a dry run it stops
        there with DryRunStop instead of joining a group."""
        calls["init_timeout"] = inspect.signature(real_init).bind(*args, **kwargs).arguments.get("timeout")
        if calls["dry_run"]:
            raise DryRunStop(DRY_RUN_MESSAGE)
        return real_init(*args, **kwargs)
    # before comm binds any name; both public spellings of the function
    dist.all_reduce, dist.init_process_group = counting_all_reduce, recording_init
    dist.distributed_c10d.init_process_group = recording_init
    from data_parallel import comm

    timeout = datetime.timedelta(seconds=PG_TIMEOUT_S)

    def join(timeout: datetime.timedelta | None, dry_run: bool = False) -> None:
        """The student's setup_process_group through ``file://ctx.store`` while MASTER_PORT is unusable; a
        ``dry_run`` stops inside ``init_process_group`` (DryRunStop), having noted its arguments."""
        saved = {name: os.environ.get(name) for name in ("MASTER_ADDR", "MASTER_PORT")}
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=UNUSABLE_PORT)
        calls.update(init_timeout=NOT_CALLED, dry_run=dry_run)
        try:
            comm.setup_process_group(ctx.rank, ctx.world_size, SETUP_BACKEND, init_method=f"file://{ctx.store}",
                                     timeout=timeout)
        finally:
            calls["dry_run"] = False
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    def default_timeout():
        outcome = call_outcome(lambda: join(None, dry_run=True))
        return [outcome, _timeout_s(calls["init_timeout"])]

    def setup():
        join(timeout)
        value = torch.tensor([float(ctx.rank + 1)])
        real_all_reduce(value)
        return [dist.get_rank(), dist.get_world_size(), str(dist.get_backend()), value.item(),
                _timeout_s(calls["init_timeout"])]

    def record_setup():
        ctx.record(P_SETUP_DEFAULT, default_timeout)
        ctx.record(P_SETUP, setup)
    PROBLEM.shared(ctx, record_setup)
    if not dist.is_initialized():            # the student's setup failed (or is not graded in this spawn)
        dist.init_process_group("gloo", init_method=f"file://{ctx.store}.grader", rank=ctx.rank,
                                world_size=ctx.world_size, timeout=timeout)

    def grads(inputs: Inputs):
        model = ref.GradProbeNet(seed=inputs.model_seed)
        batch_inputs, targets = ref.batch(0, inputs.batch_seed)
        rank_inputs, rank_targets = (ref.shard(t, ctx.rank, ctx.world_size) for t in (batch_inputs, targets))
        ref.loss_fn(model(rank_inputs), rank_targets).backward()
        calls["all_reduce"] = 0
        comm.average_gradients(model)
        return ref.grads_of(model)

    def record_grads(inputs: Inputs):
        ctx.record(P_GRADS, lambda: grads(inputs))
        ctx.record(P_ALL_REDUCE_CALLS, lambda: calls["all_reduce"])
    PROBLEM.each_split(ctx, record_grads)

    def train():
        serial = seams.apply(SWAPS)["data_parallel.comm.average_gradients"]
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
    PROBLEM.shared(ctx, lambda: ctx.record(P_TRAIN_STEP, train))     # train_step has no hidden criterion


class DryRunStop(RuntimeError):
    """Raised by the probe's init_process_group in a dry run; setup_process_group must let it through."""


def _timeout_s(given) -> float | str:
    """The collective timeout ``dist.init_process_group`` was given, in seconds (torch's default when None), or
    NOT_CALLED."""
    import torch.distributed as dist
    if given is NOT_CALLED:
        return NOT_CALLED
    if given is None:
        return dist.constants.default_pg_timeout.total_seconds()
    return given.total_seconds() if isinstance(given, datetime.timedelta) else f"{describe(given)}"


CASE = PROBLEM.case("p1_comm_2rank", probe_comm, world_size=PROBLEM.inputs.world_size, init_group=False,
                    timeout_s=90, preload=OPTIMIZER_IMPORTS, split_parts=(P_GRADS, P_ALL_REDUCE_CALLS))


# ---------------------------------------------------------------- criteria
@CASE.criterion("1.2.setup", "setup_process_group joins the group as given (init_method, rank, world, backend, "
                "timeout)", points=2)
def check_setup(run: SplitRun) -> None:
    call = (f"setup_process_group(rank, {run.world_size}, {SETUP_BACKEND!r}, init_method='file://...', "
            f"timeout={PG_TIMEOUT_S} s)")
    for rank in range(run.world_size):
        try:
            got = run.part(P_SETUP, rank)
        except CheckFailed as failure:
            hint = (f"\nlikely cause: init_method was not used (env:// read MASTER_PORT={UNUSABLE_PORT!r}); "
                    "rendezvous through the URL given as init_method" if UNUSABLE_PORT in str(failure) else "")
            raise CheckFailed(f"{call}: {failure}{hint}") from None
        want = [rank, run.world_size, SETUP_BACKEND, float(sum(range(1, run.world_size + 1)))]
        expect(got[:4] == want, f"{call}: rank {rank} sees [rank, world size, backend, all_reduce of rank+1] = "
               f"{got[:4]}, expected {want} (pass rank, world_size and backend on as given)")
        expect(got[4] in (NOT_CALLED, float(PG_TIMEOUT_S)), f"{call}: rank {rank} called init_process_group with "
               f"a collective timeout of {_seconds(got[4])}, expected the given {PG_TIMEOUT_S} s (pass timeout on)")
        outcome = run.part(P_SETUP_DEFAULT, rank)[0]
        expect(outcome.startswith(DryRunStop.__name__), f"setup_process_group(rank, {run.world_size}, "
               f"{SETUP_BACKEND!r}, init_method='file://...'): rank {rank}: the grader's init_process_group raised "
               f"{DryRunStop.__name__}, and setup_process_group ended with {outcome}: errors from "
               "torch.distributed must propagate to the caller")


def _seconds(value) -> str:
    return f"{value:g} s" if isinstance(value, float) else str(value)


@CASE.criterion("1.2.setup_timeout_default", "setup_process_group with timeout=None: a 60 s collective timeout",
                points=1)
def check_setup_timeout_default(run: SplitRun) -> None:
    call = (f"setup_process_group(rank, {run.world_size}, {SETUP_BACKEND!r}, init_method='file://...', "
            "timeout=None)")
    for rank in range(run.world_size):
        outcome, got = run.part(P_SETUP_DEFAULT, rank)
        expect(got != NOT_CALLED, f"{call}: rank {rank} never called dist.init_process_group (it ended with "
               f"{outcome})")
        expect(got == float(DEFAULT_TIMEOUT_S), f"{call}: rank {rank} called init_process_group with a collective "
               f"timeout of {_seconds(got)}, expected {DEFAULT_TIMEOUT_S} s (None means 60 s, not torch's own "
               f"default: pass timedelta(seconds={DEFAULT_TIMEOUT_S}) on)")


@CASE.criterion("1.2.grads_2rank", "2-rank averaged grads equal the serial global-batch grads", points=3)
def check_grads(run: SplitRun) -> None:
    """Every rank's averaged gradients equal the serial gradients of the global batch."""
    inputs = run.inputs
    expected = ref.serial_gradients(seed=inputs.model_seed, step=0, batch_seed=inputs.batch_seed)
    assert_ranks_close(f"average_gradients ({run.world_size} ranks): rank {{rank}} grad of", run.parts(P_GRADS),
                       expected, hint=lambda got: factor_hint(got, expected, run.world_size), atol=1e-6, rtol=1e-5)


@CASE.criterion("1.2.unused_grads_none", "parameters without grad keep grad None", points=1)
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


@CASE.criterion("1.2.uses_all_reduce", "average_gradients uses torch.distributed.all_reduce", points=1)
def check_uses_all_reduce(run: SplitRun) -> None:
    for rank in range(run.world_size):
        run.part(P_GRADS, rank)     # only meaningful once average_gradients runs
        calls = run.part(P_ALL_REDUCE_CALLS, rank)
        expect(isinstance(calls, int) and calls >= 1,
               f"average_gradients: rank {rank} never called torch.distributed.all_reduce")


@CASE.criterion("1.2.train_step_updates", "3 train_step updates (with the given loss_fn) equal serial SGD on the "
                "global batch", points=3)
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


@CASE.criterion("1.2.train_step_loss", "train_step returns the local loss as a float", points=1)
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

