"""Problem 5.1 checks: the parallel-region autograd functions and the column/row parallel layers.

The criteria compare what each rank records (``probes.py``) with a full ``nn.Linear`` in the grader
(``reference.py``). The layer checks run with grader stand-ins for the two autograd functions, so a bug in a
function costs only its own criteria; the communication count runs the student's functions and layers together.
Every part is recorded over the split's group (``Inputs.group_ranks``; hidden: 3 of a subgroup of 4 ranks).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from grading.check import CheckFailed, SplitRun, SubProblem, Swap, apply, assert_tensor_close, describe, expect
from common.startup import GRADIENT_IMPORTS
from grading.problems.p5_1_layers import ID, TITLE, probes
from grading.problems.p5_1_layers import reference as ref
from grading.problems.p5_1_layers.probes import (BAD_CHUNKS, P_BAD_CHUNKS, P_CHUNKS, P_GRADS, P_GROUP, P_MLP_COMM,
                                                 P_NO_BIAS, P_OUT, P_REGION_FUNCTIONS, P_REGION_MEMORY,
                                                 P_SHARD_COPIES, P_SHARD_TENSORS, P_UNEVEN, SHARD_KINDS, SPLIT_PARTS,
                                                 join_group, uneven_sizes)


@dataclass(frozen=True)
class Inputs:
    """The ranks of the group the layers split over (empty: the whole default group); the chunked layer's blocks."""

    group_ranks: tuple[int, ...] = ()
    chunks: int = 3                     # ColumnParallelLinear.from_linear(..., chunks=chunks) on 2*chunks*N features


PROBLEM = SubProblem(ID, TITLE, __package__, inputs=Inputs())

ATOL, RTOL = 1e-5, 1e-5

SWAPS = [
    Swap("tensor_parallel.layers", "copy_to_parallel_region", lambda: ref.gathered_copy,
         "5.1 column/row criteria are judged apart from the student's CopyToParallelRegion"),
    Swap("tensor_parallel.layers", "reduce_from_parallel_region", lambda: ref.gathered_reduce,
         "5.1 column/row criteria are judged apart from the student's ReduceFromParallelRegion"),
]


# ---------------------------------------------------------------- probe
def probe_layers(ctx) -> None:
    """Functions alone, the student's MLP with communication counts, then the layers on grader stand-ins.

    Each split's group is joined first (every rank takes part); a rank outside
    a split's group records nothing for it. A collective on other ranks than
    the split's group is refused at once (``probes.Collectives``), not left to
    hang until the collective timeout. The swaps are applied between the two
    ``each_split`` calls: the student's own functions run (for every split)
    before any layer runs on the stand-ins.
    """
    import torch.distributed as dist

    collectives = probes.Collectives(dist)
    from tensor_parallel import layers

    joined: dict[Inputs, tuple] = {}     # each split's (group, members), by its inputs: joined once

    def own_functions(inputs: Inputs) -> None:
        group, members = joined[inputs] = join_group(ctx, inputs.group_ranks)
        if ctx.rank in members:
            with collectives.splitting_over(members):
                probes.record_own_functions(ctx, layers, collectives.counts, group, members.index(ctx.rank))

    def layers_on_stand_ins(inputs: Inputs) -> None:
        group, members = joined[inputs]
        if ctx.rank in members:
            with collectives.splitting_over(members):
                probes.record_layers(ctx, layers, group, members.index(ctx.rank), len(members))
                probes.record_shards(ctx, layers, group, len(members), inputs.chunks)

    PROBLEM.each_split(ctx, own_functions)
    apply(SWAPS)     # the layers from here on call the grader's all-gather stand-ins
    PROBLEM.each_split(ctx, layers_on_stand_ins)


CASE = PROBLEM.case("p5_layers", probe_layers, world_size=2, init_group=True, timeout_s=90, preload=GRADIENT_IMPORTS,
                    split_parts=SPLIT_PARTS)


# ---------------------------------------------------------------- criteria
def group_members(run: SplitRun) -> list[tuple[int, int, str]]:
    """``(group rank, process rank, label)`` of every rank in the group of ``run``'s split."""
    members = run.part(P_GROUP, 0)
    whole = members == list(range(run.world_size))
    return [(index, rank, f"rank {rank}" if whole else f"rank {rank} (rank {index} of the group {members})")
            for index, rank in enumerate(members)]


