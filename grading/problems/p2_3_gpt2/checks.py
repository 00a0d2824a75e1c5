"""Problem 2.3 checks: a ``transformers`` GPT-2 as pipeline stages.

The probe builds the student's stages and pipelines over the grader's tiny GPT-2, with ``pipeline.pipe.Pipe``
replaced by a sequential run of the stages (``SWAPS``: no micro-batches, no threads), so 2.3 is judged apart
from the student's 2.2. Logits, loss and gradients are compared with the unsplit model (``reference.py``), the
blocks per stage with the expected split stored as data (``Expected.blocks_per_stage``).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from grading.check import (SplitRun, SubProblem, Swap, apply, assert_state_close, assert_tensor_close, describe_kind,
                          expect)
from grading.problems.probe_helpers import GPT2_IMPORTS, stage_devices
from grading.problems.p2_3_gpt2 import ID, TITLE
from grading.problems.p2_3_gpt2 import reference as ref


@dataclass(frozen=True)
class Inputs:
    """What the split-dependent probe parts run on: a tiny GPT-2 (blocks, seed) and the stage counts to cut it in."""

    layers: int
    stage_counts: tuple[int, ...]
    model_seed: int


@dataclass(frozen=True)
class Expected:
    """GPT-2 blocks per stage, by number of stages."""

    blocks_per_stage: dict[int, list[int]]


STAGE_COUNTS = (1, 2, 3, 4)            # 4 stages of the 4-block GPT-2: one block each, no remainder
PROBLEM = SubProblem(ID, TITLE, __package__,
                     inputs=Inputs(layers=ref.GPT2_LAYERS, stage_counts=STAGE_COUNTS, model_seed=ref.GPT2_SEED),
                     expected_type=Expected)

P_DEVICES = "devices"
P_STAGES = "stages"    # a split part: recorded once per split
# a split part: pipeline_parallel logits of the split's GPT-2 over 3 stages, judged on the hidden split only (the
# public GPT-2's logits are judged by 2.3.pipeline_parallel); recorded last, so a hang there costs no other part
P_STAGES_LOGITS = "stages_logits"


def logits_part(mode: str) -> str:
    """The part holding ``{impl: {"logits", "device"}}`` of one pipeline mode."""
    return f"logits_{mode}"


P_TUPLE_BLOCKS = "logits_tuple_blocks"
P_TRAINING_STEP = "training_step"
P_MORE_STAGES = "more_stages_than_blocks"
P_STAGES_META = "stages_meta"          # gpt2_stages over META_DEVICES: each stage must be moved to its device
P_STAGES_RETURNED = "stages_returned"  # what gpt2_stages returned (a list of nn.Sequential)
P_ZERO_BLOCK_STAGES = "zero_block_stages"  # the modules of each of MORE_STAGES stages (two hold no block)
P_MANY_STAGES = "many_stages"          # the modules of each of MANY_STAGES stages (all but four hold no block)
P_BLOCKS_OUTPUT = "blocks_output"      # what Blocks.forward returns for two blocks (a tensor of the input's shape)
META_DEVICES = ("cpu", "meta", "cpu")  # a device other than the CPU even on a CPU-only machine
MORE_STAGES = 6                        # stages for the 4-block GPT-2: two of them hold no block
# stages for the 4-block GPT-2 whose indices pass 256: CPython keeps one object of each small int only, so a stage
# index compared by identity (`k is len(devices) - 1`) misses the last stage there
MANY_STAGES = 300


def _sequential_pipe():
    """Stand-in for ``Pipe``: the provided ``ModelParallel`` (the stages one after the other, no micro-batches)."""
    from pipeline.gpt2 import ModelParallel

    def pipe(stages: Sequence[nn.Module], devices: Sequence, split_size: int) -> nn.Module:
        return ModelParallel(stages, devices)
    return pipe


SWAPS = [Swap("pipeline.pipe", "Pipe", _sequential_pipe,
              "2.3 is judged apart from the student's Pipe (2.2): the stages run one after the other")]


def _module_kind(gpt2, module) -> str:
    """The kit class a stage's module is (``Embeddings``, ``Blocks``, ``LMHead``), else its class name."""
    kit = (gpt2.Embeddings, gpt2.Blocks, gpt2.LMHead)
    return next((c.__name__ for c in kit if type(module) is c), f"{type(module).__name__} (not a kit module)")


