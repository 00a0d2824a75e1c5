"""The grader's own Problem 4 references: models, global batches, serial training. Never imports student code.

Every expected value here is a *serial* computation on the whole global batch
(one process, plain ``torch.optim``); nothing here buckets, shards or
checkpoints, so nothing here is a solution of a Problem 4 function.
"""
from __future__ import annotations

import torch
from torch import nn

from grading.problems.p1_2_comm.reference import grads_of, loss_fn, params_of, shard

GLOBAL_BATCH = 12           # divisible by 2 and 3 ranks
DDP_IN, DDP_HIDDEN, DDP_OUT = 8, 16, 4
TRAIN_STEPS = 5
MANY_SCALARS = 257          # ManyScalarsNet's parameter count: past 256, where `is` on ints stops meaning ==
SGD_LR, ADAM_LR = 0.1, 1e-2

__all__ = ["DDPProbeNet", "MiddleFrozenNet", "ManyScalarsNet", "ShuffledNet", "ZeroNet",
           "batch", "shard", "loss_fn", "grads_of", "params_of", "serial_gradients",
           "serial_training", "stacked_grads", "state_of", "flat_numel", "make_optimizer", "GLOBAL_BATCH",
           "TRAIN_STEPS"]


class DDPProbeNet(nn.Module):
    """Three linear layers, a frozen parameter (in no bucket) and a buffer (broadcast at construction)."""

    def __init__(self, seed: int = 0):
        super().__init__()
        state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        self.fc1 = nn.Linear(DDP_IN, DDP_HIDDEN)
        self.frozen = nn.Parameter(torch.ones(DDP_HIDDEN), requires_grad=False)
        self.fc2 = nn.Linear(DDP_HIDDEN, DDP_HIDDEN)
        self.fc3 = nn.Linear(DDP_HIDDEN, DDP_OUT)
        self.register_buffer("shift", torch.randn(DDP_OUT))
        torch.random.set_rng_state(state)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc1(x)) * self.frozen
        return self.fc3(torch.tanh(self.fc2(h))) + self.shift


class MiddleFrozenNet(nn.Module):
    """Five scalar parameters, each with its own gradient, the middle one frozen: a bucket loop that stops at a
    frozen parameter leaves the ones before it out."""

    def __init__(self, seed: int = 0):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.scales = nn.ParameterList(nn.Parameter(torch.randn((), generator=generator)) for _ in range(5))
        self.scales[2].requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :DDP_OUT] * (torch.stack(list(self.scales)) * torch.linspace(0.5, 1.5, 5)).sum()


class ManyScalarsNet(nn.Module):
    """``MANY_SCALARS`` one-element parameters, each with its own gradient: more buckets (one per parameter) or
    more parameters in one bucket than the 256 small ints CPython keeps one object each of."""

    def __init__(self, seed: int = 0):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.scales = nn.ParameterList(nn.Parameter(torch.randn((), generator=generator))
                                       for _ in range(MANY_SCALARS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = torch.linspace(0.5, 1.5, MANY_SCALARS)
        return x[:, :DDP_OUT] * (torch.stack(list(self.scales)) * weights).sum() / MANY_SCALARS


class Gate(nn.Module):
    """Multiplies its input by a trainable ``scale`` (a submodule, so it sits between ``inp`` and ``mid``)."""

    def __init__(self, features: int):
        super().__init__()
        self.scale = nn.Parameter(torch.rand(features) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


class ShuffledNet(nn.Module):
    """Registers its layers in another order (out, inp, gate, mid) than it computes them (inp, gate, mid, out).

    With ``skip_gate`` set, the trainable ``gate.scale`` takes no part in forward, so it receives no gradient.
    """

    def __init__(self, seed: int = 0):
        super().__init__()
        state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        self.out = nn.Linear(12, DDP_OUT)
        self.inp = nn.Linear(DDP_IN, DDP_HIDDEN)
        self.gate = Gate(DDP_HIDDEN)
        self.mid = nn.Linear(DDP_HIDDEN, 12)
        torch.random.set_rng_state(state)
        self.skip_gate = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inp(x))
        if not self.skip_gate:
            h = self.gate(h)
        return self.out(torch.tanh(self.mid(h)))


class ZeroNet(nn.Module):
    """An MLP ``sizes[0] -> sizes[1] -> ... `` (tanh between); ``last_bias`` False makes odd parameter counts."""

    def __init__(self, sizes: tuple[int, ...], seed: int = 0, last_bias: bool = True):
        super().__init__()
        state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        self.layers = nn.ModuleList(nn.Linear(a, b, bias=last_bias or k < len(sizes) - 2)
                                    for k, (a, b) in enumerate(zip(sizes, sizes[1:])))
        torch.random.set_rng_state(state)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for k, layer in enumerate(self.layers):
            x = layer(x)
            if k < len(self.layers) - 1:
                x = torch.tanh(x)
        return x


def batch(step: int, in_features: int, out_features: int, dtype: torch.dtype = torch.float32
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Global batch ``step``: inputs (GLOBAL_BATCH, in_features) and targets (GLOBAL_BATCH, out_features)."""
    g = torch.Generator().manual_seed(4000 + step)
    x = torch.randn(GLOBAL_BATCH, in_features, generator=g)
    y = torch.randn(GLOBAL_BATCH, out_features, generator=g)
    return x.to(dtype), y.to(dtype)


def stacked_grads(model: nn.Module) -> torch.Tensor:
    """The gradients of ``model``'s one-element parameters as one 1-D tensor, in registration order (NaN where a
    parameter has no gradient)."""
    return torch.stack([p.grad.detach().reshape(()) if p.grad is not None else torch.tensor(float("nan"))
                        for p in model.parameters()])


def flat_numel(model: nn.Module) -> int:
    """Elements of the trainable parameters of ``model``."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def state_of(model: nn.Module) -> dict[str, torch.Tensor]:
    """Copies of every parameter and buffer of ``model`` (the broadcast covers both)."""
    return {name: t.detach().clone() for name, t in [*model.named_parameters(), *model.named_buffers()]}


def serial_gradients(model: nn.Module, step: int, in_features: int, out_features: int) -> dict:
    """Gradients of the mean loss over global batch ``step`` (one process, no communication)."""
    x, y = batch(step, in_features, out_features)
    loss_fn(model(x), y).backward()
    return grads_of(model)


def serial_training(model: nn.Module, optimizer_name: str, in_features: int, out_features: int,
                    steps: int = TRAIN_STEPS, dtype: torch.dtype = torch.float32, grad_scale: float = 1.0
                    ) -> dict[str, torch.Tensor]:
    """Parameters after ``steps`` steps of ``sgd`` (lr 0.1) or ``adam`` (lr 1e-2) on the global batches 0..steps-1.

    ``grad_scale`` multiplies every gradient before the step (a likely-cause probe: a sum that was not divided).
    """
    optimizer = make_optimizer(optimizer_name, [p for p in model.parameters() if p.requires_grad])
    for step in range(steps):
        optimizer.zero_grad()
        x, y = batch(step, in_features, out_features, dtype)
        loss_fn(model(x), y).backward()
        if grad_scale != 1.0:
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.mul_(grad_scale)
        optimizer.step()
    return params_of(model)


def make_optimizer(name: str, params) -> torch.optim.Optimizer:
    """The optimizer every Problem 4 probe and reference uses for ``name`` (``sgd`` or ``adam``)."""
    return torch.optim.SGD(params, lr=SGD_LR) if name == "sgd" else torch.optim.Adam(params, lr=ADAM_LR)
