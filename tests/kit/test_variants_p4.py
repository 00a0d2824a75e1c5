"""Problem 4 buggy variants: each bug loses exactly its intended criteria; the starter loses every criterion.

Runs the Problem 4 cases directly (``PROBLEM.graded_cases()`` of each folder: the public cases and, on the
staff side, the hidden 3-rank ones) on a kit copy whose regions are replaced; a variant may edit several
regions of one bug (e.g. a blocking all-reduce changes the hook and what finish waits for).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from grading.problems.p4_1_ddp import checks as p4_1_ddp
from grading.problems.p4_2_zero1 import checks as p4_2_zero1
from grading.problems.p4_3_checkpoint import checks as p4_3_checkpoint
from grading.kit.regions import parse_regions, stub_body
from grading.engine.runner import run_case
from tests.kit.variants import make_variant_kit

DDP, ZERO, CKPT = "data_parallel/ddp.py", "data_parallel/zero1.py", "data_parallel/checkpoint.py"
CASES = {DDP: p4_1_ddp.PROBLEM.graded_cases(), ZERO: p4_2_zero1.PROBLEM.graded_cases(),
         CKPT: p4_3_checkpoint.PROBLEM.graded_cases()}


@dataclass(frozen=True)
class Bug:
    """A named bug: ``edits`` are (function, new region body) in ``path``; ``fails`` the criteria it must lose."""

    name: str
    path: str
    edits: tuple[tuple[str, str], ...]
    fails: frozenset[str]


BUGS = [
    Bug("no_broadcast", DDP, (("__init__", """
        self.world_size = dist.get_world_size()
        named = dict(module.named_parameters())
        cap = self.bucket_mb * MIB
        current, size = [], 0
        for name, param in reversed(list(named.items())):
            if not param.requires_grad:
                continue
            nbytes = param.numel() * param.element_size()
            if current and size + nbytes > cap:
                self.buckets.append(current)
                current, size = [], 0
            current.append(name)
            size += nbytes
        if current:
            self.buckets.append(current)
        self._params = [[named[name] for name in bucket] for bucket in self.buckets]
        self._bucket_of = {id(param): index for index, bucket in enumerate(self._params) for param in bucket}
        self._arrived = [0] * len(self.buckets)
        self._next = 0
        self._launched = []
        for bucket in self._params:
            for param in bucket:
                param.register_post_accumulate_grad_hook(self._grad_ready)
    """),), frozenset({"4.1.broadcast"})),
    Bug("cap_reached_starts_new_bucket", DDP, (("__init__", """
        self.world_size = dist.get_world_size()
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor.data, src=0)
        named = dict(module.named_parameters())
        cap = self.bucket_mb * MIB
        current, size = [], 0
        for name, param in reversed(list(named.items())):
            if not param.requires_grad:
                continue
            nbytes = param.numel() * param.element_size()
            if current and size + nbytes >= cap:
                self.buckets.append(current)
                current, size = [], 0
            current.append(name)
            size += nbytes
        if current:
            self.buckets.append(current)
        self._params = [[named[name] for name in bucket] for bucket in self.buckets]
        self._bucket_of = {id(param): index for index, bucket in enumerate(self._params) for param in bucket}
        self._arrived = [0] * len(self.buckets)
        self._next = 0
        self._launched = []
        for bucket in self._params:
            for param in bucket:
                param.register_post_accumulate_grad_hook(self._grad_ready)
    """),), frozenset({"4.1.buckets"})),
    Bug("sum_not_mean", DDP, (("finish_gradient_synchronization", """
        for (handle, buffer), bucket in zip(self._launched, self._params):
            handle.wait()
            offset = 0
            for param in bucket:
                n = param.numel()
                param.grad.copy_(buffer[offset:offset + n].view_as(param.grad))
                offset += n
        self._reset()
    """),), frozenset({"4.1.grads", "4.1.train", "4.1.grads_hidden"})),
    Bug("launch_in_finish", DDP, (("_grad_ready", """
        self._arrived[self._bucket_of[id(param)]] += 1
    """), ("finish_gradient_synchronization", """
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
    """)), frozenset({"4.1.overlap"})),
    Bug("blocking_all_reduce_in_hook", DDP, (("_grad_ready", """
        import types
        self._arrived[self._bucket_of[id(param)]] += 1
        while self._next < len(self._params) and self._arrived[self._next] == len(self._params[self._next]):
            buffer = torch.cat([p.grad.detach().reshape(-1) for p in self._params[self._next]])
            dist.all_reduce(buffer, op=dist.ReduceOp.SUM)
            self._launched.append((types.SimpleNamespace(wait=lambda: None), buffer))
            self._next += 1
    """),), frozenset({"4.1.overlap"})),
    Bug("state_not_reset", DDP, (("_reset", """
        pass
    """),), frozenset({"4.1.reset", "4.1.train"})),
    Bug("no_division_by_world_size", ZERO, (("step", """
        device = self.master.device
        with torch.no_grad():
            grads = self._flat([p.grad for p in self.params], device)
            shard_grad = torch.empty(self.shard_numel, dtype=torch.float32, device=device)
            dist.reduce_scatter(shard_grad, list(grads.chunk(self.world_size)), op=dist.ReduceOp.SUM)
        self.master.grad = shard_grad
        self.optimizer.step()
        self.master.grad = None
        with torch.no_grad():
            shards = [torch.empty_like(self.master) for _ in range(self.world_size)]
            dist.all_gather(shards, self.master.detach())
            full = torch.cat(shards)
            offset = 0
            for param in self.params:
                n = param.numel()
                param.copy_(full[offset:offset + n].view_as(param).to(param.dtype))
                offset += n
    """),), frozenset({"4.2.steps", "4.2.steps_hidden"})),
    Bug("no_padding", ZERO, (("_flat", """
        return torch.cat([(t if t is not None else torch.zeros_like(p)).reshape(-1).float().to(device)
                          for p, t in zip(self.params, tensors)])
    """),), frozenset({"4.2.uneven", "4.2.steps_hidden", "4.2.memory_hidden"})),   # 212 parameters on 3 ranks
    Bug("replicated_optimizer_state", ZERO, (("__init__", """
        device = self.params[0].device
        with torch.no_grad():
            self.master = nn.Parameter(self._flat([p.detach() for p in self.params], device))
        self.optimizer = optimizer_cls([self.master], **kwargs)
    """), ("step", """
        with torch.no_grad():
            grads = self._flat([p.grad for p in self.params], self.master.device)
            dist.all_reduce(grads)
            grads /= self.world_size
        self.master.grad = grads
        self.optimizer.step()
        self.master.grad = None
        with torch.no_grad():
            offset = 0
            for param in self.params:
                n = param.numel()
                param.copy_(self.master[offset:offset + n].view_as(param).to(param.dtype))
                offset += n
    """)), frozenset({"4.2.memory", "4.2.memory_hidden"})),
    Bug("master_in_model_dtype", ZERO, (("__init__", """
        device = self.params[0].device
        with torch.no_grad():
            flat = self._flat([p.detach() for p in self.params], device)
            start = self.rank * self.shard_numel
            self.master = nn.Parameter(flat[start:start + self.shard_numel].to(self.params[0].dtype))
        self.optimizer = optimizer_cls([self.master], **kwargs)
    """), ("step", """
        device = self.master.device
        with torch.no_grad():
            grads = self._flat([p.grad for p in self.params], device)
            shard_grad = torch.empty(self.shard_numel, dtype=torch.float32, device=device)
            dist.reduce_scatter(shard_grad, list(grads.chunk(self.world_size)), op=dist.ReduceOp.SUM)
            shard_grad /= self.world_size
        self.master.grad = shard_grad.to(self.master.dtype)
        self.optimizer.step()
        self.master.grad = None
        with torch.no_grad():
            shards = [torch.empty_like(self.master) for _ in range(self.world_size)]
            dist.all_gather(shards, self.master.detach())
            full = torch.cat(shards)
            offset = 0
            for param in self.params:
                n = param.numel()
                param.copy_(full[offset:offset + n].view_as(param).to(param.dtype))
                offset += n
    """)), frozenset({"4.2.bf16"})),
]

_SAVE_BODY = """
    directory.mkdir(parents=True, exist_ok=True)
    manifest = directory / MANIFEST
    if rank == 0:
        manifest.unlink(missing_ok=True)
    dist.barrier()
    mine = {shard_name(rank): directory / shard_name(rank)}
    torch.save({"step": step, "rank": rank, "world_size": world_size, "optimizer": optimizer.state_dict(),
                "extra": extra}, mine[shard_name(rank)])
    if rank == 0:
        mine[MODEL_FILE] = directory / MODEL_FILE
        torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, mine[MODEL_FILE])
    gathered = [{} for _ in range(world_size)]
    dist.all_gather_object(gathered, {name: file_digest(path) for name, path in mine.items()})
    if rank == 0:
        files = {name: digest for part in gathered for name, digest in sorted(part.items())}
        temporary = directory / f".{MANIFEST}.tmp"
        temporary.write_text(json.dumps({"format": FORMAT, "step": step, "world_size": world_size, "files": files}))
        WRITE_MANIFEST
    dist.barrier()
    return manifest
