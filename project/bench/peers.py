"""The reference implementations we measure ours against, on the same workload, plus gradient checks.

- ``torch.nn.parallel.DistributedDataParallel`` (bucketed all-reduce overlapped with backward);
- one flat all-reduce of all gradients after backward (``dp_flat``), and the bare all-reduce of a
  gradient-sized buffer (``comm_floor``: the least communication a data-parallel step can do);
- ``torch.distributed.pipelining.ScheduleGPipe`` over 2 ranks, one stage per rank, the stages cut by
  the student's ``gpt2_stages`` (``scale_grads=False`` and a loss scaled by the micro-batch's share, so
  its gradients are the full-batch gradients, comparable with ours);
- PEFT LoRA on the unconverted GPT-2 (``Conv1D``), loaded from our adapter via ``export_peft_adapter``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from project.bench.context import Context, Stepper, local_step
from project.devices import stage_devices

LORA_RANK, LORA_ALPHA = 8, 16.0


def flat_allreduce(model: torch.nn.Module, world_size: int) -> None:
    """Average all gradients of ``model`` over the group with ONE all-reduce of a flattened buffer."""
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat)
    flat /= world_size
    for grad, value in zip(grads, _unflatten_dense_tensors(flat, grads)):
        grad.copy_(value)


def _ddp(ctx: Context, model: torch.nn.Module) -> torch.nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)


def dp_ddp(ctx: Context) -> Stepper:
    """A data-parallel step with DistributedDataParallel; AdamW."""
    net = _ddp(ctx, ctx.model())
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    return Stepper(lambda i: local_step(net, optimizer, *ctx.batch(i)))


def dp_flat(ctx: Context) -> Stepper:
    """A data-parallel step whose gradients are averaged by one flat all-reduce; AdamW."""
    model = ctx.model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return Stepper(lambda i: local_step(model, optimizer, *ctx.batch(i),
                                        between=lambda: flat_allreduce(model, ctx.world_size)))


def comm_floor(ctx: Context) -> Stepper:
    """Only ``all_reduce`` of one buffer as large as all gradients together (no copies, no division)."""
    numel = sum(p.numel() for p in ctx.model().parameters())
    buffer = torch.ones(numel, device=ctx.device)
    return Stepper(lambda i: dist.all_reduce(buffer), prepare=lambda: buffer.fill_(1.0))


def _gpipe_schedule(ctx: Context, model: torch.nn.Module, n_chunk: int):
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    from pipeline.gpt2 import gpt2_stages
    from project.model import lm_loss

    batch_size = ctx.workload["batches"][0]["input_ids"].shape[0]
    stage = PipelineStage(gpt2_stages(model, [ctx.device] * 2)[ctx.rank], ctx.rank, 2, ctx.device)
    return ScheduleGPipe(stage, n_chunk, loss_fn=lambda out, tgt: lm_loss(out, tgt) * tgt.shape[0] / batch_size,
                         scale_grads=False)


def _gpipe_step(ctx: Context, schedule, index: int) -> None:
    x, y = ctx.batch(index, rows=False)
    if ctx.rank == 0:
        schedule.step(x)
    else:
        schedule.step(target=y, return_outputs=False)


def gpipe(ctx: Context, n_chunk: int) -> Stepper:
    """A training step with torch's ScheduleGPipe, stage ``rank`` on this rank; AdamW.

    GPT-2 ties the LM head to the token embedding: each rank updates its own
    copy here (a real run would all-reduce the tied gradient); the cost of
    that is not part of the comparison.
    """
    model = ctx.model()
    schedule = _gpipe_schedule(ctx, model, n_chunk)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(i: int) -> None:
        optimizer.zero_grad()
        _gpipe_step(ctx, schedule, i)
        optimizer.step()
    return Stepper(step)


def our_lora_model(ctx: Context, seed: int = 0) -> torch.nn.Module:
    """GPT-2 with adapters from the student's ``apply_lora``, as ``project/run_finetune.py`` builds it.

    ``conv1d_to_linear`` + ``apply_lora`` on ``c_attn``/``c_proj``/``c_fc``
    (rank 8, alpha 16); ``lora_B`` is then set to small seeded random values
    so that every adapter gets a non-zero gradient.
    """
    from finetune.gpt2 import conv1d_to_linear, lora_target_names
    from finetune.lora import LoRALinear, apply_lora
    from project.run_finetune import LORA_SUFFIXES

    ours = ctx.model()
    conv1d_to_linear(ours)
    torch.manual_seed(seed)
    apply_lora(ours, lora_target_names(ours, LORA_SUFFIXES), rank=LORA_RANK, alpha=LORA_ALPHA)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for module in ours.modules():
            if isinstance(module, LoRALinear):
                module.lora_B.copy_(0.02 * torch.randn(module.lora_B.shape, generator=generator))
    return ours


def lora_pair(ctx: Context) -> tuple[torch.nn.Module, torch.nn.Module]:
    """``(ours, peft)``: ``our_lora_model`` and PEFT's ``PeftModel.from_pretrained`` of its exported adapter.

    PEFT wraps a fresh, unconverted copy (``Conv1D`` layers), trainable.
    """
    from peft import PeftModel

    from finetune.peft_io import export_peft_adapter

    ours = our_lora_model(ctx)
    folder = export_peft_adapter(ours, ctx.folder / f"peft_adapter_{ctx.role}{ctx.rank}")
    theirs = PeftModel.from_pretrained(ctx.model(), str(folder), is_trainable=True).train()
    return ours, theirs


def lora_peft(ctx: Context) -> Stepper:
    """A fine-tuning step with PEFT's LoRA; AdamW on the trainable (adapter) parameters."""
    _, theirs = lora_pair(ctx)
    optimizer = torch.optim.AdamW([p for p in theirs.parameters() if p.requires_grad], lr=3e-3)
    return Stepper(lambda i: local_step(theirs, optimizer, *ctx.batch(i, rows=False)))


