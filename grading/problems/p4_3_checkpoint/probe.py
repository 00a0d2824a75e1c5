"""Problem 4.3 probes (rank side): train, save, inspect, load damaged copies; resume in new processes, crash.

The case runs in two phases (``Case.next_phases``); the checkpoint goes from one to the other through the case's shared
folder (``ctx.handoff_dir``)::

    phase 1, rank r:  train 10 steps, save ─> shared/checkpoints/step_10, ..., inspect, load, refuse damage
    phase 2, rank r:  fresh model ─> load step_10 ─> train the last 10 steps; then a save that crashes
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from grading.check import describe_kind
from grading.problems.probe_helpers import unchecked_group
from grading.problems.p4_1_ddp import reference as ref
from grading.problems.p4_3_checkpoint.damage import ALL_DAMAGE, MANIFEST, RAN_CODE, SaveLog, damage, digest
from grading.problems.p4_3_checkpoint.order import FileOrder, order_collectives
from grading.problems.p4_3_checkpoint.reference import OwnerAdam, same

SIZES = (8, 16, 4)
TOTAL_STEPS, SAVE_STEP, EARLY_STEP = 20, 10, 5
NOISE = 0.05

P_STRAIGHT = "straight"
P_MANIFEST = "manifest"
P_ROUNDTRIP = "roundtrip"
P_REFUSALS = "refusals"
P_RESUME = "resume"
P_EVENTS = "events"           # what the save of step SAVE_STEP did, in order (SaveLog)
P_FILES = "files"             # the files of that save as torch.load reads them, and what was saved
P_CRASH = "crash"             # a save that fails in torch.save, into a folder holding a complete checkpoint
P_ACCESSES = "accesses"       # every save's file accesses, in the order the grader ran them (FileOrder.log)
REMOVES_MANIFEST = f"remove {MANIFEST}"      # a call of P_CRASH's: os.unlink / os.remove of the manifest


def stale_shard(world_size: int) -> str:
    """The shard of rank ``world_size``, left by an earlier save of more ranks in the folder of step EARLY_STEP."""
    return f"shard_{world_size:05d}.pt"


def _model(seed: int = 0) -> torch.nn.Module:
    return ref.ZeroNet(SIZES, seed=seed)


def _steps(model, optimizer, start: int, stop: int) -> list[float]:
    """Train on global batches start..stop-1, each with this rank's noise; return the losses."""
    losses = []
    for position in range(start, stop):
        x, y = ref.batch(position, SIZES[0], SIZES[-1])
        x = x + NOISE * torch.randn(x.shape)
        optimizer.zero_grad()
        loss = ref.loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _extra(position: int) -> dict:
    return {"torch_rng": torch.get_rng_state(), "position": position}


def _optimizer_state(optimizer: OwnerAdam) -> dict:
    state = optimizer.adam.state_dict()
    return {"state": {str(k): {key: value.detach().clone() if isinstance(value, torch.Tensor) else value
                               for key, value in v.items()} for k, v in state["state"].items()},
            "param_groups": [{key: list(value) if isinstance(value, list) else value for key, value in group.items()}
                             for group in state["param_groups"]]}


def _snapshot(model, optimizer) -> dict:
    return {"model": ref.state_of(model), "optimizer": _optimizer_state(optimizer)}


def _returned(value) -> dict:
    """What ``load_sharded`` returned: its kind for messages, whether it is the stated tuple ``(step, extra)``,
    and the two items where it is a pair of any kind (so the other checks can still judge them)."""
    pair = isinstance(value, (list, tuple)) and len(value) == 2
    return {"returned": describe_kind(value) + (f" (length {len(value)})" if isinstance(value, (list, tuple)) else ""),
            "pair": type(value) is tuple and len(value) == 2,
            "step": value[0] if pair else None, "extra": value[1] if pair else None}


def _path_returned(value, manifest: Path) -> dict:
    """What ``save_sharded`` returned, for 4.3.manifest: its kind, the path it names (a ``pathlib.Path`` only),
    and the manifest's path (both resolved)."""
    return {"kind": describe_kind(value), "path": str(value.resolve()) if isinstance(value, Path) else None,
            "manifest": str(manifest.resolve())}


def _ordered(ctx, phase: str) -> FileOrder:
    """This rank's ``FileOrder`` for the case phase ``phase``, watching ``torch.save``, file accesses and
    collectives; made before the submission binds any name."""
    order = FileOrder(ctx.rank, ctx.world_size, ctx.handoff_dir / ".order" / phase)
    order.install()
    order_collectives(order)
    return order


