"""The model of the entry points, a Hugging Face ``GPT2LMHeadModel``, and the loss it trains on and reports.

Presets are plain ``GPT2Config`` keyword sets (``PRESETS``). Both losses score only the target tokens, in fp32
whatever the autocast precision: ``lm_loss`` is what training minimises, ``evaluate`` the validation loss.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch
import torch.nn.functional as F

from project.cli import ConfigError
from project.data import IGNORE_INDEX
from project.output import progress

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
    drawn after ``torch.manual_seed(seed)`` (same seed -> same weights; the
    small presets have dropout 0, so data-parallel and serial runs can be
    compared exactly), or,
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


def logits_of(output) -> torch.Tensor:
    """The logits tensor of a Hugging Face model output (or the tensor itself)."""
    return output.logits if hasattr(output, "logits") else output


def lm_loss(output, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy on the labelled (target) tokens: mean over sequences of each sequence's mean.

    ``output`` is a model output with ``.logits`` or a logits tensor ``[B, T, V]``;
    ``labels`` is ``[B, T]`` with -100 where there is no loss. Position ``t``
    predicts ``labels[:, t + 1]``. Averaging per sequence first makes the
    mean over ranks of per-rank losses equal to the loss of the whole global
    batch when the ranks hold equally many sequences.
    """
    logits = logits_of(output)
    labels = labels.to(logits.device)
    per_token = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(),
                                ignore_index=IGNORE_INDEX, reduction="none").view(labels.shape[0], -1)
    counts = (labels[:, 1:] != IGNORE_INDEX).sum(dim=1)
    return (per_token.sum(dim=1) / counts.clamp(min=1)).mean()


@torch.no_grad()
def evaluate(forward: Callable[[torch.Tensor], object], examples: list, collate: Callable, batch_size: int,
             device: torch.device | str = "cpu", quiet: bool = True) -> float:
    """Token-level mean cross entropy of the targets of ``examples`` (a validation loss).

    ``forward(input_ids)`` returns logits or a model output; runs under
    ``no_grad``. Callers put the model in eval mode if it has dropout.
    A progress bar shows on a terminal unless ``quiet``.
    """
    total, count = 0.0, 0
    for start in progress(range(0, len(examples), batch_size), quiet, desc="validation", unit="batch"):
        batch = collate(examples[start:start + batch_size])
        logits = logits_of(forward(batch["input_ids"].to(device)))
        labels = batch["labels"].to(logits.device)
        total += F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(),
                                 ignore_index=IGNORE_INDEX, reduction="sum").item()
        count += int((labels[:, 1:] != IGNORE_INDEX).sum())
    return total / max(count, 1)


def validation_loss(model: torch.nn.Module, examples: list, collate: Callable, device: torch.device | str,
                    quiet: bool = True, forward: Callable | None = None, batch_size: int = 64) -> float:
    """``evaluate`` with ``model`` in eval mode (dropout off), back in train mode afterwards.

    ``forward`` (default: ``model``) is what the inputs go through, e.g. a pipeline wrapping the model.
    """
    model.eval()
    try:
        return evaluate(forward or model, examples, collate, batch_size, device, quiet)
    finally:
        model.train()
