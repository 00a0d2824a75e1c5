"""Buggy variants of 5.1 (staff only, never released): each loses exactly the criteria it names and breaks the
clauses it names."""
from __future__ import annotations

from grading.kit.variants import Clause, Variant, edited

LAYERS = "tensor_parallel/layers.py"

# Variants of from_linear are mostly the reference with targeted edits (``edited``: each old text must occur once),
# some keeping the shorter messages they were written with as named swaps beside their bug; variants of the
# one-to-three-line regions are whole bodies.
_COLUMN_ERROR = """raise ValueError(f"ColumnParallelLinear: {out_features} output features in {chunks} chunk(s) do not "
                             f"split evenly over {world_size} ranks")"""
_ROW_ERROR = """raise ValueError(f"RowParallelLinear: {in_features} input features do not split evenly over "
                             f"{world_size} ranks")"""
_SHORT_ROW_ERROR = (_ROW_ERROR, 'raise ValueError(f"{in_features} input features, {world_size} ranks")')

# layers.py has several regions in methods of the same name, so a variant names its region as "function#k":
# forward#0 / backward#0: CopyToParallelRegion; forward#1 / backward#1: ReduceFromParallelRegion;
# from_linear#0, forward#2: ColumnParallelLinear; from_linear#1, forward#3: RowParallelLinear.
VARIANTS = [
    Variant("copy_backward_without_all_reduce", LAYERS, "backward#0", """
        return grad, None
    """, frozenset({"5.1.region_functions", "5.1.comm_counts", "5.1.region_functions_hidden"}),
        hint="likely cause: the backward of copy_to_parallel_region returns this rank's gradient without the "
             "all-reduce",
        breaks=(
            Clause("502", "CopyToParallelRegion", "forward identity, backward the sum over the ranks of the gradient",
                   "5.1.region_functions"),
            Clause("503", "CopyToParallelRegion / ReduceFromParallelRegion",
                   "one all-reduce (SUM) each, f in the backward and g in the forward; no other communication",
                   "5.1.comm_counts"))),
    Variant("reduce_forward_in_place", LAYERS, "forward#1", """
        dist.all_reduce(x, op=dist.ReduceOp.SUM, group=group)
        return x
    """, frozenset({"5.1.region_functions", "5.1.region_functions_hidden"}),
        breaks=(Clause("506", "ReduceFromParallelRegion.forward",
                       "the sum over the ranks as a new tensor; the caller's `x` unchanged", "5.1.region_functions"),)),
    Variant("column_forward_skips_copy", LAYERS, "forward#2", """
        return F.linear(x, self.weight, self.bias)
    """, frozenset({"5.1.input_grads", "5.1.comm_counts", "5.1.input_grads_hidden"}),
        breaks=(
            Clause("518", "ColumnParallelLinear.forward", "`x` through copy_to_parallel_region(x, self.group) first: "
                   "its gradient is summed over the ranks", "5.1.input_grads"),
            Clause("521", "layers (module)", "column followed by row: one all-reduce forward, one backward, none in "
                   "between", "5.1.comm_counts"))),
    Variant("row_bias_on_every_rank", LAYERS, "forward#3", """
        return reduce_from_parallel_region(F.linear(x, self.weight, self.bias), self.group)
    """, frozenset({"5.1.row_forward", "5.1.row_forward_hidden"}),
        hint="likely cause: the bias added on every rank before the all-reduce (counted 2 times)",
        breaks=(Clause("519", "RowParallelLinear / .forward", "whole bias on every rank, added once after the "
                       "all-reduce (the full output on every rank)", "5.1.row_forward"),)),
    Variant("row_bias_split_over_ranks", LAYERS, "forward#3", """
        share = self.bias / dist.get_world_size(self.group) if self.bias is not None else None
        return reduce_from_parallel_region(F.linear(x, self.weight, share), self.group)
    """, frozenset({"5.1.weight_grads"}), hint="likely cause: bias / 2 added on every rank before the all-reduce",
        breaks=(Clause("520", "RowParallelLinear", "every rank holds the whole bias: its gradient is the full layer's "
                       "(`bias / N` added on every rank before the sum gives the same output, 1/N of the gradient: "
                       "the message names it)", "5.1.weight_grads"),)),
    Variant("column_slice_of_wrong_rank", LAYERS, "from_linear#0", """
        out_features = linear.out_features
        if chunks < 1 or out_features % (chunks * world_size):
            raise ValueError(f"{out_features} output features, {chunks} chunks, {world_size} ranks")
        block, part = out_features // chunks, out_features // (chunks * world_size)
        mine = world_size - 1 - rank
        rows = torch.cat([torch.arange(k * block + mine * part, k * block + (mine + 1) * part)
                          for k in range(chunks)])
        with torch.no_grad():
            weight = linear.weight[rows].clone()
            bias = linear.bias[rows].clone() if linear.bias is not None else None
        return cls(weight, bias, group)
    """, frozenset({"5.1.column_forward", "5.1.input_grads", "5.1.column_forward_hidden", "5.1.input_grads_hidden",
                    "5.1.column_chunks", "5.1.column_chunks_hidden"}),
        hint="likely cause: rank 0 of the group took the rows of rank 1",
        breaks=(
            Clause("508", "ColumnParallelLinear.from_linear",
                   "chunks 1: rank r keeps rows [r*O/N, (r+1)*O/N) of the weight and bias", "5.1.column_forward"),
            Clause("517", "ColumnParallelLinear.forward", "(..., in) -> (..., out/N): this rank's slice of x W^T + b",
                   "5.1.column_forward"))),
    Variant("row_uneven_split_accepted", LAYERS, "from_linear#1", """
        part = linear.in_features // world_size
        with torch.no_grad():
            weight = linear.weight[:, rank * part:(rank + 1) * part].clone()
            bias = linear.bias.clone() if linear.bias is not None else None
        return cls(weight, bias, group)
    """, frozenset({"5.1.uneven_split"}),
        breaks=(Clause("516", "RowParallelLinear.from_linear", "I not divisible by N: ValueError naming I and N",
                       "5.1.uneven_split"),)),
    Variant("copy_backward_ignores_group", LAYERS, "backward#0", """
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        return grad, None
    """, frozenset({"5.1.region_functions_hidden"}),
        hint="dist.all_reduce was called on the ranks [0, 1, 2, 3] (no group, or another one)",
        breaks=(Clause("504", "CopyToParallelRegion.forward", "remember `group` on ctx: the backward reduces over "
                       "`ctx.group` (r, N of the group, not of the world)", "5.1.region_functions_hidden"),)),
    Variant("column_forward_ignores_group", LAYERS, "forward#2", """
        return F.linear(copy_to_parallel_region(x), self.weight, self.bias)
    """, frozenset({"5.1.input_grads_hidden"}), hint="was called on the ranks [0, 1, 2, 3] (no group, or another one)",
        breaks=(Clause("518b", "ColumnParallelLinear.forward", "... over `self.group`", "5.1.input_grads_hidden"),)),
    Variant("copy_forward_clones", LAYERS, "forward#0", """
        ctx.group = group
        return x.clone()
    """, frozenset({"5.1.copy_forward_view"}),
        breaks=(Clause("501", "CopyToParallelRegion.forward",
                       "returns `x` unchanged, a view sharing its memory (no copy)", "5.1.copy_forward_view"),)),
    Variant("reduce_backward_all_reduces", LAYERS, "backward#1", """
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad, None
    """, frozenset({"5.1.region_functions", "5.1.comm_counts", "5.1.region_functions_hidden"}),
        also=((LAYERS, "forward#1", """
        ctx.group = group
        out = x.contiguous().clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
        return out
    """),),
        breaks=(
            Clause("507", "ReduceFromParallelRegion.backward", "the incoming gradient unchanged, no communication",
                   "5.1.region_functions"),
            Clause("507b", "ReduceFromParallelRegion.backward", "no communication in the backward of g",
                   "5.1.comm_counts"))),
    Variant("copy_backward_reduces_grad_in_place", LAYERS, "backward#0", """
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad, None
    """, frozenset({"5.1.grad_kept"}),
        breaks=(Clause("505", "CopyToParallelRegion.backward",
                       "reduce a copy, never `grad` itself: the caller's gradient comes out unchanged",
                       "5.1.grad_kept"),)),
    Variant("column_chunks_ignored", LAYERS, "from_linear#0", """
        out_features = linear.out_features
        if chunks < 1 or out_features % (chunks * world_size):
            raise ValueError(f"{out_features} output features, {chunks} chunks, {world_size} ranks")
        part = out_features // world_size
        with torch.no_grad():
            weight = linear.weight[rank * part:(rank + 1) * part].clone()
            bias = linear.bias[rank * part:(rank + 1) * part].clone() if linear.bias is not None else None
        return cls(weight, bias, group)
    """, frozenset({"5.1.column_chunks", "5.1.column_chunks_hidden"}), hint="likely cause: chunks ignored",
        breaks=(Clause("509", "ColumnParallelLinear.from_linear", "chunks c > 1: rank r's slice of every one of the c "
                       "blocks, in block order (public c = 3, hidden 2 or 4)", "5.1.column_chunks"),)),
    Variant("column_weight_view", LAYERS, "from_linear#0", """
        out_features = linear.out_features
        if chunks < 1 or out_features % (chunks * world_size):
            raise ValueError(f"{out_features} output features, {chunks} chunks, {world_size} ranks")
        block, part = out_features // chunks, out_features // (chunks * world_size)
        starts = [k * block + rank * part for k in range(chunks)]
        weights = [linear.weight.detach()[s:s + part] for s in starts]
        weight = weights[0] if chunks == 1 else torch.cat(weights)     # one piece: no need to copy (wrong)
        bias = torch.cat([linear.bias.detach()[s:s + part] for s in starts]) if linear.bias is not None else None
        return cls(weight, bias, group)
    """, frozenset({"5.1.shard_copies"}),
        breaks=(Clause("510", "ColumnParallelLinear.from_linear", "copies (clone): linear unchanged, no memory shared "
                       "(an in-place change of the shard leaves linear as it was)", "5.1.shard_copies"),)),
    Variant("row_shares_source_bias", LAYERS, "from_linear#1", edited(LAYERS, "from_linear#1", _SHORT_ROW_ERROR, (
        "            bias = linear.bias.clone() if linear.bias is not None else None\n", ""), (
        "cls(weight, bias, group)", "cls(weight, linear.bias, group)")), frozenset({"5.1.shard_copies"}),
        breaks=(Clause("510b", "RowParallelLinear.from_linear",
                       "a copy of the whole bias, sharing no memory with linear", "5.1.shard_copies"),)),
    Variant("shards_in_new_float32_cpu_tensors", LAYERS, "from_linear#0", """
        out_features = linear.out_features
        if chunks < 1 or out_features % (chunks * world_size):
            raise ValueError(f"{out_features} output features, {chunks} chunks, {world_size} ranks")
        block, part = out_features // chunks, out_features // (chunks * world_size)
        rows = [k * block + rank * part + i for k in range(chunks) for i in range(part)]
        weight = torch.zeros(len(rows), linear.in_features)
        bias = torch.zeros(len(rows)) if linear.bias is not None else None
        with torch.no_grad():
            for i, row in enumerate(rows):
                weight[i] = linear.weight[row]
                if bias is not None:
                    bias[i] = linear.bias[row]
        return cls(weight, bias, group)
    """, frozenset({"5.1.shard_dtype_device"}),
        breaks=(Clause("511", "ColumnParallelLinear.from_linear", "the shards keep linear's dtype and device (float64 "
                       "and 'meta' sources on CPU; CUDA in gpu_check.sh)", "5.1.shard_dtype_device"),)),
    Variant("shard_trainability_copied", LAYERS, "from_linear#1", edited(LAYERS, "from_linear#1", _SHORT_ROW_ERROR, (
        "return cls(weight, bias, group)", """layer = cls(weight, bias, group)
        return layer.requires_grad_(linear.weight.requires_grad)     # "keep it frozen if it was" (wrong)""")),
        frozenset({"5.1.shard_dtype_device"}),
        breaks=(Clause("512", "RowParallelLinear.from_linear",
                       "the shards are new parameters that require grad, whatever linear's do",
                       "5.1.shard_dtype_device"),)),
    Variant("row_bias_assumed", LAYERS, "from_linear#1", edited(LAYERS, "from_linear#1", _SHORT_ROW_ERROR, (
        "linear.bias.clone() if linear.bias is not None else None", "linear.bias.clone()")),
        frozenset({"5.1.no_bias"}),
        breaks=(Clause("513", "RowParallelLinear.from_linear",
                       "a layer without bias gives `bias=None` (and a forward without bias)", "5.1.no_bias"),)),
    Variant("chunks_not_validated", LAYERS, "from_linear#0", edited(LAYERS, "from_linear#0", (
        "if chunks < 1 or out_features", "if out_features"), (
        _COLUMN_ERROR, 'raise ValueError(f"{out_features} output features, {chunks} chunks, {world_size} ranks")')),
        frozenset({"5.1.bad_chunks"}),
        breaks=(Clause("514", "ColumnParallelLinear.from_linear", "chunks < 1 raises ValueError", "5.1.bad_chunks"),)),
    Variant("column_error_omits_chunks", LAYERS, "from_linear#0", edited(LAYERS, "from_linear#0", (
        _COLUMN_ERROR, """raise ValueError(f"ColumnParallelLinear: {out_features} output features do not split over "
                             f"{world_size} ranks")""")), frozenset({"5.1.uneven_split"}),
        breaks=(Clause("515", "ColumnParallelLinear.from_linear",
                       "O not divisible by c*N: ValueError naming O, c and N", "5.1.uneven_split"),)),
    Variant("copy_backward_returns_grad_only", LAYERS, "backward#0", """
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad
    """, frozenset({"5.1.region_functions", "5.1.comm_counts", "5.1.copy_forward_view", "5.1.grad_kept",
                    "5.1.region_functions_hidden"}),       # torch itself refuses it; every backward through f fails
        hint="returned an incorrect number of gradients (expected 2, got 1)",
        breaks=(Clause("521c", "CopyToParallelRegion.backward", "returns `(grad, None)`: one gradient per input "
                       "(torch's own message names the count that came back)", "5.1.region_functions"),)),
    Variant("reduce_forward_returns_all_reduce_result", LAYERS, "forward#1", """
        out = x.contiguous().clone()
        return dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    """, frozenset({"5.1.region_functions", "5.1.comm_counts", "5.1.region_functions_hidden"}),
        hint="ReduceFromParallelRegion.forward returned NoneType, expected a tensor",
        breaks=(Clause("521f", "ReduceFromParallelRegion.forward", "returns the sum as a tensor, not "
                       "`dist.all_reduce`'s None (the message names what came back)", "5.1.region_functions"),)),
    Variant("column_forward_returns_nothing", LAYERS, "forward#2", """
        F.linear(copy_to_parallel_region(x, self.group), self.weight, self.bias)
    """, frozenset({"5.1.column_forward", "5.1.weight_grads", "5.1.input_grads", "5.1.comm_counts",
                    "5.1.column_chunks", "5.1.no_bias", "5.1.column_forward_hidden", "5.1.input_grads_hidden",
                    "5.1.column_chunks_hidden"}),
        hint="ColumnParallelLinear.forward returned NoneType, expected a tensor",
        breaks=(Clause("521e", "ColumnParallelLinear.forward",
                       "returns a tensor (..., out/N), not None (the message names what came back)",
                       "5.1.column_forward"),)),
    Variant("column_from_linear_returns_shards", LAYERS, "from_linear#0", edited(LAYERS, "from_linear#0", (
        "return cls(weight, bias, group)", "return weight, bias")),
        frozenset({"5.1.column_forward", "5.1.weight_grads", "5.1.input_grads", "5.1.comm_counts", "5.1.column_chunks",
                   "5.1.shard_copies", "5.1.shard_dtype_device", "5.1.no_bias", "5.1.column_forward_hidden",
                   "5.1.input_grads_hidden", "5.1.column_chunks_hidden"}),
        hint="ColumnParallelLinear.from_linear returned tuple of tensor",
        breaks=(Clause("521d", "ColumnParallelLinear.from_linear", "returns a `ColumnParallelLinear` (`cls(...)`), not "
                       "the shard tensors (the message names what came back)", "5.1.column_forward"),)),
    Variant("row_from_linear_returns_shards", LAYERS, "from_linear#1", edited(LAYERS, "from_linear#1", (
        "return cls(weight, bias, group)", "return weight, bias")),
        frozenset({"5.1.row_forward", "5.1.weight_grads", "5.1.input_grads", "5.1.comm_counts", "5.1.shard_copies",
                   "5.1.shard_dtype_device", "5.1.no_bias", "5.1.row_forward_hidden", "5.1.input_grads_hidden"}),
        hint="RowParallelLinear.from_linear returned tuple of tensor",   # every use of the layer breaks
        breaks=(Clause("521b", "RowParallelLinear.from_linear", "returns a `RowParallelLinear` made by "
                       "`cls(weight, bias, group)`, not the shard tensors (the message names what came back; every "
                       "use of the layer fails)", "5.1.row_forward"),)),
]

