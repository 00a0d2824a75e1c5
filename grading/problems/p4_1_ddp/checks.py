"""Problem 4.1 checks: BucketedDDP (broadcast, buckets, averaged gradients, overlap, reset, training).

The probe records what ``BucketedDDP`` does on each rank; the criteria compare with serial computations on the
whole global batch (``reference.py``) and with the expected bucket assignment stored as data
(``Expected.buckets``).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

from grading.check import (CheckFailed, Phase, SplitRun, SubProblem, assert_state_close, assert_tensor_close, describe,
                           expect)
from grading.problems.p4_1_ddp import ID, TITLE
from grading.problems.p4_1_ddp import reference as ref
from grading.problems.probe_helpers import OPTIMIZER_IMPORTS, factor_hint
from grading.problems.p4_1_ddp.async_results import DeferredAllReduce
from grading.problems.p4_1_ddp.hints import bucket_hint, early_launch_hint, unwaited_hint


@dataclass(frozen=True)
class Inputs:
    """The bucket caps (``bucket_mb``, MiB) whose ``BucketedDDP.buckets`` on ``DDPProbeNet(seed=0)`` are judged."""

    bucket_sizes: tuple[float, ...]


@dataclass(frozen=True)
class Expected:
    """``BucketedDDP(DDPProbeNet(seed=0), bucket_mb).buckets`` for each cap of the inputs, keyed by the cap."""

    buckets: dict[float, list[list[str]]]


PROBLEM = SubProblem(ID, TITLE, __package__,
                     # per parameter, exact fit of fc3 (272 bytes) and one byte less, mid, one bucket; a cap the
                     # fifth parameter misses by its size (1360 + 64 > 1400, though 1360 | 64 == 1360 fits); a
                     # second bucket that fits exactly (fc2.weight + fc1.bias: 1088) and one byte less
                     inputs=Inputs(bucket_sizes=tuple(b / 2 ** 20 for b in (272, 271, 1100, 1400, 1088, 1087))
                                   + (1e-9, 1000.0)),
                     expected_type=Expected)

BROADCAST_SEED = 100          # rank r builds its model from seed 100 + r; all must end with rank 0's
GRAD_BUCKETS = {"per_parameter": 1e-9, "mid": 1100 / 2 ** 20, "one_bucket": 1000.0, "middle_frozen": 1000.0}
GRAD_MODELS = {"middle_frozen": ref.MiddleFrozenNet}     # the model of a label (default DDPProbeNet)
MANY_BUCKETS = {"one bucket each": 1e-9, "all in one bucket": 1000.0}    # ManyScalarsNet: > 256 buckets, > 256 in one
PER_PARAMETER = GRAD_BUCKETS["per_parameter"]
OVERLAP_BUCKET = "mid"        # three buckets on DDPProbeNet: the first can launch before backward ends
IO = (ref.DDP_IN, ref.DDP_OUT)

P_BROADCAST = "broadcast"
P_BUCKETS = "buckets"         # a split part: recorded once per split
P_GRADS = "grads"             # one part per GRAD_BUCKETS label: grads_part(label)
P_RESET = "reset"
P_TRAIN = "train"
P_ORDER = "order"             # ShuffledNet, one bucket per parameter: the all-reduce sizes in launch order
UNUSED = "gate.scale"         # ShuffledNet's parameter that skip_gate leaves without gradient
P_UNUSED = "unused"           # ShuffledNet without its gate in forward: what finish raised
P_AFTER_ERROR = "after_error" # then a full backward on the same wrapper: the gradients
P_MANY = "many_scalars"       # ManyScalarsNet's gradients (stacked, in registration order) per MANY_BUCKETS label
GRADS_RECORDED = "grads_recorded_rank"   # a handoff file per rank: its first phase recorded every gradient part


def grads_part(label: str) -> str:
    """The part name under which the probe records the gradients of ``GRAD_BUCKETS[label]``."""
    return f"{P_GRADS}_{label}"


# ---------------------------------------------------------------- probe (rank side)
def _rank_batch(ctx, step: int):
    x, y = ref.batch(step, *IO)
    return ref.shard(x, ctx.rank, ctx.world_size), ref.shard(y, ctx.rank, ctx.world_size)


def _backward(ctx, wrapper, step: int) -> None:
    x, y = _rank_batch(ctx, step)
    ref.loss_fn(wrapper(x), y).backward()


def _broadcast_state(ctx, BucketedDDP) -> dict:
    """This rank's parameters and buffers after wrapping its model of seed BROADCAST_SEED + rank."""
    model = ref.DDPProbeNet(seed=BROADCAST_SEED + ctx.rank)
    BucketedDDP(model, bucket_mb=GRAD_BUCKETS["mid"])
    return ref.state_of(model)


