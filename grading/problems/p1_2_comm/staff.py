"""Staff only (never released): the 1.2 hidden inputs and hidden criteria.

1.2 stores no expected values (the criteria recompute serial training in the
grader), so there is no ``expected``; the hidden inputs average on 3 or 4
ranks, so they run in their own spawn of that size.
"""
from __future__ import annotations

import random

from grading.check import Spawn
from grading.problems.p1_2_comm import checks
from grading.problems.p1_2_comm.checks import Inputs


def hidden_inputs(rng: random.Random) -> Inputs:
    """A secret world size (3 or 4: both divide the global batch of 12) and secret model and batch seeds."""
    return Inputs(world_size=rng.choice([3, 4]), model_seed=rng.randint(1, 10_000), batch_seed=rng.randint(1, 10_000))


HIDDEN_KIND = "more than two ranks, and other model and batch seeds"
HIDDEN_POINTS = {checks.check_grads: 2}
HIDDEN_SPAWN = Spawn(world_size=lambda inputs: inputs.world_size)     # as many ranks as they draw
