"""Problem 4 buggy variants: each bug loses exactly its intended criteria; the starter loses every criterion.

Most variants are the reference region with one targeted edit (``edited``: each old text must occur once), so
a variant differs from the reference by its bug only. A bug that spans regions lists its other edits in
``also``. Variants of different files are graded together (each case imports one file only): fewer kit copies
and spawns; the union of their criteria must fail, and nothing else.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from grading.engine.runner import run_cases
from common.regions import parse_regions
from grading.kit.splice import stub_body
from grading.problems import sub_problem
from grading.problems.p4_1_ddp import checks as p4_1_ddp
from grading.problems.p4_2_zero1 import checks as p4_2_zero1
from grading.problems.p4_3_checkpoint import checks as p4_3_checkpoint
from tests.kit.variants import Variant, assert_verdicts, edited, make_variant_kit, reference

ROOT = Path(__file__).resolve().parents[2]
DDP, ZERO, CKPT = "data_parallel/ddp.py", "data_parallel/zero1.py", "data_parallel/checkpoint.py"
PROBLEMS = {DDP: p4_1_ddp.PROBLEM, ZERO: p4_2_zero1.PROBLEM, CKPT: p4_3_checkpoint.PROBLEM}


def fails(*ids: str) -> frozenset[str]:
    return frozenset(ids)


def first(line: str, body: str) -> str:
    """``body`` with ``line`` put before it at the body's indentation."""
    return body[:len(body) - len(body.lstrip(" "))] + line + "\n" + body


_LAUNCH = "self._launched.append((dist.all_reduce(buffer, op=dist.ReduceOp.SUM, async_op=True), buffer))"
_ERROR_PATH = """            for handle, _ in self._launched:      # keep the ranks' collectives paired before failing
                handle.wait()
            self._reset()
            raise RuntimeError(message)"""

