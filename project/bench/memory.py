"""Peak memory of one training step with and without activation checkpointing (``--grad_ckpt``).

Each variant runs in a fresh process, so the peak belongs to that step alone (``measure``).
"""
from __future__ import annotations

import resource
from pathlib import Path

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
