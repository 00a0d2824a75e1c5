"""Staff only (never released): the 3.1 hidden inputs and hidden criteria.

Nothing of 3.1 is stored as expected data (the criteria compare with the
inputs and ``LoRANet``), so there is no ``expected`` here.
"""
from __future__ import annotations

import random

from grading.problems.p3_1_lora import checks
from grading.problems.p3_1_lora import reference as ref
from grading.problems.p3_1_lora.checks import Inputs


def hidden_inputs(rng: random.Random) -> Inputs:
    """Two or three of ``LoRANet``'s Linear layers (in model order), rank 3-6, alpha a secret multiple of rank/2."""
    targets = sorted(rng.sample(ref.NESTED_TARGETS, rng.randint(2, 3)), key=ref.NESTED_TARGETS.index)
    rank = rng.randint(3, 6)
    return Inputs(targets=tuple(targets), rank=rank, alpha=float(rng.choice([1, 2, 8, 16])) * rank / 2)


HIDDEN_KIND = "other target layers (in model order), ranks and alphas"
HIDDEN_POINTS = {checks.check_replace: 1}
