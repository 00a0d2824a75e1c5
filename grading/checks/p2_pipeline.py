"""Problem 2 checks: schedule and splitting (2.1), Pipe on stage workers (2.2), GPT-2 stages (2.3).

Probes run in a child process and only *record* what the student code
returns; criteria run in the grader and judge it against
``grading.references.p2``. The 2.2 probe installs the grader's
``clock_cycles`` and the 2.3 probe the grader's Pipe, so a broken schedule
costs only 2.1 and a broken Pipe only 2.2.

Devices: with two or more GPUs the stages run on ``cuda:0``, ``cuda:1``, ...;
otherwise every stage is on ``cpu`` (each still has its own worker thread).
Distinct devices on a CPU-only machine come from the ``meta`` device: real
tensors without data, so grouping layers by device (2.1) and "the output is
on the last stage's device" (2.2) are checked honestly there too.
"""
from __future__ import annotations

import itertools
import threading

from grading.checks.common import call_outcome
from grading.compare import assert_state_close, assert_tensor_close, describe
from grading.references import p2 as ref
from grading.rubric import Case, CaseRun, CheckFailed, Criterion
from grading.runner import expect

STAGE_TIMEOUT_S = 8.0    # receive timeout inside the probes: a lost result becomes a TimeoutError, not a hang
FORWARD_CONFIGS = [(1, 8, 3), (2, 8, 3), (3, 8, 3), (3, 7, 2), (2, 5, 8), (3, 6, 1)]   # (stages, rows, split)
EVENT_CONFIGS = [(3, 7, 2), (2, 6, 2)]                                                 # 4 and 3 micro-batches
BACKWARD_CONFIG = (3, 7, 2)
SGD_CONFIG = (2, 7, 3)
REPEATS = 3


def _devices(count: int) -> list[str]:
    """Stage devices for ``count`` stages: GPUs round robin when there are >= 2, else all CPU."""
    import torch
    gpus = torch.cuda.device_count()
    return [f"cuda:{k % gpus}" for k in range(count)] if gpus >= 2 else ["cpu"] * count


def _forward_label(stages: int, rows: int, split: int) -> str:
    return f"{stages}stages_{rows}rows_split{split}"


# ================================================================ 2.1 probe
# name -> (expected stage devices, expected stages as original layer indices); layers built in _split_layers
SPLIT_PLAIN = {
    "one cpu stage": (["cpu"], [[0, 1, 2]]),
    "cpu | meta | cpu": (["cpu", "meta", "cpu"], [[0, 1], [2, 3, 4], [5]]),
    "leading parameterless layer": (["meta", "cpu"], [[0, 1], [2, 3]]),
    "no parameters at all": (["cpu"], [[0, 1]]),
}
SPLIT_WITH_DEVICE = {
    "WithDevice(ReLU, meta) starts a meta stage": (["cpu", "meta"], [[0], [1, 2]]),
    "WithDevice moves a cpu Linear to meta": (["meta", "cpu"], [[0, 1], [2, 3]]),
}


def _split_layers(name: str) -> list:
    """The layers of split case ``name`` (child side: needs the student's WithDevice)."""
    import torch
    from torch import nn

    from pipeline.partition import WithDevice
    torch.manual_seed(0)
    meta = torch.device("meta")

    def lin(device="cpu"):
        return nn.Linear(3, 3, device=device)
    builders = {
        "one cpu stage": lambda: [lin(), nn.ReLU(), lin()],
        "cpu | meta | cpu": lambda: [lin(), nn.Tanh(), lin(meta), nn.ReLU(), lin(meta), lin()],
        "leading parameterless layer": lambda: [nn.ReLU(), lin(meta), lin(), nn.Tanh()],
        "no parameters at all": lambda: [nn.ReLU(), nn.Tanh()],
        "WithDevice(ReLU, meta) starts a meta stage": lambda: [lin(), WithDevice(nn.ReLU(), "meta"), lin(meta)],
        "WithDevice moves a cpu Linear to meta": lambda: [WithDevice(lin(), meta), lin(meta),
                                                          WithDevice(nn.Tanh(), "cpu"), lin()],
    }
    return builders[name]()


