"""Export/import LoRA adapters in PEFT's on-disk layout (provided, not student code).

A directory written by ``export_peft_adapter`` holds what
``peft.PeftModel.from_pretrained(base_model, directory)`` reads:

- ``adapter_model.safetensors``: for every ``LoRALinear`` at dotted path
  ``<path>``, tensors ``base_model.model.<path>.lora_A.weight`` (r x in) and
  ``base_model.model.<path>.lora_B.weight`` (out x r);
- ``adapter_config.json``: ``peft_type`` ``"LORA"``, ``r``, ``lora_alpha``,
  ``target_modules`` (the dotted paths), ``lora_dropout`` 0, ``bias`` ``"none"``.

PEFT computes ``base(x) + lora_B(lora_A(x)) * lora_alpha / r``, the same as
``LoRALinear``. This module needs ``safetensors`` only; PEFT itself is not
imported.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

from finetune.lora import LoRALinear

WEIGHTS_NAME = "adapter_model.safetensors"
CONFIG_NAME = "adapter_config.json"
_PREFIX = "base_model.model."


def _lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    return {name: module for name, module in model.named_modules() if isinstance(module, LoRALinear)}


def export_peft_adapter(
    model: nn.Module,
    directory: str | os.PathLike,
    *,
    base_model_name_or_path: str | None = None,
    fan_in_fan_out: bool = False,
) -> Path:
    """Write the ``LoRALinear`` adapters of ``model`` as a PEFT LoRA adapter directory.

    Args:
        model: a model holding at least one ``LoRALinear``; all of them must
            share one ``rank`` and ``alpha`` (``apply_lora`` does that).
        directory: created if needed; the two files are overwritten.
        base_model_name_or_path: recorded in the config (e.g. ``"gpt2"``).
        fan_in_fan_out: recorded in the config; ``True`` when the adapter
            is for an unconverted Hugging Face GPT-2, whose layers are
            ``Conv1D`` (PEFT would otherwise switch it on with a warning).
            The tensors are the same either way.

    Raises:
        ValueError: no ``LoRALinear`` in ``model``, or mixed rank/alpha.

    Returns:
        The directory as a ``Path``.
    """
    from safetensors.torch import save_file

    layers = _lora_layers(model)
    if not layers:
        raise ValueError("export_peft_adapter: the model has no LoRALinear layers")
    settings = {(layer.rank, layer.alpha) for layer in layers.values()}
    if len(settings) != 1:
        raise ValueError(f"export_peft_adapter: layers mix (rank, alpha) settings {sorted(settings)}")
    ((rank, alpha),) = settings
    tensors = {}
    for name, layer in layers.items():
        for part in ("lora_A", "lora_B"):
            value = getattr(layer, part).detach().to("cpu", copy=True).contiguous()
            tensors[f"{_PREFIX}{name}.{part}.weight"] = value
    config = {
        "peft_type": "LORA",
        "task_type": None,
        "base_model_name_or_path": base_model_name_or_path,
        "r": rank,
        "lora_alpha": alpha,
        "target_modules": sorted(layers),
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": fan_in_fan_out,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "inference_mode": True,
    }
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / WEIGHTS_NAME), metadata={"format": "pt"})
    (out / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
    return out


def read_peft_adapter(directory: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict]:
    """Read a PEFT LoRA adapter directory into this kit's naming.

    Returns ``(state, config)``: ``state`` maps ``"<path>.lora_A"`` /
    ``"<path>.lora_B"`` (the names ``model.named_parameters()`` gives for a
    ``LoRALinear`` at ``<path>``, i.e. the layout of ``save_adapter`` files)
    to CPU tensors; ``config`` is the parsed ``adapter_config.json``.

    Raises:
        ValueError: not a LoRA adapter, or a tensor key outside the
            ``base_model.model.<path>.lora_{A,B}.weight`` layout (e.g. a
            DoRA magnitude or a saved bias).
    """
    from safetensors.torch import load_file

    src = Path(directory)
    config = json.loads((src / CONFIG_NAME).read_text())
    if config.get("peft_type") != "LORA":
        raise ValueError(f"read_peft_adapter: peft_type is {config.get('peft_type')!r}, not 'LORA'")
    state = {}
    for key, value in load_file(str(src / WEIGHTS_NAME), device="cpu").items():
        path, _, part = key.removeprefix(_PREFIX).removesuffix(".weight").rpartition(".")
        if not key.startswith(_PREFIX) or not key.endswith(".weight") or part not in ("lora_A", "lora_B"):
            raise ValueError(f"read_peft_adapter: unexpected tensor {key!r}")
        state[f"{path}.{part}"] = value
    return state, config


def import_peft_adapter(model: nn.Module, directory: str | os.PathLike) -> None:
    """Copy a PEFT LoRA adapter into the ``LoRALinear`` layers of ``model`` in place.

    ``model`` must already carry ``LoRALinear`` at exactly the adapter's
    paths, with the adapter's ``r`` and ``lora_alpha / r`` scale (e.g. from
    ``apply_lora(model, names, rank=config["r"], alpha=config["lora_alpha"])``).
    Everything is checked before any parameter changes; values are copied
    into the existing parameters.

    Raises:
        ValueError: a path missing on either side, a shape, rank or scale
            mismatch, or a malformed adapter (see ``read_peft_adapter``).
    """
    state, config = read_peft_adapter(directory)
    layers = _lora_layers(model)
    paths = {name.rpartition(".")[0] for name in state}
    if paths != set(layers):
        raise ValueError(
            f"import_peft_adapter: adapter paths {sorted(paths)} != model LoRA paths {sorted(layers)}"
        )
    scale = config["lora_alpha"] / config["r"]
    params = {}
    for name, layer in layers.items():
        if layer.rank != config["r"] or abs(layer.scale - scale) > 1e-12 * max(1.0, abs(scale)):
            raise ValueError(
                f"import_peft_adapter: {name!r} has rank {layer.rank}, scale {layer.scale}; "
                f"adapter has r={config['r']}, scale {scale}"
            )
        for part in ("lora_A", "lora_B"):
            key = f"{name}.{part}"
            if key not in state:
                raise ValueError(f"import_peft_adapter: adapter lacks {key!r}")
            params[key] = getattr(layer, part)
            if state[key].shape != params[key].shape:
                raise ValueError(
                    f"import_peft_adapter: {key!r} has shape {tuple(state[key].shape)}, "
                    f"model expects {tuple(params[key].shape)}"
                )
    with torch.no_grad():
        for key, param in params.items():
            param.copy_(state[key])
