"""Staff only (never released): the 3.2 hidden inputs and hidden criteria.

Nothing of 3.2 is stored as expected data (the criteria compare with the
adapter values the grader set, ``adapter_state``), so there is no ``expected`` here.
"""
from __future__ import annotations

import random

from grading.problems.p3_1_lora import reference as ref
from grading.problems.p3_2_adapter import checks
from grading.problems.p3_2_adapter.checks import Inputs


def hidden_inputs(rng: random.Random) -> Inputs:
    """Two to four of ``LoRANet``'s Linear layers (in model order), adapters of a secret seed, rank 1-4."""
    targets = sorted(rng.sample(ref.NESTED_TARGETS, rng.randint(2, 4)), key=ref.NESTED_TARGETS.index)
    seed = rng.randint(10, 10_000)
    return Inputs(targets=tuple(targets), rank=rng.randint(1, 4), seed=seed)


HIDDEN_KIND = "other target layers (in model order), adapter values and ranks"
HIDDEN_POINTS = {checks.check_save: 1}