DDP_VARIANTS = [
    Variant("bucket_bytes_or_ed", DDP, "__init__", edited(DDP, "__init__", (
        "if current and size + nbytes > cap:", "if current and size | nbytes > cap:")), fails("4.1.buckets")),
    Variant("frozen_stops_bucketing", DDP, "__init__", edited(DDP, "__init__", (
        "            if not param.requires_grad:\n                continue",
        "            if not param.requires_grad:\n                break")), fails("4.1.grads", "4.1.grads_hidden")),
    Variant("bucket_bytes_start_at_minus_one", DDP, "__init__", edited(DDP, "__init__", (
        "        size = 0\n", "        size = -1\n")), fails("4.1.buckets")),
    Variant("next_bucket_bytes_start_at_one", DDP, "__init__", edited(DDP, "__init__", (
        "current, size = [], 0", "current, size = [], 1")), fails("4.1.buckets")),
    Variant("no_broadcast", DDP, "__init__", edited(DDP, "__init__", (
        """with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor.data, src=0)""", "pass")), fails("4.1.broadcast")),
    Variant("params_only_broadcast", DDP, "__init__", edited(DDP, "__init__", (
        "[*module.parameters(), *module.buffers()]", "module.parameters()")), fails("4.1.broadcast")),
    Variant("cap_reached_starts_new_bucket", DDP, "__init__", edited(DDP, "__init__", (
        "size + nbytes > cap", "size + nbytes >= cap")), fails("4.1.buckets", "4.1.buckets_hidden"),
        hint="likely cause: a bucket that reaches the cap exactly was closed"),
    Variant("registration_order_buckets", DDP, "__init__", edited(DDP, "__init__", (
        "reversed(list(named.items()))", "list(named.items())")),
        fails("4.1.buckets", "4.1.buckets_hidden", "4.1.overlap"),   # bucket 0 (fc1) completes last
        hint="likely cause: parameters taken in registration order"),
    Variant("frozen_in_buckets", DDP, "__init__", edited(DDP, "__init__", (
        """            if not param.requires_grad:
                continue
""", ""), ("self._params = [[named[name] for name in bucket] for bucket in self.buckets]",
           "self._params = [ps for ps in ([named[n] for n in b if named[n].requires_grad] for b in self.buckets) "
           "if ps]"), ("self._arrived = [0] * len(self.buckets)", "self._arrived = [0] * len(self._params)")),
        fails("4.1.buckets", "4.1.buckets_hidden"), hint="likely cause: a frozen parameter"),
    Variant("per_parameter_all_reduce", DDP, "_grad_ready", edited(DDP, "_grad_ready", (
        """            grads = [p.grad.detach().reshape(-1) for p in self._params[self._next]]
            buffer = torch.cat(grads)
            """ + _LAUNCH, """            for p in self._params[self._next]:
                buffer = p.grad.detach().reshape(-1).clone()
                """ + _LAUNCH)), fails("4.1.one_buffer"),
        also=((DDP, "finish_gradient_synchronization", edited(DDP, "finish_gradient_synchronization", (
            """        for (handle, buffer), bucket in zip(self._launched, self._params):
            handle.wait()
            buffer /= self.world_size
            offset = 0
            for param in bucket:
                n = param.numel()
                param.grad.copy_(buffer[offset:offset + n].view_as(param.grad))
                offset += n""", """        params = [p for bucket in self._params for p in bucket]
        for (handle, buffer), param in zip(self._launched, params):
            handle.wait()
            param.grad.copy_((buffer / self.world_size).view_as(param.grad))""")),),)),
    Variant("launch_when_complete_any_order", DDP, "_grad_ready", """
        index = self._bucket_of[id(param)]
        self._arrived[index] += 1
        self._seen.add(id(param))
        if self._arrived[index] == len(self._params[index]):
            buffer = torch.cat([p.grad.detach().reshape(-1) for p in self._params[index]])
            self._launched.append((index, dist.all_reduce(buffer, op=dist.ReduceOp.SUM, async_op=True), buffer))
            self._next += 1
    """, fails("4.1.launch_order"), also=((DDP, "finish_gradient_synchronization", edited(
        DDP, "finish_gradient_synchronization",
        ("for handle, _ in self._launched:", "for _, handle, _ in self._launched:"),
        ("""        for (handle, buffer), bucket in zip(self._launched, self._params):
            handle.wait()""", """        for index, handle, buffer in sorted(self._launched, key=lambda e: e[0]):
            bucket = self._params[index]
            handle.wait()"""))),)),
    Variant("sum_not_mean", DDP, "finish_gradient_synchronization", edited(DDP, "finish_gradient_synchronization", (
        "            buffer /= self.world_size\n", "")), fails("4.1.grads", "4.1.train", "4.1.grads_hidden"),
        hint="likely cause: a sum without the division by the world size"),
    Variant("launch_in_finish", DDP, "_grad_ready", """
        self._arrived[self._bucket_of[id(param)]] += 1
        self._seen.add(id(param))
    """, fails("4.1.overlap"), also=((DDP, "finish_gradient_synchronization", """
        missing = [self._names[id(p)] for bucket in self._params for p in bucket if id(p) not in self._seen]
        if missing:
            self._reset()
            raise RuntimeError(f"BucketedDDP: parameters {missing} received no gradient")
        for bucket in self._params:
            buffer = torch.cat([p.grad.detach().reshape(-1) for p in bucket])
            dist.all_reduce(buffer, op=dist.ReduceOp.SUM, async_op=True).wait()
            buffer /= self.world_size
            offset = 0
            for param in bucket:
                n = param.numel()
                param.grad.copy_(buffer[offset:offset + n].view_as(param.grad))
                offset += n
        self._reset()
    """),)),
    Variant("blocking_all_reduce_in_hook", DDP, "_grad_ready", first("import types", edited(DDP, "_grad_ready", (
        _LAUNCH, """dist.all_reduce(buffer, op=dist.ReduceOp.SUM)
            self._launched.append((types.SimpleNamespace(wait=lambda: None), buffer))"""))),
        fails("4.1.overlap")),
    Variant("state_not_reset", DDP, "_reset", "pass", fails("4.1.reset", "4.1.train", "4.1.after_error")),
    Variant("unused_not_detected", DDP, "finish_gradient_synchronization", edited(
        DDP, "finish_gradient_synchronization", (_ERROR_PATH, "            pass")), fails("4.1.unused_raises")),
    Variant("names_pending_buckets", DDP, "finish_gradient_synchronization", edited(
        DDP, "finish_gradient_synchronization", (
            "missing = [self._names[id(p)] for bucket in self._params for p in bucket if id(p) not in self._seen]",
            "missing = [name for bucket in self.buckets[self._next:] for name in bucket]")),
        fails("4.1.unused_raises")),
    # a bucket launched when its first gradient arrived, the missing ones sent as zeros (all in order)
    Variant("bucket_launched_before_full", DDP, "_grad_ready", edited(DDP, "_grad_ready", (
        "self._arrived[self._next] == len(self._params[self._next])", "self._arrived[self._next] >= 1"), (
        "[p.grad.detach()", "[(p.grad if p.grad is not None else torch.zeros_like(p)).detach()")),
        fails("4.1.grads", "4.1.grads_hidden", "4.1.train"),
        hint="likely cause: a bucket was all-reduced before all of its gradients arrived"),
    Variant("raise_without_reset", DDP, "finish_gradient_synchronization", edited(
        DDP, "finish_gradient_synchronization", (_ERROR_PATH, _ERROR_PATH.replace("            self._reset()\n", ""))),
        fails("4.1.after_error")),
    # reads each bucket's buffer without waiting on its handle: the grader hands an async result to its tensor only
    # at wait(), so this race loses on every run, with its cause named
    Variant("never_waits", DDP, "finish_gradient_synchronization", edited(DDP, "finish_gradient_synchronization", (
        "            handle.wait()\n            buffer /= self.world_size", "            buffer /= self.world_size")),
        fails("4.1.grads", "4.1.grads_hidden", "4.1.train"), hint="were never waited on (handle.wait())"),
    # ints compared by identity: equal only below 257 (ManyScalarsNet: 257 parameters in one bucket, 257 buckets)
    Variant("bucket_count_compared_with_is", DDP, "_grad_ready", edited(DDP, "_grad_ready", (
        "self._arrived[self._next] == len(self._params[self._next])",
        "self._arrived[self._next] is len(self._params[self._next])")), fails("4.1.grads")),
    Variant("next_bucket_compared_with_is_not", DDP, "_grad_ready", edited(DDP, "_grad_ready", (
        "while self._next < len(self._params)", "while self._next is not len(self._params)")),
        fails("4.1.grads")),
    Variant("finish_compares_with_is_not", DDP, "finish_gradient_synchronization", edited(
        DDP, "finish_gradient_synchronization", ("if self._next < len(self._params):",
                                                 "if self._next is not len(self._params):")),
        fails("4.1.grads")),
]