def _layer(run: SplitRun, name: str, rank: int) -> dict:
    got = run.part(name, rank)
    expect(isinstance(got, dict), f"rank {rank}: {name} results missing ({describe(got)})")
    return got


@CASE.criterion("5.1.region_functions", "copy_to (identity / all-reduce grad), reduce_from (all-reduce / "
                "identity)", points=3, reads=(P_GROUP, P_REGION_FUNCTIONS))
def check_region_functions(run: SplitRun) -> None:
    """copy_to: identity forward, summed gradient; reduce_from: summed forward, identity backward; input kept."""
    members = group_members(run)
    x = [ref.data("x", ref.IN_FEATURES) * (index + 1) for index, _, _ in members]
    g = [ref.data("g_mlp", ref.IN_FEATURES) * (index + 2) for index, _, _ in members]
    for index, rank, who in members:
        got = _layer(run, P_REGION_FUNCTIONS, rank)
        copy, reduce = got["copy"], got["reduce"]
        assert_tensor_close(f"copy_to_parallel_region: {who} forward (must be the input itself)", copy["out"],
                            x[index], atol=0, rtol=0)
        close_or_likely_cause(f"copy_to_parallel_region: {who} backward (must be the sum of every rank's "
                              "gradient)", copy["input_grad"], sum(g), [
                                  ("the backward of copy_to_parallel_region returns this rank's gradient without "
                                   "the all-reduce", g[index])])
        close_or_likely_cause(f"reduce_from_parallel_region: {who} forward (must be the sum over the ranks)",
                              reduce["out"], sum(x), [("the forward of reduce_from_parallel_region returns this "
                                                       "rank's input without the all-reduce", x[index])])
        assert_tensor_close(f"reduce_from_parallel_region: {who} backward (must be the incoming gradient "
                            "unchanged)", reduce["input_grad"], g[index], atol=0, rtol=0)
        expect(copy["x_unchanged"] and reduce["x_unchanged"], f"{who}: a parallel-region function changed "
               "its input tensor in place (all-reduce a copy)")


@CASE.criterion("5.1.column_forward", "ColumnParallelLinear output is the rank's slice of the full layer's",
                points=3, reads=(P_GROUP, P_OUT["column"]))
def check_column_forward(run: SplitRun) -> None:
    """Each rank's ColumnParallelLinear output is its slice of the full layer's output."""
    full, members = ref.serial_column()["out"], group_members(run)
    world = len(members)
    for index, rank, who in members:
        close_or_likely_cause(f"ColumnParallelLinear: {who} output (its slice of the full layer's output)",
                              run.part(P_OUT["column"], rank), ref.rank_slice(full, index, world),
                              [(f"rank {index} of the group took the rows of rank {k} (r is "
                                "dist.get_rank(group))", ref.rank_slice(full, k, world))
                               for k in range(world) if k != index])


@CASE.criterion("5.1.row_forward", "RowParallelLinear output equals the full layer's (bias added once)",
                points=3, reads=(P_GROUP, P_OUT["row"]))
def check_row_forward(run: SplitRun) -> None:
    """Every rank's RowParallelLinear output is the full layer's output (bias added once)."""
    full, members = ref.serial_row()["out"], group_members(run)
    bias = ref.row_linear().bias.detach()
    for _, rank, who in members:
        close_or_likely_cause(f"RowParallelLinear: {who} output (the full layer's output, bias added once)",
                              run.part(P_OUT["row"], rank), full, [
                                  (f"the bias added on every rank before the all-reduce (counted {len(members)} "
                                   "times)", full + (len(members) - 1) * bias),
                                  ("the bias never added", full - bias)])


@CASE.criterion("5.1.weight_grads", "each rank's weight/bias gradient is its slice of the serial gradient",
                points=3, reads=(P_GROUP, P_GRADS["column"], P_GRADS["row"]))