def _describe_split(layers, split_module) -> dict:
    """Run split_module on nn.Sequential(*layers); describe the result by the original layer indices."""
    from torch import nn

    from pipeline.partition import WithDevice
    index = {}
    for k, layer in enumerate(layers):
        index[id(layer)] = str(k)
        if isinstance(layer, WithDevice):
            index[id(layer.module)] = str(k)
            index[id(layer)] = f"{k} (the WithDevice wrapper itself)"
    partitions, devices = split_module(nn.Sequential(*layers))
    groups, param_devices = [], []
    for partition in partitions:
        children = list(partition.children()) if isinstance(partition, nn.Module) else list(partition)
        groups.append([index.get(id(child), f"an unknown {type(child).__name__}") for child in children])
        param_devices.append(sorted({str(p.device) for child in children for p in child.parameters()}))
    return {"devices": [str(d) for d in devices], "groups": groups, "param_devices": param_devices,
            "types": [type(p).__name__ for p in partitions], "device_types": [type(d).__name__ for d in devices]}


def probe_schedule_split(ctx) -> None:
    """Record the student's schedules (bounded), their errors, and split_module on CPU + meta layers."""
    import torch
    from torch import nn

    from pipeline import partition, schedule

    def schedules():
        results = []
        for m, n in ref.SCHEDULE_CONFIGS:
            try:
                waves = itertools.islice(schedule.clock_cycles(m, n), m + n + 5)   # a runaway generator stops
                results.append([[[int(i), int(j)] for i, j in wave] for wave in waves])
            except Exception as exc:  # noqa: BLE001
                results.append(f"{type(exc).__name__}: {exc}")
        return results
    ctx.record("schedules", schedules)
    ctx.record("schedule_errors", lambda: [
        call_outcome(lambda m=m, n=n: list(itertools.islice(schedule.clock_cycles(m, n), 50)))
        for m, n in ref.BAD_SCHEDULE_ARGS])

    for part, cases in (("split_plain", SPLIT_PLAIN), ("split_with_device", SPLIT_WITH_DEVICE)):
        def run(cases=cases):
            out = {}
            for name in cases:
                try:
                    out[name] = _describe_split(_split_layers(name), partition.split_module)
                except Exception as exc:  # noqa: BLE001
                    out[name] = f"{type(exc).__name__}: {exc}"
            return out
        ctx.record(part, run)

    def spanning():
        torch.manual_seed(0)
        straddling = nn.Linear(3, 3)
        straddling.bias = nn.Parameter(torch.zeros(3, device="meta"))
        return call_outcome(lambda: partition.split_module(nn.Sequential(nn.Linear(3, 3), straddling)))
    ctx.record("split_spanning", spanning)


# ================================================================ 2.1 criteria
def check_schedule(run: CaseRun) -> None:
    for (m, n), got in zip(ref.SCHEDULE_CONFIGS, run.part("schedules")):
        want = ref.expected_schedule(m, n)
        expect(not isinstance(got, str), f"clock_cycles({m}, {n}) raised {got}")
        if got == want:
            continue
        if len(got) != len(want):
            raise CheckFailed(f"clock_cycles({m}, {n}) yielded {len(got)} cycle(s), expected {len(want)} "
                              f"(k = 0 .. m+n-2, none for m = 0, never an empty cycle): got {got[:8]}")
        k = next(k for k in range(len(want)) if got[k] != want[k])
        raise CheckFailed(f"clock_cycles({m}, {n}) cycle {k} is {got[k]}, expected {want[k]} "
                          "(all (i, j) with i + j == k, by increasing j)")


def check_schedule_errors(run: CaseRun) -> None:
    for (m, n), outcome in zip(ref.BAD_SCHEDULE_ARGS, run.part("schedule_errors")):
        expect(outcome == "ValueError", f"clock_cycles({m}, {n}) must raise ValueError, got {outcome}")


