"""Problem 1 buggy variants: each bug loses exactly its intended criteria.

Most variants are the reference region with targeted edits (``edited``: each old text must occur once). Some were
written with shorter error messages and keep that difference as the named swaps below, beside their bug.
"""
import pytest

from tests.kit.variants import Variant, assert_verdicts, edited, grade_variant

DATASET, COMM = "data_parallel/dataset.py", "data_parallel/comm.py"

_ARGS_CHECKS = """if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")"""
_ONE_ARGS_CHECK = (_ARGS_CHECKS, 'if size < 0 or world_size < 1:\n        raise ValueError("bad arguments")')
_SHORT_BATCH_ERROR = ('f"batch_size {batch_size} gives no examples per rank for world_size {world_size}"',
                      '"no examples per rank"')
_NO_SET_DEVICE = ('    if backend == "nccl":\n        torch.cuda.set_device(rank % torch.cuda.device_count())\n', "")
_MASTER_DEFAULTS = ('        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")\n'
                    '        os.environ.setdefault("MASTER_PORT", "29500")\n')
_INIT_TIMEOUT = ",\n                            timeout=datetime.timedelta(seconds=60) if timeout is None else timeout)"

VARIANTS = [
    Variant("global_random_seeded", DATASET, "partition_indices", edited(DATASET, "partition_indices", _ONE_ARGS_CHECK,
        ("random.Random(seed).shuffle(order)", "random.seed(seed)\n    random.shuffle(order)")),
        frozenset({"1.1.rng_untouched"})),
    Variant("global_random_unseeded", DATASET, "partition_indices", edited(
        DATASET, "partition_indices", _ONE_ARGS_CHECK, ("random.Random(seed).shuffle(order)", "random.shuffle(order)")),
        frozenset({"1.1.deterministic", "1.1.rng_untouched", "1.1.exact", "1.1.exact_hidden"})),
    Variant("overlapping_slices", DATASET, "partition_indices", """
        if size < 0 or world_size < 1:
            raise ValueError("bad arguments")
        order = list(range(size))
        random.Random(seed).shuffle(order)
        base, extra = divmod(size, world_size)
        return [order[rank * base:rank * base + base + (1 if rank < extra else 0)] for rank in range(world_size)]
    """, frozenset({"1.1.coverage", "1.1.exact", "1.1.exact_hidden", "1.1.edge_cases"})),
    Variant("no_value_error", DATASET, "partition_indices", edited(DATASET, "partition_indices", (
        _ARGS_CHECKS + "\n    order = list(range(size))", "order = list(range(max(size, 0)))"), (
        "base, extra = divmod(size, world_size)",
        "world_size = max(world_size, 1)\n    base, extra = divmod(len(order), world_size)")),
        frozenset({"1.1.value_errors"})),
    Variant("ceil_sized_chunks", DATASET, "partition_indices", """
        if size < 0 or world_size < 1:
            raise ValueError("bad arguments")
        order = list(range(size))
        random.Random(seed).shuffle(order)
        chunk = -(-size // world_size)
        return [order[rank * chunk:(rank + 1) * chunk] for rank in range(world_size)]
    """, frozenset({"1.1.sizes", "1.1.exact", "1.1.exact_hidden"})),
    Variant("seed_ignored", DATASET, "partition_indices", edited(DATASET, "partition_indices", _ONE_ARGS_CHECK, (
        "random.Random(seed)", "random.Random(DEFAULT_SEED)")),
        frozenset({"1.1.seed_sensitivity", "1.1.exact", "1.1.exact_hidden"})),
    Variant("partition_getitem_ignores_index", DATASET, "__getitem__", """
        return self.data[i]
    """, frozenset({"1.1.partition_class"})),
    Variant("partition_getitem_off_by_one", DATASET, "__getitem__", """
        return self.data[self.index[i + 1]]
    """, frozenset({"1.1.partition_class"}), hint="IndexError: list index out of range (at data_parallel/dataset.py:"),
    Variant("full_batch_per_rank", DATASET, "partition_dataset", """
        part = Partition(dataset, partition_indices(len(dataset), world_size, seed)[rank])
        return DataLoader(part, batch_size=batch_size, shuffle=False, collate_fn=collate_fn)
    """, frozenset({"1.1.partition_dataset", "1.1.partition_dataset_errors"})),
    Variant("round_robin_split", DATASET, "partition_indices", """
        if size < 0 or world_size < 1:
            raise ValueError("bad arguments")
        order = list(range(size))
        random.Random(seed).shuffle(order)
        return [order[rank::world_size] for rank in range(world_size)]
    """, frozenset({"1.1.exact", "1.1.exact_hidden"})),
    Variant("refuses_fewer_items_than_ranks", DATASET, "partition_indices", edited(DATASET, "partition_indices", (
        _ARGS_CHECKS, """if size < world_size or world_size < 1:
        raise ValueError("need at least one item per rank")""")),
        frozenset({"1.1.edge_cases", "1.1.exact_hidden"})),
    Variant("parts_as_tensors", DATASET, "partition_indices", """
        import torch
        if size < 0 or world_size < 1:
            raise ValueError("bad arguments")
        order = list(range(size))
        random.Random(seed).shuffle(order)
        return list(torch.tensor(order, dtype=torch.long).tensor_split(world_size))
    """, frozenset({"1.1.coverage", "1.1.sizes", "1.1.exact", "1.1.exact_hidden", "1.1.edge_cases"}),
            hint="returned a list of tensor"),
    Variant("partition_getitem_returns_position", DATASET, "__getitem__", """
        return self.index[i]
    """, frozenset({"1.1.partition_class"}), hint="items of type int"),
    Variant("loader_returns_batch_list", DATASET, "partition_dataset", edited(
        DATASET, "partition_dataset", _SHORT_BATCH_ERROR, ("return DataLoader(", "return list(DataLoader("),
        ("collate_fn=collate_fn)", "collate_fn=collate_fn))")),
        frozenset({"1.1.partition_dataset"}), hint="partition_dataset returned list, expected a torch.utils.data"),
    Variant("drops_last_short_batch", DATASET, "partition_dataset", edited(DATASET, "partition_dataset",
        _SHORT_BATCH_ERROR, ("collate_fn=collate_fn)", "collate_fn=collate_fn, drop_last=True)")),
        frozenset({"1.1.partition_dataset"}), hint="was dropped (drop_last)"),
    Variant("partition_dataset_without_checks", DATASET, "partition_dataset", """
        part = Partition(dataset, partition_indices(len(dataset), world_size, seed)[rank])
        return DataLoader(part, batch_size=max(batch_size // world_size, 1), shuffle=False, collate_fn=collate_fn)
    """, frozenset({"1.1.partition_dataset_errors"})),
    Variant("rank_at_world_size_only_refused", DATASET, "partition_dataset", edited(DATASET, "partition_dataset", (
        "if not 0 <= rank < world_size:", "if rank < 0 or rank == world_size:")),
        frozenset({"1.1.partition_dataset_errors"})),
    Variant("batch_of_one_refused", DATASET, "partition_dataset", edited(DATASET, "partition_dataset", (
        "if local_batch < 1:", "if local_batch < 2:")), frozenset({"1.1.partition_dataset_errors"})),
    Variant("collate_fn_ignored", DATASET, "partition_dataset", edited(
        DATASET, "partition_dataset", _SHORT_BATCH_ERROR, ("shuffle=False, collate_fn=collate_fn)", "shuffle=False)")),
        frozenset({"1.1.partition_dataset"})),
    Variant("sum_without_dividing", COMM, "average_gradients", """
        for param in model.parameters():
            if param.grad is not None:
                dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
    """, frozenset({"1.2.grads_2rank", "1.2.grads_2rank_hidden"}), hint="likely cause: a sum without the division"),
    Variant("only_weights_averaged", COMM, "average_gradients", """
        for name, param in model.named_parameters():
            if param.grad is not None and name.endswith("weight"):
                dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
                param.grad /= dist.get_world_size()
    """, frozenset({"1.2.grads_2rank", "1.2.grads_2rank_hidden"}), hint="pattern: only the biases differ"),
    Variant("divides_on_rank_0_only", COMM, "average_gradients", """
        for param in model.parameters():
            if param.grad is not None:
                dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
                if dist.get_rank() == 0:
                    param.grad /= dist.get_world_size()
    """, frozenset({"1.2.grads_2rank", "1.2.grads_2rank_hidden"}), hint="pattern: only rank 1"),
    Variant("zero_fill_none_grads", COMM, "average_gradients", """
        for param in model.parameters():
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
            param.grad /= dist.get_world_size()
    """, frozenset({"1.2.unused_grads_none"})),
    Variant("all_gather_instead_of_all_reduce", COMM, "average_gradients", """
        world_size = dist.get_world_size()
        for param in model.parameters():
            if param.grad is not None:
                pieces = [torch.empty_like(param.grad) for _ in range(world_size)]
                dist.all_gather(pieces, param.grad)
                param.grad.copy_(torch.stack(pieces).mean(0))
    """, frozenset({"1.2.uses_all_reduce"})),
    Variant("nccl_hard_coded", COMM, "setup_process_group", """
        dist.init_process_group("nccl", init_method=init_method, rank=rank, world_size=world_size)
    """, frozenset({"1.2.setup", "1.2.setup_timeout_default"})),     # no group joins: no timeout to read either
    Variant("gloo_hard_coded", COMM, "setup_process_group", edited(COMM, "setup_process_group", (
        "dist.init_process_group(backend,", 'dist.init_process_group("gloo",')), frozenset({"1.2.setup"})),
    Variant("nccl_device_not_selected", COMM, "setup_process_group", edited(COMM, "setup_process_group",
        _NO_SET_DEVICE), frozenset({"1.2.setup"}), hint="called torch.cuda.set_device with nothing, expected"),
    Variant("nccl_compared_by_identity", COMM, "setup_process_group", edited(COMM, "setup_process_group", (
        'if backend == "nccl":', 'if backend is "nccl":')), frozenset({"1.2.setup"})),
    Variant("nccl_compared_by_order", COMM, "setup_process_group", edited(COMM, "setup_process_group", (
        'if backend == "nccl":', 'if backend >= "nccl":')), frozenset({"1.2.setup"}),
        hint="expected no call: only backend == 'nccl' selects a GPU ('zgloo' sorts after 'nccl'"),
    Variant("nccl_device_is_rank", COMM, "setup_process_group", edited(COMM, "setup_process_group", (
        "set_device(rank % torch.cuda.device_count())", "set_device(rank)")), frozenset({"1.2.setup"}),
        hint="rank 1 called torch.cuda.set_device with [1], expected 0 once"),
    Variant("init_method_ignored", COMM, "setup_process_group", """
        import os
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=60) if timeout is None else timeout)
    """, frozenset({"1.2.setup"}), hint="likely cause: init_method was not used"),
    Variant("timeout_ignored", COMM, "setup_process_group", edited(
        COMM, "setup_process_group", (_INIT_TIMEOUT, ")")),
        frozenset({"1.2.setup", "1.2.setup_timeout_default"})),    # neither the given timeout nor the default
    Variant("timeout_none_passed_through", COMM, "setup_process_group", edited(
        COMM, "setup_process_group", (_INIT_TIMEOUT, ", timeout=timeout)")),
        frozenset({"1.2.setup_timeout_default"}), hint="None means 60 s"),
    Variant("zero_timeout_replaced", COMM, "setup_process_group", edited(COMM, "setup_process_group", (
        "datetime.timedelta(seconds=60) if timeout is None else timeout", "timeout or datetime.timedelta(seconds=60)")),
        frozenset({"1.2.setup_timeout_default"}), hint="expected the given 0 s (only None means 60 s"),
    Variant("setup_errors_swallowed", COMM, "setup_process_group", """
        import os
        if init_method is None:
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", "29500")
            init_method = "env://"
        try:
            dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                                    timeout=datetime.timedelta(seconds=60) if timeout is None else timeout)
        except Exception as exc:
            print(f"could not join the process group: {exc}")
    """, frozenset({"1.2.setup"}), hint="errors from torch.distributed must propagate"),
    Variant("master_port_overwritten", COMM, "setup_process_group", edited(COMM, "setup_process_group", (
        'os.environ.setdefault("MASTER_PORT", "29500")', 'os.environ["MASTER_PORT"] = "29500"')),
        frozenset({"1.2.setup"}), hint="overwrote the caller's MASTER_PORT='12345' with '29500'"),
    Variant("master_defaults_not_set", COMM, "setup_process_group", edited(COMM, "setup_process_group", (
        _MASTER_DEFAULTS, "")), frozenset({"1.2.setup"}), hint="MASTER_ADDR unset, expected the default '127.0.0.1'"),
    Variant("frozen_grads_skipped", COMM, "average_gradients", edited(COMM, "average_gradients", (
        "if param.grad is None:", "if param.grad is None or not param.requires_grad:")),
        frozenset({"1.2.grads_2rank", "1.2.grads_2rank_hidden"}), hint="likely cause: 'frozen.weight' was skipped"),
    Variant("train_step_mse_instead_of_loss_fn", COMM, "train_step", edited(COMM, "train_step", (
        "loss = loss_fn(model(inputs), targets)", "loss = torch.nn.functional.mse_loss(model(inputs), targets)")),
        frozenset({"1.2.train_step_updates"}), hint="likely cause: the loss was not computed with the given loss_fn"),
    Variant("loader_seed_ignored", DATASET, "partition_dataset", edited(
        DATASET, "partition_dataset", _SHORT_BATCH_ERROR, ("world_size, seed)[rank]", "world_size)[rank]")),
        frozenset({"1.1.partition_dataset"}), hint="likely cause: the seed was not passed on"),
    Variant("no_zero_grad", COMM, "train_step", edited(COMM, "train_step", ("    optimizer.zero_grad()\n", "")),
        frozenset({"1.2.train_step_updates"})),
    Variant("returns_tensor", COMM, "train_step", edited(COMM, "train_step", ("loss.item()", "loss.detach()")),
        frozenset({"1.2.train_step_loss"})),
]


@pytest.mark.kit
@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
def test_variant_loses_only_its_criteria(variant, tmp_path, fork_servers):
    assert_verdicts(grade_variant(variant, variant.problem, tmp_path, fork_servers), [variant])
