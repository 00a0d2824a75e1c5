"""Problem 3.1 checks: ``apply_lora`` with the provided ``LoRALinear``.

The probe applies LoRA to fresh copies of the grader's small residual MLP (``LoRANet`` in this folder's
``reference.py``) and records which modules were replaced, the outputs before and after, the trainable set and
what invalid inputs do. Nothing is stored as expected data: every criterion compares with the inputs themselves
and with ``LoRANet``.
"""
from __future__ import annotations

from dataclasses import dataclass

from grading.check import SplitRun, SubProblem, assert_tensor_close, describe, describe_exception, expect
from grading.problems.probe_helpers import call_outcome, expect_refusals, labelled
from grading.problems.p3_1_lora import ID, TITLE
from grading.problems.p3_1_lora import reference as ref


@dataclass(frozen=True)
class Inputs:
    """The split-dependent apply_lora call: dotted target names (in ``LoRANet``), rank and alpha."""

    targets: tuple[str, ...]
    rank: int
    alpha: float


PROBLEM = SubProblem(ID, TITLE, __package__, inputs=Inputs(targets=tuple(ref.NESTED_TARGETS), rank=3, alpha=6.0))

# (label, target_names, rank) for apply_lora on a LoRANet; each must raise ValueError and change nothing
BAD_APPLY = [
    ("empty target list", [], 2),
    ("duplicate name", ["embed", "head", "embed"], 2),
    ("missing name after a valid one", ["embed", "nope"], 2),
    ("LayerNorm target after a valid one", ["head", "blocks.0.norm"], 2),
    ("ModuleList target", ["blocks"], 2),
    ("rank 0", ["embed", "head"], 0),
]
# ... and on a model that is itself an nn.Linear: "" (the root) is never a target
ROOT_TARGET = ("'' (the model itself, an nn.Linear)", [""], 2)
# ... and on a LoRANet that also registers its head as `head_alias`: named_modules() lists that module once, as
# 'head', so 'head_alias' names no module of named_modules()
ALIAS_TARGET = ("'head_alias' after a valid one (a second name of 'head', which named_modules() lists only as "
                "'head')", ["embed", "head_alias"], 2)

P_REPLACE = "replace"    # a split part: recorded once per split
P_OUTPUTS = "outputs"
P_TRAINABLE = "trainable"
P_INVALID = "invalid"
# Many distinct targets are no duplicates: an nn.ModuleList of MANY_TARGETS nn.Linear(1, 1), every one named. Past
# 256 the list's length and its set's are distinct int objects, so lengths compared by identity (`is not`) differ.
MANY_TARGETS = 300
P_MANY_TARGETS = "many_targets"    # apply_lora on all of them: its outcome and the LoRALinear count afterwards


def _call(inputs: Inputs) -> str:
    """The apply_lora call of ``inputs``, as messages name it."""
    return f"apply_lora(model, {list(inputs.targets)}, rank={inputs.rank}, alpha={inputs.alpha})"


# ---------------------------------------------------------------- probe
def _replaced(LoRALinear, apply_lora, device, inputs: Inputs) -> dict:
    """apply_lora with the split's inputs on a fresh float64 ``LoRANet``: what it returned, what each target became,
    which other modules moved, the LoRALinear modules and the trainable parameters afterwards."""
    import torch

    targets, rank, alpha = inputs.targets, inputs.rank, inputs.alpha
    model = ref.LoRANet(0).to(device, torch.float64)
    before = dict(model.named_modules())
    result = labelled(_call(inputs), apply_lora, model, list(targets), rank=rank, alpha=alpha)
    after = dict(model.named_modules())
    wrapped = {}
    for name in targets:
        module = after.get(name)
        wrapped[name] = {
            "type": type(module).__name__,
            "is_provided_lora": isinstance(module, LoRALinear),
            "base_is_original": isinstance(module, LoRALinear) and module.base is before[name],
            "rank": getattr(module, "rank", None), "scale": getattr(module, "scale", None),
        }
    others_moved = [name for name, module in before.items()
                    if name not in targets and after.get(name) is not module]
    returned = "the model" if result is model else describe(result)
    new_lora = sorted(name for name, module in after.items() if isinstance(module, LoRALinear))
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    return {"same_object": result is model, "returned": returned, "wrapped": wrapped,
            "others_moved": sorted(others_moved),
            "lora_modules": new_lora, "trainable": trainable}


