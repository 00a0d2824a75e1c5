"""Witnesses of the listed equivalent mutants (tests/kit/test_equivalent_mutants.py, docs/mutation-analysis.md).

Staff list a surviving mutant as equivalent in ``grading/problems/*/equivalent_mutants.json`` with one line of
reason. Its witness, here, keyed by the mutant's id, runs the function the mutant changes on inputs at the
boundary of that reason (the value where ``<=`` and ``==`` part, the largest small int the contract allows, one
trainable parameter, rank 0 and rank 1 ...) and returns what the contract makes observable there: return values,
the exception type it names, files written, the state a call leaves. The test runs the witness on the reference
module and on the mutant's module (``Mutant.text`` loaded as a module) and finds the two equal, so a reason that
does not hold fails CI.

A witness is ``observe(module, folder) -> {case: observation}`` (``plain`` data: comparable, picklable), with
``world``: 0 runs it in the test process; ``DISTRIBUTED`` on every rank of a 2-rank gloo group (``rank_main``);
``FAKE_WORLD`` on rank 0 of a 256-rank group of torch's ``fake`` backend (no communication, ``get_world_size()``
says 256), for a boundary that only a world that large reaches. ``prepare(folder)``, when given, writes inputs
the ``observe`` calls share, once, on every rank alike.
"""
from __future__ import annotations

import datetime
import hashlib
import importlib
import json
import shutil
import traceback
import types
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from common.startup import OPTIMIZER_IMPORTS

DISTRIBUTED, FAKE_WORLD = 2, 256       # the world sizes a witness can ask for (0: no process group)
WITNESS_FAILED = "the witness raised"   # an observation that is not one: the witness broke (on the reference: fix it)


@dataclass(frozen=True)
class Witness:
    """How to tell a listed mutant from the reference: ``observe(module, folder)`` at the reason's boundary."""

    observe: Callable[[types.ModuleType, Path], dict]
    world: int = 0                                          # 0, DISTRIBUTED or FAKE_WORLD
    prepare: Callable[[Path], None] | None = None           # shared inputs, written once into ``folder``


def load_module(text: str, name: str) -> types.ModuleType:
    """A module made from the source ``text`` (a student file of the kit, or a mutant of one); never registered in
    ``sys.modules``, so the kit's own modules stay the reference."""
    module = types.ModuleType(name)
    module.__file__ = f"<{name}>"
    exec(compile(text, module.__file__, "exec"), module.__dict__)
    return module


