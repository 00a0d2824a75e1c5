"""Buggy variants of 3.2 (staff only, never released): each loses exactly the criteria it names and breaks
the clauses it names."""
from grading.kit.variants import Clause, Variant, edited

LORA = "finetune/lora.py"

_COPY = "    with torch.no_grad():\n        for name, param in params.items():\n            param.copy_(state[name])"
_SORTED_KEYS = ("    # sorted as text: a file may hold int keys beside str ones, which do not compare\n"
                "    missing = sorted(params.keys() - state.keys(), key=str)\n"
                "    extra = sorted(state.keys() - params.keys(), key=str)\n")

VARIANTS = [
    Variant("saves_base_weights", LORA, "save_adapter", """
    torch.save({name: p.detach().cpu().clone() for name, p in model.named_parameters()}, path)
    """, frozenset({"3.2.save_contents", "3.2.save_contents_hidden"}),
            breaks=(Clause("42", "save_adapter", "only lora_A/lora_B, CPU, detached, weights_only loadable",
                           "3.2.save_contents"),)),
    Variant("saves_dotted_names_only", LORA, "save_adapter", edited(LORA, "save_adapter", (
        'if name.rpartition(".")[2] in ADAPTER_PARAM_NAMES', 'if name.endswith((".lora_A", ".lora_B"))')),
        frozenset({"3.2.save_contents", "3.2.save_contents_hidden"}),
        hint="save_adapter on a model that is itself a LoRALinear: the file holds [], expected the keys",
        breaks=(Clause("42b", "save_adapter", "the adapters are the parameters whose name's last dot-separated part "
                       "is `lora_A`/`lora_B`: a model that is itself a `LoRALinear` saves `lora_A` and `lora_B` (no "
                       "dot)", "3.2.save_contents"),)),
    Variant("lenient_load", LORA, "load_adapter", """
    state = torch.load(path, map_location="cpu", weights_only=True)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in state.items():
            if name in params and params[name].shape == value.shape:
                params[name].copy_(value)
    """, frozenset({"3.2.load_rejects"}),
            breaks=(Clause("43", "load_adapter", "ValueError before any change for a non-dict, empty, missing, extra, "
                           "mis-shaped file", "3.2.load_rejects"),)),
    Variant("assigns_param_data", LORA, "load_adapter", edited(LORA, "load_adapter", (
        _COPY, "    for name, param in params.items():\n        param.data = state[name]")),
            frozenset({"3.2.load_in_place"}),
            breaks=(Clause("44b", "load_adapter", "values cast to the parameter's dtype (copied into it)",
                           "3.2.load_in_place"),)),
    Variant("replaces_parameter_objects", LORA, "load_adapter", edited(LORA, "load_adapter", (_COPY, """\
    for name, value in state.items():
        module_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(module_name), attr, nn.Parameter(value.clone()))""")),
            frozenset({"3.2.load_in_place"}),
            breaks=(Clause("44", "load_adapter", "copy in place: the parameter objects stay", "3.2.load_in_place"),)),
    Variant("loads_lora_A_only", LORA, "load_adapter", edited(LORA, "load_adapter", (
        "param.copy_(state[name])", 'if name.endswith("lora_A"):\n                param.copy_(state[name])')),
            frozenset({"3.2.load_restores"}),
            breaks=(Clause("43b", "load_adapter", "every adapter value is copied: the outputs equal the source model's",
                           "3.2.load_restores"),)),
    Variant("load_without_tensor_check", LORA, "load_adapter", edited(LORA, "load_adapter", (
        "if not isinstance(state[name], torch.Tensor) or state[name].shape", "if state[name].shape")),
            frozenset({"3.2.load_rejects"}),
            hint="a value that is not a tensor (head.lora_B: 0): expected ValueError, got AttributeError",
            breaks=(Clause("43c", "load_adapter", "a dict value that is not a tensor: ValueError before any change "
                           "(not the AttributeError of reading its shape)", "3.2.load_rejects"),)),
    Variant("shapes_compared_by_order", LORA, "load_adapter", edited(LORA, "load_adapter", (
        "state[name].shape != param.shape", "state[name].shape > param.shape")), frozenset({"3.2.load_rejects"}),
        breaks=(Clause("43e", "load_adapter", "... a mis-shaped value that would broadcast into the parameter (one "
                       "row of lora_B) too", "3.2.load_rejects"),)),
    Variant("load_unpickles_anything", LORA, "load_adapter", edited(LORA, "load_adapter", (
        'torch.load(path, map_location="cpu", weights_only=True)',
        'torch.load(path, map_location="cpu", weights_only=False)')),
            frozenset({"3.2.load_rejects"}), hint="the code ran (the file was unpickled with weights_only=False)",
            breaks=(Clause("43d", "load_adapter", "opens the file with `weights_only=True`: a file whose pickle runs "
                           "code when loaded is refused and the code never runs", "3.2.load_rejects"),)),
    Variant("saves_views_of_parameters", LORA, "save_adapter", edited(LORA, "save_adapter", (
        'param.detach().to("cpu", copy=True)', "param.detach().cpu()")),
            frozenset({"3.2.save_contents", "3.2.save_contents_hidden"}), hint="torch.save writes a tensor's whole",
            breaks=(Clause("42c", "save_adapter", "each value a CPU copy of its own: on a model whose parameters are "
                           "views of one buffer (`torch.nn.utils.vector_to_parameters`, built on the CPU) every saved "
                           "tensor's storage holds only its own values (`torch.save` writes a whole storage: a view "
                           "would bring the base weights in)", "3.2.save_contents"),)),
    Variant("load_sorts_mixed_keys", LORA, "load_adapter", edited(LORA, "load_adapter", (_SORTED_KEYS,
        "    missing, extra = sorted(params.keys() - state.keys()), sorted(state.keys() - params.keys())\n")),
            frozenset({"3.2.load_rejects"}), hint="extra keys of two types (0 and head.base.weight): expected "
            "ValueError, got TypeError",
            breaks=(Clause("43h", "load_adapter", "... extra keys of two types (`0` and `head.base.weight`): "
                           "ValueError (not the TypeError of `sorted` on a mixed set, the old reference's bug)",
                           "3.2.load_rejects"),)),
    Variant("load_checks_key_suffixes", LORA, "load_adapter", edited(LORA, "load_adapter", (_SORTED_KEYS,
        "    if any(key.rpartition('.')[2] not in ADAPTER_PARAM_NAMES for key in state):\n"
        "        raise ValueError('load_adapter: the file holds keys that name no adapter')\n" + _SORTED_KEYS)),
            frozenset({"3.2.load_rejects"}), hint="an int key (0) beside every adapter key: expected ValueError, "
            "got AttributeError",
            breaks=(Clause("43f", "load_adapter", "an extra key of any type: `{0: tensor}` beside every adapter key "
                           "raises ValueError, model untouched (not the AttributeError of a str method called on the "
                           "key)", "3.2.load_rejects"),)),
    Variant("load_sorts_symmetric_difference", LORA, "load_adapter", edited(LORA, "load_adapter", (
        _SORTED_KEYS + "    if missing or extra:\n", "    unmatched = sorted(params.keys() ^ state.keys())\n"
        "    if unmatched:\n"), ("missing keys {missing}, unexpected keys {extra}", "keys {unmatched} do not match")),
            frozenset({"3.2.load_rejects"}), hint="an int key (0) in place of a missing key (head.lora_B): expected "
            "ValueError, got TypeError",
            breaks=(Clause("43g", "load_adapter", "... an int key in place of a missing one (`head.lora_B` missing, "
                           "`0` extra): ValueError (not the TypeError of sorting the missing and extra keys together)",
                           "3.2.load_rejects"),)),
]

NOT_GRADED = """
`load_adapter`'s `map_location="cpu"` and its cast to the parameter's *device* (every file and model is on the CPU
on a CPU grader; the 3.2 probe builds its models on the rank's device, so a GPU grader exercises the cast:
`python -m grading grade --problem 3.2` on a GPU, proposed for `scripts/gpu_check.sh`). "Returns None" of
`save_adapter` and `load_adapter` (no caller reads the value: one returned instead changes nothing).
"""
