"""Problem 5.1 checks: the parallel-region autograd functions and the column/row parallel layers.

The probe runs on every rank and only *records*; the criteria compare with a
full ``nn.Linear`` computed in the grader (``grading.problems.p5_1_layers.reference``).
Isolation: the layer checks run with grader stand-ins for the two autograd
functions (they all-gather instead of all-reducing), so a bug in a function
costs the function's criteria, not the layers'. The communication count runs
the student's own functions and layers together (it is a statement about
both).

Every part depends on the group the probe splits over (``Inputs.group_ranks``:
the whole default group in the public case), so each is recorded per split.
On the staff side the hidden inputs split 3 ways inside a subgroup of 4
ranks (``staff.py``), so a rank's place in the group differs from its global
rank and code that ignores ``group`` fails.
"""
from __future__ import annotations

from dataclasses import dataclass

from grading.engine.compare import assert_tensor_close, describe
from grading.engine.expect import expect
from grading.engine.results import CaseRun
from grading.engine.rubric import split_part
from grading.kit.problem import SubProblem
from grading.kit.seams import Swap, apply
from grading.problems.common import call_outcome
from grading.problems.p5_1_layers import ID, TITLE
from grading.problems.p5_1_layers import reference as ref


@dataclass(frozen=True)
class Inputs:
    """The ranks of the group the layers split over; empty: the whole default group."""

    group_ranks: tuple[int, ...] = ()


PROBLEM = SubProblem(ID, TITLE, __package__, inputs=Inputs())

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
               "broadcast", "reduce", "all_to_all", "all_to_all_single", "gather", "scatter")
ATOL, RTOL = 1e-5, 1e-5
# every part is recorded per split: split_part(P_X, split)
P_GROUP = "group_ranks"
P_REGION_FUNCTIONS = "region_functions"
P_MLP_COMM = "mlp_comm"
P_OUT = {"column": "column_out", "row": "row_out"}
P_GRADS = {"column": "column_grads", "row": "row_grads"}
P_UNEVEN = "uneven"


def uneven_sizes(world_size: int) -> dict[str, int]:
    """Feature counts that do not split over ``world_size`` ranks (column, column with 3 chunks, row)."""
    return {"column": 2 * world_size + 1, "column_chunks3": 3 * (2 * world_size + 1), "row": 2 * world_size + 1}


SWAPS = [
    Swap("tensor_parallel.layers", "copy_to_parallel_region", lambda: ref.gathered_copy,
         "5.1 column/row criteria are judged apart from the student's CopyToParallelRegion"),
    Swap("tensor_parallel.layers", "reduce_from_parallel_region", lambda: ref.gathered_reduce,
         "5.1 column/row criteria are judged apart from the student's ReduceFromParallelRegion"),
]


# ---------------------------------------------------------------- probe
def _count_collectives(dist) -> dict[str, int]:
    """Wrap torch.distributed's collectives (before the student module binds any) to count calls by name."""
    counts = {name: 0 for name in COLLECTIVES}
    for name in COLLECTIVES:
        real = getattr(dist, name, None)
        if real is None:
            continue

        def counting(*args, _real=real, _name=name, **kwargs):
            counts[_name] += 1
            return _real(*args, **kwargs)
        setattr(dist, name, counting)
    return counts


def join_group(ctx, split: str, group_ranks: tuple[int, ...]) -> tuple[object, list[int]]:
    """``(group, members)``: the default group (``group_ranks`` empty), or a subgroup of ``group_ranks``.

    Every rank must call it (creating a group is collective). Rank 0 records
    the members (part ``split_part(P_GROUP, split)``), so the criteria know
    which ranks hold results and each one's rank in the group (its index in
    ``members``).
    """
    import torch.distributed as dist

    members = list(group_ranks) if group_ranks else list(range(ctx.world_size))
    group = dist.new_group(members) if group_ranks else None
    if ctx.rank == 0:
        ctx.record(split_part(P_GROUP, split), lambda: members)
    return group, members


