"""Problem 2.2 references: the layers, batches and plain (unsplit) model ``Pipe`` must reproduce.

Never imports student code (``pipeline/``) and computes nothing a student
function returns: the probe (child) and the criteria (parent) build the same
layers and batches from these functions with the same seeds, and the parent
runs the plain sequential model to get the expected outputs and gradients.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

# ------------------------------------------------------------------ 2.2: layers and batches
# One width everywhere: a stage fed the wrong micro-batch (a late-binding bug) computes wrong numbers
# instead of crashing on a shape mismatch, so the bug costs the value checks, not the dispatch checks.
IN_FEATURES = HIDDEN = OUT_FEATURES = 8
LEARNING_RATE = 0.1
SGD_STEPS = 3
# layer index ranges of each stage, by number of stages
STAGE_CUTS = {1: [(0, 7)], 2: [(0, 3), (3, 7)], 3: [(0, 2), (2, 4), (4, 7)]}


def build_layers(seed: int = 0) -> list[nn.Module]:
    """Seven layers (4 Linear 8 -> 8, 3 Tanh) of a small MLP; the global RNG is left as it was."""
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    layers = [nn.Linear(IN_FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
              nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, OUT_FEATURES)]
    torch.random.set_rng_state(state)
    return layers


def stage_layers(layers: Sequence[nn.Module], stages: int) -> list[nn.Sequential]:
    """``layers`` cut into ``stages`` consecutive nn.Sequential stages (shared modules)."""
    return [nn.Sequential(*layers[a:b]) for a, b in STAGE_CUTS[stages]]


def batch(rows: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs (rows, 8) and regression targets (rows, 8)."""
    g = torch.Generator().manual_seed(500 + seed)
    return torch.randn(rows, IN_FEATURES, generator=g), torch.randn(rows, OUT_FEATURES, generator=g)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, target.to(output.device))


def sequential_forward(rows: int, seed: int = 0, model_seed: int = 0) -> torch.Tensor:
    """The plain model's output for ``batch(rows, seed)``."""
    with torch.no_grad():
        return nn.Sequential(*build_layers(model_seed))(batch(rows, seed)[0])


def sequential_gradients(rows: int, seed: int = 0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Gradient of ``loss_fn`` w.r.t. the input and every parameter (names as in nn.Sequential)."""
    model = nn.Sequential(*build_layers(0))
    inputs, targets = batch(rows, seed)
    inputs.requires_grad_(True)
    loss_fn(model(inputs), targets).backward()
    return inputs.grad, {name: p.grad for name, p in model.named_parameters()}


def sequential_sgd(rows: int, steps: int = SGD_STEPS) -> dict[str, torch.Tensor]:
    """Parameters after ``steps`` SGD steps of the plain model on ``batch(rows, step)``."""
    model = nn.Sequential(*build_layers(0))
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    for step in range(steps):
        inputs, targets = batch(rows, step)
        optimizer.zero_grad()
        loss_fn(model(inputs), targets).backward()
        optimizer.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


class FailingStage(nn.Module):
    """A stage that raises ValueError(MESSAGE) when called: its error must reach the caller.

    ``called_in`` collects the names of the threads that called it (a stage must run on its worker).
    """

    MESSAGE = "deliberate failure in the grader's stage"

    def __init__(self):
        super().__init__()
        self.called_in: list[str] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import threading
        self.called_in.append(threading.current_thread().name)
        raise ValueError(self.MESSAGE)


class InputDevices(nn.Module):
    """A stage that notes the device of every input it receives (``received``), then runs ``inner`` on it.

    With ``inner`` on ``meta`` after a ``cpu`` stage, it receives a meta tensor only where the Pipe moved this
    stage's own input (the previous stage's output) to the stage's device and passed on the moved tensor: a
    move that a CPU grader can see.
    """

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self.received: list[str] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.received.append(str(x.device))
        return self.inner(x)


class MovesItsInput(nn.Module):
    """A stage that moves its input to ``device`` itself before running ``inner`` (on ``device``).

    Wherever a Pipe leaves a stage's input, this stage computes on its own device, so a probe built from it
    judges only what the Pipe does with the results.
    """

    def __init__(self, inner: nn.Module, device: torch.device | str):
        super().__init__()
        self.inner, self.device = inner, torch.device(device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x.to(self.device))
