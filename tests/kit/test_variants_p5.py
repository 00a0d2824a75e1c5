"""Problem 5 buggy variants: each bug loses exactly its intended criteria; the starter loses every criterion.

Variants of ``from_linear`` and ``parallelize_block`` are mostly the reference with targeted edits (``edited``: each
old text must occur once), some keeping the shorter messages or size check they were written with as named swaps
beside their bug; variants of the one-to-three-line regions are whole bodies.

``tensor_parallel/layers.py`` has several regions in methods of the same name
(``forward``, ``backward``, ``from_linear``), so a variant names its region
as ``"function#k"``: the k-th region (0-based, in file order) inside a
function of that name.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from grading.problems import all_cases
from common.regions import parse_regions
from grading.kit.splice import replace_bodies, stub_body
from grading.engine.runner import run_cases
from tests.kit.variants import Variant, assert_verdicts, edited, make_variant_kit

LAYERS, GPT2 = "tensor_parallel/layers.py", "tensor_parallel/gpt2.py"
CASES = all_cases(("5",))

_COLUMN_ERROR = """raise ValueError(f"ColumnParallelLinear: {out_features} output features in {chunks} chunk(s) do not "
                             f"split evenly over {world_size} ranks")"""
_ROW_ERROR = """raise ValueError(f"RowParallelLinear: {in_features} input features do not split evenly over "
                             f"{world_size} ranks")"""
_SHORT_ROW_ERROR = (_ROW_ERROR, 'raise ValueError(f"{in_features} input features, {world_size} ranks")')
_SIZE_CHECKS = """    inner = mlp.c_fc.weight.shape[1] if not isinstance(mlp.c_fc, nn.Linear) else mlp.c_fc.out_features
    for what, size in (("attention heads", heads), ("MLP inner size", inner)):
        if size % world_size:
            raise ValueError(f"parallelize_block: {size} {what} do not split evenly over {world_size} ranks")
"""
_ATTN_SIZES = """attn.split_size = embed // world_size
    attn.num_heads = heads // world_size
    attn.embed_dim = embed // world_size"""
# Most parallelize_block variants read the inner size from GPT-2's Conv1D only (it is checked before
# conv1d_to_linear), with a shorter message, and set the attention's sizes in one line.
_CONV1D_SIZE_CHECKS = (
    _SIZE_CHECKS, """    for what, size in (("attention heads", heads), ("MLP inner size", mlp.c_fc.weight.shape[1])):
        if size % world_size:
            raise ValueError(f"{size} {what} do not split over {world_size} ranks")
""")
_ONE_LINE_SIZES = (_ATTN_SIZES, "attn.split_size, attn.num_heads, attn.embed_dim = "
                                "embed // world_size, heads // world_size, embed // world_size")

