"""The staff references: what each deterministic student function must return.

This is the answer key. It lives only here (staff side); the starter gets
the values it produces for the public inputs as data (grading/fixtures/).
"""
from __future__ import annotations

import random
from collections.abc import Iterator

DEFAULT_SEED = 1234


def partition_indices(size: int, world_size: int, seed: int = DEFAULT_SEED) -> list[list[int]]:
    """Problem 1.1: shuffle with random.Random(seed), then contiguous slices in rank order."""
    order = list(range(size))
    random.Random(seed).shuffle(order)
    base, extra = divmod(size, world_size)
    parts, start = [], 0
    for rank in range(world_size):
        length = base + (1 if rank < extra else 0)
        parts.append(order[start:start + length])
        start += length
    return parts


def clock_cycles(microbatches: int, stages: int) -> Iterator[list[tuple[int, int]]]:
    """Problem 2.1: for k = 0 .. m+n-2 the tasks (i, j) with i + j == k, by increasing j."""
    for k in range(microbatches + stages - 1 if microbatches else 0):
        yield [(k - j, j) for j in range(stages) if 0 <= k - j < microbatches]


def schedule(microbatches: int, stages: int) -> list[list[list[int]]]:
    """``clock_cycles`` as plain nested lists (the form probes record)."""
    return [[[i, j] for i, j in wave] for wave in clock_cycles(microbatches, stages)]


def pipe_events(microbatches: int, stages: int) -> list[list]:
    """Problem 2.2: StageWorkers.events of a correct forward (per cycle every submit, then every receive)."""
    events = []
    for wave in clock_cycles(microbatches, stages):
        events += [["submit", j] for _, j in wave]
        events += [["receive", j] for _, j in wave]
    return events


def block_split(layers: int, stages: int) -> list[int]:
    """Problem 2.3: blocks per stage, layers // stages each, one more for the first layers % stages."""
    return [layers // stages + (1 if k < layers % stages else 0) for k in range(stages)]


def config_entries(world_size: int, micro_batch: int, grad_accum: int, precision: str) -> dict:
    """Problem 3.3: the entries a ``build_config`` result must hold (dotted key -> value)."""
    return {
        "train_batch_size": world_size * micro_batch * grad_accum,
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accum,
        "zero_optimization.stage": 2,
        "gradient_clipping": 0.0,
        "zero_allow_untested_optimizer": True,
        "fp16.enabled": precision == "fp16",
        "bf16.enabled": precision == "bf16",
    }


def engine_config(world_size: int, micro_batch: int, grad_accum: int) -> dict:
    """Problem 3.3: the fp32 ``build_config`` result as a nested dict (the config ``train_microbatch`` runs in)."""
    config: dict = {"steps_per_print": 10 ** 9}
    for dotted, value in config_entries(world_size, micro_batch, grad_accum, "fp32").items():
        *sections, leaf = dotted.split(".")
        node = config
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = value
    return config
