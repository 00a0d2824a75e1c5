"""Likely causes for Problem 5.2 failures, read from the rows of c_attn in which each rank's gradient lives."""
from __future__ import annotations

import torch

QKV_WEIGHT = "attn.c_attn.weight"       # GPT-2's fused q, k, v projection: (3E, E) in nn.Linear layout


def _rows(grad: torch.Tensor) -> set[int]:
    """The rows of ``grad`` with a nonzero entry."""
    return set(torch.nonzero(grad.reshape(grad.shape[0], -1).abs().sum(dim=1)).flatten().tolist())


def qkv_hint(grads: list, world: int) -> str:
    """A likely cause when every rank's c_attn gradient lives in a contiguous 1/N of the rows, not in q, k and v.

    ``grads[i]`` is what group rank i recorded (name -> full gradient, ``nn.Linear`` layout). With the
    full-weight stand-ins a rank's gradient is nonzero only in the rows its shard holds: split as one matrix,
    rank i holds rows [3E i/N, 3E (i+1)/N); split per q, k and v (chunks=3), rows [E i/N, E (i+1)/N) of each
    of the three E-row blocks. "" when any rank's rows are not of the first kind, or also of the second.
    """
    seen = False
    for index, got in enumerate(grads):
        if not isinstance(got, dict):
            return ""
        for name, grad in got.items():
            if not (name.endswith(QKV_WEIGHT) and isinstance(grad, torch.Tensor) and grad.dim() == 2
                    and grad.shape[0] % (3 * world) == 0):
                continue
            block, part = grad.shape[0] // 3, grad.shape[0] // (3 * world)
            contiguous = set(range(3 * part * index, 3 * part * (index + 1)))
            per_qkv = {k * block + index * part + i for k in range(3) for i in range(part)}
            rows = _rows(grad)
            if not rows or not rows <= contiguous or rows <= per_qkv:
                return ""
            seen = True
    if not seen:
        return ""
    return ("\nlikely cause: the fused qkv weight was split as one matrix; split q, k and v each (chunks=3), "
            "or heads mix across ranks")
