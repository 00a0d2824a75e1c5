"""A training run's state and its checkpoints: one verified folder per optimizer step, written atomically.

``RunState`` is where a run stands and what a resume restores; ``StepFolders`` writes and reads the checkpoint folders
(their layout is there); ``project.resume`` picks and verifies the folder a ``--resume`` names.
"""
from __future__ import annotations

import contextlib
import json
import random
import re
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from common.files import atomic_path, atomic_write
from project.cli import ConfigError
from project.manifest import verify_sizes, write_manifest

LATEST = "latest"
SECONDARY_FAILURE_WAIT_S = 30.0   # see failure_is_one_line
STEP_NAME = re.compile(r"^step_(\d+)$")


class SaveError(ConfigError):
    """A checkpoint could not be written (full disk, quota, file-size limit); the previous one is intact."""


def step_dir(root: Path, step: int) -> Path:
    """The final folder of the checkpoint of optimizer step ``step``."""
    return Path(root) / f"step_{step:08d}"


def staging_dir(root: Path, step: int) -> Path:
    """The folder every rank writes step ``step``'s checkpoint into before ``commit`` (created)."""
    path = Path(root) / f"step_{step:08d}.tmp"
    path.mkdir(parents=True, exist_ok=True)
    return path


def save_file(obj: Any, path: Path) -> None:
    """``torch.save(obj)`` to ``path`` through a temporary file and a rename (atomic).

    A failed write raises the OSError underneath (``No space left on device``,
    ``File too large``), not torch's own RuntimeError about stream positions.
    """
    with atomic_path(path) as scratch:
        with open(scratch, "wb") as handle:
            try:
                torch.save(obj, handle)
            except RuntimeError as exc:
                if isinstance(exc.__context__, OSError):
                    raise exc.__context__ from None
                raise


def commit(root: Path, step: int, keep: int = 3) -> Path:
    """Rank 0, after every rank wrote its part: manifest, publish step ``step``, point ``latest`` at it, prune.

    Returns the final folder. Keeps the newest ``keep`` checkpoints up to
    ``step`` (the one just written among them); pruning runs only after it
    is published and verified, so the only intact checkpoint is never removed.
    """
    root, final = Path(root), step_dir(root, step)
    staging = root / f"step_{step:08d}.tmp"
    write_manifest(staging, step)
    aside = root / f".{final.name}.replaced"
    if final.exists():                        # the same step again (after a resume or a rollback)
        shutil.rmtree(aside, ignore_errors=True)
        final.replace(aside)
    staging.replace(final)                    # the folder every rank wrote into, published at once
    atomic_write(root / LATEST, final.name + "\n")
    shutil.rmtree(aside, ignore_errors=True)
    if keep and verify_sizes(final):
        older = [folder for s, folder in checkpoints(root) if s < step]
        for old in older[:max(0, len(older) - (keep - 1))]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def checkpoints(root: Path) -> list[tuple[int, Path]]:
    """``[(step, folder), ...]`` of the published checkpoint folders under ``root``, oldest first (unverified)."""
    found = []
    if Path(root).is_dir():
        for path in Path(root).iterdir():
            match = STEP_NAME.match(path.name)
            if match and path.is_dir():
                found.append((int(match.group(1)), path))
    return sorted(found)


def latest_step(root: Path) -> int | str:
    """The step ``root/latest`` names, or why it names none (one line, as ``project.resume.resolve`` reports it)."""
    try:
        name = (root / LATEST).read_text().strip()
    except FileNotFoundError:
        return f"'{LATEST}' (it is missing)"
    except OSError as exc:
        return f"'{LATEST}' (unreadable: {exc.strerror})"
    match = STEP_NAME.match(name)
    if not match or not (root / name).is_dir():
        return f"'{LATEST}' (it names {name[:40]!r}, which is not there)"
    return int(match.group(1))


