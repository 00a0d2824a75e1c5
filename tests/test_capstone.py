"""End-to-end runs of ``project/run_capstone.py`` (BucketedDDP + ShardedOptimizer + sharded checkpoints).

Small configurations of the real script: real rank processes over gloo,
the tiny GPT-2 on the embedded corpus, a checkpoint, new processes that
resume from it. The runs start in this process (``run_capstone.cli``, the
script's exit codes and output); one test runs the script as a command.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from project.run_capstone import cli
from common import ROOT

pytestmark = pytest.mark.project

SMALL = ["--world_size", "2", "--steps", "6", "--save_step", "3", "--batch_size", "8", "--max_len", "32"]
RUN = "ws2-steps6-save3-batch8-len32"   # the run folder of SMALL (project.options.run_name)


def _run(args: list[str], capsys) -> tuple[int, str, str]:
    """``(exit code, stdout, stderr)`` of the capstone run with ``args``, started in this process."""
    code = cli(args)
    out, err = capsys.readouterr()
    return code, out, err


def _loss_steps(out: str) -> list[int]:
    """The step column of the printed loss tables (rows ``  <step>  <loss>``)."""
    rows = [line.split() for line in out.splitlines()]
    return [int(r[0]) for r in rows if len(r) == 2 and r[0].isdigit() and r[1].replace(".", "", 1).isdigit()]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("capstone")


def test_capstone_verifies_the_resume_and_reports_memory(work, capsys):
    code, out, err = _run([*SMALL, "--workdir", str(work)], capsys)
    assert code == 0, err[-3000:]
    assert "RESUME VERIFIED" in out
    assert _loss_steps(out) == [1, 2, 3, 4, 5, 6, 4, 5, 6], out              # straight run, then resumed 4..6
    memory = [line.split() for line in out.splitlines() if len(line.split()) == 5 and line.split()[0].isdigit()]
    assert len(memory) == 2 and all(r[3] == r[4] for r in memory), out       # optimizer state == 12P/N
    manifest = work / "out" / "capstone" / RUN / "checkpoint_step3" / "manifest.json"
    assert manifest.is_file() and '"world_size": 2' in out


def test_capstone_resume_flag_continues_a_run(work, capsys):
    checkpoint = work / "out" / "capstone" / RUN / "checkpoint_step3"
    if not checkpoint.is_dir():
        _run([*SMALL, "--workdir", str(work)], capsys)
    code, out, err = _run([*SMALL, "--workdir", str(work), "--resume", str(checkpoint)], capsys)
    assert code == 0, err[-3000:]
    assert _loss_steps(out) == [4, 5, 6], out
    assert out.splitlines()[-1].startswith("resumed at step 4: steps 4-6 match the uninterrupted run"), out


def test_capstone_fails_with_a_message_when_the_loss_does_not_fall(work, capsys):
    code, out, err = _run(["--world_size", "2", "--steps", "4", "--save_step", "2", "--batch_size", "4",
                           "--max_len", "32", "--lr", "1e-9", "--workdir", str(work), "--out_dir", str(work / "flat")],
                          capsys)
    assert code == 1, (out[-2000:], err[-2000:])
    assert "FAILED: loss not decreasing" in err


def test_the_script_exits_2_with_one_line_for_a_bad_argument(tmp_path):
    """``python project/run_capstone.py`` itself: the exit code and the one-line message reach the shell."""
    done = subprocess.run([sys.executable, "project/run_capstone.py", "--resume", str(tmp_path / "missing"),
                           "--workdir", str(tmp_path)], cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.startswith("error:") and "no manifest.json" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize("args, message", [
    (["--world_size", "3", "--batch_size", "8"], "multiple of --world_size"),
    (["--steps", "5", "--save_step", "5"], "save_step"),
    (["--resume", "/nonexistent/folder"], "no manifest.json"),
])
def test_capstone_bad_arguments_exit_2_with_one_line(args, message, capsys):
    from project.run_capstone import cli

    assert cli(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and message in err and len(err.splitlines()) == 1


def test_a_checkpoint_of_another_world_size_is_refused_in_one_line_before_any_rank_starts(tmp_path, capsys):
    """A checkpoint that 4 ranks wrote, resumed with 2: ``error: cannot resume: ...`` and exit 2, not the ranks'
    load_sharded tracebacks."""
    from data_parallel.checkpoint import file_digest

    folder = tmp_path / "step_00000004"
    folder.mkdir()
    for name in ["model.pt", *(f"shard_{r:05d}.pt" for r in range(4))]:
        (folder / name).write_bytes(name.encode())
    files = {p.name: file_digest(p) for p in sorted(folder.iterdir())}
    (folder / "manifest.json").write_text(json.dumps({"format": 1, "step": 4, "world_size": 4, "files": files}))
    code, out, err = _run([*SMALL, "--workdir", str(tmp_path), "--resume", str(folder)], capsys)
    assert code == 2, (out[-2000:], err[-2000:])
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err[-3000:]
    assert err.startswith("error: cannot resume: checkpoint step_00000004 was written by world size 4, this run "
                          "has 2"), err
