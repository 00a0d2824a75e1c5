"""Problem 5.2: a ``transformers`` GPT-2 block split across the ranks of a group (Megatron-style).

A ``GPT2Block`` is ``x + attn(ln_1(x))`` then ``x + mlp(ln_2(x))``. Split over
N ranks, each rank holds ``1/N`` of every projection matrix::

    attn.c_attn  (E -> 3E, fused q|k|v)  column parallel, by heads: rank r holds heads
                                         [r*H/N, (r+1)*H/N) of q, of k and of v
    attention                            local: rank r attends with its own H/N heads
    attn.c_proj  (E -> E)                row parallel: its input is the concatenation of the heads
    mlp.c_fc     (E -> I)                column parallel
    mlp.c_proj   (I -> E)                row parallel
    ln_1, ln_2                           replicated (whole on every rank)

(E = n_embd, H = n_head, I = the MLP's inner size.) The block's input and
output are full on every rank: two all-reduces in the forward (one per row
layer), two in the backward (one per column layer), none between the layers.
Everything outside the blocks (embeddings, final norm, LM head) stays
replicated, so a model whose every block is split computes the same logits,
loss and (gathered) gradients as the unsplit model.
"""
from __future__ import annotations

from torch import nn

from finetune.gpt2 import conv1d_to_linear
from tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear, rank_and_size


def parallelize_block(block: nn.Module, group=None) -> nn.Module:
    """Split ``block`` (a ``GPT2Block``) across the ranks of ``group`` in place; return ``block`` itself.

    Contract (call it on every rank of ``group``, on blocks with the same weights):
    - with H = ``block.attn.num_heads``, E = ``block.attn.embed_dim`` (= H x
      ``head_dim``, so it splits whenever H does) and I = the inner size of
      the MLP (``c_fc``'s output features), raise ValueError naming the size
      and N when H or I is not divisible by N, before changing anything (no
      submodule replaced or converted, no attribute set);
    - ``attn.c_attn`` becomes ``ColumnParallelLinear.from_linear(..., chunks=3)``
      (q, k and v are split separately, so rank r keeps whole heads);
      ``attn.c_proj`` a ``RowParallelLinear``; ``mlp.c_fc`` a
      ``ColumnParallelLinear``; ``mlp.c_proj`` a ``RowParallelLinear``; all
      with ``group``; look the two classes up as module attributes of this
      file (``ColumnParallelLinear``, ``RowParallelLinear``) at call time;
    - the attention then works on its local heads: set ``attn.split_size``
      (the width it splits the fused projection into q, k, v with) to E/N, and
      ``attn.num_heads`` to H/N and ``attn.embed_dim`` to E/N (ints); ``head_dim``
      does not change;
    - layer norms and everything else stay as they are (replicated).
    Afterwards the block, called as ``GPT2Model`` calls it (the full
    ``hidden_states``, and the model's attention mask: None or one mask per
    position, broadcast over the heads, passed through untouched), takes and
    returns full hidden states on every rank, equal to the unsplit block's.
    """
    _, world_size = rank_and_size(group)
    attn, mlp = block.attn, block.mlp
    # GPT-2 builds its projections from transformers' Conv1D (weight stored in x out):
    # conv1d_to_linear(block) turns them into equivalent nn.Linear layers, ready for from_linear. It changes
    # the block in place, so call it only after every size check has passed.
    # BEGIN_STUDENT 5.2
    heads, embed = attn.num_heads, attn.embed_dim
    inner = mlp.c_fc.weight.shape[1] if not isinstance(mlp.c_fc, nn.Linear) else mlp.c_fc.out_features
    for what, size in (("attention heads", heads), ("MLP inner size", inner)):
        if size % world_size:
            raise ValueError(f"parallelize_block: {size} {what} do not split evenly over {world_size} ranks")
    conv1d_to_linear(block)
    attn.c_attn = ColumnParallelLinear.from_linear(attn.c_attn, group, chunks=3)
    attn.c_proj = RowParallelLinear.from_linear(attn.c_proj, group)
    mlp.c_fc = ColumnParallelLinear.from_linear(mlp.c_fc, group)
    mlp.c_proj = RowParallelLinear.from_linear(mlp.c_proj, group)
    attn.split_size = embed // world_size
    attn.num_heads = heads // world_size
    attn.embed_dim = embed // world_size
    return block
    # END_STUDENT 5.2


def parallelize_gpt2(model: nn.Module, group=None) -> nn.Module:
    """Split every block of a ``GPT2LMHeadModel`` with ``parallelize_block``; return ``model`` (provided).

    Embeddings, the final layer norm and the LM head stay replicated. Every
    block has the same sizes, so a ValueError from ``parallelize_block``
    comes from the first block, before any block is changed.
    """
    for block in model.transformer.h:
        parallelize_block(block, group)
    return model
