"""Problem 5.2 checks: ``parallelize_block`` on every block of a tiny GPT-2.

The probe swaps the student's ``ColumnParallelLinear`` and ``RowParallelLinear`` (as ``tensor_parallel.gpt2``
looks them up) for grader stand-ins that keep the FULL weight on every rank (``reference.py``), so what 5.2
decides (which layer is split how, q/k/v by heads, the attention's local sizes) is judged apart from 5.1, against
the unsplit model computed in the grader. Every part depends on the inputs (``Inputs``: the group the blocks
split over, the attention implementation), so each is a split part.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

from grading.check import (CheckFailed, SplitRun, SubProblem, Swap, apply, assert_tensor_close, describe, describe_kind,
                          expect)
from grading.problems.probe_helpers import GPT2_IMPORTS, call_outcome
from grading.problems.p5_1_layers.checks import group_members, join_group
from grading.problems.p5_1_layers.probes import P_GROUP
from grading.problems.p5_2_gpt2 import ID, TITLE
from grading.problems.p5_2_gpt2 import reference as ref
from grading.problems.p5_2_gpt2.hints import qkv_hint


@dataclass(frozen=True)
class Inputs:
    """The ranks of the group the blocks split over (empty: the whole default group) and the attention kind."""

    group_ranks: tuple[int, ...] = ()
    attention: str = "eager"            # or "sdpa" (PyTorch's fused attention)


PROBLEM = SubProblem(ID, TITLE, __package__, inputs=Inputs())

ATOL, RTOL = 1e-5, 1e-4
P_VALUE_ERRORS = "value_errors"
P_SPLIT = "split"
P_FORWARD = "forward"
P_GRADS = "grads"
P_SGD = "sgd"                           # read by a public criterion only
P_SGD_PARAMS = "sgd_params"             # read by a public criterion only
SPLIT_PARTS = (P_GROUP, P_VALUE_ERRORS, P_SPLIT, P_FORWARD, P_GRADS, P_SGD, P_SGD_PARAMS)  # all: on the inputs
ATTENTION_SIZES = ("num_heads", "embed_dim", "split_size", "head_dim")


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
    """Split every block (stand-in layers), then forward, backward and SGD steps; record what a rank holds.

    Each split's group is joined first (every rank takes part); a rank outside
    a split's group records nothing for it.
    """
    from tensor_parallel import gpt2 as student

    apply(SWAPS)

    def record(inputs: Inputs) -> None:
        group, members = join_group(ctx, inputs.group_ranks)
        if ctx.rank in members:
            _probe_split(ctx, student, inputs.attention, group, len(members))
    PROBLEM.each_split(ctx, record)


def _probe_split(ctx, student, attention: str, group, world: int) -> None:
    """This rank's parts of one split: refusals, the split, forward, gradients, SGD steps."""
    def value_errors():
        out = {}
        for key, sizes in bad_sizes(world).items():
            block = ref.build_gpt2(0, attention, **{k: v for k, v in sizes.items() if k != "bad"}).transformer.h[0]
            before = _block_state(block)
            outcome = call_outcome(lambda block=block: student.parallelize_block(block, group), message=True)
            after = _block_state(block)
            out[key] = {"outcome": outcome, "changed": [what for what in before if before[what] != after.get(what)]}
        return out
    ctx.record(P_VALUE_ERRORS, value_errors)

    model = ref.build_gpt2(0, attention)

    def split_blocks():
        returned = []                        # per block: None when it returned the block, else what came back
        for block in model.transformer.h:
            got = student.parallelize_block(block, group)
            returned.append(None if got is block else describe_kind(got))
        return {"layers": {name: getattr(module, "stands_for", type(module).__name__)
                           for name, module in model.named_modules() if ref.split_layer_of(name + ".weight")},
                "block_matrix_bytes": ref.held_block_matrix_bytes(model, world), "returned_block": returned,
                "attention": [{size: getattr(block.attn, size, None) for size in ATTENTION_SIZES}
                              for block in model.transformer.h]}
    if ctx.record(P_SPLIT, split_blocks) is None:
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
    if ctx.record(P_FORWARD, lambda: step(0)) is None:
        return
    ctx.record(P_GRADS, lambda: ref.full_values(model, "grad"))

    def sgd():
        optimizer.step()
        for index in range(1, ref.SGD_STEPS):
            step(index)
            optimizer.step()
        return list(losses)
    if ctx.record(P_SGD, sgd) is not None:
        ctx.record(P_SGD_PARAMS, lambda: ref.full_values(model, "data"))


