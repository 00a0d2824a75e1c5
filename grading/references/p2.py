"""The grader's own Problem 2 references. Never imports student code (``pipeline/``).

The probe (child) and the criteria (parent) build the same layers, batches and
GPT-2 from these functions with the same seeds, so the parent recomputes every
expected value itself. ``clock_cycles`` and ``ReferencePipe`` are installed in
the probes in place of the student's schedule (2.2 checks) and the student's
Pipe (2.3 checks), so a bug in one problem costs only that problem.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import nn

# ------------------------------------------------------------------ 2.1: schedule
SCHEDULE_CONFIGS = [(1, 1), (3, 2), (2, 3), (4, 4), (5, 1), (1, 5), (6, 3), (3, 7), (0, 1), (0, 3)]
BAD_SCHEDULE_ARGS = [(-1, 2), (3, 0), (2, -1), (0, 0)]


def clock_cycles(microbatches: int, stages: int) -> Iterator[list[tuple[int, int]]]:
    """The GPipe schedule: for k = 0 .. m+n-2 the tasks (i, j) with i + j == k, by increasing j."""
    if microbatches < 0 or stages < 1:
        raise ValueError(f"bad schedule size ({microbatches}, {stages})")
    for k in range(microbatches + stages - 1 if microbatches else 0):
        yield [(k - j, j) for j in range(stages) if 0 <= k - j < microbatches]


def expected_schedule(microbatches: int, stages: int) -> list[list[list[int]]]:
    """``clock_cycles`` as plain nested lists, the form the probe records."""
    return [[[i, j] for i, j in wave] for wave in clock_cycles(microbatches, stages)]


# ------------------------------------------------------------------ 2.2: layers and batches
# One width everywhere: a stage fed the wrong micro-batch (a late-binding bug) computes wrong numbers
# instead of crashing on a shape mismatch, so the bug costs the value checks, not the dispatch checks.
IN_FEATURES = HIDDEN = OUT_FEATURES = 8
LEARNING_RATE = 0.1
SGD_STEPS = 3
# layer index ranges of each stage, by number of stages
STAGE_CUTS = {1: [(0, 7)], 2: [(0, 3), (3, 7)], 3: [(0, 2), (2, 4), (4, 7)]}


def build_layers(seed: int = 0) -> list[nn.Module]:
    """Seven layers (4 Linear 8 -> 8, 3 Tanh) of a small MLP; the global RNG is left as it was."""
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    layers = [nn.Linear(IN_FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
              nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, OUT_FEATURES)]
    torch.random.set_rng_state(state)
    return layers


def stage_layers(layers: Sequence[nn.Module], stages: int) -> list[nn.Sequential]:
    """``layers`` cut into ``stages`` consecutive nn.Sequential stages (shared modules)."""
    return [nn.Sequential(*layers[a:b]) for a, b in STAGE_CUTS[stages]]


def batch(rows: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs (rows, 8) and regression targets (rows, 8)."""
    g = torch.Generator().manual_seed(500 + seed)
    return torch.randn(rows, IN_FEATURES, generator=g), torch.randn(rows, OUT_FEATURES, generator=g)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, target.to(output.device))


def sequential_forward(rows: int, seed: int = 0, model_seed: int = 0) -> torch.Tensor:
    """The plain model's output for ``batch(rows, seed)``."""
    with torch.no_grad():
        return nn.Sequential(*build_layers(model_seed))(batch(rows, seed)[0])