_GATHER = """        shards = [torch.empty_like(self.master) for _ in range(self.world_size)]
            dist.all_gather(shards, self.master.detach())
            full = torch.cat(shards)"""
_SCATTER = """\
            shard_grad = torch.empty(self.shard_numel, dtype=torch.float32, device=device)
            dist.reduce_scatter(shard_grad, list(grads.chunk(self.world_size)), op=dist.ReduceOp.SUM)
            shard_grad /= self.world_size"""
ZERO_VARIANTS = [
    Variant("no_division_by_world_size", ZERO, "step", edited(ZERO, "step", (
        "            shard_grad /= self.world_size\n", "")), fails("4.2.steps", "4.2.steps_hidden"),
        hint="likely cause: the reduce-scattered sum was not divided by the world size"),
    Variant("no_padding", ZERO, "_flat", """
        return torch.cat([(t if t is not None else torch.zeros_like(p)).reshape(-1).float().to(device)
                          for p, t in zip(self.params, tensors)])
    """, fails("4.2.uneven", "4.2.steps_hidden", "4.2.memory_hidden")),   # 212 parameters on 3 ranks
    Variant("replicated_optimizer_state", ZERO, "__init__", """
        device = self.params[0].device
        with torch.no_grad():
            self.master = nn.Parameter(self._flat([p.detach() for p in self.params], device))
        self.optimizer = optimizer_cls([self.master], **kwargs)
    """, fails("4.2.memory", "4.2.memory_hidden", "4.2.collectives"), also=((ZERO, "step", edited(ZERO, "step", (
        """            shard_grad = torch.empty(self.shard_numel, dtype=torch.float32, device=device)
            dist.reduce_scatter(shard_grad, list(grads.chunk(self.world_size)), op=dist.ReduceOp.SUM)
            shard_grad /= self.world_size""", """            dist.all_reduce(grads)
            shard_grad = grads / self.world_size"""), (_GATHER.strip(), "full = self.master.detach()"))),)),
    Variant("master_in_model_dtype", ZERO, "__init__", edited(ZERO, "__init__", (
        "flat[start:start + self.shard_numel].clone()",
        "flat[start:start + self.shard_numel].to(self.params[0].dtype)")),
        fails("4.2.bf16"), also=((ZERO, "step", edited(ZERO, "step", (
            "self.master.grad = shard_grad", "self.master.grad = shard_grad.to(self.master.dtype)"))),)),
    Variant("none_grads_skipped", ZERO, "_flat", """
        flat = torch.zeros(self.world_size * self.shard_numel, dtype=torch.float32, device=device)
        present = [t.reshape(-1).float() for t in tensors if t is not None]
        joined = torch.cat(present) if present else flat[:0]
        flat[:joined.numel()] = joined
        return flat
    """, fails("4.2.none_grads")),
    Variant("master_grad_kept", ZERO, "step", edited(ZERO, "step", (
        "        self.optimizer.step()\n        self.master.grad = None\n", "        self.optimizer.step()\n")),
        fails("4.2.master_grad_none")),
    # right values, twice the traffic: the whole flat gradient all-reduced, then this rank's shard sliced out
    Variant("all_reduce_then_slice", ZERO, "step", edited(ZERO, "step", (_SCATTER, """\
            dist.all_reduce(grads, op=dist.ReduceOp.SUM)
            start = self.rank * self.shard_numel
            shard_grad = grads[start:start + self.shard_numel] / self.world_size""")),
        fails("4.2.collectives"), hint="likely cause: the whole flat gradient was all-reduced"),
    # right values, twice the traffic: each rank's shard written into zeros, the full vector all-reduced
    Variant("all_gather_by_all_reduce", ZERO, "step", edited(ZERO, "step", (_GATHER.strip(), """\
full = torch.zeros(self.world_size * self.shard_numel, dtype=torch.float32, device=device)
            start = self.rank * self.shard_numel
            full[start:start + self.shard_numel] = self.master.detach()
            dist.all_reduce(full, op=dist.ReduceOp.SUM)""")),
        fails("4.2.collectives"), hint="likely cause: the updated shards were summed into a zero-padded full vector"),
    # assumes a second trainable parameter: a model with a single one raises IndexError
    Variant("device_of_second_parameter", ZERO, "__init__", edited(ZERO, "__init__", (
        "device = self.params[0].device", "device = self.params[1].device")),
        fails("4.2.steps", "4.2.steps_hidden"), hint="one trainable tensor"),
    # allowed: the flat-tensor forms of the same two collectives (full marks)
    Variant("flat_tensor_collectives", ZERO, "step", edited(ZERO, "step", (
        "dist.reduce_scatter(shard_grad, list(grads.chunk(self.world_size)), op=dist.ReduceOp.SUM)",
        "dist.reduce_scatter_tensor(shard_grad, grads, op=dist.ReduceOp.SUM)"), (_GATHER.strip(), """\
full = torch.empty(self.world_size * self.shard_numel, dtype=torch.float32, device=device)
            dist.all_gather_into_tensor(full, self.master.detach())""")), fails()),
]

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