def _split_buckets(BucketedDDP, inputs: Inputs) -> list:
    """``BucketedDDP(DDPProbeNet(seed=0), bucket_mb).buckets`` for each cap of the split's inputs."""
    return [BucketedDDP(ref.DDPProbeNet(seed=0), bucket_mb=mb).buckets for mb in inputs.bucket_sizes]


def _bucket_grads(ctx, BucketedDDP, events: list, wrappers: dict, label: str, mb: float) -> dict:
    """One backward through a wrapper of cap ``mb``: the gradients after finish_gradient_synchronization, the
    hook/launch events during backward and after it, and the buckets. The model and wrapper are kept in
    ``wrappers[label]`` for the reset part; with OVERLAP_BUCKET each parameter notes when its gradient is ready."""
    model = GRAD_MODELS.get(label, ref.DDPProbeNet)(seed=0)
    if label == OVERLAP_BUCKET:
        for name, param in model.named_parameters():
            if param.requires_grad:     # registered before the student's hooks, so they fire first
                param.register_post_accumulate_grad_hook(lambda p, name=name: events.append(["ready", name]))
    wrapper = BucketedDDP(model, bucket_mb=mb)
    events.clear()
    _backward(ctx, wrapper, 0)
    during_backward = [list(e) for e in events]
    wrapper.finish_gradient_synchronization()
    wrappers[label] = (model, wrapper)
    return {"grads": ref.grads_of(model), "events": during_backward, "after": events[len(during_backward):],
            "buckets": wrapper.buckets}


def _reset_grads(ctx, wrappers: dict) -> dict:
    """The OVERLAP_BUCKET wrapper's gradients, then those of a second backward on the same batch and weights."""
    model, wrapper = wrappers[OVERLAP_BUCKET]
    first = ref.grads_of(model)
    model.zero_grad(set_to_none=True)
    _backward(ctx, wrapper, 0)              # same batch, same weights: a fresh state gives the same grads
    wrapper.finish_gradient_synchronization()
    return {"first": first, "second": ref.grads_of(model)}


def _launch_order(ctx, BucketedDDP, events: list) -> dict:
    """ShuffledNet, one bucket per parameter: the buckets and the all-reduce sizes in launch order."""
    model = ref.ShuffledNet(seed=0)
    wrapper = BucketedDDP(model, bucket_mb=PER_PARAMETER)
    events.clear()
    _backward(ctx, wrapper, 0)
    wrapper.finish_gradient_synchronization()
    return {"buckets": wrapper.buckets, "launches": [e[2] for e in events if e[0] == "all_reduce"]}


def _unused_error(ctx, BucketedDDP, unused_state: dict) -> dict | None:
    """What finish_gradient_synchronization raised after a backward that left UNUSED without a gradient (None:
    nothing); the model and wrapper are kept in ``unused_state`` for the after-error part."""
    model = ref.ShuffledNet(seed=0)
    wrapper = BucketedDDP(model, bucket_mb=PER_PARAMETER)
    unused_state.update(model=model, wrapper=wrapper)
    model.skip_gate = True
    _backward(ctx, wrapper, 0)
    try:
        wrapper.finish_gradient_synchronization()
    except Exception as exc:  # noqa: BLE001 - a submission may raise anything
        return {"type": type(exc).__name__, "runtime": isinstance(exc, RuntimeError), "message": str(exc)[:800]}
    return None


