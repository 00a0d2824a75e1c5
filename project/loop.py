"""The one training loop: data parallel, pipeline, tensor parallel, ZeRO (DeepSpeed) and the capstone.

An entry point's rank function calls ``prepare_run`` (the ``LoopSpec`` and step log of its ``RunConfig``),
``make_scheduler`` and ``train``. One optimizer step is written once (``_step``); what differs between runs is
passed in (``LoopParts``): the update strategy (``project.updates``), ``reduce_grads`` and the checkpoint store.
The ``DivergenceGuard`` refuses a step whose loss spikes or is not finite: it is rolled back, skipped or kept.
"""
from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from project.checkpoint import RunState, StepFolders
from project.config import RunConfig
from project.devices import peak_memory_bytes
from project.output import GUARD_EVENT, StepLog, log, progress
from project.updates import TorchUpdate


class GradReduction:
    """A named reason why the loop has no gradient reduction to call (``LoopParts.reduce_grads``)."""

    def __init__(self, name: str, meaning: str):
        self.name, self.meaning = name, meaning

    def __repr__(self) -> str:
        return self.name


SINGLE_REPLICA = GradReduction("SINGLE_REPLICA", "one copy of the model sees all the data: nothing to average "
                                                 "(pipeline; tensor-parallel ranks share one copy)")
REDUCED_BY_ENGINE = GradReduction("REDUCED_BY_ENGINE", "the engine averages the gradients itself (DeepSpeed)")
_UNSET: Any = GradReduction("UNSET", "nobody said")
WINDOW = 20        # accepted losses the divergence guard's median is taken over
MIN_HISTORY = 5    # accepted steps before spikes are judged (the first losses fall fast)


@dataclass
class LoopSpec:
    """How to train: the options of ``project.options.add_training_args`` (see there), resolved (``prepare_run``)."""

    n_epochs: int
    grad_accum: int = 1
    precision: str = "fp32"
    save_every: int = 0
    save_dir: Path | None = None
    keep_last: int = 3                          # checkpoints kept (pruned after each successful save)
    resume: Path | None = None
    max_steps: int | None = None
    spike_factor: float = 2.0
    lr_spike: tuple[int, float] | None = None
    quiet: bool = True
    meta: dict = field(default_factory=dict)   # sizes a resume must match (world size, batch, accumulation)


@dataclass(kw_only=True)
class LoopParts:
    """What the loop trains: the runner builds these.

    ``reduce_grads`` is required: a function combining the gradients over the
    data-parallel ranks once per step (``lambda: average_gradients(model)``,
    ``ddp.finish_gradient_synchronization``), or ``SINGLE_REPLICA`` /
    ``REDUCED_BY_ENGINE``; leaving it out raises TypeError here, so no run
    can train unaveraged by accident. ``loss_of(batch, epoch, index)`` is the
    loss of one batch for the default ``TorchUpdate``; ``update`` replaces
    that strategy, ``checkpoints`` the default store (``StepFolders`` under
    ``LoopSpec.save_dir``). ``all_reduce_sum(t)`` sums a small tensor over
    the ranks; ``barrier()`` waits for every rank. ``scheduler`` may be None.
    """

    model: torch.nn.Module
    optimizer: Any
    scheduler: Any
    loader: Any
    device: torch.device
    reduce_grads: Callable[[], None] | GradReduction = _UNSET
    loss_of: Callable[[dict, int, int], torch.Tensor] | None = None
    update: Any = None
    checkpoints: Any = None
    rank: int = 0
    world_size: int = 1
    all_reduce_sum: Callable[[torch.Tensor], torch.Tensor] = lambda t: t
    barrier: Callable[[], None] = lambda: None
    step_log: StepLog | None = None

    def __post_init__(self) -> None:
        choices = ("a function that averages the gradients over the data-parallel ranks once per step (e.g. "
                   "lambda: average_gradients(model)), SINGLE_REPLICA or REDUCED_BY_ENGINE (project.loop)")
        if self.reduce_grads is _UNSET:
            raise TypeError(f"LoopParts needs reduce_grads: {choices}")
        if not callable(self.reduce_grads) and not isinstance(self.reduce_grads, GradReduction):
            raise TypeError(f"LoopParts.reduce_grads is {self.reduce_grads!r}; give {choices}")
        if self.reduce_grads is SINGLE_REPLICA and self.world_size > 1:
            raise ValueError(f"LoopParts.reduce_grads is SINGLE_REPLICA but world_size is {self.world_size}: "
                             f"{self.world_size} replicas would train apart; give the function that averages them")
        if self.update is None and self.loss_of is None:
            raise TypeError("LoopParts needs loss_of(batch, epoch, index) (or an update strategy)")


