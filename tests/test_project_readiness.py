"""Entry points on an unfinished student starter: one line naming the problems to finish, exit 2, no traceback.

The starter is made here with ``python -m grading release``; finishing a
problem is simulated by copying the reference file of that problem in.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from project import readiness
from tests.commands import run_kit_command

pytestmark = pytest.mark.project

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def starter(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("starter") / "kit"
    done = run_kit_command(["release", out], cwd=ROOT, timeout=300)
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
        "scripts/run_benchmarks.py": "Problems 1.1, 1.2, 2.1, 2.2, 2.3 and 3.1 are not implemented yet",
    }
    assert set(expected) == set(readiness.COMMANDS)
    for command, needs in readiness.COMMANDS.items():
        assert readiness.problems_not_ready(needs, starter) == [expected[command]], command
        assert readiness.problems_not_ready(needs, ROOT) == [], command   # the reference is complete


ON_THE_STARTER = pytest.mark.parametrize("command", [
    ("project/run_data_parallel.py",),
    ("project/run_pipeline.py", "--model_parallel_mode", "model_parallel"),
    ("project/run_pipeline.py",),
    ("project/run_finetune.py",),
    ("scripts/run_benchmarks.py", "--quick"),
], ids=["data_parallel", "model_parallel", "pipeline_parallel", "finetune", "benchmarks"])


def _one_line_refusal(done: subprocess.CompletedProcess, command: tuple[str, ...]) -> None:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert f"error: {command[0]} " in lines[0] and " needs Problem" in lines[0] and "not implemented yet" in lines[0]


@ON_THE_STARTER
def test_an_entry_point_on_the_starter_says_what_to_finish_in_one_line(starter, command):
    done = _run(starter, *command)
    _one_line_refusal(done, command)
    assert not (starter / "workdir" / "out").exists() and not (starter / "workdir" / "perf").exists()


@ON_THE_STARTER
def test_the_refusal_comes_before_torch_transformers_or_deepspeed_is_imported(starter, command):
    """Entry points parse and check readiness first (``project/__init__.py``): the one line costs no heavy import.

    The script runs as ``python SCRIPT`` would (``runpy``, as ``__main__``); what it imported is printed at exit
    by an ``atexit`` handler (the entry point ends with ``sys.exit``, the normal way).
    """
    argv = [*command, "--workdir", str(starter / "workdir")]
    code = ("import atexit, runpy, sys\n"
            "atexit.register(lambda: print(sorted(m for m in ('torch', 'transformers', 'deepspeed')"
            " if m in sys.modules)))\n"
            f"sys.argv = {argv!r}\n"
            "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=starter, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"})
    _one_line_refusal(done, command)
    assert done.stdout.strip().splitlines()[-1:] == ["[]"], done.stdout[-2000:]


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