def _outputs(apply_lora, device) -> dict:
    """A float64 ``LoRANet``'s output before and after apply_lora (rank 1) on its top-level targets, and the dtype
    and device of each adapter."""
    import torch

    model = ref.LoRANet(0).to(device, torch.float64)
    x = ref.inputs(0).to(device, torch.float64)
    with torch.no_grad():
        before = model(x).cpu()
    labelled(f"apply_lora(model, {ref.TOP_TARGETS}, rank=1)", apply_lora, model, ref.TOP_TARGETS, rank=1,
             alpha=4)                             # rank 1: the smallest rank there is
    adapters = {name: [str(p.dtype), str(p.device)] for name, p in model.named_parameters()
                if name.rpartition(".")[2] in ("lora_A", "lora_B")}
    try:
        with torch.no_grad():
            after = model(x).cpu()
    except Exception as exc:  # noqa: BLE001 - judged in the parent, after the dtype/device check
        after = f"the forward pass raised {describe_exception(exc)}"
    return {"before": before, "after": after, "adapters": adapters, "device": str(torch.device(device))}


def _trainable(apply_lora, device) -> dict:
    """The trainable parameters of a ``LoRANet`` after apply_lora on its top-level targets."""
    model = ref.LoRANet(0).to(device)
    labelled(f"apply_lora(model, {ref.TOP_TARGETS})", apply_lora, model, ref.TOP_TARGETS)
    return {"trainable": sorted(n for n, p in model.named_parameters() if p.requires_grad)}


def _invalid_outcomes(apply_lora, device) -> list[dict]:
    """apply_lora on each invalid input (BAD_APPLY, ROOT_TARGET, ALIAS_TARGET): how it ended, the modules it
    swapped and the parameters whose requires_grad it changed."""
    import torch

    results = []
    for label, names, rank in [*BAD_APPLY, ROOT_TARGET, ALIAS_TARGET]:
        if names == ROOT_TARGET[1]:
            model = torch.nn.Linear(ref.IN_FEATURES, ref.OUT_FEATURES).to(device)
            model.bias.requires_grad_(False)                              # a mix of frozen and trainable
        else:
            model = ref.LoRANet(0).to(device)
            next(iter(model.blocks[1].parameters())).requires_grad_(False)   # a mix of frozen and trainable
        if names == ALIAS_TARGET[1]:
            model.head_alias = model.head
        aliases = {n: getattr(model, n) for n in ("head_alias",) if hasattr(model, n)}
        modules = dict(model.named_modules())
        grads = {n: p.requires_grad for n, p in model.named_parameters()}
        outcome = call_outcome(lambda: apply_lora(model, list(names), rank=rank))
        swapped = sorted(n for n, m in model.named_modules() if modules.get(n) is not m)
        swapped += sorted(set(modules) - {n for n, _ in model.named_modules()})
        swapped += sorted(n for n, m in aliases.items() if getattr(model, n, None) is not m)
        regraded = sorted(n for n, p in model.named_parameters() if grads.get(n) != p.requires_grad)
        results.append({"label": label, "outcome": outcome, "swapped": swapped, "requires_grad": regraded})
    return results


def _many_targets(LoRALinear, apply_lora, device) -> dict:
    """apply_lora on every one of MANY_TARGETS nn.Linear of an nn.ModuleList: how it ended, and the LoRALinear
    count afterwards."""
    import torch

    model = torch.nn.ModuleList(torch.nn.Linear(1, 1) for _ in range(MANY_TARGETS)).to(device)
    outcome = call_outcome(lambda: apply_lora(model, [str(k) for k in range(MANY_TARGETS)]), message=True)
    return {"outcome": outcome, "lora": sum(isinstance(module, LoRALinear) for module in model)}


def probe_apply(ctx) -> None:
    """apply_lora on fresh ``LoRANet`` models: dotted targets, outputs, trainable set, invalid inputs."""
    from finetune.lora import LoRALinear, apply_lora
    device = ctx.device

    PROBLEM.each_split(ctx, lambda inputs: ctx.record(P_REPLACE, lambda: _replaced(LoRALinear, apply_lora, device,
                                                                                   inputs)))
    ctx.record(P_OUTPUTS, lambda: _outputs(apply_lora, device))
    ctx.record(P_TRAINABLE, lambda: _trainable(apply_lora, device))
    ctx.record(P_INVALID, lambda: _invalid_outcomes(apply_lora, device))
    ctx.record(P_MANY_TARGETS, lambda: _many_targets(LoRALinear, apply_lora, device))


CASE = PROBLEM.case("p3_apply_lora", probe_apply, world_size=1, init_group=False, timeout_s=60,
                    split_parts=(P_REPLACE,))


