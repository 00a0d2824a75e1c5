"""Buggy variants of 2.3 (staff only, not released): each loses exactly the criteria and breaks the clauses it names."""
from grading.kit.variants import Clause, Variant, edited

GPT2 = "pipeline/gpt2.py"

# Most variants are the reference region with targeted edits (``edited``: each old text must occur once). Some were
# written with untyped locals (``_UNTYPED_LAYERS``) and keep that difference beside their bug.
_UNTYPED_LAYERS = ("layers: list[nn.Module] = [", "layers = [")

# A GPT-2 without the causal mask is still causal with ``sdpa`` attention (the training step uses it) but not with
# ``eager``, which both logits criteria also run.
VARIANTS = [
    Variant("blocks_without_causal_mask", GPT2, "forward", edited(GPT2, "forward", (
        "        mask = causal_mask(self.config, hidden_states)\n", ""), (", attention_mask=mask)", ")")),
        frozenset({"2.3.model_parallel", "2.3.pipeline_parallel", "2.3.more_stages_than_blocks"}),  # eager: acausal
        breaks=(Clause("35", "Blocks.forward", "causal mask for eager attention; tuple or tensor blocks",
                       "2.3.model_parallel"),
                Clause("35b", "Blocks.forward", "the pipeline_parallel logits equal the unsplit model",
                       "2.3.pipeline_parallel"))),
    Variant("zero_blocks_not_handled", GPT2, "forward", edited(GPT2, "forward", (
        "return hidden_states", "return out[0] if isinstance(out, tuple) else out")),
        frozenset({"2.3.more_stages_than_blocks"}),
        breaks=(Clause("35c", "Blocks.forward", "zero blocks return the input unchanged (more stages than blocks)",
                       "2.3.more_stages_than_blocks"),)),
    Variant("remainder_to_other_stages", GPT2, "gpt2_stages", edited(GPT2, "gpt2_stages", (
        "1 if k < extra else 0", "1 if k != extra else 0")), frozenset({"2.3.stages"}),
        breaks=(Clause("37a", "gpt2_stages", "... the `+1` goes to the first `n_layer % n` stages (4 blocks over 4 "
                       "stages: one each)", "2.3.stages"),)),
    Variant("extra_blocks_on_last_stage", GPT2, "gpt2_stages", edited(GPT2, "gpt2_stages", _UNTYPED_LAYERS, (
        "(1 if k < extra else 0)", "(1 if k >= len(devices) - extra else 0)")),
        frozenset({"2.3.stages", "2.3.stages_hidden"}),
        breaks=(Clause("37", "gpt2_stages", "embeddings first, blocks split n_layer//n (+1), head last, moved to its "
                       "device", "2.3.stages"),)),
    Variant("stages_not_moved", GPT2, "gpt2_stages", edited(GPT2, "gpt2_stages", _UNTYPED_LAYERS, (
        "nn.Sequential(*layers).to(device)", "nn.Sequential(*layers)")),
        frozenset({"2.3.stages", "2.3.stages_hidden"}),
        breaks=(Clause("37b", "gpt2_stages", "stage k moved with `.to(devices[k])` (devices `[cpu, meta, cpu]`: "
                       "honoured on a CPU-only machine)", "2.3.stages"),)),
    Variant("blocks_return_tuple", GPT2, "forward", edited(GPT2, "forward", (
        "return hidden_states", "return (hidden_states,)")),
        frozenset({"2.3.model_parallel", "2.3.pipeline_parallel", "2.3.more_stages_than_blocks",
                   "2.3.training_step", "2.3.stages_hidden"}), hint="Blocks.forward on hidden states of shape",
        breaks=(Clause("35d", "Blocks.forward", "returns a tensor of the input's shape, never a tuple",
                       "2.3.model_parallel"),)),
    Variant("stages_as_generator", GPT2, "gpt2_stages", edited(GPT2, "gpt2_stages", (
        "stages, start = [], 0", "start = 0"), _UNTYPED_LAYERS, (
        "stages.append(nn.Sequential(*layers).to(device))", "yield nn.Sequential(*layers).to(device)"), (
        "    return stages\n", "")),
        frozenset({"2.3.stages", "2.3.stages_hidden", "2.3.model_parallel", "2.3.pipeline_parallel",
                   "2.3.more_stages_than_blocks", "2.3.training_step"}), hint="returned generator, expected a list",
        breaks=(Clause("37d", "gpt2_stages", "returns a `list` of `nn.Sequential` (not a generator: the runtimes take "
                       "its length)", "2.3.stages"),)),
    Variant("empty_blocks_omitted", GPT2, "gpt2_stages", edited(GPT2, "gpt2_stages", (
        "layers: list[nn.Module] = [Blocks(blocks[start:start + count], model.config)]",
        "layers = [Blocks(blocks[start:start + count], model.config)] if count else []")),
            frozenset({"2.3.more_stages_than_blocks"}), hint="still holds an empty Blocks",
            breaks=(Clause("37c", "gpt2_stages", "a stage whose share is zero blocks still holds an empty `Blocks` "
                           "(degenerate case, own criterion)", "2.3.more_stages_than_blocks"),)),
    Variant("last_stage_compared_by_identity", GPT2, "gpt2_stages", edited(GPT2, "gpt2_stages", (
        "if k == len(devices) - 1:", "if k is len(devices) - 1:")),
            frozenset({"2.3.more_stages_than_blocks"}),
            hint="stage 299 holds ['Blocks'], expected ['Blocks', 'LMHead']",
            breaks=(Clause("37e", "gpt2_stages", "`LMHead(model)` ends stage `k == n - 1` for any n: over 300 devices "
                           "(a last index above 256, compared by value, not identity) stage 299 holds `Blocks` then "
                           "`LMHead`", "2.3.more_stages_than_blocks"),)),
    Variant("blocks_detach_their_input", GPT2, "forward", edited(GPT2, "forward", (
        "mask = causal_mask", "hidden_states = hidden_states.detach()\n        mask = causal_mask")),
        frozenset({"2.3.training_step"}),
        breaks=(Clause("36", "Blocks.forward", "gradients flow through the blocks", "2.3.training_step"),)),
]

NOT_GRADED = """Arguments only passed on between kit functions that no student region calls with another value
(`Blocks(..., model.config)` feeds `causal_mask`; the eager GPT-2 logits of 2.3.model_parallel show a wrong config's
missing mask). `Blocks.forward`'s mask "computed once" (a mask computed per block is the same mask: the outputs are
the same, only the time differs)."""
