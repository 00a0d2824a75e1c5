"""Problem 4.3: sharded checkpoints a cluster can trust, with exact resume.

A directory written by ``save_sharded`` (world size N)::

    model.pt          rank 0: model.state_dict() (CPU tensors), written once
    shard_00000.pt    rank r: {"step", "rank", "world_size", "optimizer": optimizer.state_dict(), "extra"}
    ...
    shard_0000<N-1>.pt
    manifest.json     rank 0, LAST, via a temporary name and an atomic rename:
                      {"format": 1, "step", "world_size",
                       "files": {"model.pt": {"sha256", "bytes"}, "shard_00000.pt": {...}, ...}}

A crash in the middle of a save leaves no manifest (the old one is removed
first), and ``load_sharded`` trusts nothing that the manifest does not vouch
for: it checks everything before it changes anything, and a refused load
(``CheckpointError``, whatever the reason) leaves the model and the optimizer
exactly as they were.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

MANIFEST = "manifest.json"
MODEL_FILE = "model.pt"
FORMAT = 1


class CheckpointError(ValueError):
    """A checkpoint that cannot be trusted or does not fit this run; the message names the file."""


def shard_name(rank: int) -> str:
    """The file name of rank ``rank``'s shard: ``shard_00000.pt`` for rank 0."""
    return f"shard_{rank:05d}.pt"


