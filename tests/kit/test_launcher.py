"""The rank launcher: hangs, crashes and exceptions become reports, never a hung test run."""
import time

import pytest

from grading.engine.launch import launch
from tests.kit.variants import KIT_ROOT

pytestmark = pytest.mark.kit
PROBES = "tests.kit.launcher_probes"


def run(tmp_path, probe, world_size=2, **kw):
    return launch(f"{PROBES}:{probe}", world_size, cwd=KIT_ROOT, out_dir=tmp_path / "run", **kw)


def test_clean_run_records_results(tmp_path):
    result = run(tmp_path, "all_reduce_rank", world_size=3)
    assert result.ok, result.failure()
    import torch
    for rank in range(3):
        assert torch.load(tmp_path / "run" / f"rank{rank}" / "sum.pt", weights_only=True) == 6.0


def test_hung_rank_is_killed_and_its_stack_reported(tmp_path):
    result = run(tmp_path, "rank1_hangs_in_collective", timeout_s=8, pg_timeout_s=60)
    assert result.timed_out and not result.ok
    message = result.failure()
    assert "timed out" in message and ("rank(s) 0, 1" in message or "rank(s) 1" in message), message
    assert "launcher_probes.py" in message, message      # the stuck frame is named


def test_crashed_and_failing_ranks_are_all_reported(tmp_path):
    result = run(tmp_path, "rank0_raises_rank1_segfaults", timeout_s=30)
    message = result.failure()
    assert "rank 0 failed: RuntimeError: boom on rank 0" in message
    assert "rank 1 died from signal SIGSEGV" in message


def test_exit_without_finishing_is_reported(tmp_path):
    result = run(tmp_path, "exits_early", world_size=1, timeout_s=30, init_group=False)
    assert "rank 0 exited with code 0 before finishing" in result.failure()


def test_spawned_grandchild_is_killed(tmp_path):
    result = run(tmp_path, "spawns_sleeper", world_size=1, timeout_s=30, init_group=False)
    assert result.ok, result.failure()
    pid = int((tmp_path / "run" / "rank0" / "child_pid.txt").read_text())
    time.sleep(0.2)
    import os
    try:
        os.kill(pid, 0)
        alive = open(f"/proc/{pid}/stat").read().split()[2] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        alive = False
    assert not alive, "a process spawned by a rank survived the run"
