"""One benchmark worker's world and the pieces every stepper is made of (ours, the peers, Problem 4/5 groups).

- ``Context``: role, rank, device, the workload, the cached steppers, this rank's rows of a batch;
- ``Stepper``: ``step(batch_index)`` plus untimed ``prepare``/``close`` and an optional timeline;
- ``local_step``: zero_grad, forward, ``lm_loss``, backward, a hook (e.g. a gradient all-reduce), step.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from project.bench.workload import fresh_model
from project.model import lm_loss


@dataclass
class Stepper:
    """``step(batch_index)`` runs one training step; ``prepare()`` (untimed) runs before every run."""

    step: Callable[[int], Any]
    prepare: Callable[[], None] = lambda: None
    close: Callable[[], None] = lambda: None
    timeline: Callable[[], list] | None = None   # per-step tasks of the last step, when recorded


@dataclass
class Context:
    """One worker's world: its role (``solo`` or ``pair``), rank, device, workload and cached steppers."""

    role: str
    rank: int
    world_size: int
    device: torch.device
    folder: Path
    workload: dict
    steppers: dict[str, Stepper] = field(default_factory=dict)

    def batch(self, index: int, rows: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """``(input_ids, labels)`` of global batch ``index`` on this device: this rank's rows when ``rows``."""
        b = self.workload["batches"][index]
        x, y = b["input_ids"], b["labels"]
        if rows and self.world_size > 1:
            share = x.shape[0] // self.world_size
            x, y = x[self.rank * share:(self.rank + 1) * share], y[self.rank * share:(self.rank + 1) * share]
        return x.to(self.device), y.to(self.device)

    def half(self, index: int, part: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of global batch ``index`` that rank ``part`` of world size 2 trains on."""
        b = self.workload["batches"][index]
        share = b["input_ids"].shape[0] // 2
        sl = slice(part * share, (part + 1) * share)
        return b["input_ids"][sl].to(self.device), b["labels"][sl].to(self.device)

    def sync(self) -> None:
        """Wait for every GPU this process may have used (a pipeline's stages sit on several)."""
        if self.device.type == "cuda":
            for index in range(torch.cuda.device_count()):
                torch.cuda.synchronize(index)

    def model(self) -> torch.nn.Module:
        """A fresh copy of the workload's model on this worker's device, in train mode."""
        return fresh_model(self.workload, self.device)


def local_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
               between: Callable[[], None] = lambda: None) -> None:
    """zero_grad, forward, ``lm_loss``, backward, ``between()`` (e.g. a gradient all-reduce), optimizer step."""
    optimizer.zero_grad()
    lm_loss(model(x), y).backward()
    between()
    optimizer.step()
