"""Problem 4.2 checks: ShardedOptimizer (ZeRO-1) against serial torch.optim on the global batch.

The probe trains small MLPs with ``ShardedOptimizer`` on each rank's slice of every global batch and records the
parameters, the master shard, the inner optimizer's state tensors and the collectives each ``step()`` called
(``CollectiveLog``). The criteria compare the parameters with serial ``torch.optim.Adam``/``SGD`` on the whole
global batch, measure the optimizer state a rank holds from the tensors it recorded (``held_state``), and judge the
communication by its calls and sizes. No inputs vary here: the hidden criteria run the same probe on 3 ranks.
"""
from __future__ import annotations

import math

import torch

from grading.check import CheckFailed, SplitRun, SubProblem, assert_state_close, describe, expect
from grading.problems.probe_helpers import OPTIMIZER_IMPORTS, CollectiveLog, describe_call
from grading.problems.p4_1_ddp import reference as ref
from grading.problems.p4_1_ddp.hints import close_to
from grading.problems.p4_2_zero1 import ID, TITLE

PROBLEM = SubProblem(ID, TITLE, __package__)

SHUFFLED_IO = (8, 4)            # ShuffledNet's input and output features
SCALE_FREE_EPS = 1e-12          # Adam with this eps ignores a gradient's scale: none_grads sees the None handling only
EVEN_SIZES = (8, 16, 4)         # 212 parameters: divisible by 2, not by 3
ODD_SIZES = (7, 5, 3)           # 55 parameters (no last bias): divisible by neither 2 nor 3
SINGLE_SIZES = (4, 3)           # one trainable tensor: a bias-free Linear(4, 3), 12 elements (divisible by 2 and 3)
ADAM_BYTES_PER_ELEMENT = 12     # fp32 master + exp_avg + exp_avg_sq
TOLERANCE = {"atol": 1e-6, "rtol": 1e-5}   # fp32; ranks sum gradients in another order than one process
BF16_TOLERANCE = {"atol": 3e-2, "rtol": 0.0}

P_STEPS = "steps"
P_MEMORY = "memory"
P_BF16 = "bf16"
P_UNEVEN = "uneven"
P_NONE_GRADS = "none_grads"     # ShuffledNet without its gate: a trainable parameter whose grad stays None
P_MASTER_GRAD = "master_grad"   # what master.grad is after step()
P_SINGLE = "one_trainable_tensor"   # one Adam step on SINGLE_SIZES (self.params has one entry)
P_COLLECTIVES = "collectives"   # the collectives each step() of the P_MEMORY training called (CollectiveLog)
# a reduce-scatter / all-gather call of torch.distributed -> (its argument of this rank's S elements, its N x S)
REDUCE_SCATTERS = {"reduce_scatter": ("output", "input_list"), "reduce_scatter_tensor": ("output", "input")}
ALL_GATHERS = {"all_gather": ("tensor", "tensor_list"), "all_gather_into_tensor": ("input_tensor", "output_tensor")}