def _check_split(run: CaseRun, part: str, cases: dict) -> None:
    got_all = run.part(part)
    for name, (devices, groups) in cases.items():
        got = got_all.get(name) if isinstance(got_all, dict) else None
        label = f"split_module on '{name}'"
        expect(got is not None, f"{label}: no result")
        expect(not isinstance(got, str), f"{label} raised {got}")
        expect(all(t == "Sequential" for t in got["types"]),
               f"{label}: partitions must be nn.Sequential, got {got['types']}")
        expect(all(t == "device" for t in got["device_types"]),
               f"{label}: devices must be torch.device objects, got {got['device_types']}")
        want_groups = [[str(k) for k in group] for group in groups]
        expect(got["devices"] == devices and got["groups"] == want_groups,
               f"{label}: stages (original layer indices) {got['groups']} on {got['devices']}, "
               f"expected {want_groups} on {devices}")
        for k, (device, found) in enumerate(zip(devices, got["param_devices"])):
            expect(found in ([], [device]), f"{label}: stage {k} should hold parameters on {device} only, "
                   f"found {found}")


def check_split_plain(run: CaseRun) -> None:
    _check_split(run, "split_plain", SPLIT_PLAIN)


def check_split_with_device(run: CaseRun) -> None:
    _check_split(run, "split_with_device", SPLIT_WITH_DEVICE)


def check_split_spanning(run: CaseRun) -> None:
    outcome = run.part("split_spanning")
    expect(outcome == "ValueError", "split_module must raise ValueError for a layer whose parameters are on "
           f"cpu and meta, got {outcome}")


# ================================================================ 2.2 probe
def _stages(count: int, layers: list | None = None) -> list:
    """The grader's layers cut into ``count`` stages, each moved to its device (``_devices``)."""
    layers = ref.build_layers(0) if layers is None else layers
    return [stage.to(device) for stage, device in zip(ref.stage_layers(layers, count), _devices(count))]


def _pipe_run(Pipe, stages: int, rows: int, split: int) -> dict:
    """One forward of a fresh Pipe over the grader's layers on ``batch(rows)``; output (on CPU) and its device."""
    x = ref.batch(rows)[0]
    with Pipe(_stages(stages), _devices(stages), split) as pipe:
        out = pipe(x)
    return {"output": out.detach().cpu(), "device": str(out.device)}


