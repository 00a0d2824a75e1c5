"""Problem 4.2 checks: ShardedOptimizer (ZeRO-1) against serial torch.optim on the global batch.

The probe trains small MLPs with ``ShardedOptimizer`` on each rank's slice of every global batch and records the
parameters, the master shard and the inner optimizer's state tensors. The criteria compare the parameters with
serial ``torch.optim.Adam``/``SGD`` on the whole global batch, and measure the optimizer state a rank holds from
the tensors it recorded (``held_state``). No inputs vary here: the hidden criteria run the same probe on 3 ranks.
"""
from __future__ import annotations

import math

import torch

from grading.kit.compare import assert_state_close, describe
from grading.engine.expect import CheckFailed, expect
from grading.engine.rubric import SplitRun
from grading.kit.problem import SubProblem
from grading.problems.probe_helpers import OPTIMIZER_IMPORTS
from grading.problems.p4_1_ddp import reference as ref
from grading.problems.p4_1_ddp.hints import close_to
from grading.problems.p4_2_zero1 import ID, TITLE

PROBLEM = SubProblem(ID, TITLE, __package__)

SHUFFLED_IO = (8, 4)            # ShuffledNet's input and output features
SCALE_FREE_EPS = 1e-12          # Adam with this eps ignores a gradient's scale: none_grads sees the None handling only
EVEN_SIZES = (8, 16, 4)         # 212 parameters: divisible by 2, not by 3
ODD_SIZES = (7, 5, 3)           # 55 parameters (no last bias): divisible by neither 2 nor 3
ADAM_BYTES_PER_ELEMENT = 12     # fp32 master + exp_avg + exp_avg_sq
TOLERANCE = {"atol": 1e-6, "rtol": 1e-5}   # fp32; ranks sum gradients in another order than one process
BF16_TOLERANCE = {"atol": 3e-2, "rtol": 0.0}

P_STEPS = "steps"
P_MEMORY = "memory"
P_BF16 = "bf16"
P_UNEVEN = "uneven"
P_NONE_GRADS = "none_grads"     # ShuffledNet without its gate: a trainable parameter whose grad stays None
P_MASTER_GRAD = "master_grad"   # what master.grad is after step()


