"""Problem 1 checks: dataset partitioning (1.1) and gradient averaging (1.2).

Probes run in rank processes and only *record* what the student code returns;
criteria run in the grader and judge it against ``grading.references.p1``.
"""
from __future__ import annotations

import datetime
import random
from collections import Counter

from grading.checks.common import call_outcome
from grading.references import p1 as ref
from grading.rubric import Case, CaseRun, CheckFailed, Criterion
from grading.compare import assert_state_close, describe
from grading.runner import expect

# (size, world_size, seed) configurations for partition_indices
PARTITION_CONFIGS = [(10, 3, 0), (12, 4, 7), (5, 1, 1), (2, 5, 3), (0, 3, 3), (101, 2, 11), (1000, 7, 1234)]
BAD_PARTITION_ARGS = [(-1, 2), (10, 0), (10, -3)]
DATASET = list(range(22))
GLOBAL_BATCH = 8


# ---------------------------------------------------------------- 1.1 probe
def probe_partition(ctx) -> None:
    """Rank r seeds the *global* random differently, then records partitions and loaders."""
    random.seed(100 + ctx.rank)
    from data_parallel.dataset import Partition, partition_dataset, partition_indices

    before = random.getstate()
    ctx.record("partitions", lambda: [partition_indices(size, ws, seed) for size, ws, seed in PARTITION_CONFIGS])
    ctx.record("default_seed", lambda: partition_indices(30, 3))
    ctx.record("seed_pair", lambda: [partition_indices(100, 2, seed=1), partition_indices(100, 2, seed=2)])
    ctx.record("rng_state", lambda: [before, random.getstate()])

    def bad_args():
        return [call_outcome(lambda size=size, ws=ws: partition_indices(size, ws, 0))
                for size, ws in BAD_PARTITION_ARGS]
    ctx.record("bad_args", bad_args)
    ctx.record("partition_class", lambda: (lambda p: [len(p), [p[i] for i in range(len(p))]])(
        Partition(list("abcdefg"), [3, 1, 4])))

    from data_parallel import dataset as student_dataset
    # isolate partition_dataset from the student's split and Partition (judged by their own criteria)
    student_dataset.partition_indices = ref.reference_partition_indices
    student_dataset.Partition = ref.ReferencePartition

    def loader_batches(rank, world_size):
        loader = partition_dataset(rank, world_size, DATASET, GLOBAL_BATCH, collate_fn=list)
        return [list(b) for b in loader]
    ctx.record("loader_2", lambda: loader_batches(ctx.rank, 2))
    if ctx.rank == 0:
        ctx.record("loader_3", lambda: [loader_batches(r, 3) for r in range(3)])


# ---------------------------------------------------------------- 1.1 criteria
def _partitions(run: CaseRun):
    return run.part("partitions", 0)


def check_coverage(run: CaseRun) -> None:
    for (size, ws, seed), parts in zip(PARTITION_CONFIGS, _partitions(run)):
        label = f"partition_indices({size}, {ws}, seed={seed})"
        expect(isinstance(parts, list) and len(parts) == ws, f"{label}: expected a list of {ws} parts, "
               f"got {describe(parts)} of length {len(parts) if hasattr(parts, '__len__') else '?'}")
        flat = [i for part in parts for i in part]
        dup = sorted(i for i, n in Counter(flat).items() if n > 1)
        expect(not dup, f"{label}: indices {dup[:5]} appear in more than one part")
        missing = sorted(set(range(size)) - set(flat))
        expect(not missing, f"{label}: indices {missing[:5]} are in no part")
        extra = sorted(set(flat) - set(range(size)))
        expect(not extra, f"{label}: indices {extra[:5]} are out of range")


