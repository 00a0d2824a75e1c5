"""Problem 5.1 references: a full ``nn.Linear``, its data, the parallel-region stand-ins. No student code.

Serial computations that the parent compares the ranks' results with, and
the isolation stand-ins the 5.1 layer checks swap in for the student's
parallel-region functions: they all-gather where the student all-reduces.
(``grading.problems.p5_2_gpt2.reference`` builds its stand-in layers on them.)
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist
from torch import nn

# ---------------------------------------------------------------- 5.1: one linear layer and an MLP
IN_FEATURES, HIDDEN, OUT_FEATURES = 6, 12, 6       # HIDDEN splits over 2 and 3 ranks
BATCH_SHAPE = (2, 3)                               # inputs are (2, 3, features): leading dims must pass through


def make_linear(in_features: int, out_features: int, seed: int, bias: bool = True) -> nn.Linear:
    """A deterministic ``nn.Linear`` (same weights in every process for the same arguments)."""
    generator = torch.Generator().manual_seed(seed)
    linear = nn.Linear(in_features, out_features, bias=bias)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(out_features, in_features, generator=generator) / in_features ** 0.5)
        if bias:
            linear.bias.copy_(torch.randn(out_features, generator=generator))
    return linear


def column_linear() -> nn.Linear:
    """The full layer the 5.1 checks split by columns: ``nn.Linear(IN_FEATURES, HIDDEN)``."""
    return make_linear(IN_FEATURES, HIDDEN, seed=11)


def row_linear() -> nn.Linear:
    """The full layer the 5.1 checks split by rows: ``nn.Linear(HIDDEN, OUT_FEATURES)``."""
    return make_linear(HIDDEN, OUT_FEATURES, seed=12)


def data(name: str, features: int) -> torch.Tensor:
    """A named deterministic tensor of shape ``BATCH_SHAPE + (features,)`` (inputs and upstream gradients)."""
    seed = {"x": 21, "h": 22, "g_col": 23, "g_row": 24, "g_mlp": 25}[name]
    return torch.randn(*BATCH_SHAPE, features, generator=torch.Generator().manual_seed(seed))


def rank_slice(tensor: torch.Tensor, rank: int, world_size: int, dim: int = -1) -> torch.Tensor:
    """Rank ``rank``'s contiguous equal slice of ``tensor`` along ``dim``."""
    size = tensor.shape[dim] // world_size
    return tensor.narrow(dim, rank * size, size)


def serial_linear(linear: nn.Linear, x: torch.Tensor, upstream: torch.Tensor) -> dict[str, torch.Tensor]:
    """Output, weight/bias gradients and input gradient of ``loss = (linear(x) * upstream).sum()``."""
    linear = make_copy(linear)
    x = x.clone().requires_grad_()
    out = linear(x)
    (out * upstream).sum().backward()
    return {"out": out.detach(), "weight": linear.weight.grad, "bias": linear.bias.grad, "input": x.grad}


def make_copy(linear: nn.Linear) -> nn.Linear:
    """An independent ``nn.Linear`` with ``linear``'s weights."""
    copy = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None)
    copy.load_state_dict(linear.state_dict())
    return copy


@functools.lru_cache(maxsize=None)
def serial_column() -> dict[str, torch.Tensor]:
    """``serial_linear`` of the column checks' layer, input and upstream gradient."""
    return serial_linear(column_linear(), data("x", IN_FEATURES), data("g_col", HIDDEN))


@functools.lru_cache(maxsize=None)
def serial_row() -> dict[str, torch.Tensor]:
    """``serial_linear`` of the row checks' layer, (full) input and upstream gradient."""
    return serial_linear(row_linear(), data("h", HIDDEN), data("g_row", OUT_FEATURES))


def _gather_grad_sum(grad: torch.Tensor, group) -> torch.Tensor:
    pieces = [torch.empty_like(grad) for _ in range(dist.get_world_size(group))]
    dist.all_gather(pieces, grad.contiguous(), group=group)
    return torch.stack(pieces).sum(0)


class _GatheredCopy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return _gather_grad_sum(grad, ctx.group), None


class _GatheredReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return _gather_grad_sum(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def gathered_copy(x: torch.Tensor, group=None) -> torch.Tensor:
    """Stand-in for ``copy_to_parallel_region``: identity forward; backward sums the ranks' gradients
    with an all-gather (not an all-reduce)."""
    return _GatheredCopy.apply(x, group)


def gathered_reduce(x: torch.Tensor, group=None) -> torch.Tensor:
    """Stand-in for ``reduce_from_parallel_region``: forward sums over the ranks with an all-gather;
    backward identity."""
    return _GatheredReduce.apply(x, group)


# ---------------------------------------------------------------- 5.1: chunked, bias-free and foreign-dtype layers
def chunked_linear(chunks: int, world_size: int) -> nn.Linear:
    """The full layer the chunked column check splits: ``chunks`` blocks of 2 features per rank each."""
    return make_linear(IN_FEATURES, 2 * chunks * world_size, seed=13)


def chunked_column_shard(tensor: torch.Tensor, chunks: int, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s part of ``tensor``'s last dim cut into ``chunks`` blocks: its slice of every block, in order."""
    return torch.cat([rank_slice(block, rank, world_size) for block in tensor.chunk(chunks, dim=-1)], dim=-1)


def serial_out(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """The full layer's output on ``x`` (no gradient)."""
    with torch.no_grad():
        return linear(x)