"""

_LOAD_HEAD = """
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text())
        step, saved_world, files = manifest["step"], manifest["world_size"], manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}: unreadable ({exc})") from None
    if saved_world != world_size:
        raise CheckpointError(f"{path}: saved by {saved_world} ranks, this run has {world_size}")
"""
_VERIFY = """
    for name in [MODEL_FILE, *(shard_name(r) for r in range(world_size))]:
        file = directory / name
        if name not in files or not file.is_file():
            raise CheckpointError(f"{file}: missing")
        if file_digest(file) != files[name]:
            raise CheckpointError(f"{file}: size or sha256 differs from {path}")
"""
_LOAD_REST = """
    shard = torch.load(directory / shard_name(rank), weights_only=True)
    optimizer.load_state_dict(shard["optimizer"])
    return step, shard["extra"]
"""
BUGS += [
    Bug("manifest_copied_not_renamed", CKPT, (("save_sharded", _SAVE_BODY.replace(
        "WRITE_MANIFEST", "shutil.copy(temporary, manifest)").replace(
        "directory.mkdir(", "import shutil\n    directory.mkdir(")),), frozenset({"4.3.manifest"})),
    Bug("hashes_not_checked", CKPT, (("load_sharded", _LOAD_HEAD + """
    try:
        model.load_state_dict(torch.load(directory / MODEL_FILE, weights_only=True))
    except Exception as exc:
        raise RuntimeError(f"cannot load the model: {exc}") from None
