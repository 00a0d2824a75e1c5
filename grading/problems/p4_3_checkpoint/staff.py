"""Staff only (never released): the 4.3 hidden criteria (the same probe on 3 ranks; no answers needed)."""
from __future__ import annotations

from grading.check import Spawn
from grading.problems.p4_3_checkpoint import checks

HIDDEN_KIND = "three ranks, so that three shards each go back to the rank that saved it"
HIDDEN_POINTS = {checks.check_roundtrip: 1, checks.check_refuse: 1}
HIDDEN_SPAWN = Spawn(world_size=3)            # three shards: each must come back to the rank that saved it
