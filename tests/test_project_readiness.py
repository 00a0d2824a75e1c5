"""Entry points on an unfinished student starter: one line naming the problems to finish, exit 2, no traceback.

The starter (every problem, 1-5) is made here with ``python -m grading release``; finishing a problem is
simulated by copying the reference file of that problem in. Every entry point and benchmark flag is run
on a starter by ``tests/kit/test_starter_entry_points.py``; here: the tables and how the message moves on.
A written ``clock_cycles`` that breaks its contract is refused the same way (``project.microbatch``); its
broken variants wrap the kit's own ``clock_cycles``, so no schedule is written out here.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.schedule import clock_cycles
from project import microbatch, readiness
from project.cli import UniformError, refusal_code
from tests.commands import run_kit_command
from common import ROOT

pytestmark = pytest.mark.project



@pytest.fixture(scope="module")
def starter(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("starter") / "kit"
    done = run_kit_command(["release", out, "--problems", "1,2,3,4,5"], cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _run(starter: Path, *command: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, *command, "--workdir", str(starter / "workdir")], cwd=starter, env=env,
                          capture_output=True, text=True, timeout=300)


def test_each_command_names_exactly_its_unwritten_problems(starter):
    expected = {
        "project/run_data_parallel.py": "Problems 1.1 and 1.2 are not implemented yet",
        "project/run_pipeline.py --model_parallel_mode model_parallel": "Problem 2.3 is not implemented yet",
        "project/run_pipeline.py --model_parallel_mode pipeline_parallel":
            "Problems 2.1, 2.2 and 2.3 are not implemented yet",
        "project/run_finetune.py": "Problems 1.1, 1.2, 3.1, 3.2 and 3.3 are not implemented yet",
        "project/run_capstone.py": "Problems 4.1, 4.2 and 4.3 are not implemented yet",
        "project/run_tensor_parallel.py": "Problems 5.1 and 5.2 are not implemented yet",
        "scripts/run_benchmarks.py": "Problems 1.1, 1.2, 2.1, 2.2, 2.3 and 3.1 are not implemented yet",
    }
    assert set(expected) == set(readiness.COMMANDS)
    for command, needs in readiness.COMMANDS.items():
        assert readiness.problems_not_ready(needs, starter) == [expected[command]], command
        assert readiness.problems_not_ready(needs, ROOT) == [], command   # the reference is complete


def test_finishing_a_problem_moves_the_message_on(starter, tmp_path):
    kit = tmp_path / "kit"
    shutil.copytree(starter, kit)
    shutil.copy(ROOT / "data_parallel" / "dataset.py", kit / "data_parallel" / "dataset.py")   # 1.1 done
    done = _run(kit, "project/run_data_parallel.py")
    assert done.returncode == 2
    assert done.stderr.strip() == ("error: project/run_data_parallel.py needs Problems 1.1 and 1.2: "
                                   "Problem 1.2 is not implemented yet")
    (kit / "pipeline" / "pipe.py").write_text((ROOT / "pipeline" / "pipe.py").read_text()
                                              .replace("return torch.cat(batches)", "return torch.cat(batches"))
    problems = readiness.problems_not_ready(readiness.PIPELINE_PARALLEL, kit)
    assert problems[0].startswith("Problem 2.2 (pipeline/pipe.py) has a syntax error at line ")
    done = _run(kit, "project/run_pipeline.py")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr[-2000:]
    assert "syntax error" in done.stderr and "Traceback" not in done.stderr


def test_each_benchmark_flag_moves_on_as_problems_are_finished(starter, tmp_path):
    kit = tmp_path / "kit"
    shutil.copytree(starter, kit)
    with pytest.raises(UniformError, match=r"--peers needs Problems .*: Problems 1.1, 1.2, 2.1, 2.2, 2.3, 3.1, "):
        readiness.ensure_bench_ready(["--peers"], kit)
    for rel in ("data_parallel/dataset.py", "data_parallel/comm.py"):   # Problem 1 done
        shutil.copy(ROOT / rel, kit / rel)
    assert readiness.ensure_bench_ready([], kit) == {}
    assert readiness.ensure_bench_ready(["--peers"], kit) == {
        "finetune": "needs Problem 3.1: Problem 3.1 is not implemented yet",
        "ddp_zero": "needs Problems 1.2, 4.1 and 4.2: Problems 4.1 and 4.2 are not implemented yet"}
    with pytest.raises(UniformError) as refused:
        readiness.ensure_bench_ready(["--tensor_parallel"], kit)
    assert str(refused.value) == ("scripts/run_benchmarks.py --tensor_parallel needs Problems 1.1 and 1.2 "
                                  "(data_parallel) or 2.1, 2.2 and 2.3 (pipeline), and 5.1 and 5.2 (tensor_parallel): "
                                  "Problems 5.1 and 5.2 are not implemented yet")
    shutil.rmtree(kit / "tensor_parallel")   # a course without Problem 4 or 5
    for rel in ("data_parallel/ddp.py", "data_parallel/zero1.py"):
        (kit / rel).unlink()
    assert readiness.ensure_bench_ready(["--peers"], kit)["ddp_zero"] == "this course does not hand out Problem 4"
    with pytest.raises(UniformError, match=r"measures Problem 5 \(tensor_parallel\), which this course does not"):
        readiness.ensure_bench_ready(["--tensor_parallel"], kit)


@pytest.mark.parametrize("local_rank, code, printed", [(None, 2, True), ("0", 2, True), ("1", 0, False)])
def test_under_torchrun_local_rank_0_reports_a_refusal_and_the_others_end_quietly(monkeypatch, capsys, local_rank,
                                                                                   code, printed):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    if local_rank is not None:
        monkeypatch.setenv("RANK", local_rank)
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    assert refusal_code("error: x needs Problem 1.1: Problem 1.1 is not implemented yet") == code
    assert capsys.readouterr().err == ("error: x needs Problem 1.1: Problem 1.1 is not implemented yet\n"
                                       if printed else "")


def _generator_cycles(m, n):
    for cycle in clock_cycles(m, n):
        yield iter(cycle)


def _list_tasks(m, n):
    for cycle in clock_cycles(m, n):
        yield [list(task) for task in cycle]


def _one_cycle(m, n):
    yield [task for cycle in clock_cycles(m, n) for task in cycle]


@pytest.mark.parametrize("broken, why", [
    (_generator_cycles, "yielded a list_iterator as cycle 0, not a list (Pipe walks a cycle twice)"),
    (_list_tasks, "put a list [0, 0] in cycle 0, not a (microbatch, stage) tuple of two ints"),
    (_one_cycle, "put task (1, 0) in cycle 0, not after task (0, 0) (its stage's previous task)"),
])
def test_a_schedule_that_breaks_its_contract_is_refused_naming_the_call(broken, why):
    microbatch.check_schedule(clock_cycles, 4, 3)   # the reference keeps it
    with pytest.raises(UniformError) as refused:
        microbatch.check_schedule(broken, 4, 2)
    assert str(refused.value) == f"pipeline/schedule.py: clock_cycles(4, 2) {why}; {microbatch.SCHEDULE_CONTRACT}"


def test_run_pipeline_refuses_generator_cycles_in_one_line_before_training(tmp_path):
    kit = tmp_path / "kit"
    shutil.copytree(ROOT, kit, ignore=shutil.ignore_patterns(".git", "__pycache__", "workdir", ".*_cache"))
    with open(kit / "pipeline" / "schedule.py", "a") as source:   # each cycle a generator: Pipe's 2nd walk is empty
        source.write("\n\n_written = clock_cycles\n\n\ndef clock_cycles(m, n):\n"
                     "    for cycle in _written(m, n):\n        yield (task for task in cycle)\n")
    done = _run(kit, "project/run_pipeline.py", "--n_train", "16", "--n_valid", "8", "--n_epochs", "1",
                "--batch_size", "8", "--quiet")
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip() == ("error: pipeline/schedule.py: clock_cycles(4, 2) yielded a generator as cycle 0, "
                                   f"not a list (Pipe walks a cycle twice); {microbatch.SCHEDULE_CONTRACT}")
