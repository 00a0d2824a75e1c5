"""Problem 2 buggy variants: each bug loses exactly its intended criteria.

Most variants are the reference region with targeted edits (``edited``: each old text must occur once). Some were
written with untyped locals (``_UNTYPED``, ``_UNTYPED_LAYERS``) and keep that difference beside their bug.

The 2.2 probe runs the grader's own schedule, so schedule bugs cost 2.1 only.
A late-binding lambda computes wrong numbers, which necessarily shows in the
outputs and in the gradients: it costs both value criteria of 2.2. A GPT-2
without the causal mask is still causal with ``sdpa`` attention (the training
step uses it) but not with ``eager``, which both logits criteria also run.
"""
import pytest

from tests.kit.variants import Variant, assert_verdicts, edited, grade_variant

SCHEDULE, PARTITION = "pipeline/schedule.py", "pipeline/partition.py"
PIPE, GPT2 = "pipeline/pipe.py", "pipeline/gpt2.py"

GOOD_TASK = "lambda i=i, j=j, xb=batches[i]: self.stages[j](xb.to(self.devices[j]))"
_TYPED_LOCALS = """groups: list[list[nn.Module]] = []
    devices: list[torch.device] = []
    pending: list[nn.Module] = []           # parameterless layers before the first device"""
_UNTYPED = (_TYPED_LOCALS, "groups, devices, pending = [], [], []")
_WITH_DEVICE = """if isinstance(layer, WithDevice):
            device, layer = layer.device, layer.module.to(layer.device)
        else:
            device = layer_device(layer)"""
_UNTYPED_LAYERS = ("layers: list[nn.Module] = [", "layers = [")

