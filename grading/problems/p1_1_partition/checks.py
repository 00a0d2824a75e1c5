"""Problem 1.1 checks: ``partition_indices``, ``Partition``, ``partition_dataset``.

The probe records what the student functions return; the criteria judge it in the grader against expected
partitions stored as data (``Expected``). ``partition_dataset`` runs on recorded partitions and torch's own
``Subset`` instead of the student's ``partition_indices`` and ``Partition`` (``swaps``), so it is judged on its own.
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

import torch

from grading.check import PUBLIC, Recorded, SplitRun, SubProblem, Swap, apply, describe, expect
from grading.problems.probe_helpers import call_outcome
from grading.problems.p1_1_partition import ID, TITLE

Call = tuple[int, int, int]                # (size, world_size, seed): one partition_indices call
Parts = list[list[int]]


@dataclass(frozen=True)
class Inputs:
    """What the split-dependent probe part runs on: the main partition_indices calls."""

    partitions: tuple[Call, ...]


@dataclass(frozen=True)
class Expected:
    """The parts of every call the criteria compare with, and the ones the partition_dataset stand-in replays."""

    partitions: dict[Call, Parts]
    loader: dict[Call, Parts]


DEFAULT_SEED = 1234                      # the contract's default seed (data_parallel.dataset.DEFAULT_SEED)
EDGE_CONFIGS: list[Call] = [(2, 5, 3), (0, 3, 3), (3, 3, 5)]     # judged by their own criterion
DEFAULT_SEED_CALL = (30, 3)              # partition_indices(30, 3): the default seed
BAD_ARGS = [(-1, 2), (10, 0), (10, -3)]
DATASET = [f"example{k}" for k in range(22)]
GLOBAL_BATCH = 8
LOADER_WORLD_SIZES = (2, 3)
LOADER_SEED = 7                          # partition_dataset(..., seed=LOADER_SEED): the seed must be passed on
# (rank, world_size, batch_size): ranks out of range (the world size, beyond it, negative), a global batch smaller
# than the world; a per-rank batch of 1 is fine
BAD_LOADER_ARGS = [(2, 2, 8), (3, 2, 8), (-1, 2, 8), (0, 4, 3)]
ONE_PER_RANK = (0, 2, 2)

PROBLEM = SubProblem(ID, TITLE, __package__,
                     inputs=Inputs(partitions=((10, 3, 0), (12, 4, 7), (5, 1, 1), (101, 2, 11), (1000, 7, 1234))),
                     expected_type=Expected, expected_in_ranks=(PUBLIC,))   # the loader's stand-in replays them

P_PARTITIONS = "partitions"    # a split part: recorded once per split
P_EDGE = "edge_partitions"
P_DEFAULT_SEED = "default_seed"
P_SEED_PAIR = "seed_pair"
P_RNG_STATE = "rng_state"
P_BAD_ARGS = "bad_args"
P_PARTITION_CLASS = "partition_class"
P_LOADER_2 = "loader_2"
P_LOADER_3 = "loader_3"
P_LOADER_SEED = "loader_seed"
P_LOADER_ERRORS = "loader_errors"


def partition_calls(inputs: Inputs) -> list[Call]:
    """Every partition_indices call whose parts the criteria compare with on ``inputs``."""
    return [*inputs.partitions, *EDGE_CONFIGS, (*DEFAULT_SEED_CALL, DEFAULT_SEED)]


def loader_calls() -> list[Call]:
    """The partition_indices calls partition_dataset makes in the probe (the recorded table covers exactly these)."""
    return [*((len(DATASET), world_size, DEFAULT_SEED) for world_size in LOADER_WORLD_SIZES),
            (len(DATASET), 2, LOADER_SEED)]


def swaps(*expected: Expected) -> list[Swap]:
    """The swaps of this case: partition_indices replays the recorded loader parts of ``expected``; Subset."""
    table = {call: parts for e in expected for call, parts in e.loader.items()}
    return [
        Swap("data_parallel.dataset", "partition_indices", lambda: _recorded_partitions(table),
             "1.1.partition_dataset is judged apart from the student's partition_indices"),
        Swap("data_parallel.dataset", "Partition", _subset,
             "1.1.partition_dataset is judged apart from the student's Partition (torch's Subset stands in)"),
    ]


def _recorded_partitions(table: dict):
    """Stand-in for ``partition_indices``: a lookup in the recorded partitions (no shuffling, no splitting)."""
    recorded = Recorded(table, "partition_indices")

    def partition_indices(size: int, world_size: int, seed: int = DEFAULT_SEED) -> list[list[int]]:
        return recorded(size, world_size, seed)
    return partition_indices


def _subset():
    from torch.utils.data import Subset
    return Subset


def _tagged_batch(items: list) -> dict:
    """The probe's ``collate_fn``: a batch it can recognise (the loader must use it)."""
    return {"items": list(items)}


