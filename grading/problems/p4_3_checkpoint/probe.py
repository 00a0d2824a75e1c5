"""Problem 4.3 probe (rank side): train, save, inspect, load damaged copies, resume in new processes, crash.

The resumed half of the exact-resume check runs in *new processes*: before
it joins the case's group, each rank forks its ``Successor``, while the rank
has no group, no second thread and has not called the submission yet (so
nothing the submission keeps in memory can reach it; it has the libraries
imported, as the rank had). Given the checkpoint, the successor joins a
fresh process group, loads it into a differently initialised model and
trains the last steps::

    rank r:  fork ─> successor r (waits on a pipe)
             join group, train 10 steps, save, ..., send the checkpoint ─> join a new group, load, train 10 steps
             read what the successor recorded <──────────────────────────── resumed.pt, exit
"""
from __future__ import annotations

import copy
import datetime
import json
import os
import signal
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from grading.problems.p4_1_ddp import reference as ref
from grading.problems.p4_3_checkpoint.damage import ALL_DAMAGE, SaveLog, damage, digest
from grading.problems.p4_3_checkpoint.reference import OwnerAdam, same

SIZES = (8, 16, 4)
TOTAL_STEPS, SAVE_STEP, EARLY_STEP = 20, 10, 5
NOISE = 0.05
CHILD_TIMEOUT_S = 60

P_STRAIGHT = "straight"
P_MANIFEST = "manifest"
P_ROUNDTRIP = "roundtrip"
P_REFUSALS = "refusals"
P_RESUME = "resume"
P_EVENTS = "events"           # what the save of step SAVE_STEP did, in order (SaveLog)
P_FILES = "files"             # the files of that save as torch.load reads them, and what was saved
P_CRASH = "crash"             # a save that fails in torch.save, into a folder holding a complete checkpoint


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


# ---------------------------------------------------------------- probe (rank side)
def probe_checkpoint(ctx, public: bool) -> None:
    """Round trip, manifest, files, refusals, exact resume (new processes; ``public`` only) and a crash.

    The case joins no group before the probe: the successor is forked first (``public`` only).
    """
    successor = Successor(ctx) if public else None
    try:
        ctx.join_group()
        _probe(ctx, successor)
    finally:
        if successor is not None:
            successor.close()


def _probe(ctx, successor: Successor | None) -> None:
    log = SaveLog()
    log.install()                               # before the submission binds any name
    from data_parallel.checkpoint import load_sharded, save_sharded

    root = Path(ctx.store).parent / "checkpoints"
    saved, early = root / f"step_{SAVE_STEP}", root / f"step_{EARLY_STEP}"
    torch.manual_seed(10 + ctx.rank)
    model = _model()
    optimizer = OwnerAdam(model, ref.ADAM_LR)
    at_save: dict = {}

    def straight():
        losses = _steps(model, optimizer, 0, EARLY_STEP)
        save_sharded(early, EARLY_STEP, model, optimizer, extra=_extra(EARLY_STEP))
        losses += _steps(model, optimizer, EARLY_STEP, SAVE_STEP)
        at_save.update(_snapshot(model, optimizer), extra=_extra(SAVE_STEP),
                       state_dict=copy.deepcopy(optimizer.state_dict()))
        log.watch(saved)
        try:
            save_sharded(saved, SAVE_STEP, model, optimizer, extra=_extra(SAVE_STEP))
        finally:
            at_save["events"] = log.stop()
        losses += _steps(model, optimizer, SAVE_STEP, TOTAL_STEPS)
        return {"losses": losses, "params": ref.params_of(model)}
    if ctx.record(P_STRAIGHT, straight) is None:
        return
    ctx.record(P_EVENTS, lambda: {"events": at_save["events"], "directory": str(saved.resolve())})

    def manifest():
        return {"manifest": json.loads((saved / "manifest.json").read_text()),
                "files": {p.name: digest(p) for p in sorted(saved.iterdir()) if p.is_file()}}
    ctx.record(P_MANIFEST, manifest)

    def files():
        def read(path: Path):
            try:
                return {"value": torch.load(path, weights_only=True)}
            except Exception as exc:  # noqa: BLE001 - a submission may write anything
                return {"error": f"{type(exc).__name__}: {exc}"[:300]}
        return {"shard": read(saved / f"shard_{ctx.rank:05d}.pt"), "model": read(saved / "model.pt"),
                "saved_model": at_save["model"], "saved_optimizer": at_save["state_dict"],
                "saved_extra": at_save["extra"]}
    ctx.record(P_FILES, files)

    def roundtrip():
        step, extra = load_sharded(saved, model, optimizer)
        return {"step": step, "extra": extra, "loaded": _snapshot(model, optimizer),
                "saved": {k: at_save[k] for k in ("model", "optimizer", "extra")}}
    ctx.record(P_ROUNDTRIP, roundtrip)

    def refusals():
        _steps(model, optimizer, 0, 1)          # a state that differs from every checkpoint
        if ctx.rank == 0:
            for kind in ALL_DAMAGE:
                damage(saved, root / kind, kind, early)
        dist.barrier()
        outcomes = {}
        for kind in ALL_DAMAGE:
            before = _snapshot(model, optimizer)
            try:
                load_sharded(root / kind, model, optimizer)
                outcome = {"raised": None}
            except Exception as exc:  # noqa: BLE001 - a submission may raise anything
                outcome = {"raised": type(exc).__name__, "value_error": isinstance(exc, ValueError),
                           "message": str(exc)[:500]}
            outcome["untouched"] = same(before, _snapshot(model, optimizer))
            outcomes[kind] = outcome
        return outcomes
    ctx.record(P_REFUSALS, refusals)
    if successor is None:                       # only public criteria read the rest
        return
    ctx.record(P_RESUME, lambda: successor.resume(saved))

    def crash():
        folder = root / "crashed"
        save_sharded(folder, EARLY_STEP, model, optimizer, extra=_extra(EARLY_STEP))
        try:                                    # every rank fails while it writes its shard: nothing to pickle
            save_sharded(folder, SAVE_STEP, model, optimizer, extra={"unpicklable": lambda: None})
            raised = None
        except Exception as exc:  # noqa: BLE001
            raised = type(exc).__name__
        dist.barrier()
        return {"raised": raised, "manifest_left": (folder / "manifest.json").exists()}
    ctx.record(P_CRASH, crash)               # last: a save that does not fail everywhere can hang the ranks