VARIANTS = [
    Variant("reversed_wave_order", SCHEDULE, "clock_cycles", """
        if microbatches < 0 or stages < 1:
            raise ValueError("bad schedule size")
        for k in range(microbatches + stages - 1 if microbatches else 0):
            yield [(k - j, j) for j in reversed(range(stages)) if 0 <= k - j < microbatches]
    """, frozenset({"2.1.clock_cycles", "2.1.clock_cycles_hidden"})),
    Variant("extra_empty_wave", SCHEDULE, "clock_cycles", """
        if microbatches < 0 or stages < 1:
            raise ValueError("bad schedule size")
        for k in range(microbatches + stages if microbatches else 0):
            yield [(k - j, j) for j in range(stages) if 0 <= k - j < microbatches]
    """, frozenset({"2.1.clock_cycles", "2.1.clock_cycles_hidden"})),
    Variant("empty_waves_for_zero_microbatches", SCHEDULE, "clock_cycles", """
        if microbatches < 0 or stages < 1:
            raise ValueError("bad schedule size")
        for k in range(microbatches + stages - 1):
            yield [(k - j, j) for j in range(stages) if 0 <= k - j < microbatches]
    """, frozenset({"2.1.clock_cycles_empty"})),
    Variant("drops_partial_last_microbatch", PIPE, "forward", edited(PIPE, "forward", (
        "batches = list(torch.split(x, self.split_size))", """count = max(len(x) // self.split_size, 1)
        batches = [x[k * self.split_size:(k + 1) * self.split_size] for k in range(count)]"""),
        ("torch.cat(batches).to(self.devices[-1])", "torch.cat(batches)")),
        frozenset({"2.2.forward_uneven", "2.2.forward_hidden"})),
    Variant("with_device_ignored", PARTITION, "split_module", edited(PARTITION, "split_module", _UNTYPED, (
        _WITH_DEVICE, "device = layer_device(layer)")), frozenset({"2.1.with_device"})),
    Variant("late_binding_lambda", PIPE, "forward", edited(PIPE, "forward", (
        GOOD_TASK, "lambda: self.stages[j](batches[i].to(self.devices[j]))")),
        frozenset({"2.2.forward", "2.2.backward", "2.2.forward_hidden", "2.2.forward_uneven"}),
        hint="likely cause: a late-binding closure"),
    # allowed forms of binding (full marks): the index bound, the micro-batch read when the task runs; a partial;
    # a closure returned by a helper
    Variant("micro_batch_read_when_run", PIPE, "forward", edited(PIPE, "forward", (
        GOOD_TASK, "lambda i=i, j=j: self.stages[j](batches[i].to(self.devices[j]))")), frozenset()),
    Variant("task_from_partial", PIPE, "forward", edited(PIPE, "forward", (
        f"self.workers.submit(j, {GOOD_TASK})", """self.workers.submit(j, functools.partial(
                    lambda xb, j: self.stages[j](xb.to(self.devices[j])), batches[i], j))"""), (
        "batches = list(", "import functools\n        batches = list(")), frozenset()),
    Variant("task_from_helper_closure", PIPE, "forward", edited(PIPE, "forward", (
        f"self.workers.submit(j, {GOOD_TASK})", "self.workers.submit(j, task(self.stages[j], self.devices[j], "
        "batches[i]))"), ("batches = list(", """def task(stage, device, xb):
            return lambda: stage(xb.to(device))
        batches = list(""")), frozenset()),
    Variant("receive_right_after_submit", PIPE, "forward", edited(PIPE, "forward", (
        "            for i, j in wave:\n                batches[i] = self.workers.receive(j)",
        "                batches[i] = self.workers.receive(j)")), frozenset({"2.2.wave_dispatch"})),
    Variant("detach_between_stages", PIPE, "forward", edited(PIPE, "forward", (
        "self.stages[j](xb.to(", "self.stages[j]((xb if j == 0 else xb.detach()).to(")), frozenset({"2.2.backward"})),
    Variant("result_on_input_device", PIPE, "forward", edited(PIPE, "forward", (
        "torch.cat(batches).to(self.devices[-1])", "torch.cat(batches).to(x.device)")),
        frozenset({"2.2.output_on_last_device"})),
    Variant("blocks_without_causal_mask", GPT2, "forward", edited(GPT2, "forward", (
        "        mask = causal_mask(self.config, hidden_states)\n", ""), (", attention_mask=mask)", ")")),
        frozenset({"2.3.model_parallel", "2.3.pipeline_parallel", "2.3.more_stages_than_blocks"})),  # eager: acausal
    Variant("zero_blocks_not_handled", GPT2, "forward", edited(GPT2, "forward", (
        "return hidden_states", "return out[0] if isinstance(out, tuple) else out")),
        frozenset({"2.3.more_stages_than_blocks"})),
    Variant("moves_input_in_caller", PIPE, "forward", edited(PIPE, "forward", (
        GOOD_TASK, "lambda i=i, j=j, xb=batches[i].to(self.devices[j]): self.stages[j](xb)")),
        frozenset({"2.2.moves_in_worker"})),
    Variant("output_moved_instead_of_input", PIPE, "forward", edited(PIPE, "forward", (
        GOOD_TASK, "lambda i=i, j=j, xb=batches[i]: self.stages[j](xb).to(self.devices[j])")),
        frozenset({"2.2.moves_in_worker"}), hint="the second stage received its input on cpu"),
    Variant("moved_copy_discarded", PIPE, "forward", edited(PIPE, "forward", (
        f"self.workers.submit(j, {GOOD_TASK})", """def task(i=i, j=j, xb=batches[i]):
                    xb.to(self.devices[j])          # Tensor.to is not in place: the stage gets xb as it was
                    return self.stages[j](xb)
                self.workers.submit(j, task)""")),
        frozenset({"2.2.moves_in_worker"}), hint="the second stage received its input on cpu"),
    Variant("input_moved_by_previous_stage", PIPE, "forward", edited(PIPE, "forward", (GOOD_TASK, (
        "lambda i=i, j=j, xb=batches[i]: self.stages[j](xb if j else xb.to(self.devices[0]))"
        ".to(self.devices[min(j + 1, len(self.devices) - 1)])"))),
        frozenset({"2.2.moves_in_worker"}), hint="expected only that stage's own worker 'pipeline-stage-1'"),
    Variant("empty_sequential_one_stage", PARTITION, "split_module", edited(PARTITION, "split_module", _UNTYPED, (
        "if pending:", "if pending or not groups:")), frozenset({"2.1.split_module"})),
    Variant("remainder_to_other_stages", GPT2, "gpt2_stages", edited(GPT2, "gpt2_stages", (
        "1 if k < extra else 0", "1 if k != extra else 0")), frozenset({"2.3.stages"})),
    Variant("extra_blocks_on_last_stage", GPT2, "gpt2_stages", edited(GPT2, "gpt2_stages", _UNTYPED_LAYERS, (
        "(1 if k < extra else 0)", "(1 if k >= len(devices) - extra else 0)")),
        frozenset({"2.3.stages", "2.3.stages_hidden"})),
    Variant("stages_not_moved", GPT2, "gpt2_stages", edited(GPT2, "gpt2_stages", _UNTYPED_LAYERS, (
        "nn.Sequential(*layers).to(device)", "nn.Sequential(*layers)")),
        frozenset({"2.3.stages", "2.3.stages_hidden"})),
    Variant("schedule_without_validation", SCHEDULE, "clock_cycles", """
        for k in range(microbatches + stages - 1 if microbatches > 0 else 0):
            yield [(k - j, j) for j in range(stages) if 0 <= k - j < microbatches]
    """, frozenset({"2.1.clock_cycles_errors"})),
    Variant("leading_parameterless_layers_dropped", PARTITION, "split_module", edited(PARTITION, "split_module", (
        _TYPED_LOCALS, "groups, devices = [], []"), ("pending.append(layer)", "continue"),
        ("groups.append(pending + [layer])", "groups.append([layer])"), ("            pending = []\n", ""),
        ("    if pending:\n        groups.append(pending)\n        devices.append(_CPU)\n", "")),
        frozenset({"2.1.split_module"})),
    Variant("first_parameter_decides_device", PARTITION, "split_module", edited(PARTITION, "split_module", _UNTYPED, (
        "device = layer_device(layer)", "device = next((p.device for p in layer.parameters()), None)"), (
        "devices.append(_CPU)", 'devices.append(torch.device("cpu"))')), frozenset({"2.1.split_spanning"})),
    Variant("stage_computed_in_the_caller", PIPE, "forward", edited(PIPE, "forward", (
        GOOD_TASK, "lambda out=self.stages[j](batches[i].to(self.devices[j])): out")),
        frozenset({"2.2.stage_exception", "2.2.moves_in_worker"})),
    Variant("waves_as_generators", SCHEDULE, "clock_cycles", """
        if microbatches < 0 or stages < 1:
            raise ValueError("bad schedule size")
        for k in range(microbatches + stages - 1 if microbatches else 0):
            yield ((k - j, j) for j in range(stages) if 0 <= k - j < microbatches)
    """, frozenset({"2.1.clock_cycles", "2.1.clock_cycles_hidden"}), hint="yielded generator as cycle 0"),
    Variant("schedule_as_list", SCHEDULE, "clock_cycles", """
        if microbatches < 0 or stages < 1:
            raise ValueError("bad schedule size")
        return [[(k - j, j) for j in range(stages) if 0 <= k - j < microbatches]
                for k in range(microbatches + stages - 1 if microbatches else 0)]
    """, frozenset()),      # allowed: the cycles as a list instead of a generator (full marks)
    Variant("partitions_as_lists", PARTITION, "split_module", edited(PARTITION, "split_module", (
        "return [nn.Sequential(*group) for group in groups], devices", "return groups, devices")),
            frozenset({"2.1.split_module", "2.1.with_device"}), hint="partitions must be nn.Sequential, got ['list'"),
    Variant("buffers_decide_device", PARTITION, "split_module", edited(PARTITION, "split_module", (
        "            device = layer_device(layer)\n",
        "            found = {t.device for t in [*layer.parameters(), *layer.buffers()]}\n"
        "            device = found.pop() if len(found) == 1 else layer_device(layer)\n")),
            frozenset({"2.1.split_module"}), hint="buffers but no parameters"),
    Variant("spanning_error_without_names", PARTITION, "split_module", edited(PARTITION, "split_module", _UNTYPED, (
        "device = layer_device(layer)", """found = {p.device for p in layer.parameters()}
            if len(found) > 1:
                raise ValueError("a layer spans several devices")
            device = found.pop() if found else None""")),
        frozenset({"2.1.split_spanning"}), hint="must name the layer's class and its devices"),
    Variant("returns_microbatch_outputs", PIPE, "forward", edited(PIPE, "forward", (
        "return torch.cat(batches).to(self.devices[-1])", "return batches")),
            frozenset({"2.2.forward", "2.2.forward_hidden", "2.2.forward_uneven", "2.2.output_on_last_device",
                       "2.2.backward"}), hint="Pipe.forward returned list of"),
    Variant("blocks_return_tuple", GPT2, "forward", edited(GPT2, "forward", (
        "return hidden_states", "return (hidden_states,)")),
        frozenset({"2.3.model_parallel", "2.3.pipeline_parallel", "2.3.more_stages_than_blocks",
                   "2.3.training_step", "2.3.stages_hidden"}), hint="Blocks.forward on hidden states of shape"),
    Variant("stages_as_generator", GPT2, "gpt2_stages", edited(GPT2, "gpt2_stages", (
        "stages, start = [], 0", "start = 0"), _UNTYPED_LAYERS, (
        "stages.append(nn.Sequential(*layers).to(device))", "yield nn.Sequential(*layers).to(device)"), (
        "    return stages\n", "")),
        frozenset({"2.3.stages", "2.3.stages_hidden", "2.3.model_parallel", "2.3.pipeline_parallel",
                   "2.3.more_stages_than_blocks", "2.3.training_step"}), hint="returned generator, expected a list"),
    Variant("empty_blocks_omitted", GPT2, "gpt2_stages", edited(GPT2, "gpt2_stages", (
        "layers: list[nn.Module] = [Blocks(blocks[start:start + count], model.config)]",
        "layers = [Blocks(blocks[start:start + count], model.config)] if count else []")),
            frozenset({"2.3.more_stages_than_blocks"}), hint="still holds an empty Blocks"),
    Variant("last_stage_compared_by_identity", GPT2, "gpt2_stages", edited(GPT2, "gpt2_stages", (
        "if k == len(devices) - 1:", "if k is len(devices) - 1:")),
            frozenset({"2.3.more_stages_than_blocks"}),
            hint="stage 299 holds ['Blocks'], expected ['Blocks', 'LMHead']"),
    Variant("blocks_detach_their_input", GPT2, "forward", edited(GPT2, "forward", (
        "mask = causal_mask", "hidden_states = hidden_states.detach()\n        mask = causal_mask")),
        frozenset({"2.3.training_step"})),
]


@pytest.mark.kit
@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
def test_variant_loses_only_its_criteria(variant, tmp_path, fork_servers):
    assert_verdicts(grade_variant(variant, variant.problem, tmp_path, fork_servers), [variant])