CKPT_VARIANTS = [
    Variant("manifest_copied_not_renamed", CKPT, "save_sharded", first("import shutil", edited(CKPT, "save_sharded", (
        "os.replace(temporary, manifest)", "shutil.copy(temporary, manifest)"))),
        fails("4.3.manifest", "4.3.manifest_atomic")),
    Variant("manifest_written_in_place", CKPT, "save_sharded", edited(CKPT, "save_sharded", (
        """temporary = directory / f".{MANIFEST}.tmp{os.getpid()}"
        temporary.write_text(""", "manifest.write_text("), ("        os.replace(temporary, manifest)\n", "")),
        fails("4.3.manifest_atomic")),
    Variant("manifest_not_removed_first", CKPT, "save_sharded", edited(CKPT, "save_sharded", (
        "    if rank == 0:\n        manifest.unlink(missing_ok=True)\n", "")), fails("4.3.crash_no_manifest")),
    Variant("manifest_removed_by_rank_1", CKPT, "save_sharded", edited(CKPT, "save_sharded", (
        "    if rank == 0:\n        manifest.unlink", "    if rank == 1:\n        manifest.unlink")),
        fails("4.3.crash_no_manifest"), hint="rank 0 did not remove the old manifest.json before its first"),
    Variant("shard_keys_not_checked", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        'if not isinstance(shard, dict) or not {"optimizer", "extra"} <= shard.keys():',
        'if not isinstance(shard, dict):')), fails("4.3.refuse_shard_fields", "4.3.untouched")),
    Variant("every_rank_writes_manifest", CKPT, "save_sharded", edited(CKPT, "save_sharded", (
        "    if rank == 0:\n        files =", "    if rank >= 0:\n        files =")), fails("4.3.manifest_atomic")),
    Variant("only_larger_world_refused", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        "if saved_world != world_size:", "if saved_world > world_size:")), fails("4.3.refuse", "4.3.refuse_hidden")),
    Variant("only_missing_keys_refused", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        "    if saved != shapes:", "    if any(saved.get(k) != v for k, v in shapes.items()):")),
        fails("4.3.refuse_model", "4.3.untouched")),
    # the message's key lists sorted as they are: an int key beside the names raises TypeError, not CheckpointError
    Variant("mixed_keys_sorted_as_they_are", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        "{sorted(set(saved) - set(shapes), key=repr)}", "{sorted(set(saved) - set(shapes))}")),
        fails("4.3.refuse_model")),
    Variant("only_newer_formats_refused", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        'manifest.get("format") != FORMAT', 'manifest.get("format") > FORMAT')), fails("4.3.refuse_manifest")),
    Variant("model_file_unpickles_anything", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        'state = torch.load(directory / MODEL_FILE, map_location="cpu", weights_only=True)',
        'state = torch.load(directory / MODEL_FILE, map_location="cpu", weights_only=False)')),
        fails("4.3.refuse", "4.3.refuse_hidden"), hint="loading it ran the code its pickle holds"),
    Variant("shard_unpickles_anything", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        'shard = torch.load(shard_file, map_location="cpu", weights_only=True)',
        'shard = torch.load(shard_file, map_location="cpu", weights_only=False)')),
        fails("4.3.refuse", "4.3.refuse_hidden"), hint="loading it ran the code its pickle holds"),
    Variant("no_first_barrier", CKPT, "save_sharded", edited(CKPT, "save_sharded", (
        "manifest.unlink(missing_ok=True)\n    dist.barrier()\n", "manifest.unlink(missing_ok=True)\n")),
        fails("4.3.barriers")),
    # the digests reach rank 0 by gather_object, not the all_gather_object the docstring names
    Variant("digests_by_gather_object", CKPT, "save_sharded", edited(CKPT, "save_sharded", (
        "    gathered: list[dict] = [{} for _ in range(world_size)]\n    dist.all_gather_object(gathered, digests)",
        "    gathered = [{} for _ in range(world_size)] if rank == 0 else None\n"
        "    dist.gather_object(digests, gathered, dst=0)")), fails("4.3.barriers")),
    # the folder created without its parents: a save into a new folder of a new folder fails
    Variant("mkdir_without_parents", CKPT, "save_sharded", edited(CKPT, "save_sharded", (
        "directory.mkdir(parents=True, exist_ok=True)", "directory.mkdir(exist_ok=True)")),
        fails("4.3.crash_no_manifest")),
    Variant("no_final_barrier", CKPT, "save_sharded", edited(CKPT, "save_sharded", (
        "    dist.barrier()\n    return manifest", "    return manifest")), fails("4.3.barriers")),
    Variant("shard_keys_renamed", CKPT, "save_sharded", edited(CKPT, "save_sharded", (
        '"optimizer": optimizer.state_dict()', '"optimizer_state": optimizer.state_dict()')),
        fails("4.3.file_format"), also=((CKPT, "load_sharded", edited(CKPT, "load_sharded", (
            'optimizer.load_state_dict(shard["optimizer"])', 'optimizer.load_state_dict(shard["optimizer_state"])'),
            ('{"optimizer", "extra"}', '{"optimizer_state", "extra"}'))),)),
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
""")), fails("4.3.file_format"), hint="rank 1 wrote model.pt too"),
    Variant("hashes_not_checked", CKPT, "load_sharded", edited(CKPT, "load_sharded", (_DIGEST_CHECK, "")),
        fails("4.3.refuse", "4.3.refuse_hidden")),
    Variant("checks_own_shard_only", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        "    for name in expected:\n        file = directory / name",
        "    for name in [MODEL_FILE, shard_name(rank)]:\n        file = directory / name")),
        fails("4.3.refuse", "4.3.refuse_hidden")),
    Variant("missing_manifest_raises_file_not_found", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        "    try:\n        manifest = json.loads(path.read_text())",
        "    text = path.read_text()\n    try:\n        manifest = json.loads(text)")), fails("4.3.refuse_manifest")),
    Variant("manifest_types_not_checked", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        """        if not all(type(manifest[key]) is int for key in ("format", "step", "world_size")):
            raise ValueError("format, step and world_size must be JSON integers")