def check_weight_grads(run: SplitRun) -> None:
    """Each rank's weight/bias gradients are its slice of the full layer's (row bias: the whole one)."""
    members = group_members(run)
    world = len(members)
    column, row = ref.serial_column(), ref.serial_row()
    for index, rank, who in members:
        got = _layer(run, P_GRADS["column"], rank)
        for name in ("weight", "bias"):
            assert_tensor_close(f"ColumnParallelLinear: {who} gradient of {name} (the matching rows of the "
                                "full layer's gradient)", got[name], ref.rank_slice(column[name], index, world, dim=0),
                                atol=ATOL, rtol=RTOL)
        got = _layer(run, P_GRADS["row"], rank)
        assert_tensor_close(f"RowParallelLinear: {who} gradient of weight (the matching columns of the full "
                            "layer's gradient)", got["weight"], ref.rank_slice(row["weight"], index, world, dim=1),
                            atol=ATOL, rtol=RTOL)
        try:
            assert_tensor_close(f"RowParallelLinear: {who} gradient of bias (the full layer's bias gradient)",
                                got["bias"], row["bias"], atol=ATOL, rtol=RTOL)
        except CheckFailed as failure:
            raise CheckFailed(f"{failure}{_split_bias_hint(got['bias'], row['bias'], world)}") from None


def _split_bias_hint(got, want: torch.Tensor, world: int) -> str:
    """A likely cause when a RowParallelLinear's bias gradient is 1/N of the full layer's: bias / N added on every
    rank before the all-reduce (the same output, another gradient)."""
    if not (isinstance(got, torch.Tensor) and got.shape == want.shape and world > 1
            and torch.allclose(got.double() * world, want.double(), atol=ATOL, rtol=RTOL)):
        return ""
    return (f"\nlikely cause: bias / {world} added on every rank before the all-reduce (the output is the same, but "
            f"each rank's bias gradient is 1/{world} of the full layer's); add the whole bias once, after the sum")


@CASE.criterion("5.1.input_grads", "input gradients equal the serial ones", points=3,
                reads=(P_GROUP, P_GRADS["column"], P_GRADS["row"]))
def check_input_grads(run: SplitRun) -> None:
    """Column: every rank's input gradient is the full one; row: the matching slice of the full one."""
    members = group_members(run)
    column, row = ref.serial_column(), ref.serial_row()
    for index, rank, who in members:
        assert_tensor_close(f"ColumnParallelLinear: {who} gradient of the input (the full layer's: every "
                            "rank's part summed)", _layer(run, P_GRADS["column"], rank)["input"],
                            column["input"], atol=ATOL, rtol=RTOL)
        assert_tensor_close(f"RowParallelLinear: {who} gradient of its input slice (the matching slice of "
                            "the full layer's)", _layer(run, P_GRADS["row"], rank)["input"],
                            ref.rank_slice(row["input"], index, len(members)), atol=ATOL, rtol=RTOL)


@CASE.criterion("5.1.comm_counts", "column -> row MLP: one all-reduce forward, one backward", points=2,
                reads=(P_GROUP, P_MLP_COMM))
def check_comm_counts(run: SplitRun) -> None:
    """The student's column -> row MLP makes exactly one all_reduce forward and one backward."""
    for _, rank, who in group_members(run):
        got = _layer(run, P_MLP_COMM, rank)
        for phase in ("forward", "backward"):
            calls = got[phase]
            expect(calls == {"all_reduce": 1}, f"column -> row MLP: {who} made {calls or 'no collective calls'}"
                   f" in the {phase} pass; expected exactly one all_reduce and no other collective")


@CASE.criterion("5.1.uneven_split", "uneven splits raise ValueError naming the sizes", points=1,
                reads=(P_GROUP, P_UNEVEN))