# ---------------------------------------------------------------- probe
def probe_partition(ctx) -> None:
    """Rank r seeds the *global* random differently, then records partitions and loaders."""
    random.seed(100 + ctx.rank)
    from torch.utils.data import DataLoader

    from data_parallel.dataset import Partition, partition_dataset, partition_indices

    before = random.getstate()
    PROBLEM.each_split(ctx, lambda inputs: ctx.record(P_PARTITIONS, lambda: [partition_indices(*c)
                                                                             for c in inputs.partitions]))
    ctx.record(P_EDGE, lambda: [partition_indices(*c) for c in EDGE_CONFIGS])
    ctx.record(P_DEFAULT_SEED, lambda: partition_indices(*DEFAULT_SEED_CALL))
    ctx.record(P_SEED_PAIR, lambda: [partition_indices(100, 2, seed=1), partition_indices(100, 2, seed=2)])
    ctx.record(P_RNG_STATE, lambda: [before, random.getstate()])
    ctx.record(P_BAD_ARGS, lambda: [call_outcome(lambda s=s, w=w: partition_indices(s, w, 0)) for s, w in BAD_ARGS])
    ctx.record(P_PARTITION_CLASS, lambda: (lambda p: [len(p), [p[i] for i in range(len(p))]])(
        Partition(list("abcdefg"), [3, 1, 4])))

    apply(swaps(*PROBLEM.shipped_expected(ctx)))

    def loader_batches(rank, world_size, **seed):
        loader = partition_dataset(rank, world_size, DATASET, GLOBAL_BATCH, collate_fn=_tagged_batch, **seed)
        if not isinstance(loader, DataLoader):
            return f"partition_dataset returned {describe(loader)}, expected a torch.utils.data.DataLoader"
        return [b["items"] if isinstance(b, dict) else f"a batch that collate_fn did not make: {b!r}"[:200]
                for b in loader]
    ctx.record(P_LOADER_2, lambda: loader_batches(ctx.rank, 2))
    if ctx.rank == 0:
        ctx.record(P_LOADER_3, lambda: [loader_batches(r, 3) for r in range(3)])
        ctx.record(P_LOADER_SEED, lambda: [loader_batches(r, 2, seed=LOADER_SEED) for r in range(2)])
        ctx.record(P_LOADER_ERRORS, lambda: [call_outcome(lambda a=a: partition_dataset(a[0], a[1], DATASET, a[2]))
                                             for a in (*BAD_LOADER_ARGS, ONE_PER_RANK)])


CASE = PROBLEM.case("p1_partition", probe_partition, world_size=2, init_group=False, timeout_s=60,
                    split_parts=(P_PARTITIONS,))


# ---------------------------------------------------------------- criteria
def _label(size: int, world_size: int, seed: int) -> str:
    return f"partition_indices({size}, {world_size}, seed={seed})"


def _check_lists(label: str, parts, world_size: int) -> None:
    """``parts`` is what the contract says partition_indices returns: a list of ``world_size`` lists of ints."""
    want = f"expected a list of {world_size} lists of ints"
    expect(isinstance(parts, list), f"{label} returned {describe(parts)}, {want}")
    expect(len(parts) == world_size, f"{label} returned a list of {len(parts)} parts, {want}")
    odd = [describe(p) for p in parts if not isinstance(p, list)]
    expect(not odd, f"{label} returned a list of {', '.join(sorted(set(odd)))}, {want}")
    items = sorted({describe(i) for p in parts for i in p if type(i) is not int})
    expect(not items, f"{label} returned parts holding {', '.join(items)}, {want}")


def _comparable(value):
    """``value`` with tensors turned into lists and tuples into lists, so two calls' results compare with ``==``
    whatever they are (whether they are the stated lists of ints is ``_check_lists``'s to judge)."""
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_comparable(item) for item in value]
    return value


def _check_cover(label: str, parts, size: int, world_size: int) -> None:
    _check_lists(label, parts, world_size)
    flat = [i for part in parts for i in part]
    dup = sorted(i for i, n in Counter(flat).items() if n > 1)
    expect(not dup, f"{label}: indices {dup[:5]} appear in more than one part")
    missing = sorted(set(range(size)) - set(flat))
    expect(not missing, f"{label}: indices {missing[:5]} are in no part")
    extra = sorted(set(flat) - set(range(size)))
    expect(not extra, f"{label}: indices {extra[:5]} are out of range")