def _describe_stages(gpt2, model, count: int, devices: Sequence[str] | None = None) -> list[dict]:
    names = {id(p): name for name, p in model.named_parameters()}
    blocks = {id(b): k for k, b in enumerate(model.transformer.h)}
    described = []
    for stage in gpt2.gpt2_stages(model, list(devices or stage_devices(count))):
        modules = list(stage.modules())
        described.append({
            "type": type(stage).__name__,
            "params": sorted(names.get(id(p), "<a parameter not in the model>") for p in stage.parameters()),
            "param_devices": sorted({str(p.device) for p in stage.parameters()}),
            "blocks": [blocks[id(m)] for m in modules if id(m) in blocks],
        })
    return described


# ================================================================ probe
def _student_stage_kinds(gpt2, count: int) -> list[list[str]]:
    """The kit class of each module of each stage of the 4-block GPT-2 cut into ``count`` stages, all on the CPU."""
    return [[_module_kind(gpt2, m) for m in stage.children()] for stage in
            gpt2.gpt2_stages(ref.tiny_gpt2(), ["cpu"] * count)]


def _blocks_output(gpt2, ids) -> dict:
    """What ``Blocks.forward`` of the first two blocks returns for the embeddings of ``ids``: its kind and shape,
    and the input's shape."""
    model = ref.tiny_gpt2("eager")
    hidden = gpt2.Embeddings(model)(ids)
    with torch.no_grad():
        out = gpt2.Blocks(list(model.transformer.h[:2]), model.config)(hidden)
    return {"kind": describe_kind(out), "shape": list(out.shape) if isinstance(out, torch.Tensor) else None,
            "input_shape": list(hidden.shape)}


def _split_stages(gpt2, inputs: Inputs) -> dict:
    """``_describe_stages`` of the split's GPT-2 cut into each of its stage counts."""
    return {n: _describe_stages(gpt2, ref.tiny_gpt2(seed=inputs.model_seed, layers=inputs.layers), n)
            for n in inputs.stage_counts}


def _mode_logits(gpt2, ids, mode: str) -> dict:
    """The logits (CPU) and their device of the GPT-2 built by ``build_pipeline_gpt2`` in ``mode`` over 3 stages,
    with each attention implementation."""
    found = {}
    for impl in ("sdpa", "eager"):
        with gpt2.build_pipeline_gpt2(ref.tiny_gpt2(impl), stage_devices(3), mode, ref.GPT2_SPLIT) as net:
            out = net(ids)
        found[impl] = {"logits": out.detach().cpu(), "device": str(out.device)}
    return found


def _tuple_blocks_logits(gpt2, ids):
    """model_parallel logits over 2 stages of a GPT-2 whose blocks return tuples."""
    model = ref.tiny_gpt2("eager")
    model.transformer.h = nn.ModuleList(ref.TupleBlock(block) for block in model.transformer.h)
    with gpt2.build_pipeline_gpt2(model, stage_devices(2), "model_parallel") as net:
        return net(ids).detach().cpu()


def _more_stages_logits(gpt2, ids):
    """model_parallel logits of the 4-block GPT-2 over MORE_STAGES stages (two of them hold no block)."""
    with gpt2.build_pipeline_gpt2(ref.tiny_gpt2("eager"), ["cpu"] * MORE_STAGES, "model_parallel") as net:
        return net(ids).detach().cpu()


