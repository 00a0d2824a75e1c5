"""Problem 3 buggy variants: each bug loses exactly its intended criteria.

Variants that differ from the reference in a line or two are targeted edits of it (``edited``: each old text must
occur once); the others are rewrites, several sharing checks worded more tersely than the reference's (``_CHECKS``,
``_VALIDATE_LOAD``, ``_CONFIG_CHECKS``).
"""
from pathlib import Path

import pytest

from grading.problems import all_cases
from grading.engine.runner import run_cases
from tests.kit.variants import Variant, assert_verdicts, edited, grade_variant, make_variant_kit

LORA, ZERO = "finetune/lora.py", "finetune/zero.py"

_CHECKS = """
    names = list(target_names)
    if rank < 1:
        raise ValueError("rank must be >= 1")
    if not names:
        raise ValueError("no targets")
    if len(set(names)) != len(names):
        raise ValueError("duplicate targets")
"""

_VALIDATE_LOAD = """
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or not state:
        raise ValueError("empty adapter file")
    params = {n: p for n, p in model.named_parameters() if n.rpartition(".")[2] in ("lora_A", "lora_B")}
    if set(state) != set(params):
        raise ValueError("keys differ")
    for name, param in params.items():
        if not isinstance(state[name], torch.Tensor) or state[name].shape != param.shape:
            raise ValueError(f"{name}: wrong shape")
"""

_CONFIG_CHECKS = """
    for value in (world_size, micro_batch, grad_accum):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError("bad size")
    if precision not in ("fp32", "fp16", "bf16"):
        raise ValueError("bad precision")
"""