def _after_error_grads(ctx, BucketedDDP, unused_state: dict) -> dict:
    """The gradients of a full backward on the wrapper that raised, and of the same backward on a new wrapper."""
    model, wrapper = unused_state["model"], unused_state["wrapper"]
    model.skip_gate = False
    model.zero_grad(set_to_none=True)
    _backward(ctx, wrapper, 0)
    wrapper.finish_gradient_synchronization()
    fresh = ref.ShuffledNet(seed=0)           # the same backward through a new wrapper
    fresh_wrapper = BucketedDDP(fresh, bucket_mb=PER_PARAMETER)
    _backward(ctx, fresh_wrapper, 0)
    fresh_wrapper.finish_gradient_synchronization()
    return {"after": ref.grads_of(model), "fresh": ref.grads_of(fresh)}


def _trained_params(ctx, BucketedDDP, optimizer_name: str) -> dict:
    """The parameters after ``ref.TRAIN_STEPS`` steps of ``optimizer_name`` through a wrapper of the mid cap."""
    model = ref.DDPProbeNet(seed=0)
    wrapper = BucketedDDP(model, bucket_mb=GRAD_BUCKETS["mid"])
    optimizer = ref.make_optimizer(optimizer_name, [p for p in model.parameters() if p.requires_grad])
    for step in range(ref.TRAIN_STEPS):
        optimizer.zero_grad()
        _backward(ctx, wrapper, step)
        wrapper.finish_gradient_synchronization()
        optimizer.step()
    return ref.params_of(model)


def _many_scalar_grads(ctx, BucketedDDP) -> dict:
    """ManyScalarsNet's gradients (stacked, in registration order) for each cap of MANY_BUCKETS."""
    found = {}
    for label, mb in MANY_BUCKETS.items():
        model = ref.ManyScalarsNet(seed=0)
        wrapper = BucketedDDP(model, bucket_mb=mb)
        _backward(ctx, wrapper, 0)
        wrapper.finish_gradient_synchronization()
        found[label] = ref.stacked_grads(model)
    return found


def _record_public_parts(ctx, BucketedDDP, events: list, wrappers: dict) -> None:
    """The parts only public criteria read (but many scalars, ``probe_many_scalars``): reset (when its wrapper was
    built), launch order, the unused parameter's error and the backward after it (when its wrapper was built),
    training."""
    unused_state: dict = {}
    if OVERLAP_BUCKET in wrappers:
        ctx.record(P_RESET, lambda: _reset_grads(ctx, wrappers))
    ctx.record(P_ORDER, lambda: _launch_order(ctx, BucketedDDP, events))
    ctx.record(P_UNUSED, lambda: {"raised": _unused_error(ctx, BucketedDDP, unused_state)})
    if unused_state:
        ctx.record(P_AFTER_ERROR, lambda: _after_error_grads(ctx, BucketedDDP, unused_state))
    ctx.record(P_TRAIN, lambda: {name: _trained_params(ctx, BucketedDDP, name) for name in ("sgd", "adam")})


def probe_ddp(ctx) -> None:
    """Record broadcast, buckets, gradients (with the hook/launch event order, never times), reset and training
    (the gradients of ManyScalarsNet: ``probe_many_scalars``, the case's second phase).

    Broadcast, reset, launch order, the unused parameter and training are read
    by public criteria only: they are recorded inside ``PROBLEM.on_public_spawn``, which
    the hidden spawn (on another world size) skips.
    """
    events: list = []
    DeferredAllReduce(events).install()         # before the student module binds any name
    from data_parallel.ddp import BucketedDDP

    PROBLEM.on_public_spawn(ctx, lambda: ctx.record(P_BROADCAST, lambda: _broadcast_state(ctx, BucketedDDP)))
    PROBLEM.each_split(ctx, lambda inputs: ctx.record(P_BUCKETS, lambda: _split_buckets(BucketedDDP, inputs)))
    wrappers: dict = {}          # label -> (model, wrapper) of each gradient part that got that far
    recorded = [ctx.record(grads_part(label), lambda label=label, mb=mb: _bucket_grads(ctx, BucketedDDP, events,
                                                                                       wrappers, label, mb))
                for label, mb in GRAD_BUCKETS.items()]
    if None not in recorded:
        with contextlib.suppress(OSError):      # unwritten, the second phase says it did not run
            (ctx.handoff_dir / f"{GRADS_RECORDED}{ctx.rank}").touch()
    PROBLEM.on_public_spawn(ctx, lambda: _record_public_parts(ctx, BucketedDDP, events, wrappers))


