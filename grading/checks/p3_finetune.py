"""Problem 3 checks: apply LoRA (3.1), save/load adapters (3.2), DeepSpeed ZeRO (3.3).

Probes run in rank processes and only *record* what the student code did;
criteria run in the grader and judge it against ``grading.references.p3``.
3.2 does not use the student's ``apply_lora``: its probe wraps the grader's
model with the kit's provided ``LoRALinear`` itself. 3.3 runs one 2-rank
case with the real DeepSpeed engine (gloo on CPU): the student's config in
one engine, and ``train_microbatch`` in a second engine built from the
grader's config, so a config bug costs only the config criterion.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from grading.checks.common import call_outcome
from grading.compare import assert_state_close, assert_tensor_close, describe
from grading.references import p3 as ref
from grading.rubric import Case, CaseRun, Criterion
from grading.runner import expect

# (world_size, micro_batch, grad_accum, precision) for build_config
CONFIGS = [(2, 2, 2, "fp32"), (1, 4, 1, "fp32"), (4, 1, 8, "fp16"), (3, 5, 2, "bf16"), (8, 2, 4, "fp32")]
BAD_CONFIGS = [(0, 2, 2, "fp32"), (2, 0, 2, "fp32"), (2, 2, 0, "fp32"), (-1, 2, 2, "fp32"), (2, 2, 2, "fp8"),
               (2, 2, 2, "float64")]
# (label, target_names, rank) for apply_lora; each must raise ValueError and change nothing
BAD_APPLY = [
    ("empty target list", [], 2),
    ("duplicate name", ["embed", "head", "embed"], 2),
    ("missing name after a valid one", ["embed", "nope"], 2),
    ("LayerNorm target after a valid one", ["head", "blocks.0.norm"], 2),
    ("ModuleList target", ["blocks"], 2),
    ("rank 0", ["embed", "head"], 0),
]


def _labelled(label: str, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``; an exception comes back as RuntimeError naming the call and the original."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001
        raise RuntimeError(f"{label} raised {type(exc).__name__}: {exc}") from exc


# ---------------------------------------------------------------- 3.1 probe
def probe_apply(ctx) -> None:
    """apply_lora on fresh ``LoRANet`` models: dotted targets, outputs, trainable set, invalid inputs."""
    import torch

    from finetune.lora import LoRALinear, apply_lora
    device = ctx.device

    def replace():
        model = ref.LoRANet(0).to(device, torch.float64)
        before = dict(model.named_modules())
        result = _labelled(f"apply_lora(model, {ref.NESTED_TARGETS}, rank=3, alpha=6)", apply_lora, model,
                           ref.NESTED_TARGETS, rank=3, alpha=6)
        after = dict(model.named_modules())
        wrapped = {}
        for name in ref.NESTED_TARGETS:
            module = after.get(name)
            wrapped[name] = {
                "type": type(module).__name__,
                "is_provided_lora": isinstance(module, LoRALinear),
                "base_is_original": isinstance(module, LoRALinear) and module.base is before[name],
                "rank": getattr(module, "rank", None), "scale": getattr(module, "scale", None),
            }
        others_moved = [name for name, module in before.items()
                        if name not in ref.NESTED_TARGETS and after.get(name) is not module]
        new_lora = sorted(name for name, module in after.items() if isinstance(module, LoRALinear))
        return {"same_object": result is model, "wrapped": wrapped, "others_moved": sorted(others_moved),
                "lora_modules": new_lora}
    ctx.record("replace", replace)

    def outputs():
        model = ref.LoRANet(0).to(device, torch.float64)
        x = ref.inputs(0).to(device, torch.float64)
        with torch.no_grad():
            before = model(x).cpu()
        _labelled(f"apply_lora(model, {ref.TOP_TARGETS})", apply_lora, model, ref.TOP_TARGETS, rank=2, alpha=4)
        adapters = {name: [str(p.dtype), str(p.device)] for name, p in model.named_parameters()
                    if name.rpartition(".")[2] in ("lora_A", "lora_B")}
        try:
            with torch.no_grad():
                after = model(x).cpu()
        except Exception as exc:  # noqa: BLE001 - judged in the parent, after the dtype/device check
            after = f"the forward pass raised {type(exc).__name__}: {exc}"
        return {"before": before, "after": after, "adapters": adapters, "device": str(torch.device(device))}
    ctx.record("outputs", outputs)

    def trainable():
        model = ref.LoRANet(0).to(device)
        _labelled(f"apply_lora(model, {ref.TOP_TARGETS})", apply_lora, model, ref.TOP_TARGETS)
        return {"trainable": sorted(n for n, p in model.named_parameters() if p.requires_grad)}
    ctx.record("trainable", trainable)

    def invalid():
        results = []
        for label, names, rank in BAD_APPLY:
            model = ref.LoRANet(0).to(device)
            next(iter(model.blocks[1].parameters())).requires_grad_(False)   # a mix of frozen and trainable
            modules = dict(model.named_modules())
            grads = {n: p.requires_grad for n, p in model.named_parameters()}
            outcome = call_outcome(lambda: apply_lora(model, list(names), rank=rank))
            swapped = sorted(n for n, m in model.named_modules() if modules.get(n) is not m)
            swapped += sorted(set(modules) - {n for n, _ in model.named_modules()})
            regraded = sorted(n for n, p in model.named_parameters() if grads.get(n) != p.requires_grad)
            results.append({"label": label, "outcome": outcome, "swapped": swapped, "requires_grad": regraded})
        return results
    ctx.record("invalid", invalid)


# ---------------------------------------------------------------- 3.1 criteria
def check_replace(run: CaseRun) -> None:
    got = run.part("replace")
    call = f"apply_lora(model, {ref.NESTED_TARGETS}, rank=3, alpha=6)"
    expect(got["same_object"], f"{call} must return the model it was given (modified in place), not a copy")
    for name, info in got["wrapped"].items():
        expect(info["is_provided_lora"], f"{call}: module '{name}' is {info['type']}, expected finetune.lora."
               "LoRALinear (dotted names must reach nested layers)")
        expect(info["base_is_original"], f"{call}: LoRALinear at '{name}' must wrap the original nn.Linear "
               "object as its base (no copy)")
        expect(info["rank"] == 3 and abs(info["scale"] - 2.0) < 1e-12, f"{call}: LoRALinear at '{name}' has "
               f"rank {info['rank']} and scale {info['scale']}, expected rank 3 and scale 6/3 = 2")
    expect(got["lora_modules"] == sorted(ref.NESTED_TARGETS), f"{call}: LoRALinear found at "
           f"{got['lora_modules']}, expected exactly {sorted(ref.NESTED_TARGETS)}")
    expect(not got["others_moved"], f"{call}: modules other than the targets were replaced or removed: "
           f"{got['others_moved']}")


def check_outputs(run: CaseRun) -> None:
    got = run.part("outputs")
    call = f"apply_lora(float64 model on {got['device']}, {ref.TOP_TARGETS})"
    for name, (dtype, device) in got["adapters"].items():
        expect(dtype == "torch.float64" and device == got["device"], f"{call}: adapter '{name}' is {dtype} on "
               f"{device}, expected torch.float64 on {got['device']} (the layer's dtype and device)")
    expect(len(got["adapters"]) == 2 * len(ref.TOP_TARGETS), f"{call}: found adapters {sorted(got['adapters'])}")
    expect(not isinstance(got["after"], str), f"{call}: {got['after']}")
    assert_tensor_close(f"{call}: model output right after apply_lora (lora_B starts at zero)", got["after"],
                        got["before"], atol=0.0, rtol=0.0)


def check_trainable(run: CaseRun) -> None:
    got = run.part("trainable")
    want = sorted(f"{t}.{p}" for t in ref.TOP_TARGETS for p in ("lora_A", "lora_B"))
    expect(got["trainable"] == want, f"apply_lora(model, {ref.TOP_TARGETS}): trainable parameters are "
           f"{got['trainable']}, expected only the adapters {want} (freeze every parameter of the model)")


def check_invalid(run: CaseRun) -> None:
    for item in run.part("invalid"):
        label = f"apply_lora with {item['label']}"
        expect(item["outcome"] == "ValueError", f"{label}: expected ValueError, got {item['outcome']}")
        expect(not item["swapped"], f"{label}: raised, but had already replaced modules {item['swapped']} "
               "(validate every target before changing the model)")
        expect(not item["requires_grad"], f"{label}: raised, but had already changed requires_grad of "
               f"{item['requires_grad'][:4]} (validate before freezing)")


# ---------------------------------------------------------------- 3.2 probe
def _grader_lora_model(device, adapters: dict, layer=None):
    """``LoRANet(0)`` with ``layer`` (default: the kit's provided ``LoRALinear``) at ``ADAPTER_TARGETS``,
    adapters set to ``adapters``."""
    import torch

    if layer is None:
        from finetune.lora import LoRALinear as layer
    model = ref.LoRANet(0)
    for name in ref.ADAPTER_TARGETS:
        parent, _, child = name.rpartition(".")
        holder = model.get_submodule(parent)
        setattr(holder, child, layer(getattr(holder, child), ref.RANK, ref.ALPHA))
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

    def save():
        model = _grader_lora_model(device, saved)
        before = _snapshot(model)
        path = folder / "student.pt"
        _labelled("save_adapter(model, path)", save_adapter, model, path)
        loaded = torch.load(path, map_location=None, weights_only=True)
        meta = ({k: [type(v).__name__, str(v.device) if isinstance(v, torch.Tensor) else "",
                     bool(getattr(v, "requires_grad", False))] for k, v in loaded.items()}
                if isinstance(loaded, dict) else {})
        values = ({k: v.detach().cpu().clone() if isinstance(v, torch.Tensor) else describe(v)
                   for k, v in loaded.items()} if isinstance(loaded, dict) else describe(loaded))
        return {"values": values, "meta": meta, "model_changed": _changed(model, before)}
    ctx.record("save", save)

    def restore():
        source = _grader_lora_model(device, saved)
        model = _grader_lora_model(device, other)
        with torch.no_grad():
            want = source(x).cpu()
        _labelled("load_adapter(model, path)", load_adapter, model, grader_file)
        with torch.no_grad():
            got = model(x).cpu()
        return {"source_out": want, "loaded_out": got, "params": {n: t.cpu() for n, t in _snapshot(model).items()}}
    ctx.record("restore", restore)

    def in_place():
        model = _grader_lora_model(device, other)
        objects = dict(model.named_parameters())
        _labelled("load_adapter(model, path)", load_adapter, model, grader_file)
        now = dict(model.named_parameters())
        return {
            "replaced": sorted(n for n, p in objects.items() if now.get(n) is not p),
            "not_trainable": sorted(n for n, p in now.items() if n in saved and not p.requires_grad),
        }
    ctx.record("in_place", in_place)

    def rejects():
        bad = {
            "an empty dict": {},
            "an extra key (a base weight)": {**saved, "head.base.weight": torch.zeros(ref.OUT_FEATURES, ref.HIDDEN)},
            "an extra key (lora_A of a layer without LoRA)": {**saved, "blocks.0.fc.lora_A": torch.zeros(2, 8)},
            "a missing key (head.lora_B)": {k: v for k, v in saved.items() if k != "head.lora_B"},
            "a mis-shaped last entry (head.lora_B)": {**saved, "head.lora_B": torch.zeros(ref.OUT_FEATURES, 3)},
        }
        results = []
        for label, state in bad.items():
            path = folder / f"bad_{len(results)}.pt"
            torch.save(state, path)
            model = _grader_lora_model(device, other)
            before = _snapshot(model)
            outcome = call_outcome(lambda: load_adapter(model, path))
            results.append({"label": label, "outcome": outcome, "changed": _changed(model, before)})
        return results
    ctx.record("rejects", rejects)


# ---------------------------------------------------------------- 3.2 criteria
def check_save(run: CaseRun) -> None:
    got = run.part("save")
    expected = ref.adapter_state(1)
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


def check_restore(run: CaseRun) -> None:
    got = run.part("restore")
    assert_tensor_close("load_adapter: outputs after loading the adapter of another model (must equal that "
                        "model's outputs)", got["loaded_out"], got["source_out"], atol=0.0, rtol=0.0)
    expected = {**ref.wrapped_base_state(0), **ref.adapter_state(1)}
    assert_state_close("load_adapter: parameter after loading", got["params"], expected, atol=0.0, rtol=0.0)


def check_in_place(run: CaseRun) -> None:
    got = run.part("in_place")
    expect(not got["replaced"], f"load_adapter replaced the Parameter objects {got['replaced']}; copy into the "
           "existing parameters (param.copy_ under torch.no_grad()) so optimizers keep working")
    expect(not got["not_trainable"], f"load_adapter left {got['not_trainable']} with requires_grad=False")


def check_rejects(run: CaseRun) -> None:
    for item in run.part("rejects"):
        label = f"load_adapter on a file with {item['label']}"
        expect(item["outcome"] == "ValueError", f"{label}: expected ValueError, got {item['outcome']}")
        expect(not item["changed"], f"{label}: raised, but had already changed {item['changed']} (check the "
               "whole file before copying anything)")


# ---------------------------------------------------------------- 3.3 probe
def _lora_model_for_training():
    """The 3.3 model: ``LoRANet(0)`` with the grader's LoRA layers holding ``adapter_state(3)``, base frozen."""
    model = _grader_lora_model("cpu", ref.adapter_state(3), ref.GraderLoRALinear)
    for name, param in model.named_parameters():
        param.requires_grad_(name.rpartition(".")[2] in ("lora_A", "lora_B"))
    return model


def _engine(config: dict):
    import torch

    from finetune.zero import init_engine
    model = _lora_model_for_training()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=ref.LEARNING_RATE)
    return init_engine(model, optimizer, config), model


