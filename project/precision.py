"""Mixed precision of the entry points (``--precision fp32|bf16|fp16``).

- ``fp32``: nothing changes;
- ``bf16``: forward passes under ``torch.autocast(<device>, torch.bfloat16)`` on CPU and GPU; bf16 has
  fp32's exponent range, so no loss scaling is needed;
- ``fp16``: autocast to float16 plus a ``torch.amp.GradScaler`` (loss scaling, skipped steps on
  overflow), CUDA only: on the CPU it is refused up front.

The weights, the optimizer state and the loss stay fp32 (``lm_loss`` computes in fp32).
"""
from __future__ import annotations

import contextlib

import torch

from project.cli import ConfigError

PRECISIONS = ("fp32", "bf16", "fp16")


def check_precision(precision: str, device_type: str) -> None:
    """Raise ConfigError for an unknown precision or fp16 on a device that is not CUDA."""
    if precision not in PRECISIONS:
        raise ConfigError(f"--precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    if precision == "fp16" and device_type != "cuda":
        raise ConfigError("--precision fp16 needs CUDA (float16 autocast with gradient scaling); this run is on the "
                          "CPU: use --precision bf16 or fp32")


def autocast(precision: str, device_type: str) -> contextlib.AbstractContextManager:
    """The context the forward pass runs in: ``torch.autocast`` for bf16/fp16, a no-op for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type, dtype=dtype)


def grad_scaler(precision: str, device_type: str) -> torch.amp.GradScaler | None:
    """A ``GradScaler`` for fp16 (loss scaling), else None."""
    return torch.amp.GradScaler(device_type) if precision == "fp16" else None
