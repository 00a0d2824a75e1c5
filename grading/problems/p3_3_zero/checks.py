"""Problem 3.3 checks: ``build_config`` (DeepSpeed ZeRO-2) and ``train_microbatch``.

One 2-rank case with the real DeepSpeed engine (gloo on CPU). Rank 0 records ``build_config`` results, compared
with ``Expected.entries``; both ranks then train with ``train_microbatch`` in an engine built from a config that
is data too (``Expected.engine_config``), so a config bug costs only the config criteria. The model is ``LoRANet``
with the grader's own LoRA layer (``reference.py`` here), so 3.3 does not depend on ``finetune/lora.py``.
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Any

from grading.check import (PUBLIC, CheckFailed, SplitRun, SubProblem, assert_state_close, describe, describe_exception,
                          expect)
from grading.problems.probe_helpers import DEEPSPEED_IMPORTS, call_outcome, labelled
from grading.problems.p3_1_lora import reference as lora_ref
from grading.problems.p3_3_zero import ID, TITLE
from grading.problems.p3_3_zero import reference as ref

Call = tuple[int, int, int, str]       # build_config(world_size, micro_batch, grad_accum, precision)
ConfigPath = tuple[str, ...]           # a path into a config dict: ("zero_optimization", "stage")


@dataclass(frozen=True)
class Inputs:
    """The split-dependent ``build_config`` calls."""

    configs: tuple[Call, ...]


@dataclass(frozen=True)
class Expected:
    """The entries each ``build_config`` result must hold, and the fp32 config the training engine runs in."""

    entries: dict[Call, dict[ConfigPath, bool | int | float]]
    engine_config: dict[str, Any]       # a DeepSpeed config for ENGINE_SIZES, fp32 (not the student's)


PROBLEM = SubProblem(ID, TITLE, __package__,
                     inputs=Inputs(configs=((2, 2, 2, "fp32"), (1, 4, 1, "fp32"), (4, 1, 8, "fp16"),
                                            (3, 5, 2, "bf16"), (8, 2, 4, "fp32"))),
                     expected_type=Expected, expected_in_ranks=(PUBLIC,))   # the engine's fp32 config

ENGINE_SIZES = (ref.WORLD_SIZE, ref.MICRO_BATCH, ref.GRAD_ACCUM)     # the engine train_microbatch runs in
BAD_CONFIGS = [(0, 2, 2, "fp32"), (2, 0, 2, "fp32"), (2, 2, 0, "fp32"), (-1, 2, 2, "fp32"), (2, 2, 2, "fp8"),
               (2, 2, 2, "float64"), (True, 2, 2, "fp32"), (2, 2.0, 2, "fp32"), (2, 2, "2", "fp32")]
PRECISION_FLAGS: tuple[ConfigPath, ...] = (("fp16", "enabled"), ("bf16", "enabled"))

P_CONFIG_VALUES = "config_values"    # a split part (rank 0): recorded once per split
P_CONFIG_ERRORS = "config_errors"
P_TRAIN = "train"
P_ENGINE_CALLS = "engine_calls"      # per train_microbatch call of P_TRAIN: [backward calls, step calls, raised]
COUNTED_METHODS = ("backward", "step")
P_STUDENT_ENGINE = "student_engine"


# ---------------------------------------------------------------- probe
def _lora_model_for_training():
    """The 3.3 model: ``LoRANet(0)`` with the grader's LoRA layers holding ``adapter_state(ADAPTER_SEED)``,
    base frozen."""
    model = lora_ref.lora_model(ref.GraderLoRALinear, lora_ref.adapter_state(ref.ADAPTER_SEED))
    for name, param in model.named_parameters():
        param.requires_grad_(name.rpartition(".")[2] in ("lora_A", "lora_B"))
    return model


def _engine(config: dict):
    """A DeepSpeed engine (the kit's provided ``init_engine``) over the 3.3 model and SGD, from ``config``."""
    import torch

    from finetune.zero import init_engine
    model = _lora_model_for_training()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=ref.LEARNING_RATE)
    return init_engine(model, optimizer, config), model


