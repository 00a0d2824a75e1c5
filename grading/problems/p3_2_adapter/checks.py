"""Problem 3.2 checks: ``save_adapter`` and ``load_adapter``.

The probe wraps the grader's model with the provided ``LoRALinear`` itself
(so 3.2 does not depend on the student's ``apply_lora``), sets known adapter
values, and records what the student's functions write and load; the
criteria compare with those values (``grading.problems.p3_1_lora.reference``),
and on the staff side with hidden targets, rank and values.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from grading.kit import data
from grading.problems.common import call_outcome, expect_refusals, labelled
from grading.engine.compare import assert_state_close, assert_tensor_close, describe
from grading.engine.expect import expect
from grading.problems.p3_1_lora import reference as ref
from grading.engine.rubric import HIDDEN, PUBLIC, Case, split_part

P_RESTORE = "restore"
P_IN_PLACE = "in_place"
P_REJECTS = "rejects"


P_SAVE = "save"    # recorded per split: split_part(P_SAVE, split)


# ---------------------------------------------------------------- probe
def grader_lora_model(device, adapters: dict, layer=None, targets: list[str] = ref.ADAPTER_TARGETS,
                      rank: int = ref.RANK):
    """``LoRANet(0)`` with ``layer`` (default: the kit's provided ``LoRALinear``) at ``targets``, adapters set to
    ``adapters`` (the grader wraps the layers itself: 3.2 and 3.3 do not depend on the student's apply_lora)."""
    import torch

    if layer is None:
        from finetune.lora import LoRALinear as layer
    model = ref.LoRANet(0)
    for name in targets:
        parent, _, child = name.rpartition(".")
        holder = model.get_submodule(parent)
        setattr(holder, child, layer(getattr(holder, child), rank, ref.ALPHA))
    model.to(device)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in adapters:
                param.copy_(adapters[name])
    return model


def _snapshot(model) -> dict:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _changed(model, before: dict) -> list[str]:
    import torch
    return sorted(n for n, p in model.named_parameters() if n not in before or not torch.equal(p.detach(), before[n]))


def probe_adapter_io(ctx) -> None:
    """save_adapter/load_adapter on grader-built LoRA models and grader-written files."""
    import torch

    from finetune.lora import load_adapter, save_adapter
    device = ctx.device
    folder = Path(tempfile.mkdtemp(prefix="p3_adapters_", dir=ctx.out_dir))
    saved, other = ref.adapter_state(1), ref.adapter_state(2)
    grader_file = folder / "grader.pt"
    torch.save(saved, grader_file)
    x = ref.inputs(1).to(device)

    def save(adapters, targets, rank, name):
        model = grader_lora_model(device, adapters, targets=targets, rank=rank)
        before = _snapshot(model)
        path = folder / f"{name}.pt"
        labelled("save_adapter(model, path)", save_adapter, model, path)
        loaded = torch.load(path, map_location=None, weights_only=True)
        meta = ({k: [type(v).__name__, str(v.device) if isinstance(v, torch.Tensor) else "",
                     bool(getattr(v, "requires_grad", False))] for k, v in loaded.items()}
                if isinstance(loaded, dict) else {})
        values = ({k: v.detach().cpu().clone() if isinstance(v, torch.Tensor) else describe(v)
                   for k, v in loaded.items()} if isinstance(loaded, dict) else describe(loaded))
        return {"values": values, "meta": meta, "model_changed": _changed(model, before)}
    ctx.record(split_part(P_SAVE, PUBLIC), lambda: save(saved, ref.ADAPTER_TARGETS, ref.RANK, "student"))
    hidden = ctx.args.get("hidden")
    if hidden:
        ctx.record(split_part(P_SAVE, HIDDEN), lambda: save(
            ref.adapter_state(hidden["seed"], hidden["targets"], hidden["rank"]), hidden["targets"], hidden["rank"],
            "student_hidden"))

    def restore():
        source = grader_lora_model(device, saved)
        model = grader_lora_model(device, other)
        with torch.no_grad():
            want = source(x).cpu()
        labelled("load_adapter(model, path)", load_adapter, model, grader_file)
        with torch.no_grad():
            got = model(x).cpu()
        return {"source_out": want, "loaded_out": got, "params": {n: t.cpu() for n, t in _snapshot(model).items()}}
    ctx.record(P_RESTORE, restore)

    def in_place():
        model = grader_lora_model(device, other)
        objects = dict(model.named_parameters())
        labelled("load_adapter(model, path)", load_adapter, model, grader_file)
        now = dict(model.named_parameters())
        double_file = folder / "float64.pt"
        torch.save({k: v.double() for k, v in saved.items()}, double_file)
        cast = grader_lora_model(device, other)
        labelled("load_adapter(float32 model, float64 file)", load_adapter, cast, double_file)
        return {
            "replaced": sorted(n for n, p in objects.items() if now.get(n) is not p),
            "not_trainable": sorted(n for n, p in now.items() if n in saved and not p.requires_grad),
            "dtypes": sorted({str(p.dtype) for n, p in cast.named_parameters() if n in saved}),
        }
    ctx.record(P_IN_PLACE, in_place)

    def rejects():
        bad = {
            "an empty dict": {},
            "a list of tensors instead of a dict": list(saved.values()),
            "an extra key (a base weight)": {**saved, "head.base.weight": torch.zeros(ref.OUT_FEATURES, ref.HIDDEN)},
            "an extra key (lora_A of a layer without LoRA)": {**saved, "blocks.0.fc.lora_A": torch.zeros(2, 8)},
            "a missing key (head.lora_B)": {k: v for k, v in saved.items() if k != "head.lora_B"},
            "a mis-shaped last entry (head.lora_B)": {**saved, "head.lora_B": torch.zeros(ref.OUT_FEATURES, 3)},
        }
        results = []
        for label, state in bad.items():
            path = folder / f"bad_{len(results)}.pt"
            torch.save(state, path)
            model = grader_lora_model(device, other)
            before = _snapshot(model)
            outcome = call_outcome(lambda: load_adapter(model, path))
            results.append({"label": label, "outcome": outcome, "changed": _changed(model, before)})
        return results
    ctx.record(P_REJECTS, rejects)


def _case_args() -> dict:
    hidden = data.hidden("p3_2")
    return {"hidden": hidden} if hidden else {}


CASE = Case("p3_adapter_io", probe_adapter_io, world_size=1, init_group=False, timeout_s=60, args=_case_args())


# ---------------------------------------------------------------- criteria
@CASE.criterion("3.2.save_contents", "only lora_A/lora_B saved, CPU, detached, weights_only loadable", points=3,
                hidden_points=1)
def check_save(run, split: str) -> None:
    got = run.part(split_part(P_SAVE, split))
    hidden = data.hidden("p3_2") if split == HIDDEN else None
    expected = ref.adapter_state(hidden["seed"], hidden["targets"], hidden["rank"]) if hidden else ref.adapter_state(1)
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


@CASE.criterion("3.2.load_restores", "loading restores outputs exactly; base weights unchanged", points=2)
def check_restore(run) -> None:
    got = run.part(P_RESTORE)
    assert_tensor_close("load_adapter: outputs after loading the adapter of another model (must equal that "
                        "model's outputs)", got["loaded_out"], got["source_out"], atol=0.0, rtol=0.0)
    expected = {**ref.wrapped_base_state(0), **ref.adapter_state(1)}
    assert_state_close("load_adapter: parameter after loading", got["params"], expected, atol=0.0, rtol=0.0)


@CASE.criterion("3.2.load_in_place", "parameter objects stay registered (copied in place)", points=2)
def check_in_place(run) -> None:
    got = run.part(P_IN_PLACE)
    expect(not got["replaced"], f"load_adapter replaced the Parameter objects {got['replaced']}; copy into the "
           "existing parameters (param.copy_ under torch.no_grad()) so optimizers keep working")
    expect(not got["not_trainable"], f"load_adapter left {got['not_trainable']} with requires_grad=False")
    expect(got["dtypes"] == ["torch.float32"], f"load_adapter of a float64 file into a float32 model left adapters "
           f"of dtype {got['dtypes']}: copy the values into the parameters (param.copy_), which casts them")


@CASE.criterion("3.2.load_rejects", "empty/extra/missing/mis-shaped files: ValueError before any change",
                points=3)
def check_rejects(run) -> None:
    expect_refusals(run.part(P_REJECTS), "load_adapter on a file with",
                    {"changed": "check the whole file before copying anything"})


CASES = [CASE]