def _block_state(block) -> dict[str, object]:
    """What ``parallelize_block`` could change: each submodule's and parameter's identity, the attention sizes."""
    state: dict[str, object] = {f"module {name or '(block)'}": id(module) for name, module in block.named_modules()}
    state.update({f"parameter {name}": (id(p), p.data_ptr(), tuple(p.shape)) for name, p in block.named_parameters()})
    state.update({f"attn.{size}": getattr(block.attn, size, None) for size in ATTENTION_SIZES})
    return state


CASE = PROBLEM.case("p5_gpt2", probe_gpt2, world_size=2, init_group=True, timeout_s=120, preload=GPT2_IMPORTS,
                    split_parts=SPLIT_PARTS)


# ---------------------------------------------------------------- criteria
def _split(run: SplitRun) -> None:
    """Raise CheckFailed with parallelize_block's own error when the split failed on some rank."""
    for _, rank, _ in group_members(run):
        run.part(P_SPLIT, rank)


def assert_split_close(what: str, run: SplitRun, part: str, expected: dict[str, torch.Tensor],
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
    layers = run.part(P_SPLIT, members[0][1])["layers"]
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


@contextmanager
def _qkv_hinted(run: SplitRun):
    """Re-raise a CheckFailed inside with the likely cause of ``qkv_hint`` (the ranks' recorded gradients)."""
    try:
        yield
    except CheckFailed as failure:
        try:
            grads = [run.part(P_GRADS, rank) for _, rank, _ in group_members(run)]
        except CheckFailed:             # no gradients recorded: nothing to read the shards from
            raise failure from None
        raise CheckFailed(f"{failure}{qkv_hint(grads, len(grads))}") from None


@CASE.criterion("5.2.value_errors", "heads or inner size not divisible: ValueError naming the sizes, "
                "block unchanged", points=1, reads=(P_GROUP, P_VALUE_ERRORS))
def check_value_errors(run: SplitRun) -> None:
    """Heads or MLP inner size that do not split: ValueError naming the sizes, the block left unchanged."""
    members = group_members(run)
    world = len(members)
    got = run.part(P_VALUE_ERRORS, members[0][1])
    for key, sizes in bad_sizes(world).items():
        outcome, changed = got[key]["outcome"], got[key]["changed"]
        label = (f"parallelize_block on a block with {sizes['bad']} "
                 f"{'attention heads' if key == 'heads' else 'MLP inner features'} over {world} ranks")
        expect(outcome.startswith("ValueError"), f"{label} must raise ValueError, got {outcome}")
        expect(str(sizes["bad"]) in outcome and str(world) in outcome, f"{label}: the ValueError must name the "
               f"sizes ({sizes['bad']}, {world} ranks); its message was: {outcome}")
        expect(not changed, f"{label}: the block was changed before the ValueError: {', '.join(changed[:4])}"
               f"{' ...' if len(changed) > 4 else ''} (check every size first)")


@CASE.criterion("5.2.forward", "every block split: logits and loss equal the unsplit GPT-2's", points=4,
                reads=(P_GROUP, P_SPLIT, P_FORWARD, P_GRADS))
def check_forward(run: SplitRun) -> None:
    """Every rank's logits and loss of the split GPT-2 equal the unsplit model's."""
    _split(run)
    serial = ref.serial_gpt2()
    for _, rank, who in group_members(run):
        got = run.part(P_FORWARD, rank)
        with _qkv_hinted(run):
            assert_tensor_close(f"split GPT-2: {who} logits", got["logits"], serial["logits"], atol=ATOL, rtol=RTOL)
            expect(abs(got["loss"] - serial["loss"]) <= 1e-5 * max(1.0, abs(serial["loss"])), f"split GPT-2: "
                   f"{who} loss {got['loss']:.6g}, unsplit model {serial['loss']:.6g}")


@CASE.criterion("5.2.grads", "the ranks' gradients make up the unsplit GPT-2's", points=4,
                reads=(P_GROUP, P_SPLIT, P_GRADS))
def check_grads(run: SplitRun) -> None:
    """The ranks' gradients make up the unsplit model's (see ``assert_split_close``)."""
    _split(run)
    with _qkv_hinted(run):
        assert_split_close("split GPT-2: gradient of", run, P_GRADS, ref.serial_gpt2()["grads"])


@CASE.criterion("5.2.sgd_steps", "three SGD steps stay equal to the unsplit model's", points=2,
                reads=(P_GROUP, P_SPLIT, P_SGD, P_SGD_PARAMS, P_GRADS))
def check_sgd(run: SplitRun) -> None:
    """Losses and parameters over three SGD steps stay equal to the unsplit model's."""
    _split(run)
    serial = ref.serial_gpt2()
    with _qkv_hinted(run):
        for _, rank, who in group_members(run):
            for step, (mine, want) in enumerate(zip(run.part(P_SGD, rank), serial["losses"])):
                expect(abs(mine - want) <= 1e-5 * max(1.0, abs(want)), f"split GPT-2: {who} loss at SGD step "
                       f"{step} is {mine:.6g}, unsplit model {want:.6g}")
        assert_split_close(f"split GPT-2 after {ref.SGD_STEPS} SGD steps: parameter", run, P_SGD_PARAMS,
                           serial["params"], initial=serial["initial"])


@CASE.criterion("5.2.param_bytes", "each rank holds 1/N of the blocks' matrix parameters", points=2,
                reads=(P_GROUP, P_SPLIT))
def check_param_bytes(run: SplitRun) -> None:
    """Each rank would hold 1/N of the blocks' matrix bytes with real parallel layers."""
    _split(run)
    members = group_members(run)
    world = len(members)
    full = ref.serial_block_matrix_bytes()
    for _, rank, who in members:
        got = run.part(P_SPLIT, rank)
        held = got["block_matrix_bytes"]
        expect(held * world == full, f"{who} holds {held:,} bytes of block matrices, expected "
               f"{full // world:,} (1/{world} of the unsplit {full:,}); layers: {got['layers']}")



@CASE.criterion("5.2.returns_block", "parallelize_block returns the block it split (in place)", points=1,
                reads=(P_GROUP, P_SPLIT))
def check_returns_block(run: SplitRun) -> None:
    """``parallelize_block(block, group) is block`` for every block."""
    _split(run)
    for _, rank, who in group_members(run):
        returned = run.part(P_SPLIT, rank)["returned_block"]
        wrong = {k: kind for k, kind in enumerate(returned) if kind is not None}
        expect(not wrong, f"{who}: parallelize_block returned {', '.join(sorted(set(wrong.values())))} for blocks "
               f"{sorted(wrong)}, expected the block it was given (it splits in place: return block itself)")


@CASE.criterion("5.2.attention_sizes", "the attention's num_heads, embed_dim, split_size become the ints H/N, E/N, "
                "E/N; head_dim unchanged", points=1, reads=(P_GROUP, P_SPLIT))
def check_attention_sizes(run: SplitRun) -> None:
    """Every split block's attention reports its local sizes."""
    _split(run)
    world = len(group_members(run))
    heads, embed = ref.GPT2_SIZES["n_head"], ref.GPT2_SIZES["n_embd"]
    want = {"num_heads": heads // world, "embed_dim": embed // world, "split_size": embed // world,
            "head_dim": embed // heads}
    for _, rank, who in group_members(run):
        for index, sizes in enumerate(run.part(P_SPLIT, rank)["attention"]):
            wrong = {k: v for k, v in sizes.items() if type(v) is not int or v != want[k]}
            expect(not wrong, f"{who}: block {index}'s attention after the split has "
                   f"{', '.join(f'{k}={v}' for k, v in wrong.items())}; expected "
                   f"{', '.join(f'{k}={want[k]}' for k in wrong)} (H={heads}, E={embed}, N={world})")
