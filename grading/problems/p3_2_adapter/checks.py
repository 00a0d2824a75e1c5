"""Problem 3.2 checks: ``save_adapter`` and ``load_adapter``.

The probe wraps the grader's model with the provided ``LoRALinear`` itself (``lora_model`` of
``p3_1_lora/reference.py``; so 3.2 does not depend on the student's ``apply_lora``), sets known adapter values,
and records what the student's functions write and load. The criteria compare with those values
(``adapter_state``, same module); nothing is stored as expected data.
"""
from __future__ import annotations

import itertools
import tempfile
from dataclasses import dataclass
from pathlib import Path

from grading.check import SplitRun, SubProblem, assert_state_close, assert_tensor_close, describe, expect
from grading.problems.probe_helpers import CodeOnLoad, call_outcome, expect_refusals, labelled
from grading.problems.p3_1_lora import reference as ref
from grading.problems.p3_2_adapter import ID, TITLE


@dataclass(frozen=True)
class Inputs:
    """The split-dependent save: LoRA at ``targets`` (names in ``LoRANet``) of ``rank``, adapters of ``seed``."""

    targets: tuple[str, ...]
    rank: int
    seed: int                    # ref.adapter_state(seed, targets, rank): the values the model holds


BARE_KEYS = ("lora_A", "lora_B")    # save_adapter's keys for a model that is itself a LoRALinear
SAVED_SEED, OTHER_SEED = 1, 2    # the grader's file holds adapter_state(1); models load it over adapter_state(2)

PROBLEM = SubProblem(ID, TITLE, __package__,
                     inputs=Inputs(targets=tuple(ref.ADAPTER_TARGETS), rank=ref.RANK, seed=SAVED_SEED))

P_SAVE = "save"    # a split part: recorded once per split
P_SAVE_SHARED = "save_shared"    # save_adapter on a model whose parameters are views of one buffer: storage bytes
P_RESTORE = "restore"
P_IN_PLACE = "in_place"
P_REJECTS = "rejects"
P_CODE_ON_LOAD = "code_on_load"    # load_adapter on a file whose pickle runs code: did the code run?


# ---------------------------------------------------------------- probe
def _kit_lora_model(device, adapters: dict, targets=ref.ADAPTER_TARGETS, rank: int = ref.RANK):
    """``ref.lora_model`` with the kit's provided ``LoRALinear`` (child side: imports ``finetune.lora``)."""
    from finetune.lora import LoRALinear
    return ref.lora_model(LoRALinear, adapters, targets, rank, device)


def _snapshot(model) -> dict:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _changed(model, before: dict) -> list[str]:
    import torch
    return sorted(n for n, p in model.named_parameters() if n not in before or not torch.equal(p.detach(), before[n]))


def _saved_file(save_adapter, device, folder: Path, saves, inputs: Inputs) -> dict:
    """save_adapter on a LoRA model holding the split's adapter values: the file's values and their type, device and
    requires_grad, the parameters the save changed, and a save of a bare LoRALinear (``_bare_save``)."""
    import torch

    adapters = ref.adapter_state(inputs.seed, list(inputs.targets), inputs.rank)
    model = _kit_lora_model(device, adapters, inputs.targets, inputs.rank)
    before = _snapshot(model)
    path = folder / f"student_{next(saves)}.pt"       # a file of its own for each split
    labelled("save_adapter(model, path)", save_adapter, model, path)
    loaded = torch.load(path, map_location=None, weights_only=True)
    meta = ({k: [type(v).__name__, str(v.device) if isinstance(v, torch.Tensor) else "",
                 bool(getattr(v, "requires_grad", False))] for k, v in loaded.items()}
            if isinstance(loaded, dict) else {})
    values = ({k: v.detach().cpu().clone() if isinstance(v, torch.Tensor) else describe(v)
               for k, v in loaded.items()} if isinstance(loaded, dict) else describe(loaded))
    return {"values": values, "meta": meta, "model_changed": _changed(model, before),
            "bare": _bare_save(save_adapter, device, folder, saves, inputs)}


