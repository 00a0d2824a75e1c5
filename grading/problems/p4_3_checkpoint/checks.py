"""Problem 4.3 checks: sharded checkpoints (round trip, manifest, refusals) and exact resume in new processes.

Isolation: the checkpoints here hold the state of ``OwnerAdam``, a grader
optimizer that is *not* ZeRO-1 (whole parameters owned round-robin, plain
``torch.optim.Adam`` per owner, parameters broadcast from their owner), so a
bug in ``ShardedOptimizer`` costs no 4.3 point. Each rank feeds its own
random noise into the inputs, so every rank's shard (optimizer state, RNG
state in ``extra``) differs and must come back to the rank that saved it.

The resumed half of the exact-resume check runs in *new processes*: each
rank starts ``python -m grading.problems.p4_3_checkpoint.checks`` which joins a fresh
process group, loads the checkpoint into a differently initialised model and
trains the last steps.

No inputs vary here: the hidden criteria (``staff.py``) run the same probe on
3 ranks, where the spawn without the PUBLIC split skips the exact resume
(read by a public criterion only).
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from grading.engine.compare import assert_state_close, describe
from grading.engine.expect import expect
from grading.engine.results import CaseRun
from grading.engine.rubric import PUBLIC
from grading.kit.problem import SubProblem
from grading.problems.p4_1_ddp import reference as ref
from grading.problems.p4_3_checkpoint import ID, TITLE
from grading.problems.p4_3_checkpoint.reference import OwnerAdam, same

PROBLEM = SubProblem(ID, TITLE, __package__)

SIZES = (8, 16, 4)
TOTAL_STEPS, SAVE_STEP, EARLY_STEP = 20, 10, 5
NOISE = 0.05
CORRUPTIONS = ("flipped_byte_shard", "flipped_byte_model", "missing_shard", "other_world_size", "other_step_manifest",
               "truncated_manifest")
FILE_NAMED = {"flipped_byte_shard": "shard_00001.pt", "flipped_byte_model": "model.pt",
              "missing_shard": "shard_00000.pt", "other_world_size": "manifest.json",
              "other_step_manifest": None, "truncated_manifest": "manifest.json"}
CHILD_TIMEOUT_S = 60

P_STRAIGHT = "straight"
P_MANIFEST = "manifest"
P_ROUNDTRIP = "roundtrip"
P_REFUSALS = "refusals"
P_RESUME = "resume"


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


def _digest(path: Path) -> dict:
    data = path.read_bytes()
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def _corrupt(source: Path, dest: Path, kind: str, early: Path) -> None:
    shutil.copytree(source, dest)
    if kind.startswith("flipped_byte"):
        target = dest / FILE_NAMED[kind]
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0xFF
        target.write_bytes(bytes(data))
    elif kind == "missing_shard":
        (dest / FILE_NAMED[kind]).unlink()
    elif kind == "other_world_size":
        manifest = json.loads((dest / "manifest.json").read_text())
        manifest["world_size"] = manifest.get("world_size", 2) + 1
        (dest / "manifest.json").write_text(json.dumps(manifest))
    elif kind == "other_step_manifest":
        shutil.copy(early / "manifest.json", dest / "manifest.json")
    elif kind == "truncated_manifest":
        text = (dest / "manifest.json").read_text()
        (dest / "manifest.json").write_text(text[:len(text) // 2])


# ---------------------------------------------------------------- probe (rank side)
def probe_checkpoint(ctx) -> None:
    """Round trip, manifest, refusals and exact resume (resumed half in new processes; public split only)."""
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
        at_save.update(_snapshot(model, optimizer), extra=_extra(SAVE_STEP))
        save_sharded(saved, SAVE_STEP, model, optimizer, extra=_extra(SAVE_STEP))
        losses += _steps(model, optimizer, SAVE_STEP, TOTAL_STEPS)
        return {"losses": losses, "params": ref.params_of(model)}
    if ctx.record(P_STRAIGHT, straight) is None:
        return

    def manifest():
        return {"manifest": json.loads((saved / "manifest.json").read_text()),
                "files": {p.name: _digest(p) for p in sorted(saved.iterdir()) if p.is_file()}}
    ctx.record(P_MANIFEST, manifest)

    def roundtrip():
        step, extra = load_sharded(saved, model, optimizer)
        return {"step": step, "extra": extra, "loaded": _snapshot(model, optimizer), "saved": at_save}
    ctx.record(P_ROUNDTRIP, roundtrip)

    def refusals():
        _steps(model, optimizer, 0, 1)          # a state that differs from every checkpoint
        if ctx.rank == 0:
            for kind in CORRUPTIONS:
                _corrupt(saved, root / kind, kind, early)
        dist.barrier()
        outcomes = {}
        for kind in CORRUPTIONS:
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
    if PUBLIC in PROBLEM.splits(ctx):           # only a public criterion reads it
        ctx.record(P_RESUME, lambda: _resume_in_new_process(ctx, saved))


def _resume_in_new_process(ctx, saved: Path) -> dict:
    """Start this rank's successor process (a fresh group over a new file store); return what it recorded."""
    out = Path(ctx.out_dir) / "resumed.pt"
    spec = {"rank": ctx.rank, "world_size": ctx.world_size, "store": f"{ctx.store}.resume",
            "checkpoint": str(saved), "out": str(out)}
    done = subprocess.run([sys.executable, "-m", "grading.problems.p4_3_checkpoint.checks", json.dumps(spec)],
                          cwd=os.getcwd(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"the resumed process of rank {ctx.rank} failed:\n{done.stderr[-1500:]}")
    return torch.load(out, weights_only=True)


def resume_child(spec: dict) -> None:
    """The resumed half, in a new process: fresh group and model, ``load_sharded``, the remaining steps."""
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
    # Skip interpreter shutdown: tearing down a live gloo group there can abort ("terminate called ...").
    os._exit(0)


CASE = PROBLEM.case("p4_checkpoint", probe_checkpoint, world_size=2, init_group=True, timeout_s=120)


# ---------------------------------------------------------------- criteria (grader side)
@CASE.criterion("4.3.roundtrip", "a round trip restores model, optimizer shard state and extra bit for bit",
                points=2)
def check_roundtrip(run: CaseRun, split: str) -> None:
    """``load_sharded`` gives every rank back its own step, extra, model and optimizer state, bit for bit."""
    for rank in range(run.world_size):
        run.part(P_STRAIGHT, rank)             # save_sharded's own error, when it raised
        got = run.part(P_ROUNDTRIP, rank)
        expect(got["step"] == SAVE_STEP, f"load_sharded: rank {rank} returned step {got['step']!r}, "
               f"expected {SAVE_STEP}")
        expect(same(got["extra"], got["saved"]["extra"]), f"load_sharded: rank {rank} returned an extra that "
               "differs from the one this rank saved (each rank saves and gets back its own)")
        assert_state_close(f"load_sharded: rank {rank} model after loading, tensor", got["loaded"]["model"],
                           got["saved"]["model"], atol=0, rtol=0)
        expect(same(got["loaded"]["optimizer"], got["saved"]["optimizer"]), f"load_sharded: rank {rank}'s "
               "optimizer state after loading differs from the state this rank saved (bit for bit)")


@CASE.criterion("4.3.manifest", "manifest: step, world size, every file's sha256 and size", points=2)
def check_manifest(run: CaseRun, split: str) -> None:
    """manifest.json holds the step, the world size and every file's digest; no stray files remain."""
    run.part(P_STRAIGHT, 0)
    got = run.part(P_MANIFEST, 0)
    manifest, files = got["manifest"], got["files"]
    expect(isinstance(manifest, dict), f"manifest.json holds {describe(manifest)}, expected an object")
    expect(manifest.get("step") == SAVE_STEP and manifest.get("world_size") == run.world_size,
           f"manifest.json: step {manifest.get('step')!r}, world_size {manifest.get('world_size')!r}; expected "
           f"{SAVE_STEP} and {run.world_size}")
    listed = manifest.get("files")
    want = {"model.pt", *(f"shard_{r:05d}.pt" for r in range(run.world_size))}
    expect(isinstance(listed, dict) and set(listed) == want, f"manifest.json 'files' lists "
           f"{sorted(listed) if isinstance(listed, dict) else describe(listed)}, expected {sorted(want)}")
    for name, entry in listed.items():
        expect(entry == files.get(name), f"manifest.json: entry of {name} is {entry}, the file on disk has "
               f"{files.get(name)}")
    stray = sorted(set(files) - want - {"manifest.json"})
    expect(not stray, f"the checkpoint folder holds files the manifest does not list: {stray} (temporary files "
           "must be renamed or removed)")


@CASE.criterion("4.3.refuse", "flipped byte, missing shard, other world size/step, torn manifest: "
                "CheckpointError naming the file", points=3)
def check_refuse(run: CaseRun, split: str) -> None:
    """Every damaged checkpoint raises CheckpointError (a ValueError) whose message names the file."""
    run.part(P_STRAIGHT, 0)
    for rank in range(run.world_size):
        outcomes = run.part(P_REFUSALS, rank)
        for kind in CORRUPTIONS:
            got = outcomes[kind]
            what = f"load_sharded on a checkpoint with a {kind.replace('_', ' ')}: rank {rank}"
            expect(got["raised"] is not None, f"{what} loaded it without complaint")
            expect(got["raised"] == "CheckpointError" and got["value_error"],
                   f"{what} raised {got['raised']}: {got['message'][:200]}; expected CheckpointError (a ValueError)")
            named = FILE_NAMED[kind]
            names = [named] if named else ["model.pt", "shard_", "manifest.json"]
            expect(any(n in got["message"] for n in names), f"{what}: the message {got['message'][:200]!r} "
                   f"does not name the file ({' or '.join(names)})")


@CASE.criterion("4.3.untouched", "a refused load leaves model and optimizer untouched", points=2)
def check_untouched(run: CaseRun, split: str) -> None:
    """A refused ``load_sharded`` changed neither the model nor the optimizer."""
    run.part(P_STRAIGHT, 0)
    for rank in range(run.world_size):
        outcomes = run.part(P_REFUSALS, rank)
        refused = [kind for kind in CORRUPTIONS if outcomes[kind]["raised"] is not None]
        expect(refused, f"load_sharded: rank {rank} refused none of the damaged checkpoints, so none left the "
               "model untouched")
        changed = [kind for kind in refused if not outcomes[kind]["untouched"]]
        expect(not changed, f"load_sharded: rank {rank} changed the model or optimizer before refusing "
               f"{', '.join(changed)}: check everything first, then load")


@CASE.criterion("4.3.resume", "20 steps == 10 + save + new processes + load + 10 (bitwise)", points=3)
def check_resume(run: CaseRun, split: str) -> None:
    """Save, new processes, load and the remaining steps reproduce the straight run's losses and weights."""
    for rank in range(run.world_size):
        straight = run.part(P_STRAIGHT, rank)
        resumed = run.part(P_RESUME, rank)
        expect(resumed["step"] == SAVE_STEP, f"rank {rank}: the resumed process loaded step {resumed['step']!r}")
        want = straight["losses"][SAVE_STEP:]
        expect(resumed["losses"] == want, f"exact resume: rank {rank} losses of steps {SAVE_STEP}..{TOTAL_STEPS - 1} "
               f"after save + new processes + load are {[f'{v:.6g}' for v in resumed['losses']]}, straight run "
               f"{[f'{v:.6g}' for v in want]} (RNG state and data position travel in extra)")
        assert_state_close(f"exact resume: rank {rank} after {TOTAL_STEPS} steps, parameter", resumed["params"],
                           straight["params"], atol=0, rtol=0)


if __name__ == "__main__":
    resume_child(json.loads(sys.argv[1]))