def _check_sizes(label: str, parts, expected: Parts) -> None:
    want = [len(p) for p in expected]
    _check_lists(label, parts, len(want))
    got = [len(p) for p in parts]
    expect(got == want, f"{label}: part sizes {got}, expected {want} (size // world_size each, one more for the "
           "first size % world_size parts)")


@CASE.criterion("1.1.coverage", "every index in exactly one part", points=2, reads=(P_PARTITIONS,))
def check_coverage(run: SplitRun) -> None:
    for config, parts in zip(run.inputs.partitions, run.part(P_PARTITIONS)):
        _check_cover(_label(*config), parts, config[0], config[1])


@CASE.criterion("1.1.sizes", "part sizes size//world (+1 for the first size%world)", points=1, reads=(P_PARTITIONS,))
def check_sizes(run: SplitRun) -> None:
    expected = run.expected.partitions
    for config, parts in zip(run.inputs.partitions, run.part(P_PARTITIONS)):
        _check_sizes(_label(*config), parts, expected[config])


def _check_default_seed(run: SplitRun) -> None:
    got = run.part(P_DEFAULT_SEED)
    want = run.expected.partitions[(*DEFAULT_SEED_CALL, DEFAULT_SEED)]
    _check_lists(f"partition_indices{DEFAULT_SEED_CALL}", got, DEFAULT_SEED_CALL[1])
    expect(got == want, f"partition_indices{DEFAULT_SEED_CALL} (default seed) gave {got}, expected {want}: "
           "the default seed is DEFAULT_SEED")


@CASE.criterion("1.1.exact", "the shuffled indices, cut into contiguous slices in rank order", points=1,
                reads=(P_PARTITIONS, P_DEFAULT_SEED),
                public_only=(_check_default_seed,))
def check_exact(run: SplitRun) -> None:
    expected = run.expected.partitions
    for config, parts in zip(run.inputs.partitions, run.part(P_PARTITIONS)):
        label, want = _label(*config), expected[config]
        _check_cover(label, parts, config[0], config[1])
        _check_sizes(label, parts, want)
        for rank, (got, ref) in enumerate(zip(parts, want)):
            expect(list(got) == ref, f"{label}: part {rank} is {list(got)[:8]}..., expected {ref[:8]}... "
                   "(shuffle list(range(size)) with random.Random(seed), then rank r takes the next "
                   "contiguous slice, rank 0 first)")


@CASE.criterion("1.1.edge_cases", "empty parts (size < world_size) and size 0", points=1, reads=(P_EDGE,))
def check_edge_cases(run: SplitRun) -> None:
    expected = run.expected.partitions
    for config, parts in zip(EDGE_CONFIGS, run.part(P_EDGE)):
        _check_cover(_label(*config), parts, config[0], config[1])
        _check_sizes(_label(*config), parts, expected[config])


@CASE.criterion("1.1.deterministic", "same parts in processes with different global RNG", points=1,
                reads=(P_PARTITIONS, P_DEFAULT_SEED, P_SEED_PAIR))
def check_deterministic(run: SplitRun) -> None:
    for name in (P_PARTITIONS, P_DEFAULT_SEED, P_SEED_PAIR):
        a, b = _comparable(run.part(name, 0)), _comparable(run.part(name, 1))
        expect(a == b, f"partition_indices gives different parts in two processes whose global random "
               f"states differ ('{name}'): it must shuffle with its own random.Random(seed)")


@CASE.criterion("1.1.rng_untouched", "global random state unchanged", points=1, reads=(P_PARTITIONS, P_RNG_STATE))
def check_rng_untouched(run: SplitRun) -> None:
    for rank in range(run.world_size):
        run.part(P_PARTITIONS, rank)          # only meaningful once partition_indices runs
        before, after = run.part(P_RNG_STATE, rank)
        expect(before == after, f"rank {rank}: the global random state changed during partition_indices: "
               "use a private random.Random(seed)")


@CASE.criterion("1.1.seed_sensitivity", "shuffled, and a different seed gives different parts", points=1,
                reads=(P_SEED_PAIR,))
def check_seed_sensitivity(run: SplitRun) -> None:
    first, second = _comparable(run.part(P_SEED_PAIR, 0))
    expect(first != second, "partition_indices(100, 2) gives the same parts for seed=1 and seed=2")
    unshuffled = [list(range(50)), list(range(50, 100))]
    expect(first != unshuffled and sorted(first[0]) != first[0],
           "partition_indices(100, 2, seed=1) did not shuffle the indices")


