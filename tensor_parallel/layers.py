"""Problem 5.1: Megatron-style tensor-parallel linear layers.

One ``nn.Linear`` (``y = x W^T + b``, ``W`` of shape out x in) split over the
N ranks of a process group, two ways::

    column parallel: W split by rows (output features)     row parallel: W split by columns (input features)

        x (full) --f--> x W_r^T + b_r = y_r                     x_r --> x_r W_r^T --g--> sum_r (...) + b = y
        rank r holds W_r: (out/N, in), b_r: (out/N,)            rank r holds W_r: (out, in/N), b: (out,)
        output: rank r's slice of y                             output: the full y, on every rank

``f`` and ``g`` are the two communication functions, as autograd functions::

    f = copy_to_parallel_region:     forward identity,   backward all-reduce (sum) of the gradient
    g = reduce_from_parallel_region: forward all-reduce, backward identity

A column layer followed by a row layer (Megatron's MLP) needs no
communication in between: the column output slice ``y_r`` is exactly the row
layer's input slice ``x_r``. Forward has one all-reduce (``g``), backward one
(``f``).

``group`` is a ``torch.distributed`` process group (None: the default group).
N is ``dist.get_world_size(group)`` and r is ``dist.get_rank(group)``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def rank_and_size(group=None) -> tuple[int, int]:
    """``(r, N)``: this process's rank in ``group`` and the group's size (the default group when None)."""
    return dist.get_rank(group), dist.get_world_size(group)


class CopyToParallelRegion(torch.autograd.Function):
    """``f``: the input of a column-parallel layer. Forward: identity. Backward: all-reduce (sum) over the group.

    Every rank feeds the same full ``x`` to its column shard; each rank's
    shard contributes a part of the gradient of ``x``, so the gradient that
    leaves ``f`` must be the sum of every rank's part.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        """Return ``x`` unchanged as a view of it (``x.view_as(x)``); remember ``group`` on ``ctx`` for the backward.

        A view shares ``x``'s memory: no copy, and no communication.
        """
        # BEGIN_STUDENT 5.1
        ctx.group = group
        return x.view_as(x)
        # END_STUDENT 5.1

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        """Return ``(sum over the ranks of grad, None)``: one ``dist.all_reduce`` (SUM) over ``ctx.group``.

        All-reduce works in place: reduce a contiguous copy (NCCL refuses
        non-contiguous tensors), never ``grad`` itself: autograd may hand over the
        caller's own tensor (``y.backward(g)`` passes ``g``), which must come out
        unchanged. ``None`` is the gradient for ``group``.
        """
        # BEGIN_STUDENT 5.1
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad, None
        # END_STUDENT 5.1


class ReduceFromParallelRegion(torch.autograd.Function):
    """``g``: the output of a row-parallel layer. Forward: all-reduce (sum) over the group. Backward: identity.

    Each rank holds a partial sum ``x_r W_r^T`` of the output; ``g`` adds
    them up. The sum depends on each part with coefficient 1, so the gradient
    of every part is the incoming gradient itself.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        """Return the sum over the ranks of ``x`` (one ``dist.all_reduce``, SUM, over ``group``) as a new tensor.

        Reduce a contiguous copy of ``x`` (NCCL refuses non-contiguous tensors),
        never ``x`` itself: the caller's ``x`` must come out unchanged.
        """
        # BEGIN_STUDENT 5.1
        out = x.contiguous().clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
        return out
        # END_STUDENT 5.1

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        """Return ``(grad, None)`` unchanged: no communication in the backward of ``g``."""
        # BEGIN_STUDENT 5.1
        return grad, None
        # END_STUDENT 5.1


def copy_to_parallel_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """``f(x)``: identity forward, all-reduced gradient backward (see ``CopyToParallelRegion``)."""
    return CopyToParallelRegion.apply(x, group)


def reduce_from_parallel_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """``g(x)``: sum over the ranks forward, identity backward (see ``ReduceFromParallelRegion``)."""
    return ReduceFromParallelRegion.apply(x, group)


