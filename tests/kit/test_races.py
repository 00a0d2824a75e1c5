"""Races a docstring rules out get the same verdict on every run, the machine busy or not.

The grader makes each race lose on every run instead of by luck: an async all-reduce's result reaches its tensor
only at ``wait()`` (``p4_1_ddp/async_results.py``), and a save's file accesses between two collectives run in
rank order (``p4_3_checkpoint/order.py``). Each racy submission is graded five times, two of them with busy
loops on every core beside the ranks (``_busy_loops``), and must get the same verdicts and messages each time,
below full marks, with its cause named. Only the public cases run: the races are the same at the hidden world size.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from common.error_words import plain
from grading.engine.case_run import CASE_FOLDER, LaunchResult
from grading.engine.expect import CheckFailed
from grading.engine.rubric import Case
from grading.engine.runner import judge_case, run_cases
from grading.problems import sub_problem
from grading.kit.variants import make_variant_kit
from grading.commands.variants import declared

pytestmark = pytest.mark.kit
RUNS, BUSY_RUNS = 5, (1, 3)         # the runs (counted from 0) with busy loops beside
# The races, by sub-problem and variant name (each marked alone in its folder's variants.py: graded on its own there)
RACE_NAMES = {"4.1": "never_waits", "4.3": "hashes_shards_without_gather"}
RACES = [v for problem, name in RACE_NAMES.items() for v in declared(problem) if v.name == name]


def _busy_loops() -> list[subprocess.Popen]:
    """A spinning process per core, at nice 5: it takes about a quarter of each core from the ranks (and from
    the other tests running beside this one, which it would otherwise slow to half speed)."""
    spin = "import os, time\nos.nice(5)\nend = time.monotonic() + 300\nwhile time.monotonic() < end: pass"
    return [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(os.cpu_count() or 2)]


def test_every_race_is_declared_and_graded_alone():
    assert [(v.problem, v.name) for v in RACES] == list(RACE_NAMES.items())
    assert all(v.alone for v in RACES), [v.name for v in RACES if not v.alone]


@pytest.mark.parametrize("variant", RACES, ids=[v.name for v in RACES])
def test_a_race_gets_the_same_verdicts_on_every_run_busy_or_not(variant, tmp_path, fork_servers):
    kit = make_variant_kit(tmp_path / "kit", variant.edits)
    cases = sub_problem(variant.problem).graded_cases()[:1]
    runs = []
    for run in range(RUNS):
        loops = _busy_loops() if run in BUSY_RUNS else []
        try:
            verdicts = run_cases(cases, kit, tmp_path / f"run{run}", servers=fork_servers)
        finally:
            for loop in loops:
                loop.kill()
                loop.wait()
        runs.append(verdicts)
    outcomes = [sorted((v.id, v.passed, v.score, v.message) for v in verdicts) for verdicts in runs]
    assert all(outcome == outcomes[0] for outcome in outcomes), outcomes
    failed = [v for v in runs[0] if not v.passed]
    assert failed, f"{variant.name} kept full marks"
    public = {cid for cid in variant.fails if not cid.endswith("_hidden")}
    assert public <= {v.id for v in failed}, (public, [v.id for v in failed])
    for verdicts in runs:
        messages = "\n".join(v.message for v in verdicts if not v.passed)
        assert variant.hint in messages, f"{variant.name}: no message says {variant.hint!r}:\n{messages[:2000]}"



def test_a_failure_reads_the_same_whichever_folders_the_run_had(tmp_path):
    """A case's folder is new on every run: a message quoting a path in it (a check's words, a student's error)
    shows it as ``CASE_FOLDER``, and a library's error quoting a loopback address loses its port, so the same code
    gets the same message on every run."""
    case = Case("toy_paths", probe=lambda ctx: None)
    run_dir = {}

    @case.criterion("90.1.paths", "quotes paths of its run", points=1, reads=())
    def check_paths(run) -> None:
        raise CheckFailed(f"no manifest at {run_dir['now'] / 'handoff' / 'checkpoints' / 'step_10' / 'manifest.json'}"
                          f"; rank 1 wrote {run_dir['now'] / 'rank1' / 'x.pt'}")

    messages = []
    for name in ("first", "second"):
        run_dir["now"] = tmp_path / name / "toy_paths"
        run_dir["now"].mkdir(parents=True)
        [verdict] = judge_case(case, LaunchResult(run_dir["now"], 1))
        messages.append(verdict.message)
    assert messages == [f"no manifest at {CASE_FOLDER}/handoff/checkpoints/step_10/manifest.json; "
                        f"rank 1 wrote {CASE_FOLDER}/rank1/x.pt"] * 2, messages
    assert plain("Connection closed by peer [127.0.0.1]:15752.") == "Connection closed by peer [127.0.0.1]."
