"""Problem 5.2 checks: ``parallelize_block`` on every block of a tiny GPT-2.

Isolation from 5.1: the probe swaps the student's ``ColumnParallelLinear``
and ``RowParallelLinear`` (as ``tensor_parallel.gpt2`` looks them up) for
grader stand-ins that keep the FULL weight on every rank and take their
slice of the full output (``grading.problems.p5_1_layers.reference``). What 5.2 decides --
which layer is split how, q/k/v by heads, the attention's local sizes -- is
then judged against the unsplit model computed in the grader: logits, loss,
the ranks' gradients (see ``assert_split_close``), three SGD steps, and the
bytes of block matrices each rank would hold with real parallel layers
(1/N of a split layer's weight).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from grading.problems.common import call_outcome
from grading.problems.p5_1_layers.checks import group_members, join_group
from grading.engine.compare import assert_tensor_close, describe
from grading.problems.p5_1_layers import reference as ref
from grading.engine.expect import CheckFailed, expect
from grading.engine.rubric import Case, Criterion
from grading.kit.seams import Swap, apply

if TYPE_CHECKING:
    from grading.engine.results import CaseRun

ATOL, RTOL = 1e-5, 1e-4


def bad_sizes(world_size: int) -> dict[str, dict[str, int]]:
    """GPT-2 sizes whose heads (or MLP inner size) do not split over ``world_size`` ranks, with the bad number."""
    heads = world_size + 1                      # 3 for 2 ranks, 4 for 3 ranks; both divide n_embd = 48
    return {"heads": {"n_head": heads, "bad": heads}, "inner": {"n_inner": 8 * world_size + 1,
                                                                "bad": 8 * world_size + 1}}


SWAPS = [
    Swap("tensor_parallel.gpt2", "ColumnParallelLinear", lambda: ref.FullWeightColumn,
         "5.2 criteria are judged apart from the student's 5.1 ColumnParallelLinear (full-weight stand-in)"),
    Swap("tensor_parallel.gpt2", "RowParallelLinear", lambda: ref.FullWeightRow,
         "5.2 criteria are judged apart from the student's 5.1 RowParallelLinear (full-weight stand-in)"),
]


# ---------------------------------------------------------------- probe
def probe_gpt2(ctx) -> None:
    """Split every block (stand-in layers), then forward, backward and SGD steps; record what a rank holds."""
    from tensor_parallel import gpt2 as student

    apply(SWAPS)
    group, members = join_group(ctx)
    if ctx.rank not in members:
        return
    world = len(members)
    attention = ctx.args.get("attention", "eager")

    def value_errors():
        out = {}
        for key, sizes in bad_sizes(world).items():
            block = ref.build_gpt2(0, attention, **{k: v for k, v in sizes.items() if k != "bad"}).transformer.h[0]
            before = [(name, id(module)) for name, module in block.named_modules()] + [block.attn.split_size]
            outcome = call_outcome(lambda block=block: student.parallelize_block(block, group), message=True)
            after = [(name, id(module)) for name, module in block.named_modules()] + [block.attn.split_size]
            out[key] = {"outcome": outcome, "unchanged": before == after}
        return out
    ctx.record("value_errors", value_errors)

    model = ref.build_gpt2(0, attention)

    def split():
        for block in model.transformer.h:
            student.parallelize_block(block, group)
        return {"layers": {name: getattr(module, "stands_for", type(module).__name__)
                           for name, module in model.named_modules() if ref.split_layer_of(name + ".weight")},
                "block_matrix_bytes": ref.held_block_matrix_bytes(model, world)}
    if ctx.record("split", split) is None:
        return                               # the criteria report the split's error
    optimizer = torch.optim.SGD(model.parameters(), lr=ref.LEARNING_RATE)
    losses = []

    def step(index: int) -> dict:
        optimizer.zero_grad()
        logits = model(ref.tokens(index)).logits
        loss = ref.next_token_loss(logits, ref.tokens(index))
        losses.append(loss.item())
        loss.backward()
        return {"logits": logits.detach(), "loss": loss.item()}
    if ctx.record("forward", lambda: step(0)) is None:
        return
    ctx.record("grads", lambda: ref.full_values(model, "grad"))
    if not ctx.args.get("sgd", True):
        return

    def sgd():
        optimizer.step()
        for index in range(1, ref.SGD_STEPS):
            step(index)
            optimizer.step()
        return list(losses)
    if ctx.record("sgd", sgd) is not None:
        ctx.record("sgd_params", lambda: ref.full_values(model, "data"))


# ---------------------------------------------------------------- criteria
def _split(run: CaseRun) -> None:
    """Raise CheckFailed with parallelize_block's own error when the split failed on some rank."""
    for _, rank, _ in group_members(run):
        run.part("split", rank)


