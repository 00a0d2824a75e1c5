"""Staff only (never released): the 2.2 answers, hidden inputs and hidden criteria."""
from __future__ import annotations

import random

from grading.problems.p2_1_schedule.staff import schedule
from grading.problems.p2_2_pipe import checks
from grading.problems.p2_2_pipe.checks import Expected, Inputs


def pipe_events(microbatches: int, stages: int) -> list[tuple[str, int]]:
    """StageWorkers.events of a correct forward: per clock cycle every submit, then every receive."""
    events: list[tuple[str, int]] = []
    for wave in schedule(microbatches, stages):
        events += [("submit", j) for _, j in wave]
        events += [("receive", j) for _, j in wave]
    return events


def expected(inputs: Inputs) -> Expected:
    """The recorded waves of every schedule the probe needs on ``inputs``, and the events of a correct forward."""
    return Expected(waves={key: schedule(*key) for key in checks.schedules(inputs)},
                    events={checks.schedule_of(c): pipe_events(*checks.schedule_of(c)) for c in checks.EVENT_CONFIGS})


def hidden_inputs(rng: random.Random) -> Inputs:
    """Two Pipes (2 and 3 stages) with a smaller last micro-batch each, on batches of a secret seed."""
    configs = []
    for stages in (2, 3):
        rows = rng.randint(9, 17)
        split = rng.choice([s for s in range(2, 6) if rows % s])           # always a smaller last micro-batch
        configs.append((stages, rows, split))
    return Inputs(forward=tuple(configs), data_seed=rng.randint(1, 10_000))


HIDDEN_KIND = "Pipes of 2 and 3 stages, each with a smaller last micro-batch, on other batches"
HIDDEN_POINTS = {checks.check_pipe_forward: 1}
