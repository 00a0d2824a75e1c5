"""The model of the entry points: a Hugging Face ``GPT2LMHeadModel``.

Presets are plain ``GPT2Config`` keyword sets. ``tiny`` trains in minutes on
two CPU cores (dropout 0, so data-parallel and serial runs can be compared
exactly); ``gpt2`` is the 124M GPT-2 shape (12 layers, 768 wide). The
vocabulary size always comes from the tokenizer. ``--pretrained NAME`` loads
weights with ``from_pretrained`` instead (needs network or the hub cache).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from project.cli import ConfigError

if TYPE_CHECKING:   # transformers is imported where a model is built: entry points refuse bad options faster
    from transformers import GPT2LMHeadModel

PRESETS: dict[str, dict] = {
    "tiny": dict(n_layer=4, n_head=4, n_embd=128, n_positions=128,
                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "small": dict(n_layer=6, n_head=8, n_embd=256, n_positions=256,
                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, n_positions=1024,
                 resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1),
}


def build_model(preset: str, tokenizer, pretrained: str | None = None, seed: int = 0) -> GPT2LMHeadModel:
    """Return a ``GPT2LMHeadModel`` on the CPU, in fp32, in train mode.

    From ``PRESETS[preset]`` with ``vocab_size=len(tokenizer)`` and weights
    drawn after ``torch.manual_seed(seed)`` (same seed -> same weights), or,
    when ``pretrained`` is given, ``GPT2LMHeadModel.from_pretrained(pretrained)``
    with its token embedding resized to ``len(tokenizer)`` when that differs.
    Raises ConfigError for an unknown preset or a pretrained model that
    cannot be loaded.
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    if pretrained:
        try:
            model = GPT2LMHeadModel.from_pretrained(pretrained)
        except Exception as exc:  # noqa: BLE001
            raise ConfigError(f"could not load pretrained model {pretrained!r} ({type(exc).__name__}: {exc}); "
                              f"the presets (--preset tiny|small|gpt2) need no network") from None
        if model.get_input_embeddings().num_embeddings != len(tokenizer):
            model.resize_token_embeddings(len(tokenizer))
    else:
        if preset not in PRESETS:
            raise ConfigError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
        config = GPT2Config(vocab_size=len(tokenizer), bos_token_id=tokenizer.eos_token_id,
                            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                            **PRESETS[preset])
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(config)
    return model.float().train()


def enable_activation_checkpointing(model: GPT2LMHeadModel) -> None:
    """Recompute each GPT-2 block's activations in backward instead of keeping them (non-reentrant)."""
    if hasattr(model, "activation_checkpointing_enable"):   # where transformers provides it
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def count_parameters(model: torch.nn.Module, trainable_only: bool = False) -> int:
    """Number of parameter elements of ``model`` (only those with ``requires_grad`` when asked)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