def plain(value: Any) -> Any:
    """``value`` as plain data that compares by what it holds: a tensor as its dtype, shape, values, device and
    ``requires_grad``; a scalar with its type's name (``True`` is not ``1``, ``2.0`` not ``2``); containers in
    their order."""
    if isinstance(value, torch.Tensor):
        data = value.detach().cpu()
        values = data.float().tolist() if data.dtype == torch.bfloat16 else data.tolist()
        return ("tensor", str(data.dtype), tuple(data.shape), repr(values), str(value.device), value.requires_grad)
    if isinstance(value, dict):
        return ("dict", tuple((plain(k), plain(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(plain(v) for v in value))
    if value is None or isinstance(value, (bool, int, str)):
        return (type(value).__name__, value)
    if isinstance(value, float):
        return ("float", repr(value))
    if isinstance(value, (torch.device, torch.dtype)):
        return (type(value).__name__, str(value))
    return ("object", type(value).__name__)


def outcome(call: Callable[[], Any], named: dict[str, str] | None = None) -> tuple:
    """``("returns", plain(value))``, or ``("raises", exception type name, the keys of ``named`` whose text the
    message contains)``: the exception's type and which of the things the contract asks its message to name
    (a file, parameters) it names."""
    try:
        return ("returns", plain(call()))
    except Exception as exc:  # noqa: BLE001 - the observation is which exception, not a failure of the witness
        return ("raises", type(exc).__name__, tuple(k for k, text in (named or {}).items() if text in str(exc)))


# ------------------------------------------------------------------------------------------------------ 2.1
def schedule_bounds(module, folder):
    """``microbatches <= 0`` for ``== 0``: on the boundary -1 / 0 / 1 micro-batches, with 0 to 3 stages."""
    return {(m, n): outcome(lambda m=m, n=n: [list(cycle) for cycle in module.clock_cycles(m, n)])
            for m in (-2, -1, 0, 1, 2) for n in (0, 1, 2, 3)}


# ------------------------------------------------------------------------------------------------------ 2.3
def _tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=8, n_head=2, vocab_size=16, n_positions=8, bos_token_id=0,
                        eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config).eval()


def gpt2_stage_ends(module, folder):
    """First and last stage found by ``k <= 0``, ``k >= n - 1`` and ``insert(-1, ...)``: one device (stage 0 is
    also the last, its list one module long when the embeddings go in), two, and three (more stages than the two
    blocks: one stage holds no block); each stage's modules (which of the model's own it reuses) and the logits
    the stages give."""
    model, tokens = _tiny_gpt2(), torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    names = {id(m): name for name, m in model.named_modules()}
    found = {}
    for n in (1, 2, 3):
        def stages(n=n):
            result = module.gpt2_stages(model, ["cpu"] * n)
            layout = [[(type(part).__name__, tuple(names.get(id(m), "new") for m in part.modules()))
                       for part in stage] for stage in result]
            x = tokens
            with torch.no_grad():
                for stage in result:
                    x = stage(x)
                expected = model(tokens).logits
            return {"stages": layout, "logits": x, "model's logits": torch.equal(x, expected)}
        found[f"{n} devices"] = outcome(stages)
    return found


# ------------------------------------------------------------------------------------------------------ 3.1
def _lora_model():
    torch.manual_seed(0)
    return nn.Sequential(OrderedDict(fc=nn.Linear(3, 4), act=nn.ReLU(), block=nn.Sequential(nn.Linear(4, 4))))


def lora_duplicates(module, folder):
    """``len(set(names)) < len(names)`` for ``!=``: target lists with and without a repeated name (and a repeat
    that is not adjacent); the outcome, the modules and which parameters train afterwards."""
    found = {}
    for targets in (["fc"], ["fc", "block.0"], ("block.0", "fc"), ["fc", "fc"], ["fc", "block.0", "fc"],
                    ["block.0", "block.0", "block.0"]):
        model = _lora_model()
        torch.manual_seed(1)
        result = outcome(lambda: module.apply_lora(model, targets) is model)
        found[repr(targets)] = (result, [(name, type(m).__name__) for name, m in model.named_modules()],
                                {name: (p.requires_grad, plain(p)) for name, p in model.named_parameters()})
    return found


# ------------------------------------------------------------------------------------------------------ 3.2
def _adapter_model(module):
    torch.manual_seed(0)
    return nn.Sequential(module.LoRALinear(nn.Linear(3, 4)), nn.ReLU(), module.LoRALinear(nn.Linear(4, 2)))


ADAPTER_FILES = {           # name -> what the file holds: the exact adapter, then key sets the contract refuses
    "exact": lambda s: s,
    "missing": lambda s: {k: v for k, v in s.items() if k != "2.lora_B"},
    "extra": lambda s: {**s, "2.lora_C": torch.ones(2)},
    "missing and extra": lambda s: {**{k: v for k, v in s.items() if k != "0.lora_A"}, "0.lora_Z": torch.ones(1)},
    "extra int key": lambda s: {**s, 5: torch.ones(1)},
    "int key for a missing one": lambda s: {**{k: v for k, v in s.items() if k != "0.lora_A"}, 0: torch.ones(1)},
    "only extra keys": lambda s: {"x.lora_A": torch.ones(1)},
    "empty": lambda s: {},
    "wrong shape": lambda s: {**s, "2.lora_B": torch.ones(3, 2)},
}


def adapter_key_sets(module, folder):
    """``^`` for ``-`` in the missing / unexpected key lists: an exact file, a missing key, an extra key, both, and
    keys that are not strings; the outcome (ValueError, the contract's) and the adapter values afterwards."""
    found = {}
    for name, make in ADAPTER_FILES.items():
        model = _adapter_model(module)
        torch.manual_seed(2)
        values = {k: torch.randn(v.shape) for k, v in module.adapter_parameters(model).items()}
        path = Path(folder) / f"{name}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(make(values), path)
        before = {k: id(p) for k, p in model.named_parameters()}
        result = outcome(lambda: module.load_adapter(model, path))
        found[name] = (result, {k: (plain(p), id(p) == before[k]) for k, p in model.named_parameters()})
    return found


# ------------------------------------------------------------------------------------------------------ 3.3
def config_precisions(module, folder):
    """``precision <= "bf16"`` for ``== "bf16"``: the three precisions, and refused names that sort before, at and
    just after ``bf16``; the whole config, each value with its type."""
    return {(precision, sizes): outcome(lambda p=precision, s=sizes: module.build_config(*s, p))
            for precision in ("fp32", "fp16", "bf16", "a", "bf", "bf16 ", "BF16", "", "fp8")
            for sizes in ((1, 1, 1), (2, 3, 4))}


# ------------------------------------------------------------------------------------------------------ 4.1
class _Crossed(nn.Module):
    """Registers ``a``, ``b``, ``c`` (and a frozen ``d``) but computes ``b``, then ``a`` twice, then ``c``: backward
    completes ``a``'s buckets before ``b``'s, and ``a``'s hook fires once for its two uses."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c, self.d = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2), nn.Linear(4, 4)
        self.d.requires_grad_(False)

    def forward(self, x: torch.Tensor, skip: str = "") -> torch.Tensor:
        h = self.d(x)
        if "b" not in skip:
            h = torch.tanh(self.b(h))
        if "a" not in skip:
            h = torch.tanh(self.a(torch.tanh(self.a(h))))
        return self.c(h) if "c" not in skip else h[:, :2]


DDP_STEPS = ("", "b", "", "a", "", "c", "")      # per backward, the layers it leaves out ("": every one used)


def ddp_buckets(module, folder):
    """The bucket counters and launch loop (``>=`` for ``==``, ``!=`` for ``<``, no wait before the error): each
    parameter alone in its bucket, a mixed cap and one bucket for all; backward completes the buckets out of index
    order; backward passes that leave a layer out (nothing launched, the first buckets launched, all but the last)
    raise, and the passes after them must average as before. Per step: the buckets, then each gradient after
    ``finish_gradient_synchronization`` or the error (its type and the parameters its message names)."""
    rank = dist.get_rank()
    found = {}
    for cap in (1e-9, 40 * 4 / 2 ** 20, 25.0):
        torch.manual_seed(10 + rank)               # each rank its own weights: construction broadcasts rank 0's
        model = _Crossed()
        ddp = module.BucketedDDP(model, bucket_mb=cap)
        names = {name: repr(name) for name, _ in model.named_parameters()}
        steps = [("buckets", plain(ddp.buckets)), ("weights", plain(model.state_dict()))]
        for k, skip in enumerate(DDP_STEPS):
            torch.manual_seed(100 * k + rank)
            model.zero_grad(set_to_none=True)

            def step(ddp=ddp, skip=skip):
                ddp(torch.randn(3, 4), skip).square().sum().backward()
                ddp.finish_gradient_synchronization()
            result = outcome(step, names)
            grads = {name: plain(p.grad) for name, p in model.named_parameters()} if result[0] == "returns" else {}
            steps.append((skip, result, grads))
        found[f"bucket_mb={cap:g}"] = steps
    return found


# ------------------------------------------------------------------------------------------------------ 4.2
def zero1_first_parameter(module, folder):
    """``self.params[-1]`` for ``[0]``: one trainable parameter (alone, and between frozen ones: then index -1 and
    index 0 are the same parameter), several of unequal sizes, a bf16 one; the master shard, then the model and the
    inner state after a step with per-rank gradients (one None)."""
    rank = dist.get_rank()
    layouts = {"one parameter": [(3,)], "one trainable between frozen": [(2, 2), (3,), (4,)],
               "several": [(4, 3), (4,), (1, 4), (1,)], "bf16": [(5,)]}
    frozen = {"one trainable between frozen": (0, 2)}
    found = {}
    for name, shapes in layouts.items():
        torch.manual_seed(0)
        dtype = torch.bfloat16 if name == "bf16" else torch.float32
        params = [nn.Parameter(torch.randn(s, dtype=dtype)) for s in shapes]
        for k in frozen.get(name, ()):
            params[k].requires_grad_(False)
        opt = module.ShardedOptimizer(params, lr=0.1)
        state = [plain(opt.master), opt.shard_numel, opt.numel, opt.state_bytes()]
        torch.manual_seed(50 + rank)
        for k, p in enumerate(params):
            p.grad = torch.randn(p.shape, dtype=dtype) if p.requires_grad and k != 2 else None
        result = outcome(opt.step)
        found[name] = (state, result, plain(params), plain(opt.master), plain(opt.optimizer.state_dict()))
    return found


# ------------------------------------------------------------------------------------------------------ 4.3
def _ckpt_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))


def _ckpt_optimizer(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    optimizer.step()
    return optimizer


def _digest(path: Path) -> dict:
    data = Path(path).read_bytes()
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def _shard_name(rank: int) -> str:
    return f"shard_{rank:05d}.pt"


def write_checkpoint(folder: Path, world_size: int, *, manifest: dict | None = None, model_state: Any = None,
                     shard: dict | None = None) -> None:
    """A checkpoint as the contract lays it out, written by this process alone (rank 0 of any world): step 7,
    ``model.pt``, one shard per rank (``extra`` names its rank), a manifest listing their digests. ``model_state``
    replaces model.pt's content, ``shard`` the items of rank 0's shard (a value None removes the key, a non-dict
    replaces the shard), ``manifest`` the manifest's items (after the digests are taken)."""
    folder.mkdir(parents=True, exist_ok=True)
    model = _ckpt_model()
    optimizer_state = _ckpt_optimizer(model).state_dict()
    torch.save(model.state_dict() if model_state is None else model_state, folder / "model.pt")
    for rank in range(world_size):
        content: Any = {"step": 7, "rank": rank, "world_size": world_size, "optimizer": optimizer_state,
                        "extra": {"rank": rank, "data": [1, 2]}}
        if rank == 0 and shard is not None:
            content = ({k: v for k, v in {**content, **shard}.items() if v is not None}
                       if isinstance(shard, dict) else shard)
        if rank > 1:          # a rank beyond 1 exists only in the fake world: rank 0 reads nothing but its digest
            shutil.copyfile(folder / _shard_name(1), folder / _shard_name(rank))
        else:
            torch.save(content, folder / _shard_name(rank))
    files = {name: _digest(folder / name) for name in ["model.pt", *map(_shard_name, range(world_size))]}
    text = {"format": 1, "step": 7, "world_size": world_size, "files": files, **(manifest or {})}
    (folder / "manifest.json").write_text(json.dumps(text))


def _model_state(change: Callable[[dict], dict]) -> dict:
    return change(dict(_ckpt_model().state_dict()))


LOAD_CASES = {             # witness -> case -> write_checkpoint's keyword arguments (world size: the group's)
    "format": {f"format {v!r}": {"manifest": {"format": v}} for v in (1, 0, 2, -1, -5, 255, 256, 257, 2 ** 70)},
    "types": {"valid": {}, **{f"{key} {v!r}": {"manifest": {key: v}} for key in ("format", "step", "world_size")
                              for v in (True, False, 1.0, 2.0, "1", None, [1])}},
    "world": {f"world_size {v}": {"manifest": {"world_size": v}} for v in (255, 256, 257)},    # in FAKE_WORLD
    "shard keys": {
        "valid": {},
        "only optimizer and extra": {"shard": {"step": None, "rank": None, "world_size": None}},
        "optimizer, extra, step": {"shard": {"rank": None, "world_size": None}},
        "no extra": {"shard": {"extra": None}},
        "no optimizer": {"shard": {"optimizer": None}},
        "one key more": {"shard": {"note": "x"}},
        "a list": {"shard": ["optimizer", "extra"]},
    },
    "model keys": {
        "exact": {},
        "missing": {"model_state": lambda s: {k: v for k, v in s.items() if k != "1.bias"}},
        "extra": {"model_state": lambda s: {**s, "2.weight": torch.ones(1)}},
        "missing and extra": {"model_state": lambda s: {**{k: v for k, v in s.items() if k != "0.bias"},
                                                        "0.bias_": torch.ones(4)}},
        "extra int key": {"model_state": lambda s: {**s, 3: torch.ones(1)}},
        "int key for a missing one": {"model_state": lambda s: {**{k: v for k, v in s.items() if k != "0.bias"},
                                                                0: torch.ones(4)}},
        "empty": {"model_state": lambda s: {}},
        "a list": {"model_state": lambda s: [1, 2]},
    },
    "model shapes": {
        "exact": {},
        "bigger": {"model_state": lambda s: {**s, "0.weight": torch.ones(5, 3)}},
        "smaller": {"model_state": lambda s: {**s, "0.weight": torch.ones(4, 2)}},
        "transposed": {"model_state": lambda s: {**s, "0.weight": torch.ones(3, 4)}},
        "one dim more": {"model_state": lambda s: {**s, "0.bias": torch.ones(4, 1)}},
        "a scalar": {"model_state": lambda s: {**s, "1.bias": torch.tensor(1.0)}},
        "not a tensor": {"model_state": lambda s: {**s, "1.bias": 3}},
        "bigger and smaller": {"model_state": lambda s: {**s, "0.weight": torch.ones(5, 3),
                                                         "1.weight": torch.ones(1, 4)}},
        "shape and missing key": {"model_state": lambda s: {**{k: v for k, v in s.items() if k != "1.bias"},
                                                            "0.weight": torch.ones(5, 3)}},
        "shape and extra key": {"model_state": lambda s: {**s, "0.weight": torch.ones(5, 3), "2.x": torch.ones(1),
                                                          7: torch.ones(1)}},
    },
}


LOAD_FAULT = {"format": "manifest.json", "types": "manifest.json", "world": "manifest.json",   # the file a refusal
              "shard keys": None, "model keys": "model.pt", "model shapes": "model.pt"}       # names (None: the rank's)


def _prepare_load(cases: str) -> Callable[[Path], None]:
    def prepare(folder: Path) -> None:
        if dist.get_rank() == 0:
            for case, kwargs in LOAD_CASES[cases].items():
                kwargs = dict(kwargs)
                if callable(kwargs.get("model_state")):
                    kwargs["model_state"] = _model_state(kwargs["model_state"])
                write_checkpoint(folder / case, dist.get_world_size(), **kwargs)
        dist.barrier()
    return prepare


def _load_observer(cases: str) -> Callable[[types.ModuleType, Path], dict]:
    def observe(module, folder):
        """``load_sharded`` on each prepared checkpoint of its cases (``LOAD_CASES``): the outcome (the returned
        step and extra, or CheckpointError and whether its message names the file at fault, ``LOAD_FAULT``: the
        contract asks no more of the message) and the model and optimizer after."""
        found = {}
        for case in LOAD_CASES[cases]:
            where = folder / case
            at_fault = LOAD_FAULT[cases] or _shard_name(dist.get_rank())
            named = {f"names {at_fault}": str(where / at_fault)}
            model = _ckpt_model()
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(-1)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            result = outcome(lambda: module.load_sharded(where, model, optimizer), named)
            found[case] = (result, plain(model.state_dict()), plain(optimizer.state_dict()))
        return found
    observe.__name__ = f"load_{cases.replace(' ', '_')}"
    return observe


def save_files(module, folder):
    """``rank <= 0`` for ``rank == 0`` and the manifest's indent: both ranks save twice into one folder (the second
    save replaces the first's manifest; the folder also holds an earlier save's shard of a third rank), and each
    rank reads back what the folder holds: the returned path, the file names, every ``.pt`` file's content, the
    manifest's JSON, and what ``load_sharded`` of the reference makes of it."""
    rank = dist.get_rank()
    where = folder / "checkpoint"
    if rank == 0:
        where.mkdir(parents=True, exist_ok=True)
        torch.save({"step": 1}, where / _shard_name(2))     # an earlier save's: whether it stays is free
    dist.barrier()
    found = {}
    for step in (3, 4):
        model = _ckpt_model()
        optimizer = _ckpt_optimizer(model)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(step + rank)                 # only rank 0's model is written

        def save(model=model, optimizer=optimizer, step=step):
            path = module.save_sharded(where, step, model, optimizer, {"rank": rank, "step": step})
            return type(path).__name__, path == where / "manifest.json"
        result = outcome(save)
        listing = sorted(p.name for p in where.iterdir() if p.name != _shard_name(2))
        content = {p: plain(torch.load(where / p, weights_only=True)) for p in listing if p.endswith(".pt")}
        manifest = json.loads((where / "manifest.json").read_text()) if (where / "manifest.json").exists() else None
        fresh = _ckpt_model()
        fresh_optimizer = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
        loaded = outcome(lambda: module.load_sharded(where, fresh, fresh_optimizer))
        found[f"step {step}"] = (result, listing, content, plain(manifest), loaded, plain(fresh.state_dict()),
                                 plain(fresh_optimizer.state_dict()))
        dist.barrier()
    return found


# ------------------------------------------------------------------------------------------------------ 5.1
def column_bias_rows(module, folder):
    """``index_select(-1, ...)`` on the bias: one-dimensional biases of float32 and float64 layers, chunks 1 to 3,
    no bias, a frozen layer, refused chunk counts; each rank's shard, and the layer after the shard is changed in
    place."""
    found = {}
    for dtype in (torch.float32, torch.float64):
        for chunks in (1, 2, 3, 5, 0):
            for bias in (True, False):
                torch.manual_seed(0)
                linear = nn.Linear(4, 12, bias=bias).to(dtype)
                if chunks == 2:
                    linear.requires_grad_(False)
                before = plain(linear.state_dict())

                def shard(linear=linear, chunks=chunks):
                    layer = module.ColumnParallelLinear.from_linear(linear, chunks=chunks)
                    seen = [plain(layer.weight), plain(layer.bias)]
                    with torch.no_grad():
                        for p in layer.parameters():
                            p.add_(1)
                    return seen
                found[(str(dtype), chunks, bias)] = (outcome(shard), plain(linear.state_dict()) == before)
    return found


# ------------------------------------------------------------------------------------------------------ the list
_SCHEDULE = Witness(schedule_bounds)
_STAGES = Witness(gpt2_stage_ends)
_LORA = Witness(lora_duplicates)
_ADAPTER = Witness(adapter_key_sets)
_CONFIG = Witness(config_precisions)
_DDP = Witness(ddp_buckets, DISTRIBUTED)
_ZERO1 = Witness(zero1_first_parameter, DISTRIBUTED)
_SAVE = Witness(save_files, DISTRIBUTED)
_LOADS = {cases: Witness(_load_observer(cases), FAKE_WORLD if cases == "world" else DISTRIBUTED, _prepare_load(cases))
          for cases in LOAD_CASES}
_COLUMN = Witness(column_bias_rows, DISTRIBUTED)
_NOT_EQUAL = ("Eq", "Lt", "LtE", "Gt", "GtE", "Is", "IsNot")

WITNESSES: dict[str, Witness] = {
    "2.1/clock_cycles/ReplaceComparisonOperator_Eq_LtE/0": _SCHEDULE,
    "2.3/gpt2_stages/ReplaceComparisonOperator_Eq_LtE/0": _STAGES,
    "2.3/gpt2_stages/ReplaceComparisonOperator_Eq_GtE/1": _STAGES,
    "2.3/gpt2_stages/NumberReplacer/9": _STAGES,
    "3.1/apply_lora/ReplaceComparisonOperator_NotEq_Lt/0": _LORA,
    "3.2/load_adapter/ReplaceBinaryOperator_Sub_BitXor/0": _ADAPTER,
    "3.2/load_adapter/ReplaceBinaryOperator_Sub_BitXor/1": _ADAPTER,
    "3.3/build_config/ReplaceComparisonOperator_Eq_LtE/1": _CONFIG,
    "4.1/_grad_ready/ReplaceComparisonOperator_Eq_GtE/0": _DDP,
    "4.1/_grad_ready/ReplaceComparisonOperator_Lt_NotEq/0": _DDP,
    "4.1/finish_gradient_synchronization/ReplaceComparisonOperator_Lt_NotEq/0": _DDP,
    "4.1/finish_gradient_synchronization/ZeroIterationForLoop/0": _DDP,
    "4.2/__init__/NumberReplacer/1": _ZERO1,
    **{f"4.3/load_sharded/ReplaceBinaryOperator_Sub_{op}/{k}": _LOADS["model keys"]
       for op in ("BitOr", "BitAnd", "BitXor") for k in (0, 1)},
    **{f"4.3/save_sharded/ReplaceComparisonOperator_Eq_LtE/{k}": _SAVE for k in (0, 1, 2)},
    **{f"4.3/load_sharded/ReplaceComparisonOperator_NotEq_{op}/5": _LOADS["model shapes"] for op in _NOT_EQUAL},
    "4.3/load_sharded/ReplaceComparisonOperator_NotEq_IsNot/0": _LOADS["format"],
    "4.3/load_sharded/ReplaceComparisonOperator_NotEq_IsNot/1": _LOADS["world"],
    "4.3/load_sharded/ReplaceComparisonOperator_LtE_Lt/0": _LOADS["shard keys"],
    "4.3/load_sharded/ReplaceComparisonOperator_Is_Eq/0": _LOADS["types"],
    "4.3/save_sharded/NumberReplacer/6": _SAVE,
    "4.3/save_sharded/NumberReplacer/7": _SAVE,
    "5.1/from_linear/NumberReplacer/7": _COLUMN,
}


def observe_pairs(jobs: list[tuple[str, str, str]], references: dict[str, str], world: int, folder: Path) -> dict:
    """For each ``(id, path, mutant text)`` of ``jobs`` whose witness runs in a world of ``world``: ``(reference's
    observation, mutant's)``, each witness run once on the reference (``references``: path -> text) and once per
    mutant, in ``jobs``' order (the same on every rank, so their collectives pair). ``folder``: scratch space, one
    sub-folder per witness (its shared inputs) and per run."""
    modules = {path: load_module(text, f"reference_{k}") for k, (path, text) in enumerate(sorted(references.items()))}
    observed: dict[int, Any] = {}
    found = {}
    for n, (mutant_id, path, text) in enumerate(jobs):
        witness = WITNESSES[mutant_id]
        if witness.world != world:
            continue
        space = Path(folder) / witness.observe.__name__
        if id(witness) not in observed:
            if witness.prepare is not None:
                witness.prepare(space / "inputs")
            observed[id(witness)] = _observe(witness, lambda: modules[path],
                                             space / ("inputs" if witness.prepare else "reference"))
        mutant = _observe(witness, lambda: load_module(text, f"mutant_{n}"),
                          space / ("inputs" if witness.prepare else f"mutant{n}"))
        found[mutant_id] = (observed[id(witness)], mutant)
    return found


def _observe(witness: Witness, module: Callable[[], types.ModuleType], folder: Path) -> Any:
    """``witness.observe`` of the module ``module()`` makes, or ``(WITNESS_FAILED, the traceback's end)`` when
    making it or observing it raised where no ``outcome`` caught it."""
    try:
        return witness.observe(module(), folder)
    except Exception:  # noqa: BLE001 - reported by the test: on the reference a broken witness, else a difference
        return (WITNESS_FAILED, traceback.format_exc(limit=-4))


def rank_main(env, folder: str) -> dict:
    """A rank of the witnesses' 2-rank group (``project.launch.spawn_ranks``): imports what an optimizer needs and
    joins a gloo group over the file store of ``env`` while the parent makes the mutants, then receives ``(jobs,
    references)`` over ``env.conn`` (``observe_pairs``' arguments) and runs every ``DISTRIBUTED`` witness; then rank
    0 joins a ``FAKE_WORLD``-rank group of torch's ``fake`` backend for the ``FAKE_WORLD`` witnesses. Returns
    ``{id: (reference's observation, mutant's)}``."""
    for name in OPTIMIZER_IMPORTS:
        importlib.import_module(name)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=env.init_method, rank=env.rank, world_size=env.world_size,
                            timeout=datetime.timedelta(seconds=60))
    try:
        jobs, references = env.conn.recv()
        found = observe_pairs(jobs, references, DISTRIBUTED, Path(folder) / "gloo")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if env.rank == 0 and any(WITNESSES[job[0]].world == FAKE_WORLD for job in jobs):
        dist.init_process_group("fake", rank=0, world_size=FAKE_WORLD)
        try:
            found.update(observe_pairs(jobs, references, FAKE_WORLD, Path(folder) / "fake"))
        finally:
            dist.destroy_process_group()
    return found


def first_difference(reference: Any, mutant: Any) -> str:
    """Where two observations first differ, in words: the case (and the place inside it), then both values there."""
    path: list[str] = []
    while type(reference) is type(mutant) and reference != mutant:
        if isinstance(reference, dict):
            key = next((k for k in reference if k not in mutant or reference[k] != mutant[k]), None)
            if key is None:
                break
            path.append(repr(key))
            reference, mutant = reference[key], mutant.get(key, "nothing")
        elif isinstance(reference, (tuple, list)) and len(reference) == len(mutant):
            k = next(k for k, (a, b) in enumerate(zip(reference, mutant)) if a != b)
            path.append(f"[{k}]")
            reference, mutant = reference[k], mutant[k]
        else:
            break
    return f"at {' '.join(path) or 'the top'}: reference {_short(reference)}, mutant {_short(mutant)}"


def _short(value: Any, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + " ..."
