"""Problem 2.3 references: a tiny GPT-2, its batch, and the unsplit model's logits, loss and gradients.

Never imports student code and computes nothing a student function returns:
the probe (child) and the criteria (parent) build the same tiny GPT-2 with the
same seeds, and the parent runs the unsplit model for the expected values.
"""
from __future__ import annotations

import torch
from torch import nn

GPT2_SEED = 0
GPT2_LAYERS = 4
GPT2_VOCAB = 101
GPT2_BATCH, GPT2_SEQ = 5, 9
GPT2_SPLIT = 2


def tiny_gpt2(attn_implementation: str = "sdpa", seed: int = GPT2_SEED, layers: int = GPT2_LAYERS):
    """A 4-block GPT2LMHeadModel (n_embd 32, vocab 101), no dropout, in eval mode; global RNG untouched."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    config = GPT2Config(n_layer=layers, n_embd=32, n_head=4, n_positions=16, vocab_size=GPT2_VOCAB,
                        bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        attn_implementation=attn_implementation)
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config)
    torch.random.set_rng_state(state)
    return model.eval()


def gpt2_batch(seed: int = 0) -> torch.Tensor:
    """Token ids (GPT2_BATCH, GPT2_SEQ)."""
    g = torch.Generator().manual_seed(700 + seed)
    return torch.randint(0, GPT2_VOCAB, (GPT2_BATCH, GPT2_SEQ), generator=g)


def lm_loss(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy of ``logits`` (batch, T, vocab) on ``input_ids`` (batch, T)."""
    targets = input_ids[:, 1:].to(logits.device)
    return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), targets.reshape(-1))


def gpt2_logits(attn_implementation: str = "sdpa", seed: int = GPT2_SEED, layers: int = GPT2_LAYERS) -> torch.Tensor:
    """The unsplit model's logits for ``gpt2_batch()``."""
    with torch.no_grad():
        return tiny_gpt2(attn_implementation, seed, layers)(gpt2_batch()).logits


def gpt2_training_step() -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and parameter gradients of one step of the unsplit model (names from named_parameters)."""
    model = tiny_gpt2("sdpa")
    ids = gpt2_batch()
    loss = lm_loss(model(ids).logits, ids)
    loss.backward()
    return loss.item(), {name: p.grad for name, p in model.named_parameters()}


class TupleBlock(nn.Module):
    """A GPT-2 block that answers like older transformers versions: a tuple ``(hidden_states, None)``."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, hidden_states, *args, **kwargs):
        out = self.block(hidden_states, *args, **kwargs)
        return (out[0] if isinstance(out, tuple) else out), None