def probe_zero(ctx) -> None:
    """build_config values and errors (rank 0), then two live ZeRO-2 engines on both ranks.

    The engine built from the grader's config trains first, so that a student
    config that breaks or stalls DeepSpeed costs only the config criterion.
    """
    if ctx.backend == "gloo":
        os.environ["DS_ACCELERATOR"] = "cpu"      # before DeepSpeed is imported: ranks may share one GPU
    from finetune.zero import build_config, train_microbatch

    if ctx.rank == 0:
        ctx.record("config_values", lambda: [build_config(w, m, a, p) for w, m, a, p in CONFIGS])
        ctx.record("config_errors", lambda: [call_outcome(lambda c=c: build_config(*c)) for c in BAD_CONFIGS])

    def train():
        engine, model = _engine(ref.grader_config())
        losses = []
        for step in range(ref.STEPS):
            row = []
            for micro in range(ref.GRAD_ACCUM):
                x, y = (t.to(ctx.device) for t in ref.micro_batch(step, ctx.rank, micro))
                row.append(_labelled(f"train_microbatch at optimizer step {step}, micro-batch {micro}",
                                     train_microbatch, engine, x, y, ref.loss_fn))
            losses.append(row)
        params = {name: p.detach().cpu().clone() for name, p in model.named_parameters()}
        return {"losses": losses, "params": params, "global_steps": int(engine.global_steps)}
    ctx.record("train", train)

    def student_engine():
        config = build_config(ref.WORLD_SIZE, ref.MICRO_BATCH, ref.GRAD_ACCUM, "fp32")
        engine, _ = _engine(config)
        return {"train_batch_size": engine.train_batch_size(),
                "micro": engine.train_micro_batch_size_per_gpu(),
                "accum": engine.gradient_accumulation_steps(),
                "stage": engine.zero_optimization_stage(),
                "clipping": float(engine.gradient_clipping()),
                "offload": bool(engine.zero_offload_optimizer() or engine.zero_offload_param()),
                "fp16": bool(engine.fp16_enabled()), "bf16": bool(engine.bfloat16_enabled()),
                "optimizer": type(engine.optimizer).__name__}
    ctx.record("student_engine", student_engine)


