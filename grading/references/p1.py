"""The grader's own Problem 1 references. Never imports student code.

The probe (child) and the criteria (parent) build the same model and batches
from these functions with the same seeds, so the parent can recompute every
expected value itself.
"""
from __future__ import annotations

import random

import torch
import torch.distributed as dist
from torch import nn

IN_FEATURES, HIDDEN, OUT_FEATURES = 6, 8, 4
GLOBAL_BATCH = 12           # divisible by 2 and 3 ranks
LEARNING_RATE = 0.1
TRAIN_STEPS = 3


class GradProbeNet(nn.Module):
    """A small MLP with one unused layer and one frozen parameter (their grads must stay None)."""

    def __init__(self, seed: int = 0):
        super().__init__()
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        self.fc1 = nn.Linear(IN_FEATURES, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, OUT_FEATURES)
        self.unused = nn.Linear(HIDDEN, OUT_FEATURES)
        self.frozen_scale = nn.Parameter(torch.ones(OUT_FEATURES), requires_grad=False)
        torch.random.set_rng_state(generator_state)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x))) * self.frozen_scale


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step``: inputs (GLOBAL_BATCH, 6), targets (GLOBAL_BATCH, 4)."""
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(GLOBAL_BATCH, IN_FEATURES, generator=g), torch.randn(GLOBAL_BATCH, OUT_FEATURES, generator=g)


def shard(tensor: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s contiguous equal slice of a global batch."""
    size = tensor.shape[0] // world_size
    return tensor[rank * size:(rank + 1) * size]


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, target)


def grads_of(model: nn.Module) -> dict[str, torch.Tensor | None]:
    return {name: (p.grad.detach().clone() if p.grad is not None else None) for name, p in model.named_parameters()}


def params_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def serial_gradients(seed: int = 0, step: int = 0) -> dict[str, torch.Tensor | None]:
    """Gradients of the mean loss over the whole global batch of ``step`` (one process)."""
    model = GradProbeNet(seed)
    inputs, targets = batch(step)
    loss_fn(model(inputs), targets).backward()
    return grads_of(model)


def serial_sgd(seed: int = 0, steps: int = TRAIN_STEPS) -> tuple[dict[str, torch.Tensor], list[list[float]]]:
    """Parameters after ``steps`` SGD steps on the global batches, and each step's per-shard losses.

    Returns (params, losses) where ``losses[k][r]`` is the loss of rank r's shard
    (for world sizes 2) before step k.
    """
    model = GradProbeNet(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    losses = []
    for step in range(steps):
        inputs, targets = batch(step)
        with torch.no_grad():
            losses.append([loss_fn(model(shard(inputs, r, 2)), shard(targets, r, 2)).item() for r in range(2)])
        optimizer.zero_grad()
        loss_fn(model(inputs), targets).backward()
        optimizer.step()
    return params_of(model), losses


def reference_average_gradients(model: nn.Module) -> None:
    """The grader's own gradient averaging (used to isolate ``train_step`` from ``average_gradients``)."""
    world_size = dist.get_world_size()
    for param in model.parameters():
        if param.grad is not None:
            dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
            param.grad /= world_size


def reference_partition_indices(size: int, world_size: int, seed: int = 1234) -> list[list[int]]:
    """The grader's own partition (private RNG, contiguous split), used to isolate partition_dataset."""
    if size < 0 or world_size < 1:
        raise ValueError(f"bad size {size} or world_size {world_size}")
    order = list(range(size))
    random.Random(seed).shuffle(order)
    base, extra = divmod(size, world_size)
    parts, start = [], 0
    for rank in range(world_size):
        length = base + (1 if rank < extra else 0)
        parts.append(order[start:start + length])
        start += length
    return parts


class ReferencePartition:
    """The grader's own Partition (a view of ``data`` at ``index``), used to isolate partition_dataset."""

    def __init__(self, data, index):
        self.data, self.index = data, list(index)

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int):
        return self.data[self.index[i]]
