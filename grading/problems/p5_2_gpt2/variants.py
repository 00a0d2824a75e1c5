"""Buggy variants of 5.2 (staff only, never released): each loses exactly the criteria it names and breaks the
clauses it names."""
from __future__ import annotations

from grading.kit.variants import Clause, Variant, edited

GPT2 = "tensor_parallel/gpt2.py"

# Variants of parallelize_block are mostly the reference with targeted edits (``edited``: each old text must occur
# once), some keeping the shorter messages or size check they were written with as named swaps beside their bug.
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

VARIANTS = [
    Variant("head_count_divided_as_float", GPT2, "parallelize_block", edited(GPT2, "parallelize_block", (
        "attn.num_heads = heads // world_size", "attn.num_heads = heads / world_size")),
        frozenset({"5.2.attention_sizes"}),
        breaks=(Clause("528b", "parallelize_block", "... as ints (`heads // N`, not the float `heads / N`)",
                       "5.2.attention_sizes"),)),
    Variant("qkv_split_ignoring_heads", GPT2, "parallelize_block", edited(
        GPT2, "parallelize_block", _CONV1D_SIZE_CHECKS, _ONE_LINE_SIZES, ("group, chunks=3)", "group)")),
        frozenset({"5.2.forward", "5.2.grads", "5.2.sgd_steps", "5.2.forward_hidden", "5.2.grads_hidden"}),
        hint="likely cause: the fused qkv weight was split as one matrix; split q, k and v each (chunks=3)",
        breaks=(
            Clause("525", "parallelize_block", "c_attn column parallel with chunks=3 (q, k, v split by whole heads)",
                   "5.2.forward"),
            Clause("529", "parallelize_block / gpt2 (module)", "afterwards full hidden states in and out, equal to "
                   "the unsplit block's: same logits and loss", "5.2.forward"),
            Clause("530", "gpt2 (module)", "the split model trains like the unsplit one (three SGD steps)",
                   "5.2.sgd_steps"))),
    Variant("mlp_left_whole", GPT2, "parallelize_block", edited(GPT2, "parallelize_block", _CONV1D_SIZE_CHECKS, (
        "    mlp.c_fc = ColumnParallelLinear.from_linear(mlp.c_fc, group)\n"
        "    mlp.c_proj = RowParallelLinear.from_linear(mlp.c_proj, group)\n", ""), _ONE_LINE_SIZES),
        frozenset({"5.2.grads", "5.2.sgd_steps", "5.2.param_bytes", "5.2.grads_hidden"}),
        breaks=(
            Clause("526", "parallelize_block", "c_proj row, c_fc column, c_proj row (the ranks' gradients make up "
                   "the unsplit model's)", "5.2.grads"),
            Clause("526b", "gpt2 (module)", "each rank holds 1/N of every projection matrix", "5.2.param_bytes"))),
    Variant("group_not_passed_on", GPT2, "parallelize_block", edited(GPT2, "parallelize_block", _CONV1D_SIZE_CHECKS, (
        "(attn.c_attn, group, chunks=3)", "(attn.c_attn, chunks=3)"), ("(attn.c_proj, group)", "(attn.c_proj)"),
        ("(mlp.c_fc, group)", "(mlp.c_fc)"), ("(mlp.c_proj, group)", "(mlp.c_proj)"), _ONE_LINE_SIZES),
        frozenset({"5.2.forward_hidden", "5.2.grads_hidden"}),
        breaks=(Clause("527", "parallelize_block", "all four layers with `group`", "5.2.forward_hidden"),)),
    Variant("sizes_not_checked", GPT2, "parallelize_block", edited(
        GPT2, "parallelize_block", (_SIZE_CHECKS, ""), _ONE_LINE_SIZES), frozenset({"5.2.value_errors"}),
        breaks=(Clause("523", "parallelize_block", "H or I not divisible by N: ValueError naming the size and N",
                       "5.2.value_errors"),)),
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
    """, frozenset({"5.2.value_errors"}),
        breaks=(Clause("524", "parallelize_block", "... before changing anything (no submodule replaced or "
                       "converted, no attribute set)", "5.2.value_errors"),)),
    Variant("returns_nothing", GPT2, "parallelize_block", edited(
        GPT2, "parallelize_block", _CONV1D_SIZE_CHECKS, _ONE_LINE_SIZES, ("    return block\n", "")),
        frozenset({"5.2.returns_block"}), hint="returned NoneType for blocks",
        breaks=(Clause("522", "parallelize_block", "split in place, return `block` itself (the message names what "
                       "came back)", "5.2.returns_block"),)),
    Variant("only_split_size_set", GPT2, "parallelize_block", edited(GPT2, "parallelize_block", _CONV1D_SIZE_CHECKS, (
        _ATTN_SIZES,
        "attn.split_size = embed // world_size          # the forward only reads split_size and head_dim")),
        frozenset({"5.2.attention_sizes"}),
        breaks=(Clause("528", "parallelize_block", "attn.split_size, num_heads, embed_dim become E/N, H/N, E/N; "
                       "head_dim unchanged", "5.2.attention_sizes"),)),
]

NOT_GRADED = """
`parallelize_block`'s "look the two classes up as module attributes at call time" (an isolation instruction: a local
import is judged on the student's own 5.1 layers instead of the stand-ins, with the same outcome when they are
right); "call it on every rank of `group`, on blocks with the same weights" (the caller's precondition); the
attention mask (stated for the caller: the mask `GPT2Model` prepares is per position, broadcast over the heads, and
passes through the split untouched; `parallelize_block` never sees it); "layer norms and everything else stay as
they are" (every replicated parameter is compared whole on every rank by 5.2.grads, and no plausible bug in a
function that swaps four projections changes them); the module's "two all-reduces in the forward, two in the
backward" for a split block (it follows from the 5.1 layers, graded by 5.1.comm_counts; 5.2 runs on stand-ins that
all-gather); `parallelize_gpt2` (provided code).
Dropped from the contracts as not needed: E in `parallelize_block`'s divisibility rule (E = H x head_dim splits
whenever H does).
"""
