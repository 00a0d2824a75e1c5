"""Write and check the public fixtures (``grading/fixtures/*.json``) from the staff answers.

``python -m grading fixtures`` rewrites them; ``python -m grading fixtures
--check`` (and a kit test) fails when a committed file differs from what the
answers give; ``grading release`` writes them fresh into every starter.
Each fixture holds the expected values of one check module's *public*
inputs, which stay defined in that module.
"""
from __future__ import annotations

import json
from pathlib import Path

from grading.problems.p1_1_partition import checks as p1_1_partition
from grading.problems.p2_1_schedule import checks as p2_1_schedule
from grading.problems.p2_2_pipe import checks as p2_2_pipe
from grading.problems.p2_3_gpt2 import checks as p2_3_gpt2
from grading.problems.p3_3_zero import checks as p3_3_zero
from grading.kit.data import FIXTURE_DIR, fixture_key
from grading.hidden import answers, p4_hidden


def public_fixtures() -> dict[str, dict]:
    """Fixture name -> content, computed from the staff answers for the public inputs."""
    p1_1_calls = (p1_1_partition.CONFIGS + p1_1_partition.EDGE_CONFIGS
                  + [(*p1_1_partition.DEFAULT_SEED_CALL, answers.DEFAULT_SEED)])
    loader_calls = [(len(p1_1_partition.DATASET), ws, answers.DEFAULT_SEED) for ws in (2, 3)]
    return {
        "p1_1": {
            "partitions": {fixture_key(*c): answers.partition_indices(*c) for c in p1_1_calls},
            "loader": {fixture_key(*c): answers.partition_indices(*c) for c in loader_calls},
        },
        "p2_1": {"schedules": {fixture_key(m, n): answers.schedule(m, n)
                               for m, n in p2_1_schedule.SCHEDULE_CONFIGS}},
        "p2_2": {
            "waves": {k: answers.schedule(*map(int, k.split(","))) for k in p2_2_pipe.public_schedule_keys()},
            "events": {p2_2_pipe.schedule_key(*c): answers.pipe_events(*map(int, p2_2_pipe.schedule_key(*c).split(",")))
                       for c in p2_2_pipe.EVENT_CONFIGS},
        },
        "p2_3": {"blocks_per_stage": {str(n): answers.block_split(p2_3_gpt2.ref.GPT2_LAYERS, n)
                                      for n in p2_3_gpt2.STAGE_COUNTS}},
        "p4_buckets": p4_hidden.bucket_fixture(),
        "p3_3": {
            "entries": {fixture_key(*c): answers.config_entries(*c) for c in p3_3_zero.CONFIGS},
            "engine_config": answers.engine_config(*p3_3_zero.ENGINE_SIZES),
        },
    }


def render(content: dict) -> str:
    """The canonical JSON text of one fixture."""
    return json.dumps(content, indent=1, sort_keys=True) + "\n"


def write(folder: Path = FIXTURE_DIR) -> list[Path]:
    """Write every public fixture into ``folder``; return the paths."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, content in public_fixtures().items():
        path = folder / f"{name}.json"
        path.write_text(render(content))
        paths.append(path)
    return paths


def stale(folder: Path = FIXTURE_DIR) -> list[str]:
    """Names of the fixtures in ``folder`` that are missing or differ from the staff answers."""
    found = []
    for name, content in public_fixtures().items():
        path = folder / f"{name}.json"
        if not path.is_file() or path.read_text() != render(content):
            found.append(name)
    return found
