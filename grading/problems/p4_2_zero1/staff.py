"""Staff only (never released): the 4.2 hidden criteria (the same probe on 3 ranks; no answers needed)."""
from __future__ import annotations

from grading.check import Spawn
from grading.problems.p4_2_zero1 import checks

HIDDEN_KIND = "three ranks, so that the flat buffer needs padding"
HIDDEN_POINTS = {checks.check_steps: 1, checks.check_memory: 1}
HIDDEN_SPAWN = Spawn(world_size=3)            # 212 parameters over 3 ranks: the flat buffer is padded
