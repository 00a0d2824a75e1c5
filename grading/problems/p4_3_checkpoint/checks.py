"""Problem 4.3 checks: sharded checkpoints (round trip, manifest, refusals) and exact resume in new processes.

The checkpoints hold the state of ``OwnerAdam``, a grader optimizer that is *not* ZeRO-1, so a bug in
``ShardedOptimizer`` costs no 4.3 point; each rank feeds its own noise into the inputs, so every rank's shard
(optimizer state, RNG state in ``extra``) differs and must come back to the rank that saved it. The probes are in
``probe.py``; the hidden criteria run them on 3 ranks.
"""
from __future__ import annotations

from pathlib import Path

from grading.check import Phase, SplitRun, SubProblem, assert_state_close, describe, expect
from common.error_words import self_contained
from grading.problems.probe_helpers import OPTIMIZER_IMPORTS
from grading.problems.p4_3_checkpoint import ID, TITLE, probe
from grading.problems.p4_3_checkpoint.damage import (ALL_DAMAGE, CODE_DAMAGE, COLLECTIVES, CORRUPTIONS, MANIFEST,
                                                     MANIFEST_DAMAGE, MODEL_DAMAGE, MODEL_FILE, OPTIMIZER_DAMAGE,
                                                     SHARD_DAMAGE)
from grading.problems.p4_3_checkpoint.order import races
from grading.problems.p4_3_checkpoint.probe import (P_ACCESSES, P_CRASH, P_EVENTS, P_FILES, P_MANIFEST, P_REFUSALS,
                                                    P_RESUME, P_ROUNDTRIP, P_STRAIGHT, REMOVES_MANIFEST, SAVE_STEP,
                                                    TOTAL_STEPS)
from grading.problems.p4_3_checkpoint.reference import same

PROBLEM = SubProblem(ID, TITLE, __package__)


# The second phase, in new processes: the exact resume and a crashing save (not in a hidden-only spawn).
CASE = PROBLEM.case("p4_checkpoint", probe.probe_checkpoint, world_size=2, timeout_s=120,
                    preload=OPTIMIZER_IMPORTS, next_phases=(Phase(probe.probe_resumed, public_only=True),))


# ---------------------------------------------------------------- criteria (grader side)
@CASE.criterion("4.3.roundtrip", "a round trip restores model, optimizer shard state and extra bit for bit",
                points=2, reads=(P_STRAIGHT, P_ROUNDTRIP))
def check_roundtrip(run: SplitRun) -> None:
    """``load_sharded`` gives every rank back its own step, extra, model and optimizer state, bit for bit."""
    for rank in range(run.world_size):
        run.part(P_STRAIGHT, rank)             # save_sharded's own error, when it raised
        got = run.part(P_ROUNDTRIP, rank)
        expect(got["pair"], f"load_sharded: rank {rank} returned {got['returned']}, expected a tuple (step, extra)")
        expect(type(got["step"]) is int, f"load_sharded: rank {rank} returned the step as {describe(got['step'])}, "
               "expected an int (the manifest's step)")
        expect(got["step"] == SAVE_STEP, f"load_sharded: rank {rank} returned step {got['step']!r}, "
               f"expected {SAVE_STEP}")
        expect(same(got["extra"], got["saved"]["extra"]), f"load_sharded: rank {rank} returned an extra that "
               "differs from the one this rank saved (each rank saves and gets back its own)")
        assert_state_close(f"load_sharded: rank {rank} model after loading, tensor", got["loaded"]["model"],
                           got["saved"]["model"], atol=0, rtol=0)
        expect(same(got["loaded"]["optimizer"], got["saved"]["optimizer"]), f"load_sharded: rank {rank}'s "
               "optimizer state after loading differs from the state this rank saved (bit for bit)")


@CASE.criterion("4.3.manifest", "manifest: step, world size, every file's sha256 and size; save_sharded returns "
                "its path", points=2, reads=(P_STRAIGHT, P_MANIFEST))
def check_manifest(run: SplitRun) -> None:
    """manifest.json holds the step, the world size and every file's digest; no stray files remain; every rank's
    save_sharded returned the manifest's path as a pathlib.Path."""
    run.part(P_STRAIGHT, 0)
    for rank in range(run.world_size):
        returned = run.part(P_MANIFEST, rank)["returned"]
        expect(returned["path"] is not None and Path(returned["path"]) == Path(returned["manifest"]),
               f"save_sharded: rank {rank} returned {returned['kind']}"
               + (f" {returned['path']}" if returned["path"] is not None else "")
               + f", expected the manifest's path as a pathlib.Path: {returned['manifest']}")
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
    stale, early = probe.stale_shard(run.world_size), got["early_listed"]
    expect(early == sorted(want), f"save_sharded of step {probe.EARLY_STEP} into a folder that already held "
           f"{stale} (left by an earlier save of {run.world_size + 1} ranks): manifest.json 'files' lists {early}, "
           f"expected {sorted(want)} (only the files this save wrote)")


