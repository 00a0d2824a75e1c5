"""LoRA adapters: the provided ``LoRALinear`` layer and the student API.

``LoRALinear`` (provided) wraps a frozen ``nn.Linear`` and adds a trainable
low-rank update::

    y = base(x) + (alpha / rank) * (x @ lora_A.T) @ lora_B.T
        lora_A: (rank, in_features), normal(0, 0.02)
        lora_B: (out_features, rank), zeros  -> the update starts at zero

Student parts:
- 3.1 ``apply_lora(model, target_names, rank=2, alpha=4)``: swap in
  ``LoRALinear`` at the named ``nn.Linear`` modules and freeze the base.
- 3.2 ``save_adapter(model, path)`` / ``load_adapter(model, path)``: write and
  read only the adapter parameters.

GPT-2 in ``transformers`` builds ``c_attn``/``c_proj``/``c_fc`` from
``Conv1D``, not ``nn.Linear``; ``apply_lora`` accepts ``nn.Linear`` only.
Convert those layers first with the provided
``finetune.gpt2.conv1d_to_linear(model)`` (same outputs, weight transposed),
then pick targets with ``finetune.gpt2.lora_target_names(model, suffixes)``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
from torch import nn

ADAPTER_PARAM_NAMES = ("lora_A", "lora_B")


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trainable low-rank update (provided).

    Args:
        base: the layer to wrap; it is kept as ``self.base`` (the same object)
            and its parameters get ``requires_grad=False``.
        rank: inner dimension r of the update, >= 1.
        alpha: scaling numerator; the update is multiplied by ``alpha / rank``.

    ``lora_A`` (rank x in_features) starts normal with std 0.02 (drawn from
    torch's global generator), ``lora_B`` (out_features x rank) starts at
    zero, so right after wrapping the layer computes exactly what ``base``
    did. Both adapters take the device and dtype of ``base.weight``.

    Raises:
        ValueError: ``base`` is not an ``nn.Linear`` or ``rank < 1``.
    """

    def __init__(self, base: nn.Linear, rank: int = 2, alpha: float = 4) -> None:
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise ValueError(f"LoRALinear: base must be nn.Linear, got {type(base).__name__}")
        if rank < 1:
            raise ValueError(f"LoRALinear: rank must be >= 1, got {rank}")
        self.base = base
        for param in base.parameters():
            param.requires_grad_(False)
        self.rank = int(rank)
        self.alpha = alpha
        self.scale = alpha / rank
        factory = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, **factory))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, **factory))
        nn.init.normal_(self.lora_A, std=0.02)

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        update = nn.functional.linear(nn.functional.linear(x, self.lora_A), self.lora_B)
        return self.base(x) + update * self.scale

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha}"


def apply_lora(
    model: nn.Module, target_names: Sequence[str], rank: int = 2, alpha: float = 4
) -> nn.Module:
    """Freeze ``model`` and wrap each named ``nn.Linear`` in ``LoRALinear``.

    Args:
        model: any ``nn.Module``.
        target_names: names as ``model.named_modules()`` gives them; dotted
            names (``"encoder.layers.0.fc"``) reach nested layers. A module
            registered under two names is listed there once, under the name
            registered first; its other name is no name of
            ``named_modules()`` and counts as missing. ``""``
            (the model itself, even an ``nn.Linear``) is never a target: it
            has no parent to swap a ``LoRALinear`` into.
        rank, alpha: passed to ``LoRALinear`` for every target.

    Validate everything first, then mutate. Raise ``ValueError`` (and leave
    the model exactly as it was: no module swapped, no ``requires_grad``
    changed) when ``target_names`` is empty, holds a name twice, holds a
    name that ``model.named_modules()`` does not give (a module that does
    not exist, or the second name of one), names a module that is not an
    ``nn.Linear``, holds ``""``, or when ``rank < 1``.

    Then set ``requires_grad=False`` on every parameter of ``model`` and
    replace each target (in any order: each ``LoRALinear`` draws ``lora_A``
    from the global torch generator, and no check depends on those random
    values) in its parent module with
    ``LoRALinear(original_linear, rank, alpha)`` (the original layer object
    becomes its ``base``). The adapters keep the layer's device and dtype;
    afterwards only ``lora_A``/``lora_B`` are trainable and the model's
    outputs are unchanged (``lora_B`` starts at zero).

    Returns:
        ``model`` itself (modified in place), not a copy.

    Hint: ``model.get_submodule(parent_name)`` and ``setattr(parent, child,
    new_module)`` with ``parent_name, _, child = name.rpartition(".")``.
    """
    # BEGIN_STUDENT 3.1
    names = list(target_names)
    if rank < 1:
        raise ValueError(f"apply_lora: rank must be >= 1, got {rank}")
    if not names:
        raise ValueError("apply_lora: target_names is empty")
    if len(set(names)) != len(names):
        raise ValueError(f"apply_lora: duplicate target names in {names}")
    modules = dict(model.named_modules())
    for name in names:
        if not name or name not in modules:
            raise ValueError(f"apply_lora: no module named {name!r}")
        if not isinstance(modules[name], nn.Linear):
            raise ValueError(f"apply_lora: {name!r} is {type(modules[name]).__name__}, not nn.Linear")
    for param in model.parameters():
        param.requires_grad_(False)
    for name in names:
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, LoRALinear(modules[name], rank, alpha))
    return model
    # END_STUDENT 3.1


