"""Memory of one training step: peak with and without activation checkpointing (``--grad_ckpt``, ``measure``), and
per pipeline stage for each micro-batch count (``pipeline_stages``: parameters and what autograd keeps for backward).

Each measurement runs in a fresh process, so the peak belongs to that step alone.
"""
from __future__ import annotations

import contextlib
import resource
from pathlib import Path
from typing import Iterator, Sequence

import torch

from common.startup import GPT2_IMPORTS
from project.devices import RankEnv
from project.launch import RankError, spawn_ranks

VARIANTS = ("plain", "grad_ckpt")


def _rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()


def _one_step(env: RankEnv, preset: str, batch_size: int, max_len: int, checkpointing: bool, threads: int) -> dict:
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    from project.devices import stage_devices
    from project.model import PRESETS, enable_activation_checkpointing, lm_loss

    transformers.logging.set_verbosity_error()
    if threads > 0:
        torch.set_num_threads(threads)
    device = stage_devices("auto", 1)[0]   # one device: cuda:0 with a GPU, else the CPU
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=2000, bos_token_id=0, eos_token_id=0, use_cache=False,
                                       **PRESETS[preset])).to(device).train()
    if checkpointing:
        enable_activation_checkpointing(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 2000, (batch_size, max_len), device=device)
    saved: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel() * t.element_size())
        return t
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = _rss_bytes()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = lm_loss(model(x), x)
    loss.backward()
    optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    return {"device": str(device), "peak_step_bytes": int(peak), "saved_for_backward_bytes": sum(saved),
            "measure": "cuda max_memory_allocated" if device.type == "cuda" else "peak RSS (ru_maxrss)"}


def measure(preset: str, batch_size: int, max_len: int, threads: int, timeout_s: float = 300.0) -> dict:
    """``{"plain": {...}, "grad_ckpt": {...}, "ratio_peak": plain/ckpt, "ratio_saved": ...}`` of one step each.

    Each variant runs in a fresh process (``project.launch.spawn_ranks``: one rank that joins no group, on the
    device ``project.devices`` picks for one rank), with the same model weights and batch::

        GPU:  torch.cuda.max_memory_allocated() after one step, minus the allocation before it
        CPU:  peak RSS (ru_maxrss) after one step, minus the RSS before it

    plus, on both, the bytes autograd saved for backward during the forward (``saved_tensors_hooks``), which is
    what checkpointing trades for recompute.
    Raises RuntimeError when a variant fails or does not answer in ``timeout_s``.
    """
    out: dict = {"preset": preset, "batch_size": batch_size, "max_len": max_len}
    for variant in VARIANTS:
        ranks = spawn_ranks(_one_step, 1, None, (preset, batch_size, max_len, variant == "grad_ckpt", threads),
                            name=f"memory-{variant}", preload=GPT2_IMPORTS)
        try:
            out[variant] = ranks.wait(timeout_s)[0]
        except RankError as exc:
            raise RuntimeError(f"memory measurement ({variant}): {exc}") from None
    out["ratio_peak"] = out["plain"]["peak_step_bytes"] / max(out["grad_ckpt"]["peak_step_bytes"], 1)
    out["ratio_saved"] = out["plain"]["saved_for_backward_bytes"] / max(out["grad_ckpt"]["saved_for_backward_bytes"], 1)
    return out


def stages_of(net: torch.nn.Module) -> list[torch.nn.Module]:
    """The stages a pipeline wrapper (``ModelParallel``, the student's ``Pipe``) registers, in order.

    A stage is an ``nn.Sequential`` holding a ``Blocks`` (``gpt2_stages``' contract); [] when none is registered.
    """
    from pipeline.gpt2 import Blocks

    return [m for m in net.modules()
            if isinstance(m, torch.nn.Sequential) and any(isinstance(c, Blocks) for c in m.children())]


def parameters_per_stage(stages: Sequence[torch.nn.Module]) -> list[int]:
    """Parameter elements each stage registers. GPT-2's tied output weight is the token embedding's, registered by
    the first stage only (``LMHead``), so the counts add up to the model's ``parameters``."""
    return [sum(p.numel() for p in stage.parameters()) for stage in stages]