KIND_NOTES = {"format_true": " (manifest.json's format is JSON true, not the integer 1)",
              "step_as_text": f" (manifest.json's step is the text \"{SAVE_STEP}\", not an integer; the shards agree)"}


def _judge_refusals(run: SplitRun, kinds: dict) -> None:
    """Each damaged checkpoint of ``kinds`` raised CheckpointError (a ValueError) on every rank, naming the file."""
    run.part(P_STRAIGHT, 0)
    for rank in range(run.world_size):
        outcomes = run.part(P_REFUSALS, rank)
        for kind, named in kinds.items():
            got = outcomes[kind]
            what = f"load_sharded on a checkpoint with {kind.replace('_', ' ')}{KIND_NOTES.get(kind, '')}: rank {rank}"
            expect(got["raised"] is not None, f"{what} loaded it without complaint")
            expect(got["raised"] == "CheckpointError" and got["value_error"],
                   f"{what} raised {got['raised']}: {self_contained(got['message'])[:200]}; expected "
                   "CheckpointError (a ValueError)")
            if named == "":                  # CODE_DAMAGE: refused however the message reads, the code never run
                expect(not got.get("ran_code"), f"{what}: loading it ran the code its pickle holds; read every "
                       "file with torch.load(..., weights_only=True)")
                continue
            names = {None: ["model.pt", "shard_", "manifest.json"], "shard": [f"shard_{rank:05d}.pt"]}.get(
                named, [named, "shard_00001.pt"] if kind == "shard_not_listed" else [named])
            expect(any(n in got["message"] for n in names), f"{what}: the message {got['message'][:200]!r} "
                   f"does not name the file ({' or '.join(names)})")


@CASE.criterion("4.3.refuse", "flipped byte, missing shard, other world size/step, torn manifest: "
                "CheckpointError naming the file; a file whose pickle runs code: refused, the code never run",
                points=3, reads=(P_STRAIGHT, P_REFUSALS))
def check_refuse(run: SplitRun) -> None:
    """Every damaged checkpoint raises CheckpointError (a ValueError) whose message names the file; a model.pt or
    shard whose pickle runs code when loaded (digests that match) is refused without running it."""
    _judge_refusals(run, {**CORRUPTIONS, **CODE_DAMAGE})


@CASE.criterion("4.3.refuse_manifest", "no manifest, format 2 or true, step as text, a shard not listed: "
                "CheckpointError", points=1, reads=(P_STRAIGHT, P_REFUSALS))
def check_refuse_manifest(run: SplitRun) -> None:
    """A missing manifest, format 2 or JSON true, a step written as text (the shards agreeing, digests refreshed),
    or a manifest that does not list shard_00001.pt is refused on every rank."""
    _judge_refusals(run, MANIFEST_DAMAGE)


@CASE.criterion("4.3.refuse_shard_fields", "valid-looking shards of another rank or step: CheckpointError",
                points=1, reads=(P_STRAIGHT, P_REFUSALS))
def check_refuse_shard_fields(run: SplitRun) -> None:
    """Digests that match, but each shard holds another rank's state (or an older step's): refused."""
    _judge_refusals(run, SHARD_DAMAGE)


@CASE.criterion("4.3.refuse_model", "valid-looking model.pt with a missing key, another shape or an int key: "
                "CheckpointError", points=1, reads=(P_STRAIGHT, P_REFUSALS))
def check_refuse_model(run: SplitRun) -> None:
    """Digests that match, but model.pt misses a key, holds another shape, or an extra key (a name, or an int
    beside a name): refused, naming model.pt."""
    _judge_refusals(run, MODEL_DAMAGE)


@CASE.criterion("4.3.untouched", "a refused load leaves model and optimizer untouched", points=1,
                reads=(P_STRAIGHT, P_REFUSALS))
def check_untouched(run: SplitRun) -> None:
    """A refused ``load_sharded`` changed neither the model nor the optimizer."""
    run.part(P_STRAIGHT, 0)
    for rank in range(run.world_size):
        outcomes = run.part(P_REFUSALS, rank)
        refused = [kind for kind in ALL_DAMAGE if kind not in OPTIMIZER_DAMAGE     # 4.3.refuse_optimizer's
                   and outcomes[kind]["raised"] is not None]
        expect(refused, f"load_sharded: rank {rank} refused none of the damaged checkpoints, so none left the "
               "model untouched")
        changed = [kind for kind in refused if not outcomes[kind]["untouched"]]
        expect(not changed, f"load_sharded: rank {rank} changed the model or optimizer before refusing "
               f"{', '.join(changed)}: check everything first, then load")