def _bare_save(save_adapter, device, folder: Path, saves, inputs: Inputs) -> dict:
    """save_adapter on a model that is itself a LoRALinear: its adapters are named lora_A and lora_B, no
    dot; the file's keys and whether each value equals the parameter's."""
    import torch

    from finetune.lora import LoRALinear
    with torch.random.fork_rng(devices=[]):        # the global generator as it was afterwards
        torch.manual_seed(inputs.seed)
        bare = LoRALinear(torch.nn.Linear(ref.HIDDEN, ref.OUT_FEATURES), inputs.rank).to(device)
        with torch.no_grad():
            bare.lora_B.normal_()           # both adapters nonzero: a zero lora_B tells nothing
    path = folder / f"student_{next(saves)}.pt"
    labelled("save_adapter(LoRALinear(...), path)", save_adapter, bare, path)
    loaded = torch.load(path, map_location=None, weights_only=True)
    if not isinstance(loaded, dict):
        return {"keys": describe(loaded), "differ": []}
    params = dict(bare.named_parameters())
    return {"keys": sorted(str(k) for k in loaded),
            "differ": sorted(k for k, v in loaded.items() if k in params and not (
                isinstance(v, torch.Tensor) and torch.equal(v.cpu(), params[k].detach().cpu())))}


def _shared_storage_save(save_adapter, folder: Path, saved: dict) -> dict:
    """save_adapter on a CPU model whose parameters are views of one buffer (vector_to_parameters, so on every
    machine): for each saved tensor, the bytes of the storage torch.save wrote for it and its own bytes."""
    import torch

    model = _kit_lora_model("cpu", saved)
    params = list(model.parameters())
    torch.nn.utils.vector_to_parameters(torch.nn.utils.parameters_to_vector(params), params)
    path = folder / "student_shared.pt"
    labelled("save_adapter(model whose parameters share one buffer, path)", save_adapter, model, path)
    loaded = torch.load(path, map_location="cpu", weights_only=True)
    return {k: [v.untyped_storage().nbytes(), v.numel() * v.element_size()] for k, v in loaded.items()
            if isinstance(v, torch.Tensor)} if isinstance(loaded, dict) else {}


def _restored(load_adapter, device, grader_file: Path, saved: dict, other: dict, x) -> dict:
    """load_adapter of the grader's file (adapters ``saved``) into a model holding ``other``: the outputs on ``x``
    of a model holding ``saved`` and of the loaded one, and the loaded one's parameters."""
    import torch

    source = _kit_lora_model(device, saved)
    model = _kit_lora_model(device, other)
    with torch.no_grad():
        want = source(x).cpu()
    labelled("load_adapter(model, path)", load_adapter, model, grader_file)
    with torch.no_grad():
        got = model(x).cpu()
    return {"source_out": want, "loaded_out": got, "params": {n: t.cpu() for n, t in _snapshot(model).items()}}


def _loaded_in_place(load_adapter, device, folder: Path, grader_file: Path, saved: dict, other: dict) -> dict:
    """load_adapter of the grader's file: the parameter objects it replaced and the adapters it left frozen; then of
    a float64 copy into a float32 model: the adapters' dtypes afterwards."""
    import torch

    model = _kit_lora_model(device, other)
    objects = dict(model.named_parameters())
    labelled("load_adapter(model, path)", load_adapter, model, grader_file)
    now = dict(model.named_parameters())
    double_file = folder / "float64.pt"
    torch.save({k: v.double() for k, v in saved.items()}, double_file)
    cast = _kit_lora_model(device, other)
    labelled("load_adapter(float32 model, float64 file)", load_adapter, cast, double_file)
    return {
        "replaced": sorted(n for n, p in objects.items() if now.get(n) is not p),
        "not_trainable": sorted(n for n, p in now.items() if n in saved and not p.requires_grad),
        "dtypes": sorted({str(p.dtype) for n, p in cast.named_parameters() if n in saved}),
    }


