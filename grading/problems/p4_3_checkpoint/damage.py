"""Problem 4.3 probe helpers: damaged copies of a checkpoint, and a log of what ``save_sharded`` does.

A damaged copy starts as a copy of a good checkpoint. Some damage breaks the
manifest's promise (a flipped byte, a missing file); the rest is
*valid-looking*: the grader rewrites the manifest's digests so that every
file matches, and only a check of the content (format, listed files, a
shard's step and rank, model.pt's keys and shapes, whether the shard's
optimizer state fits the optimizer) can refuse it.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from grading.problems.probe_helpers import CodeOnLoad

# every torch.distributed call that synchronises ranks (SaveLog and FileOrder watch them)
COLLECTIVES = ("barrier", "monitored_barrier", "all_gather_object", "broadcast_object_list", "gather_object",
               "scatter_object_list", "all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "broadcast", "reduce", "all_to_all", "all_to_all_single", "gather", "scatter",
               "send", "recv", "isend", "irecv")

MANIFEST = "manifest.json"
MODEL_FILE = "model.pt"
# kind -> the file a refusal's message must name (None: any checkpoint file; "shard": this rank's shard)
CORRUPTIONS = {"flipped_byte_shard": "shard_00001.pt", "flipped_byte_model": "model.pt",
               "missing_shard": "shard_00000.pt", "other_world_size": MANIFEST, "smaller_world_size": MANIFEST,
               "other_step_manifest": None,
               "truncated_manifest": MANIFEST}
MANIFEST_DAMAGE = {"no_manifest": MANIFEST, "other_format": MANIFEST, "older_format": MANIFEST,
                   "shard_not_listed": MANIFEST, "format_true": MANIFEST,
                   "step_as_text": MANIFEST}     # JSON true == 1 in Python; "10" != 10
SHARD_DAMAGE = {"rotated_shards": "shard", "other_step_shards": "shard", "shard_without_extra": "shard"}
MODEL_DAMAGE = {"model_missing_key": "model.pt", "model_other_shape": "model.pt", "model_extra_key": "model.pt",
                "model_int_key": "model.pt"}      # an int key beside a name: a sorted() of the keys fails
OPTIMIZER_DAMAGE = {"optimizer_other_group_size": "shard"}    # judged by 4.3.refuse_optimizer alone
# files whose pickle runs code when loaded without weights_only (""): any CheckpointError, the code never run
CODE_DAMAGE = {"model_runs_code": "", "shard_runs_code": ""}
RAN_CODE = "the_file_ran_code"         # what that code creates in the damaged checkpoint's folder
ALL_DAMAGE = {**CORRUPTIONS, **MANIFEST_DAMAGE, **SHARD_DAMAGE, **MODEL_DAMAGE, **OPTIMIZER_DAMAGE, **CODE_DAMAGE}


def digest(path: Path) -> dict:
    """``{"sha256", "bytes"}`` of a file, as the manifest records it."""
    data = path.read_bytes()
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def _grow_groups(state):
    """``state`` with one more parameter index in every parameter group of every optimizer state it holds
    (a dict with ``param_groups``, at any depth): the state of an optimizer over more parameters."""
    if isinstance(state, dict):
        grown = {key: _grow_groups(value) for key, value in state.items()}
        if isinstance(state.get("param_groups"), list):
            grown["param_groups"] = [_grow_group(group) for group in state["param_groups"]]
        return grown
    return state


def _grow_group(group):
    """A parameter group (``{"params": [int, ...], ...}``) with one more parameter index; anything else as it is."""
    params = group.get("params") if isinstance(group, dict) else None
    if not (isinstance(params, list) and all(type(p) is int for p in params)):
        return group
    return {**group, "params": [*params, max(params, default=-1) + 1]}


def _manifest(dest: Path) -> dict:
    return json.loads((dest / MANIFEST).read_text())


def _write_manifest(dest: Path, manifest: dict, refresh: bool = False) -> None:
    if refresh:          # a valid-looking copy: every listed file matches its entry
        manifest["files"] = {name: digest(dest / name) for name in manifest["files"]}
    (dest / MANIFEST).write_text(json.dumps(manifest))


@dataclass(frozen=True)
class _Copy:
    """A fresh copy of a good checkpoint to damage: its folder ``dest``, the checkpoint it copies (``source``), an
    older one (``early``), its manifest as read, and the shards the manifest lists."""

    source: Path
    dest: Path
    early: Path
    manifest: dict
    shards: list[str]


def damage(source: Path, dest: Path, kind: str, early: Path) -> None:
    """Copy the checkpoint ``source`` to ``dest`` and damage it as ``kind`` says (``early``: an older one)."""
    shutil.copytree(source, dest)
    manifest = _manifest(dest)
    shards = sorted(name for name in manifest.get("files", {}) if name.startswith("shard_"))
    damager = _damage_files if kind.startswith("flipped_byte") else _DAMAGERS.get(kind)
    if damager is None:
        raise ValueError(kind)
    damager(_Copy(source, dest, early, manifest, shards), kind)


def _damage_files(copy: _Copy, kind: str) -> None:
    """Files that break the manifest's promise: a flipped byte, a missing shard, the older manifest, a truncated
    manifest, no manifest."""
    dest = copy.dest
    if kind.startswith("flipped_byte"):
        target = dest / CORRUPTIONS[kind]
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0xFF
        target.write_bytes(bytes(data))
    elif kind == "missing_shard":
        (dest / CORRUPTIONS[kind]).unlink()
    elif kind == "other_step_manifest":
        shutil.copy(copy.early / MANIFEST, dest / MANIFEST)
    elif kind == "truncated_manifest":
        text = (dest / MANIFEST).read_text()
        (dest / MANIFEST).write_text(text[:len(text) // 2])
    elif kind == "no_manifest":
        (dest / MANIFEST).unlink()


def _damage_manifest_fields(copy: _Copy, kind: str) -> None:
    """A manifest field changed (world size, format) or a shard left out of its files; the digests as they were."""
    dest, manifest = copy.dest, copy.manifest
    if kind == "other_world_size":
        _write_manifest(dest, {**manifest, "world_size": manifest.get("world_size", 2) + 1})
    elif kind == "smaller_world_size":       # every file still listed: only the recorded world size is wrong
        _write_manifest(dest, {**manifest, "world_size": manifest.get("world_size", 2) - 1})
    elif kind == "other_format":
        _write_manifest(dest, {**manifest, "format": 2})
    elif kind == "older_format":
        _write_manifest(dest, {**manifest, "format": 0})
    elif kind == "format_true":
        _write_manifest(dest, {**manifest, "format": True})
    elif kind == "shard_not_listed":
        del manifest["files"]["shard_00001.pt"]
        _write_manifest(dest, manifest)


def _step_as_text(copy: _Copy, kind: str) -> None:
    """The step as text in the manifest and every shard: the shards agree with the manifest, only the step's type is
    wrong (valid-looking)."""
    dest = copy.dest
    for name in copy.shards:
        try:                                 # a submission's shard of another layout: left as it is
            shard = torch.load(dest / name, weights_only=True)
        except Exception:  # noqa: BLE001 - 4.3.file_format judges the format
            continue
        if isinstance(shard, dict) and "step" in shard:
            torch.save({**shard, "step": str(shard["step"])}, dest / name)
    _write_manifest(dest, {**copy.manifest, "step": str(copy.manifest.get("step"))}, refresh=True)


def _swap_shards(copy: _Copy, kind: str) -> None:
    """Shards of another rank or save under this manifest (valid-looking): ``rotated_shards`` gives shard r rank
    r + 1's state, so every rank gets another's; ``other_step_shards`` every shard from the older save."""
    if kind == "rotated_shards":
        for name, following in zip(copy.shards, copy.shards[1:] + copy.shards[:1]):
            shutil.copy(copy.source / following, copy.dest / name)
    else:
        for name in copy.shards:
            shutil.copy(copy.early / name, copy.dest / name)
    _write_manifest(copy.dest, copy.manifest, refresh=True)


def _damage_model(copy: _Copy, kind: str) -> None:
    """model.pt with a key missing, an extra key, an int key beside a name, or its last layer of another shape
    (valid-looking)."""
    state = torch.load(copy.dest / "model.pt", weights_only=True)
    last = sorted(name for name in state if name.endswith(".weight"))[-1]
    if kind == "model_missing_key":
        del state[last[:-len("weight")] + "bias"]
    elif kind == "model_extra_key":
        state["unexpected.weight"] = torch.zeros(1)
    elif kind == "model_int_key":
        state.update({0: torch.zeros(1), "unexpected.weight": torch.zeros(1)})
    else:
        state[last] = torch.zeros(state[last].shape[0] + 1, *state[last].shape[1:])
        state[last[:-len("weight")] + "bias"] = torch.zeros(state[last].shape[0])
    torch.save(state, copy.dest / "model.pt")
    _write_manifest(copy.dest, copy.manifest, refresh=True)


def _drop_extra(copy: _Copy, kind: str) -> None:
    """Every shard without its "extra": step, rank, world size and optimizer fit; no "extra" to return
    (valid-looking)."""
    for name in copy.shards:
        try:
            shard = torch.load(copy.dest / name, weights_only=True)
            del shard["extra"]
        except Exception:  # noqa: BLE001 - left as it is (4.3.file_format judges the format)
            continue
        torch.save(shard, copy.dest / name)
    _write_manifest(copy.dest, copy.manifest, refresh=True)


def _code_running_files(copy: _Copy, kind: str) -> None:
    """model.pt (``model_runs_code``) or every shard as a pickle that runs code when loaded without weights_only
    (valid-looking)."""
    for name in [MODEL_FILE] if kind == "model_runs_code" else copy.shards:
        torch.save(CodeOnLoad(str(copy.dest / RAN_CODE)), copy.dest / name)
    _write_manifest(copy.dest, copy.manifest, refresh=True)


def _grow_optimizer_groups(copy: _Copy, kind: str) -> None:
    """Every shard's optimizer state over one more parameter: step, rank and model fit; the optimizer does not
    (valid-looking)."""
    for name in copy.shards:
        try:                                 # a submission's shard of another layout: grown where it can be
            shard = torch.load(copy.dest / name, weights_only=True)
        except Exception:  # noqa: BLE001 - left as it is (4.3.file_format judges the format)
            continue
        torch.save(_grow_groups(shard), copy.dest / name)
    _write_manifest(copy.dest, copy.manifest, refresh=True)


# kind -> the function that damages a copy so (the flipped_byte_* kinds: _damage_files)
_DAMAGERS = {
    **dict.fromkeys(("missing_shard", "other_step_manifest", "truncated_manifest", "no_manifest"), _damage_files),
    **dict.fromkeys(("other_world_size", "smaller_world_size", "other_format", "older_format", "format_true",
                     "shard_not_listed"), _damage_manifest_fields),
    "step_as_text": _step_as_text,
    **dict.fromkeys(("rotated_shards", "other_step_shards"), _swap_shards),
    **dict.fromkeys(MODEL_DAMAGE, _damage_model),
    "shard_without_extra": _drop_extra,
    **dict.fromkeys(CODE_DAMAGE, _code_running_files),
    "optimizer_other_group_size": _grow_optimizer_groups,
}


class SaveLog:
    """Records, while ``active``, the collectives, file writes and renames the submission makes in this rank.

    ``install()`` wraps ``dist.barrier`` and the other collectives (``COLLECTIVES``), ``torch.save``, ``os.replace``,
    ``os.rename``, ``os.unlink`` and ``os.remove`` (``Path.unlink`` calls ``os.unlink``) before the submission
    is imported; each event is a plain list.
    """

    def __init__(self) -> None:
        self.events: list[list] = []
        self.active: Path | None = None          # the directory of the save being watched

    def install(self) -> None:
        import torch.distributed as dist

        def wrap(owner, name: str, note):
            real = getattr(owner, name)

            def wrapper(*args, **kwargs):
                if self.active is not None:
                    self.events.append([name, *note(*args, **kwargs)])
                return real(*args, **kwargs)
            setattr(owner, name, wrapper)

        manifest_there = lambda *a, **k: [(self.active / MANIFEST).exists()]  # noqa: E731
        wrap(dist, "barrier", manifest_there)
        for name in COLLECTIVES:
            if name != "barrier" and hasattr(dist, name):
                wrap(dist, name, lambda *a, **k: [])
        wrap(torch, "save", lambda obj, f, *a, **k: [str(getattr(f, "name", f))])     # a path or an open file
        for name in ("replace", "rename"):
            wrap(os, name, lambda src, dst, *a, **k: [str(Path(src).resolve()), str(Path(dst).resolve())])
        for name in ("unlink", "remove"):
            wrap(os, name, lambda path, *a, **k: [os.fspath(path)])

    def watch(self, directory: Path) -> None:
        """Start recording a save into ``directory`` (events so far are dropped)."""
        self.events, self.active = [], Path(directory)

    def stop(self) -> list[list]:
        """Stop recording; the events of the watched save."""
        self.active = None
        return self.events
