"""Likely causes for Problem 2.2 failures, found by recomputing a suspected wrong answer (never a right one)."""
from __future__ import annotations

import torch

from grading.problems.p2_2_pipe import reference as ref


def late_binding_outputs(waves: list[list[tuple[int, int]]], stages: int, rows: int, split: int,
                         seed: int = 0) -> list[torch.Tensor]:
    """What a Pipe whose tasks read the loop's ``i`` and ``j`` when they run returns on ``batch(rows, seed)``.

    ``StageWorkers`` starts a cycle's tasks at its first ``receive``, so every task of a wave (``waves``: the
    recorded schedule) reads the pair the loops hold then: the receive loop's first pair when it reuses the
    names ``i`` and ``j``, the submit loop's last when it does not. One output for each.
    """
    outputs = []
    for pick in (0, -1):
        with torch.no_grad():
            layers = ref.stage_layers(ref.build_layers(0), stages)
            batches = list(torch.split(ref.batch(rows, seed)[0], split))
            for wave in waves:
                i, j = wave[pick]
                result = layers[j](batches[i])
                for i, _ in wave:
                    batches[i] = result
            outputs.append(torch.cat(batches))
    return outputs


def late_binding_hint(got, waves, stages: int, rows: int, split: int, seed: int = 0) -> str:
    """The likely cause when ``got`` is what a late-binding task gives (``late_binding_outputs``), else ""."""
    if not isinstance(got, torch.Tensor) or waves is None:
        return ""
    for wrong in late_binding_outputs(waves, stages, rows, split, seed):
        if got.shape == wrong.shape and torch.allclose(got, wrong, atol=1e-5, rtol=1e-4):
            return ("\nlikely cause: a late-binding closure in Pipe.forward: each task read the loop's i and j when "
                    "its worker ran it (the workers start a clock cycle's tasks at its first receive), not when it "
                    "was submitted; bind them as default arguments (lambda i=i, j=j, ...: ...)")
    return ""