class Successor:
    """This rank's successor: a process forked now, that resumes from a checkpoint it is sent (``resume``).

    Fork it before the rank joins a group or starts a thread: the fork then
    holds no lock another thread owned, and no state the submission made.
    ``close`` lets a successor that was never sent a checkpoint exit.
    """

    def __init__(self, ctx):
        self.rank, self.world_size, self.store = ctx.rank, ctx.world_size, ctx.store
        self.out = Path(ctx.out_dir) / "resumed.pt"
        self.error = Path(ctx.out_dir) / "resumed_error.txt"
        read_end, self._pipe = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(self._pipe)
            _successor_main(read_end, self.error)
        os.close(read_end)

    def resume(self, checkpoint: Path) -> dict:
        """Send ``checkpoint``; wait (``CHILD_TIMEOUT_S`` at most) until the successor has resumed from it on a
        fresh group; return what it recorded. Raises RuntimeError with its traceback when it failed."""
        spec = {"rank": self.rank, "world_size": self.world_size, "store": f"{self.store}.resume",
                "checkpoint": str(checkpoint), "out": str(self.out)}
        os.write(self._pipe, json.dumps(spec).encode())
        os.close(self._pipe)
        self._pipe = None
        deadline = time.monotonic() + CHILD_TIMEOUT_S
        while (done := os.waitpid(self.pid, os.WNOHANG))[0] == 0:
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the resumed process of rank {self.rank} did not finish in {CHILD_TIMEOUT_S} s")
            time.sleep(0.01)
        self.pid, status = None, done[1]
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            detail = self.error.read_text()[-1500:] if self.error.exists() else f"exit code {code}"
            raise RuntimeError(f"the resumed process of rank {self.rank} failed:\n{detail}")
        return torch.load(self.out, weights_only=True)

    def close(self) -> None:
        """End the successor: it exits at once when it was sent nothing; a running one is killed."""
        if self._pipe is not None:
            os.close(self._pipe)
            self._pipe = None
        if self.pid is not None:
            pid, _ = os.waitpid(self.pid, os.WNOHANG)
            if pid == 0:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            self.pid = None


def _successor_main(read_end: int, error: Path) -> None:
    """The successor's whole life: read a spec until end of file, resume from it (nothing read: just exit)."""
    code = 1
    try:
        chunks = []
        while chunk := os.read(read_end, 65536):
            chunks.append(chunk)
        if chunks:
            resume_child(json.loads(b"".join(chunks)))
        code = 0
    except BaseException:  # noqa: BLE001 - reported to the rank through the error file
        error.write_text(traceback.format_exc()[-6000:])
    finally:
        os._exit(code)


def resume_child(spec: dict) -> None:
    """The resumed half, in the successor: fresh group and model, ``load_sharded``, the remaining steps."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{spec['store']}", rank=spec["rank"],
                            world_size=spec["world_size"], timeout=datetime.timedelta(seconds=CHILD_TIMEOUT_S))
    from data_parallel.checkpoint import load_sharded

    torch.manual_seed(999)                       # whatever the checkpoint does not restore differs
    model = _model(seed=7)
    optimizer = OwnerAdam(model, ref.ADAM_LR)
    step, extra = load_sharded(spec["checkpoint"], model, optimizer)
    torch.set_rng_state(extra["torch_rng"])
    losses = _steps(model, optimizer, extra["position"], TOTAL_STEPS)
    torch.save({"step": step, "losses": losses, "params": ref.params_of(model)}, spec["out"])
    dist.barrier()