def probe_pipe(ctx) -> None:
    """Pipe forward/backward with the grader's schedule; the runtime's events; errors; devices."""
    import torch
    from torch import nn

    from pipeline import runtime, schedule
    schedule.clock_cycles = ref.clock_cycles          # isolate 2.2 from the student's 2.1
    runtime.DEFAULT_TIMEOUT = STAGE_TIMEOUT_S
    from pipeline.pipe import Pipe

    ctx.record("devices", lambda: {n: _devices(n) for n in (1, 2, 3)})
    for stages, rows, split in FORWARD_CONFIGS:
        ctx.record("forward_" + _forward_label(stages, rows, split), lambda s=stages, r=rows, p=split: _pipe_run(
            Pipe, s, r, p))

    def repeated():
        outputs = []
        with Pipe(_stages(3), _devices(3), 2) as pipe:
            for seed in range(REPEATS):
                outputs.append(pipe(ref.batch(7, seed)[0]).detach().cpu())
        return outputs
    ctx.record("repeated", repeated)

    def no_grad():
        with Pipe(_stages(3), _devices(3), 2) as pipe, torch.no_grad():
            out = pipe(ref.batch(7)[0])
        return {"output": out.detach().cpu(), "requires_grad": out.requires_grad}
    ctx.record("no_grad", no_grad)

    def output_device():
        # one micro-batch (split_size == batch): one task per cycle, so only the result's device is at stake
        found = _pipe_run(Pipe, 3, 4, 4)
        torch.manual_seed(0)
        stages = [nn.Linear(ref.IN_FEATURES, ref.HIDDEN), nn.Linear(ref.HIDDEN, ref.OUT_FEATURES, device="meta")]
        with Pipe(stages, ["cpu", "meta"], 4) as pipe:
            try:
                out = pipe(ref.batch(4)[0])
            except NotImplementedError as exc:
                if "meta" not in str(exc):
                    raise
                raise RuntimeError(f"the result was moved off the last stage's device (meta): {exc}") from None
        return {"device": found["device"], "meta_device": str(out.device), "meta_shape": list(out.shape)}
    ctx.record("output_device", output_device)

    def events():
        found = {}
        for stages, rows, split in EVENT_CONFIGS:
            with Pipe(_stages(stages), _devices(stages), split) as pipe:
                pipe(ref.batch(rows)[0])
                found[_forward_label(stages, rows, split)] = [[str(kind), int(stage)]
                                                              for kind, stage in pipe.workers.events]
        return found
    ctx.record("events", events)

    def stage_exception():
        before = set(threading.enumerate())
        stages = _stages(3)
        stages[1] = failing = ref.FailingStage()
        outcome = ["no exception", ""]
        with Pipe(stages, _devices(3), 2) as pipe:
            workers = [t.name for t in pipe.workers.threads]
            try:
                pipe(ref.batch(7)[0])
            except Exception as exc:  # noqa: BLE001
                outcome = [type(exc).__name__, str(exc)]
        alive = [t.name for t in threading.enumerate() if t not in before and t.is_alive()]
        return {"outcome": outcome, "alive": alive, "called_in": failing.called_in, "workers": workers}
    ctx.record("stage_exception", stage_exception)

    def backward():
        stages, rows, split = BACKWARD_CONFIG
        layers = ref.build_layers(0)
        inputs, targets = ref.batch(rows)
        inputs.requires_grad_(True)
        with Pipe(_stages(stages, layers), _devices(stages), split) as pipe:
            ref.loss_fn(pipe(inputs), targets).backward()
        grads = {name: (p.grad.detach().cpu() if p.grad is not None else None)
                 for name, p in nn.Sequential(*layers).named_parameters()}
        return {"input": inputs.grad, "params": grads}
    ctx.record("backward", backward)

    def sgd():
        stages, rows, split = SGD_CONFIG
        layers = ref.build_layers(0)
        with Pipe(_stages(stages, layers), _devices(stages), split) as pipe:
            optimizer = torch.optim.SGD(pipe.parameters(), lr=ref.LEARNING_RATE)
            for step in range(ref.SGD_STEPS):
                inputs, targets = ref.batch(rows, step)
                optimizer.zero_grad()
                ref.loss_fn(pipe(inputs), targets).backward()
                optimizer.step()
        return {name: p.detach().cpu().clone() for name, p in nn.Sequential(*layers).named_parameters()}
    ctx.record("sgd", sgd)


# ================================================================ 2.2 criteria
def check_pipe_forward(run: CaseRun) -> None:
    for stages, rows, split in FORWARD_CONFIGS:
        label = _forward_label(stages, rows, split)
        got = run.part("forward_" + label)
        assert_tensor_close(f"Pipe output ({stages} stage(s), batch {rows}, split_size {split})", got["output"],
                            ref.sequential_forward(rows), atol=1e-5, rtol=1e-4)
    outputs = run.part("repeated")
    expect(isinstance(outputs, list) and len(outputs) == REPEATS, f"repeated calls: got {describe(outputs)}")
    for seed, out in enumerate(outputs):
        assert_tensor_close(f"Pipe output of call {seed + 1} of {REPEATS} on one Pipe (3 stages, batch 7, "
                            "split_size 2)", out, ref.sequential_forward(7, seed), atol=1e-5, rtol=1e-4)
    got = run.part("no_grad")
    assert_tensor_close("Pipe output under torch.no_grad()", got["output"], ref.sequential_forward(7),
                        atol=1e-5, rtol=1e-4)
    expect(got["requires_grad"] is False, "Pipe output under torch.no_grad() requires grad: it built a graph")