def probe_zero(ctx) -> None:
    """build_config values and errors (rank 0), then two live ZeRO-2 engines on both ranks.

    The engine built from the grader's config trains first, so that a student
    config that breaks or stalls DeepSpeed costs only the config criterion; its
    ``backward`` and ``step`` are counted per ``train_microbatch`` call
    (``_count_calls``). The second engine is built from the student's config.
    """
    if ctx.backend == "gloo":
        os.environ["DS_ACCELERATOR"] = "cpu"      # before DeepSpeed is imported: ranks may share one GPU
    from finetune.zero import build_config, train_microbatch

    if ctx.rank == 0:
        PROBLEM.each_split(ctx, lambda inputs: ctx.record(P_CONFIG_VALUES,
                                                          lambda: [build_config(*c) for c in inputs.configs]))
        ctx.record(P_CONFIG_ERRORS, lambda: [call_outcome(lambda c=c: build_config(*c)) for c in BAD_CONFIGS])

    engine_calls: list[list] = []     # per train_microbatch call, a failed one too: [backward, step, what it raised]

    def train():
        engine, model = _engine(copy.deepcopy(PROBLEM.shipped_expected(ctx)[0].engine_config))
        counts = _count_calls(engine, COUNTED_METHODS)

        def counted(*args):
            counts.update(dict.fromkeys(COUNTED_METHODS, 0))
            raised = ""
            try:
                return train_microbatch(*args)
            except Exception as exc:  # noqa: BLE001 - noted here, and raised on to the train part
                raised = describe_exception(exc)
                raise
            finally:
                engine_calls.append([*(counts[name] for name in COUNTED_METHODS), raised])
        losses = []
        for step in range(ref.STEPS):
            row = []
            for micro in range(ref.GRAD_ACCUM):
                x, y = (t.to(ctx.device) for t in ref.micro_batch(step, ctx.rank, micro))
                row.append(labelled(f"train_microbatch at optimizer step {step}, micro-batch {micro}",
                                     counted, engine, x, y, ref.loss_fn))
            losses.append(row)
        params = {name: p.detach().cpu().clone() for name, p in model.named_parameters()}
        return {"losses": losses, "params": params, "global_steps": int(engine.global_steps)}
    ctx.record(P_TRAIN, train)
    ctx.record(P_ENGINE_CALLS, lambda: engine_calls)

    def student_engine():
        config = build_config(ref.WORLD_SIZE, ref.MICRO_BATCH, ref.GRAD_ACCUM, "fp32")
        engine, _ = _engine(config)
        return {"train_batch_size": engine.train_batch_size(),
                "micro": engine.train_micro_batch_size_per_gpu(),
                "accum": engine.gradient_accumulation_steps(),
                "stage": engine.zero_optimization_stage(),
                "clipping": float(engine.gradient_clipping()),
                "offload": _offloads(engine.zero_offload_optimizer()) or _offloads(engine.zero_offload_param()),
                "fp16": bool(engine.fp16_enabled()), "bf16": bool(engine.bfloat16_enabled()),
                "optimizer": type(engine.optimizer).__name__}
    ctx.record(P_STUDENT_ENGINE, student_engine)


def _count_calls(engine, names: tuple[str, ...]) -> dict[str, int]:
    """Count the calls of ``engine``'s methods ``names``: each is wrapped on the instance (the real method still
    runs); returns the live counts, name -> calls, which the caller may reset."""
    counts = dict.fromkeys(names, 0)
    for name in names:
        def counting(*args, _name=name, _method=getattr(engine, name), **kwargs):
            counts[_name] += 1
            return _method(*args, **kwargs)
        setattr(engine, name, counting)
    return counts


def _offloads(offload) -> bool:
    """Whether an engine's offload setting (None, or a config with a ``device``) moves anything off the device:
    ``{"device": "none"}`` is no offload, as the contract says."""
    device = getattr(offload, "device", None)
    return offload is not None and str(getattr(device, "value", device)) != "none"


# The collectives here are DeepSpeed's, not the student's: torch's per-call checks would only slow them down.
CASE = PROBLEM.case("p3_zero_2rank", probe_zero, world_size=2, init_group=True, timeout_s=150,
                    preload=DEEPSPEED_IMPORTS, split_parts=(P_CONFIG_VALUES,), collective_checks=False)


# ---------------------------------------------------------------- criteria
def _lookup(config, path: ConfigPath):
    """The value at ``path`` in the nested dict ``config``, or "<absent>"."""
    value = config
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return "<absent>"
        value = value[key]
    return value


def _same_value(got, want) -> bool:
    """Equal and of the right kind: bools exactly, ints as int (not bool), floats as int or float."""
    if isinstance(want, bool):
        return got is want
    if isinstance(want, int):
        return type(got) is int and got == want
    return type(got) in (int, float) and got == want


