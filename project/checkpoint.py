"""Training checkpoints of the entry points: one folder per optimizer step, written atomically.

Layout under the checkpoint root (``--save_dir``, default ``<out_dir>/checkpoints``)::

    step_00000012/          state.pt (rank 0: model, optimizer, scheduler, position, metrics so far)
                            rng_rank<r>.pt (every rank's RNG states), or a DeepSpeed checkpoint
    latest                  "step_00000012" (replaced atomically after the folder is complete)

Every rank writes into ``step_<n>.tmp/``; after a barrier rank 0 renames it
to ``step_<n>/`` and then rewrites ``latest``, so a run killed at any
moment leaves either the previous checkpoint or the new one, never half of
one. The oldest folders beyond ``keep`` are removed. ``--resume DIR``
accepts the root (its ``latest``) or one ``step_<n>`` folder. Single files
are written with ``grading.kit.files`` (temporary name, fsync, rename).
``StepFolders`` is this layout as the store of ``project.loop``.
"""
from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path
from typing import Any, Callable

import torch

from grading.kit.files import atomic_path, atomic_write
from project.cli import ConfigError

LATEST = "latest"
_STEP_RE = re.compile(r"^step_(\d+)$")


def step_dir(root: Path, step: int) -> Path:
    """The final folder of the checkpoint of optimizer step ``step``."""
    return Path(root) / f"step_{step:08d}"


def staging_dir(root: Path, step: int) -> Path:
    """The folder every rank writes step ``step``'s checkpoint into before ``commit`` (created)."""
    path = Path(root) / f"step_{step:08d}.tmp"
    path.mkdir(parents=True, exist_ok=True)
    return path


def save_file(obj: Any, path: Path) -> None:
    """``torch.save(obj)`` to ``path`` through a temporary file and a rename (atomic)."""
    with atomic_path(path) as scratch:
        torch.save(obj, scratch)


def commit(root: Path, step: int, keep: int = 3) -> Path:
    """Rank 0, after every rank wrote its part: publish step ``step``, point ``latest`` at it, prune old ones.

    Returns the final folder. Keeps the newest ``keep`` checkpoints.
    """
    root, final = Path(root), step_dir(root, step)
    if final.exists():
        shutil.rmtree(final)
    (root / f"step_{step:08d}.tmp").replace(final)   # the folder every rank wrote into, published at once
    atomic_write(root / LATEST, final.name + "\n")
    for _, old in checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def checkpoints(root: Path) -> list[tuple[int, Path]]:
    """``[(step, folder), ...]`` of the complete checkpoints under ``root``, oldest first."""
    found = []
    if Path(root).is_dir():
        for path in Path(root).iterdir():
            match = _STEP_RE.match(path.name)
            if match and path.is_dir():
                found.append((int(match.group(1)), path))
    return sorted(found)


def resolve(path: str | Path) -> Path:
    """The checkpoint folder ``--resume`` names: a ``step_<n>`` folder, or a root whose ``latest`` points at one.

    Raises ConfigError when ``path`` holds no complete checkpoint.
    """
    path = Path(path)
    if _STEP_RE.match(path.name) and (path / "state.pt").is_file():
        return path
    if (path / LATEST).is_file():
        target = path / (path / LATEST).read_text().strip()
        if (target / "state.pt").is_file():
            return target
    raise ConfigError(f"--resume {str(path)!r}: no checkpoint there (expected a folder with a 'latest' file "
                      f"or a step_<n> folder holding state.pt, as written by --save_every)")


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
    rank 0 commits and after.
    """
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
        commit(root, step, keep)
    barrier()
    return step_dir(root, step)


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
    """The checkpoints of a training run in this module's layout under ``root`` (``project.loop``'s default store).

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
        """The steps of the complete checkpoints, oldest first."""
        return [step for step, _ in checkpoints(self.root)]

    def folder(self, step: int) -> Path:
        """The folder of step ``step``'s checkpoint."""
        return step_dir(self.root, step)