def check_pipe_device(run: CaseRun) -> None:
    devices = run.part("devices")[3]
    got = run.part("output_device")
    expect(got["device"] == devices[-1], f"Pipe output (stages on {devices}, a cpu input) is on {got['device']}, "
           f"expected the last stage's device {devices[-1]}")
    expect(got["meta_device"] == "meta" and got["meta_shape"] == [4, ref.OUT_FEATURES],
           f"Pipe with stages on [cpu, meta] and a cpu input: output on {got['meta_device']} with shape "
           f"{got['meta_shape']}, expected on meta with shape [4, {ref.OUT_FEATURES}]")


def check_pipe_waves(run: CaseRun) -> None:
    found = run.part("events")
    for stages, rows, split in EVENT_CONFIGS:
        label = _forward_label(stages, rows, split)
        micro = -(-rows // split)
        want = ref.expected_events(micro, stages)
        got = found.get(label, [])
        if got == want:
            continue
        k = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]), min(len(got), len(want)))
        raise CheckFailed(f"StageWorkers events ({stages} stages, {micro} micro-batches): event {k} is "
                          f"{got[k] if k < len(got) else 'missing'}, expected "
                          f"{want[k] if k < len(want) else 'nothing more'}; each clock cycle must submit all its "
                          f"tasks before receiving any, then receive them in the same order.\n"
                          f"got      {got[:12]}...\nexpected {want[:12]}...")


def check_pipe_exception(run: CaseRun) -> None:
    got = run.part("stage_exception")
    kind, message = got["outcome"]
    expect(kind == "ValueError" and ref.FailingStage.MESSAGE in message,
           f"a stage raising ValueError('{ref.FailingStage.MESSAGE}') must surface in the caller of Pipe.forward; "
           f"the caller got {kind}{': ' + message if message else ''}")
    expect(got["called_in"] and set(got["called_in"]) <= set(got["workers"]),
           f"the failing stage ran in thread(s) {got['called_in']}, expected the Pipe's worker threads "
           f"{got['workers']} (run every stage call through self.workers.submit)")
    expect(not got["alive"], f"threads still alive after the failing Pipe was closed: {got['alive']}")


def check_pipe_backward(run: CaseRun) -> None:
    stages, rows, split = BACKWARD_CONFIG
    want_input, want_params = ref.sequential_gradients(rows)
    got = run.part("backward")
    where = f"({stages} stages, batch {rows}, split_size {split})"
    expect(got["input"] is not None, f"Pipe backward {where}: the input got no gradient (detached between stages?)")
    assert_tensor_close(f"Pipe backward {where}: input gradient", got["input"], want_input, atol=1e-6, rtol=1e-4)
    for name, grad in got["params"].items():
        expect(grad is not None, f"Pipe backward {where}: parameter '{name}' got no gradient "
               "(detached between stages?)")
    assert_state_close(f"Pipe backward {where}: gradient of", got["params"], want_params, atol=1e-6, rtol=1e-4)
    stages, rows, split = SGD_CONFIG
    assert_state_close(f"Pipe training ({stages} stages, batch {rows}, split_size {split}): after {ref.SGD_STEPS} "
                       "SGD steps, parameter", run.part("sgd"), ref.sequential_sgd(rows), atol=1e-6, rtol=1e-4)