# ---------------------------------------------------------------- 3.3 criteria
def _lookup(config, dotted: str):
    value = config
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            return "<absent>"
        value = value[key]
    return value


def _same_value(got, want) -> bool:
    """Equal and of the right kind: bools exactly, ints as int (not bool), floats as int or float."""
    if isinstance(want, bool):
        return got is want
    if isinstance(want, int):
        return type(got) is int and got == want
    return type(got) in (int, float) and got == want


def check_config(run: CaseRun) -> None:
    for (w, m, a, p), config in zip(CONFIGS, run.part("config_values")):
        call = f"build_config({w}, {m}, {a}, {p!r})"
        expect(isinstance(config, dict), f"{call} returned {describe(config)}, expected a dict")
        for key, want in ref.expected_config_entries(w, m, a, p).items():
            got = _lookup(config, key)
            if got == "<absent>" and key in ("fp16.enabled", "bf16.enabled") and want is False:
                continue                          # a missing section is disabled in DeepSpeed too
            expect(_same_value(got, want), f"{call}: '{key}' is {got!r}, expected {want!r}")
        zero = config.get("zero_optimization", {})
        for key in ("offload_optimizer", "offload_param"):
            device = _lookup(zero, f"{key}.device") if isinstance(zero, dict) else "<absent>"
            expect(device in ("<absent>", "none", None), f"{call}: zero_optimization.{key} offloads to "
                   f"{device!r}; ZeRO-2 here runs without offload")
    want = {"train_batch_size": ref.WORLD_SIZE * ref.MICRO_BATCH * ref.GRAD_ACCUM, "micro": ref.MICRO_BATCH,
            "accum": ref.GRAD_ACCUM, "stage": 2, "clipping": 0.0, "offload": False, "fp16": False, "bf16": False}
    for rank in range(run.world_size):
        got = run.part("student_engine", rank)
        for key, value in want.items():
            expect(got[key] == value, f"DeepSpeed engine from build_config({ref.WORLD_SIZE}, {ref.MICRO_BATCH}, "
                   f"{ref.GRAD_ACCUM}, 'fp32') on {ref.WORLD_SIZE} ranks: rank {rank} reports {key} = "
                   f"{got[key]!r}, expected {value!r}")