NOT_GRADED = """
"reduce a contiguous copy" in both region functions (gloo, the CPU grader's backend, accepts non-contiguous tensors;
NCCL refuses them, so `scripts/gpu_check.sh` part `tensor_parallel_nccl_contiguous` feeds non-contiguous inputs and
gradients through f and g on a 1-rank NCCL group, and checks that a CUDA layer's shards stay on CUDA);
`rank_and_size`, the two wrapper functions, the constructors and `extra_repr` (provided code).
Return kinds (rows 521b-521f): one probe check per kind (`built` for `from_linear`, `forwarded` for both layers'
`forward`, the region functions' tensor), each naming what came back; `RowParallelLinear.forward` shares
`ColumnParallelLinear.forward`'s check (shape judged by 5.1.row_forward), and `CopyToParallelRegion.forward`
shares `ReduceFromParallelRegion.forward`'s (its view is judged by 5.1.copy_forward_view); the two `backward`
methods' return kinds are enforced by torch itself (a backward returning `grad` alone instead of `(grad, None)`
raises torch's "returned an incorrect number of gradients (expected 2, got 1)", which becomes the criterion's
message: row 521c).
Dropped from the contracts as not needed: "Return a view, not `x` itself" (autograd turns a returned input into
a view itself: both behave the same) and "before building anything" in `from_linear` (building a layer before
raising has no observable effect).
"""
