"""DeepSpeed side of ``run_finetune.py``: the ZeRO stage/offload on top of ``build_config``, and its update.

``zero_config`` adapts a copy of the student's ``build_config`` (Problem 3.3: ZeRO-2, no offload) to
``--zero_stage`` and ``--offload``; ``DeepSpeedUpdate`` runs the engine through the one loop (``project.loop``).
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

    ``stage`` goes to ``zero_optimization.stage``; ``offload`` ``cpu`` sets
    ``zero_optimization.offload_optimizer = {"device": "cpu"}`` and
    ``zero_force_ds_cpu_optimizer = False``. Raises ConfigError for a stage
    other than 2 or 3 or an unknown offload.
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
    is the plain mean of its micro-batches' losses. The engine also averages
    the gradients over the ranks (the loop's ``REDUCED_BY_ENGINE``) and
    applies the update at the last micro-batch of each ``grad_accum`` group,
    so a step the divergence guard refuses is rolled back to a checkpoint, or
    kept when there is none.
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