@CASE.criterion("1.1.value_errors", "ValueError for negative size or world_size < 1", points=1, reads=(P_BAD_ARGS,))
def check_value_errors(run: SplitRun) -> None:
    for (size, ws), outcome in zip(BAD_ARGS, run.part(P_BAD_ARGS, 0)):
        expect(outcome == "ValueError", f"partition_indices({size}, {ws}) must raise ValueError, got {outcome}")


@CASE.criterion("1.1.partition_class", "Partition len/getitem view the chosen indices", points=1,
                reads=(P_PARTITION_CLASS,))
def check_partition_class(run: SplitRun) -> None:
    got = run.part(P_PARTITION_CLASS, 0)
    kinds = sorted({describe(item) for item in got[1]}) if isinstance(got, list) and len(got) == 2 else []
    expect(got == [3, ["d", "b", "e"]], f"Partition(list('abcdefg'), [3, 1, 4]): len and items {got}"
           + (f" (items of type {', '.join(kinds)})" if kinds else "") + ", expected 3 and the items "
           "data[index[i]]: ['d', 'b', 'e'] (str)")


def _check_loaders(label: str, per_rank: list, world_size: int, expected: Expected,
                   seed: int = DEFAULT_SEED) -> None:
    local = GLOBAL_BATCH // world_size
    parts = expected.loader[len(DATASET), world_size, seed]
    default_parts = expected.loader.get((len(DATASET), world_size, DEFAULT_SEED))
    for rank, batches in enumerate(per_rank):
        expect(not isinstance(batches, str), f"{label}: rank {rank}: {batches}")
        odd = [b for b in batches if isinstance(b, str)]
        expect(not odd, f"{label}: rank {rank} got {odd[0] if odd else ''} (pass collate_fn to the DataLoader)")
        sizes = [len(b) for b in batches]
        expect(all(s == local for s in sizes[:-1]) and (not sizes or 0 < sizes[-1] <= local),
               f"{label}: rank {rank} batch sizes {sizes}, expected {local} per rank "
               f"(global batch {GLOBAL_BATCH} // world size {world_size})")
        want = [DATASET[i] for i in parts[rank]]
        got = [x for b in batches for x in b]
        unseeded = seed != DEFAULT_SEED and default_parts and got == [DATASET[i] for i in default_parts[rank]]
        short_dropped = len(want) % local and got == want[:len(want) - len(want) % local]
        expect(got == want, f"{label}: rank {rank} loads {got[:6]}..., expected its part "
               f"partition_indices(len(dataset), world_size, seed)[rank] in order: {want[:6]}..."
               + ("\nlikely cause: the seed was not passed on to partition_indices (these are the default "
                  "seed's parts)" if unseeded else "")
               + (f"\nlikely cause: the last, smaller batch ({len(want) % local} of the part's {len(want)} items) "
                  "was dropped (drop_last); every item of the part is loaded" if short_dropped else ""))


@CASE.criterion("1.1.partition_dataset", "per-rank DataLoaders: batch_size // world (a smaller last batch kept), "
                "the rank's part (of the given seed) in order, the given collate_fn", points=1,
                reads=(P_LOADER_2, P_LOADER_3, P_LOADER_SEED))
def check_partition_dataset(run: SplitRun) -> None:
    expected = run.expected
    _check_loaders("partition_dataset(world_size=2)", run.parts(P_LOADER_2), 2, expected)
    _check_loaders("partition_dataset(world_size=3)", run.part(P_LOADER_3, 0), 3, expected)
    _check_loaders(f"partition_dataset(world_size=2, seed={LOADER_SEED})", run.part(P_LOADER_SEED, 0), 2, expected,
                   LOADER_SEED)


@CASE.criterion("1.1.partition_dataset_errors", "partition_dataset: ValueError for a bad rank or batch < world; "
                "batch == world is fine", points=1, reads=(P_LOADER_ERRORS,))
def check_partition_dataset_errors(run: SplitRun) -> None:
    *bad, one = run.part(P_LOADER_ERRORS, 0)
    for (rank, ws, batch), outcome in zip(BAD_LOADER_ARGS, bad):
        expect(outcome == "ValueError", f"partition_dataset(rank={rank}, world_size={ws}, batch_size={batch}) "
               f"must raise ValueError, got {outcome}")
    rank, ws, batch = ONE_PER_RANK
    expect(one == "no exception", f"partition_dataset(rank={rank}, world_size={ws}, batch_size={batch}) raised "
           f"{one}; a per-rank batch of 1 is a batch (only a per-rank batch of 0 is refused)")