def _check_student_engine(run: SplitRun) -> None:
    """Every rank's live engine from the student's fp32 config for ENGINE_SIZES reports that config's settings
    (fixed sizes, so judged on the public split only)."""
    want = {"train_batch_size": ref.WORLD_SIZE * ref.MICRO_BATCH * ref.GRAD_ACCUM, "micro": ref.MICRO_BATCH,
            "accum": ref.GRAD_ACCUM, "stage": 2, "clipping": 0.0, "offload": False, "fp16": False, "bf16": False}
    for rank in range(run.world_size):
        got = run.part(P_STUDENT_ENGINE, rank)
        for key, value in want.items():
            expect(got[key] == value, f"DeepSpeed engine from build_config({ref.WORLD_SIZE}, {ref.MICRO_BATCH}, "
                   f"{ref.GRAD_ACCUM}, 'fp32') on {ref.WORLD_SIZE} ranks: rank {rank} reports {key} = "
                   f"{got[key]!r}, expected {value!r}")


@CASE.criterion("3.3.config", "config values for several sizes/precisions; a live 2-rank ZeRO-2 engine from it",
                points=6, reads=(P_CONFIG_VALUES, P_STUDENT_ENGINE), public_only=(_check_student_engine,))
def check_config(run: SplitRun) -> None:
    configs, expected = run.inputs.configs, run.expected.entries
    for (w, m, a, p), config in zip(configs, run.part(P_CONFIG_VALUES)):
        call = f"build_config({w}, {m}, {a}, {p!r})"
        expect(isinstance(config, dict), f"{call} returned {describe(config)}, expected a dict")
        for path, want in expected[w, m, a, p].items():
            got = _lookup(config, path)
            if got == "<absent>" and path in PRECISION_FLAGS and want is False:
                continue                          # a missing section is disabled in DeepSpeed too
            expect(_same_value(got, want), f"{call}: '{'.'.join(path)}' is {got!r}, expected {want!r}")
        zero = config.get("zero_optimization", {})
        for key in ("offload_optimizer", "offload_param"):
            device = _lookup(zero, (key, "device")) if isinstance(zero, dict) else "<absent>"
            expect(device in ("<absent>", "none", None), f"{call}: zero_optimization.{key} offloads to "
                   f"{device!r}; ZeRO-2 here runs without offload")


@CASE.criterion("3.3.config_errors", "ValueError for bad sizes or unknown precision", points=2,
                reads=(P_CONFIG_ERRORS,))
def check_config_errors(run: SplitRun) -> None:
    for args, outcome in zip(BAD_CONFIGS, run.part(P_CONFIG_ERRORS)):
        expect(outcome == "ValueError", f"build_config{args} must raise ValueError, got {outcome}")


@CASE.criterion("3.3.update", "3 steps x 2 micro-batches per rank through train_microbatch equal serial SGD; "
                "base frozen; global_steps == 3", points=6, reads=(P_TRAIN,))
def check_update(run: SplitRun) -> None:
    records = [run.part(P_TRAIN, rank) for rank in range(run.world_size)]     # a stub fails before the reference
    expected_adapters, expected_losses = ref.serial_sgd()
    base = lora_ref.wrapped_base_state(0)
    for rank, got in enumerate(records):
        what = f"train_microbatch: rank {rank}"
        expect(got["global_steps"] == ref.STEPS, f"{what}: engine.global_steps is {got['global_steps']} after "
               f"{ref.STEPS * ref.GRAD_ACCUM} micro-batches with gradient_accumulation_steps={ref.GRAD_ACCUM}, "
               f"expected {ref.STEPS} (call engine.step() once per micro-batch)")
        try:
            assert_state_close(f"{what}: after {ref.STEPS} ZeRO-2 steps, compared with serial SGD on the global "
                               "batch, adapter", got["params"], expected_adapters, atol=1e-6, rtol=1e-5)
        except CheckFailed as failure:
            raise CheckFailed(f"{failure}{_accumulation_hint(got['params'])}{_loss_fn_hint(got['params'])}") from None
        assert_state_close(f"{what}: after {ref.STEPS} ZeRO-2 steps, frozen base weight", got["params"], base,
                           atol=0.0, rtol=0.0)
        for step, row in enumerate(got["losses"][1:], start=1):     # the first step's: 3.3.returns_loss
            for micro, value in enumerate(row):
                want, number = expected_losses[step][rank][micro], _number(value)
                expect(number is None or abs(number - want) <= 1e-5 * max(1.0, abs(want)), f"{what} returned "
                       f"loss {number:.6g} for step {step} micro-batch {micro}, expected {want:.6g}")