def _model(sizes: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    return ref.ZeroNet(sizes, seed=0, last_bias=sizes != ODD_SIZES).to(dtype)


# ---------------------------------------------------------------- probe (rank side)
def _train(ctx, sizes: tuple[int, ...], optimizer_name: str, dtype: torch.dtype = torch.float32):
    from data_parallel.zero1 import ShardedOptimizer

    model = _model(sizes, dtype)
    inner = torch.optim.SGD if optimizer_name == "sgd" else torch.optim.Adam
    lr = ref.SGD_LR if optimizer_name == "sgd" else ref.ADAM_LR
    optimizer = ShardedOptimizer(model.parameters(), inner, lr=lr)
    for step in range(ref.TRAIN_STEPS):
        optimizer.zero_grad()
        x, y = ref.batch(step, sizes[0], sizes[-1], dtype)
        ref.loss_fn(model(ref.shard(x, ctx.rank, ctx.world_size)), ref.shard(y, ctx.rank, ctx.world_size)).backward()
        optimizer.step()
    return model, optimizer


def held_state(optimizer) -> dict:
    """What the rank holds as optimizer state: the master shard and every tensor in the inner optimizer's state."""
    tensors = {"master": optimizer.master.detach().clone()}
    for k, state in enumerate(optimizer.optimizer.state.values()):
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state[{k}].{key}"] = value.detach().clone()
    return tensors


def probe_zero(ctx) -> None:
    """Record ZeRO-1 training results on this rank: SGD and Adam (even P), memory, master.grad after step,
    Adam with a None gradient (ShuffledNet without its gate; None counts as zeros), bf16, Adam (odd P).

    All but the first two are read by public criteria only: they are recorded
    inside ``PROBLEM.without_inputs``, which the hidden spawn (on 3 ranks) skips.
    """
    def steps():
        return {name: ref.params_of(_train(ctx, EVEN_SIZES, name)[0]) for name in ("sgd", "adam")}
    ctx.record(P_STEPS, steps)

    trained = {}

    def memory():
        _, trained["optimizer"] = _train(ctx, EVEN_SIZES, "adam")
        return held_state(trained["optimizer"])
    ctx.record(P_MEMORY, memory)

    def none_grads():
        from data_parallel.zero1 import ShardedOptimizer

        model = ref.ShuffledNet(seed=0)
        model.skip_gate = True
        optimizer = ShardedOptimizer(model.parameters(), torch.optim.Adam, lr=ref.ADAM_LR, eps=SCALE_FREE_EPS)
        for step in range(ref.TRAIN_STEPS):
            optimizer.zero_grad()
            x, y = ref.batch(step, *SHUFFLED_IO)
            inputs, targets = ref.shard(x, ctx.rank, ctx.world_size), ref.shard(y, ctx.rank, ctx.world_size)
            ref.loss_fn(model(inputs), targets).backward()
            optimizer.step()
        return ref.params_of(model)

    def bf16():
        model, optimizer = _train(ctx, EVEN_SIZES, "adam", torch.bfloat16)
        return {"params": ref.params_of(model), "master": optimizer.master.detach().clone()}

    def record_public_parts():
        if trained:
            ctx.record(P_MASTER_GRAD, lambda: {"grad": describe(trained["optimizer"].master.grad),
                                               "is_none": trained["optimizer"].master.grad is None})
        ctx.record(P_NONE_GRADS, none_grads)
        ctx.record(P_BF16, bf16)
        # last: a padding bug can leave the ranks' collectives out of step, which must not cost the parts above
        ctx.record(P_UNEVEN, lambda: ref.params_of(_train(ctx, ODD_SIZES, "adam")[0]))
    PROBLEM.without_inputs(ctx, record_public_parts)


CASE = PROBLEM.case("p4_zero", probe_zero, world_size=2, init_group=True, timeout_s=90, preload=OPTIMIZER_IMPORTS)


# ---------------------------------------------------------------- criteria (grader side)
def _serial(sizes: tuple[int, ...], name: str) -> dict:
    return ref.serial_training(_model(sizes), name, sizes[0], sizes[-1])


def _every_rank_trained_like(run: SplitRun, part: str, expected: dict, setting: str) -> None:
    """Every rank's recorded parameters ``part`` equal the serial Adam run ``expected`` (``setting`` names it)."""
    for rank in range(run.world_size):
        assert_state_close(f"ShardedOptimizer(Adam) {setting}: rank {rank} after {ref.TRAIN_STEPS} steps, parameter",
                           run.part(part, rank), expected, **TOLERANCE)


@CASE.criterion("4.2.steps", "5 Adam and 5 SGD steps equal serial torch.optim on the global batch", points=3)
def check_steps(run: SplitRun) -> None:
    """Every rank's parameters after 5 Adam and 5 SGD steps equal serial training on the global batches."""
    for name in ("adam", "sgd"):
        expected = _serial(EVEN_SIZES, name)
        for rank in range(run.world_size):
            got = run.part(P_STEPS, rank)
            expect(isinstance(got, dict) and name in got, f"rank {rank}: training results missing")
            try:
                assert_state_close(f"ShardedOptimizer({name.upper()}): rank {rank} after {ref.TRAIN_STEPS} steps, "
                                   "parameter", got[name], expected, **TOLERANCE)
            except CheckFailed as failure:
                raise CheckFailed(f"{failure}{_scale_hint(got[name], name, run.world_size)}") from None


def _scale_hint(got, name: str, world_size: int) -> str:
    """A likely cause when the parameters match serial training with every gradient N x or 1/N x too large."""
    for factor, cause in ((world_size, "the reduce-scattered sum was not divided by the world size"),
                          (1 / world_size, "the gradient was divided by the world size twice")):
        wrong = ref.serial_training(_model(EVEN_SIZES), name, EVEN_SIZES[0], EVEN_SIZES[-1], grad_scale=factor)
        if close_to(got, wrong, **TOLERANCE):
            return f"\nlikely cause: {cause} (the parameters match serial training with every gradient {factor:g} x)"
    return ""


@CASE.criterion("4.2.uneven", "a parameter count not divisible by the world size works", points=2)
def check_uneven(run: SplitRun) -> None:
    """Adam on 55 parameters (divisible by neither 2 nor 3) equals serial training on every rank."""
    expected = _serial(ODD_SIZES, "adam")
    numel = sum(t.numel() for t in expected.values())
    _every_rank_trained_like(run, P_UNEVEN, expected,
                             f"on {numel} parameters over {run.world_size} ranks (not divisible)")


@CASE.criterion("4.2.memory", "per-rank optimizer state is 12 bytes x shard length (12P/N)", points=3)
def check_memory(run: SplitRun) -> None:
    """Each rank holds a 1-D fp32 master shard of ceil(P / N) and 12 x that many bytes of optimizer state."""
    numel = ref.flat_numel(_model(EVEN_SIZES))
    shard = math.ceil(numel / run.world_size)
    want = ADAM_BYTES_PER_ELEMENT * shard
    for rank in range(run.world_size):
        held = run.part(P_MEMORY, rank)
        expect(isinstance(held, dict) and "master" in held, f"rank {rank}: optimizer state missing")
        master = held["master"]
        expect(isinstance(master, torch.Tensor) and master.dtype == torch.float32 and master.dim() == 1
               and master.numel() == shard, f"ShardedOptimizer: rank {rank} master is {describe(master)} "
               f"with {getattr(master, 'numel', lambda: '?')()} elements, expected a 1-D fp32 shard of "
               f"ceil({numel} / {run.world_size}) = {shard}")
        vectors = {k: t for k, t in held.items() if t.dim() >= 1}      # Adam's scalar 'step' is not state
        got = sum(t.numel() * t.element_size() for t in vectors.values())
        detail = ", ".join(f"{k}: {t.numel()} x {t.element_size()} B" for k, t in vectors.items())
        expect(got == want, f"ShardedOptimizer(Adam): rank {rank} holds {got} bytes of optimizer state ({detail}); "
               f"ZeRO-1 gives 12 x shard length = 12 x {shard} = {want} bytes (12P/N, P = {numel}, "
               f"N = {run.world_size})")


@CASE.criterion("4.2.bf16", "a bf16 model trains with fp32 master shards", points=2)
def check_bf16(run: SplitRun) -> None:
    """A bf16 model keeps bf16 parameters, an fp32 master that is not bf16-rounded, and tracks fp32 Adam."""
    expected = {k: v.to(torch.bfloat16) for k, v in _serial(EVEN_SIZES, "adam").items()}
    for rank in range(run.world_size):
        got = run.part(P_BF16, rank)
        master = got["master"]
        expect(isinstance(master, torch.Tensor) and master.dtype == torch.float32,
               f"ShardedOptimizer on a bf16 model: rank {rank} master is {describe(master)}, expected fp32")
        expect(not torch.equal(master, master.to(torch.bfloat16).float()),
               f"ShardedOptimizer on a bf16 model: rank {rank}'s master shard holds only bf16-representable "
               "values after 5 Adam steps: keep the master in fp32 and step it there, not the bf16 parameters")
        params = got["params"]
        for name, value in params.items():
            expect(value.dtype == torch.bfloat16, f"ShardedOptimizer: rank {rank} parameter '{name}' became "
                   f"{value.dtype}; the model must keep its bf16 parameters")
        # bf16 forward/backward differs from the fp32 serial run; the tolerance is a few Adam steps of lr 1e-2
        assert_state_close(f"ShardedOptimizer(Adam) on a bf16 model: rank {rank} after {ref.TRAIN_STEPS} steps, "
                           "parameter", params, expected, **BF16_TOLERANCE)



@CASE.criterion("4.2.none_grads", "a trainable parameter whose grad is None counts as zeros", points=1)
def check_none_grads(run: SplitRun) -> None:
    """ShuffledNet without its gate in forward (gate.scale.grad stays None): Adam equals serial training."""
    model = ref.ShuffledNet(seed=0)
    model.skip_gate = True
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=ref.ADAM_LR,
                                 eps=SCALE_FREE_EPS)
    for step in range(ref.TRAIN_STEPS):
        optimizer.zero_grad()
        ref.loss_fn(model(ref.batch(step, *SHUFFLED_IO)[0]), ref.batch(step, *SHUFFLED_IO)[1]).backward()
        optimizer.step()
    expected = ref.params_of(model)
    _every_rank_trained_like(run, P_NONE_GRADS, expected,
                             "on a model whose trainable 'gate.scale' (before 'mid') gets no gradient")


@CASE.criterion("4.2.master_grad_none", "master.grad is None after step()", points=1)
def check_master_grad_none(run: SplitRun) -> None:
    """After ``step()`` the master shard holds no gradient (``master.grad is None``)."""
    for rank in range(run.world_size):
        run.part(P_MEMORY, rank)                  # the training's own error, when it failed
        got = run.part(P_MASTER_GRAD, rank)
        expect(got["is_none"], f"ShardedOptimizer: rank {rank}'s master.grad after step() is {got['grad']}; "
               "set it to None after the inner optimizer step")
