"""Problem 3 references: the LoRA probe model, adapter values, inputs and serial training.

Never imports student code (``finetune/``).

The probes (children) wrap ``LoRANet`` with the kit's provided ``LoRALinear``
and load the adapter values from ``adapter_state``; the criteria (parent)
recompute every expected value here with ``reference_forward``, which does
the same arithmetic without any kit code. Nothing here computes what a
student function returns: the expected configs of 3.3 are data
(``grading/fixtures/p3_3.json``).
"""
from __future__ import annotations

import torch
from torch import nn

IN_FEATURES, HIDDEN, OUT_FEATURES = 6, 8, 4
RANK, ALPHA = 2, 4.0

# Targets: top-level only (3.1 outputs/trainable/validation) and with dotted names (3.1 replace, 3.2, 3.3).
TOP_TARGETS = ["embed", "head"]
NESTED_TARGETS = ["embed", "blocks.0.fc", "blocks.1.fc", "head"]
ADAPTER_TARGETS = ["embed", "blocks.1.fc", "head"]

# 3.3: two ranks, two micro-batches of two samples per rank, three optimizer steps.
WORLD_SIZE, MICRO_BATCH, GRAD_ACCUM, STEPS = 2, 2, 2, 3
LEARNING_RATE = 0.2


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(HIDDEN, HIDDEN)
        self.act = nn.Tanh()
        self.norm = nn.LayerNorm(HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.norm(self.act(self.fc(x)))


class LoRANet(nn.Module):
    """A small residual MLP: ``embed`` -> ``blocks.0``/``blocks.1`` (fc, act, norm) -> ``head``.

    Its ``nn.Linear`` layers sit at top-level names (``embed``, ``head``) and
    at dotted names (``blocks.0.fc``); ``blocks.0.norm`` and ``blocks`` are
    modules that are not ``nn.Linear``. The global RNG is restored afterwards.
    """

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        self.embed = nn.Linear(IN_FEATURES, HIDDEN)
        self.blocks = nn.ModuleList([_Block(), _Block()])
        self.head = nn.Linear(HIDDEN, OUT_FEATURES)
        with torch.no_grad():       # non-trivial LayerNorm parameters
            for block in self.blocks:
                block.norm.weight.uniform_(0.5, 1.5)
                block.norm.bias.uniform_(-0.2, 0.2)
        torch.random.set_rng_state(state)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.embed(x))
        for block in self.blocks:
            h = block(h)
        return self.head(h)


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


def base_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """``LoRANet(seed)``'s parameters by name (the frozen base weights)."""
    return {name: p.detach().clone() for name, p in LoRANet(seed).named_parameters()}


def _shape(target: str) -> tuple[int, int]:
    """(in, out) features of the Linear at ``target``."""
    return {"embed": (IN_FEATURES, HIDDEN), "head": (HIDDEN, OUT_FEATURES)}.get(target, (HIDDEN, HIDDEN))


def adapter_state(seed: int, targets: list[str] = ADAPTER_TARGETS, rank: int = RANK) -> dict[str, torch.Tensor]:
    """Non-zero adapter values ``{"<target>.lora_A": (rank, in), "<target>.lora_B": (out, rank)}``."""
    g = torch.Generator().manual_seed(500 + seed)
    state = {}
    for target in targets:
        fan_in, fan_out = _shape(target)
        state[f"{target}.lora_A"] = 0.3 * torch.randn(rank, fan_in, generator=g)
        state[f"{target}.lora_B"] = 0.3 * torch.randn(fan_out, rank, generator=g)
    return state


def inputs(seed: int, batch: int = 5) -> torch.Tensor:
    g = torch.Generator().manual_seed(900 + seed)
    return torch.randn(batch, IN_FEATURES, generator=g)


def reference_forward(base: dict[str, torch.Tensor], adapters: dict[str, torch.Tensor], x: torch.Tensor,
                      scale: float = ALPHA / RANK) -> torch.Tensor:
    """``LoRANet`` with LoRA on every target named in ``adapters``, computed from plain tensors."""
    def linear(name: str, h: torch.Tensor) -> torch.Tensor:
        out = nn.functional.linear(h, base[f"{name}.weight"], base[f"{name}.bias"])
        if f"{name}.lora_A" in adapters:
            update = nn.functional.linear(nn.functional.linear(h, adapters[f"{name}.lora_A"]),
                                          adapters[f"{name}.lora_B"])
            out = out + update * scale
        return out

    h = torch.tanh(linear("embed", x))
    for k in range(2):
        prefix = f"blocks.{k}"
        z = torch.tanh(linear(f"{prefix}.fc", h))
        h = h + nn.functional.layer_norm(z, (HIDDEN,), base[f"{prefix}.norm.weight"], base[f"{prefix}.norm.bias"])
    return linear("head", h)


# ---------------------------------------------------------------- 3.3
def micro_batch(step: int, rank: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s micro-batch ``micro`` of optimizer step ``step``: (inputs, targets)."""
    g = torch.Generator().manual_seed(10_000 + 100 * step + 10 * rank + micro)
    return torch.randn(MICRO_BATCH, IN_FEATURES, generator=g), torch.randn(MICRO_BATCH, OUT_FEATURES, generator=g)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, target)


def serial_sgd(seed: int = 3, lr: float = LEARNING_RATE) -> tuple[dict[str, torch.Tensor], list[list[list[float]]]]:
    """Adapters after ``STEPS`` SGD steps on the global batches (base frozen), and the micro-batch losses.

    Each step's global batch is every rank's micro-batches together; its loss
    is the mean over all of them (equal sizes), the loss whose gradient a
    2-rank ZeRO run with accumulation averages. ``losses[step][rank][micro]``
    is the micro-batch loss at the weights of that step.
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
                loss = loss_fn(reference_forward(base, adapters, x), y)
                micro_losses.append(loss)
                row.append(loss.item())
            per_rank.append(row)
        torch.stack(micro_losses).mean().backward()
        optimizer.step()
        losses.append(per_rank)
    return {name: value.detach() for name, value in adapters.items()}, losses


def wrapped_base_state(seed: int = 0, targets: list[str] = ADAPTER_TARGETS) -> dict[str, torch.Tensor]:
    """``base_state(seed)`` named as in the model with ``LoRALinear`` at ``targets`` (``head.weight`` ->
    ``head.base.weight``)."""
    renamed = {}
    for name, value in base_state(seed).items():
        module, _, leaf = name.rpartition(".")
        renamed[f"{module}.base.{leaf}" if module in targets else name] = value
    return renamed
