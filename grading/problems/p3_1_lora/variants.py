"""Buggy variants of 3.1 (staff only, never released): each loses exactly the criteria it names and breaks
the clauses it names."""
from grading.kit.variants import Clause, Variant, edited

LORA = "finetune/lora.py"

_FREEZE = "    for param in model.parameters():\n        param.requires_grad_(False)\n"

VARIANTS = [
    Variant("mutate_before_validate", LORA, "apply_lora", edited(LORA, "apply_lora",   # freeze, then replace per check
        ("    modules = dict(", _FREEZE + "    modules = dict("), (_FREEZE + "    for name in names:\n", "")),
            frozenset({"3.1.validation"}),
            breaks=(Clause("38", "apply_lora", "validate every target before mutating; ValueError for each bad input",
                           "3.1.validation"),)),
    Variant("base_not_frozen", LORA, "apply_lora", edited(LORA, "apply_lora", (_FREEZE, "")),
            frozenset({"3.1.only_adapters_trainable", "3.1.replaces_targets_hidden"}),
            breaks=(Clause("39", "apply_lora", "freeze every base parameter; only lora_A/lora_B trainable",
                           "3.1.only_adapters_trainable"),)),
    Variant("aliases_accepted", LORA, "apply_lora", edited(LORA, "apply_lora", (
        "dict(model.named_modules())", "dict(model.named_modules(remove_duplicate=False))")),
            frozenset({"3.1.validation"}), hint="'head_alias' after a valid one",
            breaks=(Clause("38c", "apply_lora", "a name `named_modules()` does not give is missing: the second name "
                           "of a module registered twice (`head_alias` for `head`) raises ValueError, model untouched",
                           "3.1.validation"),)),
    Variant("top_level_names_only", LORA, "apply_lora", edited(LORA, "apply_lora", (
        "dict(model.named_modules())", "dict(model.named_children())")),
            frozenset({"3.1.replaces_targets", "3.1.replaces_targets_hidden"}),
            breaks=(Clause("40", "apply_lora", "dotted names reach nested layers; the original layer is the base",
                           "3.1.replaces_targets"),)),
    Variant("casts_target_to_float32", LORA, "apply_lora", edited(LORA, "apply_lora", (
        "LoRALinear(modules[name], rank, alpha)", "LoRALinear(modules[name].float(), rank, alpha)")),
            frozenset({"3.1.outputs_dtype_device"}),
            breaks=(Clause("41", "apply_lora", "adapters keep the layer's device and dtype; outputs unchanged",
                           "3.1.outputs_dtype_device"),)),
    Variant("rank_alpha_not_passed", LORA, "apply_lora", edited(LORA, "apply_lora", (
        "LoRALinear(modules[name], rank, alpha)", "LoRALinear(modules[name])")),
            frozenset({"3.1.replaces_targets", "3.1.replaces_targets_hidden"}),
            breaks=(Clause("40b", "apply_lora", "`rank` and `alpha` passed to every `LoRALinear` (rank 3, alpha 6; "
                           "not the defaults)", "3.1.replaces_targets"),)),
    Variant("root_target_accepted", LORA, "apply_lora", edited(LORA, "apply_lora", (
        "if not name or name not in modules:", "if name not in modules:")),
            frozenset({"3.1.validation"}), hint="the model itself, an nn.Linear",
            breaks=(Clause("38b", "apply_lora", '`""` (the model itself, even an `nn.Linear`) is never a target: '
                           'ValueError, model untouched', "3.1.validation"),)),
    Variant("apply_lora_returns_none", LORA, "apply_lora", edited(LORA, "apply_lora", ("    return model\n", "")),
            frozenset({"3.1.replaces_targets", "3.1.replaces_targets_hidden"}),
            hint="returned NoneType, expected the model",
            breaks=(Clause("40c", "apply_lora", "returns `model` itself (the message names what came back)",
                           "3.1.replaces_targets"),)),
    Variant("rank_one_refused", LORA, "apply_lora", edited(LORA, "apply_lora", (
        "if rank < 1:", "if rank < 2:")), frozenset({"3.1.outputs_dtype_device"}),
        breaks=(Clause("38d", "apply_lora", "rank 1 is a rank (only rank < 1 is refused)",
                       "3.1.outputs_dtype_device"),)),
    Variant("duplicates_compared_by_identity", LORA, "apply_lora", edited(LORA, "apply_lora", (
        "if len(set(names)) != len(names):", "if len(set(names)) is not len(names):")),
            frozenset({"3.1.validation"}), hint="300 distinct names, expected no error, got ValueError",
            breaks=(Clause("38e", "apply_lora", "a name is a duplicate only when listed twice: 300 distinct targets "
                           "(an `nn.ModuleList` of 300 `nn.Linear(1, 1)`, names `'0'`..`'299'`) are all wrapped, no "
                           "ValueError (the lengths compared by value)", "3.1.validation"),)),
]