def _model(sizes: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    return ref.ZeroNet(sizes, seed=0, last_bias=sizes not in (ODD_SIZES, SINGLE_SIZES)).to(dtype)


# ---------------------------------------------------------------- probe (rank side)
def _train(ctx, sizes: tuple[int, ...], optimizer_name: str, dtype: torch.dtype = torch.float32,
           steps: int = ref.TRAIN_STEPS, log: CollectiveLog | None = None, step_calls: list | None = None):
    """Train ``_model(sizes)`` through ``ShardedOptimizer``; with ``log``, each step()'s collectives are appended to
    ``step_calls`` (one list per step)."""
    from data_parallel.zero1 import ShardedOptimizer

    model = _model(sizes, dtype)
    inner = torch.optim.SGD if optimizer_name == "sgd" else torch.optim.Adam
    lr = ref.SGD_LR if optimizer_name == "sgd" else ref.ADAM_LR
    optimizer = ShardedOptimizer(model.parameters(), inner, lr=lr)
    for step in range(steps):
        optimizer.zero_grad()
        x, y = ref.batch(step, sizes[0], sizes[-1], dtype)
        ref.loss_fn(model(ref.shard(x, ctx.rank, ctx.world_size)), ref.shard(y, ctx.rank, ctx.world_size)).backward()
        if log is None:
            optimizer.step()
            continue
        with log.watching() as calls:
            optimizer.step()
        step_calls.append(calls)
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
    """Record ZeRO-1 training results on this rank: SGD and Adam (even P), one step on one trainable tensor,
    memory (with each step()'s collectives), master.grad after step, Adam with a None gradient (ShuffledNet
    without its gate; None counts as zeros), bf16, Adam (odd P).

    All but the first three are read by public criteria only: they are recorded
    inside ``PROBLEM.on_public_spawn``, which the hidden spawn (on 3 ranks) skips.
    """
    import torch.distributed as dist

    log = CollectiveLog(dist)           # before the student module binds any name
    step_calls: list[list[dict]] = []

    def steps():
        return {name: ref.params_of(_train(ctx, EVEN_SIZES, name)[0]) for name in ("sgd", "adam")}
    ctx.record(P_STEPS, steps)
    ctx.record(P_SINGLE, lambda: ref.params_of(_train(ctx, SINGLE_SIZES, "adam", steps=1)[0]))

    trained = {}

    def memory():
        _, trained["optimizer"] = _train(ctx, EVEN_SIZES, "adam", log=log, step_calls=step_calls)
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
        ctx.record(P_COLLECTIVES, lambda: step_calls)
        if trained:
            ctx.record(P_MASTER_GRAD, lambda: {"grad": describe(trained["optimizer"].master.grad),
                                               "is_none": trained["optimizer"].master.grad is None})
        ctx.record(P_NONE_GRADS, none_grads)
        ctx.record(P_BF16, bf16)
        # last: a padding bug can leave the ranks' collectives out of step, which must not cost the parts above
        ctx.record(P_UNEVEN, lambda: ref.params_of(_train(ctx, ODD_SIZES, "adam")[0]))
    PROBLEM.on_public_spawn(ctx, record_public_parts)


CASE = PROBLEM.case("p4_zero", probe_zero, world_size=2, init_group=True, timeout_s=90, preload=OPTIMIZER_IMPORTS)


# ---------------------------------------------------------------- criteria (grader side)
def _serial(sizes: tuple[int, ...], name: str, steps: int = ref.TRAIN_STEPS) -> dict:
    return ref.serial_training(_model(sizes), name, sizes[0], sizes[-1], steps=steps)


def _every_rank_trained_like(run: SplitRun, part: str, expected: dict, setting: str) -> None:
    """Every rank's recorded parameters ``part`` equal the serial Adam run ``expected`` (``setting`` names it)."""
    for rank in range(run.world_size):
        assert_state_close(f"ShardedOptimizer(Adam) {setting}: rank {rank} after {ref.TRAIN_STEPS} steps, parameter",
                           run.part(part, rank), expected, **TOLERANCE)


@CASE.criterion("4.2.steps", "5 Adam and 5 SGD steps (and one on one trainable tensor) equal serial torch.optim "
                "on the global batch", points=3, reads=(P_STEPS, P_SINGLE))
def check_steps(run: SplitRun) -> None:
    """Every rank's parameters after 5 Adam and 5 SGD steps equal serial training on the global batches; so do
    those of a model with a single trainable tensor after one Adam step."""
    _check_single(run)
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


def _check_single(run: SplitRun) -> None:
    """One Adam step on a model whose only trainable tensor is a bias-free Linear's weight equals serial Adam."""
    expected = _serial(SINGLE_SIZES, "adam", steps=1)
    (name, value), = expected.items()
    what = (f"ShardedOptimizer(ADAM) on a model with one trainable tensor ('{name}', {value.numel()} elements, so "
            "self.params has one entry)")
    for rank in range(run.world_size):
        try:
            assert_state_close(f"{what}: rank {rank} after 1 step, parameter", run.part(P_SINGLE, rank), expected,
                               **TOLERANCE)
        except CheckFailed as failure:
            message = str(failure)
            raise CheckFailed(message if message.startswith(what) else f"{what}: {message}") from None


def _scale_hint(got, name: str, world_size: int) -> str:
    """A likely cause when the parameters match serial training with every gradient N x or 1/N x too large."""
    for factor, cause in ((world_size, "the reduce-scattered sum was not divided by the world size"),
                          (1 / world_size, "the gradient was divided by the world size twice")):
        wrong = ref.serial_training(_model(EVEN_SIZES), name, EVEN_SIZES[0], EVEN_SIZES[-1], grad_scale=factor)
        if close_to(got, wrong, **TOLERANCE):
            return f"\nlikely cause: {cause} (the parameters match serial training with every gradient {factor:g} x)"
    return ""


@CASE.criterion("4.2.uneven", "a parameter count not divisible by the world size works", points=2, reads=(P_UNEVEN,))
def check_uneven(run: SplitRun) -> None:
    """Adam on 55 parameters (divisible by neither 2 nor 3) equals serial training on every rank."""
    expected = _serial(ODD_SIZES, "adam")
    numel = sum(t.numel() for t in expected.values())
    _every_rank_trained_like(run, P_UNEVEN, expected,
                             f"on {numel} parameters over {run.world_size} ranks (not divisible)")


@CASE.criterion("4.2.memory", "per-rank optimizer state is 12 bytes x shard length (12P/N)", points=3,
                reads=(P_MEMORY,))
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


@CASE.criterion("4.2.bf16", "a bf16 model trains with fp32 master shards", points=2, reads=(P_BF16,))
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



@CASE.criterion("4.2.none_grads", "a trainable parameter whose grad is None counts as zeros", points=1,
                reads=(P_NONE_GRADS,))
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


@CASE.criterion("4.2.master_grad_none", "master.grad is None after step()", points=1, reads=(P_MEMORY, P_MASTER_GRAD))
def check_master_grad_none(run: SplitRun) -> None:
    """After ``step()`` the master shard holds no gradient (``master.grad is None``)."""
    for rank in range(run.world_size):
        run.part(P_MEMORY, rank)                  # the training's own error, when it failed
        got = run.part(P_MASTER_GRAD, rank)
        expect(got["is_none"], f"ShardedOptimizer: rank {rank}'s master.grad after step() is {got['grad']}; "
               "set it to None after the inner optimizer step")


@CASE.criterion("4.2.collectives", "each step() reduce-scatters the gradient into this rank's shard and all-gathers "
                "the updated shards, once each; no all-reduce", points=2, reads=(P_MEMORY, P_COLLECTIVES))
def check_collectives(run: SplitRun) -> None:
    """Each of the 5 Adam steps of the memory run calls one reduce-scatter whose output is this rank's shard (S
    elements, of N x S) and then one all-gather of the S updated elements into N x S; no other collective."""
    numel = ref.flat_numel(_model(EVEN_SIZES))
    world = run.world_size
    shard = math.ceil(numel / world)
    sizes = f"P = {numel} parameters, N = {world} ranks, S = ceil(P / N) = {shard}"
    for rank in range(world):
        run.part(P_MEMORY, rank)                  # the training's own error, when it failed
        steps = run.part(P_COLLECTIVES, rank)
        steps = steps if isinstance(steps, list) else []
        expect(len(steps) == ref.TRAIN_STEPS, f"ShardedOptimizer: rank {rank} recorded the collectives of "
               f"{len(steps)} step() calls, expected {ref.TRAIN_STEPS}")
        for k, calls in enumerate(steps):
            _judge_step_calls(f"ShardedOptimizer.step(): rank {rank}, step {k + 1}", calls, world, shard, sizes)


def _judge_step_calls(where: str, calls: list, world: int, shard: int, sizes: str) -> None:
    """One step()'s collectives: one reduce-scatter (N x S -> S), then one all-gather (S -> N x S), nothing else."""
    calls = [c for c in calls if isinstance(c, dict) and isinstance(c.get("sizes"), dict)] \
        if isinstance(calls, list) else []
    ops = [call.get("op") for call in calls]
    made = "; ".join(map(describe_call, calls)) or "no collective"
    others = [describe_call(c) for c, op in zip(calls, ops) if op not in REDUCE_SCATTERS and op not in ALL_GATHERS]
    expect(not others, f"{where} called {'; '.join(others)} ({sizes}); the docstring allows one reduce-scatter "
           "(torch.distributed.reduce_scatter) of the flat gradient and one all-gather of the updated shards per "
           f"step(), no other collective{_all_reduce_cause(ops)}")
    kinds = ["reduce-scatter" if op in REDUCE_SCATTERS else "all-gather" for op in ops]
    expect(kinds == ["reduce-scatter", "all-gather"], f"{where} called {made} ({sizes}); the docstring: the flat "
           "gradient is reduce-scattered once, the master shard stepped, then the updated shards all-gathered once")
    says = {"reduce-scatter": f"the flat gradient, padded to N x S = {world * shard} elements, is reduce-scattered "
                              f"into this rank's shard of S = {shard} elements",
            "all-gather": f"each rank's S = {shard} updated elements are all-gathered into N x S = {world * shard}"}
    for call, kind in zip(calls, kinds):
        shard_argument, full_argument = {**REDUCE_SCATTERS, **ALL_GATHERS}[call["op"]]
        full = call["sizes"].get(full_argument)
        full = sum(full) if isinstance(full, list) else full
        expect(call["sizes"].get(shard_argument) == shard and full == world * shard,
               f"{where}: its {kind} was {describe_call(call)} ({sizes}); the docstring: {says[kind]}")


def _all_reduce_cause(ops: list) -> str:
    """The likely cause of an all-reduce in step(): what it stands in for (an all-reduce sends twice the data of a
    reduce-scatter or an all-gather of the same vector)."""
    if "all_reduce" not in ops:
        return ""
    if not any(op in REDUCE_SCATTERS for op in ops):
        instead = ("the whole flat gradient was all-reduced (and this rank's shard taken from it) where a "
                   "reduce-scatter gives each rank its own shard")
    elif not any(op in ALL_GATHERS for op in ops):
        instead = ("the updated shards were summed into a zero-padded full vector with an all-reduce where an "
                   "all-gather collects them")
    else:
        instead = "an all-reduce besides the reduce-scatter and the all-gather"
    return (f"\nlikely cause: {instead}: an all-reduce sends twice the data of a reduce-scatter or an all-gather, "
            "which ZeRO-1 exists to save")
