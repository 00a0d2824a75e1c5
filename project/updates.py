"""How one optimizer step's gradients are made and applied: the strategy the training loop is given.

``project.loop`` writes the step once and asks its strategy (``TorchUpdate``; an engine's, e.g.
``project.zero_engine.DeepSpeedUpdate``) for ``weights(rows)``, ``zero_grad()``, ``forward_backward`` (an engine may
also step here), ``grad_norm()``, ``step()``, ``state_dict``/``load_state_dict`` (rank 0's checkpoint part),
``save_files``/``load_files`` (every rank's own files), and two facts: ``spans_epochs`` (an accumulation group may run
on across an epoch's end) and ``applied_in_backward`` (the update is applied before the guard sees the loss).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from project.precision import autocast, grad_scaler


class TorchUpdate:
    """Plain torch: each micro-batch's loss under autocast, weighted by its share of the step's rows, backward
    (scaled by a ``GradScaler`` for fp16); then one optimizer step over the accumulated gradient.

    Weighting by rows makes K accumulated batches give the gradient of the
    K-times larger batch. ``loss_of(batch, epoch, index)`` returns the loss
    tensor of one batch (``index``: its position in the epoch).
    """

    spans_epochs = False
    applied_in_backward = False

    def __init__(self, model: torch.nn.Module, optimizer: Any, loss_of: Callable[[dict, int, int], torch.Tensor],
                 precision: str = "fp32", device_type: str = "cpu"):
        self.model, self.optimizer, self.loss_of = model, optimizer, loss_of
        self.precision, self.device_type = precision, device_type
        self.scaler = grad_scaler(precision, device_type)

    def weights(self, rows: list[int]) -> list[float]:
        """Each micro-batch's share of the step's rows."""
        total = sum(rows)
        return [r / total for r in rows]

    def zero_grad(self) -> None:
        """Drop the gradients of the previous step (set to None)."""
        self.optimizer.zero_grad(set_to_none=True)

    def forward_backward(self, batch: dict, weight: float, epoch: int, index: int) -> float:
        """Forward (autocast), backward of ``weight`` x the loss; return the unweighted local loss."""
        with autocast(self.precision, self.device_type):
            loss = self.loss_of(batch, epoch, index)
        weighted = loss * weight
        (self.scaler.scale(weighted) if self.scaler else weighted).backward()
        return loss.item()

    def grad_norm(self) -> float:
        """The total 2-norm of the model's gradients (unscaled under fp16; nothing is changed)."""
        grads = [q.grad for q in self.model.parameters() if q.grad is not None]
        if not grads:
            return 0.0
        norm = torch.nn.utils.get_total_norm(grads).item()
        return norm / self.scaler.get_scale() if self.scaler else norm

    def step(self) -> None:
        """The optimizer step (through the scaler under fp16, which skips steps with inf/nan gradients)."""
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()

    def state_dict(self) -> dict:
        """Model, optimizer and scaler states, for rank 0's checkpoint file."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict() if self.scaler else None}

    def load_state_dict(self, state: dict) -> None:
        """Load what ``state_dict`` saved; gradients are dropped."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler is not None and state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        self.optimizer.zero_grad(set_to_none=True)

    def save_files(self, folder: Path) -> None:
        """Nothing: everything is in ``state_dict``."""

    def load_files(self, folder: Path) -> None:
        """Nothing: everything is in ``state_dict``."""