""", "")), fails("4.3.refuse_manifest"), hint="loaded it without complaint"),
    Variant("format_not_checked", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        'if manifest.get("format") != FORMAT or not isinstance(files, dict):', "if not isinstance(files, dict):")),
        fails("4.3.refuse_manifest")),
    Variant("only_listed_files_checked", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        """    for name in expected:
        if name not in files:
            raise CheckpointError(f"{path}: does not list {name}")
""", ""), ("    for name in expected:\n        file = directory / name",
               "    for name in files:\n        file = directory / name")),
        fails("4.3.refuse_manifest")),
    Variant("shard_fields_not_checked", CKPT, "load_sharded", edited(CKPT, "load_sharded", (_SHARD_FIELDS, "")),
        fails("4.3.refuse_shard_fields")),
    Variant("strict_load_without_precheck", CKPT, "load_sharded", _without_precheck(
        reference(CKPT, "load_sharded")).replace(_LOAD_MODEL, """    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise CheckpointError(f"{directory / MODEL_FILE}: does not fit the model ({exc})") from None
"""), fails("4.3.untouched", "4.3.refuse_model")),     # refuse_model: an int key makes torch raise AttributeError
    Variant("strict_load_unwrapped", CKPT, "load_sharded", _without_precheck(reference(CKPT, "load_sharded")),
        fails("4.3.refuse_model", "4.3.untouched")),
    Variant("world_size_not_checked", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        """    if saved_world != world_size:
        raise CheckpointError(f"{path}: saved by {saved_world} ranks, this run has {world_size}")