# ---------------------------------------------------------------- probes (rank side)
@dataclass
class _Phase1:
    """What phase 1's parts share: this rank's model and optimizer (one training run through every part), the
    grader's group, the checkpoint folders, and what the straight run noted at its save of step SAVE_STEP."""

    model: torch.nn.Module
    optimizer: OwnerAdam
    grader: object                      # unchecked_group(): the grader's traffic
    root: Path                          # the shared checkpoints folder
    saved: Path                         # the save of step SAVE_STEP
    early: Path                         # the save of step EARLY_STEP
    at_save: dict = field(default_factory=dict)


def _straight_run(ctx, run: _Phase1, order: FileOrder, log: SaveLog, save_sharded) -> dict:
    """TOTAL_STEPS steps with saves at EARLY_STEP (into a folder holding a stale shard of more ranks) and SAVE_STEP
    (watched by ``log``; the state, extra and what it returned kept in ``run.at_save``): the losses and the final
    parameters."""
    model, optimizer, grader, early, saved = run.model, run.optimizer, run.grader, run.early, run.saved
    stale = early / stale_shard(ctx.world_size)
    losses = _steps(model, optimizer, 0, EARLY_STEP)
    if ctx.rank == 0:                       # the folder already holds a shard of an earlier save by more ranks
        early.mkdir(parents=True, exist_ok=True)
        torch.save({"step": 0, "rank": ctx.world_size, "world_size": ctx.world_size + 1}, stale)
    dist.barrier(group=grader)              # every rank's save starts with that folder in place
    with order.saving(early):
        save_sharded(early, EARLY_STEP, model, optimizer, extra=_extra(EARLY_STEP))
    dist.barrier(group=grader)
    losses += _steps(model, optimizer, EARLY_STEP, SAVE_STEP)
    run.at_save.update(_snapshot(model, optimizer), extra=_extra(SAVE_STEP),
                       state_dict=copy.deepcopy(optimizer.state_dict()))
    log.watch(saved)
    try:
        with order.saving(saved):
            run.at_save["returned"] = save_sharded(saved, SAVE_STEP, model, optimizer, extra=_extra(SAVE_STEP))
    finally:
        run.at_save["events"] = log.stop()
    dist.barrier(group=grader)
    losses += _steps(model, optimizer, SAVE_STEP, TOTAL_STEPS)
    return {"losses": losses, "params": ref.params_of(model)}


def _manifests(run: _Phase1) -> dict:
    """The manifest of the save of SAVE_STEP, the digest of each of its files, the files the EARLY_STEP manifest
    lists, and what save_sharded returned."""
    early, saved = run.early, run.saved
    listed = json.loads((early / "manifest.json").read_text()).get("files")
    return {"manifest": json.loads((saved / "manifest.json").read_text()),
            "files": {p.name: digest(p) for p in sorted(saved.iterdir()) if p.is_file()},
            "early_listed": sorted(listed) if isinstance(listed, dict) else describe_kind(listed),
            "returned": _path_returned(run.at_save["returned"], saved / "manifest.json")}


def _read_file(path: Path) -> dict:
    """``{"value": torch.load(path, weights_only=True)}``, or ``{"error": ...}`` naming what that raised."""
    try:
        return {"value": torch.load(path, weights_only=True)}
    except Exception as exc:  # noqa: BLE001 - a submission may write anything
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}


def _saved_files(ctx, run: _Phase1) -> dict:
    """This rank's shard and model.pt of the save of SAVE_STEP as torch.load reads them, and what was saved."""
    saved, at_save = run.saved, run.at_save
    return {"shard": _read_file(saved / f"shard_{ctx.rank:05d}.pt"), "model": _read_file(saved / "model.pt"),
            "saved_model": at_save["model"], "saved_optimizer": at_save["state_dict"],
            "saved_extra": at_save["extra"]}


def _roundtrip(run: _Phase1, load_sharded) -> dict:
    """load_sharded of the save of SAVE_STEP into the trained model: what it returned, the state it loaded and the
    state that was saved."""
    returned = _returned(load_sharded(run.saved, run.model, run.optimizer))
    return {**returned, "loaded": _snapshot(run.model, run.optimizer),
            "saved": {k: run.at_save[k] for k in ("model", "optimizer", "extra")}}


def _refusals(ctx, run: _Phase1, load_sharded) -> dict:
    """load_sharded of each damaged copy (rank 0 makes them, ``ALL_DAMAGE``), each from the same state that no
    checkpoint holds: what it raised, whether the state stayed untouched, whether the file's code ran."""
    model, optimizer, root = run.model, run.optimizer, run.root
    _steps(model, optimizer, 0, 1)          # a state that differs from every checkpoint
    if ctx.rank == 0:
        for kind in ALL_DAMAGE:
            damage(run.saved, root / kind, kind, run.early)
    dist.barrier()
    off_model, off_optimizer = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
    outcomes = {}
    for kind in ALL_DAMAGE:                 # each from the same state, one no checkpoint holds: a load shows
        model.load_state_dict(off_model)
        optimizer.load_state_dict(copy.deepcopy(off_optimizer))
        before = _snapshot(model, optimizer)
        try:
            load_sharded(root / kind, model, optimizer)
            outcome = {"raised": None}
        except Exception as exc:  # noqa: BLE001 - a submission may raise anything
            outcome = {"raised": type(exc).__name__, "value_error": isinstance(exc, ValueError),
                       "message": str(exc)[:500]}
        outcome["untouched"] = same(before, _snapshot(model, optimizer))
        outcome["ran_code"] = (root / kind / RAN_CODE).exists()
        outcomes[kind] = outcome
    return outcomes