# forward#0 / backward#0: CopyToParallelRegion; forward#1 / backward#1: ReduceFromParallelRegion;
# from_linear#0, forward#2: ColumnParallelLinear; from_linear#1, forward#3: RowParallelLinear.
VARIANTS = [
    Variant("copy_backward_without_all_reduce", LAYERS, "backward#0", """
        return grad, None
    """, frozenset({"5.1.region_functions", "5.1.comm_counts", "5.1.region_functions_hidden"}),
        hint="likely cause: the backward of copy_to_parallel_region returns this rank's gradient without the "
             "all-reduce"),
    Variant("reduce_forward_in_place", LAYERS, "forward#1", """
        dist.all_reduce(x, op=dist.ReduceOp.SUM, group=group)
        return x
    """, frozenset({"5.1.region_functions", "5.1.region_functions_hidden"})),
    Variant("column_forward_skips_copy", LAYERS, "forward#2", """
        return F.linear(x, self.weight, self.bias)
    """, frozenset({"5.1.input_grads", "5.1.comm_counts", "5.1.input_grads_hidden"})),
    Variant("row_bias_on_every_rank", LAYERS, "forward#3", """
        return reduce_from_parallel_region(F.linear(x, self.weight, self.bias), self.group)
    """, frozenset({"5.1.row_forward", "5.1.row_forward_hidden"}),
        hint="likely cause: the bias added on every rank before the all-reduce (counted 2 times)"),
    Variant("row_bias_split_over_ranks", LAYERS, "forward#3", """
        share = self.bias / dist.get_world_size(self.group) if self.bias is not None else None
        return reduce_from_parallel_region(F.linear(x, self.weight, share), self.group)
    """, frozenset({"5.1.weight_grads"}), hint="likely cause: bias / 2 added on every rank before the all-reduce"),
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
        hint="likely cause: rank 0 of the group took the rows of rank 1"),
    Variant("row_uneven_split_accepted", LAYERS, "from_linear#1", """
        part = linear.in_features // world_size
        with torch.no_grad():
            weight = linear.weight[:, rank * part:(rank + 1) * part].clone()
            bias = linear.bias.clone() if linear.bias is not None else None
        return cls(weight, bias, group)
    """, frozenset({"5.1.uneven_split"})),
    Variant("copy_backward_ignores_group", LAYERS, "backward#0", """
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        return grad, None
    """, frozenset({"5.1.region_functions_hidden"}),
        hint="dist.all_reduce was called on the ranks [0, 1, 2, 3] (no group, or another one)"),
    Variant("column_forward_ignores_group", LAYERS, "forward#2", """
        return F.linear(copy_to_parallel_region(x), self.weight, self.bias)
    """, frozenset({"5.1.input_grads_hidden"}), hint="was called on the ranks [0, 1, 2, 3] (no group, or another one)"),
    Variant("copy_forward_clones", LAYERS, "forward#0", """
        ctx.group = group
        return x.clone()
    """, frozenset({"5.1.copy_forward_view"})),
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
    """),)),
    Variant("copy_backward_reduces_grad_in_place", LAYERS, "backward#0", """
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad, None
    """, frozenset({"5.1.grad_kept"})),
    Variant("column_chunks_ignored", LAYERS, "from_linear#0", """
        out_features = linear.out_features
        if chunks < 1 or out_features % (chunks * world_size):
            raise ValueError(f"{out_features} output features, {chunks} chunks, {world_size} ranks")
        part = out_features // world_size
        with torch.no_grad():
            weight = linear.weight[rank * part:(rank + 1) * part].clone()
            bias = linear.bias[rank * part:(rank + 1) * part].clone() if linear.bias is not None else None
        return cls(weight, bias, group)
    """, frozenset({"5.1.column_chunks", "5.1.column_chunks_hidden"}), hint="likely cause: chunks ignored"),
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
    """, frozenset({"5.1.shard_copies"})),
    Variant("row_shares_source_bias", LAYERS, "from_linear#1", edited(LAYERS, "from_linear#1", _SHORT_ROW_ERROR, (
        "            bias = linear.bias.clone() if linear.bias is not None else None\n", ""), (
        "cls(weight, bias, group)", "cls(weight, linear.bias, group)")), frozenset({"5.1.shard_copies"})),
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
    """, frozenset({"5.1.shard_dtype_device"})),
    Variant("shard_trainability_copied", LAYERS, "from_linear#1", edited(LAYERS, "from_linear#1", _SHORT_ROW_ERROR, (
        "return cls(weight, bias, group)", """layer = cls(weight, bias, group)
        return layer.requires_grad_(linear.weight.requires_grad)     # "keep it frozen if it was" (wrong)""")),
        frozenset({"5.1.shard_dtype_device"})),
    Variant("row_bias_assumed", LAYERS, "from_linear#1", edited(LAYERS, "from_linear#1", _SHORT_ROW_ERROR, (
        "linear.bias.clone() if linear.bias is not None else None", "linear.bias.clone()")),
        frozenset({"5.1.no_bias"})),
    Variant("chunks_not_validated", LAYERS, "from_linear#0", edited(LAYERS, "from_linear#0", (
        "if chunks < 1 or out_features", "if out_features"), (
        _COLUMN_ERROR, 'raise ValueError(f"{out_features} output features, {chunks} chunks, {world_size} ranks")')),
        frozenset({"5.1.bad_chunks"})),
    Variant("column_error_omits_chunks", LAYERS, "from_linear#0", edited(LAYERS, "from_linear#0", (
        _COLUMN_ERROR, """raise ValueError(f"ColumnParallelLinear: {out_features} output features do not split over "
                             f"{world_size} ranks")""")), frozenset({"5.1.uneven_split"})),
    Variant("head_count_divided_as_float", GPT2, "parallelize_block", edited(GPT2, "parallelize_block", (
        "attn.num_heads = heads // world_size", "attn.num_heads = heads / world_size")),
        frozenset({"5.2.attention_sizes"})),
    Variant("qkv_split_ignoring_heads", GPT2, "parallelize_block", edited(
        GPT2, "parallelize_block", _CONV1D_SIZE_CHECKS, _ONE_LINE_SIZES, ("group, chunks=3)", "group)")),
        frozenset({"5.2.forward", "5.2.grads", "5.2.sgd_steps", "5.2.forward_hidden", "5.2.grads_hidden"}),
        hint="likely cause: the fused qkv weight was split as one matrix; split q, k and v each (chunks=3)"),
    Variant("mlp_left_whole", GPT2, "parallelize_block", edited(GPT2, "parallelize_block", _CONV1D_SIZE_CHECKS, (
        "    mlp.c_fc = ColumnParallelLinear.from_linear(mlp.c_fc, group)\n"
        "    mlp.c_proj = RowParallelLinear.from_linear(mlp.c_proj, group)\n", ""), _ONE_LINE_SIZES),
        frozenset({"5.2.grads", "5.2.sgd_steps", "5.2.param_bytes", "5.2.grads_hidden"})),
    Variant("group_not_passed_on", GPT2, "parallelize_block", edited(GPT2, "parallelize_block", _CONV1D_SIZE_CHECKS, (
        "(attn.c_attn, group, chunks=3)", "(attn.c_attn, chunks=3)"), ("(attn.c_proj, group)", "(attn.c_proj)"),
        ("(mlp.c_fc, group)", "(mlp.c_fc)"), ("(mlp.c_proj, group)", "(mlp.c_proj)"), _ONE_LINE_SIZES),
        frozenset({"5.2.forward_hidden", "5.2.grads_hidden"})),
    Variant("sizes_not_checked", GPT2, "parallelize_block", edited(
        GPT2, "parallelize_block", (_SIZE_CHECKS, ""), _ONE_LINE_SIZES), frozenset({"5.2.value_errors"})),
    Variant("inner_checked_after_attention_split", GPT2, "parallelize_block", """
        heads, embed = attn.num_heads, attn.embed_dim
        if heads % world_size:
            raise ValueError(f"{heads} attention heads do not split over {world_size} ranks")
        conv1d_to_linear(block)
        attn.c_attn = ColumnParallelLinear.from_linear(attn.c_attn, group, chunks=3)
        attn.c_proj = RowParallelLinear.from_linear(attn.c_proj, group)
        attn.split_size, attn.num_heads, attn.embed_dim = embed // world_size, heads // world_size, embed // world_size
        if mlp.c_fc.out_features % world_size:
            raise ValueError(f"{mlp.c_fc.out_features} MLP inner features do not split over {world_size} ranks")
        mlp.c_fc = ColumnParallelLinear.from_linear(mlp.c_fc, group)
        mlp.c_proj = RowParallelLinear.from_linear(mlp.c_proj, group)
        return block
    """, frozenset({"5.2.value_errors"})),
    Variant("returns_nothing", GPT2, "parallelize_block", edited(
        GPT2, "parallelize_block", _CONV1D_SIZE_CHECKS, _ONE_LINE_SIZES, ("    return block\n", "")),
        frozenset({"5.2.returns_block"}), hint="returned NoneType for blocks"),
    Variant("copy_backward_returns_grad_only", LAYERS, "backward#0", """
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad
    """, frozenset({"5.1.region_functions", "5.1.comm_counts", "5.1.copy_forward_view", "5.1.grad_kept",
                    "5.1.region_functions_hidden"}),       # torch itself refuses it; every backward through f fails
        hint="returned an incorrect number of gradients (expected 2, got 1)"),
    Variant("reduce_forward_returns_all_reduce_result", LAYERS, "forward#1", """
        out = x.contiguous().clone()
        return dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    """, frozenset({"5.1.region_functions", "5.1.comm_counts", "5.1.region_functions_hidden"}),
        hint="ReduceFromParallelRegion.forward returned NoneType, expected a tensor"),
    Variant("column_forward_returns_nothing", LAYERS, "forward#2", """
        F.linear(copy_to_parallel_region(x, self.group), self.weight, self.bias)
    """, frozenset({"5.1.column_forward", "5.1.weight_grads", "5.1.input_grads", "5.1.comm_counts",
                    "5.1.column_chunks", "5.1.no_bias", "5.1.column_forward_hidden", "5.1.input_grads_hidden",
                    "5.1.column_chunks_hidden"}),
        hint="ColumnParallelLinear.forward returned NoneType, expected a tensor"),
    Variant("column_from_linear_returns_shards", LAYERS, "from_linear#0", edited(LAYERS, "from_linear#0", (
        "return cls(weight, bias, group)", "return weight, bias")),
        frozenset({"5.1.column_forward", "5.1.weight_grads", "5.1.input_grads", "5.1.comm_counts", "5.1.column_chunks",
                   "5.1.shard_copies", "5.1.shard_dtype_device", "5.1.no_bias", "5.1.column_forward_hidden",
                   "5.1.input_grads_hidden", "5.1.column_chunks_hidden"}),
        hint="ColumnParallelLinear.from_linear returned tuple of tensor"),
    Variant("row_from_linear_returns_shards", LAYERS, "from_linear#1", edited(LAYERS, "from_linear#1", (
        "return cls(weight, bias, group)", "return weight, bias")),
        frozenset({"5.1.row_forward", "5.1.weight_grads", "5.1.input_grads", "5.1.comm_counts", "5.1.shard_copies",
                   "5.1.shard_dtype_device", "5.1.no_bias", "5.1.row_forward_hidden", "5.1.input_grads_hidden"}),
        hint="RowParallelLinear.from_linear returned tuple of tensor"),   # every use of the layer breaks
    Variant("only_split_size_set", GPT2, "parallelize_block", edited(GPT2, "parallelize_block", _CONV1D_SIZE_CHECKS, (
        _ATTN_SIZES,
        "attn.split_size = embed // world_size          # the forward only reads split_size and head_dim")),
        frozenset({"5.2.attention_sizes"})),
]


