"""Staff only (never released): the 5.2 hidden inputs and hidden criteria (no answers needed)."""
from __future__ import annotations

import random

from grading.check import Spawn
from grading.problems.p5_2_gpt2 import checks
from grading.problems.p5_2_gpt2.checks import Inputs


def hidden_inputs(rng: random.Random) -> Inputs:
    """3 of 4 ranks, never ranks 0-2 (a rank's place in the group differs from its global rank); sdpa attention."""
    return Inputs(group_ranks=tuple(rng.choice([[1, 2, 3], [0, 2, 3], [0, 1, 3]])), attention="sdpa")


HIDDEN_KIND = "a group of three of four ranks, not starting at rank 0, with sdpa attention"
HIDDEN_POINTS = {checks.check_forward: 2, checks.check_grads: 1}
HIDDEN_SPAWN = Spawn(world_size=4, timeout_s=150)   # the 3-rank subgroup lives inside a 4-rank default group