# ================================================================ 2.3 probe
def probe_gpt2(ctx) -> None:
    """GPT-2 stages, logits in both modes, one training step; the grader's Pipe stands in for 2.2."""
    from torch import nn

    from pipeline import pipe
    pipe.Pipe = ref.ReferencePipe                    # isolate 2.3 from the student's 2.2
    from pipeline import gpt2

    ctx.record("devices", lambda: {n: _devices(n) for n in (1, 2, 3)})

    def stages():
        found = {}
        for n in (1, 2, 3):
            model = ref.tiny_gpt2()
            names = {id(p): name for name, p in model.named_parameters()}
            blocks = {id(b): k for k, b in enumerate(model.transformer.h)}
            described = []
            for stage in gpt2.gpt2_stages(model, _devices(n)):
                modules = list(stage.modules())
                described.append({
                    "type": type(stage).__name__,
                    "params": sorted(names.get(id(p), "<a parameter not in the model>") for p in stage.parameters()),
                    "param_devices": sorted({str(p.device) for p in stage.parameters()}),
                    "blocks": [blocks[id(m)] for m in modules if id(m) in blocks],
                })
            found[n] = described
        return found
    ctx.record("stages", stages)

    ids = ref.gpt2_batch()
    for impl in ("sdpa", "eager"):
        for mode in gpt2.MODES:
            def logits(impl=impl, mode=mode):
                with gpt2.build_pipeline_gpt2(ref.tiny_gpt2(impl), _devices(3), mode, ref.GPT2_SPLIT) as net:
                    out = net(ids)
                return {"logits": out.detach().cpu(), "device": str(out.device)}
            ctx.record(f"logits_{mode}_{impl}", logits)

    def tuple_blocks():
        model = ref.tiny_gpt2("eager")
        model.transformer.h = nn.ModuleList(ref.TupleBlock(block) for block in model.transformer.h)
        with gpt2.build_pipeline_gpt2(model, _devices(2), "model_parallel") as net:
            return net(ids).detach().cpu()
    ctx.record("logits_tuple_blocks", tuple_blocks)

    def training_step():
        model = ref.tiny_gpt2("sdpa")
        with gpt2.build_pipeline_gpt2(model, _devices(3), "pipeline_parallel", ref.GPT2_SPLIT) as net:
            loss = ref.lm_loss(net(ids), ids)
            loss.backward()
        grads = {name: (p.grad.detach().cpu() if p.grad is not None else None)
                 for name, p in model.named_parameters()}
        return {"loss": float(loss.item()), "grads": grads}
    ctx.record("training_step", training_step)


# ================================================================ 2.3 criteria
def check_gpt2_stages(run: CaseRun) -> None:
    devices = run.part("devices")
    found = run.part("stages")
    all_names = {name for name, _ in ref.tiny_gpt2().named_parameters()}
    for n in (1, 2, 3):
        stages = found[n]
        label = f"gpt2_stages over {n} device(s)"
        expect(len(stages) == n, f"{label}: {len(stages)} stages, expected {n}")
        split = [len(s["blocks"]) for s in stages]
        want_split = ref.expected_block_split(ref.GPT2_LAYERS, n)
        expect(split == want_split, f"{label}: blocks per stage {split}, expected {want_split} "
               "(n_layer // n each, one more for the first n_layer % n stages)")
        order = [k for s in stages for k in s["blocks"]]
        expect(order == list(range(ref.GPT2_LAYERS)), f"{label}: blocks in stage order {order}, expected "
               f"{list(range(ref.GPT2_LAYERS))}")
        for k, stage in enumerate(stages):
            expect(stage["type"] == "Sequential", f"{label}: stage {k} is a {stage['type']}, expected nn.Sequential")
            params = set(stage["params"])
            embeds = {"transformer.wte.weight", "transformer.wpe.weight"}
            head = {"transformer.ln_f.weight", "transformer.ln_f.bias"}
            want_embeds = embeds if k == 0 else set()
            expect(params & embeds == want_embeds, f"{label}: the embeddings (wte, wpe) must be in stage 0 "
                   f"only; stage {k} has {sorted(params & embeds) or 'none of them'}")
            want_head = head if k == n - 1 else set()
            expect(params & head == want_head, f"{label}: the final norm ln_f must be in the last stage only; "
                   f"stage {k} has {sorted(params & head) or 'none of it'}")
            expect(stage["param_devices"] in ([], [devices[n][k]]),
                   f"{label}: stage {k} has parameters on {stage['param_devices']}, expected {devices[n][k]}")
        listed = [name for s in stages for name in s["params"]]
        expect(len(listed) == len(set(listed)) and set(listed) == all_names,
               f"{label}: the stages must hold each of the model's own parameters exactly once "
               f"(missing {sorted(all_names - set(listed))[:3]}, extra or repeated "
               f"{sorted({x for x in listed if listed.count(x) > 1 or x not in all_names})[:3]})")


