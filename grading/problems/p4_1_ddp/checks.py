"""Problem 4.1 checks: BucketedDDP (broadcast, buckets, averaged gradients, overlap, reset, training).

The probe records what ``BucketedDDP`` does on each rank: the weights after
construction, its ``buckets``, the gradients after
``finish_gradient_synchronization``, the order in which gradient hooks fired
and all-reduces were launched (events, never times), and the parameters after
five SGD and five Adam steps. The criteria compare with serial computations
on the whole global batch (``grading.problems.p4_1_ddp.reference``) and with the expected
bucket assignment stored as data (``grading/fixtures/p4_buckets.json``).
"""
from __future__ import annotations


from grading.kit import data
from grading.engine.compare import assert_state_close, describe
from grading.problems.p4_1_ddp import reference as ref
from grading.engine.expect import CheckFailed, expect
from grading.engine.results import CaseRun
from grading.engine.rubric import Case, Criterion

BROADCAST_SEED = 100          # rank r builds its model from seed 100 + r; all must end with rank 0's
GRAD_BUCKETS = {"per_parameter": 1e-9, "mid": 1100 / 2 ** 20, "one_bucket": 1000.0}
OVERLAP_BUCKET = "mid"        # three buckets on DDPProbeNet: the first can launch before backward ends
IO = (ref.DDP_IN, ref.DDP_OUT)


def grads_part(label: str) -> str:
    """The part name under which the probe records the gradients of ``GRAD_BUCKETS[label]``."""
    return "grads_" + label


def bucket_fixture() -> list[dict]:
    """The public bucket cases: ``[{"bucket_mb": float, "buckets": [[names], ...]}, ...]`` for DDPProbeNet."""
    return data.fixture("p4_buckets")["cases"]


# ---------------------------------------------------------------- probe (rank side)
def _rank_batch(ctx, step: int):
    x, y = ref.batch(step, *IO)
    return ref.shard(x, ctx.rank, ctx.world_size), ref.shard(y, ctx.rank, ctx.world_size)


def _backward(ctx, wrapper, step: int) -> None:
    x, y = _rank_batch(ctx, step)
    ref.loss_fn(wrapper(x), y).backward()


def probe_ddp(ctx) -> None:
    """Record broadcast, buckets, gradients (with the hook/launch event order), reset and training on this rank."""
    import torch.distributed as dist

    events: list = []
    real_all_reduce = dist.all_reduce

    def recording_all_reduce(tensor, *args, **kwargs):
        events.append(["all_reduce", bool(kwargs.get("async_op", args[2] if len(args) > 2 else False)),
                       int(tensor.numel())])
        return real_all_reduce(tensor, *args, **kwargs)
    dist.all_reduce = recording_all_reduce      # before the student module binds any name
    from data_parallel.ddp import BucketedDDP

    def broadcast():
        model = ref.DDPProbeNet(seed=BROADCAST_SEED + ctx.rank)
        BucketedDDP(model, bucket_mb=GRAD_BUCKETS["mid"])
        return ref.state_of(model)
    ctx.record("broadcast", broadcast)

    bucket_sizes = ctx.args.get("bucket_sizes") or [case["bucket_mb"] for case in bucket_fixture()]
    ctx.record("buckets", lambda: [BucketedDDP(ref.DDPProbeNet(seed=0), bucket_mb=mb).buckets
                                   for mb in bucket_sizes])

    wrappers = {}
    for label, mb in GRAD_BUCKETS.items():
        def grads(label=label, mb=mb):
            model = ref.DDPProbeNet(seed=0)
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
            return {"grads": ref.grads_of(model), "events": during_backward, "after": events[len(during_backward):]}
        ctx.record(grads_part(label), grads)

    def reset():
        model, wrapper = wrappers[OVERLAP_BUCKET]
        first = ref.grads_of(model)
        model.zero_grad(set_to_none=True)
        _backward(ctx, wrapper, 0)              # same batch, same weights: a fresh state gives the same grads
        wrapper.finish_gradient_synchronization()
        return {"first": first, "second": ref.grads_of(model)}
    if OVERLAP_BUCKET in wrappers:
        ctx.record("reset", reset)

    def train(optimizer_name: str):
        model = ref.DDPProbeNet(seed=0)
        wrapper = BucketedDDP(model, bucket_mb=GRAD_BUCKETS["mid"])
        optimizer = ref.make_optimizer(optimizer_name, [p for p in model.parameters() if p.requires_grad])
        for step in range(ref.TRAIN_STEPS):
            optimizer.zero_grad()
            _backward(ctx, wrapper, step)
            wrapper.finish_gradient_synchronization()
            optimizer.step()
        return ref.params_of(model)
    if ctx.args.get("train", True):
        ctx.record("train", lambda: {name: train(name) for name in ("sgd", "adam")})