class DivergenceGuard:
    """Judges each optimizer step's loss: refused when not finite, or above ``factor`` x the median of the last
    ``window`` accepted losses (after ``MIN_HISTORY`` of them); ``factor <= 0`` turns the spike test off."""

    def __init__(self, factor: float = 2.0, window: int = WINDOW):
        self.factor = factor
        self.recent: deque[float] = deque(maxlen=window)

    def check(self, loss: float) -> str | None:
        """Return why the step must not be applied, or None (and remember ``loss``) when it is fine."""
        if not math.isfinite(loss):
            return f"loss is {loss}"
        if self.factor > 0 and len(self.recent) >= MIN_HISTORY:
            median = statistics.median(self.recent)
            if loss > self.factor * median:
                return f"loss {loss:.4g} > {self.factor:g} x recent median {median:.4g}"
        self.recent.append(loss)
        return None

    def reset(self, losses: list[float]) -> None:
        """Forget the history and start again from ``losses`` (those of the checkpoint rolled back to)."""
        self.recent.clear()
        self.recent.extend(losses[-(self.recent.maxlen or 0):])


def rollback_target(saved_steps: list[int], bad_step: int) -> int | None:
    """The newest checkpoint step older than the update that produced ``bad_step``'s loss (``< bad_step - 1``).

    The loss of step t is computed with the weights after update t - 1, so
    the checkpoint of step t - 1 already holds the suspect update. None when
    no checkpoint is old enough.
    """
    older = [s for s in saved_steps if s < bad_step - 1]
    return max(older) if older else None


def prepare_run(config: RunConfig, rank: int, val_loss: Callable[[], float]) -> tuple[LoopSpec, StepLog, float]:
    """``(LoopSpec, StepLog, validation loss before training)`` of a run with the options of ``add_common_args``
    and ``add_training_args``: ``metrics.jsonl`` in ``config.out_dir``, the checkpoints in ``--save_dir`` (default
    ``<out_dir>/checkpoints``). On ``config.resume`` the loss before training comes from the checkpoint's
    ``config.checkpoint_meta`` (``val_loss`` is not called) and the step log keeps its lines up to its step."""
    saved = config.checkpoint_meta
    before = saved["carry"]["val_loss_before"] if saved else val_loss()
    step_log = StepLog(config.out_dir, enabled=rank == 0, resume_step=saved["step"] if saved else None,
                       tensorboard=config.tensorboard)
    save_dir = Path(config.save_dir) if config.save_dir else config.out_dir / "checkpoints"
    spec = LoopSpec(n_epochs=config.n_epochs, grad_accum=config.grad_accum, precision=config.precision,
                    save_every=config.save_every, save_dir=save_dir, resume=config.resume, keep_last=config.keep_last,
                    max_steps=config.max_steps, spike_factor=config.spike_factor, lr_spike=config.lr_spike,
                    quiet=config.quiet, meta={**config.meta, "carry": {"val_loss_before": before}})
    return spec, step_log, before


def make_scheduler(optimizer: Any, config: RunConfig, batches: int) -> torch.optim.lr_scheduler.LambdaLR:
    """``--lr_schedule`` as a LambdaLR over the run's optimizer steps (``--n_epochs`` epochs of ``batches`` batches,
    ``--grad_accum`` per step, the last one of an epoch maybe fewer): ``constant`` (lr as given) or ``cosine``
    (from lr down to 10 % of it)."""
    if config.lr_schedule == "constant":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    total = max(config.n_epochs * math.ceil(batches / config.grad_accum), 1)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 0.1 + 0.45 * (1 + math.cos(math.pi * min(step, total) / total)))


