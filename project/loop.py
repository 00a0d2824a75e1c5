"""The training loop shared by ``run_data_parallel.py`` and ``run_pipeline.py``.

One optimizer step, top to bottom::

    for each of K = grad_accum batches:   loss_i = loss_of(batch) under autocast
                                          backward(loss_i * rows_i / rows of the K batches)
    loss = all-reduced mean over ranks    (the divergence guard may refuse the step here)
    reduce_grads()                        (data parallel: average_gradients, once per step)
    optimizer step (lr x FACTOR at --lr_spike STEP), scheduler step, metrics line, checkpoint

Weighting each micro-batch by its share of the rows makes the accumulated
gradient the gradient of the K-times-larger batch. Checkpoints hold the
model, optimizer, scheduler, gradient scaler, the data position (epoch,
batches done) and every rank's RNG states, both now and at the start of the
epoch: resuming replays the epoch's data order and skips the batches done,
so a resumed run takes bitwise the same steps as an uninterrupted one.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from project import checkpoint
from project.devices import peak_memory_bytes
from project.guard import DivergenceGuard, rollback_target
from project.metrics import StepLog
from project.precision import autocast, grad_scaler
from project.train_lib import log, progress, save_dir


@dataclass
class LoopSpec:
    """How to train: the options of ``add_training_args`` (see there), resolved."""

    n_epochs: int
    grad_accum: int = 1
    precision: str = "fp32"
    save_every: int = 0
    save_dir: Path | None = None
    resume: Path | None = None
    max_steps: int | None = None
    spike_factor: float = 2.0
    lr_spike: tuple[int, float] | None = None
    quiet: bool = True
    meta: dict = field(default_factory=dict)   # sizes a resume must match (world size, batch, accumulation)


@dataclass
class LoopParts:
    """What the loop trains: the runner builds these.

    ``loss_of(batch, epoch, index)`` returns the loss tensor of one batch
    (``index``: position of the batch in the epoch); ``reduce_grads()``
    combines gradients over ranks once per step; ``all_reduce_sum(t)``
    sums a small tensor over ranks; ``barrier()`` waits for every rank.
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    loader: Any
    loss_of: Callable[[dict, int, int], torch.Tensor]
    device: torch.device
    rank: int = 0
    world_size: int = 1
    reduce_grads: Callable[[], None] = lambda: None
    all_reduce_sum: Callable[[torch.Tensor], torch.Tensor] = lambda t: t
    barrier: Callable[[], None] = lambda: None
    step_log: StepLog | None = None


def prepare_run(args, folder: Path, rank: int, meta: dict,
                val_loss: Callable[[], float]) -> tuple[LoopSpec, StepLog, float]:
    """``(LoopSpec, StepLog, validation loss before training)`` of a run, from its command line.

    ``args`` holds the options of ``add_common_args``/``add_training_args``;
    ``folder`` is where ``metrics.jsonl`` (and by default the checkpoints)
    go; ``meta`` is what a resume must match. On ``--resume`` the loss before
    training comes from the checkpoint (``val_loss`` is not called) and the
    step log keeps its lines up to the checkpoint's step.
    """
    resume = checkpoint.resolve(args.resume) if args.resume else None
    saved = checkpoint.read_meta(resume) if resume else None
    before = saved["carry"]["val_loss_before"] if saved else val_loss()
    step_log = StepLog(folder, enabled=rank == 0, resume_step=saved["step"] if saved else None,
                       tensorboard=args.tensorboard)
    spec = LoopSpec(n_epochs=args.n_epochs, grad_accum=args.grad_accum, precision=args.precision,
                    save_every=args.save_every, save_dir=save_dir(args, folder), resume=resume,
                    max_steps=args.max_steps, spike_factor=args.spike_factor, lr_spike=args.lr_spike,
                    quiet=args.quiet, meta={**meta, "carry": {"val_loss_before": before}})
    return spec, step_log, before


def make_scheduler(optimizer: torch.optim.Optimizer, kind: str, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """``constant`` (lr as given) or ``cosine`` (from lr down to 10 % of it over ``total_steps``), a LambdaLR."""
    if kind == "constant":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    total = max(total_steps, 1)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 0.1 + 0.45 * (1 + math.cos(math.pi * min(step, total) / total)))


def steps_per_epoch(batches: int, grad_accum: int) -> int:
    """Optimizer steps in an epoch of ``batches`` batches (the last step may accumulate fewer)."""
    return math.ceil(batches / grad_accum)


def _rows(batch: dict) -> int:
    return int(batch["input_ids"].shape[0])


def _loader_rng(loader) -> torch.Tensor | None:
    generator = getattr(loader, "generator", None)
    return generator.get_state() if generator is not None else None