def rng_state() -> dict:
    """This process's RNG states: torch CPU, every CUDA device, Python's ``random``."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what ``rng_state`` returned."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(root: Path, step: int, rank: int, state: dict | None, rank_state: dict, barrier: Callable[[], None],
         meta: dict | None = None, extra: Callable[[Path], None] | None = None, keep: int = 3) -> Path:
    """Write step ``step``'s checkpoint from every rank; returns the final folder.

    ``state`` (rank 0's model/optimizer/... dict, None on other ranks) goes to
    ``state.pt`` and ``meta`` (JSON-ready, rank 0) to ``meta.json``; every rank
    writes its ``rank_state`` (RNG states) to ``rng_rank<rank>.pt``;
    ``extra(folder)`` (e.g. a DeepSpeed ``save_checkpoint``, a collective)
    runs on every rank first. ``barrier()`` synchronises the ranks before
    the writes (rank 0 clears what a killed save left), before rank 0
    commits and after. A write that fails (full disk, quota, file-size
    limit) raises ``SaveError`` naming the step; the previous checkpoint and
    ``latest`` are untouched.
    """
    staging = Path(root) / f"step_{step:08d}.tmp"
    if rank == 0:
        shutil.rmtree(staging, ignore_errors=True)      # what a save killed midway left
    barrier()
    with failure_is_one_line(root, step):
        folder = staging_dir(root, step)
        if extra is not None:
            extra(folder)
        if state is not None:
            save_file(state, folder / "state.pt")
        if meta is not None:
            atomic_write(folder / "meta.json", json.dumps(meta, indent=1) + "\n")
        save_file(rank_state, folder / f"rng_rank{rank}.pt")
    barrier()
    if rank == 0:
        with failure_is_one_line(root, step):
            commit(root, step, keep)
    barrier()
    return step_dir(root, step)


@contextlib.contextmanager
def failure_is_one_line(root: Path, step: int) -> Iterator[None]:
    """Turn a failed write inside the block into ``SaveError`` (one line); remove the unfinished folder.

    A write that failed because the folder is gone (another rank's failed
    save removed it) waits up to ``SECONDARY_FAILURE_WAIT_S`` before it
    reports, so that the launcher hears the first rank's cause (``File too
    large``), not this consequence, and stops this rank meanwhile.
    """
    staging = Path(root) / f"step_{step:08d}.tmp"
    try:
        yield
    except (OSError, RuntimeError) as exc:
        cause = exc.__context__ if isinstance(exc, RuntimeError) and isinstance(exc.__context__, OSError) else exc
        if isinstance(cause, FileNotFoundError) and not staging.exists():
            time.sleep(SECONDARY_FAILURE_WAIT_S)
        shutil.rmtree(staging, ignore_errors=True)   # give the space back
        reason = (cause.strerror if isinstance(cause, OSError) and cause.strerror else
                  (str(cause).strip().splitlines() or [type(cause).__name__])[0])
        latest = latest_step(Path(root))
        kept = (f"step_{latest:08d} and '{LATEST}' are intact: resume with --resume {root}"
                if isinstance(latest, int) else "no earlier checkpoint to keep")
        raise SaveError(f"cannot write checkpoint {step_dir(root, step).name}: {reason} ({kept})") from None


def read_meta(folder: Path) -> dict:
    """The ``meta.json`` of a checkpoint folder (what the run was: sizes, step, carried values)."""
    return json.loads((Path(folder) / "meta.json").read_text())


def load(folder: Path, rank: int) -> tuple[dict, dict]:
    """``(state, rank_state)`` of a checkpoint folder for ``rank`` (``weights_only`` loads, on the CPU)."""
    folder = Path(folder)
    state = torch.load(folder / "state.pt", map_location="cpu", weights_only=True)
    rng_file = folder / f"rng_rank{rank}.pt"
    if not rng_file.is_file():
        raise ConfigError(f"checkpoint {folder} has no RNG state for rank {rank}: it was written by a run with "
                          f"fewer ranks; resume with the same --world_size")
    return state, torch.load(rng_file, map_location="cpu", weights_only=True)


class StepFolders:
    """The checkpoints of a training run under ``root`` (``project.loop``'s default store), in this layout::

        step_00000012/   state.pt (rank 0: model, optimizer, scheduler, position, metrics so far)
                         rng_rank<r>.pt (every rank's RNG states), and the update's own files (a DeepSpeed checkpoint)
                         meta.json (what the run was), manifest.json (LAST: size and sha256 of every file)
        latest           "step_00000012" (replaced atomically after the folder is complete and verified)

    Every rank writes into ``step_<n>.tmp/``; rank 0 then writes the manifest, renames the folder and rewrites
    ``latest``, so a run killed at any moment, or a full disk, leaves the previous checkpoint and ``latest`` as they
    were (``SaveError``: one line). Only then are steps beyond the newest ``keep`` removed.

    ``update`` (the loop's update strategy) adds what it holds: its
    ``state_dict()`` goes into rank 0's ``state.pt`` next to the run's state,
    its ``save_files(folder)``/``load_files(folder)`` (DeepSpeed's own
    checkpoint, a collective) run on every rank. ``barrier`` synchronises the
    ranks around the commit.
    """

    def __init__(self, root: Path, rank: int, barrier: Callable[[], None], update: Any, keep: int = 3):
        self.root, self.rank, self.barrier, self.update, self.keep = Path(root), rank, barrier, update, keep

    def save(self, step: int, state: dict, rank_state: dict, meta: dict) -> None:
        """Write step ``step``: ``state`` (+ the update's) from rank 0, ``rank_state`` from every rank."""
        mine = {**state, **self.update.state_dict()} if self.rank == 0 else None
        save(self.root, step, self.rank, mine, rank_state, self.barrier, meta=meta if self.rank == 0 else None,
             extra=self.update.save_files, keep=self.keep)

    def load(self, folder: Path) -> tuple[dict, dict]:
        """``(state, rank_state)`` of a checkpoint folder, after loading the update's part of it."""
        state, rank_state = load(folder, self.rank)
        self.update.load_files(Path(folder))
        self.update.load_state_dict(state)
        return state, rank_state

    def saved_steps(self) -> list[int]:
        """The steps of the complete checkpoints (every file there with its size), oldest first."""
        return [step for step, folder in checkpoints(self.root) if verify_sizes(folder)]

    def folder(self, step: int) -> Path:
        """The folder of step ``step``'s checkpoint."""
        return step_dir(self.root, step)


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

    A checkpoint holds all of it (epoch, batch, step, the epoch's totals, the guard's losses) plus every rank's RNG
    states, now and at the start of the epoch, so a resumed run replays the epoch's data order and takes bitwise the
    same steps.

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

    def save(self) -> None:
        """Write this step's checkpoint to the store (a collective: every rank calls it)."""
        state = {"position": {"epoch": self.epoch, "batch": self.batch, "step": self.step}, "history": self.history,
                 "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None}
        rank_state = {"current": rng_state(), "current_loader": _loader_rng(self.loader),
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

    def batches(self):
        """An iterator over the current epoch's batches from ``self.batch`` on, RNG as in the original run."""
        resumed = self._resume_rng
        if resumed is not None:
            set_rng_state(self.epoch_rng["global"])
            _set_loader_rng(self.loader, self.epoch_rng["loader"])
        else:
            self.epoch_rng = {"global": rng_state(), "loader": _loader_rng(self.loader)}
        iterator = iter(self.loader)
        for _ in range(self.batch):
            next(iterator)
        if resumed is not None:
            set_rng_state(resumed["current"])
            _set_loader_rng(self.loader, resumed["current_loader"])
            self._resume_rng = None
        return iterator
