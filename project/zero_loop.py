"""DeepSpeed side of ``run_finetune.py``: the ZeRO stage/offload on top of ``build_config``, and its loop.

``build_config`` (Problem 3.3) returns a ZeRO-2 config with no offload; the
entry point adapts a *copy* of it (``zero_config``)::

    --zero_stage 3          zero_optimization.stage = 3 (parameters, gradients, optimizer state sharded)
    --offload cpu           zero_optimization.offload_optimizer = {"device": "cpu"}
                            zero_force_ds_cpu_optimizer = false (keep the plain torch AdamW)

The loop (``train_engine``) calls your ``train_microbatch`` per micro-batch;
DeepSpeed counts micro-batches and steps the optimizer every
``grad_accum`` of them. After each optimizer step: the loss averaged over
the step's micro-batches and the ranks, a ``metrics.jsonl`` line, the
divergence guard (DeepSpeed has already applied the update, so a refused
step is undone by rolling back to a checkpoint), and a checkpoint every
``save_every`` steps (``engine.save_checkpoint`` plus position and RNG
states, committed atomically by ``project.checkpoint``).
"""
from __future__ import annotations

import contextlib
import copy
import math
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from project import checkpoint
from project.data import ConfigError
from project.devices import peak_memory_bytes
from project.guard import DivergenceGuard, rollback_target
from project.loop import LoopSpec
from project.metrics import StepLog
from project.train_lib import log, progress

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


