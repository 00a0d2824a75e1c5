"""Problem 2 buggy variants: each bug loses exactly its intended criteria.

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


def _pipe_forward(submit: str, receive: str = "batches[i] = self.workers.receive(j)",
                  result: str = "torch.cat(batches).to(self.devices[-1])") -> str:
    """A Pipe.forward body with one line changed."""
    return f"""
        batches = list(torch.split(x, self.split_size))
        for wave in schedule.clock_cycles(len(batches), len(self.stages)):
            for i, j in wave:
                self.workers.submit(j, {submit})
            for i, j in wave:
                {receive}
        return {result}
    """


GOOD_TASK = "lambda i=i, j=j, xb=batches[i]: self.stages[j](xb.to(self.devices[j]))"

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
    Variant("drops_partial_last_microbatch", PIPE, "forward", """
        count = max(len(x) // self.split_size, 1)
        batches = [x[k * self.split_size:(k + 1) * self.split_size] for k in range(count)]
        for wave in schedule.clock_cycles(len(batches), len(self.stages)):
            for i, j in wave:
                self.workers.submit(j, lambda i=i, j=j, xb=batches[i]: self.stages[j](xb.to(self.devices[j])))
            for i, j in wave:
                batches[i] = self.workers.receive(j)
        return torch.cat(batches)
    """, frozenset({"2.2.forward_uneven", "2.2.forward_hidden"})),
    Variant("with_device_ignored", PARTITION, "split_module", """
        groups, devices, pending = [], [], []
        for layer in module.children():
            device = layer_device(layer)
            if device is None and groups:
                groups[-1].append(layer)
            elif device is None:
                pending.append(layer)
            elif devices and devices[-1] == device:
                groups[-1].append(layer)
            else:
                groups.append(pending + [layer])
                devices.append(device)
                pending = []
        if pending:
            groups.append(pending)
            devices.append(_CPU)
        return [nn.Sequential(*group) for group in groups], devices
    """, frozenset({"2.1.with_device"})),
    Variant("late_binding_lambda", PIPE, "forward",
            _pipe_forward("lambda: self.stages[j](batches[i].to(self.devices[j]))"),
            frozenset({"2.2.forward", "2.2.backward", "2.2.forward_hidden", "2.2.forward_uneven"}),
            hint="likely cause: a late-binding closure"),
    Variant("receive_right_after_submit", PIPE, "forward", """
        batches = list(torch.split(x, self.split_size))
        for wave in schedule.clock_cycles(len(batches), len(self.stages)):
            for i, j in wave:
                self.workers.submit(j, lambda i=i, j=j, xb=batches[i]: self.stages[j](xb.to(self.devices[j])))
                batches[i] = self.workers.receive(j)
        return torch.cat(batches).to(self.devices[-1])
    """, frozenset({"2.2.wave_dispatch"})),
    Variant("detach_between_stages", PIPE, "forward",
            _pipe_forward("lambda i=i, j=j, xb=batches[i]: self.stages[j]((xb if j == 0 else xb.detach())"
                          ".to(self.devices[j]))"),
            frozenset({"2.2.backward"})),
    Variant("result_on_input_device", PIPE, "forward",
            _pipe_forward(GOOD_TASK, result="torch.cat(batches).to(x.device)"),
            frozenset({"2.2.output_on_last_device"})),
    Variant("blocks_without_causal_mask", GPT2, "forward", """
        for block in self.blocks:
            out = block(hidden_states)
            hidden_states = out[0] if isinstance(out, tuple) else out
        return hidden_states
    """, frozenset({"2.3.model_parallel", "2.3.pipeline_parallel", "2.3.more_stages_than_blocks"})),  # eager: acausal
    Variant("zero_blocks_not_handled", GPT2, "forward", """
        mask = causal_mask(self.config, hidden_states)
        for block in self.blocks:
            out = block(hidden_states, attention_mask=mask)
            hidden_states = out[0] if isinstance(out, tuple) else out
        return out[0] if isinstance(out, tuple) else out
    """, frozenset({"2.3.more_stages_than_blocks"})),
    Variant("moves_input_in_caller", PIPE, "forward",
            _pipe_forward("lambda i=i, j=j, xb=batches[i].to(self.devices[j]): self.stages[j](xb)"),
            frozenset({"2.2.moves_in_worker"})),
    Variant("empty_sequential_one_stage", PARTITION, "split_module", """
        groups, devices, pending = [], [], []
        for layer in module.children():
            if isinstance(layer, WithDevice):
                device, layer = layer.device, layer.module.to(layer.device)
            else:
                device = layer_device(layer)
            if device is None and groups:
                groups[-1].append(layer)
            elif device is None:
                pending.append(layer)
            elif devices and devices[-1] == device:
                groups[-1].append(layer)
            else:
                groups.append(pending + [layer])
                devices.append(device)
                pending = []
        if pending or not groups:
            groups.append(pending)
            devices.append(_CPU)
        return [nn.Sequential(*group) for group in groups], devices
    """, frozenset({"2.1.split_module"})),
    Variant("extra_blocks_on_last_stage", GPT2, "gpt2_stages", """
        blocks = list(model.transformer.h)
        base, extra = divmod(len(blocks), len(devices))
        stages, start = [], 0
        for k, device in enumerate(devices):
            count = base + (1 if k >= len(devices) - extra else 0)
            layers = [Blocks(blocks[start:start + count], model.config)]
            start += count
            if k == 0:
                layers.insert(0, Embeddings(model))
            if k == len(devices) - 1:
                layers.append(LMHead(model))
            stages.append(nn.Sequential(*layers).to(device))
        return stages
    """, frozenset({"2.3.stages", "2.3.stages_hidden"})),
    Variant("stages_not_moved", GPT2, "gpt2_stages", """
        blocks = list(model.transformer.h)
        base, extra = divmod(len(blocks), len(devices))
        stages, start = [], 0
        for k, device in enumerate(devices):
            count = base + (1 if k < extra else 0)
            layers = [Blocks(blocks[start:start + count], model.config)]
            start += count
            if k == 0:
                layers.insert(0, Embeddings(model))
            if k == len(devices) - 1:
                layers.append(LMHead(model))
            stages.append(nn.Sequential(*layers))
        return stages
    """, frozenset({"2.3.stages", "2.3.stages_hidden"})),
    Variant("schedule_without_validation", SCHEDULE, "clock_cycles", """
        for k in range(microbatches + stages - 1 if microbatches > 0 else 0):
            yield [(k - j, j) for j in range(stages) if 0 <= k - j < microbatches]
    """, frozenset({"2.1.clock_cycles_errors"})),
    Variant("leading_parameterless_layers_dropped", PARTITION, "split_module", """
        groups, devices = [], []
        for layer in module.children():
            if isinstance(layer, WithDevice):
                device, layer = layer.device, layer.module.to(layer.device)
            else:
                device = layer_device(layer)
            if device is None and groups:
                groups[-1].append(layer)
            elif device is None:
                continue
            elif devices and devices[-1] == device:
                groups[-1].append(layer)
            else:
                groups.append([layer])
                devices.append(device)
        return [nn.Sequential(*group) for group in groups], devices
    """, frozenset({"2.1.split_module"})),
    Variant("first_parameter_decides_device", PARTITION, "split_module", """
        groups, devices, pending = [], [], []
        for layer in module.children():
            if isinstance(layer, WithDevice):
                device, layer = layer.device, layer.module.to(layer.device)
            else:
                device = next((p.device for p in layer.parameters()), None)
            if device is None and groups:
                groups[-1].append(layer)
            elif device is None:
                pending.append(layer)
            elif devices and devices[-1] == device:
                groups[-1].append(layer)
            else:
                groups.append(pending + [layer])
                devices.append(device)
                pending = []
        if pending:
            groups.append(pending)
            devices.append(torch.device("cpu"))
        return [nn.Sequential(*group) for group in groups], devices
    """, frozenset({"2.1.split_spanning"})),
    Variant("stage_computed_in_the_caller", PIPE, "forward",
            _pipe_forward("lambda out=self.stages[j](batches[i].to(self.devices[j])): out"),
            frozenset({"2.2.stage_exception", "2.2.moves_in_worker"})),
    Variant("waves_as_generators", SCHEDULE, "clock_cycles", """
        if microbatches < 0 or stages < 1:
            raise ValueError("bad schedule size")
        for k in range(microbatches + stages - 1 if microbatches else 0):
            yield ((k - j, j) for j in range(stages) if 0 <= k - j < microbatches)
    """, frozenset({"2.1.clock_cycles", "2.1.clock_cycles_hidden"}), hint="yielded generator as cycle 0"),
    Variant("partitions_as_lists", PARTITION, "split_module", edited(PARTITION, "split_module", (
        "return [nn.Sequential(*group) for group in groups], devices", "return groups, devices")),
            frozenset({"2.1.split_module", "2.1.with_device"}), hint="partitions must be nn.Sequential, got ['list'"),
    Variant("buffers_decide_device", PARTITION, "split_module", edited(PARTITION, "split_module", (
        "            device = layer_device(layer)\n",
        "            found = {t.device for t in [*layer.parameters(), *layer.buffers()]}\n"
        "            device = found.pop() if len(found) == 1 else layer_device(layer)\n")),
            frozenset({"2.1.split_module"}), hint="buffers but no parameters"),
    Variant("spanning_error_without_names", PARTITION, "split_module", """
        groups, devices, pending = [], [], []
        for layer in module.children():
            if isinstance(layer, WithDevice):
                device, layer = layer.device, layer.module.to(layer.device)
            else:
                found = {p.device for p in layer.parameters()}
                if len(found) > 1:
                    raise ValueError("a layer spans several devices")
                device = found.pop() if found else None
            if device is None and groups:
                groups[-1].append(layer)
            elif device is None:
                pending.append(layer)
            elif devices and devices[-1] == device:
                groups[-1].append(layer)
            else:
                groups.append(pending + [layer])
                devices.append(device)
                pending = []
        if pending:
            groups.append(pending)
            devices.append(_CPU)
        return [nn.Sequential(*group) for group in groups], devices
    """, frozenset({"2.1.split_spanning"}), hint="must name the layer's class and its devices"),
    Variant("returns_microbatch_outputs", PIPE, "forward", _pipe_forward(GOOD_TASK, result="batches"),
            frozenset({"2.2.forward", "2.2.forward_hidden", "2.2.forward_uneven", "2.2.output_on_last_device",
                       "2.2.backward"}), hint="Pipe.forward returned list of"),
    Variant("blocks_return_tuple", GPT2, "forward", """
        mask = causal_mask(self.config, hidden_states)
        for block in self.blocks:
            out = block(hidden_states, attention_mask=mask)
            hidden_states = out[0] if isinstance(out, tuple) else out
        return (hidden_states,)
    """, frozenset({"2.3.model_parallel", "2.3.pipeline_parallel", "2.3.more_stages_than_blocks",
                    "2.3.training_step", "2.3.stages_hidden"}), hint="Blocks.forward on hidden states of shape"),
    Variant("stages_as_generator", GPT2, "gpt2_stages", """
        blocks = list(model.transformer.h)
        base, extra = divmod(len(blocks), len(devices))
        start = 0
        for k, device in enumerate(devices):
            count = base + (1 if k < extra else 0)
            layers = [Blocks(blocks[start:start + count], model.config)]
            start += count
            if k == 0:
                layers.insert(0, Embeddings(model))
            if k == len(devices) - 1:
                layers.append(LMHead(model))
            yield nn.Sequential(*layers).to(device)
    """, frozenset({"2.3.stages", "2.3.stages_hidden", "2.3.model_parallel", "2.3.pipeline_parallel",
                    "2.3.more_stages_than_blocks", "2.3.training_step"}), hint="returned generator, expected a list"),
    Variant("empty_blocks_omitted", GPT2, "gpt2_stages", edited(GPT2, "gpt2_stages", (
        "layers: list[nn.Module] = [Blocks(blocks[start:start + count], model.config)]",
        "layers = [Blocks(blocks[start:start + count], model.config)] if count else []")),
            frozenset({"2.3.more_stages_than_blocks"}), hint="still holds an empty Blocks"),
    Variant("blocks_detach_their_input", GPT2, "forward", """
        hidden_states = hidden_states.detach()
        mask = causal_mask(self.config, hidden_states)
        for block in self.blocks:
            out = block(hidden_states, attention_mask=mask)
            hidden_states = out[0] if isinstance(out, tuple) else out
        return hidden_states
    """, frozenset({"2.3.training_step"})),
]


@pytest.mark.kit
@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
def test_variant_loses_only_its_criteria(variant, tmp_path, fork_servers):
    assert_verdicts(grade_variant(variant, variant.problem, tmp_path, fork_servers), [variant])
