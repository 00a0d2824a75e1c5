"""Buggy variants of 3.3 (staff only, never released): each loses exactly the criteria it names and breaks
the clauses it names."""
from grading.kit.variants import Clause, Variant, edited, reference

ZERO = "finetune/zero.py"

_CONFIG = reference(ZERO, "build_config")

VARIANTS = [
    Variant("batch_size_without_world_size", ZERO, "build_config", edited(ZERO, "build_config", (
        "world_size * micro_batch * grad_accum", "micro_batch * grad_accum")),
            frozenset({"3.3.config", "3.3.config_hidden"}),
            breaks=(Clause("45", "build_config", "train_batch_size = world x micro x accum (and the other entries, "
                           "exact)", "3.3.config"),)),
    Variant("clipping_left_at_default", ZERO, "build_config", edited(ZERO, "build_config", (
        '        "gradient_clipping": 0.0,\n', "")),
            frozenset({"3.3.config", "3.3.config_hidden"}),
            breaks=(Clause("46", "build_config", "gradient_clipping 0.0", "3.3.config"),)),
    Variant("no_config_validation", ZERO, "build_config", "    return {" + _CONFIG.partition("    return {")[2],
            frozenset({"3.3.config_errors"}),                  # the reference's return statement alone
            breaks=(Clause("47", "build_config", "ValueError for sizes that are not ints >= 1 (bools, floats) or an "
                           "unknown precision", "3.3.config_errors"),)),
    Variant("config_as_json_text", ZERO, "build_config", edited(ZERO, "build_config", (
        "    return {", "    import json\n    return json.dumps({"), ("\n    }", "\n    })")),
            frozenset({"3.3.config", "3.3.config_hidden"}), hint="returned str, expected a dict",
            breaks=(Clause("45b", "build_config", "returns the config as a `dict`, not its JSON text", "3.3.config"),)),
    Variant("size_compared_before_type_check", ZERO, "build_config", edited(ZERO, "build_config", (
        "isinstance(value, bool) or not isinstance(value, int) or value < 1",
        "value < 1 or isinstance(value, bool) or not isinstance(value, int)")),
            frozenset({"3.3.config_errors"}), hint="got TypeError",
            breaks=(Clause("47b", "build_config", 'a size that is not an int (`"2"`): ValueError, never a TypeError '
                           'from comparing it', "3.3.config_errors"),)),
    # Free (full marks): further ZeRO settings besides the stage, nothing offloaded, an int clipping of 0,
    # other top-level keys.
    Variant("zero_settings_added", ZERO, "build_config", edited(ZERO, "build_config", (
        '"zero_optimization": {"stage": 2},', '"zero_optimization": {"stage": 2, "contiguous_gradients": True, '
        '"reduce_scatter": True,\n                              "offload_optimizer": {"device": "none"}},'), (
        '"gradient_clipping": 0.0,', '"gradient_clipping": 0,\n        "steps_per_print": 10 ** 9,')),
            frozenset()),
    Variant("microbatch_returns_tensor", ZERO, "train_microbatch", edited(ZERO, "train_microbatch", (
        "return float(loss.detach())", "return loss.detach()")),
            frozenset({"3.3.returns_loss"}), hint="expected a Python float",
            breaks=(Clause("49c", "train_microbatch", "returns the micro-batch loss as a Python float, as `loss_fn` "
                           "gave it (undivided)", "3.3.returns_loss"),)),
    Variant("loss_divided_by_accumulation_again", ZERO, "train_microbatch", edited(ZERO, "train_microbatch", (
        "engine.backward(loss)", "engine.backward(loss / engine.gradient_accumulation_steps())")),
            frozenset({"3.3.update"}), hint="likely cause: the loss divided by the accumulation steps",
            breaks=(Clause("48", "train_microbatch", "DeepSpeed owns accumulation: no extra division of the loss",
                           "3.3.update"),)),
    Variant("microbatch_mse_instead_of_loss_fn", ZERO, "train_microbatch", edited(ZERO, "train_microbatch", (
        "loss = loss_fn(engine(inputs), targets)", "loss = torch.nn.functional.mse_loss(engine(inputs), targets)")),
            frozenset({"3.3.update"}), hint="likely cause: the loss was not computed with the given loss_fn",
            breaks=(Clause("49b", "train_microbatch", "`loss = loss_fn(outputs, targets)` with the given `loss_fn` "
                           "(MSE's value, not its gradient)", "3.3.update"),)),
    Variant("steps_raw_optimizer", ZERO, "train_microbatch", edited(ZERO, "train_microbatch", (
        "engine.step()", "engine.optimizer.step()")),
            frozenset({"3.3.update", "3.3.returns_loss", "3.3.engine_calls"}),   # DeepSpeed's optimizer raises
            hint="engine.step() was called 0 times",
            breaks=(Clause("48c", "train_microbatch", "... `engine.step()`, not the raw optimizer's `step()`",
                           "3.3.engine_calls"),
                    Clause("49", "train_microbatch", "never step the raw optimizer", "3.3.update"))),
    # DeepSpeed 0.19's output hooks give a direct loss.backward() the same fp32 results: only the count shows it.
    Variant("loss_backward_instead_of_engine_backward", ZERO, "train_microbatch", edited(ZERO, "train_microbatch", (
        "engine.backward(loss)", "loss.backward()")),
            frozenset({"3.3.engine_calls"}), hint="engine.backward(loss) was called 0 times",
            breaks=(Clause("48b", "train_microbatch", "`engine.backward(loss)` and `engine.step()`, each exactly once "
                           "per call (counted on the real engine's instance; DeepSpeed 0.19's output hooks give a "
                           "direct `loss.backward()` the same fp32 results, but an fp16 engine refuses it)",
                           "3.3.engine_calls"),)),
]

NOT_GRADED = """
Freedoms: `build_config` may put further ZeRO settings in `zero_optimization` (an offload with `"device": "none"`
included), other top-level keys and `gradient_clipping` as `0` or `0.0` (the full-marks variant
`zero_settings_added` in this folder's variants.py proves it).
"""