def save_adapter(model: nn.Module, path: str | os.PathLike) -> None:
    """Write only the LoRA adapter parameters of ``model`` to ``path``.

    The file is ``torch.save`` of a flat ``dict`` mapping each adapter
    parameter's name, exactly as ``model.named_parameters()`` gives it, to a
    detached CPU copy of its values, a tensor of its own (``torch.save``
    writes a tensor's whole storage, so a parameter that is a view of a
    larger buffer, as ``torch.nn.utils.vector_to_parameters`` makes them,
    saved as it is would bring that whole buffer along). The adapter
    parameters are those whose name's last dot-separated part is
    ``lora_A`` or ``lora_B``:
    ``"blocks.0.fc.lora_A"`` in a model holding ``LoRALinear`` layers, and
    plain ``"lora_A"`` / ``"lora_B"`` when ``model`` is itself a
    ``LoRALinear``. Nothing else goes in (no base weights, no biases, no
    metadata), so ``torch.load(path, weights_only=True)`` opens it. The
    model is not changed.
    """
    # BEGIN_STUDENT 3.2
    state = {
        name: param.detach().to("cpu", copy=True)
        for name, param in model.named_parameters()
        if name.rpartition(".")[2] in ADAPTER_PARAM_NAMES
    }
    torch.save(state, path)
    # END_STUDENT 3.2


def load_adapter(model: nn.Module, path: str | os.PathLike) -> None:
    """Copy the adapter values saved by ``save_adapter`` into ``model``.

    Open the file with ``torch.load(path, map_location="cpu",
    weights_only=True)``: a file it refuses (a pickle that would run code
    when loaded) raises, its code never runs and the model is untouched.
    Check it fully before changing anything; raise
    ``ValueError`` (model untouched) when it is not a ``dict`` of name ->
    tensor (a list, or a dict with a value that is not a tensor, e.g. an
    ``int``: ValueError too, not the AttributeError of reading its shape),
    when it holds no tensors (an empty dict), when one of the model's
    ``lora_A``/``lora_B`` parameters has no entry (missing key), when it has
    an entry that is not one of them (extra key, whatever its type: an
    ``int`` key such as ``0`` beside ``str`` ones too), or when an entry's
    shape differs from its parameter's.

    Then copy every value into the existing parameter in place under
    ``torch.no_grad()`` (``param.copy_(value)``), so the parameter objects
    stay the ones the model (and any optimizer) holds; the values are cast
    to the parameter's device and dtype. Base weights are not touched.
    """
    # BEGIN_STUDENT 3.2
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or not state:
        raise ValueError(f"load_adapter: {os.fspath(path)!r} holds no adapter tensors")
    params = {
        name: param
        for name, param in model.named_parameters()
        if name.rpartition(".")[2] in ADAPTER_PARAM_NAMES
    }
    # sorted as text: a file may hold int keys beside str ones, which do not compare
    missing = sorted(params.keys() - state.keys(), key=str)
    extra = sorted(state.keys() - params.keys(), key=str)
    if missing or extra:
        raise ValueError(f"load_adapter: missing keys {missing}, unexpected keys {extra}")
    for name, param in params.items():
        if not isinstance(state[name], torch.Tensor) or state[name].shape != param.shape:
            raise ValueError(f"load_adapter: {name!r} does not have shape {tuple(param.shape)}")
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(state[name])
    # END_STUDENT 3.2


def adapter_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """Return ``{name: parameter}`` for every ``lora_A``/``lora_B`` in ``model`` (provided).

    Names are those of ``model.named_parameters()``; use it to hand only the
    adapters to an optimizer.
    """
    return {
        name: param
        for name, param in model.named_parameters()
        if name.rpartition(".")[2] in ADAPTER_PARAM_NAMES
    }