def _check_logits(run: CaseRun, mode: str) -> None:
    devices = run.part("devices")
    for impl in ("sdpa", "eager"):
        got = run.part(f"logits_{mode}_{impl}")
        what = f"{mode} GPT-2 logits over {devices[3]} ({impl} attention)"
        assert_tensor_close(what, got["logits"], ref.gpt2_logits(impl), atol=1e-5, rtol=1e-4)
        expect(got["device"] == devices[3][-1], f"{what}: on {got['device']}, expected {devices[3][-1]}")


def check_gpt2_model_parallel(run: CaseRun) -> None:
    _check_logits(run, "model_parallel")
    assert_tensor_close("model_parallel GPT-2 logits when blocks return tuples (older transformers)",
                        run.part("logits_tuple_blocks"), ref.gpt2_logits("eager"), atol=1e-5, rtol=1e-4)


def check_gpt2_pipeline_parallel(run: CaseRun) -> None:
    _check_logits(run, "pipeline_parallel")


def check_gpt2_training_step(run: CaseRun) -> None:
    want_loss, want_grads = ref.gpt2_training_step()
    got = run.part("training_step")
    expect(abs(got["loss"] - want_loss) <= 1e-5 * max(1.0, abs(want_loss)),
           f"pipeline_parallel GPT-2 loss {got['loss']:.6g}, expected {want_loss:.6g}")
    missing = sorted(name for name, grad in got["grads"].items() if grad is None)
    expect(not missing, f"pipeline_parallel GPT-2 training step: no gradient for {missing[:4]}")
    assert_state_close("pipeline_parallel GPT-2 training step: gradient of", got["grads"], want_grads,
                       atol=1e-5, rtol=1e-4)


CASES = [
    Case("p2_schedule_split", "grading.checks.p2_pipeline:probe_schedule_split", init_group=False, timeout_s=60,
         criteria=(
             Criterion("2.1.clock_cycles", "clock_cycles: every cycle's tasks for many (m, n), none for m = 0", 4,
                       check_schedule),
             Criterion("2.1.clock_cycles_errors", "clock_cycles: ValueError for m < 0 or stages < 1", 1,
                       check_schedule_errors),
             Criterion("2.1.split_module", "split_module groups consecutive layers by parameter device", 3,
                       check_split_plain),
             Criterion("2.1.with_device", "split_module honours WithDevice (moves and unwraps the layer)", 1,
                       check_split_with_device),
             Criterion("2.1.split_spanning", "split_module: ValueError for a layer spanning two devices", 1,
                       check_split_spanning),
         )),
    Case("p2_pipe", "grading.checks.p2_pipeline:probe_pipe", init_group=False, timeout_s=180, criteria=(
        Criterion("2.2.forward", "Pipe output equals the plain model (1-3 stages, uneven, split > batch, "
                  "repeated, no_grad)", 4, check_pipe_forward),
        Criterion("2.2.output_on_last_device", "Pipe output is on the last stage's device", 2, check_pipe_device),
        Criterion("2.2.wave_dispatch", "each clock cycle: all submits, then receives in the same order", 3,
                  check_pipe_waves),
        Criterion("2.2.stage_exception", "a stage's exception reaches the caller; no thread left alive", 2,
                  check_pipe_exception),
        Criterion("2.2.backward", "input/parameter gradients and 3 SGD steps equal the plain model", 4,
                  check_pipe_backward),
    )),
    Case("p2_gpt2", "grading.checks.p2_pipeline:probe_gpt2", init_group=False, timeout_s=120, criteria=(
        Criterion("2.3.stages", "gpt2_stages: embeddings first, blocks split evenly, head last, on its device", 3,
                  check_gpt2_stages),
        Criterion("2.3.model_parallel", "model_parallel logits equal the unsplit GPT-2 (causal, tuple blocks)", 2,
                  check_gpt2_model_parallel),
        Criterion("2.3.pipeline_parallel", "pipeline_parallel logits equal the unsplit GPT-2", 2,
                  check_gpt2_pipeline_parallel),
        Criterion("2.3.training_step", "one pipeline_parallel training step's loss and gradients equal the "
                  "unsplit GPT-2", 3, check_gpt2_training_step),
    )),
]

__all__ = ["CASES"]