def probe_layers(ctx) -> None:
    """Functions alone, the student's MLP with communication counts, then the layers on grader stand-ins.

    Each split's group is joined first (every rank takes part); a rank outside
    a split's group records nothing for it.
    """
    import torch.distributed as dist

    counts = _count_collectives(dist)
    from tensor_parallel import layers

    joined = {split: join_group(ctx, split, PROBLEM.rank_inputs(ctx, split).group_ranks)
              for split in PROBLEM.splits(ctx)}
    mine = {split: (group, members.index(ctx.rank), len(members))
            for split, (group, members) in joined.items() if ctx.rank in members}
    for split, (group, rank, _) in mine.items():
        _record_own_functions(ctx, split, layers, counts, group, rank)
    apply(SWAPS)     # the layers from here on call the grader's all-gather stand-ins
    for split, (group, rank, world) in mine.items():
        _record_layers(ctx, split, layers, group, rank, world)


def _record_own_functions(ctx, split: str, layers, counts: dict, group, rank: int) -> None:
    """The student's region functions alone, and the collectives of the student's column -> row MLP."""
    import torch
    import torch.nn.functional as F

    scale = float(rank + 1)

    def region_functions():
        out = {}
        for name, fn in (("copy", layers.copy_to_parallel_region), ("reduce", layers.reduce_from_parallel_region)):
            x = (ref.data("x", ref.IN_FEATURES) * scale).requires_grad_()
            y = fn(x, group)
            y.backward(ref.data("g_mlp", ref.IN_FEATURES) * (scale + 1))
            out[name] = {"out": y.detach(), "input_grad": x.grad, "x_unchanged": bool(
                torch.equal(x.detach(), ref.data("x", ref.IN_FEATURES) * scale))}
        return out
    ctx.record(split_part(P_REGION_FUNCTIONS, split), region_functions)

    def mlp_comm():
        column = layers.ColumnParallelLinear.from_linear(ref.column_linear(), group)
        row = layers.RowParallelLinear.from_linear(ref.row_linear(), group)
        x = ref.data("x", ref.IN_FEATURES).requires_grad_()
        before = dict(counts)
        out = row(F.gelu(column(x)))
        forward = {k: counts[k] - before[k] for k in counts if counts[k] != before[k]}
        before = dict(counts)
        (out * ref.data("g_row", ref.OUT_FEATURES)).sum().backward()
        backward = {k: counts[k] - before[k] for k in counts if counts[k] != before[k]}
        return {"forward": forward, "backward": backward}
    ctx.record(split_part(P_MLP_COMM, split), mlp_comm)


def _record_layers(ctx, split: str, layers, group, rank: int, world: int) -> None:
    """Column/row outputs and gradients (on the grader's region functions), and the uneven-split refusals."""
    def run_layer(kind: str) -> tuple:
        """Build the layer and run its forward: (layer, input, output); kept for the backward part."""
        if kind == "column":
            layer = layers.ColumnParallelLinear.from_linear(ref.column_linear(), group)
            x = ref.data("x", ref.IN_FEATURES).requires_grad_()
        else:
            layer = layers.RowParallelLinear.from_linear(ref.row_linear(), group)
            x = ref.rank_slice(ref.data("h", ref.HIDDEN), rank, world).clone().requires_grad_()
        state[kind] = (layer, x, layer(x))
        return state[kind]

    def backward(kind: str) -> dict:
        layer, x, out = state[kind] if kind in state else run_layer(kind)   # re-raises the forward's error
        upstream = (ref.rank_slice(ref.data("g_col", ref.HIDDEN), rank, world) if kind == "column"
                    else ref.data("g_row", ref.OUT_FEATURES))
        (out * upstream).sum().backward()
        return {"weight": layer.weight.grad, "bias": layer.bias.grad, "input": x.grad}

    state: dict = {}
    for kind in ("column", "row"):     # output and gradients recorded apart: a backward bug costs only gradients
        ctx.record(split_part(P_OUT[kind], split), lambda kind=kind: run_layer(kind)[2].detach())
        ctx.record(split_part(P_GRADS[kind], split), lambda kind=kind: backward(kind))

    def uneven():
        sizes = uneven_sizes(world)

        def outcome(fn) -> str:
            return call_outcome(fn, message=True)
        return {
            "even": outcome(lambda: [layers.ColumnParallelLinear.from_linear(ref.column_linear(), group),
                                     layers.ColumnParallelLinear.from_linear(ref.make_linear(4, 6 * world, 1), group,
                                                                             chunks=3),
                                     layers.RowParallelLinear.from_linear(ref.row_linear(), group)]),
            "column": outcome(lambda: layers.ColumnParallelLinear.from_linear(
                ref.make_linear(4, sizes["column"], 1), group)),
            "column_chunks3": outcome(lambda: layers.ColumnParallelLinear.from_linear(
                ref.make_linear(4, sizes["column_chunks3"], 1), group, chunks=3)),
            "row": outcome(lambda: layers.RowParallelLinear.from_linear(ref.make_linear(sizes["row"], 4, 1), group)),
        }
    ctx.record(split_part(P_UNEVEN, split), uneven)


