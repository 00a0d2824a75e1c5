"""The rank launcher: hangs, crashes and exceptions become reports, never a hung test run.

Every test runs twice: ranks forked warm by the run's fork servers (how grading runs them) and cold
``python -m grading.engine.worker`` processes (``GRADING_FORKSERVER=0``); both must behave the same.
"""
import os
import time

import pytest
import torch

from grading.engine.forkserver import ForkServers
from grading.engine.launch import launch
from tests.kit.variants import KIT_ROOT

pytestmark = pytest.mark.kit
PROBES = "tests.kit.launcher_probes"


@pytest.fixture(scope="module")
def servers():
    with ForkServers(KIT_ROOT) as warm:
        yield warm


@pytest.fixture(params=["warm", "cold"])
def run(request, servers):
    def start(tmp_path, probe, world_size=2, **kw):
        return launch(f"{PROBES}:{probe}", world_size, cwd=KIT_ROOT, out_dir=tmp_path / "run",
                      servers=servers if request.param == "warm" else None, **kw)
    return start


def test_clean_run_records_results(tmp_path, run):
    result = run(tmp_path, "all_reduce_rank", world_size=3)
    assert result.ok, result.failure()
    for rank in range(3):
        assert torch.load(tmp_path / "run" / f"rank{rank}" / "sum.pt", weights_only=True) == 6.0


def test_hung_rank_is_killed_and_its_stack_reported(tmp_path, run):
    result = run(tmp_path, "rank1_hangs_in_collective", timeout_s=8, pg_timeout_s=60)
    assert result.timed_out and not result.ok
    message = result.failure()
    assert "timed out" in message and ("rank(s) 0, 1" in message or "rank(s) 1" in message), message
    assert "launcher_probes.py" in message, message      # the stuck frame is named


def test_crashed_and_failing_ranks_are_all_reported(tmp_path, run):
    result = run(tmp_path, "rank0_raises_rank1_segfaults", timeout_s=30)
    message = result.failure()
    assert "rank 0 failed: RuntimeError: boom on rank 0" in message
    assert "rank 1 died from signal SIGSEGV" in message


def test_exit_without_finishing_is_reported(tmp_path, run):
    result = run(tmp_path, "exits_early", world_size=1, timeout_s=30, init_group=False)
    assert "rank 0 exited with code 0 before finishing" in result.failure()


def test_spawned_grandchild_is_killed(tmp_path, run):
    result = run(tmp_path, "spawns_sleeper", world_size=1, timeout_s=30, init_group=False)
    assert result.ok, result.failure()
    pid = int((tmp_path / "run" / "rank0" / "child_pid.txt").read_text())
    time.sleep(0.2)
    try:
        os.kill(pid, 0)
        alive = open(f"/proc/{pid}/stat").read().split()[2] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        alive = False
    assert not alive, "a process spawned by a rank survived the run"


def _alive(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_bare_forked_setsid_daemon_is_killed(tmp_path, run):
    """No exec, so the run marker is not in its /proc environ: the fork server (its subreaper) still finds it."""
    result = run(tmp_path, "forks_a_setsid_daemon", world_size=1, timeout_s=30, init_group=False)
    assert result.ok, result.failure()
    daemon = torch.load(tmp_path / "run" / "rank0" / "daemon.pt", weights_only=True)
    time.sleep(0.2)
    assert not _alive(daemon), "a daemon forked by a rank survived the run"


def test_every_rank_starts_as_fresh_as_a_new_interpreter(tmp_path, run):
    """Hash seed, random state and torch's default seed differ between ranks and between runs; the marker is
    the run's own; no student module is loaded before the probe."""
    first = run(tmp_path / "a", "reports_fresh_state", world_size=2, timeout_s=60, init_group=False)
    second = run(tmp_path / "b", "reports_fresh_state", world_size=2, timeout_s=60, init_group=False)
    assert first.ok and second.ok, first.failure() + second.failure()
    states = [torch.load(tmp_path / name / "run" / f"rank{r}" / "state.pt", weights_only=True)
              for name in ("a", "b") for r in range(2)]
    assert len({s["random"] for s in states}) == 4 and len({s["torch_seed"] for s in states}) == 4
    assert states[0]["hash"] != states[1]["hash"] and states[2]["hash"] != states[3]["hash"]
    assert states[0]["marker"] == states[1]["marker"] != states[2]["marker"] and states[0]["marker"]
    assert all(s["modules"] == [] for s in states)
