"""Problem 1.2: gradient averaging for data-parallel training.

Each rank computes gradients on its own slice of the global batch; after
``average_gradients`` every rank holds the gradient of the *global* batch mean
loss, so the optimizers on all ranks take the same step::

    rank 0: g0 ─┐                  ┌─> (g0 + g1) / 2
                ├─ all_reduce(SUM) ┤
    rank 1: g1 ─┘                  └─> (g0 + g1) / 2
"""
from __future__ import annotations

import datetime
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn


def setup_process_group(rank: int, world_size: int, backend: str = "gloo", init_method: str | None = None,
                        timeout: datetime.timedelta | None = None) -> None:
    """Join the default process group as ``rank`` of ``world_size``.

    Pass the arguments on to ``dist.init_process_group`` as given: ``backend``
    is any backend string ``torch.distributed`` accepts (``"gloo"``,
    ``"nccl"``, ``"cpu:gloo"``, a name registered with
    ``torch.distributed.Backend.register_backend``, ...); ``init_method``
    is a rendezvous URL (``file:///path``, ``tcp://host:port`` or
    ``env://``), and a given URL is the rendezvous to use (the
    environment's ``MASTER_*`` variables may then be unset or unusable);
    ``None`` means ``env://`` with ``MASTER_ADDR`` /
    ``MASTER_PORT`` defaulting to ``127.0.0.1`` / ``29500`` when unset.
    Setting those two environment variables with ``os.environ.setdefault`` is
    fine (never overwrite values the caller set). ``timeout`` bounds every
    collective of the group; a given ``timedelta`` is passed on whatever its
    value, ``timedelta(0)`` included (it is falsy: test ``timeout is
    None``), and only ``None`` means 60 s. With ``backend="nccl"`` the
    rank first selects its GPU, ``torch.cuda.set_device(rank %
    torch.cuda.device_count())``, and only then initialises the group.
    Only ``backend == "nccl"`` selects a GPU: any other backend (a
    registered CPU one whose name sorts after ``"nccl"`` included) calls
    no ``torch.cuda.set_device``.

    Afterwards ``dist.get_rank() == rank``, ``dist.get_world_size() ==
    world_size`` and ``dist.get_backend() == backend``. Returns None; errors
    from ``torch.distributed`` propagate.
    """
    # BEGIN_STUDENT 1.2
    import os
    if init_method is None:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
        init_method = "env://"
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60) if timeout is None else timeout)
    # END_STUDENT 1.2


def average_gradients(model: nn.Module) -> None:
    """Replace every existing gradient of ``model`` by its mean over all ranks.

    For each parameter whose ``.grad`` is not None, whatever its
    ``requires_grad`` (a parameter frozen after a backward still holds its
    gradient, and it is averaged too): all-reduce (sum) it across the default
    process group with ``torch.distributed.all_reduce``, then divide by the
    world size. Parameters whose ``.grad`` is None (a layer the forward did
    not use, a parameter frozen before the backward) stay None. Returns None.
    """
    # BEGIN_STUDENT 1.2
    world_size = dist.get_world_size()
    for param in model.parameters():
        if param.grad is None:
            continue
        dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
        param.grad.data /= world_size
    # END_STUDENT 1.2


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor, targets: torch.Tensor,
               loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> float:
    """One data-parallel optimisation step on this rank's slice of the batch.

    In order: clear the gradients (``optimizer.zero_grad()``), compute
    ``loss = loss_fn(model(inputs), targets)`` with the given ``loss_fn``
    (whatever it computes), ``loss.backward()``, call
    ``average_gradients(model)``, ``optimizer.step()``. Returns the local
    (this rank's) loss as a Python float.
    """
    # BEGIN_STUDENT 1.2
    optimizer.zero_grad()
    loss = loss_fn(model(inputs), targets)
    loss.backward()
    average_gradients(model)
    optimizer.step()
    return loss.item()
    # END_STUDENT 1.2
