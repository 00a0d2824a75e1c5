"""Problem 2.3: a transformers GPT-2 as pipeline stages.

``GPT2LMHeadModel`` is embeddings -> ``n_layer`` blocks -> final norm -> LM
head. Over ``n`` devices it becomes ``n`` stages, each an ``nn.Sequential``::

    stage 0:     Embeddings (wte + wpe + drop), Blocks(h[0 : c0])
    stage k:     Blocks(h[...])
    stage n-1:   Blocks(h[... : n_layer]), LMHead (ln_f + lm_head)

(with one device, stage 0 is Embeddings, Blocks(h[0 : n_layer]), LMHead:
three modules). Blocks are split evenly: every stage gets ``n_layer // n``
blocks and the first ``n_layer % n`` stages one more; a stage whose share is
zero blocks (more devices than blocks) still holds an empty ``Blocks``. The
stages share their parameters with the model (no copies), so gradients land
in ``model.parameters()``.

Two ways to run the stages (``build_pipeline_gpt2``):
- ``model_parallel``: the whole batch goes through stage 0, then stage 1, ...
  (one device busy at a time);
- ``pipeline_parallel``: ``pipeline.pipe.Pipe`` over micro-batches.
"""
from __future__ import annotations

import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from pipeline import pipe, runtime

MODES = ("model_parallel", "pipeline_parallel")


def causal_mask(config, hidden_states: torch.Tensor):
    """The attention mask GPT-2's blocks need for causal self-attention over ``hidden_states``.

    Built the way ``GPT2Model`` builds it (no padding, positions ``0..T-1``):
    ``None`` where the attention implementation applies causality by itself
    (e.g. ``sdpa``), a 4-D additive mask otherwise (e.g. ``eager``, which
    would otherwise let every token see the future).
    """
    positions = torch.arange(hidden_states.shape[1], device=hidden_states.device).unsqueeze(0)
    try:
        from transformers.masking_utils import create_causal_mask
        return create_causal_mask(config=config, inputs_embeds=hidden_states, attention_mask=None,
                                  cache=None, position_ids=positions)
    except (ImportError, TypeError):   # other transformers versions: an explicit additive mask
        length = hidden_states.shape[1]
        blocked = torch.ones(length, length, dtype=torch.bool, device=hidden_states.device).triu(1)
        mask = torch.zeros(length, length, dtype=hidden_states.dtype, device=hidden_states.device)
        return mask.masked_fill(blocked, torch.finfo(hidden_states.dtype).min)[None, None]


class Embeddings(nn.Module):
    """Token + position embeddings and dropout of a GPT-2 (shares the model's modules).

    ``forward(input_ids)`` with ``input_ids`` of shape (batch, T) returns
    hidden states of shape (batch, T, n_embd), exactly as ``GPT2Model`` does
    before its first block.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.wte = model.transformer.wte
        self.wpe = model.transformer.wpe
        self.drop = model.transformer.drop

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        return self.drop(self.wte(input_ids) + self.wpe(positions))


class LMHead(nn.Module):
    """Final layer norm and LM head of a GPT-2: hidden (batch, T, n_embd) -> logits (batch, T, vocab).

    GPT-2 ties ``lm_head.weight`` to the token embedding. A tied weight is not
    registered here (it belongs to the stage holding ``Embeddings``, so moving
    this stage never moves it); the forward reads it with a differentiable
    ``.to(device)``, so its gradient still reaches the one shared parameter.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.ln_f = model.transformer.ln_f
        self._tied = model.lm_head.weight is model.transformer.wte.weight
        if self._tied:
            self._embedding = [model.transformer.wte]   # a list, so nn.Module does not register it
        else:
            self.lm_head = model.lm_head

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = self.ln_f(hidden_states)
        if self._tied:
            return F.linear(hidden_states, self._embedding[0].weight.to(hidden_states.device))
        return self.lm_head(hidden_states)


