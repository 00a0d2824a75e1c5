"""Problem 3 buggy variants: each bug loses exactly its intended criteria.

Most variants are the reference region with targeted edits (``edited``: each old text must occur once), so a
variant differs from the reference by its bug only; the few bugs that are a different, shorter body (saving every
weight, a lenient load, no validation) are written out whole.
"""
from pathlib import Path

import pytest

from grading.problems import all_cases
from grading.engine.runner import run_cases
from tests.kit.variants import Variant, assert_verdicts, edited, grade_variant, make_variant_kit, reference

LORA, ZERO = "finetune/lora.py", "finetune/zero.py"

_FREEZE = "    for param in model.parameters():\n        param.requires_grad_(False)\n"
_COPY = "    with torch.no_grad():\n        for name, param in params.items():\n            param.copy_(state[name])"
_CONFIG = reference(ZERO, "build_config")
_SORTED_KEYS = ("    # sorted as text: a file may hold int keys beside str ones, which do not compare\n"
                "    missing = sorted(params.keys() - state.keys(), key=str)\n"
                "    extra = sorted(state.keys() - params.keys(), key=str)\n")

VARIANTS = [
    # ---- 3.1 apply_lora
    Variant("mutate_before_validate", LORA, "apply_lora", edited(LORA, "apply_lora",   # freeze, then replace per check
        ("    modules = dict(", _FREEZE + "    modules = dict("), (_FREEZE + "    for name in names:\n", "")),
            frozenset({"3.1.validation"})),
    Variant("base_not_frozen", LORA, "apply_lora", edited(LORA, "apply_lora", (_FREEZE, "")),
            frozenset({"3.1.only_adapters_trainable", "3.1.replaces_targets_hidden"})),
    Variant("aliases_accepted", LORA, "apply_lora", edited(LORA, "apply_lora", (
        "dict(model.named_modules())", "dict(model.named_modules(remove_duplicate=False))")),
            frozenset({"3.1.validation"}), hint="'head_alias' after a valid one"),
    Variant("top_level_names_only", LORA, "apply_lora", edited(LORA, "apply_lora", (
        "dict(model.named_modules())", "dict(model.named_children())")),
            frozenset({"3.1.replaces_targets", "3.1.replaces_targets_hidden"})),
    Variant("casts_target_to_float32", LORA, "apply_lora", edited(LORA, "apply_lora", (
        "LoRALinear(modules[name], rank, alpha)", "LoRALinear(modules[name].float(), rank, alpha)")),
            frozenset({"3.1.outputs_dtype_device"})),
    Variant("rank_alpha_not_passed", LORA, "apply_lora", edited(LORA, "apply_lora", (
        "LoRALinear(modules[name], rank, alpha)", "LoRALinear(modules[name])")),
            frozenset({"3.1.replaces_targets", "3.1.replaces_targets_hidden"})),
    Variant("root_target_accepted", LORA, "apply_lora", edited(LORA, "apply_lora", (
        "if not name or name not in modules:", "if name not in modules:")),
            frozenset({"3.1.validation"}), hint="the model itself, an nn.Linear"),
    Variant("apply_lora_returns_none", LORA, "apply_lora", edited(LORA, "apply_lora", ("    return model\n", "")),
            frozenset({"3.1.replaces_targets", "3.1.replaces_targets_hidden"}),
            hint="returned NoneType, expected the model"),
    Variant("saves_base_weights", LORA, "save_adapter", """
    torch.save({name: p.detach().cpu().clone() for name, p in model.named_parameters()}, path)
    """, frozenset({"3.2.save_contents", "3.2.save_contents_hidden"})),
    Variant("saves_dotted_names_only", LORA, "save_adapter", edited(LORA, "save_adapter", (
        'if name.rpartition(".")[2] in ADAPTER_PARAM_NAMES', 'if name.endswith((".lora_A", ".lora_B"))')),
        frozenset({"3.2.save_contents", "3.2.save_contents_hidden"}),
        hint="save_adapter on a model that is itself a LoRALinear: the file holds [], expected the keys"),
    Variant("lenient_load", LORA, "load_adapter", """
    state = torch.load(path, map_location="cpu", weights_only=True)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in state.items():
            if name in params and params[name].shape == value.shape:
                params[name].copy_(value)
    """, frozenset({"3.2.load_rejects"})),
    Variant("assigns_param_data", LORA, "load_adapter", edited(LORA, "load_adapter", (
        _COPY, "    for name, param in params.items():\n        param.data = state[name]")),
            frozenset({"3.2.load_in_place"})),
    Variant("replaces_parameter_objects", LORA, "load_adapter", edited(LORA, "load_adapter", (_COPY, """\
    for name, value in state.items():
        module_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(module_name), attr, nn.Parameter(value.clone()))""")),
            frozenset({"3.2.load_in_place"})),
    Variant("loads_lora_A_only", LORA, "load_adapter", edited(LORA, "load_adapter", (
        "param.copy_(state[name])", 'if name.endswith("lora_A"):\n                param.copy_(state[name])')),
            frozenset({"3.2.load_restores"})),
    Variant("load_without_tensor_check", LORA, "load_adapter", edited(LORA, "load_adapter", (
        "if not isinstance(state[name], torch.Tensor) or state[name].shape", "if state[name].shape")),
            frozenset({"3.2.load_rejects"}),
            hint="a value that is not a tensor (head.lora_B: 0): expected ValueError, got AttributeError"),
    Variant("rank_one_refused", LORA, "apply_lora", edited(LORA, "apply_lora", (
        "if rank < 1:", "if rank < 2:")), frozenset({"3.1.outputs_dtype_device"})),
    Variant("shapes_compared_by_order", LORA, "load_adapter", edited(LORA, "load_adapter", (
        "state[name].shape != param.shape", "state[name].shape > param.shape")), frozenset({"3.2.load_rejects"})),
    Variant("load_unpickles_anything", LORA, "load_adapter", edited(LORA, "load_adapter", (
        'torch.load(path, map_location="cpu", weights_only=True)',
        'torch.load(path, map_location="cpu", weights_only=False)')),
            frozenset({"3.2.load_rejects"}), hint="the code ran (the file was unpickled with weights_only=False)"),
    Variant("duplicates_compared_by_identity", LORA, "apply_lora", edited(LORA, "apply_lora", (
        "if len(set(names)) != len(names):", "if len(set(names)) is not len(names):")),
            frozenset({"3.1.validation"}), hint="300 distinct names, expected no error, got ValueError"),
    Variant("saves_views_of_parameters", LORA, "save_adapter", edited(LORA, "save_adapter", (
        'param.detach().to("cpu", copy=True)', "param.detach().cpu()")),
            frozenset({"3.2.save_contents", "3.2.save_contents_hidden"}), hint="torch.save writes a tensor's whole"),
    Variant("load_sorts_mixed_keys", LORA, "load_adapter", edited(LORA, "load_adapter", (_SORTED_KEYS,
        "    missing, extra = sorted(params.keys() - state.keys()), sorted(state.keys() - params.keys())\n")),
            frozenset({"3.2.load_rejects"}), hint="extra keys of two types (0 and head.base.weight): expected "
            "ValueError, got TypeError"),
    Variant("load_checks_key_suffixes", LORA, "load_adapter", edited(LORA, "load_adapter", (_SORTED_KEYS,
        "    if any(key.rpartition('.')[2] not in ADAPTER_PARAM_NAMES for key in state):\n"
        "        raise ValueError('load_adapter: the file holds keys that name no adapter')\n" + _SORTED_KEYS)),
            frozenset({"3.2.load_rejects"}), hint="an int key (0) beside every adapter key: expected ValueError, "
            "got AttributeError"),
    Variant("load_sorts_symmetric_difference", LORA, "load_adapter", edited(LORA, "load_adapter", (
        _SORTED_KEYS + "    if missing or extra:\n", "    unmatched = sorted(params.keys() ^ state.keys())\n"
        "    if unmatched:\n"), ("missing keys {missing}, unexpected keys {extra}", "keys {unmatched} do not match")),
            frozenset({"3.2.load_rejects"}), hint="an int key (0) in place of a missing key (head.lora_B): expected "
            "ValueError, got TypeError"),
    # ---- 3.3 build_config / train_microbatch
    Variant("batch_size_without_world_size", ZERO, "build_config", edited(ZERO, "build_config", (
        "world_size * micro_batch * grad_accum", "micro_batch * grad_accum")),
            frozenset({"3.3.config", "3.3.config_hidden"})),
    Variant("clipping_left_at_default", ZERO, "build_config", edited(ZERO, "build_config", (
        '        "gradient_clipping": 0.0,\n', "")),
            frozenset({"3.3.config", "3.3.config_hidden"})),
    Variant("no_config_validation", ZERO, "build_config", "    return {" + _CONFIG.partition("    return {")[2],
            frozenset({"3.3.config_errors"})),                  # the reference's return statement alone
    Variant("config_as_json_text", ZERO, "build_config", edited(ZERO, "build_config", (
        "    return {", "    import json\n    return json.dumps({"), ("\n    }", "\n    })")),
            frozenset({"3.3.config", "3.3.config_hidden"}), hint="returned str, expected a dict"),
    Variant("size_compared_before_type_check", ZERO, "build_config", edited(ZERO, "build_config", (
        "isinstance(value, bool) or not isinstance(value, int) or value < 1",
        "value < 1 or isinstance(value, bool) or not isinstance(value, int)")),
            frozenset({"3.3.config_errors"}), hint="got TypeError"),
    # Free (full marks): further ZeRO settings besides the stage, nothing offloaded, an int clipping of 0,
    # other top-level keys.
    Variant("zero_settings_added", ZERO, "build_config", edited(ZERO, "build_config", (
        '"zero_optimization": {"stage": 2},', '"zero_optimization": {"stage": 2, "contiguous_gradients": True, '
        '"reduce_scatter": True,\n                              "offload_optimizer": {"device": "none"}},'), (
        '"gradient_clipping": 0.0,', '"gradient_clipping": 0,\n        "steps_per_print": 10 ** 9,')),
            frozenset()),
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
            frozenset({"3.3.update", "3.3.returns_loss", "3.3.engine_calls"}),   # DeepSpeed's optimizer raises
            hint="engine.step() was called 0 times"),
    # DeepSpeed 0.19's output hooks give a direct loss.backward() the same fp32 results: only the count shows it.
    Variant("loss_backward_instead_of_engine_backward", ZERO, "train_microbatch", edited(ZERO, "train_microbatch", (
        "engine.backward(loss)", "loss.backward()")),
            frozenset({"3.3.engine_calls"}), hint="engine.backward(loss) was called 0 times"),
]


# A build_config bug and a train_microbatch bug touch disjoint criteria (the update check trains with the
# grader's config), so such pairs share one 2-rank DeepSpeed spawn; every other variant runs alone.
PAIRED = [("batch_size_without_world_size", "loss_divided_by_accumulation_again"),
          ("clipping_left_at_default", "steps_raw_optimizer"),
          ("no_config_validation", "microbatch_mse_instead_of_loss_fn"),
          ("config_as_json_text", "microbatch_returns_tensor"),
          ("size_compared_before_type_check", "loss_backward_instead_of_engine_backward"),
          ("saves_views_of_parameters", "load_sorts_mixed_keys")]
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