def _training_step(gpt2, ids) -> dict:
    """The loss and every parameter's gradient after one pipeline_parallel backward over 3 stages."""
    model = ref.tiny_gpt2("sdpa")
    with gpt2.build_pipeline_gpt2(model, stage_devices(3), "pipeline_parallel", ref.GPT2_SPLIT) as net:
        loss = ref.lm_loss(net(ids), ids)
        loss.backward()
    grads = {name: (p.grad.detach().cpu() if p.grad is not None else None)
             for name, p in model.named_parameters()}
    return {"loss": float(loss.item()), "grads": grads}


def _split_logits(gpt2, ids, inputs: Inputs):
    """pipeline_parallel logits over 3 stages of the split's GPT-2."""
    model = ref.tiny_gpt2(seed=inputs.model_seed, layers=inputs.layers)
    with gpt2.build_pipeline_gpt2(model, stage_devices(3), "pipeline_parallel", ref.GPT2_SPLIT) as net:
        return net(ids).detach().cpu()


def probe_gpt2(ctx) -> None:
    """GPT-2 stages, logits in both modes, one training step; a sequential run stands in for Pipe."""
    apply(SWAPS)
    from pipeline import gpt2

    ctx.record(P_DEVICES, lambda: {n: stage_devices(n) for n in STAGE_COUNTS})
    ctx.record(P_STAGES_META, lambda: [s["param_devices"] for s in _describe_stages(
        gpt2, ref.tiny_gpt2(), len(META_DEVICES), META_DEVICES)])
    ctx.record(P_STAGES_RETURNED, lambda: describe_kind(gpt2.gpt2_stages(ref.tiny_gpt2(), stage_devices(2))))
    for part, count in ((P_ZERO_BLOCK_STAGES, MORE_STAGES), (P_MANY_STAGES, MANY_STAGES)):
        ctx.record(part, lambda count=count: _student_stage_kinds(gpt2, count))
    ids = ref.gpt2_batch()
    ctx.record(P_BLOCKS_OUTPUT, lambda: _blocks_output(gpt2, ids))
    PROBLEM.each_split(ctx, lambda inputs: ctx.record(P_STAGES, lambda: _split_stages(gpt2, inputs)))
    for mode in gpt2.MODES:
        ctx.record(logits_part(mode), lambda mode=mode: _mode_logits(gpt2, ids, mode))
    ctx.record(P_TUPLE_BLOCKS, lambda: _tuple_blocks_logits(gpt2, ids))
    ctx.record(P_MORE_STAGES, lambda: _more_stages_logits(gpt2, ids))
    ctx.record(P_TRAINING_STEP, lambda: _training_step(gpt2, ids))
    PROBLEM.each_split(ctx, lambda inputs: ctx.record(P_STAGES_LOGITS, lambda: _split_logits(gpt2, ids, inputs)))


CASE = PROBLEM.case("p2_gpt2", probe_gpt2, init_group=False, timeout_s=120, preload=GPT2_IMPORTS,
                    split_parts=(P_STAGES, P_STAGES_LOGITS))


