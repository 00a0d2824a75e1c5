"""DeepSpeed side of ``run_finetune.py``: the ZeRO stage/offload on top of ``build_config``, and its update.

``build_config`` (Problem 3.3) returns a ZeRO-2 config with no offload; the
entry point adapts a *copy* of it (``zero_config``)::

    --zero_stage 3          zero_optimization.stage = 3 (parameters, gradients, optimizer state sharded)
    --offload cpu           zero_optimization.offload_optimizer = {"device": "cpu"}
                            zero_force_ds_cpu_optimizer = false (keep the plain torch AdamW)

Training runs through the one loop (``project.loop``) with
``DeepSpeedUpdate`` as its update strategy: your ``train_microbatch`` runs
forward, ``engine.backward`` and ``engine.step`` per micro-batch, and the
engine averages the gradients (``REDUCED_BY_ENGINE``), accumulates
``grad_accum`` micro-batches (counted across epoch ends) and applies the
update at the last one. The divergence guard sees the step's loss only
after that, so a refused step is undone by rolling back to a checkpoint, or
kept when there is none. Checkpoints add ``engine.save_checkpoint`` (every
rank) to the run's own state (``project.checkpoint``).
"""
from __future__ import annotations

import contextlib
import copy
from pathlib import Path
from typing import Any, Callable

import torch

from project.cli import ConfigError

ZERO_STAGES = (2, 3)
OFFLOADS = ("none", "cpu")
DS_TAG = "deepspeed"


def zero_config(config: dict[str, Any], stage: int, offload: str) -> dict[str, Any]:
    """A copy of ``config`` (from ``build_config``) with ZeRO ``stage`` and optimizer ``offload``.

    Raises ConfigError for a stage other than 2 or 3 or an unknown offload.
    """
    if stage not in ZERO_STAGES:
        raise ConfigError(f"--zero_stage {stage}: choose 2 or 3")
    if offload not in OFFLOADS:
        raise ConfigError(f"--offload {offload!r}: choose none or cpu")
    out = copy.deepcopy(config)
    out["zero_optimization"] = {**out.get("zero_optimization", {}), "stage": stage}
    if offload == "cpu":
        out["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
        out["zero_force_ds_cpu_optimizer"] = False   # keep the plain torch optimizer the runner passes
    return out


def gathered(engine, params: list[torch.nn.Parameter]) -> contextlib.AbstractContextManager:
    """Full copies of ``params`` on every rank for the block (ZeRO-3 shards them; a collective); else a no-op."""
    if engine.zero_optimization_stage() == 3:
        import deepspeed

        return deepspeed.zero.GatheredParameters(params, modifier_rank=None)
    return contextlib.nullcontext()


class DeepSpeedUpdate:
    """The loop's update strategy for a DeepSpeed engine (see ``project.updates`` for the interface).

    ``step_fn(engine, input_ids, labels)`` (``train_microbatch``) runs one
    micro-batch: forward, ``engine.backward``, ``engine.step``. The engine
    scales each micro-batch by ``1 / grad_accum`` itself, so the step's loss
    is the plain mean of its micro-batches' losses.
    """

    spans_epochs = True          # DeepSpeed counts micro-batches over the whole run
    applied_in_backward = True   # the group's last engine.step() has applied the update

    def __init__(self, engine: Any, step_fn: Callable[[Any, torch.Tensor, torch.Tensor], float],
                 device: torch.device):
        self.engine, self.step_fn, self.device = engine, step_fn, device

    def weights(self, rows: list[int]) -> list[float]:
        """Equal shares: the engine averages its micro-batches."""
        return [1.0 / len(rows)] * len(rows)

    def zero_grad(self) -> None:
        """Nothing: the engine clears its gradients after each update."""

    def forward_backward(self, batch: dict, weight: float, epoch: int, index: int) -> float:
        """``step_fn`` on the micro-batch (the engine weights it); return its loss."""
        return self.step_fn(self.engine, batch["input_ids"].to(self.device), batch["labels"].to(self.device))

    def grad_norm(self) -> float | None:
        """The engine's global gradient norm of its last update (None before the first)."""
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else None

    def step(self) -> None:
        """Nothing: the engine applied the update in the group's last ``engine.step()``."""

    def state_dict(self) -> dict:
        """Nothing for rank 0's file: the engine writes its own (``save_files``)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Nothing: see ``load_files``."""

    def save_files(self, folder: Path) -> None:
        """``engine.save_checkpoint`` into ``folder`` (every rank: its shards)."""
        self.engine.save_checkpoint(str(folder), tag=DS_TAG)

    def load_files(self, folder: Path) -> None:
        """``engine.load_checkpoint`` from ``folder`` (weights, optimizer shards, step counters)."""
        self.engine.load_checkpoint(str(folder), tag=DS_TAG, load_lr_scheduler_states=False)
