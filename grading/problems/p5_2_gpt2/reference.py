"""Problem 5.2 references: a tiny GPT-2, the unsplit model's results, and full-weight stand-in layers.

Never imports student code. The parent compares the ranks' results with the
unsplit model (``serial_gpt2``); the probe swaps in stand-ins for the
student's 5.1 layers that keep the FULL weight on every rank and take their
slice of the full output (computed differently from the student code).
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from grading.problems.p5_1_layers.reference import gathered_copy, rank_slice

GPT2_SIZES = dict(n_layer=2, n_head=6, n_embd=48, n_positions=32, vocab_size=64)   # heads and 4*48 split over 2, 3
TOKENS_SHAPE = (2, 10)
LEARNING_RATE = 0.1
SGD_STEPS = 3
# the layer each projection of a parallelized block must become (the contract of parallelize_block)
SPLIT_LAYERS = {"attn.c_attn": "ColumnParallelLinear", "attn.c_proj": "RowParallelLinear",
                "mlp.c_fc": "ColumnParallelLinear", "mlp.c_proj": "RowParallelLinear"}


def gpt2_config(attention: str = "eager", **sizes):
    """A tiny ``GPT2Config`` without dropout: ``GPT2_SIZES`` updated with ``sizes``; ``attention`` "eager" or "sdpa"."""
    from transformers import GPT2Config

    config = GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                        **{**GPT2_SIZES, **sizes})
    config._attn_implementation = attention
    return config


def build_gpt2(seed: int = 0, attention: str = "eager", **sizes) -> nn.Module:
    """A tiny ``GPT2LMHeadModel`` with weights drawn after ``torch.manual_seed(seed)`` (global RNG restored)."""
    from transformers import GPT2LMHeadModel

    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(gpt2_config(attention, **sizes)).float().train()
    torch.random.set_rng_state(state)
    return model


def tokens(step: int) -> torch.Tensor:
    """The token batch of ``step``: (2, 10) ids."""
    return torch.randint(0, GPT2_SIZES["vocab_size"], TOKENS_SHAPE, generator=torch.Generator().manual_seed(500 + step))


def next_token_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy of predicting ``ids[:, t + 1]`` from position ``t``."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())


def _is_conv1d(module: nn.Module) -> bool:
    from transformers.pytorch_utils import Conv1D

    return isinstance(module, Conv1D)


def linear_view(model: nn.Module, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tensors`` (by parameter name) with every ``Conv1D`` weight transposed to ``nn.Linear``'s (out, in)."""
    out = {}
    for name, tensor in tensors.items():
        owner = model.get_submodule(name.rpartition(".")[0])
        out[name] = tensor.t().contiguous() if _is_conv1d(owner) and name.endswith("weight") else tensor
    return out


