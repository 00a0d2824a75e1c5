"""Where a training run stands, and how it is checkpointed and replayed exactly.

``RunState`` holds the position (epoch, batches done in it, optimizer
steps), the accumulators of the current epoch, the epochs done and the
losses the divergence guard remembers. A checkpoint holds all of it plus
every rank's RNG states, both now and at the start of the epoch: resuming
replays the epoch's data order and skips the batches done, so a resumed
run takes bitwise the same steps as an uninterrupted one. Where the
checkpoint goes is the store's business (``project.checkpoint.StepFolders``
by default).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from project import checkpoint


def _loader_rng(loader) -> torch.Tensor | None:
    generator = getattr(loader, "generator", None)
    return generator.get_state() if generator is not None else None


def _set_loader_rng(loader, state: torch.Tensor | None) -> None:
    if state is not None:
        loader.generator.set_state(state)


def fresh_totals() -> dict:
    """The running totals of an epoch: real tokens, sum of step losses, steps, seconds, micro-batches."""
    return {"tokens": 0, "loss_sum": 0.0, "steps": 0, "time": 0.0, "micro_batches": 0}


class RunState:
    """The mutable state of one training run and its checkpoint I/O (``store``: None when nothing is saved).

    ``loader`` is what the epochs iterate (a DataLoader, or any sized
    iterable); ``scheduler`` may be None; ``meta`` goes into every
    checkpoint's ``meta.json`` (what a resume must match).
    """

    def __init__(self, loader: Any, scheduler: Any, meta: dict, store: Any = None):
        self.loader, self.scheduler, self.meta, self.store = loader, scheduler, meta, store
        self.epoch = self.batch = self.step = 0
        self.epochs: list[dict] = []
        self.totals = fresh_totals()
        self.history: list[float] = []          # the guard's memory: losses of the applied steps (checkpointed)
        self.losses: list[float] = []           # losses of the steps this process ran (not checkpointed)
        self.epoch_rng: dict = {}
        self.rollbacks = 0
        self.stopped = self.spiked = False
        self._resume_rng: dict | None = None

    def record_step(self, step: int, loss: float, local_loss: float, tokens: int, seconds: float,
                    micro_batches: int) -> None:
        """Count an applied optimizer step: ``loss`` (mean over ranks) for the guard, the rest in the totals."""
        self.step = step
        self.history.append(loss)
        self.losses.append(loss)
        t = self.totals
        t["tokens"] += tokens
        t["loss_sum"] += local_loss
        t["steps"] += 1
        t["time"] += seconds
        t["micro_batches"] += micro_batches

    def close_epoch(self) -> dict:
        """Append the epoch's record (from the totals) to ``epochs``, move to the next epoch; return the record."""
        t = self.totals
        record = {"epoch": self.epoch, "train_time_s": t["time"], "tokens": t["tokens"],
                  "tokens_per_s": t["tokens"] / max(t["time"], 1e-12),
                  "train_loss": t["loss_sum"] / max(t["steps"], 1), "steps": t["steps"],
                  "micro_batches": t["micro_batches"], "optimizer_steps": self.step}
        self.epochs.append(record)
        self.epoch, self.batch, self.totals = self.epoch + 1, 0, fresh_totals()
        return record

    def result(self) -> dict:
        """What ``project.loop.train`` returns (see there)."""
        return {"epochs": self.epochs, "steps": self.step, "rollbacks": self.rollbacks,
                "stopped_early": self.stopped, "losses": self.losses}

    # -- checkpoints ---------------------------------------------------------------------------------

    def save(self) -> None:
        """Write this step's checkpoint to the store (a collective: every rank calls it)."""
        state = {"position": {"epoch": self.epoch, "batch": self.batch, "step": self.step}, "history": self.history,
                 "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None}
        rank_state = {"current": checkpoint.rng_state(), "current_loader": _loader_rng(self.loader),
                      "epoch_start": self.epoch_rng, "epochs": self.epochs, "totals": self.totals}
        self.store.save(self.step, state, rank_state, {**self.meta, "step": self.step, "epoch": self.epoch,
                                                       "batch": self.batch})

    def restore(self, folder: Path) -> None:
        """Load a checkpoint folder: the store loads the model's part, this the position, totals and RNG."""
        state, rank_state = self.store.load(folder)
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        position = state["position"]
        self.epoch, self.batch, self.step = position["epoch"], position["batch"], position["step"]
        self.epochs, self.totals = list(rank_state["epochs"]), dict(rank_state["totals"])
        self.history = list(state["history"])
        self.epoch_rng = rank_state["epoch_start"]
        self._resume_rng = rank_state

    # -- the data of one epoch, from the current position ----------------------------------------------

    def batches(self):
        """An iterator over the current epoch's batches from ``self.batch`` on, RNG as in the original run."""
        resumed = self._resume_rng
        if resumed is not None:
            checkpoint.set_rng_state(self.epoch_rng["global"])
            _set_loader_rng(self.loader, self.epoch_rng["loader"])
        else:
            self.epoch_rng = {"global": checkpoint.rng_state(), "loader": _loader_rng(self.loader)}
        iterator = iter(self.loader)
        for _ in range(self.batch):
            next(iterator)
        if resumed is not None:
            checkpoint.set_rng_state(resumed["current"])
            _set_loader_rng(self.loader, resumed["current_loader"])
            self._resume_rng = None
        return iterator
