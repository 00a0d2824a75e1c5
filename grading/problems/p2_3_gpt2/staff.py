"""Staff only (never released): the 2.3 answers, hidden inputs and hidden criteria."""
from __future__ import annotations

import random

from grading.problems.p2_3_gpt2 import checks
from grading.problems.p2_3_gpt2.checks import Expected, Inputs


def block_split(layers: int, stages: int) -> list[int]:
    """The answer of 2.3's split: blocks per stage, layers // stages each, one more for the first layers % stages."""
    return [layers // stages + (1 if k < layers % stages else 0) for k in range(stages)]


def expected(inputs: Inputs) -> Expected:
    """The blocks per stage of ``inputs``' GPT-2 for each of its stage counts."""
    return Expected(blocks_per_stage={n: block_split(inputs.layers, n) for n in inputs.stage_counts})


def hidden_inputs(rng: random.Random) -> Inputs:
    """A GPT-2 of a secret number of blocks (5 to 7) and seed, cut into 2 and 3 stages."""
    layers = rng.choice([5, 6, 7])
    return Inputs(layers=layers, stage_counts=(2, 3), model_seed=rng.randint(1, 10_000))


HIDDEN_KIND = "a GPT-2 of another number of blocks, cut into 2 and 3 stages"
HIDDEN_POINTS = {checks.check_gpt2_stages: 1}