@CASE.criterion("3.3.engine_calls", "each train_microbatch calls engine.backward(loss) and engine.step() "
                "exactly once", points=1, reads=(P_ENGINE_CALLS, P_TRAIN))
def check_engine_calls(run: SplitRun) -> None:
    for rank in range(run.world_size):
        calls = run.part(P_ENGINE_CALLS, rank)
        if not calls:
            run.part(P_TRAIN, rank)           # why no train_microbatch call was made (a failed engine, ...)
        expect(calls, f"train_microbatch: rank {rank} was never called (the training engine failed first)")
        for k, (*counted, raised) in enumerate(calls):
            where = (f"train_microbatch: rank {rank}, optimizer step {k // ref.GRAD_ACCUM}, micro-batch "
                     f"{k % ref.GRAD_ACCUM}")
            expect(any(counted) or not raised, f"{where}: raised {raised} before any engine call")
            for name, times in zip(COUNTED_METHODS, counted):
                call = "engine.backward(loss)" if name == "backward" else "engine.step()"
                advice = (" (not loss.backward(): the engine owns the loss scaling, and an fp16 engine refuses "
                          "an unscaled backward)" if name == "backward" and times == 0 and not raised else "")
                expect(times == 1, f"{where}: {call} was called {times} time{'' if times == 1 else 's'}, "
                       f"expected exactly once{advice}" + (f" (train_microbatch raised {raised})" if raised else ""))


def _number(value) -> float | None:
    """``value`` as a float where it is a number or a one-element tensor, else None (what kind train_microbatch
    returns is 3.3.returns_loss's to judge)."""
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        return None


@CASE.criterion("3.3.returns_loss", "train_microbatch returns the micro-batch loss as a Python float, as loss_fn "
                "gave it", points=1, reads=(P_TRAIN,))
def check_returns_loss(run: SplitRun) -> None:
    records = [run.part(P_TRAIN, rank) for rank in range(run.world_size)]
    _, expected_losses = ref.serial_sgd()
    for rank, got in enumerate(records):
        what = f"train_microbatch: rank {rank}"
        for step, row in enumerate(got["losses"]):
            for micro, value in enumerate(row):
                expect(type(value) is float, f"{what} returned {describe(value)} for step {step} micro-batch "
                       f"{micro}, expected a Python float")
        # Only the first step's values: later ones depend on the updates, judged by 3.3.update.
        for micro, value in enumerate(got["losses"][0]):
            want = expected_losses[0][rank][micro]
            scaled = abs(value * ref.GRAD_ACCUM - want) <= 1e-5 * max(1.0, abs(want))
            expect(abs(value - want) <= 1e-5 * max(1.0, abs(want)), f"{what} returned loss {value:.6g} for the "
                   f"first micro-batch {micro}, expected the micro-batch loss {want:.6g} (as loss_fn returns it)"
                   + (f"\nlikely cause: the loss divided by the accumulation steps ({ref.GRAD_ACCUM}) before it "
                      "is returned; return it as loss_fn gave it" if scaled else ""))


def _loss_fn_hint(params) -> str:
    """A likely cause when the adapters moved as if trained with a plain MSE instead of the given loss_fn."""
    plain, _ = ref.serial_sgd(loss_of=ref.plain_mse)
    try:
        assert_state_close("", params, plain, atol=1e-6, rtol=1e-5)
    except CheckFailed:
        return ""
    return ("\nlikely cause: the loss was not computed with the given loss_fn (these are the updates of a plain "
            "MSE; the probe's loss_fn has the same value but another gradient)")


def _accumulation_hint(params) -> str:
    """A likely cause when the adapters moved as if the learning rate were divided by the accumulation steps."""
    scaled, _ = ref.serial_sgd(lr=ref.LEARNING_RATE / ref.GRAD_ACCUM)
    try:
        assert_state_close("", params, scaled, atol=1e-6, rtol=1e-5)
    except CheckFailed:
        return ""
    return (f"\nlikely cause: the loss divided by the accumulation steps ({ref.GRAD_ACCUM}) before "
            "engine.backward; DeepSpeed already scales it, so the updates came out that many times too small")