def probe_many_scalars(ctx) -> None:
    """The second phase, in new processes: ManyScalarsNet's gradients (a public part), where every rank recorded
    its gradient parts in the first phase. It makes a broadcast per parameter and an all-reduce per bucket, so it
    runs without torch's per-call checks, which cost a rank more than such calls themselves: a submission whose
    ranks call differently fails those checks in the first phase's gradient parts, on the same code, and this
    phase then records why it did not run (a mismatch would hang here, unexplained)."""
    missing = [r for r in range(ctx.world_size) if not (ctx.handoff_dir / f"{GRADS_RECORDED}{r}").exists()]
    if missing:
        def not_run():
            raise RuntimeError(f"not run: the gradient parts failed on rank(s) {', '.join(map(str, missing))}")
        ctx.record(P_MANY, not_run)
        return
    DeferredAllReduce([]).install()             # before the student module binds any name
    from data_parallel.ddp import BucketedDDP

    ctx.record(P_MANY, lambda: _many_scalar_grads(ctx, BucketedDDP))


CASE = PROBLEM.case("p4_ddp", probe_ddp, world_size=2, init_group=True, timeout_s=90, preload=OPTIMIZER_IMPORTS,
                    split_parts=(P_BUCKETS,),
                    next_phases=(Phase(probe_many_scalars, collective_checks=False, public_only=True),))


# ---------------------------------------------------------------- criteria (grader side)
@CASE.criterion("4.1.broadcast", "construction broadcasts parameters and buffers from rank 0", points=2,
                reads=(P_BROADCAST,))
def check_broadcast(run: SplitRun) -> None:
    """Every rank's parameters and buffers after construction equal rank 0's model (seed BROADCAST_SEED)."""
    expected = ref.state_of(ref.DDPProbeNet(seed=BROADCAST_SEED))
    for rank in range(run.world_size):
        assert_state_close(f"BucketedDDP: rank {rank} after construction, parameter/buffer",
                           run.part(P_BROADCAST, rank), expected, atol=0, rtol=0)


@CASE.criterion("4.1.buckets", "bucket assignment: reverse order, byte cap, frozen excluded", points=2,
                reads=(P_BUCKETS,))
def check_buckets(run: SplitRun) -> None:
    """Each rank's ``buckets`` for each cap of the split's inputs equal ``Expected.buckets`` of that cap."""
    sizes, expected = run.inputs.bucket_sizes, run.expected.buckets
    for rank in range(run.world_size):
        got = run.part(P_BUCKETS, rank)
        expect(isinstance(got, list) and len(got) == len(sizes),
               f"BucketedDDP: rank {rank} recorded {describe(got)} for {len(sizes)} bucket sizes")
        for mb, buckets in zip(sizes, got):
            want = expected[mb]
            expect(buckets == want, f"BucketedDDP(DDPProbeNet, bucket_mb={mb:.6g} = {mb * 2 ** 20:.0f} bytes): "
                   f"rank {rank} buckets {buckets}, expected {want} (trainable parameters in reverse registration "
                   f"order, a new bucket when the next one would exceed the cap){bucket_hint(buckets, want, mb)}")


def _check_many_scalars(run: SplitRun) -> None:
    """With more than 256 one-element parameters, in one bucket each and all in one, every rank holds the serial
    gradients (counts and indices compared by value, not by identity)."""
    expected = ref.stacked_grads(_serial_many())
    for rank in range(run.world_size):
        got = run.part(P_MANY, rank)
        for label in MANY_BUCKETS:
            assert_tensor_close(f"BucketedDDP(ManyScalarsNet: {ref.MANY_SCALARS} one-element parameters, {label}): "
                                f"rank {rank} gradients after finish_gradient_synchronization",
                                got.get(label) if isinstance(got, dict) else got, expected, atol=1e-6, rtol=1e-5)


def _serial_many():
    model = ref.ManyScalarsNet(seed=0)
    ref.serial_gradients(model, 0, *IO)
    return model


@CASE.criterion("4.1.grads", "grads equal serial global-batch grads (1 per param, 3, 1 bucket; a frozen one amid; "
                f"{ref.MANY_SCALARS} parameters)", points=3,
                reads=(*(grads_part(label) for label in GRAD_BUCKETS), P_MANY), public_only=(_check_many_scalars,))
