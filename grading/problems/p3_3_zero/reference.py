"""Problem 3.3 references: the grader's own LoRA layer, the training data and serial SGD.

Never imports student code (``finetune/``) and computes nothing a student
function returns: the probe trains ``LoRANet`` (``p3_1_lora/reference.py``,
the model all of Problem 3 shares) wrapped with ``GraderLoRALinear`` through
DeepSpeed, and the criteria compare with ``serial_sgd`` here. The expected
``build_config`` entries are data (``expected.json``), not computed here.
"""
from __future__ import annotations

import torch
from torch import nn

from grading.problems.p3_1_lora.reference import (ALPHA, IN_FEATURES, OUT_FEATURES, RANK, adapter_state,
                                                  base_state, reference_forward)

# Two ranks, two micro-batches of two samples per rank, three optimizer steps.
WORLD_SIZE, MICRO_BATCH, GRAD_ACCUM, STEPS = 2, 2, 2, 3
LEARNING_RATE = 0.2
ADAPTER_SEED = 3            # adapter_state(ADAPTER_SEED): the adapters training starts from
LOSS_TILT = 0.5             # loss_fn's extra gradient per output element (divided by their count)


class GraderLoRALinear(nn.Module):
    """The grader's own LoRA layer: ``base(x) + (alpha / rank) * (x @ lora_A.T) @ lora_B.T``.

    Same parameter names and arithmetic as the kit's ``LoRALinear``; the 3.3
    probe uses it so that Problem 3.3 does not depend on ``finetune/lora.py``
    (whose student regions belong to 3.1 and 3.2). Adapters start at zero;
    callers load values from ``adapter_state``.
    """

    def __init__(self, base: nn.Linear, rank: int = RANK, alpha: float = ALPHA) -> None:
        super().__init__()
        self.base = base
        self.scale = alpha / rank
        factory = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Parameter(torch.zeros(rank, base.in_features, **factory))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, **factory))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        update = nn.functional.linear(nn.functional.linear(x, self.lora_A), self.lora_B)
        return self.base(x) + update * self.scale


def micro_batch(step: int, rank: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s micro-batch ``micro`` of optimizer step ``step``: (inputs, targets)."""
    g = torch.Generator().manual_seed(10_000 + 100 * step + 10 * rank + micro)
    return torch.randn(MICRO_BATCH, IN_FEATURES, generator=g), torch.randn(MICRO_BATCH, OUT_FEATURES, generator=g)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The loss the probe hands to ``train_microbatch`` and the serial reference trains with: its value is the
    MSE, its gradient is not.

    The added tilt ``LOSS_TILT * (mean - mean.detach())`` is exactly zero but adds ``LOSS_TILT / numel`` to
    every output's gradient, so a ``train_microbatch`` that computes its own MSE instead of calling the given
    ``loss_fn`` returns the right losses and takes the wrong steps.
    """
    mean = output.mean()
    return nn.functional.mse_loss(output, target) + LOSS_TILT * (mean - mean.detach())


def plain_mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The MSE without the tilt: what a ``train_microbatch`` that ignores ``loss_fn`` would train with."""
    return nn.functional.mse_loss(output, target)


def serial_sgd(seed: int = ADAPTER_SEED, lr: float = LEARNING_RATE, loss_of=loss_fn
               ) -> tuple[dict[str, torch.Tensor], list[list[list[float]]]]:
    """Adapters after ``STEPS`` SGD steps on the global batches (base frozen), and the micro-batch losses.

    Each step's global batch is every rank's micro-batches together; its loss
    is the mean over all of them (equal sizes), the loss whose gradient a
    2-rank ZeRO run with accumulation averages. ``losses[step][rank][micro]``
    is the micro-batch loss at the weights of that step. ``loss_of`` is the loss trained with (``loss_fn``).
    """
    base = base_state(0)
    adapters = {name: value.clone().requires_grad_(True) for name, value in adapter_state(seed).items()}
    optimizer = torch.optim.SGD(list(adapters.values()), lr=lr)
    losses = []
    for step in range(STEPS):
        optimizer.zero_grad()
        micro_losses, per_rank = [], []
        for rank in range(WORLD_SIZE):
            row = []
            for micro in range(GRAD_ACCUM):
                x, y = micro_batch(step, rank, micro)
                loss = loss_of(reference_forward(base, adapters, x), y)
                micro_losses.append(loss)
                row.append(loss.item())
            per_rank.append(row)
        torch.stack(micro_losses).mean().backward()
        optimizer.step()
        losses.append(per_rank)
    return {name: value.detach() for name, value in adapters.items()}, losses