# ---------------------------------------------------------------- criteria
def _check_replace_trainable(run: SplitRun) -> None:
    """Hidden inputs: only the targets' adapters are trainable (publicly 3.1.only_adapters_trainable's: one bug,
    one criterion)."""
    got = run.part(P_REPLACE)
    want = sorted(f"{t}.{p}" for t in run.inputs.targets for p in ("lora_A", "lora_B"))
    expect(got["trainable"] == want, f"{_call(run.inputs)}: trainable parameters are {got['trainable']}, "
           f"expected {want}")


@CASE.criterion("3.1.replaces_targets", "dotted targets become LoRALinear around the original layer; nothing "
                "else moves; same model returned", points=3,
                reads=(P_REPLACE,), hidden_only=(_check_replace_trainable,))
def check_replace(run: SplitRun) -> None:
    inputs = run.inputs
    targets, rank, alpha = list(inputs.targets), inputs.rank, inputs.alpha
    got = run.part(P_REPLACE)
    call = _call(inputs)
    expect(got["same_object"], f"{call} returned {got.get('returned')}, expected the model it was given (modified "
           "in place, not a copy)")
    for name, info in got["wrapped"].items():
        expect(info["is_provided_lora"], f"{call}: module '{name}' is {info['type']}, expected finetune.lora."
               "LoRALinear (dotted names must reach nested layers)")
        expect(info["base_is_original"], f"{call}: LoRALinear at '{name}' must wrap the original nn.Linear "
               "object as its base (no copy)")
        expect(info["rank"] == rank and abs(info["scale"] - alpha / rank) < 1e-12, f"{call}: LoRALinear at "
               f"'{name}' has rank {info['rank']} and scale {info['scale']}, expected rank {rank} and scale "
               f"{alpha:g}/{rank} = {alpha / rank:g}")
    expect(got["lora_modules"] == sorted(targets), f"{call}: LoRALinear found at "
           f"{got['lora_modules']}, expected exactly {sorted(targets)}")
    expect(not got["others_moved"], f"{call}: modules other than the targets were replaced or removed: "
           f"{got['others_moved']}")


@CASE.criterion("3.1.outputs_dtype_device", "outputs unchanged right after apply; adapters keep dtype/device",
                points=2, reads=(P_OUTPUTS,))
def check_outputs(run: SplitRun) -> None:
    got = run.part(P_OUTPUTS)
    call = f"apply_lora(float64 model on {got['device']}, {ref.TOP_TARGETS})"
    for name, (dtype, device) in got["adapters"].items():
        expect(dtype == "torch.float64" and device == got["device"], f"{call}: adapter '{name}' is {dtype} on "
               f"{device}, expected torch.float64 on {got['device']} (the layer's dtype and device)")
    expect(len(got["adapters"]) == 2 * len(ref.TOP_TARGETS), f"{call}: found adapters {sorted(got['adapters'])}")
    expect(not isinstance(got["after"], str), f"{call}: {got['after']}")
    assert_tensor_close(f"{call}: model output right after apply_lora (lora_B starts at zero)", got["after"],
                        got["before"], atol=0.0, rtol=0.0)


@CASE.criterion("3.1.only_adapters_trainable", "only lora_A/lora_B require grad", points=2, reads=(P_TRAINABLE,))
def check_trainable(run: SplitRun) -> None:
    got = run.part(P_TRAINABLE)
    want = sorted(f"{t}.{p}" for t in ref.TOP_TARGETS for p in ("lora_A", "lora_B"))
    expect(got["trainable"] == want, f"apply_lora(model, {ref.TOP_TARGETS}): trainable parameters are "
           f"{got['trainable']}, expected only the adapters {want} (freeze every parameter of the model)")


@CASE.criterion("3.1.validation", "each invalid input raises ValueError and leaves the model untouched; 300 "
                "distinct targets are no duplicates", points=2, reads=(P_INVALID, P_MANY_TARGETS))
def check_invalid(run: SplitRun) -> None:
    expect_refusals(run.part(P_INVALID), "apply_lora with", {
        "swapped": "validate every target before changing the model",
        "requires_grad": "validate before freezing"})
    got = run.part(P_MANY_TARGETS)
    call = (f"apply_lora(nn.ModuleList of {MANY_TARGETS} nn.Linear(1, 1), ['0', '1', ..., "
            f"'{MANY_TARGETS - 1}'])")
    cause = (" (a name is a duplicate only when len(set(names)) != len(names), compared with !=: 'is not' holds for "
             "equal ints above 256, which are distinct objects)" if got["outcome"].startswith("ValueError") else "")
    expect(got["outcome"] == "no exception", f"{call}: {MANY_TARGETS} distinct names, expected no error, got "
           f"{got['outcome']}{cause}")
    expect(got["lora"] == MANY_TARGETS, f"{call}: {got['lora']} of the {MANY_TARGETS} layers became LoRALinear, "
           f"expected all {MANY_TARGETS}")