VARIANTS = [
    # ---- 3.1 apply_lora
    Variant("mutate_before_validate", LORA, "apply_lora", _CHECKS + """
    for param in model.parameters():
        param.requires_grad_(False)
    modules = dict(model.named_modules())
    for name in names:
        if not name or name not in modules or not isinstance(modules[name], nn.Linear):
            raise ValueError(f"bad target {name}")
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, LoRALinear(modules[name], rank, alpha))
    return model
    """, frozenset({"3.1.validation"})),
    Variant("base_not_frozen", LORA, "apply_lora", _CHECKS + """
    modules = dict(model.named_modules())
    for name in names:
        if not name or name not in modules or not isinstance(modules[name], nn.Linear):
            raise ValueError(f"bad target {name}")
    for name in names:
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, LoRALinear(modules[name], rank, alpha))
    return model
    """, frozenset({"3.1.only_adapters_trainable", "3.1.replaces_targets_hidden"})),
    Variant("top_level_names_only", LORA, "apply_lora", _CHECKS + """
    for name in names:
        if not isinstance(getattr(model, name, None), nn.Linear):
            raise ValueError(f"bad target {name}")
    for param in model.parameters():
        param.requires_grad_(False)
    for name in names:
        setattr(model, name, LoRALinear(getattr(model, name), rank, alpha))
    return model
    """, frozenset({"3.1.replaces_targets", "3.1.replaces_targets_hidden"})),
    Variant("casts_target_to_float32", LORA, "apply_lora", _CHECKS + """
    modules = dict(model.named_modules())
    for name in names:
        if not name or name not in modules or not isinstance(modules[name], nn.Linear):
            raise ValueError(f"bad target {name}")
    for param in model.parameters():
        param.requires_grad_(False)
    for name in names:
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, LoRALinear(modules[name].float(), rank, alpha))
    return model
    """, frozenset({"3.1.outputs_dtype_device"})),
    Variant("rank_alpha_not_passed", LORA, "apply_lora", _CHECKS + """
    modules = dict(model.named_modules())
    for name in names:
        if not name or name not in modules or not isinstance(modules[name], nn.Linear):
            raise ValueError(f"bad target {name}")
    for param in model.parameters():
        param.requires_grad_(False)
    for name in names:
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, LoRALinear(modules[name]))
    return model
    """, frozenset({"3.1.replaces_targets", "3.1.replaces_targets_hidden"})),
    Variant("root_target_accepted", LORA, "apply_lora", edited(LORA, "apply_lora", (
        "if not name or name not in modules:", "if name not in modules:")),
            frozenset({"3.1.validation"}), hint="the model itself, an nn.Linear"),
    Variant("apply_lora_returns_none", LORA, "apply_lora", edited(LORA, "apply_lora", ("    return model\n", "")),
            frozenset({"3.1.replaces_targets", "3.1.replaces_targets_hidden"}),
            hint="returned NoneType, expected the model"),
    Variant("saves_base_weights", LORA, "save_adapter", """
    torch.save({name: p.detach().cpu().clone() for name, p in model.named_parameters()}, path)
    """, frozenset({"3.2.save_contents", "3.2.save_contents_hidden"})),
    Variant("lenient_load", LORA, "load_adapter", """
    state = torch.load(path, map_location="cpu", weights_only=True)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in state.items():
            if name in params and params[name].shape == value.shape:
                params[name].copy_(value)
    """, frozenset({"3.2.load_rejects"})),
    Variant("assigns_param_data", LORA, "load_adapter", """
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or not state:
        raise ValueError("no adapter tensors")
    params = {n: p for n, p in model.named_parameters() if n.rpartition(".")[2] in ADAPTER_PARAM_NAMES}
    if set(params) != set(state):
        raise ValueError("missing or extra keys")
    for name, param in params.items():
        if not isinstance(state[name], torch.Tensor) or state[name].shape != param.shape:
            raise ValueError(f"bad shape for {name}")
    for name, param in params.items():
        param.data = state[name]
    """, frozenset({"3.2.load_in_place"})),
    Variant("replaces_parameter_objects", LORA, "load_adapter", _VALIDATE_LOAD + """
    for name, value in state.items():
        module_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(module_name), attr, nn.Parameter(value.clone()))
    """, frozenset({"3.2.load_in_place"})),
    Variant("loads_lora_A_only", LORA, "load_adapter", _VALIDATE_LOAD + """
    with torch.no_grad():
        for name, param in params.items():
            if name.endswith("lora_A"):
                param.copy_(state[name])
    """, frozenset({"3.2.load_restores"})),
    Variant("load_without_tensor_check", LORA, "load_adapter", """
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or not state:
        raise ValueError("no adapter tensors")
    params = {n: p for n, p in model.named_parameters() if n.rpartition(".")[2] in ADAPTER_PARAM_NAMES}
    if set(params) != set(state):
        raise ValueError("missing or extra keys")
    for name, param in params.items():
        if state[name].shape != param.shape:
            raise ValueError(f"bad shape for {name}")
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(state[name])
    """, frozenset({"3.2.load_rejects"}),
            hint="a value that is not a tensor (head.lora_B: 0): expected ValueError, got AttributeError"),
    # ---- 3.3 build_config / train_microbatch
    Variant("batch_size_without_world_size", ZERO, "build_config", _CONFIG_CHECKS + """
    return {"train_batch_size": micro_batch * grad_accum, "train_micro_batch_size_per_gpu": micro_batch,
            "gradient_accumulation_steps": grad_accum, "zero_optimization": {"stage": 2},
            "gradient_clipping": 0.0, "zero_allow_untested_optimizer": True,
            "fp16": {"enabled": precision == "fp16"}, "bf16": {"enabled": precision == "bf16"}}
    """, frozenset({"3.3.config", "3.3.config_hidden"})),
    Variant("clipping_left_at_default", ZERO, "build_config", _CONFIG_CHECKS + """
    return {"train_batch_size": world_size * micro_batch * grad_accum,
            "train_micro_batch_size_per_gpu": micro_batch, "gradient_accumulation_steps": grad_accum,
            "zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True,
            "fp16": {"enabled": precision == "fp16"}, "bf16": {"enabled": precision == "bf16"}}
    """, frozenset({"3.3.config", "3.3.config_hidden"})),
    Variant("no_config_validation", ZERO, "build_config", """
    return {"train_batch_size": world_size * micro_batch * grad_accum,
            "train_micro_batch_size_per_gpu": micro_batch, "gradient_accumulation_steps": grad_accum,
            "zero_optimization": {"stage": 2}, "gradient_clipping": 0.0, "zero_allow_untested_optimizer": True,
            "fp16": {"enabled": precision == "fp16"}, "bf16": {"enabled": precision == "bf16"}}
    """, frozenset({"3.3.config_errors"})),
    Variant("config_as_json_text", ZERO, "build_config", _CONFIG_CHECKS + """
    import json
    return json.dumps({"train_batch_size": world_size * micro_batch * grad_accum,
                       "train_micro_batch_size_per_gpu": micro_batch, "gradient_accumulation_steps": grad_accum,
                       "zero_optimization": {"stage": 2}, "gradient_clipping": 0.0,
                       "zero_allow_untested_optimizer": True, "fp16": {"enabled": precision == "fp16"},
                       "bf16": {"enabled": precision == "bf16"}})
    """, frozenset({"3.3.config", "3.3.config_hidden"}), hint="returned str, expected a dict"),
    Variant("size_compared_before_type_check", ZERO, "build_config", """
    for value in (world_size, micro_batch, grad_accum):
        if value < 1 or isinstance(value, (bool, float)):
            raise ValueError("bad size")
    if precision not in ("fp32", "fp16", "bf16"):
        raise ValueError("bad precision")
    return {"train_batch_size": world_size * micro_batch * grad_accum,
            "train_micro_batch_size_per_gpu": micro_batch, "gradient_accumulation_steps": grad_accum,
            "zero_optimization": {"stage": 2}, "gradient_clipping": 0.0, "zero_allow_untested_optimizer": True,
            "fp16": {"enabled": precision == "fp16"}, "bf16": {"enabled": precision == "bf16"}}
    """, frozenset({"3.3.config_errors"}), hint="got TypeError"),
    # Free (full marks): further ZeRO settings besides the stage, nothing offloaded, other top-level keys.
    Variant("zero_settings_added", ZERO, "build_config", _CONFIG_CHECKS + """
    return {"train_batch_size": world_size * micro_batch * grad_accum,
            "train_micro_batch_size_per_gpu": micro_batch, "gradient_accumulation_steps": grad_accum,
            "zero_optimization": {"stage": 2, "contiguous_gradients": True, "reduce_scatter": True,
                                  "offload_optimizer": {"device": "none"}},
            "gradient_clipping": 0, "zero_allow_untested_optimizer": True, "steps_per_print": 10 ** 9,
            "fp16": {"enabled": precision == "fp16"}, "bf16": {"enabled": precision == "bf16"}}
    """, frozenset()),
    Variant("microbatch_returns_tensor", ZERO, "train_microbatch", edited(ZERO, "train_microbatch", (
        "return float(loss.detach())", "return loss.detach()")),
            frozenset({"3.3.returns_loss"}), hint="expected a Python float"),
    Variant("loss_divided_by_accumulation_again", ZERO, "train_microbatch", edited(ZERO, "train_microbatch", (
        "engine.backward(loss)", "engine.backward(loss / engine.gradient_accumulation_steps())")),
            frozenset({"3.3.update"}), hint="likely cause: the loss divided by the accumulation steps"),
    Variant("microbatch_mse_instead_of_loss_fn", ZERO, "train_microbatch", edited(ZERO, "train_microbatch", (
        "loss = loss_fn(engine(inputs), targets)", "loss = torch.nn.functional.mse_loss(engine(inputs), targets)")),
            frozenset({"3.3.update"}), hint="likely cause: the loss was not computed with the given loss_fn"),
    Variant("steps_raw_optimizer", ZERO, "train_microbatch", edited(ZERO, "train_microbatch", (
        "engine.step()", "engine.optimizer.step()")),
            frozenset({"3.3.update", "3.3.returns_loss"})),     # DeepSpeed's optimizer raises: no loss comes back
]