def edit_regions(kit: Path, path: str, bodies: dict[str, str]) -> None:
    """Replace, in ``kit/path``, the body of each region named ``"function#k"`` (or ``"*"``: every region)."""
    text = (kit / path).read_text()
    regions = parse_regions(text, path)
    new = {}
    for where, body in bodies.items():
        if where == "*":
            new.update({k: stub_body(r) for k, r in enumerate(regions)})
            continue
        function, _, nth = where.partition("#")
        matches = [k for k, r in enumerate(regions) if r.function == function]
        k = matches[int(nth or 0)]
        new[k] = textwrap.indent(textwrap.dedent(body).strip("\n") + "\n", regions[k].indent)
    (kit / path).write_text(replace_bodies(text, path, new))


def grade(kit: Path, problem: str, work: Path, servers) -> dict:
    return {v.id: v for v in run_cases(CASES, kit, work / "runs", problem=problem, servers=servers)}


# Variants in other regions whose criteria are disjoint share one graded kit (one spawn per case instead of one
# per variant); the union of their criteria must fail, and nothing else.
GROUPS = [
    ("copy_backward_without_all_reduce", "row_bias_on_every_rank", "column_slice_of_wrong_rank",
     "row_uneven_split_accepted", "copy_forward_clones"),
    ("reduce_forward_in_place", "column_forward_skips_copy", "row_bias_split_over_ranks", "row_shares_source_bias",
     "column_chunks_ignored", "copy_backward_reduces_grad_in_place"),
    ("shards_in_new_float32_cpu_tensors", "row_bias_assumed", "reduce_backward_all_reduces"),
    ("chunks_not_validated", "shard_trainability_copied"),
    ("column_error_omits_chunks",), ("column_weight_view",),
    ("copy_backward_ignores_group", "column_forward_ignores_group"),     # refused at once, not left to hang
    ("qkv_split_ignoring_heads",), ("mlp_left_whole",), ("group_not_passed_on",), ("sizes_not_checked",),
    ("inner_checked_after_attention_split",), ("returns_nothing",), ("only_split_size_set",),
    ("head_count_divided_as_float",),
    ("row_from_linear_returns_shards",), ("copy_backward_returns_grad_only",),
    ("reduce_forward_returns_all_reduce_result",), ("column_forward_returns_nothing",),
    ("column_from_linear_returns_shards",),
]
_BY_NAME = {v.name: v for v in VARIANTS}