def train_engine(engine, loader, spec: LoopSpec, rank: int, world_size: int, device: torch.device,
                 step_fn: Callable[[Any, torch.Tensor, torch.Tensor], float], step_log: StepLog,
                 scheduler: Any) -> dict:
    """Train ``spec.n_epochs`` epochs through ``step_fn(engine, inputs, labels)`` (``train_microbatch``).

    ``scheduler`` (a LambdaLR over the torch optimizer inside the engine) is
    stepped after every optimizer step; ``spec.lr_spike`` multiplies the lr
    of the micro-batch that completes that step.

    Returns ``{"epochs": [...], "steps": n, "rollbacks": n, "stopped_early": bool}`` like
    ``project.loop.train``; per epoch ``micro_batches`` and ``optimizer_steps`` too.
    """
    epoch = batch = step = 0
    epochs: list[dict] = []
    history: list[float] = []
    acc = _fresh_acc()
    rollbacks, stopped = 0, False

    def restore(folder: Path) -> None:
        nonlocal epoch, batch, step, epochs, history, acc
        engine.load_checkpoint(str(folder), tag=DS_TAG, load_lr_scheduler_states=False)
        state, rank_state = checkpoint.load(folder, rank)
        scheduler.load_state_dict(state["scheduler"])
        epoch, batch, step = state["position"]["epoch"], state["position"]["batch"], state["position"]["step"]
        epochs, acc, history = list(rank_state["epochs"]), dict(rank_state["acc"]), list(state["history"])
        checkpoint.set_rng_state(rank_state["current"])

    def save() -> None:
        state = {"position": {"epoch": epoch, "batch": batch, "step": step}, "history": history,
                 "scheduler": scheduler.state_dict()}
        rank_state = {"current": checkpoint.rng_state(), "epochs": epochs, "acc": acc}
        checkpoint.save(spec.save_dir, step, rank, state, rank_state, dist.barrier,
                        meta={**spec.meta, "step": step} if rank == 0 else None,
                        extra=lambda folder: engine.save_checkpoint(str(folder), tag=DS_TAG))

    if spec.resume is not None:
        restore(spec.resume)
        log(f"resumed from {spec.resume} at step {step} (epoch {epoch}, batch {batch})", spec.quiet)
    guard = DivergenceGuard(spec.spike_factor)
    guard.reset(history)
    spiked = False
    losses: list[float] = []   # of the micro-batches since the last optimizer step (a group may span epochs)
    tokens, t0 = 0, time.perf_counter()
    while epoch < spec.n_epochs and not stopped:
        rolled_back = False
        iterator = iter(loader)
        for _ in range(batch):
            next(iterator)
        for data in progress(iterator, spec.quiet or rank != 0, desc=f"epoch {epoch}", unit="micro-batch",
                             total=len(loader) - batch):
            spike = (spec.lr_spike is not None and not spiked and engine.global_steps + 1 == spec.lr_spike[0]
                     and engine.is_gradient_accumulation_boundary())
            groups = scheduler.optimizer.param_groups
            if spike:
                spiked = True
                for g in groups:
                    g["lr"] *= spec.lr_spike[1]
            losses.append(step_fn(engine, data["input_ids"].to(device), data["labels"].to(device)))
            if spike:
                for g in groups:
                    g["lr"] /= spec.lr_spike[1]
            tokens += int(data["attention_mask"].sum())
            batch += 1
            acc["micro_batches"] += 1
            if engine.global_steps == step:
                continue   # inside an accumulation group
            step = engine.global_steps
            lr = groups[0]["lr"] * (spec.lr_spike[1] if spike else 1.0)
            scheduler.step()
            totals = torch.tensor([sum(losses) / len(losses), float(tokens)], dtype=torch.float64, device=device)
            dist.all_reduce(totals)
            step_loss, step_tokens = totals[0].item() / world_size, int(totals[1].item())
            seconds = time.perf_counter() - t0
            reason = guard.check(step_loss)
            if reason is not None:
                saved = [s for s, _ in checkpoint.checkpoints(spec.save_dir)] if spec.save_dir else []
                target = rollback_target(saved, step)
                step_log.event("rollback" if target is not None else "applied", step=step, epoch=epoch,
                               loss=step_loss if math.isfinite(step_loss) else str(step_loss), reason=reason,
                               restored_step=target)
                if target is not None:
                    restore(checkpoint.step_dir(spec.save_dir, target))
                    guard.reset(history)
                    rollbacks, rolled_back = rollbacks + 1, True
                    losses, tokens, t0 = [], 0, time.perf_counter()
                    break
            history.append(step_loss)
            acc["tokens"] += tokens
            acc["loss_sum"] += sum(losses)
            acc["losses"] += len(losses)
            acc["time"] += seconds
            acc["steps"] += 1
            norm = engine.get_global_grad_norm()
            step_log.step({"step": step, "epoch": epoch, "loss": step_loss,
                           "grad_norm": float(norm) if norm is not None else None, "lr": lr,
                           "step_time_s": seconds, "tokens_per_s": step_tokens / seconds,
                           "peak_mem_bytes": peak_memory_bytes(device), "micro_batches": len(losses),
                           "tokens": step_tokens})
            losses, tokens, t0 = [], 0, time.perf_counter()
            if spec.save_every and step % spec.save_every == 0:
                save()
            if spec.max_steps is not None and step >= spec.max_steps:
                stopped = True
                if spec.save_every and step % spec.save_every:
                    save()
                break
        if rolled_back:
            continue
        if stopped and batch < len(loader):
            break
        epochs.append({"epoch": epoch, "train_time_s": acc["time"], "tokens": acc["tokens"],
                       "tokens_per_s": acc["tokens"] / max(acc["time"], 1e-12),
                       "train_loss": acc["loss_sum"] / max(acc["losses"], 1), "micro_batches": acc["micro_batches"],
                       "optimizer_steps": engine.global_steps, "steps": acc["steps"]})
        log(f"rank {rank} epoch {epoch}: train loss {epochs[-1]['train_loss']:.4f}, "
            f"{epochs[-1]['tokens_per_s']:,.0f} tokens/s, {acc['time']:.1f} s", spec.quiet)
        epoch, batch, acc = epoch + 1, 0, _fresh_acc()
    return {"epochs": epochs, "steps": step, "rollbacks": rollbacks, "stopped_early": stopped}


def _fresh_acc() -> dict:
    return {"tokens": 0, "loss_sum": 0.0, "losses": 0, "time": 0.0, "steps": 0, "micro_batches": 0}