def check_config_errors(run: CaseRun) -> None:
    for args, outcome in zip(BAD_CONFIGS, run.part("config_errors")):
        expect(outcome == "ValueError", f"build_config{args} must raise ValueError, got {outcome}")


def check_update(run: CaseRun) -> None:
    expected_adapters, expected_losses = ref.serial_sgd(seed=3)
    base = ref.wrapped_base_state(0)
    for rank in range(run.world_size):
        got = run.part("train", rank)
        what = f"train_microbatch: rank {rank}"
        expect(got["global_steps"] == ref.STEPS, f"{what}: engine.global_steps is {got['global_steps']} after "
               f"{ref.STEPS * ref.GRAD_ACCUM} micro-batches with gradient_accumulation_steps={ref.GRAD_ACCUM}, "
               f"expected {ref.STEPS} (call engine.step() once per micro-batch)")
        for step, row in enumerate(got["losses"]):
            for micro, value in enumerate(row):
                expect(type(value) is float, f"{what} returned {describe(value)} for step {step} micro-batch "
                       f"{micro}, expected a Python float")
        for micro, value in enumerate(got["losses"][0]):      # later steps depend on the updates, judged below
            want = expected_losses[0][rank][micro]
            expect(abs(value - want) <= 1e-5 * max(1.0, abs(want)), f"{what} returned loss {value:.6g} for the "
                   f"first micro-batch {micro}, expected the micro-batch loss {want:.6g} (as loss_fn returns it)")
        assert_state_close(f"{what}: after {ref.STEPS} ZeRO-2 steps, compared with serial SGD on the global "
                           "batch, adapter", got["params"], expected_adapters, atol=1e-6, rtol=1e-5)
        assert_state_close(f"{what}: after {ref.STEPS} ZeRO-2 steps, frozen base weight", got["params"], base,
                           atol=0.0, rtol=0.0)
        for step, row in enumerate(got["losses"]):
            for micro, value in enumerate(row):
                want = expected_losses[step][rank][micro]
                expect(abs(value - want) <= 1e-5 * max(1.0, abs(want)), f"{what} returned loss {value:.6g} "
                       f"for step {step} micro-batch {micro}, expected {want:.6g}")