def _set_loader_rng(loader, state: torch.Tensor | None) -> None:
    if state is not None:
        loader.generator.set_state(state)


class _Run:
    """The mutable state of one training run (position, accumulators) and its checkpoint I/O."""

    def __init__(self, parts: LoopParts, spec: LoopSpec):
        self.parts, self.spec = parts, spec
        self.scaler = grad_scaler(spec.precision, parts.device.type)
        self.epoch = self.batch = self.step = 0
        self.epochs: list[dict] = []
        self.acc = {"tokens": 0, "loss_sum": 0.0, "steps": 0, "time": 0.0, "micro_batches": 0}
        self.history: list[float] = []
        self.epoch_rng: dict = {}
        self.rollbacks = 0

    # -- checkpoints ---------------------------------------------------------------------------------

    def _rank_state(self) -> dict:
        """What differs between ranks: RNG states now and at the epoch's start, this rank's metrics so far."""
        return {"current": checkpoint.rng_state(), "current_loader": _loader_rng(self.parts.loader),
                "epoch_start": self.epoch_rng, "epochs": self.epochs, "acc": self.acc}

    def save(self) -> None:
        """Write this step's checkpoint from every rank (a collective: every rank calls it)."""
        p, spec = self.parts, self.spec
        state = None
        if p.rank == 0:
            state = {"model": p.model.state_dict(), "optimizer": p.optimizer.state_dict(),
                     "scheduler": p.scheduler.state_dict(),
                     "scaler": self.scaler.state_dict() if self.scaler else None,
                     "position": {"epoch": self.epoch, "batch": self.batch, "step": self.step},
                     "history": self.history}
        meta = {**spec.meta, "step": self.step, "epoch": self.epoch, "batch": self.batch}
        checkpoint.save(spec.save_dir, self.step, p.rank, state, self._rank_state(), p.barrier,
                        meta=meta if p.rank == 0 else None)

    def restore(self, folder: Path) -> None:
        """Load a checkpoint folder into the model, optimizer, scheduler, scaler and the run's position."""
        p = self.parts
        state, rank_state = checkpoint.load(folder, p.rank)
        p.model.load_state_dict(state["model"])
        p.optimizer.load_state_dict(state["optimizer"])
        p.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        p.optimizer.zero_grad(set_to_none=True)
        position = state["position"]
        self.epoch, self.batch, self.step = position["epoch"], position["batch"], position["step"]
        self.epochs, self.acc = list(rank_state["epochs"]), dict(rank_state["acc"])
        self.history = list(state["history"])
        self.epoch_rng = rank_state["epoch_start"]
        self._resume_rng = rank_state

    # -- the data of one epoch, from the current position ----------------------------------------------

    def batches(self):
        """An iterator over the current epoch's batches from ``self.batch`` on, RNG as in the original run."""
        loader = self.parts.loader
        resumed = getattr(self, "_resume_rng", None)
        if resumed is not None:
            checkpoint.set_rng_state(self.epoch_rng["global"])
            _set_loader_rng(loader, self.epoch_rng["loader"])
        else:
            self.epoch_rng = {"global": checkpoint.rng_state(), "loader": _loader_rng(loader)}
        iterator = iter(loader)
        for _ in range(self.batch):
            next(iterator)
        if resumed is not None:
            checkpoint.set_rng_state(resumed["current"])
            _set_loader_rng(loader, resumed["current_loader"])
            self._resume_rng = None
        return iterator