def assert_split_close(what: str, run: CaseRun, part: str, expected: dict[str, torch.Tensor],
                       initial: dict[str, torch.Tensor] | None = None) -> None:
    """Compare what the ranks hold with the unsplit model's ``expected`` values, parameter by parameter.

    The stand-in layers keep full tensors. A column-parallel parameter gets
    gradient (or, after SGD, changes) only in this rank's rows: the sum over
    the ranks of the gradients (of the changes from ``initial``) is the
    serial one. Anything else -- row-parallel weights, whose full gradient
    every rank computes, biases added after the all-reduce, layer norms,
    embeddings -- must equal the serial value on every rank.
    """
    members = group_members(run)
    world = len(members)
    per_rank = [run.part(part, rank) for _, rank, _ in members]
    layers = run.part("split", members[0][1])["layers"]
    for (_, _, who), values in zip(members, per_rank):
        expect(isinstance(values, dict), f"{what}: {who} recorded {describe(values)}")
    for name, full in expected.items():
        layer = ref.split_layer_of(name)
        if layer is not None:
            want = ref.expected_class(layer)
            expect(layers.get(layer) == want, f"{what} '{name}': {layer} is a {layers.get(layer)}, expected a "
                   f"{want} (see the contract of parallelize_block)")
        values = [values.get(name) for values in per_rank]
        for (_, _, who), value in zip(members, values):
            expect(value is not None, f"{what} '{name}': {who} has none (is the parameter still registered "
                   "and trained?)")
        if layer is not None and ref.expected_class(layer) == "ColumnParallelLinear":
            base = initial[name] if initial is not None else torch.zeros_like(full)
            combined = base + sum(value - base for value in values)
            assert_tensor_close(f"{what} '{name}' summed over the {world} ranks' column-parallel parts",
                                combined, full, atol=ATOL, rtol=RTOL)
            continue
        for (_, _, who), value in zip(members, values):
            assert_tensor_close(f"{what} '{name}' on {who} (whole on every rank)", value, full,
                                atol=ATOL, rtol=RTOL)


def check_value_errors(run: CaseRun) -> None:
    members = group_members(run)
    world = len(members)
    got = run.part("value_errors", members[0][1])
    for key, sizes in bad_sizes(world).items():
        outcome, unchanged = got[key]["outcome"], got[key]["unchanged"]
        label = (f"parallelize_block on a block with {sizes['bad']} "
                 f"{'attention heads' if key == 'heads' else 'MLP inner features'} over {world} ranks")
        expect(outcome.startswith("ValueError"), f"{label} must raise ValueError, got {outcome}")
        expect(str(sizes["bad"]) in outcome and str(world) in outcome, f"{label}: the ValueError must name the "
               f"sizes ({sizes['bad']}, {world} ranks); its message was: {outcome}")
        expect(unchanged, f"{label}: the block was changed before the ValueError (check every size first)")


def check_forward(run: CaseRun) -> None:
    _split(run)
    serial = ref.serial_gpt2()
    for _, rank, who in group_members(run):
        got = run.part("forward", rank)
        assert_tensor_close(f"split GPT-2: {who} logits", got["logits"], serial["logits"], atol=ATOL, rtol=RTOL)
        expect(abs(got["loss"] - serial["loss"]) <= 1e-5 * max(1.0, abs(serial["loss"])), f"split GPT-2: {who} "
               f"loss {got['loss']:.6g}, unsplit model {serial['loss']:.6g}")


def check_grads(run: CaseRun) -> None:
    _split(run)
    assert_split_close("split GPT-2: gradient of", run, "grads", ref.serial_gpt2()["grads"])


def check_sgd(run: CaseRun) -> None:
    _split(run)
    serial = ref.serial_gpt2()
    for _, rank, who in group_members(run):
        for step, (mine, want) in enumerate(zip(run.part("sgd", rank), serial["losses"])):
            expect(abs(mine - want) <= 1e-5 * max(1.0, abs(want)), f"split GPT-2: {who} loss at SGD step "
                   f"{step} is {mine:.6g}, unsplit model {want:.6g}")
    assert_split_close(f"split GPT-2 after {ref.SGD_STEPS} SGD steps: parameter", run, "sgd_params",
                       serial["params"], initial=serial["initial"])


def check_param_bytes(run: CaseRun) -> None:
    _split(run)
    members = group_members(run)
    world = len(members)
    full = ref.serial_block_matrix_bytes()
    for _, rank, who in members:
        got = run.part("split", rank)
        held = got["block_matrix_bytes"]
        expect(held * world == full, f"{who} holds {held:,} bytes of block matrices, expected "
               f"{full // world:,} (1/{world} of the unsplit {full:,}); layers: {got['layers']}")


CASES = [
    Case("p5_gpt2_2rank", "grading.problems.p5_2_gpt2.checks:probe_gpt2", world_size=2, init_group=True, timeout_s=120,
         criteria=(
             Criterion("5.2.value_errors", "heads or inner size not divisible: ValueError naming the sizes, "
                       "block unchanged", 1, check_value_errors),
             Criterion("5.2.forward", "every block split: logits and loss equal the unsplit GPT-2's", 4,
                       check_forward),
             Criterion("5.2.grads", "the ranks' gradients make up the unsplit GPT-2's", 4,
                       check_grads),
             Criterion("5.2.sgd_steps", "three SGD steps stay equal to the unsplit model's", 2, check_sgd),
             Criterion("5.2.param_bytes", "each rank holds 1/N of the blocks' matrix parameters", 2,
                       check_param_bytes),
         )),
]

__all__ = ["CASES", "CheckFailed"]