def _rejections(load_adapter, device, folder: Path, saved: dict, other: dict) -> list[dict]:
    """load_adapter of each bad file (empty, extra, missing, mis-shaped, not a tensor, int keys): how it ended and
    the parameters it changed."""
    import torch

    bad = {
        "an empty dict": {},
        "a list of tensors instead of a dict": list(saved.values()),
        "an extra key (a base weight)": {**saved, "head.base.weight": torch.zeros(ref.OUT_FEATURES, ref.HIDDEN)},
        "an extra key (lora_A of a layer without LoRA)": {**saved, "blocks.0.fc.lora_A": torch.zeros(2, 8)},
        "a missing key (head.lora_B)": {k: v for k, v in saved.items() if k != "head.lora_B"},
        "a mis-shaped last entry (head.lora_B)": {**saved, "head.lora_B": torch.zeros(ref.OUT_FEATURES, 3)},
        "a mis-shaped entry that would broadcast (head.lora_B, one row)": {**saved,
                                                                         "head.lora_B": saved["head.lora_B"][:1]},
        "a value that is not a tensor (head.lora_B: 0)": {**saved, "head.lora_B": 0},
        # int keys: a file's keys need not be str (sorting them with str keys raises TypeError)
        "an int key (0) beside every adapter key": {**saved, 0: saved["head.lora_B"]},
        "an int key (0) in place of a missing key (head.lora_B)": {
            **{k: v for k, v in saved.items() if k != "head.lora_B"}, 0: saved["head.lora_B"]},
        "extra keys of two types (0 and head.base.weight)": {
            **saved, 0: saved["head.lora_B"], "head.base.weight": torch.zeros(ref.OUT_FEATURES, ref.HIDDEN)},
    }
    results = []
    for label, state in bad.items():
        path = folder / f"bad_{len(results)}.pt"
        torch.save(state, path)
        model = _kit_lora_model(device, other)
        before = _snapshot(model)
        outcome = call_outcome(lambda: load_adapter(model, path))
        results.append({"label": label, "outcome": outcome, "changed": _changed(model, before)})
    return results


def _code_on_load(load_adapter, device, folder: Path, other: dict) -> dict:
    """load_adapter of a file whose pickle runs code: how it ended, whether the code ran, the parameters changed."""
    import torch

    marker, path = folder / "the_file_ran_code", folder / "runs_code.pt"
    torch.save(CodeOnLoad(str(marker)), path)
    model = _kit_lora_model(device, other)
    before = _snapshot(model)
    outcome = call_outcome(lambda: load_adapter(model, path))
    return {"outcome": outcome, "ran": marker.exists(), "changed": _changed(model, before)}


def probe_adapter_io(ctx) -> None:
    """save_adapter/load_adapter on grader-built LoRA models and grader-written files."""
    import torch

    from finetune.lora import load_adapter, save_adapter
    device = ctx.device
    folder = Path(tempfile.mkdtemp(prefix="p3_adapters_", dir=ctx.out_dir))
    saved, other = ref.adapter_state(SAVED_SEED), ref.adapter_state(OTHER_SEED)
    grader_file = folder / "grader.pt"
    torch.save(saved, grader_file)
    x = ref.inputs(1).to(device)
    saves = itertools.count()        # numbers the student's files: one of their own for each save

    PROBLEM.each_split(ctx, lambda inputs: ctx.record(P_SAVE, lambda: _saved_file(save_adapter, device, folder, saves,
                                                                                  inputs)))
    ctx.record(P_SAVE_SHARED, lambda: _shared_storage_save(save_adapter, folder, saved))
    ctx.record(P_RESTORE, lambda: _restored(load_adapter, device, grader_file, saved, other, x))
    ctx.record(P_IN_PLACE, lambda: _loaded_in_place(load_adapter, device, folder, grader_file, saved, other))
    ctx.record(P_REJECTS, lambda: _rejections(load_adapter, device, folder, saved, other))
    ctx.record(P_CODE_ON_LOAD, lambda: _code_on_load(load_adapter, device, folder, other))


CASE = PROBLEM.case("p3_adapter_io", probe_adapter_io, world_size=1, init_group=False, timeout_s=60,
                    split_parts=(P_SAVE,))


# ---------------------------------------------------------------- criteria
@CASE.criterion("3.2.save_contents", "only lora_A/lora_B saved (no shared buffer), CPU, detached, weights_only "
                "loadable", points=3, reads=(P_SAVE, P_SAVE_SHARED))
