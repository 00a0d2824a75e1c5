"""Problem 3 references: the LoRA probe model, adapter values and inputs (shared by 3.1, 3.2 and 3.3).

Never imports student code (``finetune/``) and computes nothing a student function returns: the probes build
``LoRANet`` with a LoRA layer class they pass in (``lora_model``), and the criteria recompute the expected values
with ``reference_forward``, the same arithmetic without any kit code. What only 3.3 uses (its training data and
serial SGD) is in ``p3_3_zero/reference.py``.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

IN_FEATURES, HIDDEN, OUT_FEATURES = 6, 8, 4
RANK, ALPHA = 2, 4.0

# Targets: top-level only (3.1 outputs/trainable/validation) and with dotted names (3.1 replace, 3.2, 3.3).
TOP_TARGETS = ["embed", "head"]
NESTED_TARGETS = ["embed", "blocks.0.fc", "blocks.1.fc", "head"]      # every nn.Linear of LoRANet
ADAPTER_TARGETS = ["embed", "blocks.1.fc", "head"]


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
    """A (batch, IN_FEATURES) input batch for ``LoRANet``, the same for the same ``seed``."""
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


def wrapped_base_state(seed: int = 0, targets: list[str] = ADAPTER_TARGETS) -> dict[str, torch.Tensor]:
    """``base_state(seed)`` named as in the model with ``LoRALinear`` at ``targets`` (``head.weight`` ->
    ``head.base.weight``)."""
    renamed = {}
    for name, value in base_state(seed).items():
        module, _, leaf = name.rpartition(".")
        renamed[f"{module}.base.{leaf}" if module in targets else name] = value
    return renamed


def lora_model(layer: Callable[[nn.Linear, int, float], nn.Module], adapters: dict[str, torch.Tensor],
               targets: Sequence[str] = ADAPTER_TARGETS, rank: int = RANK, device: str | torch.device = "cpu"
               ) -> nn.Module:
    """``LoRANet(0)`` on ``device`` with ``layer(linear, rank, ALPHA)`` at ``targets``, adapters set to ``adapters``.

    The grader wraps the layers itself, so 3.2 and 3.3 do not depend on the
    student's ``apply_lora``; ``layer`` is the LoRA class to wrap with.
    """
    model = LoRANet(0)
    for name in targets:
        parent, _, child = name.rpartition(".")
        holder = model.get_submodule(parent)
        setattr(holder, child, layer(getattr(holder, child), rank, ALPHA))
    model.to(device)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in adapters:
                param.copy_(adapters[name])
    return model
