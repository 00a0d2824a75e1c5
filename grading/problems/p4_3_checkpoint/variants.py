"""Buggy variants of 4.3 (staff only, never released): each loses exactly the criteria it names and breaks
the clauses it names."""
from __future__ import annotations

from grading.kit.variants import Clause, Variant, edited, reference

CKPT = "data_parallel/checkpoint.py"


def first(line: str, body: str) -> str:
    """``body`` with ``line`` put before it at the body's indentation."""
    return body[:len(body) - len(body.lstrip(" "))] + line + "\n" + body


_DIGEST_CHECK = """        if file_digest(file) != files[name]:
            raise CheckpointError(f"{file}: size or sha256 differs from {path} (corrupt, partial or from "
                                  "another save)")
"""
_PRECHECK_START = "    shapes = {name: tuple(tensor.shape)"
_LOAD_OPTIMIZER = "    before = copy.deepcopy(optimizer.state_dict())\n"
_LOAD_MODEL = "    model.load_state_dict(state)\n"


def _span(start: str, end: str) -> str:
    """The reference ``load_sharded``'s text from ``start`` up to (not including) ``end``."""
    body = reference(CKPT, "load_sharded")
    return body[body.index(start):body.index(end)]


_SHARD_FIELDS = _span('    if (shard.get("step")', _PRECHECK_START)     # the shard's step/rank/world size check
_LOADS = _span(_LOAD_OPTIMIZER, "    return step")                       # optimizer first, then the model


def _without_precheck(body: str) -> str:
    """``load_sharded``'s reference without the keys-and-shapes check of model.pt (strict loading alone)."""
    start, end = body.index(_PRECHECK_START), body.index(_LOAD_OPTIMIZER)
    assert body.count(_LOAD_MODEL) == 1 and body.count(_LOAD_OPTIMIZER) == 1
    return body[:start] + body[end:]


_GATHERED = """    digests = {name: file_digest(path) for name, path in mine.items()}
    gathered: list[dict] = [{} for _ in range(world_size)]
    dist.all_gather_object(gathered, digests)
    if rank == 0:
        files = {name: digest for part in gathered for name, digest in sorted(part.items())}"""
_HASHED_AT_ONCE = """    if rank == 0:
        names = [MODEL_FILE, *(shard_name(r) for r in range(world_size))]
        files = {name: file_digest(directory / name) for name in sorted(names)}"""