# A build_config bug and a train_microbatch bug touch disjoint criteria (the update check trains with the
# grader's config), so such pairs share one 2-rank DeepSpeed spawn; every other variant runs alone.
PAIRED = [("batch_size_without_world_size", "loss_divided_by_accumulation_again"),
          ("clipping_left_at_default", "steps_raw_optimizer"),
          ("no_config_validation", "microbatch_mse_instead_of_loss_fn"),
          ("config_as_json_text", "microbatch_returns_tensor")]
_BY_NAME = {v.name: v for v in VARIANTS}
GROUPS = [tuple(_BY_NAME[n] for n in pair) for pair in PAIRED]
GROUPS += [(v,) for v in VARIANTS if not any(v.name in pair for pair in PAIRED)]


def _grade_group(group: tuple, work: Path, servers) -> dict:
    problems = {v.problem for v in group}
    assert len(problems) == 1 and len({(v.path, v.function) for v in group}) == len(group)
    if len(group) == 1:
        return grade_variant(group[0], problems.pop(), work, servers)
    problem = problems.pop()
    kit = make_variant_kit(work / "kit", [(v.path, v.function, v.body) for v in group])
    return {r.id: r for r in run_cases(all_cases((problem,)), kit, work / "runs", problem=problem,
                                                    servers=servers)}


@pytest.mark.kit
@pytest.mark.parametrize("group", GROUPS, ids=["+".join(v.name for v in g) for g in GROUPS])
def test_variant_loses_only_its_criteria(group, tmp_path, fork_servers):
    verdicts = _grade_group(group, tmp_path, fork_servers)
    assert_verdicts(verdicts, group)
    # init_engine keeps DeepSpeed from JIT-building its CPU shm op (DeepSpeed prints this line after any load).
    logs = list(tmp_path.glob("**/p3_zero_2rank/rank*.stdout"))
    assert logs or group[0].problem != "3.3", "no rank logs of the 3.3 case"
    for log in logs:
        assert "shm_comm_op built successfully" not in log.read_text(errors="replace"), log