class ColumnParallelLinear(nn.Module):
    """A linear layer whose output features are split over the ranks: rank r computes its slice of ``y``.

    Built with ``from_linear``; the constructor only wraps this rank's shard
    (``weight``: out/N x in, ``bias``: out/N or None) as parameters named
    ``weight`` and ``bias``.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group=None):
        super().__init__()
        self.group = group
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias) if bias is not None else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, group=None, *, chunks: int = 1) -> ColumnParallelLinear:
        """This rank's column-parallel shard of ``linear``, as ``cls(weight, bias, group)``.

        With O = ``linear.out_features``, N the group size and r this rank:
        - ``chunks == 1``: rank r keeps rows ``[r*O/N, (r+1)*O/N)`` of
          ``linear.weight`` (O x in) and the same entries of ``linear.bias``;
        - ``chunks == c > 1``: the output is c stacked blocks of O/c features
          (GPT-2's fused q|k|v projection: c = 3). Each block is split on its
          own, so rank r keeps the r-th slice of every block, in block order::

              rows [k*O/c + r*O/(c*N), k*O/c + (r+1)*O/(c*N))   for k = 0 .. c-1, concatenated

          (with c = 3: rank r's queries, then its keys, then its values);
        - the shards are copies (``clone``) with ``linear``'s device and dtype:
          ``linear`` is left unchanged, and no memory is shared with it (an
          in-place change of the shard leaves ``linear`` as it was);
        - a layer without bias gives ``bias=None``;
        - the constructor wraps the shards as new parameters, so they require
          grad whatever ``linear``'s parameters do (a frozen layer gives a
          trainable shard).
        Raises ValueError when ``chunks < 1``, and ValueError naming the sizes
        (O, c and N) when O is not divisible by c*N.
        """
        rank, world_size = rank_and_size(group)
        # BEGIN_STUDENT 5.1
        out_features = linear.out_features
        if chunks < 1 or out_features % (chunks * world_size):
            raise ValueError(f"ColumnParallelLinear: {out_features} output features in {chunks} chunk(s) do not "
                             f"split evenly over {world_size} ranks")
        block, part = out_features // chunks, out_features // (chunks * world_size)
        rows = torch.cat([torch.arange(k * block + rank * part, k * block + (rank + 1) * part)
                          for k in range(chunks)]).to(linear.weight.device)
        with torch.no_grad():
            weight = linear.weight.index_select(0, rows).clone()
            bias = linear.bias.index_select(0, rows).clone() if linear.bias is not None else None
        return cls(weight, bias, group)
        # END_STUDENT 5.1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (..., in), the same on every rank -> (..., out/N): this rank's slice of ``x W^T + b``.

        Pass ``x`` through ``copy_to_parallel_region(x, self.group)`` first, so
        its gradient is summed over the ranks; then a local ``F.linear``. No
        other communication.
        """
        # BEGIN_STUDENT 5.1
        return F.linear(copy_to_parallel_region(x, self.group), self.weight, self.bias)
        # END_STUDENT 5.1

    def extra_repr(self) -> str:
        return f"local weight {tuple(self.weight.shape)}, bias={self.bias is not None}"


class RowParallelLinear(nn.Module):
    """A linear layer whose input features are split over the ranks: every rank gets the full ``y``.

    Built with ``from_linear``; the constructor only wraps this rank's shard
    (``weight``: out x in/N, ``bias``: the full out, or None) as parameters
    named ``weight`` and ``bias``. Every rank holds the whole bias and adds
    it, whole, to the all-reduced sum (never a share of it before the sum).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group=None):
        super().__init__()
        self.group = group
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias) if bias is not None else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, group=None) -> RowParallelLinear:
        """This rank's row-parallel shard of ``linear``, as ``cls(weight, bias, group)``.

        With I = ``linear.in_features``, N the group size and r this rank:
        rank r keeps columns ``[r*I/N, (r+1)*I/N)`` of ``linear.weight``
        (out x I) and a copy of the whole ``linear.bias`` (None without bias).
        As in ``ColumnParallelLinear.from_linear``: copies (``clone``) with
        ``linear``'s device and dtype, sharing no memory with ``linear``
        (which is left unchanged), wrapped as new trainable parameters by the
        constructor. Raises ValueError naming the sizes (I and N) when I is
        not divisible by N.
        """
        rank, world_size = rank_and_size(group)
        # BEGIN_STUDENT 5.1
        in_features = linear.in_features
        if in_features % world_size:
            raise ValueError(f"RowParallelLinear: {in_features} input features do not split evenly over "
                             f"{world_size} ranks")
        part = in_features // world_size
        with torch.no_grad():
            weight = linear.weight[:, rank * part:(rank + 1) * part].clone()
            bias = linear.bias.clone() if linear.bias is not None else None
        return cls(weight, bias, group)
        # END_STUDENT 5.1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (..., in/N), this rank's slice of the input features -> (..., out), the full output on every rank.

        Compute the partial product ``x W_r^T`` without the bias, sum it over the
        ranks with ``reduce_from_parallel_region(partial, self.group)``, then
        add the whole ``self.bias`` to that sum (on every rank: each computes
        the full output). No part of the bias goes in before the sum: the
        whole bias there would count it N times, and ``bias / N`` on every
        rank gives the same output but only 1/N of the full layer's bias
        gradient on each rank (each rank's bias gradient must be the full
        layer's). No other communication.
        """
        # BEGIN_STUDENT 5.1
        out = reduce_from_parallel_region(F.linear(x, self.weight), self.group)
        return out + self.bias if self.bias is not None else out
        # END_STUDENT 5.1

    def extra_repr(self) -> str:
        return f"local weight {tuple(self.weight.shape)}, bias={self.bias is not None}"
