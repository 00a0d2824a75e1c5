"""Staff only (never released): the 5.1 hidden inputs and hidden criteria (no answers needed)."""
from __future__ import annotations

import random

from grading.check import Spawn
from grading.problems.p5_1_layers import checks
from grading.problems.p5_1_layers.checks import Inputs


def hidden_inputs(rng: random.Random) -> Inputs:
    """3 of 4 ranks, never ranks 0-2 (some rank's place in the group always differs from its global rank);
    a chunked column layer of 2 or 4 blocks (the public one has 3)."""
    return Inputs(group_ranks=tuple(rng.choice([[1, 2, 3], [0, 2, 3], [0, 1, 3]])), chunks=rng.choice([2, 4]))


HIDDEN_KIND = "a group of three of four ranks, not starting at rank 0, and another number of chunks"
HIDDEN_POINTS = {checks.check_region_functions: 1, checks.check_column_forward: 1, checks.check_row_forward: 1,
                 checks.check_input_grads: 1, checks.check_column_chunks: 1}
HIDDEN_SPAWN = Spawn(world_size=4)            # the 3-rank subgroup lives inside a 4-rank default group
