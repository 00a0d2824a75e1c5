"""Buggy variants of 2.1 (staff only, not released): each loses exactly the criteria and breaks the clauses it names."""
from grading.kit.variants import Clause, Variant, edited

SCHEDULE, PARTITION = "pipeline/schedule.py", "pipeline/partition.py"

# Most variants are the reference region with targeted edits (``edited``: each old text must occur once). Some were
# written with untyped locals (``_UNTYPED``) and keep that difference beside their bug.
_TYPED_LOCALS = """groups: list[list[nn.Module]] = []
    devices: list[torch.device] = []
    pending: list[nn.Module] = []           # parameterless layers before the first device"""
_UNTYPED = (_TYPED_LOCALS, "groups, devices, pending = [], [], []")
_WITH_DEVICE = """if isinstance(layer, WithDevice):
            device, layer = layer.device, layer.module.to(layer.device)
        else:
            device = layer_device(layer)"""

# The 2.2 probe runs the grader's own schedule, so schedule bugs cost 2.1 only.
VARIANTS = [
    Variant("reversed_wave_order", SCHEDULE, "clock_cycles", """
        if microbatches < 0 or stages < 1:
            raise ValueError("bad schedule size")
        for k in range(microbatches + stages - 1 if microbatches else 0):
            yield [(k - j, j) for j in reversed(range(stages)) if 0 <= k - j < microbatches]
    """, frozenset({"2.1.clock_cycles", "2.1.clock_cycles_hidden"}),
        breaks=(Clause("19", "clock_cycles", "waves k = 0..m+n-2 of (i, j) with i + j == k, by increasing j",
                       "2.1.clock_cycles"),)),
    Variant("extra_empty_wave", SCHEDULE, "clock_cycles", """
        if microbatches < 0 or stages < 1:
            raise ValueError("bad schedule size")
        for k in range(microbatches + stages if microbatches else 0):
            yield [(k - j, j) for j in range(stages) if 0 <= k - j < microbatches]
    """, frozenset({"2.1.clock_cycles", "2.1.clock_cycles_hidden"}),
        breaks=(Clause("20", "clock_cycles", "never an empty wave", "2.1.clock_cycles"),)),
    Variant("empty_waves_for_zero_microbatches", SCHEDULE, "clock_cycles", """
        if microbatches < 0 or stages < 1:
            raise ValueError("bad schedule size")
        for k in range(microbatches + stages - 1):
            yield [(k - j, j) for j in range(stages) if 0 <= k - j < microbatches]
    """, frozenset({"2.1.clock_cycles_empty"}),
        breaks=(Clause("21", "clock_cycles", "zero micro-batches yield nothing (edge case, own criterion)",
                       "2.1.clock_cycles_empty"),)),
    Variant("with_device_ignored", PARTITION, "split_module", edited(PARTITION, "split_module", _UNTYPED, (
        _WITH_DEVICE, "device = layer_device(layer)")), frozenset({"2.1.with_device"}),
        breaks=(Clause("25", "split_module", "WithDevice moves and unwraps its module", "2.1.with_device"),)),
    Variant("empty_sequential_one_stage", PARTITION, "split_module", edited(PARTITION, "split_module", _UNTYPED, (
        "if pending:", "if pending or not groups:")), frozenset({"2.1.split_module"}),
        breaks=(Clause("25b", "split_module", "an empty Sequential gives `([], [])`", "2.1.split_module"),)),
    Variant("schedule_without_validation", SCHEDULE, "clock_cycles", """
        for k in range(microbatches + stages - 1 if microbatches > 0 else 0):
            yield [(k - j, j) for j in range(stages) if 0 <= k - j < microbatches]
    """, frozenset({"2.1.clock_cycles_errors"}),
        breaks=(Clause("22", "clock_cycles", "ValueError for m < 0 or stages < 1", "2.1.clock_cycles_errors"),)),
    Variant("leading_parameterless_layers_dropped", PARTITION, "split_module", edited(PARTITION, "split_module", (
        _TYPED_LOCALS, "groups, devices = [], []"), ("pending.append(layer)", "continue"),
        ("groups.append(pending + [layer])", "groups.append([layer])"), ("            pending = []\n", ""),
        ("    if pending:\n        groups.append(pending)\n        devices.append(_CPU)\n", "")),
        frozenset({"2.1.split_module"}),
        breaks=(Clause("23", "split_module", "consecutive layers grouped by parameter device; parameterless ones join",
                       "2.1.split_module"),)),
    Variant("first_parameter_decides_device", PARTITION, "split_module", edited(PARTITION, "split_module", _UNTYPED, (
        "device = layer_device(layer)", "device = next((p.device for p in layer.parameters()), None)"), (
        "devices.append(_CPU)", 'devices.append(torch.device("cpu"))')), frozenset({"2.1.split_spanning"}),
        breaks=(Clause("24", "split_module", "a layer's device is the device of all its parameters",
                       "2.1.split_spanning"),
                Clause("26", "split_module", "ValueError for a layer spanning two devices", "2.1.split_spanning"))),
    Variant("waves_as_generators", SCHEDULE, "clock_cycles", """
        if microbatches < 0 or stages < 1:
            raise ValueError("bad schedule size")
        for k in range(microbatches + stages - 1 if microbatches else 0):
            yield ((k - j, j) for j in range(stages) if 0 <= k - j < microbatches)
    """, frozenset({"2.1.clock_cycles", "2.1.clock_cycles_hidden"}), hint="yielded generator as cycle 0",
        breaks=(Clause("19b", "clock_cycles", "an iterable of cycles (a generator or a list: `schedule_as_list` keeps "
                       "full marks), each a `list` of `(i, j)` tuples of ints (Pipe walks a cycle twice)",
                       "2.1.clock_cycles"),)),
    Variant("schedule_as_list", SCHEDULE, "clock_cycles", """
        if microbatches < 0 or stages < 1:
            raise ValueError("bad schedule size")
        return [[(k - j, j) for j in range(stages) if 0 <= k - j < microbatches]
                for k in range(microbatches + stages - 1 if microbatches else 0)]
    """, frozenset()),      # allowed: the cycles as a list instead of a generator (full marks)
    Variant("partitions_as_lists", PARTITION, "split_module", edited(PARTITION, "split_module", (
        "return [nn.Sequential(*group) for group in groups], devices", "return groups, devices")),
            frozenset({"2.1.split_module", "2.1.with_device"}), hint="partitions must be nn.Sequential, got ['list'",
            breaks=(Clause("25c", "split_module", "returns (a list of `nn.Sequential`, a list of `torch.device`)",
                           "2.1.split_module"),)),
    Variant("buffers_decide_device", PARTITION, "split_module", edited(PARTITION, "split_module", (
        "            device = layer_device(layer)\n",
        "            found = {t.device for t in [*layer.parameters(), *layer.buffers()]}\n"
        "            device = found.pop() if len(found) == 1 else layer_device(layer)\n")),
            frozenset({"2.1.split_module"}), hint="buffers but no parameters",
            breaks=(Clause("23b", "split_module", "only parameters give a child a device: one with buffers but no "
                           "parameters joins the current stage", "2.1.split_module"),)),
    Variant("spanning_error_without_names", PARTITION, "split_module", edited(PARTITION, "split_module", _UNTYPED, (
        "device = layer_device(layer)", """found = {p.device for p in layer.parameters()}
            if len(found) > 1:
                raise ValueError("a layer spans several devices")
            device = found.pop() if found else None""")),
        frozenset({"2.1.split_spanning"}), hint="must name the layer's class and its devices",
        breaks=(Clause("26b", "split_module", "the ValueError's message names the layer's class (`Linear`) and its "
                       "devices", "2.1.split_spanning"),)),
]

NOT_GRADED = """Freedoms: `clock_cycles` may yield its cycles or return them as a list (the full-marks variant
`schedule_as_list` in this folder's variants.py), and may raise its ValueError when called or when first advanced
(the probe advances it)."""