def probe_checkpoint(ctx) -> None:
    """Phase 1: the straight run with its saves, the saved files, a round trip and the damaged copies.

    Each save runs with its file accesses in rank order (``FileOrder``), and is followed by a barrier of the
    grader's before any rank reads what it wrote."""
    order = _ordered(ctx, "phase1")
    log = SaveLog()
    log.install()                               # before the submission binds any name
    from data_parallel.checkpoint import load_sharded, save_sharded

    root = ctx.handoff_dir / "checkpoints"
    torch.manual_seed(10 + ctx.rank)
    model = _model()
    grader = unchecked_group()                  # the grader's traffic
    run = _Phase1(model, OwnerAdam(model, ref.ADAM_LR, group=grader), grader, root,
                  saved=root / f"step_{SAVE_STEP}", early=root / f"step_{EARLY_STEP}")

    done = ctx.record(P_STRAIGHT, lambda: _straight_run(ctx, run, order, log, save_sharded))
    ctx.record(P_ACCESSES, lambda: order.log)   # also when a save failed: the race may be why
    if done is None:
        return
    ctx.record(P_EVENTS, lambda: {"events": run.at_save["events"], "directory": str(run.saved.resolve())})
    ctx.record(P_MANIFEST, lambda: _manifests(run))
    ctx.record(P_FILES, lambda: _saved_files(ctx, run))
    ctx.record(P_ROUNDTRIP, lambda: _roundtrip(run, load_sharded))
    ctx.record(P_REFUSALS, lambda: _refusals(ctx, run, load_sharded))


def probe_resumed(ctx) -> None:
    """Phase 2, in new processes (nothing the submission's save kept in memory reaches them), started once every
    rank of phase 1 has finished: resume from phase 1's checkpoint on a fresh, differently initialised model
    (``load_sharded``, then the remaining steps); then a save that crashes, into a folder holding a complete
    checkpoint (last: a save that does not fail everywhere can hang the ranks)."""
    order = _ordered(ctx, "phase2")
    log = SaveLog()
    log.install()                               # before the submission binds any name
    from data_parallel.checkpoint import load_sharded, save_sharded

    root = ctx.handoff_dir / "checkpoints"
    torch.manual_seed(999)                       # whatever the checkpoint does not restore differs
    model = _model(seed=7)
    grader = unchecked_group()                  # the grader's traffic
    optimizer = OwnerAdam(model, ref.ADAM_LR, group=grader)

    def resume():
        returned = _returned(load_sharded(root / f"step_{SAVE_STEP}", model, optimizer))
        if not returned["pair"]:
            raise ValueError(f"load_sharded in a new process returned {returned['returned']}, expected a tuple "
                             "(step, extra)")
        step, extra = returned["step"], returned["extra"]
        if not (isinstance(extra, dict) and {"torch_rng", "position"} <= set(extra)):
            raise ValueError(f"load_sharded in a new process returned the extra {str(extra)[:100]}, not the one this "
                             "rank saved (it must come back from the checkpoint's files)")
        torch.set_rng_state(extra["torch_rng"])
        losses = _steps(model, optimizer, extra["position"], TOTAL_STEPS)
        return {"step": step, "losses": losses, "params": ref.params_of(model)}
    ctx.record(P_RESUME, resume)

    def crash():
        folder = root / "later" / "crashed"     # neither exists yet: save_sharded creates the folder, parents too
        with order.saving(folder):
            save_sharded(folder, EARLY_STEP, model, optimizer, extra=_extra(EARLY_STEP))
        dist.barrier(group=grader)
        log.watch(folder)
        try:                                    # every rank fails while it writes its shard: nothing to pickle
            with order.saving(folder):
                save_sharded(folder, SAVE_STEP, model, optimizer, extra={"unpicklable": lambda: None})
            raised = None
        except Exception as exc:  # noqa: BLE001
            raised = type(exc).__name__
        finally:
            kinds = [REMOVES_MANIFEST if e[0] in ("unlink", "remove") and Path(e[1]).name == MANIFEST else e[0]
                     for e in log.stop()]
        dist.barrier()
        return {"raised": raised, "manifest_left": (folder / "manifest.json").exists(), "calls": kinds}
    ctx.record(P_CRASH, crash)