def train(parts: LoopParts, spec: LoopSpec) -> dict:
    """Train ``spec.n_epochs`` epochs (or up to ``spec.max_steps`` steps); return what happened.

    Returns ``{"epochs": [per-epoch metrics], "steps": optimizer steps taken,
    "rollbacks": n, "stopped_early": bool}``; per epoch: ``train_time_s``,
    ``tokens`` (this rank's real tokens), ``tokens_per_s``, ``train_loss``
    (mean of this rank's step losses), ``steps`` and ``micro_batches``.
    """
    run = _Run(parts, spec)
    if spec.resume is not None:
        run.restore(spec.resume)
        log(f"resumed from {spec.resume} at step {run.step} (epoch {run.epoch}, batch {run.batch})", spec.quiet)
    guard = DivergenceGuard(spec.spike_factor)
    guard.reset(run.history)
    spiked = False
    stopped = False
    p = parts
    params = [q for q in p.model.parameters() if q.requires_grad]
    while run.epoch < spec.n_epochs and not stopped:
        iterator = run.batches()
        quiet = spec.quiet or p.rank != 0
        bar = progress(range(len(p.loader) - run.batch), quiet, desc=f"epoch {run.epoch}", unit="batch")
        bar_iter = iter(bar)
        rolled_back = False
        while True:
            t0 = time.perf_counter()
            group = []
            for batch in iterator:
                group.append(batch)
                next(bar_iter, None)
                if len(group) == spec.grad_accum:
                    break
            if not group:
                break
            rows = sum(_rows(b) for b in group)
            loss_sum, tokens = 0.0, 0
            for k, batch in enumerate(group):
                with autocast(spec.precision, p.device.type):
                    loss = p.loss_of(batch, run.epoch, run.batch + k)
                weighted = loss * (_rows(batch) / rows)
                (run.scaler.scale(weighted) if run.scaler else weighted).backward()
                loss_sum += loss.item() * _rows(batch) / rows
                tokens += int(batch["attention_mask"].sum())
            totals = p.all_reduce_sum(torch.tensor([loss_sum, float(tokens)], dtype=torch.float64,
                                                   device=p.device))
            step_loss, step_tokens = totals[0].item() / p.world_size, int(totals[1].item())
            step = run.step + 1
            reason = guard.check(step_loss)
            if reason is not None:
                p.optimizer.zero_grad(set_to_none=True)
                saved = [s for s, _ in checkpoint.checkpoints(spec.save_dir)] if spec.save_dir else []
                target = rollback_target(saved, step)
                if p.step_log:
                    p.step_log.event("rollback" if target is not None else "skip", step=step, epoch=run.epoch,
                                     loss=step_loss if math.isfinite(step_loss) else str(step_loss),
                                     reason=reason, restored_step=target)
                log(f"divergence guard at step {step}: {reason}; "
                    + (f"rolled back to step {target}" if target is not None else "step skipped"), spec.quiet)
                if target is not None:
                    run.restore(checkpoint.step_dir(spec.save_dir, target))
                    guard.reset(run.history)
                    run.rollbacks += 1
                    rolled_back = True
                    break
                run.step, run.batch = step, run.batch + len(group)
                continue
            p.reduce_grads()
            if run.scaler:
                run.scaler.unscale_(p.optimizer)
            grads = [q.grad for q in params if q.grad is not None]
            grad_norm = torch.nn.utils.get_total_norm(grads).item() if grads else 0.0
            spike = spec.lr_spike is not None and step == spec.lr_spike[0] and not spiked
            if spike:
                spiked = True
                for g in p.optimizer.param_groups:
                    g["lr"] *= spec.lr_spike[1]
            lr = p.optimizer.param_groups[0]["lr"]
            if run.scaler:
                run.scaler.step(p.optimizer)
                run.scaler.update()
            else:
                p.optimizer.step()
            if spike:
                for g in p.optimizer.param_groups:
                    g["lr"] /= spec.lr_spike[1]
            p.scheduler.step()
            p.optimizer.zero_grad(set_to_none=True)
            if p.device.type == "cuda":
                torch.cuda.synchronize(p.device)
            seconds = time.perf_counter() - t0
            run.step, run.batch = step, run.batch + len(group)
            run.history.append(step_loss)
            run.acc["tokens"] += tokens
            run.acc["loss_sum"] += loss_sum
            run.acc["steps"] += 1
            run.acc["time"] += seconds
            run.acc["micro_batches"] += len(group)
            if p.step_log:
                p.step_log.step({"step": step, "epoch": run.epoch, "loss": step_loss, "grad_norm": grad_norm,
                                 "lr": lr, "step_time_s": seconds, "tokens_per_s": step_tokens / seconds,
                                 "peak_mem_bytes": peak_memory_bytes(p.device), "micro_batches": len(group),
                                 "tokens": step_tokens})
            if spec.save_every and step % spec.save_every == 0:
                run.save()
            if spec.max_steps is not None and step >= spec.max_steps:
                stopped = True
                if spec.save_every and step % spec.save_every:
                    run.save()   # an interrupted run always leaves its last step behind
                break
        if rolled_back:
            continue
        if stopped and run.batch < len(p.loader):
            break
        acc = run.acc
        run.epochs.append({"epoch": run.epoch, "train_time_s": acc["time"], "tokens": acc["tokens"],
                           "tokens_per_s": acc["tokens"] / max(acc["time"], 1e-12),
                           "train_loss": acc["loss_sum"] / max(acc["steps"], 1), "steps": acc["steps"],
                           "micro_batches": acc["micro_batches"]})
        log(f"rank {p.rank} epoch {run.epoch}: train loss {run.epochs[-1]['train_loss']:.4f}, "
            f"{run.epochs[-1]['tokens_per_s']:,.0f} tokens/s, {acc['time']:.1f} s", spec.quiet)
        run.epoch, run.batch = run.epoch + 1, 0
        run.acc = {"tokens": 0, "loss_sum": 0.0, "steps": 0, "time": 0.0, "micro_batches": 0}
    return {"epochs": run.epochs, "steps": run.step, "rollbacks": run.rollbacks, "stopped_early": stopped}