def sequential_gradients(rows: int, seed: int = 0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Gradient of ``loss_fn`` w.r.t. the input and every parameter (names as in nn.Sequential)."""
    model = nn.Sequential(*build_layers(0))
    inputs, targets = batch(rows, seed)
    inputs.requires_grad_(True)
    loss_fn(model(inputs), targets).backward()
    return inputs.grad, {name: p.grad for name, p in model.named_parameters()}


def sequential_sgd(rows: int, steps: int = SGD_STEPS) -> dict[str, torch.Tensor]:
    """Parameters after ``steps`` SGD steps of the plain model on ``batch(rows, step)``."""
    model = nn.Sequential(*build_layers(0))
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    for step in range(steps):
        inputs, targets = batch(rows, step)
        optimizer.zero_grad()
        loss_fn(model(inputs), targets).backward()
        optimizer.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def expected_events(microbatches: int, stages: int) -> list[list]:
    """StageWorkers.events of a correct forward: per cycle, every submit, then every receive, same order."""
    events = []
    for wave in clock_cycles(microbatches, stages):
        events += [["submit", j] for _, j in wave]
        events += [["receive", j] for _, j in wave]
    return events


class FailingStage(nn.Module):
    """A stage that raises ValueError(MESSAGE) when called: its error must reach the caller.

    ``called_in`` collects the names of the threads that called it (a stage must run on its worker).
    """

    MESSAGE = "deliberate failure in the grader's stage"

    def __init__(self):
        super().__init__()
        self.called_in: list[str] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import threading
        self.called_in.append(threading.current_thread().name)
        raise ValueError(self.MESSAGE)


# ------------------------------------------------------------------ 2.3: GPT-2
GPT2_SEED = 0
GPT2_LAYERS = 4
GPT2_VOCAB = 101
GPT2_BATCH, GPT2_SEQ = 5, 9
GPT2_SPLIT = 2


def tiny_gpt2(attn_implementation: str = "sdpa", seed: int = GPT2_SEED):
    """A 4-block GPT2LMHeadModel (n_embd 32, vocab 101), no dropout, in eval mode; global RNG untouched."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    config = GPT2Config(n_layer=GPT2_LAYERS, n_embd=32, n_head=4, n_positions=16, vocab_size=GPT2_VOCAB,
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


def gpt2_logits(attn_implementation: str = "sdpa") -> torch.Tensor:
    """The unsplit model's logits for ``gpt2_batch()``."""
    with torch.no_grad():
        return tiny_gpt2(attn_implementation)(gpt2_batch()).logits


def gpt2_training_step() -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and parameter gradients of one step of the unsplit model (names from named_parameters)."""
    model = tiny_gpt2("sdpa")
    ids = gpt2_batch()
    loss = lm_loss(model(ids).logits, ids)
    loss.backward()
    return loss.item(), {name: p.grad for name, p in model.named_parameters()}


def expected_block_split(layers: int, stages: int) -> list[int]:
    """Blocks per stage: layers // stages each, one more for the first layers % stages stages."""
    return [layers // stages + (1 if k < layers % stages else 0) for k in range(stages)]


class TupleBlock(nn.Module):
    """A GPT-2 block that answers like older transformers versions: a tuple ``(hidden_states, None)``."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, hidden_states, *args, **kwargs):
        out = self.block(hidden_states, *args, **kwargs)
        return (out[0] if isinstance(out, tuple) else out), None


class ReferencePipe(nn.Module):
    """The grader's micro-batch pipeline (installed as ``pipeline.pipe.Pipe`` in the 2.3 probe).

    Same constructor as the student's Pipe; runs the grader's ``clock_cycles``
    in the caller's thread, so 2.3 is judged without depending on 2.2.
    """

    def __init__(self, stages: Sequence[nn.Module], devices: Sequence[torch.device | str], split_size: int):
        super().__init__()
        self.stages = nn.ModuleList(stages)
        self.devices = [torch.device(d) for d in devices]
        self.split_size = split_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batches = list(torch.split(x, self.split_size))
        for wave in clock_cycles(len(batches), len(self.stages)):
            for i, j in wave:
                batches[i] = self.stages[j](batches[i].to(self.devices[j]))
        return torch.cat(batches)

    def close(self) -> None:
        pass

    def __enter__(self) -> ReferencePipe:
        return self

    def __exit__(self, *exc_info) -> None:
        pass