VARIANTS = [
    Variant("manifest_copied_not_renamed", CKPT, "save_sharded", first("import shutil", edited(CKPT, "save_sharded", (
        "os.replace(temporary, manifest)", "shutil.copy(temporary, manifest)"))),
        frozenset({"4.3.manifest", "4.3.manifest_atomic"}),
        breaks=(Clause("433", "save_sharded", "manifest `{format, step, world_size, files: {name: sha256, "
                       "bytes}}`; no other file stays in the folder", "4.3.manifest"),)),
    Variant("manifest_written_in_place", CKPT, "save_sharded", edited(CKPT, "save_sharded", (
        """temporary = directory / f".{MANIFEST}.tmp{os.getpid()}"
        temporary.write_text(""", "manifest.write_text("), ("        os.replace(temporary, manifest)\n", "")),
        frozenset({"4.3.manifest_atomic"}),
        breaks=(Clause("434", "save_sharded", "manifest written to a temporary name in the folder, then "
                       "`os.replace`-d into place", "4.3.manifest_atomic"),)),
    Variant("manifest_not_removed_first", CKPT, "save_sharded", edited(CKPT, "save_sharded", (
        "    if rank == 0:\n        manifest.unlink(missing_ok=True)\n", "")), frozenset({"4.3.crash_no_manifest"}),
        breaks=(Clause("430", "save_sharded", "rank 0 removes the old manifest first: a save that fails midway "
                       "leaves no manifest (simulated)", "4.3.crash_no_manifest"),)),
    Variant("manifest_removed_by_rank_1", CKPT, "save_sharded", edited(CKPT, "save_sharded", (
        "    if rank == 0:\n        manifest.unlink", "    if rank == 1:\n        manifest.unlink")),
        frozenset({"4.3.crash_no_manifest"}), hint="rank 0 did not remove the old manifest.json before its first",
        breaks=(Clause("430b", "save_sharded", "... rank 0, not another rank (at world size 1 no other rank "
                       "would remove it)", "4.3.crash_no_manifest"),)),
    Variant("shard_keys_not_checked", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        'if not isinstance(shard, dict) or not {"optimizer", "extra"} <= shard.keys():',
        'if not isinstance(shard, dict):')), frozenset({"4.3.refuse_shard_fields", "4.3.untouched"}),
        breaks=(Clause("442b", "load_sharded", '... and holds `"optimizer"` and `"extra"` (a shard without '
                       "`extra`, valid-looking digests: refused before anything changes)",
                       "4.3.refuse_shard_fields"),)),
    Variant("every_rank_writes_manifest", CKPT, "save_sharded", edited(CKPT, "save_sharded", (
        "    if rank == 0:\n        files =", "    if rank >= 0:\n        files =")),
        frozenset({"4.3.manifest_atomic"}),
        breaks=(Clause("434b", "save_sharded", "rank 0 alone puts manifest.json in place (no other rank moves a "
                       "file onto it)", "4.3.manifest_atomic"),)),
    Variant("only_larger_world_refused", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        "if saved_world != world_size:", "if saved_world > world_size:")),
        frozenset({"4.3.refuse", "4.3.refuse_hidden"}),
        breaks=(Clause("441b", "load_sharded", "... smaller as well as larger (every file still listed, only the "
                       "recorded world size one less)", "4.3.refuse"),)),
    Variant("only_missing_keys_refused", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        "    if saved != shapes:", "    if any(saved.get(k) != v for k, v in shapes.items()):")),
        frozenset({"4.3.refuse_model", "4.3.untouched"}),
        breaks=(Clause("443a", "load_sharded", "... no key more than the model's either (a model.pt with an "
                       "extra key, valid-looking digests)", "4.3.refuse_model"),)),
    # the message's key lists sorted as they are: an int key beside the names raises TypeError, not CheckpointError
    Variant("mixed_keys_sorted_as_they_are", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        "{sorted(set(saved) - set(shapes), key=repr)}", "{sorted(set(saved) - set(shapes))}")),
        frozenset({"4.3.refuse_model"}),
        breaks=(Clause("443d", "load_sharded", "... an int key beside the names too: CheckpointError, not the "
                       "TypeError of sorting mixed keys", "4.3.refuse_model"),)),
    Variant("only_newer_formats_refused", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        'manifest.get("format") != FORMAT', 'manifest.get("format") > FORMAT')), frozenset({"4.3.refuse_manifest"}),
        breaks=(Clause("437c", "load_sharded", "... not an older format either (format 0)", "4.3.refuse_manifest"),)),
    Variant("model_file_unpickles_anything", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        'state = torch.load(directory / MODEL_FILE, map_location="cpu", weights_only=True)',
        'state = torch.load(directory / MODEL_FILE, map_location="cpu", weights_only=False)')),
        frozenset({"4.3.refuse", "4.3.refuse_hidden"}), hint="loading it ran the code its pickle holds",
        breaks=(Clause("443b", "load_sharded", "reads model.pt with `weights_only=True`: a model.pt whose pickle "
                       "runs code (listed with its digest) is refused and the code never runs", "4.3.refuse"),)),
    Variant("shard_unpickles_anything", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        'shard = torch.load(shard_file, map_location="cpu", weights_only=True)',
        'shard = torch.load(shard_file, map_location="cpu", weights_only=False)')),
        frozenset({"4.3.refuse", "4.3.refuse_hidden"}), hint="loading it ran the code its pickle holds",
        breaks=(Clause("443c", "load_sharded", "... and this rank's shard likewise", "4.3.refuse"),)),
    Variant("no_first_barrier", CKPT, "save_sharded", edited(CKPT, "save_sharded", (
        "manifest.unlink(missing_ok=True)\n    dist.barrier()\n", "manifest.unlink(missing_ok=True)\n")),
        frozenset({"4.3.barriers"}),
        breaks=(Clause("431", "save_sharded", "then all ranks synchronise (`dist.barrier`) before any file is "
                       "written", "4.3.barriers"),)),
    # the digests reach rank 0 by gather_object, not the all_gather_object the docstring names
    Variant("digests_by_gather_object", CKPT, "save_sharded", edited(CKPT, "save_sharded", (
        "    gathered: list[dict] = [{} for _ in range(world_size)]\n    dist.all_gather_object(gathered, digests)",
        "    gathered = [{} for _ in range(world_size)] if rank == 0 else None\n"
        "    dist.gather_object(digests, gathered, dst=0)")), frozenset({"4.3.barriers"}),
        breaks=(Clause("435a", "save_sharded", "the ranks gather the digests on rank 0 with "
                       "`dist.all_gather_object` (between the barriers; not `gather_object`)", "4.3.barriers"),)),
    # the folder created without its parents: a save into a new folder of a new folder fails
    Variant("mkdir_without_parents", CKPT, "save_sharded", edited(CKPT, "save_sharded", (
        "directory.mkdir(parents=True, exist_ok=True)", "directory.mkdir(exist_ok=True)")),
        frozenset({"4.3.crash_no_manifest"}),
        breaks=(Clause("430c", "save_sharded", "creates `directory`, parents too (the crash test saves first "
                       "into a new folder of a new folder)", "4.3.crash_no_manifest"),)),
    Variant("no_final_barrier", CKPT, "save_sharded", edited(CKPT, "save_sharded", (
        "    dist.barrier()\n    return manifest", "    return manifest")), frozenset({"4.3.barriers"}),
        breaks=(Clause("435", "save_sharded", "a final `dist.barrier`, entered after the manifest is in place",
                       "4.3.barriers"),)),
    Variant("shard_keys_renamed", CKPT, "save_sharded", edited(CKPT, "save_sharded", (
        '"optimizer": optimizer.state_dict()', '"optimizer_state": optimizer.state_dict()')),
        frozenset({"4.3.file_format"}), also=((CKPT, "load_sharded", edited(CKPT, "load_sharded", (
            'optimizer.load_state_dict(shard["optimizer"])', 'optimizer.load_state_dict(shard["optimizer_state"])'),
            ('{"optimizer", "extra"}', '{"optimizer_state", "extra"}'))),),
        breaks=(Clause("432", "save_sharded", "shard r holds `{step, rank, world_size, optimizer, extra}`, "
                       "model.pt the state_dict; `weights_only` loadable", "4.3.file_format"),)),
    # every rank writes model.pt, in turn (so the file is whole when rank 0 takes its digest): only rank 0 may
    Variant("every_rank_writes_model", CKPT, "save_sharded", edited(CKPT, "save_sharded", ("""    if rank == 0:
        state = {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
        mine[MODEL_FILE] = directory / MODEL_FILE
        torch.save(state, mine[MODEL_FILE])
""", """    state = {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
    for writer in range(world_size):
        if rank == writer:
            torch.save(state, directory / MODEL_FILE)
        dist.barrier()
    if rank == 0:
        mine[MODEL_FILE] = directory / MODEL_FILE
""")), frozenset({"4.3.file_format"}), hint="rank 1 wrote model.pt too",
        breaks=(Clause("432b", "save_sharded", "rank 0 alone writes `model.pt` (each rank's own calls: a "
                       "`torch.save` to it or an `os.replace` onto it)", "4.3.file_format"),)),
    Variant("hashes_not_checked", CKPT, "load_sharded", edited(CKPT, "load_sharded", (_DIGEST_CHECK, "")),
        frozenset({"4.3.refuse", "4.3.refuse_hidden"}),
        breaks=(Clause("439", "load_sharded", "each of these files exists with exactly the recorded size and "
                       "sha256", "4.3.refuse"),)),
    Variant("checks_own_shard_only", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        "    for name in expected:\n        file = directory / name",
        "    for name in [MODEL_FILE, shard_name(rank)]:\n        file = directory / name")),
        frozenset({"4.3.refuse", "4.3.refuse_hidden"}),
        breaks=(Clause("440", "load_sharded", "every rank checks every file (a missing, unlisted or damaged "
                       "file: every rank refuses)", "4.3.refuse"),)),
    Variant("missing_manifest_raises_file_not_found", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        "    try:\n        manifest = json.loads(path.read_text())",
        "    text = path.read_text()\n    try:\n        manifest = json.loads(text)")),
        frozenset({"4.3.refuse_manifest"}),
        breaks=(Clause("436", "load_sharded", "CheckpointError when manifest.json is missing",
                       "4.3.refuse_manifest"),)),
    Variant("manifest_types_not_checked", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        """        if not all(type(manifest[key]) is int for key in ("format", "step", "world_size")):
            raise ValueError("format, step and world_size must be JSON integers")
""", "")), frozenset({"4.3.refuse_manifest"}), hint="loaded it without complaint",
        breaks=(Clause("437b", "load_sharded", "`format` the integer 1 and `step`, `world_size` integers: a "
                       "manifest with format `true` (`True == 1`) or step `\"10\"` (its shards agreeing) is "
                       "refused, so the step returned is an int", "4.3.refuse_manifest"),)),
    Variant("format_not_checked", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        'if manifest.get("format") != FORMAT or not isinstance(files, dict):', "if not isinstance(files, dict):")),
        frozenset({"4.3.refuse_manifest"}),
        breaks=(Clause("437", "load_sharded", "... or its format is not 1", "4.3.refuse_manifest"),)),
    Variant("only_listed_files_checked", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        """    for name in expected:
        if name not in files:
            raise CheckpointError(f"{path}: does not list {name}")
""", ""), ("    for name in expected:\n        file = directory / name",
               "    for name in files:\n        file = directory / name")),
        frozenset({"4.3.refuse_manifest"}),
        breaks=(Clause("438", "load_sharded", "it must list model.pt and every rank's shard",
                       "4.3.refuse_manifest"),)),
    Variant("shard_fields_not_checked", CKPT, "load_sharded", edited(CKPT, "load_sharded", (_SHARD_FIELDS, "")),
        frozenset({"4.3.refuse_shard_fields"}),
        breaks=(Clause("442", "load_sharded", "this rank's shard records the manifest's step, this rank and the "
                       "world size (valid-looking digests)", "4.3.refuse_shard_fields"),)),
    Variant("strict_load_without_precheck", CKPT, "load_sharded", _without_precheck(
        reference(CKPT, "load_sharded")).replace(_LOAD_MODEL, """    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise CheckpointError(f"{directory / MODEL_FILE}: does not fit the model ({exc})") from None
"""), frozenset({"4.3.untouched", "4.3.refuse_model"}),     # refuse_model: an int key makes torch raise AttributeError
        breaks=(Clause("444b", "load_sharded", "a strict `load_state_dict` is no check: it copies the matching "
                       "keys before it raises", "4.3.untouched"),)),
    Variant("strict_load_unwrapped", CKPT, "load_sharded", _without_precheck(reference(CKPT, "load_sharded")),
        frozenset({"4.3.refuse_model", "4.3.untouched"}),
        breaks=(Clause("443", "load_sharded", "model.pt holds exactly the model's keys and shapes (checked, not "
                       "left to a strict load)", "4.3.refuse_model"),)),
    Variant("world_size_not_checked", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        """    if saved_world != world_size:
        raise CheckpointError(f"{path}: saved by {saved_world} ranks, this run has {world_size}")
""", "")), frozenset({"4.3.refuse", "4.3.refuse_hidden"}),
        breaks=(Clause("441", "load_sharded", "the manifest's world size equals the run's", "4.3.refuse"),)),
    Variant("model_loaded_before_checks", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        "    expected = [MODEL_FILE,", """    try:
        model.load_state_dict(torch.load(directory / MODEL_FILE, map_location="cpu", weights_only=True))
    except Exception as exc:
        raise CheckpointError(f"{directory / MODEL_FILE}: does not load ({exc})") from None
    expected = [MODEL_FILE,""")), frozenset({"4.3.untouched", "4.3.refuse_optimizer"}),
        breaks=(
            Clause("444", "load_sharded", "checks everything before it changes anything", "4.3.untouched"),
            Clause("444e", "load_sharded", "a model loaded before the checks is caught on every damaged copy "
                   "(each is loaded from the same state, one no checkpoint holds)", "4.3.refuse_optimizer"),
        )),
    # the model loaded before the optimizer state is checked: an optimizer state that does not fit fails too late
    Variant("optimizer_loaded_after_model", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        _LOADS, '    model.load_state_dict(state)\n    optimizer.load_state_dict(shard["optimizer"])\n')),
        frozenset({"4.3.refuse_optimizer"}), hint="raised ValueError",
        breaks=(Clause("444c", "load_sharded", "an optimizer state that does not fit the optimizer (one "
                       "parameter more per group, valid-looking digests): CheckpointError naming this rank's "
                       "shard", "4.3.refuse_optimizer"),)),
    Variant("optimizer_refusal_after_model_load", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        _LOADS, """    model.load_state_dict(state)
    try:
        optimizer.load_state_dict(shard["optimizer"])
    except ValueError as exc:
        raise CheckpointError(f"{shard_file}: optimizer state does not fit ({exc})") from None
""")), frozenset({"4.3.refuse_optimizer"}), hint="changed the model or the optimizer first",
        breaks=(Clause("444d", "load_sharded", "... with the model and the optimizer exactly as they were (fit "
                       "checked first, or the optimizer loaded first and put back)", "4.3.refuse_optimizer"),)),
    Variant("save_returns_nothing", CKPT, "save_sharded", edited(CKPT, "save_sharded", (
        "    dist.barrier()\n    return manifest", "    dist.barrier()")), frozenset({"4.3.manifest"}),
        hint="returned NoneType, expected the manifest's path",
        breaks=(Clause("445c", "save_sharded", "every rank returns the manifest's path, a `pathlib.Path` (not "
                       "None; the message names what came back)", "4.3.manifest"),)),
    Variant("load_returns_dict", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        'return step, shard["extra"]', 'return {"step": step, "extra": shard["extra"]}')),
        frozenset({"4.3.roundtrip", "4.3.roundtrip_hidden", "4.3.resume"}), hint="returned dict, expected a tuple",
        breaks=(Clause("445b", "load_sharded", "returns the tuple `(step, extra)`, step an int (not a dict; the "
                       "message names what came back)", "4.3.roundtrip"),)),
    Variant("extra_of_rank_0_only", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        'return step, shard["extra"]',
        'return step, torch.load(directory / shard_name(0), map_location="cpu", weights_only=True)["extra"]')),
        frozenset({"4.3.roundtrip", "4.3.resume", "4.3.roundtrip_hidden"}),
        breaks=(
            Clause("445", "load_sharded", "restores model, this rank's optimizer state and returns `(step, this "
                   "rank's extra)`", "4.3.roundtrip"),
            Clause("446", "load_sharded", "save, new processes, load, continue: bitwise the straight run",
                   "4.3.resume"),
        )),
    # extra comes back from what this process saved, not from the shard: right until a new process loads
    Variant("extra_kept_in_memory", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        'return step, shard["extra"]', 'return step, globals().get("_EXTRA_SAVED", {}).get(str(directory))')),
        frozenset({"4.3.resume"}), also=((CKPT, "save_sharded", edited(CKPT, "save_sharded", (
            "    directory.mkdir(parents=True, exist_ok=True)\n",
            "    directory.mkdir(parents=True, exist_ok=True)\n"
            "    globals().setdefault(\"_EXTRA_SAVED\", {})[str(directory)] = extra\n"))),),
        breaks=(Clause("446b", "load_sharded", "returns this rank's extra as its shard holds it (read from the "
                       "file: a new process that saved nothing gets it back)", "4.3.resume"),)),
    # the manifest lists what the folder holds, not what this save wrote: a stale shard of more ranks gets in
    Variant("manifest_lists_the_folder", CKPT, "save_sharded", edited(CKPT, "save_sharded", (
        "files = {name: digest for part in gathered for name, digest in sorted(part.items())}",
        'files = {path.name: file_digest(path) for path in sorted(directory.glob("*.pt"))}')),
        frozenset({"4.3.manifest"}), hint="already held shard_00002.pt (left by an earlier save of 3 ranks)",
        breaks=(Clause("433b", "save_sharded", "`files` lists exactly the files this save wrote: a stale "
                       "`shard_00002.pt` of an earlier save by more ranks, already in the folder, is not listed "
                       "(whether it stays or is removed is free: `stale_shards_removed` keeps full marks)",
                       "4.3.manifest"),)),
    # allowed: rank 0 also removes the shards an earlier save by more ranks left (full marks)
    Variant("stale_shards_removed", CKPT, "save_sharded", edited(CKPT, "save_sharded", (
        "        manifest.unlink(missing_ok=True)\n",
        "        manifest.unlink(missing_ok=True)\n"
        "        for stale in directory.glob(\"shard_*.pt\"):\n"
        "            if stale.name not in {shard_name(r) for r in range(world_size)}:\n"
        "                stale.unlink()\n")), frozenset()),
    # rank 0 hashes every rank's file right after writing its own, with no collective between
    Variant("hashes_shards_without_gather", CKPT, "save_sharded", edited(CKPT, "save_sharded", (
        _GATHERED, _HASHED_AT_ONCE)),
        frozenset({"4.3.roundtrip", "4.3.manifest", "4.3.refuse", "4.3.refuse_manifest", "4.3.refuse_shard_fields",
                   "4.3.refuse_model", "4.3.untouched", "4.3.refuse_optimizer", "4.3.resume", "4.3.crash_no_manifest",
                   "4.3.barriers", "4.3.manifest_atomic", "4.3.file_format"}),     # every public criterion of 4.3
        hint="rank 0 read shard_00001.pt at data_parallel/checkpoint.py:",
        breaks=(Clause("435b", "save_sharded", "a rank reads another rank's file only after a collective that "
                       "follows the write (the grader runs a stretch's file accesses in rank order, so the race "
                       "loses on every run; the message names both lines)", "4.3.barriers"),),
        alone=True),        # a race: tests/kit/test_races.py grades it (by this name) five times more, on its own
]

NOT_GRADED = """
Caller obligations, nothing to grade: at most 256 ranks for `load_sharded`, every rank calling `save_sharded`
with the same arguments. Freedoms: that `load_sharded` needs no communication; whether `load_sharded` on the ranks
whose own shard is right refuses a checkpoint whose shards are wrong for other ranks only (each rank checks its own
shard; the digests, the manifest and model.pt are checked alike on every rank, so every rank refuses those:
4.3.refuse); whether `load_sharded` checks that the optimizer state fits before changing anything or loads the
optimizer first and puts it back (4.3.refuse_optimizer observes the outcome only). *GPU only*
(`scripts/gpu_check.sh`, part `problem4_cuda`): model.pt holding CPU tensors of a CUDA model, and `load_sharded`
reading with `map_location="cpu"` and putting values back on the model's and optimizer's devices.
"""
