"""Make a ``transformers`` GPT-2 ready for ``apply_lora`` (provided, not student code).

Hugging Face's GPT-2 builds its projections (``attn.c_attn``,
``attn.c_proj``, ``mlp.c_fc``, ``mlp.c_proj``) from ``Conv1D``: a linear
layer whose weight is stored transposed, ``(in_features, out_features)``.
``apply_lora`` wraps ``nn.Linear`` only, so the fine-tuning entry point does::

    model = GPT2LMHeadModel(config)           # or from_pretrained(...)
    conv1d_to_linear(model)                   # Conv1D -> nn.Linear, same outputs
    apply_lora(model, lora_target_names(model, ("c_attn",)), rank=8, alpha=16)

After conversion the LoRA parameter shapes (``lora_A``: r x in,
``lora_B``: out x r) are the ones PEFT uses for GPT-2, so an adapter
exported with ``finetune.peft_io.export_peft_adapter(..., fan_in_fan_out=True)``
loads with PEFT onto an unconverted GPT-2 (PEFT handles ``Conv1D`` itself).
Note that a converted model's ``state_dict`` holds those weights transposed
relative to a Hugging Face GPT-2 checkpoint: convert after loading weights.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn


def _is_conv1d(module: nn.Module) -> bool:
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # transformers missing: nothing can be a Conv1D
        return False
    return isinstance(module, Conv1D)


def conv1d_to_linear(model: nn.Module) -> list[str]:
    """Replace every ``transformers`` ``Conv1D`` in ``model`` by an equivalent ``nn.Linear``.

    Each new layer has ``weight = conv.weight.T`` (out x in) and the same
    bias, on the same device and dtype, and keeps ``requires_grad`` of the
    original parameters; outputs match up to float rounding (the matmul
    operand layout changes). Modules other than ``Conv1D`` are untouched.

    Returns:
        The dotted names of the converted layers, in ``named_modules`` order.
    """
    names = [name for name, module in model.named_modules() if name and _is_conv1d(module)]
    for name in names:
        conv = model.get_submodule(name)
        in_features, out_features = conv.weight.shape
        linear = nn.Linear(
            in_features, out_features, bias=True, device=conv.weight.device, dtype=conv.weight.dtype
        )
        with torch.no_grad():
            linear.weight.copy_(conv.weight.t())
            linear.bias.copy_(conv.bias)
        linear.weight.requires_grad_(conv.weight.requires_grad)
        linear.bias.requires_grad_(conv.bias.requires_grad)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, linear)
    return names


def lora_target_names(model: nn.Module, suffixes: Iterable[str]) -> list[str]:
    """Dotted names of the ``nn.Linear`` modules whose last name part is in ``suffixes``.

    ``lora_target_names(gpt2, ("c_attn",))`` gives
    ``["transformer.h.0.attn.c_attn", "transformer.h.1.attn.c_attn", ...]``
    (after ``conv1d_to_linear``). Raises ``ValueError`` when nothing matches,
    so a typo or a forgotten conversion fails loudly.
    """
    wanted = set(suffixes)
    names = [
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and name.rpartition(".")[2] in wanted
    ]
    if not names:
        raise ValueError(
            f"lora_target_names: no nn.Linear named {sorted(wanted)}; "
            "for GPT-2 call conv1d_to_linear(model) first"
        )
    return names