# ---------------------------------------------------------------- criteria (grader side)
def check_broadcast(run: CaseRun) -> None:
    expected = ref.state_of(ref.DDPProbeNet(seed=BROADCAST_SEED))
    for rank in range(run.world_size):
        assert_state_close(f"BucketedDDP: rank {rank} after construction, parameter/buffer",
                           run.part("broadcast", rank), expected, atol=0, rtol=0)


def judge_buckets(run: CaseRun, cases: list[dict]) -> None:
    """Each rank's ``buckets`` for each case's ``bucket_mb`` equal the case's expected buckets."""
    for rank in range(run.world_size):
        got = run.part("buckets", rank)
        expect(isinstance(got, list) and len(got) == len(cases),
               f"BucketedDDP: rank {rank} recorded {describe(got)} for {len(cases)} bucket sizes")
        for case, buckets in zip(cases, got):
            want = case["buckets"]
            expect(buckets == want, f"BucketedDDP(DDPProbeNet, bucket_mb={case['bucket_mb']:.6g} "
                   f"= {case['bucket_mb'] * 2 ** 20:.0f} bytes): rank {rank} buckets {buckets}, expected {want} "
                   "(trainable parameters in reverse registration order, a new bucket when the next one "
                   "would exceed the cap)")


def check_buckets(run: CaseRun) -> None:
    judge_buckets(run, bucket_fixture())


def check_grads(run: CaseRun) -> None:
    expected = ref.serial_gradients(ref.DDPProbeNet(seed=0), 0, *IO)
    for label, mb in GRAD_BUCKETS.items():
        for rank in range(run.world_size):
            got = run.part(grads_part(label), rank)
            expect(isinstance(got, dict), f"rank {rank}: gradients missing")
            assert_state_close(f"BucketedDDP(bucket_mb={mb:.3g}, {label.replace('_', ' ')}): rank {rank} grad after "
                               "finish_gradient_synchronization of", got["grads"], expected, atol=1e-6, rtol=1e-5)


def check_overlap(run: CaseRun) -> None:
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


def check_reset(run: CaseRun) -> None:
    for rank in range(run.world_size):
        run.part(grads_part(OVERLAP_BUCKET), rank)      # the first backward's own error, when it failed
        got = run.part("reset", rank)
        assert_state_close(f"BucketedDDP: rank {rank}, second backward on the same batch and weights (after "
                           "finish_gradient_synchronization), grad of", got["second"], got["first"],
                           atol=1e-7, rtol=1e-6)


def check_train(run: CaseRun) -> None:
    for name in ("sgd", "adam"):
        expected = ref.serial_training(ref.DDPProbeNet(seed=0), name, *IO)
        for rank in range(run.world_size):
            got = run.part("train", rank)
            expect(isinstance(got, dict) and name in got, f"rank {rank}: training results missing")
            assert_state_close(f"BucketedDDP + {name.upper()}: rank {rank} after {ref.TRAIN_STEPS} steps, "
                               "parameter", got[name], expected, atol=1e-5, rtol=1e-4)


CASES = [
    Case("p4_ddp_2rank", "grading.problems.p4_1_ddp.checks:probe_ddp", world_size=2, init_group=True, timeout_s=90,
         criteria=(
             Criterion("4.1.broadcast", "construction broadcasts parameters and buffers from rank 0", 2,
                       check_broadcast),
             Criterion("4.1.buckets", "bucket assignment: reverse order, byte cap, frozen excluded", 2,
                       check_buckets),
             Criterion("4.1.grads", "grads equal serial global-batch grads (1 per param, 3, 1 bucket)", 3,
                       check_grads),
             Criterion("4.1.overlap", "a bucket's async all-reduce launches before backward ends", 2,
                       check_overlap),
             Criterion("4.1.reset", "a second backward after finish gives the same grads", 1, check_reset),
             Criterion("4.1.train", "5 SGD and 5 Adam steps equal serial training", 2, check_train),
         )),
]

__all__ = ["CASES", "CheckFailed"]
