"""The language-model loss the runs train on, and the validation loss they report.

Both score only the target tokens (labels other than -100), position ``t``
predicting token ``t + 1``, in fp32 whatever the autocast precision::

    lm_loss     mean over sequences of each sequence's mean token loss   (what training minimises)
    evaluate    mean over all target tokens of a data set                 (the validation loss)
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from project.data import IGNORE_INDEX
from project.output import progress


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