@contextlib.contextmanager
def saved_activation_bytes(stages: Sequence[torch.nn.Module]) -> Iterator[list[int]]:
    """While inside: count, per stage, the bytes of the distinct storages (parameters excluded) that autograd saves
    for backward during the stage's forward calls; the list (one int per stage) is filled in on exit.

    The hooks are entered and left around each stage call in the thread that runs it (a ``Pipe`` worker or the
    caller). With GPipe's schedule every forward ends before the backward starts, so all of it is held at once:
    the stage's activation memory at the start of the backward.
    """
    params = {p.untyped_storage().data_ptr() for stage in stages for p in stage.parameters()}
    held: list[dict[int, tuple[int, torch.Tensor]]] = [{} for _ in stages]
    totals: list[int] = []
    handles = []
    for j, stage in enumerate(stages):
        def pack(t: torch.Tensor, j: int = j) -> torch.Tensor:
            storage = t.untyped_storage()
            if storage.data_ptr() not in params:
                held[j][storage.data_ptr()] = (storage.nbytes(), t)   # t kept: its address is not reused meanwhile
            return t
        hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        handles.append(stage.register_forward_pre_hook(lambda *_, h=hooks: h.__enter__()))
        handles.append(stage.register_forward_hook(lambda *_, h=hooks: h.__exit__(None, None, None)))
    try:
        yield totals
    finally:
        for handle in handles:
            handle.remove()
        totals[:] = [sum(size for size, _ in stage.values()) for stage in held]


def _pipeline_step(env: RankEnv, workload_path: str, n_chunks: list[int], threads: int) -> dict:
    from pipeline.gpt2 import build_pipeline_gpt2
    from project import microbatch
    from project.bench.workload import fresh_model, load_workload
    from project.devices import stage_devices
    from project.model import lm_loss

    if threads > 0:
        torch.set_num_threads(threads)
    workload = load_workload(Path(workload_path))
    devices = stage_devices("auto", 2)
    x, y = workload["batches"][0]["input_ids"].to(devices[0]), workload["batches"][0]["labels"]
    out: dict = {"parameters_per_stage": None, "activations_saved_bytes": {}, "micro_batches": {}}
    for mode, m in [("model_parallel", 1)] + [("pipeline_parallel", m) for m in n_chunks]:
        name = "model_parallel" if mode == "model_parallel" else f"pipeline_parallel_m{m}"
        size = microbatch.split_size(x.shape[0], m)
        net = build_pipeline_gpt2(fresh_model(workload, devices[0]), devices, mode, split_size=size)
        try:
            stages = stages_of(net)
            with saved_activation_bytes(stages) as saved:
                logits = net(x)
            lm_loss(logits, y).backward()
        finally:
            net.close()
        out["parameters_per_stage"] = parameters_per_stage(stages)
        out["activations_saved_bytes"][name] = saved
        out["micro_batches"][name] = microbatch.count(x.shape[0], size)
    return out


def pipeline_stages(workload_path: Path, n_chunks: Sequence[int], threads: int, timeout_s: float = 300.0) -> dict:
    """Per pipeline stage (2 stages, the benchmark's workload model and its first global batch): the parameters it
    registers (``parameters_per_stage``) and, for ``model_parallel`` and each ``pipeline_parallel_m<M>``, the bytes
    autograd keeps for the backward pass (``activations_saved_bytes``: one list, stage 0 first, per variant;
    ``saved_activation_bytes``), one training step each in one fresh process. Raises RuntimeError when it fails
    or does not answer in ``timeout_s``.
    """
    ranks = spawn_ranks(_pipeline_step, 1, None, (str(workload_path), list(n_chunks), threads),
                        name="memory-pipeline", preload=GPT2_IMPORTS)
    try:
        out = ranks.wait(timeout_s)[0]
    except RankError as exc:
        raise RuntimeError(f"pipeline memory measurement: {exc}") from None
    return {**out, "measure": "distinct non-parameter tensors autograd saved for backward in the stage's forward "
                              "calls, all held when the backward starts"}