@CASE.criterion("4.3.refuse_optimizer", "a shard whose optimizer state does not fit the optimizer: "
                "CheckpointError naming the shard, model and optimizer untouched", points=1,
                reads=(P_STRAIGHT, P_REFUSALS))
def check_refuse_optimizer(run: SplitRun) -> None:
    """Valid-looking shards whose optimizer state has one parameter more per group (``optimizer.load_state_dict``
    refuses it): CheckpointError naming this rank's shard, and neither the model nor the optimizer changed."""
    _judge_refusals(run, OPTIMIZER_DAMAGE)
    for rank in range(run.world_size):
        outcomes = run.part(P_REFUSALS, rank)
        for kind in OPTIMIZER_DAMAGE:
            expect(outcomes[kind]["untouched"], f"load_sharded on a checkpoint with {kind.replace('_', ' ')}: "
                   f"rank {rank} refused it but changed the model or the optimizer first: load the optimizer "
                   "state first and put it back if its load_state_dict raises (or check that it fits before "
                   "changing anything), then load the model")


@CASE.criterion("4.3.resume", "20 steps == 10 + save + new processes + load + 10 (bitwise)", points=3,
                reads=(P_STRAIGHT, P_RESUME))
def check_resume(run: SplitRun) -> None:
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


@CASE.criterion("4.3.crash_no_manifest", "a save that crashes midway leaves no manifest", points=1,
                reads=(P_STRAIGHT, P_CRASH))
def check_crash_no_manifest(run: SplitRun) -> None:
    """A save that fails in every rank's torch.save, into a folder with a complete checkpoint (which the save
    before it created, parents too): no manifest.json."""
    run.part(P_STRAIGHT, 0)                     # save_sharded's own error, when it raised
    got = run.part(P_CRASH, 0)
    expect(got["raised"] is not None, "save_sharded with an extra that cannot be pickled returned without an "
           "error (torch.save must fail on it)")
    expect(not got["manifest_left"], "save_sharded failed while writing the shards (into a folder holding a "
           "complete checkpoint) and left a manifest.json: rank 0 removes the old manifest before anything is "
           "written, so a crash from there on leaves none")
    for rank in range(run.world_size):
        calls = run.part(P_CRASH, rank)["calls"]
        before_barrier = calls[:calls.index("barrier")] if "barrier" in calls else calls
        if rank == 0:
            expect(REMOVES_MANIFEST in before_barrier, "save_sharded into a folder holding a complete checkpoint: "
                   f"rank 0 did not remove the old manifest.json before its first dist.barrier (calls in order: "
                   f"{calls}); rank 0 removes it (at world size 1 it is the only rank)")
        else:
            expect(REMOVES_MANIFEST not in calls, f"save_sharded: rank {rank} removed manifest.json (calls in "
                   f"order: {calls}); only rank 0 removes it (at world size 1 no other rank would)")


@CASE.criterion("4.3.barriers", "a barrier before any file is written; an all_gather_object; the last call a "
                "barrier after the manifest; no rank reads a file another rank writes without a collective between",
                points=1, reads=(P_ACCESSES, P_STRAIGHT, P_EVENTS))
def check_barriers(run: SplitRun) -> None:
    """No rank reads a file that another rank writes in the same stretch between collectives of a save; every
    rank enters a barrier before it writes a file, gathers the digests with all_gather_object, and returns right
    after a barrier that rank 0 entered with the manifest in place."""
    found = races([run.part(P_ACCESSES, rank) for rank in range(run.world_size)])
    expect(not found, f"save_sharded: {found[0] if found else ''}")
    for rank in range(run.world_size):
        run.part(P_STRAIGHT, rank)
        events = run.part(P_EVENTS, rank)["events"]
        kinds = [e[0] for e in events]
        first_save = kinds.index("save") if "save" in kinds else len(kinds)
        expect("barrier" in kinds[:first_save], f"save_sharded: rank {rank} wrote a file before its first "
               f"dist.barrier (calls in order: {kinds}); the ranks synchronise after rank 0 removed the old manifest")
        collectives = [e for e in events if e[0] in COLLECTIVES]
        between = [e[0] for e in collectives[1:-1]]
        expect("all_gather_object" in between, f"save_sharded: rank {rank} called {between or 'no collective'} "
               f"between its first and last dist.barrier (calls in order: {kinds}); the ranks gather the digests "
               "with dist.all_gather_object")
        last = collectives[-1] if collectives else ["none"]
        expect(last[0] == "barrier", f"save_sharded: rank {rank}'s last collective call is {last[0]} (calls in "
               f"order: {kinds}); end with dist.barrier so that no rank returns before the checkpoint is complete")
        expect(rank != 0 or last[1], f"save_sharded: rank 0 entered its final dist.barrier before manifest.json "
               f"was in place (calls in order: {kinds})")