def train(parts: LoopParts, spec: LoopSpec) -> dict:
    """Train ``spec.n_epochs`` epochs (or up to ``spec.max_steps`` steps); return what happened.

    ``{"epochs": [per-epoch record], "steps": optimizer steps, "rollbacks": n, "stopped_early": bool,
    "losses": [loss of every step this call ran, mean over ranks]}``; an epoch
    record holds ``epoch, train_time_s, tokens, tokens_per_s, train_loss,
    steps, micro_batches, optimizer_steps`` (this rank's real tokens and mean
    step loss; the steps counted so far). ``spec.resume`` continues from a
    checkpoint folder. A multi-rank run calls this on every rank.
    """
    update = parts.update or TorchUpdate(parts.model, parts.optimizer, parts.loss_of, spec.precision,
                                         parts.device.type)
    store = parts.checkpoints
    if store is None and spec.save_dir is not None:
        store = StepFolders(spec.save_dir, parts.rank, parts.barrier, update, keep=spec.keep_last)
    if store is None and (spec.save_every or spec.resume is not None):
        raise ValueError("LoopSpec.save_every/resume need LoopSpec.save_dir or LoopParts.checkpoints")
    run = RunState(parts.loader, parts.scheduler, spec.meta, store)
    if spec.resume is not None:
        run.restore(spec.resume)
        log(f"resumed from {spec.resume} at step {run.step} (epoch {run.epoch}, batch {run.batch})", spec.quiet)
    guard = DivergenceGuard(spec.spike_factor)
    guard.reset(run.history)
    carried: list = []   # micro-batches of a step that runs on into the next epoch (update.spans_epochs)
    while run.epoch < spec.n_epochs and not run.stopped:
        if _epoch(parts, spec, run, update, guard, carried):
            carried.clear()
            continue        # rolled back: carry on from the checkpoint's position
        if run.stopped and run.batch < len(parts.loader):
            break
        e = run.close_epoch()
        log(f"{_who(parts)}epoch {e['epoch']}: train loss {e['train_loss']:.4f}, "
            f"{e['tokens_per_s']:,.0f} tokens/s, {e['train_time_s']:.1f} s", spec.quiet)
    return run.result()


def _who(parts: LoopParts) -> str:
    """``rank <r> `` before a log line of a run with several processes (a process group of more than one), else
    nothing (a single-process run, such as the pipeline's)."""
    import torch.distributed as dist

    several = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    return f"rank {parts.rank} " if several or parts.world_size > 1 else ""


def _epoch(p: LoopParts, spec: LoopSpec, run: RunState, update: Any, guard: DivergenceGuard,
           carried: list) -> bool:
    """The steps of the current epoch from its position; True when a rollback moved the run elsewhere."""
    iterator = run.batches()
    bar = iter(progress(range(len(p.loader) - run.batch), spec.quiet or p.rank != 0, desc=f"epoch {run.epoch}",
                        unit="batch"))
    while not run.stopped:
        t0 = time.perf_counter()
        group, carried[:] = list(carried), []
        for batch in iterator:
            group.append((run.epoch, run.batch, batch))
            run.batch += 1
            next(bar, None)
            if len(group) == spec.grad_accum:
                break
        if not group or (len(group) < spec.grad_accum and update.spans_epochs):
            carried[:] = group   # the epoch's data ran out (an engine counting across epochs finishes the step later)
            return False
        if _step(p, spec, run, update, guard, group, t0):
            return True
    return False


@contextlib.contextmanager
def _lr_times(optimizer: Any, factor: float):
    """The optimizer's learning rates multiplied by ``factor`` inside the block (fault injection)."""
    groups = getattr(optimizer, "param_groups", []) if factor != 1.0 else []
    for g in groups:
        g["lr"] *= factor
    try:
        yield
    finally:
        for g in groups:
            g["lr"] /= factor