def check_uneven_split(run: SplitRun) -> None:
    """from_linear on sizes that do not split raises ValueError naming them; even sizes are accepted."""
    members = group_members(run)
    world = len(members)
    sizes = uneven_sizes(world)
    got = _layer(run, P_UNEVEN, members[0][1])
    expect(got["even"] == "no exception", f"from_linear on sizes that split over {world} ranks raised: "
           f"{got['even']}")
    for key, label in (("column", f"ColumnParallelLinear.from_linear(Linear(4, {sizes['column']}))"),
                       ("column_chunks3", f"ColumnParallelLinear.from_linear(Linear(4, {sizes['column_chunks3']}), "
                                          "chunks=3)"),
                       ("row", f"RowParallelLinear.from_linear(Linear({sizes['row']}, 4))")):
        outcome = got[key]
        expect(outcome.startswith("ValueError"), f"{label} on {world} ranks must raise ValueError, got {outcome}")
        named = [sizes[key], world] + ([3] if key == "column_chunks3" else [])
        expect(all(str(n) in outcome for n in named), f"{label}: the ValueError must name the sizes "
               f"({sizes[key]} features{', 3 chunks' if len(named) > 2 else ''}, {world} ranks); its message was: "
               f"{outcome}")



@CASE.criterion("5.1.bad_chunks", "ColumnParallelLinear.from_linear with chunks < 1 raises ValueError", points=1,
                reads=(P_GROUP, P_BAD_CHUNKS))
def check_bad_chunks(run: SplitRun) -> None:
    """``chunks`` of 0 or below is refused with ValueError."""
    got = _layer(run, P_BAD_CHUNKS, group_members(run)[0][1])
    for chunks in BAD_CHUNKS:
        expect(got[chunks].startswith("ValueError"), f"ColumnParallelLinear.from_linear(..., chunks={chunks}) must "
               f"raise ValueError, got {got[chunks]}")


@CASE.criterion("5.1.column_chunks", "ColumnParallelLinear with chunks = c: the rank's slice of every block, "
                "in block order", points=2, reads=(P_GROUP, P_CHUNKS))
def check_column_chunks(run: SplitRun) -> None:
    """``from_linear(..., chunks=c)``: weight, bias and output are the rank's slice of each of the c blocks."""
    members = group_members(run)
    world, chunks = len(members), run.inputs.chunks
    linear = ref.chunked_linear(chunks, world)
    full = {"weight": linear.weight.detach().t(), "bias": linear.bias.detach(),
            "out": ref.serial_out(linear, ref.data("x", ref.IN_FEATURES))}
    for index, rank, who in members:
        got = _layer(run, P_CHUNKS, rank)
        for name, value in full.items():
            want = ref.chunked_column_shard(value, chunks, index, world)
            mine = got[name].t() if name == "weight" and isinstance(got[name], torch.Tensor) else got[name]
            close_or_likely_cause(
                f"ColumnParallelLinear.from_linear(Linear({ref.IN_FEATURES}, {2 * chunks * world}), chunks={chunks}):"
                f" {who} {name}{' (transposed)' if name == 'weight' else ''}", mine, want,
                [("chunks ignored: the rank's contiguous 1/N of all the rows, not its slice of each of the "
                  f"{chunks} blocks", ref.rank_slice(value, index, world))])


@CASE.criterion("5.1.shard_copies", "the shards are copies: from_linear and changes to a shard leave the "
                "source layer unchanged", points=1, reads=(P_GROUP, P_SHARD_COPIES))
def check_shard_copies(run: SplitRun) -> None:
    """Building a shard changes nothing in ``linear``; changing the shard in place changes nothing either."""
    for _, rank, who in group_members(run):
        got = _layer(run, P_SHARD_COPIES, rank)
        for kind in SHARD_KINDS:
            label = f"{who}: {_SHARD_LABELS[kind]}"
            expect(not got[kind]["changed_by_from_linear"], f"{label} changed the source layer's "
                   f"{got[kind]['changed_by_from_linear']}")
            expect(not got[kind]["changed_by_shard_update"], f"{label}: an in-place change of the shard's weight "
                   f"and bias changed the source layer's {got[kind]['changed_by_shard_update']} (the shard shares "
                   "memory with it: clone)")


@CASE.criterion("5.1.shard_dtype_device", "shards keep the source's dtype and device and are trainable "
                "parameters", points=1, reads=(P_GROUP, P_SHARD_TENSORS))