CASES = [
    Case("p3_apply_lora", "grading.checks.p3_finetune:probe_apply", world_size=1, init_group=False,
         timeout_s=60, criteria=(
             Criterion("3.1.replaces_targets", "dotted targets become LoRALinear around the original layer; "
                        "nothing else moves; same model returned", 3, check_replace),
             Criterion("3.1.outputs_dtype_device", "outputs unchanged right after apply; adapters keep "
                        "dtype/device", 2, check_outputs),
             Criterion("3.1.only_adapters_trainable", "only lora_A/lora_B require grad", 2, check_trainable),
             Criterion("3.1.validation", "each invalid input raises ValueError and leaves the model untouched",
                        3, check_invalid),
         )),
    Case("p3_adapter_io", "grading.checks.p3_finetune:probe_adapter_io", world_size=1, init_group=False,
         timeout_s=60, criteria=(
             Criterion("3.2.save_contents", "only lora_A/lora_B saved, CPU, detached, weights_only loadable",
                        3, check_save),
             Criterion("3.2.load_restores", "loading restores outputs exactly; base weights unchanged", 2,
                        check_restore),
             Criterion("3.2.load_in_place", "parameter objects stay registered (copied in place)", 2,
                        check_in_place),
             Criterion("3.2.load_rejects", "empty/extra/missing/mis-shaped files: ValueError before any change",
                        3, check_rejects),
         )),
    Case("p3_zero_2rank", "grading.checks.p3_finetune:probe_zero", world_size=2, init_group=True,
         timeout_s=150, criteria=(
             Criterion("3.3.config", "config values for several sizes/precisions; a live 2-rank ZeRO-2 engine "
                        "from it", 7, check_config),
             Criterion("3.3.config_errors", "ValueError for bad sizes or unknown precision", 3,
                        check_config_errors),
             Criterion("3.3.update", "3 steps x 2 micro-batches per rank through train_microbatch equal serial "
                        "SGD; base frozen; global_steps == 3", 10, check_update),
         )),
]

__all__ = ["CASES"]