def check_sizes(run: CaseRun) -> None:
    for (size, ws, seed), parts in zip(PARTITION_CONFIGS, _partitions(run)):
        want = [size // ws + (1 if r < size % ws else 0) for r in range(ws)]
        got = [len(p) for p in parts]
        expect(got == want, f"partition_indices({size}, {ws}, seed={seed}): part sizes {got}, expected {want}")


def check_deterministic(run: CaseRun) -> None:
    for name in ("partitions", "default_seed", "seed_pair"):
        a, b = run.part(name, 0), run.part(name, 1)
        expect(a == b, f"partition_indices gives different parts in two processes whose global random "
               f"states differ ('{name}'): it must shuffle with its own random.Random(seed)")


def check_rng_untouched(run: CaseRun) -> None:
    for rank in range(run.world_size):
        run.part("partitions", rank)          # only meaningful once partition_indices runs
        before, after = run.part("rng_state", rank)
        expect(before == after, f"rank {rank}: the global random state changed during partition_indices: "
               "use a private random.Random(seed)")


def check_seed_sensitivity(run: CaseRun) -> None:
    first, second = run.part("seed_pair", 0)
    expect(first != second, "partition_indices(100, 2) gives the same parts for seed=1 and seed=2")
    unshuffled = [list(range(50)), list(range(50, 100))]
    expect(first != unshuffled and sorted(first[0]) != first[0],
           "partition_indices(100, 2, seed=1) did not shuffle the indices")


def check_value_errors(run: CaseRun) -> None:
    outcomes = run.part("bad_args", 0)
    for (size, ws), outcome in zip(BAD_PARTITION_ARGS, outcomes):
        expect(outcome == "ValueError", f"partition_indices({size}, {ws}) must raise ValueError, got {outcome}")


def check_partition_class(run: CaseRun) -> None:
    got = run.part("partition_class", 0)
    expect(got == [3, ["d", "b", "e"]], f"Partition(list('abcdefg'), [3, 1, 4]): len and items {got}, "
           "expected 3 and ['d', 'b', 'e']")


def _check_loaders(label: str, per_rank: list, world_size: int) -> None:
    local = GLOBAL_BATCH // world_size
    seen = []
    for rank, batches in enumerate(per_rank):
        sizes = [len(b) for b in batches]
        expect(all(s == local for s in sizes[:-1]) and (not sizes or 0 < sizes[-1] <= local),
               f"{label}: rank {rank} batch sizes {sizes}, expected {local} per rank "
               f"(global batch {GLOBAL_BATCH} // world size {world_size})")
        seen.extend(x for b in batches for x in b)
    expect(sorted(seen) == DATASET, f"{label}: the ranks' loaders together do not cover the dataset "
           f"exactly once ({len(seen)} items for {len(DATASET)})")


def check_partition_dataset(run: CaseRun) -> None:
    _check_loaders("partition_dataset(world_size=2)", run.parts("loader_2"), 2)
    _check_loaders("partition_dataset(world_size=3)", run.part("loader_3", 0), 3)


# ---------------------------------------------------------------- 1.2 probe
def probe_comm(ctx) -> None:
    """Student setup (grader fallback), then average_gradients and an isolated train_step."""
    import torch
    import torch.distributed as dist

    calls = {"all_reduce": 0}
    real_all_reduce = dist.all_reduce

    def counting_all_reduce(*args, **kwargs):
        calls["all_reduce"] += 1
        return real_all_reduce(*args, **kwargs)
    dist.all_reduce = counting_all_reduce     # before the student module binds any name
    from data_parallel import comm

    timeout = datetime.timedelta(seconds=ctx.args.get("pg_timeout_s", 30))

    def setup():
        comm.setup_process_group(ctx.rank, ctx.world_size, "gloo", init_method=f"file://{ctx.store}",
                                 timeout=timeout)
        value = torch.tensor([float(ctx.rank + 1)])
        real_all_reduce(value)
        return [dist.get_rank(), dist.get_world_size(), str(dist.get_backend()), value.item()]
    if ctx.args.get("student_setup", True):
        ctx.record("setup", setup)
    if not dist.is_initialized():            # the student's setup failed: grade the rest anyway
        dist.init_process_group("gloo", init_method=f"file://{ctx.store}.grader", rank=ctx.rank,
                                world_size=ctx.world_size, timeout=timeout)

    def grads():
        model = ref.GradProbeNet(seed=0)
        inputs, targets = ref.batch(0)
        rank_inputs, rank_targets = (ref.shard(t, ctx.rank, ctx.world_size) for t in (inputs, targets))
        ref.loss_fn(model(rank_inputs), rank_targets).backward()
        calls["all_reduce"] = 0
        comm.average_gradients(model)
        return ref.grads_of(model)
    ctx.record("grads", grads)
    ctx.record("all_reduce_calls", lambda: calls["all_reduce"])
    if not ctx.args.get("train_step", True):
        return

    def train():
        comm.average_gradients = ref.reference_average_gradients   # isolate train_step from 1.2 averaging
        model = ref.GradProbeNet(seed=0)
        optimizer = torch.optim.SGD(model.parameters(), lr=ref.LEARNING_RATE)
        losses = []
        for step in range(ref.TRAIN_STEPS):
            inputs, targets = ref.batch(step)
            losses.append(comm.train_step(model, optimizer, ref.shard(inputs, ctx.rank, ctx.world_size),
                                          ref.shard(targets, ctx.rank, ctx.world_size), ref.loss_fn))
        return {"losses": losses, "params": ref.params_of(model)}
    ctx.record("train_step", train)


# ---------------------------------------------------------------- 1.2 criteria
def check_setup(run: CaseRun) -> None:
    for rank in range(run.world_size):
        got = run.part("setup", rank)
        want = [rank, run.world_size, "gloo", float(sum(range(1, run.world_size + 1)))]
        expect(got == want, f"setup_process_group: rank {rank} sees [rank, world size, backend, all_reduce of "
               f"rank+1] = {got}, expected {want}")


def check_grads(run: CaseRun) -> None:
    expected = ref.serial_gradients(seed=0, step=0)
    for rank in range(run.world_size):
        assert_state_close(f"average_gradients: rank {rank} grad of", run.part("grads", rank), expected,
                           atol=1e-6, rtol=1e-5)


def check_unused_grads_none(run: CaseRun) -> None:
    expected = ref.serial_gradients(seed=0, step=0)
    for rank in range(run.world_size):
        got = run.part("grads", rank)
        expect(isinstance(got, dict), f"rank {rank}: gradients missing")
        for name, ref_grad in expected.items():
            if ref_grad is None:
                expect(got.get(name) is None, f"average_gradients: rank {rank} gave parameter '{name}' a "
                       f"gradient ({describe(got.get(name))}); parameters whose grad is None must stay None")


def check_uses_all_reduce(run: CaseRun) -> None:
    for rank in range(run.world_size):
        run.part("grads", rank)               # only meaningful once average_gradients runs
        calls = run.part("all_reduce_calls", rank)
        expect(isinstance(calls, int) and calls >= 1,
               f"average_gradients: rank {rank} never called torch.distributed.all_reduce")


def check_train_step_updates(run: CaseRun) -> None:
    expected, _ = ref.serial_sgd(seed=0)
    for rank in range(run.world_size):
        got = run.part("train_step", rank)
        expect(isinstance(got, dict), f"rank {rank}: train_step results missing")
        assert_state_close(f"train_step: rank {rank} after {ref.TRAIN_STEPS} steps, parameter", got["params"],
                           expected, atol=1e-6, rtol=1e-5)


def check_train_step_loss(run: CaseRun) -> None:
    _, losses = ref.serial_sgd(seed=0)
    for rank in range(run.world_size):
        got = run.part("train_step", rank)["losses"]
        for step, value in enumerate(got):
            expect(type(value) is float, f"train_step: rank {rank} step {step} returned {describe(value)}, "
                   "expected a Python float")
        # Only the first step's value: later ones depend on the updates, judged by train_step_updates.
        want = losses[0][rank]
        expect(abs(got[0] - want) <= 1e-5 * max(1.0, abs(want)), f"train_step: rank {rank} returned loss "
               f"{got[0]:.6g} on its first step, expected this rank's local loss {want:.6g}")


CASES = [
    Case("p1_partition", "grading.checks.p1_data_parallel:probe_partition", world_size=2, init_group=False,
         timeout_s=60, criteria=(
             Criterion("1.1.coverage", "every index in exactly one part", 2, check_coverage),
             Criterion("1.1.sizes", "part sizes size//world (+1 for the first size%world)", 1, check_sizes),
             Criterion("1.1.deterministic", "same parts in processes with different global RNG", 2,
                        check_deterministic),
             Criterion("1.1.rng_untouched", "global random state unchanged", 1, check_rng_untouched),
             Criterion("1.1.seed_sensitivity", "shuffled, and a different seed gives different parts", 1,
                        check_seed_sensitivity),
             Criterion("1.1.value_errors", "ValueError for negative size or world_size < 1", 1,
                        check_value_errors),
             Criterion("1.1.partition_class", "Partition len/getitem view the chosen indices", 1,
                        check_partition_class),
             Criterion("1.1.partition_dataset", "per-rank loaders: batch_size // world, cover the data", 1,
                        check_partition_dataset),
         )),
    Case("p1_comm_2rank", "grading.checks.p1_data_parallel:probe_comm", world_size=2, init_group=False,
         timeout_s=90, criteria=(
             Criterion("1.2.setup", "setup_process_group joins the group (rank, world, backend)", 2,
                        check_setup),
             Criterion("1.2.grads_2rank", "2-rank averaged grads equal the serial global-batch grads", 4,
                        check_grads),
             Criterion("1.2.unused_grads_none", "parameters without grad keep grad None", 2,
                        check_unused_grads_none),
             Criterion("1.2.uses_all_reduce", "average_gradients uses torch.distributed.all_reduce", 1,
                        check_uses_all_reduce),
             Criterion("1.2.train_step_updates", "3 train_step updates equal serial SGD on the global batch",
                        4, check_train_step_updates),
             Criterion("1.2.train_step_loss", "train_step returns the local loss as a float", 2,
                        check_train_step_loss),
         )),
]

__all__ = ["CASES", "CheckFailed"]