""", "")), fails("4.3.refuse", "4.3.refuse_hidden")),
    Variant("model_loaded_before_checks", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        "    expected = [MODEL_FILE,", """    try:
        model.load_state_dict(torch.load(directory / MODEL_FILE, map_location="cpu", weights_only=True))
    except Exception as exc:
        raise CheckpointError(f"{directory / MODEL_FILE}: does not load ({exc})") from None
    expected = [MODEL_FILE,""")), fails("4.3.untouched", "4.3.refuse_optimizer")),
    # issue 39: the earlier reference; an optimizer state that does not fit fails after the model was loaded
    Variant("optimizer_loaded_after_model", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        _LOADS, '    model.load_state_dict(state)\n    optimizer.load_state_dict(shard["optimizer"])\n')),
        fails("4.3.refuse_optimizer"), hint="raised ValueError"),
    Variant("optimizer_refusal_after_model_load", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        _LOADS, """    model.load_state_dict(state)
    try:
        optimizer.load_state_dict(shard["optimizer"])
    except ValueError as exc:
        raise CheckpointError(f"{shard_file}: optimizer state does not fit ({exc})") from None
""")), fails("4.3.refuse_optimizer"), hint="changed the model or the optimizer first"),
    Variant("save_returns_nothing", CKPT, "save_sharded", edited(CKPT, "save_sharded", (
        "    dist.barrier()\n    return manifest", "    dist.barrier()")), fails("4.3.manifest"),
        hint="returned NoneType, expected the manifest's path"),
    Variant("load_returns_dict", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        'return step, shard["extra"]', 'return {"step": step, "extra": shard["extra"]}')),
        fails("4.3.roundtrip", "4.3.roundtrip_hidden", "4.3.resume"), hint="returned dict, expected a tuple"),
    Variant("extra_of_rank_0_only", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        'return step, shard["extra"]',
        'return step, torch.load(directory / shard_name(0), map_location="cpu", weights_only=True)["extra"]')),
        fails("4.3.roundtrip", "4.3.resume", "4.3.roundtrip_hidden")),
    # extra comes back from what this process saved, not from the shard: right until a new process loads
    Variant("extra_kept_in_memory", CKPT, "load_sharded", edited(CKPT, "load_sharded", (
        'return step, shard["extra"]', 'return step, globals().get("_EXTRA_SAVED", {}).get(str(directory))')),
        fails("4.3.resume"), also=((CKPT, "save_sharded", edited(CKPT, "save_sharded", (
            "    directory.mkdir(parents=True, exist_ok=True)\n",
            "    directory.mkdir(parents=True, exist_ok=True)\n"
            "    globals().setdefault(\"_EXTRA_SAVED\", {})[str(directory)] = extra\n"))),)),
    # the manifest lists what the folder holds, not what this save wrote: a stale shard of more ranks gets in
    Variant("manifest_lists_the_folder", CKPT, "save_sharded", edited(CKPT, "save_sharded", (
        "files = {name: digest for part in gathered for name, digest in sorted(part.items())}",
        'files = {path.name: file_digest(path) for path in sorted(directory.glob("*.pt"))}')),
        fails("4.3.manifest"), hint="already held shard_00002.pt (left by an earlier save of 3 ranks)"),
    # allowed: rank 0 also removes the shards an earlier save by more ranks left (full marks)
    Variant("stale_shards_removed", CKPT, "save_sharded", edited(CKPT, "save_sharded", (
        "        manifest.unlink(missing_ok=True)\n",
        "        manifest.unlink(missing_ok=True)\n"
        "        for stale in directory.glob(\"shard_*.pt\"):\n"
        "            if stale.name not in {shard_name(r) for r in range(world_size)}:\n"
        "                stale.unlink()\n")), fails()),
]

_GATHERED = """    digests = {name: file_digest(path) for name, path in mine.items()}
    gathered: list[dict] = [{} for _ in range(world_size)]
    dist.all_gather_object(gathered, digests)
    if rank == 0:
        files = {name: digest for part in gathered for name, digest in sorted(part.items())}"""
_HASHED_AT_ONCE = """    if rank == 0:
        names = [MODEL_FILE, *(shard_name(r) for r in range(world_size))]
        files = {name: file_digest(directory / name) for name in sorted(names)}"""

# Races a docstring rules out, which the grader makes lose on every run (tests/kit/test_races.py grades each five
# times); the checkpoint one fails every criterion of its problem, so it is graded apart from the groups below.
RACES = [
    next(v for v in DDP_VARIANTS if v.name == "never_waits"),
    # rank 0 hashes every rank's file right after writing its own, with no collective between
    Variant("hashes_shards_without_gather", CKPT, "save_sharded", edited(CKPT, "save_sharded", (
        _GATHERED, _HASHED_AT_ONCE)), frozenset(c.id for case in PROBLEMS[CKPT].cases for c in case.criteria),
        hint="rank 0 read shard_00001.pt at data_parallel/checkpoint.py:"),
]
VARIANTS = [*DDP_VARIANTS, *ZERO_VARIANTS, *CKPT_VARIANTS, RACES[1]]


# A save variant that changes the checkpoints the loads are judged on is never graded beside a load variant.
SAVE_MASKS = {"4.3.file_format", "4.3.resume", "4.3.manifest", "4.3.roundtrip", "4.3.refuse"}


def _groups() -> list[tuple[Variant, ...]]:
    """Variants graded together: the k-th of each column (DDP, ZeRO-1, checkpoint loads then the saves that
    change what loads are judged on, the other saves), so a group edits each function once and its variants
    lose disjoint criteria (each case imports one file only)."""
    loads = [v for v in CKPT_VARIANTS if {f for _, f, _ in v.edits} == {"load_sharded"}]
    masking = [v for v in CKPT_VARIANTS if v not in loads and v.fails & SAVE_MASKS]
    columns = [DDP_VARIANTS, ZERO_VARIANTS, loads + masking, [v for v in CKPT_VARIANTS if v not in loads + masking]]
    return [tuple(column[k] for column in columns if k < len(column)) for k in range(max(map(len, columns)))]


GROUPS = _groups()


def _grade(kit: Path, problems: list[str], work: Path, servers, hidden: bool = True) -> dict:
    """Verdicts of ``problems`` on ``kit``; without ``hidden``, the cases that hold only hidden criteria (a spawn
    of their own, on 3 ranks) are left out."""
    cases = [case for problem in problems for case in sub_problem(problem).graded_cases()
             if hidden or not all(c.hidden for c in case.criteria)]
    return {v.id: v for v in run_cases(cases, kit, work / "runs", servers=servers)}


@pytest.mark.kit
@pytest.mark.parametrize("group", GROUPS, ids=["+".join(v.name for v in g) for g in GROUPS])
def test_variant_loses_only_its_criteria(group, tmp_path, fork_servers):
    """The hidden spawns run for a group only where one of its variants loses a hidden criterion: the others'
    hidden criteria are the same judges as public ones that pass (the reference's hidden marks: test_problems)."""
    kit = make_variant_kit(tmp_path / "kit", [edit for v in group for edit in v.edits])
    hidden = any(cid.endswith("_hidden") for v in group for cid in v.fails)
    assert_verdicts(_grade(kit, sorted({v.problem for v in group}), tmp_path, fork_servers, hidden), list(group))


@pytest.mark.kit
def test_every_criterion_is_lost_by_some_variant():
    lost = set().union(*(v.fails for v in VARIANTS))
    assert {c.id for problem in PROBLEMS.values() for case in problem.graded_cases() for c in case.criteria} <= lost


@pytest.mark.kit
def test_starter_loses_every_criterion_as_not_implemented(tmp_path, fork_servers):
    edits = []
    for path in PROBLEMS:
        text = (ROOT / path).read_text()
        edits += [(path, region.function, stub_body(region).strip()) for region in parse_regions(text, path)]
    kit = make_variant_kit(tmp_path / "kit", edits)
    verdicts = _grade(kit, [problem.id for problem in PROBLEMS.values()], tmp_path, fork_servers)
    assert verdicts and all(v.status == "not_implemented" for v in verdicts.values()), {
        cid: (v.status, v.message[:200]) for cid, v in verdicts.items() if v.status != "not_implemented"}