CASE = PROBLEM.case("p5_layers", probe_layers, world_size=2, init_group=True, timeout_s=90)


# ---------------------------------------------------------------- criteria
def group_members(run: CaseRun, split: str) -> list[tuple[int, int, str]]:
    """``(group rank, process rank, label)`` of every rank in the probe's group of ``split``."""
    members = run.part(split_part(P_GROUP, split), 0)
    whole = members == list(range(run.world_size))
    return [(index, rank, f"rank {rank}" if whole else f"rank {rank} (rank {index} of the group {members})")
            for index, rank in enumerate(members)]


def _layer(run: CaseRun, name: str, split: str, rank: int) -> dict:
    got = run.part(split_part(name, split), rank)
    expect(isinstance(got, dict), f"rank {rank}: {name} results missing ({describe(got)})")
    return got


@CASE.criterion("5.1.region_functions", "copy_to (identity / all-reduce grad), reduce_from (all-reduce / "
                "identity)", points=3)
def check_region_functions(run: CaseRun, split: str) -> None:
    """copy_to: identity forward, summed gradient; reduce_from: summed forward, identity backward; input kept."""
    members = group_members(run, split)
    x = [ref.data("x", ref.IN_FEATURES) * (index + 1) for index, _, _ in members]
    g = [ref.data("g_mlp", ref.IN_FEATURES) * (index + 2) for index, _, _ in members]
    for index, rank, who in members:
        got = _layer(run, P_REGION_FUNCTIONS, split, rank)
        copy, reduce = got["copy"], got["reduce"]
        assert_tensor_close(f"copy_to_parallel_region: {who} forward (must be the input itself)", copy["out"],
                            x[index], atol=0, rtol=0)
        assert_tensor_close(f"copy_to_parallel_region: {who} backward (must be the sum of every rank's "
                            "gradient)", copy["input_grad"], sum(g), atol=ATOL, rtol=RTOL)
        assert_tensor_close(f"reduce_from_parallel_region: {who} forward (must be the sum over the ranks)",
                            reduce["out"], sum(x), atol=ATOL, rtol=RTOL)
        assert_tensor_close(f"reduce_from_parallel_region: {who} backward (must be the incoming gradient "
                            "unchanged)", reduce["input_grad"], g[index], atol=0, rtol=0)
        expect(copy["x_unchanged"] and reduce["x_unchanged"], f"{who}: a parallel-region function changed "
               "its input tensor in place (all-reduce a copy)")


@CASE.criterion("5.1.column_forward", "ColumnParallelLinear output is the rank's slice of the full layer's",
                points=3)
def check_column_forward(run: CaseRun, split: str) -> None:
    """Each rank's ColumnParallelLinear output is its slice of the full layer's output."""
    full, members = ref.serial_column()["out"], group_members(run, split)
    for index, rank, who in members:
        assert_tensor_close(f"ColumnParallelLinear: {who} output (its slice of the full layer's output)",
                            run.part(split_part(P_OUT["column"], split), rank),
                            ref.rank_slice(full, index, len(members)), atol=ATOL, rtol=RTOL)


@CASE.criterion("5.1.row_forward", "RowParallelLinear output equals the full layer's (bias added once)",
                points=3)
def check_row_forward(run: CaseRun, split: str) -> None:
    """Every rank's RowParallelLinear output is the full layer's output (bias added once)."""
    full = ref.serial_row()["out"]
    for _, rank, who in group_members(run, split):
        assert_tensor_close(f"RowParallelLinear: {who} output (the full layer's output, bias added once)",
                            run.part(split_part(P_OUT["row"], split), rank), full, atol=ATOL, rtol=RTOL)