def check_shard_dtype_device(run: SplitRun) -> None:
    """From a float64 layer: float64 shards; from a 'meta' layer: 'meta' shards; from a frozen layer: trainable."""
    wants = {"float64": "torch.float64, cpu, requires_grad=True, leaf=True",
             "meta": "torch.float32, meta, requires_grad=True, leaf=True",
             "frozen": "torch.float32, cpu, requires_grad=True, leaf=True"}
    sources = {"float64": "a float64 layer", "meta": "a layer on the 'meta' device (a stand-in for a GPU)",
               "frozen": "a layer whose parameters do not require grad"}
    for _, rank, who in group_members(run):
        got = _layer(run, P_SHARD_TENSORS, rank)
        for kind in SHARD_KINDS:
            for what, want in wants.items():
                mine = got[kind][what]
                expect(mine == [want, want], f"{who}: {_SHARD_LABELS[kind]} of {sources[what]}: weight and bias "
                       f"are [{mine if isinstance(mine, str) else '; '.join(mine)}], expected [{want}] for both "
                       "(copies of linear's tensors, same dtype and device, wrapped by the constructor)")


@CASE.criterion("5.1.no_bias", "layers without bias: bias None, outputs those of the same layer with a zero "
                "bias", points=1, reads=(P_GROUP, P_NO_BIAS))
def check_no_bias(run: SplitRun) -> None:
    """From ``nn.Linear(..., bias=False)``: ``bias is None``; the output equals the same layer's with a zero bias.

    Judged against the student's own layer built from the same weight with a
    zero bias, so a wrong layout (or a bias added N times) costs the criteria
    about those, not this one.
    """
    for _, rank, who in group_members(run):
        got = _layer(run, P_NO_BIAS, rank)
        for kind in SHARD_KINDS:
            label = f"{who}: {_SHARD_LABELS[kind]} of a layer without bias"
            expect(got[kind]["bias_is_none"], f"{label}: its bias must be None")
            assert_tensor_close(f"{label}: output (must equal the same layer's with a zero bias)", got[kind]["out"],
                                got[kind]["zero_bias_out"], atol=ATOL, rtol=RTOL)


@CASE.criterion("5.1.copy_forward_view", "copy_to_parallel_region's forward returns a view of its input "
                "(no copy)", points=1, reads=(P_GROUP, P_REGION_MEMORY))
def check_copy_forward_view(run: SplitRun) -> None:
    """f's forward output shares the input's memory."""
    for _, rank, who in group_members(run):
        expect(_layer(run, P_REGION_MEMORY, rank)["forward_shares_input"], f"copy_to_parallel_region: "
               f"{who} forward returned a copy of its input (new memory); return a view: x.view_as(x)")


@CASE.criterion("5.1.grad_kept", "copy_to_parallel_region's backward leaves the incoming gradient unchanged",
                points=1, reads=(P_GROUP, P_REGION_MEMORY))
def check_grad_kept(run: SplitRun) -> None:
    """f's backward all-reduces a copy: the gradient tensor autograd hands it is unchanged afterwards."""
    for _, rank, who in group_members(run):
        expect(_layer(run, P_REGION_MEMORY, rank)["upstream_unchanged"], f"copy_to_parallel_region: "
               f"{who} backward changed the gradient tensor it was given (y.backward(g) changed g): all-reduce a "
               "contiguous copy, never grad itself")


_SHARD_LABELS = {"column": "ColumnParallelLinear.from_linear", "column_chunks3": "ColumnParallelLinear.from_linear("
                 "..., chunks=3)", "row": "RowParallelLinear.from_linear"}


def close_or_likely_cause(what: str, actual, expected: torch.Tensor, causes: list[tuple[str, torch.Tensor]]) -> None:
    """``assert_tensor_close``; on failure, a "likely cause" line when ``actual`` matches a known wrong answer."""
    try:
        assert_tensor_close(what, actual, expected, atol=ATOL, rtol=RTOL)
    except CheckFailed as failure:
        cause = next((cause for cause, wrong in causes if isinstance(actual, torch.Tensor)
                      and actual.shape == wrong.shape and actual.dtype == wrong.dtype
                      and torch.allclose(actual.double(), wrong.double(), atol=ATOL, rtol=RTOL)), None)
        raise CheckFailed(f"{failure}\nlikely cause: {cause}" if cause else str(failure)) from None