def check_grads(run: SplitRun) -> None:
    """After ``finish_gradient_synchronization`` every rank holds the serial gradients of the global batch."""
    for label, mb in GRAD_BUCKETS.items():
        expected = ref.serial_gradients(GRAD_MODELS.get(label, ref.DDPProbeNet)(seed=0), 0, *IO)
        for rank in range(run.world_size):
            got = run.part(grads_part(label), rank)
            expect(isinstance(got, dict), f"rank {rank}: gradients missing")
            try:
                assert_state_close(f"BucketedDDP(bucket_mb={mb:.3g}, {label.replace('_', ' ')}): rank {rank} grad "
                                   "after finish_gradient_synchronization of", got["grads"], expected,
                                   atol=1e-6, rtol=1e-5)
            except CheckFailed as failure:
                hint = (unwaited_hint([*got["events"], *got["after"]])
                        or factor_hint(got["grads"], expected, run.world_size)
                        or early_launch_hint(got["grads"], expected, atol=1e-6, rtol=1e-5))
                raise CheckFailed(f"{failure}{hint}") from None


@CASE.criterion("4.1.overlap", "a bucket's async all-reduce launches before backward ends", points=2,
                reads=(grads_part(OVERLAP_BUCKET),))
def check_overlap(run: SplitRun) -> None:
    """An async all-reduce is launched during backward, before the last gradient hook fires."""
    for rank in range(run.world_size):
        got = run.part(grads_part(OVERLAP_BUCKET), rank)
        events, after = got["events"], got["after"]
        ready = [k for k, e in enumerate(events) if e[0] == "ready"]
        launches = [k for k, e in enumerate(events) if e[0] == "all_reduce"]
        expect(ready, f"rank {rank}: no gradient hook fired during backward")
        expect(launches or after, f"BucketedDDP: rank {rank} never called torch.distributed.all_reduce")
        expect(launches, f"BucketedDDP: rank {rank} launched no all-reduce during backward (all "
               f"{len(after)} came in finish_gradient_synchronization): nothing overlaps with backward")
        sync = [events[k] for k in launches if not events[k][1]]
        expect(not sync, f"BucketedDDP: rank {rank} called all_reduce without async_op=True during backward "
               "(a blocking all-reduce stalls backward instead of overlapping with it)")
        expect(launches[0] < ready[-1], f"BucketedDDP: rank {rank} launched its first all-reduce only after the "
               "last gradient hook fired: launch each bucket as soon as its last gradient is ready")


@CASE.criterion("4.1.reset", "a second backward after finish gives the same grads", points=1,
                reads=(grads_part(OVERLAP_BUCKET), P_RESET))
def check_reset(run: SplitRun) -> None:
    """A second backward on the same batch and weights gives the first backward's gradients."""
    for rank in range(run.world_size):
        run.part(grads_part(OVERLAP_BUCKET), rank)      # the first backward's own error, when it failed
        got = run.part(P_RESET, rank)
        assert_state_close(f"BucketedDDP: rank {rank}, second backward on the same batch and weights (after "
                           "finish_gradient_synchronization), grad of", got["second"], got["first"],
                           atol=1e-7, rtol=1e-6)


@CASE.criterion("4.1.train", "5 SGD and 5 Adam steps equal serial training", points=2, reads=(P_TRAIN,))
def check_train(run: SplitRun) -> None:
    """Five SGD and five Adam steps through BucketedDDP equal serial training on the global batches."""
    for name in ("sgd", "adam"):
        expected = ref.serial_training(ref.DDPProbeNet(seed=0), name, *IO)
        for rank in range(run.world_size):
            got = run.part(P_TRAIN, rank)
            expect(isinstance(got, dict) and name in got, f"rank {rank}: training results missing")
            assert_state_close(f"BucketedDDP + {name.upper()}: rank {rank} after {ref.TRAIN_STEPS} steps, "
                               "parameter", got[name], expected, atol=1e-5, rtol=1e-4)