@CASE.criterion("5.1.weight_grads", "each rank's weight/bias gradient is its slice of the serial gradient",
                points=3)
def check_weight_grads(run: CaseRun, split: str) -> None:
    """Each rank's weight/bias gradients are its slice of the full layer's (row bias: the whole one)."""
    members = group_members(run, split)
    world = len(members)
    column, row = ref.serial_column(), ref.serial_row()
    for index, rank, who in members:
        got = _layer(run, P_GRADS["column"], split, rank)
        for name in ("weight", "bias"):
            assert_tensor_close(f"ColumnParallelLinear: {who} gradient of {name} (the matching rows of the "
                                "full layer's gradient)", got[name], ref.rank_slice(column[name], index, world, dim=0),
                                atol=ATOL, rtol=RTOL)
        got = _layer(run, P_GRADS["row"], split, rank)
        assert_tensor_close(f"RowParallelLinear: {who} gradient of weight (the matching columns of the full "
                            "layer's gradient)", got["weight"], ref.rank_slice(row["weight"], index, world, dim=1),
                            atol=ATOL, rtol=RTOL)
        assert_tensor_close(f"RowParallelLinear: {who} gradient of bias (the full layer's bias gradient)",
                            got["bias"], row["bias"], atol=ATOL, rtol=RTOL)


@CASE.criterion("5.1.input_grads", "input gradients equal the serial ones", points=3)
def check_input_grads(run: CaseRun, split: str) -> None:
    """Column: every rank's input gradient is the full one; row: the matching slice of the full one."""
    members = group_members(run, split)
    column, row = ref.serial_column(), ref.serial_row()
    for index, rank, who in members:
        assert_tensor_close(f"ColumnParallelLinear: {who} gradient of the input (the full layer's: every "
                            "rank's part summed)", _layer(run, P_GRADS["column"], split, rank)["input"],
                            column["input"], atol=ATOL, rtol=RTOL)
        assert_tensor_close(f"RowParallelLinear: {who} gradient of its input slice (the matching slice of "
                            "the full layer's)", _layer(run, P_GRADS["row"], split, rank)["input"],
                            ref.rank_slice(row["input"], index, len(members)), atol=ATOL, rtol=RTOL)


@CASE.criterion("5.1.comm_counts", "column -> row MLP: one all-reduce forward, one backward", points=2)
def check_comm_counts(run: CaseRun, split: str) -> None:
    """The student's column -> row MLP makes exactly one all_reduce forward and one backward."""
    for _, rank, who in group_members(run, split):
        got = _layer(run, P_MLP_COMM, split, rank)
        for phase in ("forward", "backward"):
            calls = got[phase]
            expect(calls == {"all_reduce": 1}, f"column -> row MLP: {who} made {calls or 'no collective calls'}"
                   f" in the {phase} pass; expected exactly one all_reduce and no other collective")


@CASE.criterion("5.1.uneven_split", "uneven splits raise ValueError naming the sizes", points=1)
def check_uneven_split(run: CaseRun, split: str) -> None:
    """from_linear on sizes that do not split raises ValueError naming them; even sizes are accepted."""
    members = group_members(run, split)
    world = len(members)
    sizes = uneven_sizes(world)
    got = _layer(run, P_UNEVEN, split, members[0][1])
    expect(got["even"] == "no exception", f"from_linear on sizes that split over {world} ranks raised: "
           f"{got['even']}")
    for key, label in (("column", f"ColumnParallelLinear.from_linear(Linear(4, {sizes['column']}))"),
                       ("column_chunks3", f"ColumnParallelLinear.from_linear(Linear(4, {sizes['column_chunks3']}), "
                                          "chunks=3)"),
                       ("row", f"RowParallelLinear.from_linear(Linear({sizes['row']}, 4))")):
        outcome = got[key]
        expect(outcome.startswith("ValueError"), f"{label} on {world} ranks must raise ValueError, got {outcome}")
        expect(str(sizes[key]) in outcome and str(world) in outcome, f"{label}: the ValueError must name the sizes "
               f"({sizes[key]} features, {world} ranks); its message was: {outcome}")

