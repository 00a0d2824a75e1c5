"""Hidden inputs of every problem, derived from the course secret, with their staff-computed answers.

``hidden_data(name, secret)`` returns plain data (JSON-like) for the check
module ``name``: the inputs its probe runs on (passed to the ranks as case
arguments) and, for deterministic functions, the expected values
(computed here, in the grader, by ``answers``). Different secrets give
different inputs; the same secret always gives the same ones. Inputs stay
within what each contract allows (world sizes that divide the batch, model
sizes the GPT-2 config accepts, ...), and never coincide with a public input.
"""
from __future__ import annotations

import functools
import hashlib
import math
import random

from grading.hidden import answers

LORA_TARGETS = ["embed", "blocks.0.fc", "blocks.1.fc", "head"]   # the Linear layers of the 3.x probe model


def _rng(name: str, secret: str) -> random.Random:
    digest = hashlib.sha256(f"{secret}\x00{name}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


@functools.cache
def hidden_data(name: str, secret: str = "") -> dict:
    """The hidden inputs (and expected values) of check module ``name`` under ``secret``."""
    rng = _rng(name, secret)
    return _BUILDERS[name](rng)


def _p1_1(rng: random.Random) -> dict:
    configs = [[rng.randint(20, 400), rng.randint(2, 8), rng.randint(10_000, 99_999)] for _ in range(4)]
    configs.append([rng.randint(3, 9), rng.randint(10, 13), rng.randint(10_000, 99_999)])   # empty parts
    return {"configs": configs, "expected": [answers.partition_indices(*c) for c in configs]}


def _p1_2(rng: random.Random) -> dict:
    return {"world_size": rng.choice([3, 4]), "model_seed": rng.randint(1, 10_000),
            "batch_seed": rng.randint(1, 10_000)}


def _p2_1(rng: random.Random) -> dict:
    configs = [[rng.randint(8, 14), rng.randint(4, 9)], [rng.randint(2, 4), rng.randint(8, 12)],
               [rng.randint(9, 16), 1]]
    return {"configs": configs, "expected": [answers.schedule(m, n) for m, n in configs]}


def _p2_2(rng: random.Random) -> dict:
    configs = []
    for stages in (2, 3):
        rows = rng.randint(9, 17)
        split = rng.choice([s for s in range(2, 6) if rows % s])           # always a smaller last micro-batch
        configs.append([stages, rows, split])
    waves = {f"{math.ceil(rows / split)},{stages}": answers.schedule(math.ceil(rows / split), stages)
             for stages, rows, split in configs}
    return {"forward_configs": configs, "waves": waves, "data_seed": rng.randint(1, 10_000)}


def _p2_3(rng: random.Random) -> dict:
    layers = rng.choice([5, 6, 7])
    return {"layers": layers, "stage_counts": [2, 3], "model_seed": rng.randint(1, 10_000),
            "expected_split": {str(n): answers.block_split(layers, n) for n in (2, 3)}}


def _p3_1(rng: random.Random) -> dict:
    targets = sorted(rng.sample(LORA_TARGETS, rng.randint(2, 3)), key=LORA_TARGETS.index)
    rank = rng.randint(3, 6)
    return {"targets": targets, "rank": rank, "alpha": float(rng.choice([1, 2, 8, 16])) * rank / 2}


def _p3_2(rng: random.Random) -> dict:
    targets = sorted(rng.sample(LORA_TARGETS, rng.randint(2, 4)), key=LORA_TARGETS.index)
    return {"targets": targets, "seed": rng.randint(10, 10_000), "rank": rng.randint(1, 4)}


def _p3_3(rng: random.Random) -> dict:
    configs = [[rng.randint(2, 16), rng.randint(1, 9), rng.randint(1, 9), rng.choice(["fp32", "fp16", "bf16"])]
               for _ in range(3)]
    return {"configs": configs, "expected": [answers.config_entries(*c) for c in configs]}


def _p4(rng: random.Random) -> dict:
    # bucket caps (MiB) between a few small parameters and most of DDPProbeNet: other cuts than the public sizes
    return {"bucket_sizes": sorted(rng.randint(300, 2400) / 2 ** 20 for _ in range(3))}


def _p5(rng: random.Random) -> dict:
    # 3 of 4 ranks, never ranks 0-2: some rank's place in the group always differs from its global rank
    return {"group_ranks": rng.choice([[1, 2, 3], [0, 2, 3], [0, 1, 3]])}


_BUILDERS = {"p1_1": _p1_1, "p1_2": _p1_2, "p2_1": _p2_1, "p2_2": _p2_2, "p2_3": _p2_3, "p3_1": _p3_1,
             "p3_2": _p3_2, "p3_3": _p3_3, "p4": _p4, "p5": _p5}