def _bucket_numels(buckets, model) -> list[int] | None:
    """Elements of each bucket (names as the submission's ``buckets`` spells them), or None when unreadable."""
    numel = {n: p.numel() if p.requires_grad else 0 for n, p in model.named_parameters()}   # frozen: never sent
    try:
        return [sum(numel[n] for n in bucket) for bucket in buckets]
    except (KeyError, TypeError):
        return None


@CASE.criterion("4.1.one_buffer", "one all-reduce per bucket, of the bucket's whole flat buffer", points=1,
                reads=(grads_part(OVERLAP_BUCKET),))
def check_one_buffer(run: SplitRun) -> None:
    """With three buckets on DDPProbeNet, each rank issues one all-reduce per bucket, sized like the bucket."""
    for rank in range(run.world_size):
        got = run.part(grads_part(OVERLAP_BUCKET), rank)
        want = _bucket_numels(got["buckets"], ref.DDPProbeNet(seed=0))
        expect(want is not None, f"BucketedDDP: rank {rank} buckets {describe(got['buckets'])} are not lists of "
               "parameter names")
        sizes = [e[2] for e in [*got["events"], *got["after"]] if e[0] == "all_reduce"]
        expect(sorted(sizes) == sorted(want), f"BucketedDDP(bucket_mb={GRAD_BUCKETS[OVERLAP_BUCKET]:.3g}): rank "
               f"{rank} all-reduced tensors of {sizes} elements; its buckets {got['buckets']} hold {want}: copy "
               "each bucket's gradients into one flat buffer and all-reduce it once")


@CASE.criterion("4.1.launch_order", "buckets launch in index order when layers run in another order", points=1,
                reads=(P_ORDER,))
def check_launch_order(run: SplitRun) -> None:
    """On ShuffledNet (computed in another order than registered), all-reduces follow the bucket index order."""
    for rank in range(run.world_size):
        got = run.part(P_ORDER, rank)
        want = _bucket_numels(got["buckets"], ref.ShuffledNet(seed=0))
        expect(want is not None, f"BucketedDDP: rank {rank} buckets {describe(got['buckets'])} are not lists of "
               "parameter names")
        expect(got["launches"] == want, f"BucketedDDP(ShuffledNet, one parameter per bucket): rank {rank} "
               f"all-reduced {got['launches']} elements in this order; its buckets {got['buckets']} hold {want}: "
               "launch bucket i only after bucket i - 1, even when a later bucket completes first")


@CASE.criterion("4.1.unused_raises", "a parameter without gradient: RuntimeError naming exactly it", points=1,
                reads=(P_UNUSED,))
def check_unused_raises(run: SplitRun) -> None:
    """A backward without ShuffledNet's gate: finish raises RuntimeError naming 'gate.scale' and no other parameter."""
    others = [n for n, _ in ref.ShuffledNet(seed=0).named_parameters() if n != UNUSED]
    for rank in range(run.world_size):
        raised = run.part(P_UNUSED, rank)["raised"]
        what = f"BucketedDDP: rank {rank}, a backward in which the trainable parameter '{UNUSED}' got no gradient:"
        expect(raised is not None, f"{what} finish_gradient_synchronization returned without an error")
        expect(raised["runtime"], f"{what} finish_gradient_synchronization raised {raised['type']}: "
               f"{raised['message'][:200]}; expected RuntimeError")
        named = [n for n in others if n in raised["message"]]
        expect(UNUSED in raised["message"] and not named, f"{what} the message {raised['message'][:300]!r} must "
               f"name '{UNUSED}' and only it (it names {named or 'not ' + UNUSED})")


@CASE.criterion("4.1.after_error", "after that RuntimeError the next backward synchronises as a fresh one",
                points=1, reads=(P_UNUSED, P_AFTER_ERROR))
def check_after_error(run: SplitRun) -> None:
    """After the RuntimeError of an incomplete backward, a full backward gives a fresh wrapper's gradients."""
    for rank in range(run.world_size):
        run.part(P_UNUSED, rank)                  # the incomplete backward's own error, when the probe failed
        got = run.part(P_AFTER_ERROR, rank)
        assert_state_close(f"BucketedDDP: rank {rank}, a full backward after finish_gradient_synchronization "
                           "refused an incomplete one, against the same backward through a new wrapper, grad of",
                           got["after"], got["fresh"], atol=1e-7, rtol=1e-6)
