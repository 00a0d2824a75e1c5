"""Problem 1.2 references: a small model, its batches, and serial (one-process) training.

Never imports student code and computes nothing a student function returns:
the probe (child) and the criteria (parent) build the same model and batches
from these functions with the same seeds, and the parent recomputes the
serial global-batch gradients and SGD steps that data-parallel training must
reproduce.
"""
from __future__ import annotations

import torch
from torch import nn

IN_FEATURES, HIDDEN, OUT_FEATURES = 6, 8, 4
GLOBAL_BATCH = 12           # divisible by 2 and 3 ranks
LEARNING_RATE = 0.1
TRAIN_STEPS = 3
LOSS_TILT = 0.5             # loss_fn's extra gradient per output element (divided by their count)


class FrozenScale(nn.Module):
    """Multiplies its input elementwise by ``weight`` (ones), a parameter with ``requires_grad=False``."""

    def __init__(self, size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


class GradProbeNet(nn.Module):
    """A small MLP with one unused layer (its grads stay None) and one frozen parameter, ``frozen.weight``.

    ``frozen.weight`` has ``requires_grad=False``, so its grad stays None in
    training; ``backward_then_freeze`` gives it a stale grad instead.
    """

    def __init__(self, seed: int = 0):
        super().__init__()
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        self.fc1 = nn.Linear(IN_FEATURES, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, OUT_FEATURES)
        self.unused = nn.Linear(HIDDEN, OUT_FEATURES)
        self.frozen = FrozenScale(OUT_FEATURES)
        torch.random.set_rng_state(generator_state)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.frozen(self.fc2(torch.tanh(self.fc1(x))))


def batch(step: int, batch_seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step``: inputs (GLOBAL_BATCH, 6), targets (GLOBAL_BATCH, 4)."""
    g = torch.Generator().manual_seed(1000 + 7919 * batch_seed + step)
    return torch.randn(GLOBAL_BATCH, IN_FEATURES, generator=g), torch.randn(GLOBAL_BATCH, OUT_FEATURES, generator=g)


def shard(tensor: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s contiguous equal slice of a global batch."""
    size = tensor.shape[0] // world_size
    return tensor[rank * size:(rank + 1) * size]


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The loss the probe hands to ``train_step``: its value is the MSE, its gradient is not.

    The added tilt ``LOSS_TILT * (mean - mean.detach())`` is exactly zero but adds ``LOSS_TILT / numel`` to
    every output's gradient, so a ``train_step`` that computes its own MSE instead of calling the ``loss_fn``
    it was given returns the right loss and takes the wrong step. A mean over the shard, so averaging equal
    shards' gradients still gives the global batch's.
    """
    mean = output.mean()
    return nn.functional.mse_loss(output, target) + LOSS_TILT * (mean - mean.detach())


FROZEN_WITH_GRAD = "frozen.weight"    # the parameter backward_then_freeze leaves frozen but holding a grad


def backward_then_freeze(model: GradProbeNet, inputs: torch.Tensor, targets: torch.Tensor) -> None:
    """``loss_fn`` backward with ``frozen.weight`` trainable, then ``requires_grad_(False)`` again.

    ``frozen.weight`` then holds a gradient while ``requires_grad`` is False
    (a parameter frozen after a backward): an existing gradient, which
    ``average_gradients`` averages like every other one.
    """
    frozen = model.get_parameter(FROZEN_WITH_GRAD)
    frozen.requires_grad_(True)
    loss_fn(model(inputs), targets).backward()
    frozen.requires_grad_(False)


def grads_of(model: nn.Module) -> dict[str, torch.Tensor | None]:
    return {name: (p.grad.detach().clone() if p.grad is not None else None) for name, p in model.named_parameters()}


def params_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def serial_gradients(seed: int = 0, step: int = 0, batch_seed: int = 0) -> dict[str, torch.Tensor | None]:
    """Gradients of the mean loss over the whole global batch of ``step`` (one process), ``frozen.weight``'s
    included (``backward_then_freeze``)."""
    model = GradProbeNet(seed)
    backward_then_freeze(model, *batch(step, batch_seed))
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