@pytest.mark.kit
@pytest.mark.parametrize("names", GROUPS, ids=["+".join(g) for g in GROUPS])
def test_variant_loses_only_its_criteria(names, tmp_path, fork_servers):
    group = [_BY_NAME[n] for n in names]
    edits = [edit for v in group for edit in v.edits]
    assert len({function for _, function, _ in edits}) == len(edits) and len({path for path, _, _ in edits}) == 1
    kit = make_variant_kit(tmp_path / "kit", [])
    edit_regions(kit, group[0].path, {function: body for _, function, body in edits})
    assert_verdicts(grade(kit, group[0].problem, tmp_path, fork_servers), group)


@pytest.mark.kit
def test_groups_cover_every_variant_once_with_disjoint_criteria():
    assert sorted(n for g in GROUPS for n in g) == sorted(_BY_NAME)
    for names in GROUPS:
        fails = [_BY_NAME[n].fails for n in names]
        assert sum(len(f) for f in fails) == len(set().union(*fails)), names


@pytest.mark.kit
def test_every_criterion_is_lost_by_some_variant():
    lost = set().union(*(v.fails for v in VARIANTS))
    assert {c.id for case in CASES for c in case.criteria} <= lost


@pytest.mark.kit
def test_starter_scores_zero_on_every_criterion_as_not_implemented(tmp_path, fork_servers):
    kit = make_variant_kit(tmp_path / "kit", [])
    for path in (LAYERS, GPT2):
        edit_regions(kit, path, {"*": ""})
    verdicts = grade(kit, "5", tmp_path, fork_servers)
    assert {v.status for v in verdicts.values()} == {"not_implemented"}, {
        cid: (v.status, v.message[:200]) for cid, v in verdicts.items() if v.status != "not_implemented"}


@pytest.mark.kit
def test_grade_variant_splices_an_optional_problem(tmp_path, fork_servers):
    """tests/kit/variants.grade_variant grades a Problem 5 variant as the variant, not as the reference, though
    the course's default problems (1-3) leave Problem 5 out of a splice."""
    from tests.kit.variants import failed_ids, grade_variant
    variant = next(v for v in VARIANTS if len(v.edits) == 1)
    assert failed_ids(grade_variant(variant, variant.problem, tmp_path, fork_servers)) == variant.fails