# ================================================================ criteria
def _check_stages(label: str, stages: list, layers: int, want_split: list, devices: list, all_names: set) -> None:
    n = len(want_split)
    expect(len(stages) == n, f"{label}: {len(stages)} stages, expected {n}")
    split = [len(s["blocks"]) for s in stages]
    expect(split == want_split, f"{label}: blocks per stage {split}, expected {want_split} "
           "(n_layer // n each, one more for the first n_layer % n stages)")
    order = [k for s in stages for k in s["blocks"]]
    expect(order == list(range(layers)), f"{label}: blocks in stage order {order}, expected {list(range(layers))}")
    embeds = {"transformer.wte.weight", "transformer.wpe.weight"}
    head = {"transformer.ln_f.weight", "transformer.ln_f.bias"}
    for k, stage in enumerate(stages):
        expect(stage["type"] == "Sequential", f"{label}: stage {k} is a {stage['type']}, expected nn.Sequential")
        params = set(stage["params"])
        expect(params & embeds == (embeds if k == 0 else set()), f"{label}: the embeddings (wte, wpe) must be in "
               f"stage 0 only; stage {k} has {sorted(params & embeds) or 'none of them'}")
        expect(params & head == (head if k == n - 1 else set()), f"{label}: the final norm ln_f must be in the "
               f"last stage only; stage {k} has {sorted(params & head) or 'none of it'}")
        expect(stage["param_devices"] in ([], [devices[k]]),
               f"{label}: stage {k} has parameters on {stage['param_devices']}, expected {devices[k]}")
    listed = [name for s in stages for name in s["params"]]
    expect(len(listed) == len(set(listed)) and set(listed) == all_names,
           f"{label}: the stages must hold each of the model's own parameters exactly once "
           f"(missing {sorted(all_names - set(listed))[:3]}, extra or repeated "
           f"{sorted({x for x in listed if listed.count(x) > 1 or x not in all_names})[:3]})")


def _check_stages_logits(run: SplitRun) -> None:
    inputs = run.inputs
    assert_tensor_close(f"pipeline_parallel logits of a {inputs.layers}-block GPT-2 over 3 stages",
                        run.part(P_STAGES_LOGITS), ref.gpt2_logits("sdpa", inputs.model_seed, inputs.layers),
                        atol=1e-5, rtol=1e-4)


@CASE.criterion("2.3.stages", "gpt2_stages: embeddings first, blocks split evenly, head last, each moved to its "
                "device",
                points=2,
                reads=(P_STAGES, P_STAGES_RETURNED, P_STAGES_META, P_STAGES_LOGITS),
                hidden_only=(_check_stages_logits,))
def check_gpt2_stages(run: SplitRun) -> None:
    inputs, expected = run.inputs, run.expected.blocks_per_stage
    found = run.part(P_STAGES)
    layers = inputs.layers
    all_names = {name for name, _ in ref.tiny_gpt2(seed=inputs.model_seed, layers=layers).named_parameters()}
    for n in inputs.stage_counts:
        _check_stages(f"gpt2_stages of a {layers}-block GPT-2 over {n} device(s)", found[n], layers,
                      expected[n], stage_devices(n), all_names)
    returned = run.part(P_STAGES_RETURNED)
    expect(returned in ("list of Sequential", "list"), f"gpt2_stages(model, {stage_devices(2)}) returned "
           f"{returned}, expected a list of nn.Sequential")
    moved = run.part(P_STAGES_META)
    expect(moved == [[d] for d in META_DEVICES], f"gpt2_stages(model, {list(META_DEVICES)}): the stages' parameters "
           f"are on {moved}, expected {[[d] for d in META_DEVICES]} (move stage k with .to(devices[k]))")


def _check_logits(run: SplitRun, mode: str) -> None:
    devices = run.part(P_DEVICES)
    found = run.part(logits_part(mode))
    for impl in ("sdpa", "eager"):
        got = found[impl]
        what = f"{mode} GPT-2 logits over {devices[3]} ({impl} attention)"
        assert_tensor_close(what, got["logits"], ref.gpt2_logits(impl), atol=1e-5, rtol=1e-4)
        expect(got["device"] == devices[3][-1], f"{what}: on {got['device']}, expected {devices[3][-1]}")


@CASE.criterion("2.3.model_parallel", "model_parallel logits equal the unsplit GPT-2 (causal, tuple blocks)",
                points=2, reads=(P_BLOCKS_OUTPUT, P_DEVICES, logits_part("model_parallel"), P_TUPLE_BLOCKS))