def file_digest(path: Path) -> dict:
    """``{"sha256": hex digest, "bytes": size}`` of the file at ``path``."""
    data = Path(path).read_bytes()
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def save_sharded(directory: str | Path, step: int, model: nn.Module, optimizer: Any,
                 extra: dict | None = None) -> Path:
    """Write a sharded checkpoint of ``step`` into ``directory`` (created, parents too); return the manifest path.

    Collective: every rank of the default group calls it with the same
    ``directory`` and ``step``. In order:

    1. rank 0 removes an existing ``manifest.json`` (a crash from here on
       leaves no manifest), then all ranks synchronise (``dist.barrier``);
    2. rank r writes ``shard_name(r)`` with ``torch.save`` of ``{"step",
       "rank", "world_size", "optimizer": optimizer.state_dict(), "extra":
       extra}`` (``extra``: plain data such as RNG states and the data
       position; each rank saves its own; the optimizer state as its
       ``state_dict()`` gives it, on its device); rank 0 also writes
       ``model.pt``, ``torch.save`` of the model's state_dict with every
       tensor on the CPU;
    3. the ranks gather each file's ``file_digest`` on rank 0
       (``dist.all_gather_object``), and rank 0 writes ``manifest.json``
       (``{"format": 1, "step", "world_size", "files": {name: digest}}``) to
       a temporary name in ``directory``, then ``os.replace``-s it into place
       (so the temporary file is gone: of the files a save creates, only
       ``model.pt``, its shards and ``manifest.json`` remain). ``files``
       lists exactly the files this save wrote: ``model.pt`` and
       ``shard_name(r)`` for r < world size. A file already in
       ``directory`` that this save does not write (a shard of an earlier
       save by more ranks, say) is never listed; whether it stays or is
       removed is free (``load_sharded`` trusts only what the manifest
       lists);
    4. a final ``dist.barrier``: when any rank returns, the checkpoint is complete.

    Every rank returns the manifest's path, a ``pathlib.Path``:
    ``Path(directory) / "manifest.json"``.

    Everything written must load with ``torch.load(..., weights_only=True)``.
    """
    directory = Path(directory)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    # Hints: file_digest(path) gives a file's digest; dist.all_gather_object(list_of_world_size, obj) collects
    # one object per rank; write the manifest to a temporary name in the same folder, then os.replace it.
    # BEGIN_STUDENT 4.3
    directory.mkdir(parents=True, exist_ok=True)
    manifest = directory / MANIFEST
    if rank == 0:
        manifest.unlink(missing_ok=True)
    dist.barrier()
    mine = {shard_name(rank): directory / shard_name(rank)}
    torch.save({"step": step, "rank": rank, "world_size": world_size, "optimizer": optimizer.state_dict(),
                "extra": extra}, mine[shard_name(rank)])
    if rank == 0:
        state = {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
        mine[MODEL_FILE] = directory / MODEL_FILE
        torch.save(state, mine[MODEL_FILE])
    digests = {name: file_digest(path) for name, path in mine.items()}
    gathered: list[dict] = [{} for _ in range(world_size)]
    dist.all_gather_object(gathered, digests)
    if rank == 0:
        files = {name: digest for part in gathered for name, digest in sorted(part.items())}
        temporary = directory / f".{MANIFEST}.tmp{os.getpid()}"
        temporary.write_text(json.dumps({"format": FORMAT, "step": step, "world_size": world_size,
                                         "files": files}, indent=1))
        os.replace(temporary, manifest)
    dist.barrier()
    return manifest
    # END_STUDENT 4.3


def load_sharded(directory: str | Path, model: nn.Module, optimizer: Any) -> tuple[int, dict | None]:
    """Restore a ``save_sharded`` checkpoint into ``model`` and ``optimizer``; return ``(step, extra)``.

    Collective in spirit (every rank calls it), but needs no communication.
    Before changing anything it checks, and raises ``CheckpointError``
    naming the file otherwise, that:

    - ``manifest.json`` exists and is valid JSON: an object whose
      ``format`` is the integer 1, whose ``step`` and ``world_size`` are
      integers (JSON numbers without a fraction: ``true``, ``1.0`` or
      ``"10"`` are refused, although ``True == 1`` in Python) and whose
      ``files`` is an object;
    - the manifest's world size equals ``dist.get_world_size()`` (a run of
      this course has at most 256 ranks);
    - it lists ``model.pt`` and ``shard_name(r)`` for every rank r, and each
      of these files exists with exactly the recorded size and sha256 (every
      rank checks all of them, so every rank refuses a checkpoint that fails
      one of the checks above);
    - this rank's shard is a dict that records the manifest's step, this
      rank and the world size and holds ``"optimizer"`` and ``"extra"``
      (each rank checks its own shard only: a checkpoint whose shards
      are wrong for some ranks only is refused on those ranks; whether the
      other ranks load it or refuse it too is free);
    - ``model.pt`` holds exactly the keys of ``model.state_dict()``, each with
      its shape (a strict ``load_state_dict`` would copy the matching keys
      before it raises); a file with keys of other types too (an ``int``
      key beside the names, say) is refused the same way, with
      ``CheckpointError``.

    Then it loads this rank's ``"optimizer"`` state into ``optimizer``
    (``optimizer.load_state_dict``) and ``model.pt`` into ``model``
    (``load_state_dict``, strict), and returns the tuple ``(step, this rank's
    extra)``, ``step`` the manifest's (an ``int``, as checked above). The
    optimizer state must fit the optimizer (a torch optimizer's
    ``load_state_dict`` requires the same number of parameter groups, each
    with the same number of parameters, and raises ValueError otherwise):
    when ``optimizer.load_state_dict`` raises,
    ``load_sharded`` raises ``CheckpointError`` naming this rank's shard, with
    the model and the optimizer exactly as they were. Check the fit before
    changing anything, or load the optimizer first and, should its
    ``load_state_dict`` raise, load back a deep copy (``copy.deepcopy``) of
    its ``state_dict()`` taken before, and load the model only after that.
    Files are read with ``torch.load(..., map_location="cpu",
    weights_only=True)``, so a file whose pickle would run code when loaded
    is refused (``CheckpointError``) without running it, even when the
    manifest lists its size and sha256; ``load_state_dict`` copies the
    values to the model's and the optimizer's devices.
    """
    directory = Path(directory)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    # Hint: first every check (manifest, world size, each file's file_digest against the manifest), then
    # torch.load, the optimizer's load_state_dict (put back as it was if it raises) and the model's; turn any
    # failure of a check into CheckpointError(f"{file}: ...").
    # BEGIN_STUDENT 4.3
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text())
        step, saved_world, files = manifest["step"], manifest["world_size"], manifest["files"]
        if not all(type(manifest[key]) is int for key in ("format", "step", "world_size")):
            raise ValueError("format, step and world_size must be JSON integers")
        if manifest.get("format") != FORMAT or not isinstance(files, dict):
            raise ValueError("unknown format")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}: not a readable checkpoint manifest ({type(exc).__name__}: {exc})") from None
    if saved_world != world_size:
        raise CheckpointError(f"{path}: saved by {saved_world} ranks, this run has {world_size}")
    expected = [MODEL_FILE, *(shard_name(r) for r in range(world_size))]
    for name in expected:
        if name not in files:
            raise CheckpointError(f"{path}: does not list {name}")
    for name in expected:
        file = directory / name
        if not file.is_file():
            raise CheckpointError(f"{file}: missing (listed in {path})")
        if file_digest(file) != files[name]:
            raise CheckpointError(f"{file}: size or sha256 differs from {path} (corrupt, partial or from "
                                  "another save)")
    shard_file = directory / shard_name(rank)
    try:
        shard = torch.load(shard_file, map_location="cpu", weights_only=True)
        state = torch.load(directory / MODEL_FILE, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is a bad checkpoint
        raise CheckpointError(f"{directory}: a checkpoint file does not load ({exc})") from None
    if not isinstance(shard, dict) or not {"optimizer", "extra"} <= shard.keys():
        raise CheckpointError(f"{shard_file}: not a shard of save_sharded (no optimizer state or extra)")
    if (shard.get("step"), shard.get("rank"), shard.get("world_size")) != (step, rank, world_size):
        raise CheckpointError(f"{shard_file}: holds step {shard.get('step')} of rank {shard.get('rank')}, "
                              f"world size {shard.get('world_size')}; {path} says step {step}, rank {rank}, "
                              f"world size {world_size}")
    shapes = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    saved = ({name: tuple(getattr(value, "shape", ())) for name, value in state.items()}
             if isinstance(state, dict) else {})
    if saved != shapes:
        raise CheckpointError(f"{directory / MODEL_FILE}: its keys or shapes differ from the model's (missing "
                              f"{sorted(set(shapes) - set(saved), key=repr)}, unexpected "
                              f"{sorted(set(saved) - set(shapes), key=repr)}, other shapes "
                              f"{sorted(k for k in set(saved) & set(shapes) if saved[k] != shapes[k])})")
    before = copy.deepcopy(optimizer.state_dict())
    try:
        optimizer.load_state_dict(shard["optimizer"])
    except Exception as exc:  # noqa: BLE001 - whatever the optimizer refuses its state with
        optimizer.load_state_dict(before)
        raise CheckpointError(f"{shard_file}: its optimizer state does not fit this optimizer "
                              f"({type(exc).__name__}: {exc})") from None
    model.load_state_dict(state)
    return step, shard["extra"]
    # END_STUDENT 4.3
