"""Problem 4.2: ZeRO stage 1 by hand: each rank keeps the optimizer state of one shard only.

Plain data parallelism replicates the optimizer on every rank: with Adam in
fp32 that is 12 bytes per parameter (master weight + two moments) on every
rank. ZeRO-1 splits the flattened parameters into ``world_size`` equal,
contiguous shards; rank r keeps the fp32 master copy and the Adam moments of
shard r only, so the optimizer state per rank is ``12 * P / N`` bytes::

    flat parameters (P, padded to N * S):  [ shard 0 | shard 1 | ... | shard N-1 ]   S = ceil(P / N)
    step():
      grads (each rank, full length) --reduce_scatter(sum) / N--> my shard's mean gradient
      master shard (fp32) <- inner optimizer step (Adam over my shard only)
      updated shards --all_gather--> every rank's model parameters (cast to their dtype)

Both collectives work on gloo (CPU) and NCCL (GPU) in this torch version.
"""
from __future__ import annotations

import math
from typing import Any, Iterable

import torch
import torch.distributed as dist
from torch import nn


class ShardedOptimizer:
    """ZeRO-1: optimizer state sharded over the ranks of the default process group.

    Contract:

    - ``params``: the model's parameters (same order on every rank); those
      with ``requires_grad`` form ``self.params`` (a single one is enough).
      Their elements, flattened in that order, are ``self.numel`` = P values;
      padded with zeros to ``world_size * self.shard_numel`` where
      ``self.shard_numel`` = S = ``ceil(P / world_size)``. Rank r owns
      elements ``[r * S, (r + 1) * S)``.
    - ``self.master``: this rank's shard as a 1-D **fp32** ``nn.Parameter`` of
      length S (initial values: the parameters' values there; the padding's
      values are free, they never reach a parameter), on the parameters'
      device (all parameters sit on one device), whatever the model's dtype
      (a bf16 model keeps fp32 master shards).
    - ``self.optimizer = optimizer_cls([self.master], **kwargs)``: the inner
      optimizer sees only the shard, so its state (Adam: ``exp_avg``,
      ``exp_avg_sq``) has S elements each. The optimizer state a rank holds
      is ``master`` + that state: 12 * S bytes for Adam.
    - ``step()``: the gradients (``p.grad``; None counts as zeros of the
      parameter's size, so the parameters after it keep their offsets),
      flattened and padded like the parameters and cast to fp32 (world_size * S
      elements), are reduce-scattered (sum, ``torch.distributed.reduce_scatter``,
      or ``reduce_scatter_tensor`` on the flat vector) into this rank's S
      elements and divided by the world size, giving this rank's shard of the
      mean gradient; that becomes ``master.grad`` for one inner
      ``optimizer.step()``; then the updated shards of all ranks (S elements
      each) are all-gathered (``torch.distributed.all_gather``, or
      ``all_gather_into_tensor``) into world_size * S elements and copied into
      every parameter (cast to its dtype), so all ranks hold the same, updated
      model.
      Each ``step()`` calls these two collectives once each, in that order, and
      no other (no ``all_reduce`` of the gradient: it sends twice a
      reduce-scatter's traffic, which ZeRO-1 exists to save; no ``broadcast``).
      ``master.grad`` is set to None afterwards (no shard gradient stays
      allocated between steps).
    - ``zero_grad()``, ``state_bytes()``, ``state_dict()`` and
      ``load_state_dict()`` are provided (``state_dict`` holds this rank's
      master shard and inner optimizer state; used by Problem 4.3's
      checkpoints).

    Raises ValueError when no parameter requires a gradient.
    """

    def __init__(self, params: Iterable[nn.Parameter], optimizer_cls: type = torch.optim.Adam, **kwargs: Any):
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("ShardedOptimizer: no parameter requires a gradient")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.numel = sum(p.numel() for p in self.params)
        self.shard_numel = math.ceil(self.numel / self.world_size)
        self.master: nn.Parameter
        self.optimizer: torch.optim.Optimizer
        # Hint: torch.cat the flattened parameters (fp32), pad to world_size * shard_numel, slice your shard.
        # BEGIN_STUDENT 4.2
        device = self.params[0].device
        with torch.no_grad():
            flat = self._flat([p.detach() for p in self.params], device)
            start = self.rank * self.shard_numel
            self.master = nn.Parameter(flat[start:start + self.shard_numel].clone())
        self.optimizer = optimizer_cls([self.master], **kwargs)
        # END_STUDENT 4.2

    def _flat(self, tensors: list[torch.Tensor | None], device: torch.device) -> torch.Tensor:
        """One fp32 vector of length world_size * shard_numel: ``tensors`` flattened in order (None -> zeros)."""
        # BEGIN_STUDENT 4.2
        flat = torch.zeros(self.world_size * self.shard_numel, dtype=torch.float32, device=device)
        offset = 0
        for param, tensor in zip(self.params, tensors):
            n = param.numel()
            if tensor is not None:
                flat[offset:offset + n] = tensor.reshape(-1).float()
            offset += n
        return flat
        # END_STUDENT 4.2

    def step(self) -> None:
        """Reduce-scatter the mean gradient, step the master shard, all-gather the parameters."""
        # BEGIN_STUDENT 4.2
        device = self.master.device
        with torch.no_grad():
            grads = self._flat([p.grad for p in self.params], device)
            shard_grad = torch.empty(self.shard_numel, dtype=torch.float32, device=device)
            dist.reduce_scatter(shard_grad, list(grads.chunk(self.world_size)), op=dist.ReduceOp.SUM)
            shard_grad /= self.world_size
        self.master.grad = shard_grad
        self.optimizer.step()
        self.master.grad = None
        with torch.no_grad():
            shards = [torch.empty_like(self.master) for _ in range(self.world_size)]
            dist.all_gather(shards, self.master.detach())
            full = torch.cat(shards)
            offset = 0
            for param in self.params:
                n = param.numel()
                param.copy_(full[offset:offset + n].view_as(param).to(param.dtype))
                offset += n
        # END_STUDENT 4.2

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the model's gradients (``None``, or zeros when ``set_to_none`` is False)."""
        for param in self.params:
            if set_to_none:
                param.grad = None
            elif param.grad is not None:
                param.grad.zero_()

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds: the master shard and every tensor (dim >= 1) of the inner state.

        Adam's scalar ``step`` counters are not counted; for Adam this is 12 * shard_numel.
        """
        tensors = [self.master, *(v for state in self.optimizer.state.values() for v in state.values())]
        return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor) and t.dim() >= 1)

    def state_dict(self) -> dict:
        """This rank's state: ``{"master": copy of the fp32 shard, "optimizer": inner state_dict, sizes}``."""
        return {"master": self.master.detach().clone(), "optimizer": self.optimizer.state_dict(),
                "numel": self.numel, "shard_numel": self.shard_numel, "rank": self.rank,
                "world_size": self.world_size}

    def load_state_dict(self, state: dict) -> None:
        """Restore a ``state_dict()`` of the same rank and sizes (master copied in place); ValueError otherwise."""
        mine = {"numel": self.numel, "shard_numel": self.shard_numel, "rank": self.rank,
                "world_size": self.world_size}
        theirs = {key: state.get(key) for key in mine}
        if theirs != mine:
            raise ValueError(f"ShardedOptimizer.load_state_dict: state of {theirs}, this optimizer is {mine}")
        with torch.no_grad():
            self.master.copy_(state["master"])
        self.optimizer.load_state_dict(state["optimizer"])