def _step(p: LoopParts, spec: LoopSpec, run: RunState, update: Any, guard: DivergenceGuard, group: list,
          t0: float) -> bool:
    """One optimizer step over ``group`` (``(epoch, index, batch)`` micro-batches); True when rolled back::

        zero_grad
        forward, backward     per micro-batch of the step (K = grad_accum): update.forward_backward
        reduce                parts.reduce_grads()   (data parallel: average_gradients, once per step)
        clip                  the gradient norm, computed and logged (nothing is clipped)
        guard                 loss all-reduced over the ranks; a spike or a non-finite loss refuses the step
        step                  update.step(), lr x FACTOR at --lr_spike STEP, scheduler step
        log                   one metrics.jsonl line (rank 0)
        checkpoint            every save_every steps, and where --max_steps stops the run
    """
    step = run.step + 1
    spike = spec.lr_spike is not None and not run.spiked and step == spec.lr_spike[0]
    with _lr_times(p.optimizer, spec.lr_spike[1] if spike else 1.0):
        groups = getattr(p.optimizer, "param_groups", None)
        lr = groups[0]["lr"] if groups else None
        update.zero_grad()
        weights = update.weights([int(batch["input_ids"].shape[0]) for _, _, batch in group])
        loss_sum, tokens = 0.0, 0
        for (epoch, index, batch), weight in zip(group, weights):          # forward, backward
            loss_sum += weight * update.forward_backward(batch, weight, epoch, index)
            tokens += int(batch["attention_mask"].sum())
        if callable(p.reduce_grads):                                         # reduce
            p.reduce_grads()
        grad_norm = update.grad_norm()                                       # clip (the norm only)
        totals = p.all_reduce_sum(torch.tensor([loss_sum, float(tokens)], dtype=torch.float64, device=p.device))
        step_loss, step_tokens = totals[0].item() / p.world_size, int(totals[1].item())
        reason = guard.check(step_loss)                                      # guard
        if reason is None or update.applied_in_backward:
            update.step()                                                    # step
            run.spiked = run.spiked or spike
    if reason is not None:
        action = _refused(p, spec, run, update, guard, step, step_loss, reason)
        if action == "rollback":
            return True
        if action == "skip":
            run.step = step
            return False
    if p.scheduler is not None:
        p.scheduler.step()
    if p.device.type == "cuda":
        torch.cuda.synchronize(p.device)
    seconds = time.perf_counter() - t0
    run.record_step(step, step_loss, loss_sum, tokens, seconds, len(group))
    if p.step_log:                                                           # log
        p.step_log.step({"step": step, "epoch": run.epoch, "loss": step_loss, "grad_norm": grad_norm, "lr": lr,
                         "step_time_s": seconds, "tokens_per_s": step_tokens / seconds,
                         "peak_mem_bytes": peak_memory_bytes(p.device), "micro_batches": len(group),
                         "tokens": step_tokens})
    if spec.save_every and step % spec.save_every == 0:                      # checkpoint
        run.save()
    if spec.max_steps is not None and step >= spec.max_steps:
        run.stopped = True
        if spec.save_every and step % spec.save_every:
            run.save()   # an interrupted run always leaves its last step behind
    return False


def _refused(p: LoopParts, spec: LoopSpec, run: RunState, update: Any, guard: DivergenceGuard, step: int,
             step_loss: float, reason: str) -> str:
    """Handle a step the guard refused: log the event, roll back when a checkpoint allows; return the action."""
    target = rollback_target(run.store.saved_steps(), step) if run.store is not None else None
    action = "rollback" if target is not None else ("keep" if update.applied_in_backward else "skip")
    if p.step_log:
        p.step_log.event(GUARD_EVENT, step=step, epoch=run.epoch, action=action, reason=reason,
                         loss=step_loss if math.isfinite(step_loss) else str(step_loss), restored_step=target)
    said = {"rollback": f"rolled back to step {target}", "skip": "step skipped",
            "keep": "kept (the engine had applied it already)"}[action]
    log(f"divergence guard at step {step}: {reason}; {said}", spec.quiet)
    if target is not None:
        run.restore(run.store.folder(target))
        guard.reset(run.history)
        run.rollbacks += 1
    return action
