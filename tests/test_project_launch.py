"""``project.launch``: the one launcher of the runners and the benchmarks, on real spawned processes (gloo, CPU)."""
from __future__ import annotations

import os
import time

import pytest
import torch

from project.launch import RankEnv, RankError, file_rendezvous, join_group, spawn_ranks

pytestmark = pytest.mark.project


def _sum_of_ranks(env: RankEnv, offset: int) -> dict:
    """Join a gloo group through the launcher's join_group and all-reduce this rank's number."""
    import torch.distributed as dist

    backend, device = join_group(env, "gloo", student_setup=False)
    t = torch.tensor([float(env.rank + offset)])
    dist.all_reduce(t)
    dist.destroy_process_group()
    return {"rank": env.rank, "sum": t.item(), "backend": backend, "device": str(device),
            "threads": torch.get_num_threads(), "ds_accelerator": os.environ.get("DS_ACCELERATOR")}


def _rank_1_fails(env: RankEnv) -> None:
    if env.rank == 1:
        raise ValueError("rank 1 gives up")
    time.sleep(600)   # rank 0 would wait for its peer for ever: the parent must not


def _serve(env: RankEnv) -> str:
    """Answer every message with its double until None, like the benchmark's workers."""
    env.conn.send(("ok", "ready"))
    while (message := env.conn.recv()) is not None:
        env.conn.send(("ok", 2 * message))
    return "bye"


def test_spawned_ranks_join_one_group_and_return_their_values(tmp_path):
    from project.devices import cpu_threads_per_rank

    values = spawn_ranks(_sum_of_ranks, 2, file_rendezvous(tmp_path, "store"), (10,)).wait(timeout_s=240)
    assert [v["rank"] for v in values] == [0, 1]
    assert all(v["sum"] == 21.0 and v["backend"] == "gloo" and v["device"] == "cpu" for v in values)
    assert all(v["threads"] == cpu_threads_per_rank(2) and v["ds_accelerator"] == "cpu" for v in values)


def test_a_failing_rank_is_reported_at_once_with_its_traceback(tmp_path):
    import signal

    ranks = spawn_ranks(_rank_1_fails, 2, None, name="demo")
    with pytest.raises(RankError, match="demo rank 1") as raised:
        ranks.wait(timeout_s=240)
    assert "ValueError: rank 1 gives up" in str(raised.value) and "Traceback" in str(raised.value)
    assert not any(proc.is_alive() for proc in ranks.procs)
    assert ranks.procs[0].exitcode == -signal.SIGTERM     # the sleeping rank 0 was stopped, not waited for


def test_a_serving_rank_answers_commands_then_returns(tmp_path):
    ranks = spawn_ranks(_serve, 1, None, name="server")
    try:
        assert ranks.replies("start", timeout_s=240) == ["ready"]
        ranks.send(21)
        assert ranks.replies("double", timeout_s=60) == [42]
        ranks.send(None)
        assert ranks.replies("stop", timeout_s=60) == ["bye"]   # the final reply: the target's return value
    finally:
        ranks.close()