def _peft_name(name: str) -> str:
    """``base_model.model.<path>.lora_A.default.weight`` -> ``<path>.lora_A`` (our naming)."""
    name = name.removeprefix("base_model.model.")
    for part in ("lora_A", "lora_B"):
        name = name.replace(f".{part}.default.weight", f".{part}")
    return name


def lora_check(ctx: Context, index: int = 0) -> dict:
    """Ours vs PEFT on global batch ``index``: max abs difference of logits and of every adapter gradient."""
    from project.model import lm_loss

    ours, theirs = lora_pair(ctx)
    x, y = ctx.batch(index, rows=False)
    logits = [ours(x).logits, theirs(x).logits]
    for out in logits:
        lm_loss(out, y).backward()
    mine = {n: p.grad for n, p in ours.named_parameters() if p.requires_grad}
    peft = {_peft_name(n): p.grad for n, p in theirs.named_parameters() if p.requires_grad}
    if set(mine) != set(peft):
        raise RuntimeError(f"ours and PEFT train different parameters: only ours {sorted(set(mine) - set(peft))[:3]}, "
                           f"only PEFT {sorted(set(peft) - set(mine))[:3]}")
    return {"logits_max_abs_diff": (logits[0] - logits[1]).abs().max().item(),
            "grad_max_abs_diff": max((mine[n] - peft[n]).abs().max().item() for n in mine),
            "grad_max_abs": max(g.abs().max().item() for g in mine.values()),
            "trainable_parameters": sum(p.numel() for p in mine.values()), "adapter_tensors": len(mine)}


def grads(ctx: Context, variant: str, n_chunk: int = 2, index: int = 0) -> str:
    """One forward/backward of ``variant`` on a fresh model and global batch ``index``; save the gradients.

    Variants: ``serial`` (whole batch, one process: the reference),
    ``dp_ours`` (rows of this rank, then the student's ``average_gradients``),
    ``dp_ddp``, ``dp_flat``, ``pipe_ours`` (the student's ``Pipe`` with
    ``n_chunk`` micro-batches), ``gpipe`` (this rank's stage). Returns the
    path of a ``torch.save`` of ``{parameter name: gradient}`` (CPU).
    """
    import math

    from data_parallel.comm import average_gradients
    from pipeline.gpt2 import build_pipeline_gpt2
    from project.model import lm_loss

    model = ctx.model()
    if variant == "serial":
        lm_loss(model(ctx.batch(index, rows=False)[0]), ctx.batch(index, rows=False)[1]).backward()
    elif variant in ("dp_ours", "dp_flat", "dp_ddp"):
        x, y = ctx.batch(index)
        net = _ddp(ctx, model) if variant == "dp_ddp" else model   # keep the DDP object alive for backward
        lm_loss(net(x), y).backward()
        if variant == "dp_ours":
            average_gradients(model)
        elif variant == "dp_flat":
            flat_allreduce(model, ctx.world_size)
    elif variant == "pipe_ours":
        x, y = ctx.batch(index, rows=False)
        with build_pipeline_gpt2(model, stage_devices("auto", 2), "pipeline_parallel",
                                 split_size=math.ceil(x.shape[0] / n_chunk)) as net:
            lm_loss(net(x), y).backward()
    elif variant == "gpipe":
        _gpipe_step(ctx, _gpipe_schedule(ctx, model, n_chunk), index)
    else:
        raise ValueError(f"unknown gradient variant {variant!r}")
    path = ctx.folder / f"grads_{variant}_{ctx.role}{ctx.rank}.pt"
    torch.save({n: p.grad.detach().cpu() for n, p in model.named_parameters() if p.grad is not None}, path)
    return str(path)
