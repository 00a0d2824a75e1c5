"""Buggy variants of 1.1 (staff only, not released): each loses exactly the criteria and breaks the clauses it names."""
from grading.kit.variants import Clause, Variant, edited

DATASET = "data_parallel/dataset.py"

# Most variants are the reference region with targeted edits (``edited``: each old text must occur once). Some were
# written with shorter error messages and keep that difference as the named swaps below, beside their bug.
_ARGS_CHECKS = """if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")"""
_ONE_ARGS_CHECK = (_ARGS_CHECKS, 'if size < 0 or world_size < 1:\n        raise ValueError("bad arguments")')
_SHORT_BATCH_ERROR = ('f"batch_size {batch_size} gives no examples per rank for world_size {world_size}"',
                      '"no examples per rank"')

VARIANTS = [
    Variant("global_random_seeded", DATASET, "partition_indices", edited(DATASET, "partition_indices", _ONE_ARGS_CHECK,
        ("random.Random(seed).shuffle(order)", "random.seed(seed)\n    random.shuffle(order)")),
        frozenset({"1.1.rng_untouched"}),
        breaks=(Clause("1", "partition_indices",
                       "shuffle with its own `random.Random(seed)`, global `random` untouched", "1.1.rng_untouched"),)),
    Variant("global_random_unseeded", DATASET, "partition_indices", edited(
        DATASET, "partition_indices", _ONE_ARGS_CHECK, ("random.Random(seed).shuffle(order)", "random.shuffle(order)")),
        frozenset({"1.1.deterministic", "1.1.rng_untouched", "1.1.exact", "1.1.exact_hidden"}),
        breaks=(Clause("2", "partition_indices",
                       "same arguments give the same parts in every process", "1.1.deterministic"),)),
    Variant("overlapping_slices", DATASET, "partition_indices", """
        if size < 0 or world_size < 1:
            raise ValueError("bad arguments")
        order = list(range(size))
        random.Random(seed).shuffle(order)
        base, extra = divmod(size, world_size)
        return [order[rank * base:rank * base + base + (1 if rank < extra else 0)] for rank in range(world_size)]
    """, frozenset({"1.1.coverage", "1.1.exact", "1.1.exact_hidden", "1.1.edge_cases"}),
        breaks=(Clause("5", "partition_indices", "every index in exactly one part", "1.1.coverage"),)),
    Variant("no_value_error", DATASET, "partition_indices", edited(DATASET, "partition_indices", (
        _ARGS_CHECKS + "\n    order = list(range(size))", "order = list(range(max(size, 0)))"), (
        "base, extra = divmod(size, world_size)",
        "world_size = max(world_size, 1)\n    base, extra = divmod(len(order), world_size)")),
        frozenset({"1.1.value_errors"}),
        breaks=(Clause("8", "partition_indices", "ValueError for size < 0 or world_size < 1", "1.1.value_errors"),)),
    Variant("ceil_sized_chunks", DATASET, "partition_indices", """
        if size < 0 or world_size < 1:
            raise ValueError("bad arguments")
        order = list(range(size))
        random.Random(seed).shuffle(order)
        chunk = -(-size // world_size)
        return [order[rank * chunk:(rank + 1) * chunk] for rank in range(world_size)]
    """, frozenset({"1.1.sizes", "1.1.exact", "1.1.exact_hidden"}),
        breaks=(Clause("4", "partition_indices", "part r gets size//world (+1 when r < size%world)", "1.1.sizes"),)),
    Variant("seed_ignored", DATASET, "partition_indices", edited(DATASET, "partition_indices", _ONE_ARGS_CHECK, (
        "random.Random(seed)", "random.Random(DEFAULT_SEED)")),
        frozenset({"1.1.seed_sensitivity", "1.1.exact", "1.1.exact_hidden"}),
        breaks=(Clause("7", "partition_indices", "the seed changes the shuffle", "1.1.seed_sensitivity"),)),
    Variant("partition_getitem_ignores_index", DATASET, "__getitem__", """
        return self.data[i]
    """, frozenset({"1.1.partition_class"}),
        breaks=(Clause("9", "Partition", "`len(p) == len(index)`, `p[i] == data[index[i]]`", "1.1.partition_class"),)),
    Variant("partition_getitem_off_by_one", DATASET, "__getitem__", """
        return self.data[self.index[i + 1]]
    """, frozenset({"1.1.partition_class"}), hint="IndexError: list index out of range (at data_parallel/dataset.py:",
        breaks=(Clause("9c", "Partition",
                       "`__getitem__` returns the `i`-th chosen item, `data[index[i]]`, not the one after it",
                       "1.1.partition_class"),)),
    Variant("full_batch_per_rank", DATASET, "partition_dataset", """
        part = Partition(dataset, partition_indices(len(dataset), world_size, seed)[rank])
        return DataLoader(part, batch_size=batch_size, shuffle=False, collate_fn=collate_fn)
    """, frozenset({"1.1.partition_dataset", "1.1.partition_dataset_errors"}),
        breaks=(Clause("10", "partition_dataset",
                       "per-rank batch `batch_size // world_size`, the rank's part in order",
                       "1.1.partition_dataset"),)),
    Variant("round_robin_split", DATASET, "partition_indices", """
        if size < 0 or world_size < 1:
            raise ValueError("bad arguments")
        order = list(range(size))
        random.Random(seed).shuffle(order)
        return [order[rank::world_size] for rank in range(world_size)]
    """, frozenset({"1.1.exact", "1.1.exact_hidden"}),
        breaks=(Clause("3", "partition_indices",
                       "contiguous slices of the shuffled list in rank order", "1.1.exact"),)),
    Variant("refuses_fewer_items_than_ranks", DATASET, "partition_indices", edited(DATASET, "partition_indices", (
        _ARGS_CHECKS, """if size < world_size or world_size < 1:
        raise ValueError("need at least one item per rank")""")),
        frozenset({"1.1.edge_cases", "1.1.exact_hidden"}),
        breaks=(Clause("6", "partition_indices",
                       "parts may be empty; size 0 gives empty parts (edge case, own criterion)", "1.1.edge_cases"),)),
    Variant("parts_as_tensors", DATASET, "partition_indices", """
        import torch
        if size < 0 or world_size < 1:
            raise ValueError("bad arguments")
        order = list(range(size))
        random.Random(seed).shuffle(order)
        return list(torch.tensor(order, dtype=torch.long).tensor_split(world_size))
    """, frozenset({"1.1.coverage", "1.1.sizes", "1.1.exact", "1.1.exact_hidden", "1.1.edge_cases"}),
            hint="returned a list of tensor",
        breaks=(Clause("5b", "partition_indices",
                       "returns a list of `world_size` lists of ints (not tensors; the message names what came back)",
                       "1.1.coverage"),)),
    Variant("partition_getitem_returns_position", DATASET, "__getitem__", """
        return self.index[i]
    """, frozenset({"1.1.partition_class"}), hint="items of type int",
        breaks=(Clause("9b", "Partition",
                       "`__getitem__` returns the item `data[index[i]]`, not its position `index[i]`",
                       "1.1.partition_class"),)),
    Variant("loader_returns_batch_list", DATASET, "partition_dataset", edited(
        DATASET, "partition_dataset", _SHORT_BATCH_ERROR, ("return DataLoader(", "return list(DataLoader("),
        ("collate_fn=collate_fn)", "collate_fn=collate_fn))")),
        frozenset({"1.1.partition_dataset"}), hint="partition_dataset returned list, expected a torch.utils.data",
        breaks=(Clause("10e", "partition_dataset",
                       "returns a `DataLoader`, not a list of its batches", "1.1.partition_dataset"),)),
    Variant("drops_last_short_batch", DATASET, "partition_dataset", edited(DATASET, "partition_dataset",
        _SHORT_BATCH_ERROR, ("collate_fn=collate_fn)", "collate_fn=collate_fn, drop_last=True)")),
        frozenset({"1.1.partition_dataset"}), hint="was dropped (drop_last)",
        breaks=(Clause("10d", "partition_dataset",
                       "a part's last, smaller batch is still yielded (`drop_last=False`: every item loaded)",
                       "1.1.partition_dataset"),)),
    Variant("partition_dataset_without_checks", DATASET, "partition_dataset", """
        part = Partition(dataset, partition_indices(len(dataset), world_size, seed)[rank])
        return DataLoader(part, batch_size=max(batch_size // world_size, 1), shuffle=False, collate_fn=collate_fn)
    """, frozenset({"1.1.partition_dataset_errors"}),
        breaks=(Clause("11", "partition_dataset",
                       "ValueError for a rank outside [0, world) or a per-rank batch of 0",
                       "1.1.partition_dataset_errors"),)),
    Variant("rank_at_world_size_only_refused", DATASET, "partition_dataset", edited(DATASET, "partition_dataset", (
        "if not 0 <= rank < world_size:", "if rank < 0 or rank == world_size:")),
        frozenset({"1.1.partition_dataset_errors"}),
        breaks=(Clause("11b", "partition_dataset",
                       "... every rank outside, beyond the world size too, not only `rank == world_size`",
                       "1.1.partition_dataset_errors"),)),
    Variant("batch_of_one_refused", DATASET, "partition_dataset", edited(DATASET, "partition_dataset", (
        "if local_batch < 1:", "if local_batch < 2:")), frozenset({"1.1.partition_dataset_errors"}),
        breaks=(Clause("11c", "partition_dataset",
                       "a per-rank batch of 1 (`batch_size == world_size`) is fine", "1.1.partition_dataset_errors"),)),
    Variant("collate_fn_ignored", DATASET, "partition_dataset", edited(
        DATASET, "partition_dataset", _SHORT_BATCH_ERROR, ("shuffle=False, collate_fn=collate_fn)", "shuffle=False)")),
        frozenset({"1.1.partition_dataset"}),
        breaks=(Clause("10b", "partition_dataset",
                       "the DataLoader uses the given `collate_fn`", "1.1.partition_dataset"),)),
    Variant("loader_seed_ignored", DATASET, "partition_dataset", edited(
        DATASET, "partition_dataset", _SHORT_BATCH_ERROR, ("world_size, seed)[rank]", "world_size)[rank]")),
        frozenset({"1.1.partition_dataset"}), hint="likely cause: the seed was not passed on",
        breaks=(Clause("10c", "partition_dataset",
                       "the part of the given `seed`, passed on to partition_indices (seed 7, not the default)",
                       "1.1.partition_dataset"),)),
]

NOT_GRADED = """
Freedoms: `partition_dataset` may build the loader with any other `DataLoader` options that keep the stated batches
(the probe reads what it yields).
"""