""" + _LOAD_REST),), frozenset({"4.3.refuse", "4.3.refuse_hidden"})),
    Bug("model_loaded_before_checks", CKPT, (("load_sharded", _LOAD_HEAD + """
    try:
        model.load_state_dict(torch.load(directory / MODEL_FILE, weights_only=True))
    except Exception as exc:
        raise CheckpointError(f"{directory / MODEL_FILE}: does not load ({exc})") from None
""" + _VERIFY + _LOAD_REST),), frozenset({"4.3.untouched"})),
    Bug("extra_of_rank_0_only", CKPT, (("load_sharded", _LOAD_HEAD + _VERIFY + """
    model.load_state_dict(torch.load(directory / MODEL_FILE, weights_only=True))
    shard = torch.load(directory / shard_name(rank), weights_only=True)
    optimizer.load_state_dict(shard["optimizer"])
    return step, torch.load(directory / shard_name(0), weights_only=True)["extra"]
"""),), frozenset({"4.3.roundtrip", "4.3.resume", "4.3.roundtrip_hidden"})),
]


def _grade(kit: Path, paths: list[str], work: Path) -> dict:
    return {v.id: v for path in paths for case in CASES[path] for v in run_case(case, kit, work / "runs")}


def _groups() -> list[tuple[Bug, ...]]:
    """Bugs of different files graded together (each case imports one file only): fewer kit copies and spawns."""
    by_file = [[b for b in BUGS if b.path == path] for path in CASES]
    return [tuple(column[k] for column in by_file if k < len(column)) for k in range(max(map(len, by_file)))]


GROUPS = _groups()


@pytest.mark.kit
@pytest.mark.parametrize("group", GROUPS, ids=["+".join(b.name for b in g) for g in GROUPS])
def test_bug_loses_only_its_criteria(group, tmp_path):
    kit = make_variant_kit(tmp_path / "kit", [(b.path, function, body) for b in group for function, body in b.edits])
    verdicts = _grade(kit, [b.path for b in group], tmp_path)
    failed = {cid for cid, v in verdicts.items() if not v.passed}
    assert failed == set().union(*(b.fails for b in group)), {
        cid: v.message[:300] for cid, v in verdicts.items() if not v.passed}


@pytest.mark.kit
def test_starter_loses_every_criterion_as_not_implemented(tmp_path):
    edits = []
    for path in CASES:
        text = (Path(__file__).resolve().parents[2] / path).read_text()
        edits += [(path, region.function, stub_body(region).strip()) for region in parse_regions(text, path)]
    kit = make_variant_kit(tmp_path / "kit", edits)
    verdicts = _grade(kit, list(CASES), tmp_path)
    assert verdicts and all(v.status == "not_implemented" for v in verdicts.values()), {
        cid: (v.status, v.message[:200]) for cid, v in verdicts.items() if v.status != "not_implemented"}