def check_save(run: SplitRun) -> None:
    inputs = run.inputs
    got = run.part(P_SAVE)
    expected = ref.adapter_state(inputs.seed, list(inputs.targets), inputs.rank)
    values = got["values"]
    expect(isinstance(values, dict), f"save_adapter: the file holds {values}, expected a dict name -> tensor")
    extra, missing = sorted(set(values) - set(expected)), sorted(set(expected) - set(values))
    expect(not extra, f"save_adapter: the file holds {extra}, which are not lora_A/lora_B parameters "
           "(save only the adapters)")
    expect(not missing, f"save_adapter: the file lacks {missing} (keys are the names model.named_parameters() "
           "gives)")
    for name, (kind, device, requires_grad) in got["meta"].items():
        expect(device == "cpu", f"save_adapter: '{name}' was saved on {device}, expected a CPU copy")
        expect(not requires_grad, f"save_adapter: '{name}' was saved as a {kind} that requires grad; save "
               "detached tensors")
    assert_state_close("save_adapter: saved value", values, expected, atol=0.0, rtol=0.0)
    expect(not got["model_changed"], f"save_adapter changed the model's parameters {got['model_changed']}")
    bare, want = got["bare"], list(BARE_KEYS)
    expect(bare["keys"] == want, f"save_adapter on a model that is itself a LoRALinear: the file holds "
           f"{bare['keys']}, expected the keys {want} (named_parameters() names them without a dot: save every "
           "parameter whose name is lora_A or lora_B or ends in .lora_A or .lora_B)")
    expect(not bare["differ"], f"save_adapter on a model that is itself a LoRALinear: saved {bare['differ']} "
           "differ from the model's values")
    for name, (stored, own) in run.part(P_SAVE_SHARED).items():
        expect(stored == own, "save_adapter on a model whose parameters are views of one buffer "
               f"(torch.nn.utils.vector_to_parameters): '{name}' was saved with a storage of {stored} bytes, its "
               f"own values are {own} bytes: torch.save writes a tensor's whole storage, here the base weights "
               "too; save a copy of each adapter (.to('cpu', copy=True) or .clone())")


@CASE.criterion("3.2.load_restores", "loading restores outputs exactly; base weights unchanged", points=2,
                reads=(P_RESTORE,))
def check_restore(run: SplitRun) -> None:
    got = run.part(P_RESTORE)
    assert_tensor_close("load_adapter: outputs after loading the adapter of another model (must equal that "
                        "model's outputs)", got["loaded_out"], got["source_out"], atol=0.0, rtol=0.0)
    expected = {**ref.wrapped_base_state(0), **ref.adapter_state(SAVED_SEED)}
    assert_state_close("load_adapter: parameter after loading", got["params"], expected, atol=0.0, rtol=0.0)


@CASE.criterion("3.2.load_in_place", "parameter objects stay registered (copied in place)", points=2,
                reads=(P_IN_PLACE,))
def check_in_place(run: SplitRun) -> None:
    got = run.part(P_IN_PLACE)
    expect(not got["replaced"], f"load_adapter replaced the Parameter objects {got['replaced']}; copy into the "
           "existing parameters (param.copy_ under torch.no_grad()) so optimizers keep working")
    expect(not got["not_trainable"], f"load_adapter left {got['not_trainable']} with requires_grad=False")
    expect(got["dtypes"] == ["torch.float32"], f"load_adapter of a float64 file into a float32 model left adapters "
           f"of dtype {got['dtypes']}: copy the values into the parameters (param.copy_), which casts them")


@CASE.criterion("3.2.load_rejects", "empty/extra/missing/mis-shaped/non-tensor/int-key files: ValueError before any "
                "change; a file that runs code is refused unrun", points=3, reads=(P_REJECTS, P_CODE_ON_LOAD))
def check_rejects(run: SplitRun) -> None:
    expect_refusals(run.part(P_REJECTS), "load_adapter on a file with",
                    {"changed": "check the whole file before copying anything"})
    unsafe, label = run.part(P_CODE_ON_LOAD), "load_adapter on a file whose pickle runs code when loaded"
    expect(not unsafe["ran"], f"{label}: the code ran (the file was unpickled with weights_only=False); open it "
           "with torch.load(path, map_location='cpu', weights_only=True), which refuses anything but tensors and "
           "plain containers")
    expect(unsafe["outcome"] != "no exception" and not unsafe["changed"], f"{label}: expected an error and the "
           f"model untouched, got {unsafe['outcome']} (changed: {unsafe['changed'][:4]})")