def check_gpt2_model_parallel(run: SplitRun) -> None:
    got = run.part(P_BLOCKS_OUTPUT)
    expect(got["kind"].startswith("tensor") and got["shape"] == got["input_shape"], "Blocks.forward on hidden "
           f"states of shape {tuple(got['input_shape'])} returned {got['kind']}, expected a tensor of that shape "
           "(unpack a block's tuple output, never return one)")
    _check_logits(run, "model_parallel")
    assert_tensor_close("model_parallel GPT-2 logits when blocks return tuples (older transformers)",
                        run.part(P_TUPLE_BLOCKS), ref.gpt2_logits("eager"), atol=1e-5, rtol=1e-4)


@CASE.criterion("2.3.pipeline_parallel", "pipeline_parallel logits equal the unsplit GPT-2", points=2,
                reads=(P_DEVICES, logits_part("pipeline_parallel")))
def check_gpt2_pipeline_parallel(run: SplitRun) -> None:
    _check_logits(run, "pipeline_parallel")


def _stage_kinds(count: int) -> list[list[str]]:
    """The modules each of ``count`` stages of the 4-block GPT-2 holds: Embeddings first, a Blocks in every stage
    (empty ones included), LMHead last."""
    return [(["Embeddings"] if k == 0 else []) + ["Blocks"] + (["LMHead"] if k == count - 1 else [])
            for k in range(count)]


@CASE.criterion("2.3.more_stages_than_blocks", "stages with zero blocks hold an empty Blocks, which passes its "
                "input through (6 and 300 stages)", points=1, reads=(P_ZERO_BLOCK_STAGES, P_MORE_STAGES, P_MANY_STAGES))
def check_more_stages_than_blocks(run: SplitRun) -> None:
    got, want = run.part(P_ZERO_BLOCK_STAGES), _stage_kinds(MORE_STAGES)
    expect(got == want, f"gpt2_stages of the {ref.GPT2_LAYERS}-block GPT-2 over {MORE_STAGES} devices: the stages "
           f"hold {got}, expected {want} (a stage whose share is zero blocks still holds an empty Blocks)")
    assert_tensor_close(f"model_parallel logits of the {ref.GPT2_LAYERS}-block GPT-2 over {MORE_STAGES} stages "
                        "(some stages hold no block)", run.part(P_MORE_STAGES), ref.gpt2_logits("eager"),
                        atol=1e-5, rtol=1e-4)
    got, want = run.part(P_MANY_STAGES), _stage_kinds(MANY_STAGES)
    what = f"gpt2_stages of the {ref.GPT2_LAYERS}-block GPT-2 over {MANY_STAGES} devices"
    expect(len(got) == MANY_STAGES, f"{what}: {len(got)} stages, expected {MANY_STAGES}")
    for k, (mine, theirs) in enumerate(zip(got, want)):
        cause = (" (stage k is the last when k == len(devices) - 1, compared with ==: 'is' fails for ints above "
                 "256, which are distinct objects)" if "LMHead" in theirs and "LMHead" not in mine else "")
        expect(mine == theirs, f"{what}: stage {k} holds {mine}, expected {theirs}{cause}")


@CASE.criterion("2.3.training_step", "one pipeline_parallel training step's loss and gradients equal the unsplit "
                "GPT-2", points=2, reads=(P_TRAINING_STEP,))
def check_gpt2_training_step(run: SplitRun) -> None:
    got = run.part(P_TRAINING_STEP)             # first: a rank that failed costs no reference GPT-2 here
    want_loss, want_grads = ref.gpt2_training_step()
    expect(abs(got["loss"] - want_loss) <= 1e-5 * max(1.0, abs(want_loss)),
           f"pipeline_parallel GPT-2 loss {got['loss']:.6g}, expected {want_loss:.6g}")
    missing = sorted(name for name, grad in got["grads"].items() if grad is None)
    expect(not missing, f"pipeline_parallel GPT-2 training step: no gradient for {missing[:4]}")
    assert_state_close("pipeline_parallel GPT-2 training step: gradient of", got["grads"], want_grads,
                       atol=1e-5, rtol=1e-4)

