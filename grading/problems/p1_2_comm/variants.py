"""Buggy variants of 1.2 (staff only, not released): each loses exactly the criteria and breaks the clauses it names."""
from grading.kit.variants import Clause, Variant, edited

COMM = "data_parallel/comm.py"

_NO_SET_DEVICE = ('    if backend == "nccl":\n        torch.cuda.set_device(rank % torch.cuda.device_count())\n', "")
_MASTER_DEFAULTS = ('        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")\n'
                    '        os.environ.setdefault("MASTER_PORT", "29500")\n')
_INIT_TIMEOUT = ",\n                            timeout=datetime.timedelta(seconds=60) if timeout is None else timeout)"

VARIANTS = [
    Variant("sum_without_dividing", COMM, "average_gradients", """
        for param in model.parameters():
            if param.grad is not None:
                dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
    """, frozenset({"1.2.grads_2rank", "1.2.grads_2rank_hidden"}), hint="likely cause: a sum without the division",
        breaks=(Clause("13", "average_gradients",
                       "every existing grad becomes the mean over ranks", "1.2.grads_2rank"),)),
    Variant("only_weights_averaged", COMM, "average_gradients", """
        for name, param in model.named_parameters():
            if param.grad is not None and name.endswith("weight"):
                dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
                param.grad /= dist.get_world_size()
    """, frozenset({"1.2.grads_2rank", "1.2.grads_2rank_hidden"}), hint="pattern: only the biases differ",
        breaks=(Clause("14", "average_gradients", "every parameter with a grad, not only some", "1.2.grads_2rank"),)),
    Variant("divides_on_rank_0_only", COMM, "average_gradients", """
        for param in model.parameters():
            if param.grad is not None:
                dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
                if dist.get_rank() == 0:
                    param.grad /= dist.get_world_size()
    """, frozenset({"1.2.grads_2rank", "1.2.grads_2rank_hidden"}), hint="pattern: only rank 1",
        breaks=(Clause("13b", "average_gradients",
                       "... on every rank: each divides the all-reduced sum by the world size, not rank 0 alone",
                       "1.2.grads_2rank"),)),
    Variant("zero_fill_none_grads", COMM, "average_gradients", """
        for param in model.parameters():
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
            param.grad /= dist.get_world_size()
    """, frozenset({"1.2.unused_grads_none"}),
        breaks=(Clause("15", "average_gradients",
                       "grads that are None (an unused layer, a parameter frozen before the backward) stay None",
                       "1.2.unused_grads_none"),)),
    Variant("all_gather_instead_of_all_reduce", COMM, "average_gradients", """
        world_size = dist.get_world_size()
        for param in model.parameters():
            if param.grad is not None:
                pieces = [torch.empty_like(param.grad) for _ in range(world_size)]
                dist.all_gather(pieces, param.grad)
                param.grad.copy_(torch.stack(pieces).mean(0))
    """, frozenset({"1.2.uses_all_reduce"}),
        breaks=(Clause("16", "average_gradients", "with torch.distributed.all_reduce", "1.2.uses_all_reduce"),)),
    Variant("nccl_hard_coded", COMM, "setup_process_group", """
        dist.init_process_group("nccl", init_method=init_method, rank=rank, world_size=world_size)
    """, frozenset({"1.2.setup", "1.2.setup_timeout_default"}),     # no group joins: no timeout to read either
        breaks=(Clause("12", "setup_process_group",
                       "joins the group: rank, world size, backend as given", "1.2.setup"),)),
    Variant("gloo_hard_coded", COMM, "setup_process_group", edited(COMM, "setup_process_group", (
        "dist.init_process_group(backend,", 'dist.init_process_group("gloo",')), frozenset({"1.2.setup"}),
        breaks=(Clause("12b", "setup_process_group",
                       '`backend` passed on as given (`"cpu:gloo"`, not the default `"gloo"`); afterwards '
                       "`dist.get_backend() == backend`", "1.2.setup"),)),
    Variant("nccl_device_not_selected", COMM, "setup_process_group", edited(COMM, "setup_process_group",
        _NO_SET_DEVICE), frozenset({"1.2.setup"}), hint="called torch.cuda.set_device with nothing, expected",
        breaks=(Clause("12i", "setup_process_group",
                       'with `backend="nccl"` the rank selects its GPU with `torch.cuda.set_device` before '
                       "`init_process_group` (recorded on CPU: dry runs in which `torch.cuda` reports 1 and 3 GPUs)",
                       "1.2.setup"),)),
    Variant("nccl_compared_by_identity", COMM, "setup_process_group", edited(COMM, "setup_process_group", (
        'if backend == "nccl":', 'if backend is "nccl":')), frozenset({"1.2.setup"}),
        breaks=(Clause("12i2", "setup_process_group",
                       '... for any string equal to `"nccl"` (one made at run time, as a command line gives it, not '
                       "only the literal)", "1.2.setup"),)),
    Variant("nccl_compared_by_order", COMM, "setup_process_group", edited(COMM, "setup_process_group", (
        'if backend == "nccl":', 'if backend >= "nccl":')), frozenset({"1.2.setup"}),
        hint="expected no call: only backend == 'nccl' selects a GPU ('zgloo' sorts after 'nccl'",
        breaks=(Clause("12l", "setup_process_group",
                       'only `backend == "nccl"` selects a GPU: any other backend, a registered CPU one whose name '
                       'sorts after `"nccl"` included (`"zgloo"`, registered by the probe with '
                       "`Backend.register_backend`, its creator gloo's process group), calls no "
                       "`torch.cuda.set_device` (a dry run in which `torch.cuda` reports 3 GPUs)", "1.2.setup"),)),
    Variant("nccl_device_is_rank", COMM, "setup_process_group", edited(COMM, "setup_process_group", (
        "set_device(rank % torch.cuda.device_count())", "set_device(rank)")), frozenset({"1.2.setup"}),
        hint="rank 1 called torch.cuda.set_device with [1], expected 0 once",
        breaks=(Clause("12j", "setup_process_group",
                       "... GPU `rank % torch.cuda.device_count()`, not the rank itself", "1.2.setup"),)),
    Variant("init_method_ignored", COMM, "setup_process_group", """
        import os
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=60) if timeout is None else timeout)
    """, frozenset({"1.2.setup"}), hint="likely cause: init_method was not used",
        breaks=(Clause("12c", "setup_process_group",
                       "a given `init_method` is the rendezvous used (the environment's MASTER_PORT is unusable "
                       "meanwhile)", "1.2.setup"),)),
    Variant("timeout_ignored", COMM, "setup_process_group", edited(
        COMM, "setup_process_group", (_INIT_TIMEOUT, ")")),
        frozenset({"1.2.setup", "1.2.setup_timeout_default"}),    # neither the given timeout nor the default
        breaks=(Clause("12d", "setup_process_group",
                       "`timeout` bounds the group's collectives (30 s given, not the default; as passed to "
                       "`init_process_group`)", "1.2.setup"),)),
    Variant("timeout_none_passed_through", COMM, "setup_process_group", edited(
        COMM, "setup_process_group", (_INIT_TIMEOUT, ", timeout=timeout)")),
        frozenset({"1.2.setup_timeout_default"}), hint="None means 60 s",
        breaks=(Clause("12e", "setup_process_group",
                       "`timeout=None` means a 60 s collective timeout (not torch's own 30-minute default)",
                       "1.2.setup_timeout_default"),)),
    Variant("zero_timeout_replaced", COMM, "setup_process_group", edited(COMM, "setup_process_group", (
        "datetime.timedelta(seconds=60) if timeout is None else timeout", "timeout or datetime.timedelta(seconds=60)")),
        frozenset({"1.2.setup_timeout_default"}), hint="expected the given 0 s (only None means 60 s",
        breaks=(Clause("12k", "setup_process_group",
                       "a given `timeout` is passed on whatever its value: `timedelta(0)` (falsy) stays 0 s, only "
                       "`None` means 60 s (`timeout or 60 s` replaces it)", "1.2.setup_timeout_default"),)),
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
    """, frozenset({"1.2.setup"}), hint="errors from torch.distributed must propagate",
        breaks=(Clause("12f", "setup_process_group",
                       "errors from `torch.distributed` propagate (an error raised inside `init_process_group` "
                       "reaches the caller)", "1.2.setup"),)),
    Variant("master_port_overwritten", COMM, "setup_process_group", edited(COMM, "setup_process_group", (
        'os.environ.setdefault("MASTER_PORT", "29500")', 'os.environ["MASTER_PORT"] = "29500"')),
        frozenset({"1.2.setup"}), hint="overwrote the caller's MASTER_PORT='12345' with '29500'",
        breaks=(Clause("12g", "setup_process_group",
                       "`init_method=None` means `env://`, never overwriting the caller's "
                       "`MASTER_ADDR`/`MASTER_PORT` (a dry run stops inside `init_process_group` and reads "
                       "`init_method` and the environment there)", "1.2.setup"),)),
    Variant("master_defaults_not_set", COMM, "setup_process_group", edited(COMM, "setup_process_group", (
        _MASTER_DEFAULTS, "")), frozenset({"1.2.setup"}), hint="MASTER_ADDR unset, expected the default '127.0.0.1'",
        breaks=(Clause("12h", "setup_process_group",
                       "... and unset ones default to `127.0.0.1` / `29500` (`os.environ.setdefault`), as seen by "
                       "the same dry run", "1.2.setup"),)),
    Variant("frozen_grads_skipped", COMM, "average_gradients", edited(COMM, "average_gradients", (
        "if param.grad is None:", "if param.grad is None or not param.requires_grad:")),
        frozenset({"1.2.grads_2rank", "1.2.grads_2rank_hidden"}), hint="likely cause: 'frozen.weight' was skipped",
        breaks=(Clause("14b", "average_gradients",
                       "whatever its `requires_grad`: a parameter frozen after the backward still holds a grad, "
                       "which is averaged (the probe's `frozen.weight`; serial reference: `backward_then_freeze`)",
                       "1.2.grads_2rank"),)),
    Variant("train_step_mse_instead_of_loss_fn", COMM, "train_step", edited(COMM, "train_step", (
        "loss = loss_fn(model(inputs), targets)", "loss = torch.nn.functional.mse_loss(model(inputs), targets)")),
        frozenset({"1.2.train_step_updates"}), hint="likely cause: the loss was not computed with the given loss_fn",
        breaks=(Clause("17b", "train_step",
                       "`loss = loss_fn(model(inputs), targets)` with the given `loss_fn` (the probe's has the MSE's "
                       "value, not its gradient)", "1.2.train_step_updates"),)),
    Variant("no_zero_grad", COMM, "train_step", edited(COMM, "train_step", ("    optimizer.zero_grad()\n", "")),
        frozenset({"1.2.train_step_updates"}),
        breaks=(Clause("17", "train_step",
                       "zero_grad, forward, backward, average, step, in that order", "1.2.train_step_updates"),)),
    Variant("returns_tensor", COMM, "train_step", edited(COMM, "train_step", ("loss.item()", "loss.detach()")),
        frozenset({"1.2.train_step_loss"}),
        breaks=(Clause("18", "train_step", "returns the local loss as a Python float", "1.2.train_step_loss"),)),
]

NOT_GRADED = """
Behaviour that only exists on GPUs: NCCL itself joining a group after the `set_device` (a CPU grader has no NCCL;
the order is recorded on CPU by dry runs, rows 12i-12j, and `scripts/gpu_check.sh` runs it). `setup_process_group`
with `init_method=None` is graded by dry runs only (rows 12g, 12h): joining would rendezvous on a fixed port,
29500, that another process on the grading machine may hold. "Returns None" of `setup_process_group` and
`average_gradients` (no caller reads the value: one returned instead changes nothing).
"""