class Blocks(nn.Module):
    """A run of consecutive GPT-2 blocks (``model.transformer.h[a:b]``, shared, not copied)."""

    def __init__(self, blocks: Sequence[nn.Module], config):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.config = config

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Run ``hidden_states`` (batch, T, n_embd) through every block in order; same shape out.

        Contract:
        - call each block as ``block(hidden_states, attention_mask=mask)`` with
          ``mask = causal_mask(self.config, hidden_states)`` (computed once);
          without it an ``eager``-attention GPT-2 would not be causal;
        - a block returns a tensor in recent transformers and a tuple whose
          first item is the hidden states in older ones: accept both;
        - zero blocks return the input unchanged.
        Returns a tensor (batch, T, n_embd), never a tuple: the next stage
        takes it as its input.
        """
        # BEGIN_STUDENT 2.3
        mask = causal_mask(self.config, hidden_states)
        for block in self.blocks:
            out = block(hidden_states, attention_mask=mask)
            hidden_states = out[0] if isinstance(out, tuple) else out
        return hidden_states
        # END_STUDENT 2.3


def gpt2_stages(model: nn.Module, devices: Sequence[torch.device | str]) -> list[nn.Sequential]:
    """Split a ``GPT2LMHeadModel`` into ``len(devices)`` stages, stage ``k`` moved to ``devices[k]``.

    Contract (see the module docstring for the picture):
    - stage ``k`` is an ``nn.Sequential`` of: ``Embeddings(model)`` if ``k ==
      0``; then ``Blocks(blocks, model.config)`` with its share of
      ``model.transformer.h`` (``n_layer // n`` blocks, one more for the first
      ``n_layer % n`` stages, in order; possibly none: a stage whose share is
      zero blocks still holds an empty ``Blocks``); then ``LMHead(model)`` if
      ``k == n - 1``;
    - move each stage with ``.to(devices[k])``; reuse the model's modules
      (no copies), so the model's parameters are the stages' parameters;
    - feeding ``input_ids`` through the stages in order gives the model's
      logits.
    Raises ValueError for an empty ``devices``. Returns the stages as a
    ``list`` of ``nn.Sequential`` (not a generator: the runtimes take its
    length).
    """
    if len(devices) < 1:
        raise ValueError("gpt2_stages needs at least one device")
    # BEGIN_STUDENT 2.3
    blocks = list(model.transformer.h)
    base, extra = divmod(len(blocks), len(devices))
    stages, start = [], 0
    for k, device in enumerate(devices):
        count = base + (1 if k < extra else 0)
        layers: list[nn.Module] = [Blocks(blocks[start:start + count], model.config)]
        start += count
        if k == 0:
            layers.insert(0, Embeddings(model))
        if k == len(devices) - 1:
            layers.append(LMHead(model))
        stages.append(nn.Sequential(*layers).to(device))
    return stages
    # END_STUDENT 2.3


class ModelParallel(nn.Module):
    """Naive model parallelism: the whole batch through stage 0 on ``devices[0]``, then stage 1, ...

    Only one device works at a time; compare with ``Pipe``. ``close()`` is a
    no-op, for symmetry with ``Pipe``. ``timeline`` records one dict per stage
    call (``stage``, ``task_index``, ``start``, ``end``), like ``Pipe``'s
    ``workers.timeline``.
    """

    def __init__(self, stages: Sequence[nn.Module], devices: Sequence[torch.device | str]):
        super().__init__()
        if len(stages) != len(devices):
            raise ValueError(f"ModelParallel got {len(stages)} stages but {len(devices)} devices")
        self.stages = nn.ModuleList(stages)
        self.devices = [torch.device(d) for d in devices]
        self.timeline = runtime.RecordList()
        self._calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for j, (stage, device) in enumerate(zip(self.stages, self.devices)):
            start = time.perf_counter()
            x = stage(x.to(device))
            self.timeline.append({"stage": j, "task_index": self._calls, "start": start, "end": time.perf_counter()})
        self._calls += 1
        return x

    def close(self) -> None:
        pass

    def __enter__(self) -> ModelParallel:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def build_pipeline_gpt2(model: nn.Module, devices: Sequence[torch.device | str], mode: str,
                        split_size: int = 1) -> nn.Module:
    """Wrap a ``GPT2LMHeadModel`` for ``mode`` over ``devices``; ``forward(input_ids)`` returns logits.

    ``mode`` is ``"model_parallel"`` (a ``ModelParallel``) or
    ``"pipeline_parallel"`` (a ``pipe.Pipe`` with micro-batches of
    ``split_size``). The stages come from ``gpt2_stages`` and share the
    model's parameters; the logits are on the last device. Close the result
    (or use it in a ``with`` block) when done. Raises ValueError for an unknown
    mode.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    devices = [torch.device(d) for d in devices]
    stages = gpt2_stages(model, devices)
    if mode == "model_parallel":
        return ModelParallel(stages, devices)
    return pipe.Pipe(stages, devices, split_size)