@CASE.criterion("4.3.manifest_atomic", "manifest.json is os.replace-d into place by rank 0 alone, from a "
                "temporary in the folder", points=1, reads=(P_STRAIGHT, P_EVENTS))
def check_manifest_atomic(run: SplitRun) -> None:
    """Rank 0 put manifest.json in place with os.replace (or os.rename) of a file in the same folder; no other
    rank moved anything onto it."""
    run.part(P_STRAIGHT, 0)
    for rank in range(1, run.world_size):
        run.part(P_STRAIGHT, rank)
        moved = [e for e in run.part(P_EVENTS, rank)["events"]
                 if e[0] in ("replace", "rename") and Path(e[2]).name == MANIFEST]
        expect(not moved, f"save_sharded: rank {rank} moved {moved[0][1] if moved else ''} onto manifest.json too; "
               "rank 0 alone writes the manifest")
    got = run.part(P_EVENTS, 0)
    folder = Path(got["directory"])
    moves = [e for e in got["events"] if e[0] in ("replace", "rename") and Path(e[2]) == folder / "manifest.json"]
    expect(moves, "save_sharded: rank 0 never os.replace-d anything onto manifest.json (calls in order: "
           f"{[e[0] for e in got['events']]}); write it to a temporary name in the folder, then os.replace it")
    expect(all(Path(e[1]).parent == folder for e in moves), f"save_sharded: rank 0 moved {moves[0][1]} onto "
           "manifest.json; the temporary file must be in the checkpoint folder (a rename is atomic only there)")


def _model_writes(events: list[list]) -> list[str]:
    """The calls among one rank's save events (``SaveLog``) that wrote model.pt: a ``torch.save`` to it, or an
    ``os.replace``/``os.rename`` onto it."""
    return [e[0] for e in events if (e[0] == "save" and Path(e[1]).name == MODEL_FILE)
            or (e[0] in ("replace", "rename") and Path(e[2]).name == MODEL_FILE)]


@CASE.criterion("4.3.file_format", "model.pt (written by rank 0 alone) and each shard hold what the format says "
                "(weights_only)", points=1, reads=(P_STRAIGHT, P_EVENTS, P_FILES))
def check_file_format(run: SplitRun) -> None:
    """torch.load(weights_only=True) of model.pt gives the model's state_dict, of shard r its step/rank/...;
    no rank but rank 0 wrote model.pt (the ranks' own calls, seen whether or not they share a folder)."""
    for rank in range(run.world_size):
        run.part(P_STRAIGHT, rank)
        writes = _model_writes(run.part(P_EVENTS, rank)["events"])
        expect(rank == 0 or not writes, f"save_sharded: rank {rank} wrote model.pt too ({', '.join(writes)}); "
               "rank 0 alone writes it (ranks that share a folder would write over each other's file)")
        got = run.part(P_FILES, rank)
        for name, part in ((f"shard_{rank:05d}.pt", got["shard"]), ("model.pt", got["model"])):
            expect("value" in part, f"torch.load({name}, weights_only=True) on rank {rank} failed: "
                   f"{part.get('error')}")
        shard, want = got["shard"]["value"], {"step": SAVE_STEP, "rank": rank, "world_size": run.world_size,
                                              "optimizer": got["saved_optimizer"], "extra": got["saved_extra"]}
        expect(isinstance(shard, dict) and set(shard) == set(want), f"shard_{rank:05d}.pt holds "
               f"{sorted(shard) if isinstance(shard, dict) else describe(shard)}, expected the keys {sorted(want)}")
        wrong = [k for k in want if not same(shard[k], want[k])]
        expect(not wrong, f"shard_{rank:05d}.pt: {wrong} differ from what rank {rank} saved ({SAVE_STEP}, rank "
               f"{rank}, world size {run.world_size}, optimizer.state_dict(), extra)")
        model = got["model"]["value"]
        expect(isinstance(model, dict), f"model.pt holds {describe(model)}, expected the model's state_dict")
        assert_state_close("model.pt, tensor", model, got["saved_model"], atol=0, rtol=0)