@functools.lru_cache(maxsize=None)
def serial_gpt2() -> dict:
    """The unsplit model on ``tokens(0)``, then ``SGD_STEPS`` SGD steps: logits, loss, grads, losses, params
    (and the initial params).

    Gradients and parameters are in ``nn.Linear`` layout (Conv1D weights transposed).
    """
    model = build_gpt2(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    result: dict = {"losses": [], "initial": linear_view(model, {n: p.detach().clone()
                                                              for n, p in model.named_parameters()})}
    for step in range(SGD_STEPS):
        optimizer.zero_grad()
        logits = model(tokens(step)).logits
        loss = next_token_loss(logits, tokens(step))
        loss.backward()
        if step == 0:
            result["logits"], result["loss"] = logits.detach(), loss.item()
            result["grads"] = linear_view(model, {n: p.grad.clone() for n, p in model.named_parameters()})
        result["losses"].append(loss.item())
        optimizer.step()
    result["params"] = linear_view(model, {n: p.detach().clone() for n, p in model.named_parameters()})
    return result


def serial_block_matrix_bytes() -> int:
    """Bytes of the 2-D parameters inside the unsplit model's blocks."""
    return sum(p.numel() * p.element_size() for n, p in build_gpt2(seed=0).named_parameters()
               if ".h." in f".{n}" and p.dim() == 2)


def split_layer_of(name: str) -> str | None:
    """The split projection (e.g. "transformer.h.0.attn.c_attn") parameter ``name`` belongs to, else None."""
    layer = name.rpartition(".")[0]
    return layer if ".h." in f".{layer}" and layer.endswith(tuple(SPLIT_LAYERS)) else None


def expected_class(layer: str) -> str:
    """The class the contract puts at split projection ``layer``."""
    return next(cls for suffix, cls in SPLIT_LAYERS.items() if layer.endswith(suffix))


class _GatherLastDim(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.rank, ctx.width = dist.get_rank(group), x.shape[-1]
        pieces = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(pieces, x.contiguous(), group=group)
        return torch.cat(pieces, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad.narrow(-1, ctx.rank * ctx.width, ctx.width).contiguous(), None


def _full_copy(linear: nn.Module, who: str) -> tuple[nn.Parameter, nn.Parameter | None]:
    """Copies of ``linear``'s weight and bias as parameters; TypeError unless it is an ``nn.Linear``."""
    if not isinstance(linear, nn.Linear):
        raise TypeError(f"{who}.from_linear expects an nn.Linear, got {type(linear).__name__} "
                        "(convert GPT-2's Conv1D layers first)")
    bias = nn.Parameter(linear.bias.detach().clone()) if linear.bias is not None else None
    return nn.Parameter(linear.weight.detach().clone()), bias


class FullWeightColumn(nn.Module):
    """Stand-in for the student's ``ColumnParallelLinear`` in 5.2 checks: keeps the FULL weight on every rank.

    Forward: the full output ``x W^T + b`` (input through ``gathered_copy``),
    then this rank's slice of each chunk. Only this rank's rows of the weight
    (and entries of the bias) get a nonzero gradient, so summing the ranks'
    full gradients gives the serial gradient.
    """

    stands_for = "ColumnParallelLinear"

    def __init__(self, linear: nn.Module, group, chunks: int):
        super().__init__()
        self.group, self.chunks = group, chunks
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.weight, self.bias = _full_copy(linear, self.stands_for)

    @classmethod
    def from_linear(cls, linear: nn.Module, group=None, *, chunks: int = 1) -> FullWeightColumn:
        return cls(linear, group, chunks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        full = F.linear(gathered_copy(x, self.group), self.weight, self.bias)
        return torch.cat([rank_slice(b, self.rank, self.world_size) for b in full.chunk(self.chunks, dim=-1)], -1)


class FullWeightRow(nn.Module):
    """Stand-in for the student's ``RowParallelLinear`` in 5.2 checks: keeps the FULL weight on every rank.

    Forward: all-gathers the ranks' input slices into the full input, then the
    full ``x W^T + b`` (the same on every rank, and so is the full gradient).
    """

    stands_for = "RowParallelLinear"

    def __init__(self, linear: nn.Module, group):
        super().__init__()
        self.group = group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.weight, self.bias = _full_copy(linear, self.stands_for)

    @classmethod
    def from_linear(cls, linear: nn.Module, group=None) -> FullWeightRow:
        return cls(linear, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(_GatherLastDim.apply(x, self.group), self.weight, self.bias)


STAND_INS = (FullWeightColumn, FullWeightRow)


def full_values(model: nn.Module, which: str) -> dict[str, torch.Tensor | None]:
    """Every parameter's ``which`` ("grad" or "data"), whole, in ``nn.Linear`` layout (Conv1D weights transposed)."""
    out: dict[str, torch.Tensor | None] = {}
    for name, param in model.named_parameters():
        value = param.grad if which == "grad" else param
        if value is not None:
            value = value.detach().clone()
            owner = model.get_submodule(name.rpartition(".")[0])
            if _is_conv1d(owner) and name.endswith("weight"):
                value = value.t().contiguous()
        out[name] = value
    return out


def held_block_matrix_bytes(model: nn.Module, world_size: int) -> int:
    """Bytes of the blocks' 2-D parameters one rank would hold: a stand-in layer's weight counts 1/N."""
    total = 0
    for name, param in model.named_parameters():
        if ".h." in f".{name}" and param.dim() == 2:
            owner = model.get_submodule(name.rpartition(".")[0])
            share = world_size if isinstance(owner, STAND_INS) else 1
            total += param.numel() * param.element_size() // share
    return total
