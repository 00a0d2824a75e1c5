"""``project.launch``: the one launcher of the runners and the benchmarks, on real spawned processes (gloo, CPU)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from project.devices import RankEnv, join_group
from project.launch import RankError, file_rendezvous, spawn_ranks

pytestmark = [pytest.mark.project, pytest.mark.long_file]


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


def _rank_1_fails_late(env: RankEnv, rendezvous: str) -> None:
    """Rank 1 leaves the group, waits, then raises: rank 0's gloo error reaches the parent first."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=rendezvous, rank=env.rank, world_size=env.world_size)
    if env.rank == 1:
        dist.destroy_process_group()
        time.sleep(1.0)
        raise KeyError("w")
    dist.all_reduce(torch.ones(3))


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
    assert all(proc.poll() is not None for proc in ranks.procs)
    assert ranks.procs[0].poll() == -signal.SIGTERM     # the sleeping rank 0 was stopped, not waited for


def _leaves_a_process_running(env: RankEnv, pid_file: str) -> None:
    """Start a process in a session of its own that outlives this rank, and say its pid."""
    import subprocess

    Path(pid_file).write_text(str(subprocess.Popen(["sleep", "600"], start_new_session=True).pid))


def test_what_a_forked_rank_leaves_running_ends_with_its_run(tmp_path, monkeypatch):
    """The fork server session that forked the ranks adopts what they leave behind and ends it as the run ends."""
    import psutil

    from project.rank_start import RANK_START_ENV

    monkeypatch.setenv(RANK_START_ENV, "forkserver")
    spawn_ranks(_leaves_a_process_running, 1, None, (str(tmp_path / "pid"),)).wait(timeout_s=240)
    left = int((tmp_path / "pid").read_text())
    deadline = time.monotonic() + 10
    while psutil.pid_exists(left) and psutil.Process(left).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the process a rank left running still runs"
        time.sleep(0.05)


def test_ranks_start_fresh_where_the_fork_server_cannot_fork_them(tmp_path, monkeypatch, capfd):
    """A preload that leaves the fork server with a second thread ends the server (it must not fork then): the
    ranks start as fresh interpreters, with the same results, and one line says why."""
    from project.rank_start import RANK_START_ENV

    monkeypatch.setenv(RANK_START_ENV, "forkserver")
    values = spawn_ranks(_sum_of_ranks, 2, file_rendezvous(tmp_path, "store"), (10,),
                         preload=("tests.kit.thread_on_import",)).wait(timeout_s=240)
    assert [v["sum"] for v in values] == [21.0, 21.0]
    assert "the ranks start as fresh interpreters: the fork server gave none (the fork server has 2 threads" in \
        capfd.readouterr().err


def _rank_1_is_killed(env: RankEnv) -> None:
    import signal

    if env.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(600)


def test_a_rank_killed_by_a_signal_is_named_with_the_words_the_grader_uses(tmp_path):
    """How a rank that sent no reply ended is worded once (``common.rank_reports.ending``), for the grader and the
    entry points."""
    ranks = spawn_ranks(_rank_1_is_killed, 2, None, name="demo")
    with pytest.raises(RankError) as raised:
        ranks.wait(timeout_s=240)
    assert str(raised.value).splitlines()[0] == "demo rank 1 died from signal SIGKILL (killed; out of memory?)"


def test_the_rank_at_fault_comes_first_though_its_peers_error_arrives_first(tmp_path):
    ranks = spawn_ranks(_rank_1_fails_late, 2, None, (file_rendezvous(tmp_path, "store"),), name="demo")
    with pytest.raises(RankError) as raised:
        ranks.wait(timeout_s=240)
    first, *rest = str(raised.value).splitlines()
    assert first == "demo rank 1 failed: KeyError: 'w'", first     # no student file in its traceback
    assert rest[0].startswith("symptom: demo rank 0 then failed: RuntimeError: "), rest
    assert "Traceback" in rest[1] and "KeyError: 'w'" in rest[-1]


def test_run_cli_prints_a_rank_failure_with_its_explanation_last(capsys):
    from project.cli import run_cli

    def main(argv):
        raise RankError("rank 1 failed: KeyError: 'w' (at x.py:3 (in f))\nsymptom: rank 0 then failed: "
                        "RuntimeError: Connection closed by peer\nTraceback (most recent call last):\nKeyError: 'w'")

    assert run_cli(main, []) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[-2:] == ["error: rank 1 failed: KeyError: 'w' (at x.py:3 (in f))",
                          "symptom: rank 0 then failed: RuntimeError: Connection closed by peer"]


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


def test_run_cli_reports_ctrl_c_in_one_line(capsys):
    from project.cli import run_cli

    def main(argv):
        raise KeyboardInterrupt

    assert run_cli(main, []) == 130
    assert capsys.readouterr().err == "interrupted (Ctrl-C)\n"


def _environment_and_modules(env: RankEnv, names: list[str]) -> dict:
    """What a rank sees at its start: a test variable, torch's threads, which of ``names`` were imported before,
    how many objects no garbage collection will walk (``gc.freeze``), ``tempfile``'s folder."""
    import gc
    import sys
    import tempfile

    return {"var": os.environ.get("KIT_TEST_VARIABLE"), "loaded": [n for n in names if n in sys.modules],
            "threads": torch.get_num_threads(), "frozen": gc.get_freeze_count(), "tempdir": tempfile.gettempdir()}


def test_rank_start_method_is_forkserver_without_a_gpu_and_can_be_forced(monkeypatch):
    from project.cli import ConfigError
    from project.devices import gpu_count
    from project.rank_start import RANK_START_ENV, rank_start_method

    monkeypatch.delenv(RANK_START_ENV, raising=False)
    assert rank_start_method() == ("spawn" if gpu_count() else "forkserver")
    monkeypatch.setenv(RANK_START_ENV, "spawn")
    assert rank_start_method() == "spawn"
    monkeypatch.setenv(RANK_START_ENV, "fork")
    with pytest.raises(ConfigError, match="KIT_RANK_START must be auto, spawn or forkserver, not 'fork'"):
        rank_start_method()


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_ranks_see_the_parents_environment_at_their_start_not_at_the_servers(tmp_path, monkeypatch, method):
    """A fork server started before the parent changed its environment still hands the ranks the current one,
    and torch's thread count of a fresh interpreter (the server itself runs single-threaded); what a rank
    inherited or imported before its work is frozen out of its garbage collections; ``tempfile`` finds the folder
    the parent's ``TMPDIR`` names now."""
    from project.launch import start_rank_server
    from project.rank_start import RankStart
    from project.rank_start import RANK_START_ENV

    monkeypatch.setenv(RANK_START_ENV, method)
    monkeypatch.setenv("KIT_TEST_VARIABLE", "before")
    start_rank_server(2)
    monkeypatch.setenv("KIT_TEST_VARIABLE", "after")
    (tmp_path / "own tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "own tmp"))
    values = spawn_ranks(_environment_and_modules, 2, None, ([],)).wait(timeout_s=240)
    assert [(v["var"], v["tempdir"]) for v in values] == [("after", str(tmp_path / "own tmp"))] * 2
    assert [v["threads"] for v in values] == [RankStart.here().threads] * 2
    assert all(v["frozen"] > 100_000 for v in values), values     # torch's objects: never walked by a collection
    monkeypatch.delenv("KIT_TEST_VARIABLE")
    values = spawn_ranks(_environment_and_modules, 1, None, ([],)).wait(timeout_s=240)
    assert values[0]["var"] is None


def test_same_group_results_from_forked_and_spawned_ranks(tmp_path, monkeypatch):
    from project.rank_start import RANK_START_ENV

    results = {}
    for method in ("forkserver", "spawn"):
        monkeypatch.setenv(RANK_START_ENV, method)
        results[method] = spawn_ranks(_sum_of_ranks, 2, file_rendezvous(tmp_path, method), (10,)).wait(240)
    assert results["forkserver"] == results["spawn"]


def test_a_launching_process_preloads_once_and_exits_without_waiting_for_its_fork_server(tmp_path):
    """Run as a command (as the runners are): the ranks find the preloads imported, and the command's output
    ends when it exits (the fork server, which holds that output open, is stopped with it)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = ("import atexit, json, os\n"
              "from project.launch import spawn_ranks\n"
              "from project.rank_start import fork_servers\n"
              "from tests.test_project_launch import _environment_and_modules\n"
              "atexit.register(lambda: print(json.dumps({'server_at_exit': os.path.exists(f'/proc/{server}')})))\n"
              "names = ['transformers.models.gpt2.modeling_gpt2', 'deepspeed']\n"
              "values = spawn_ranks(_environment_and_modules, 2, None, (names,), preload=(names[0],)).wait(240)\n"
              "[server] = [process.pid for process in fork_servers()]\n"
              "print(json.dumps({'loaded': [v['loaded'] for v in values],\n"
              "                  'server_running': os.path.exists(f'/proc/{server}')}))\n")
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "KIT_RANK_START": "forkserver"}
    done = subprocess.run([sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report, at_exit = (json.loads(line) for line in done.stdout.splitlines()[-2:])
    assert report == {"loaded": [["transformers.models.gpt2.modeling_gpt2"]] * 2, "server_running": True}
    assert at_exit == {"server_at_exit": False}, "the fork server was left to shut down on its own"


def _disagree(env: RankEnv, rendezvous: str, how: str) -> None:
    """Ranks that disagree on their collective calls: ``barrier`` (rank 0 adds a barrier, the others wait in an
    all-reduce) or ``order`` (rank 1 all-reduces two tensors of different sizes in the other order)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=rendezvous, rank=env.rank, world_size=env.world_size)
    tensors = [torch.ones(64, 8), torch.ones(8)]
    if how == "barrier" and env.rank == 0:
        dist.barrier()
    for tensor in tensors[::-1] if how == "order" and env.rank == 1 else tensors:
        dist.all_reduce(tensor)


def _slow_rank_0(env: RankEnv, rendezvous: str) -> int:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=rendezvous, rank=env.rank, world_size=env.world_size)
    if env.rank == 0:
        end = time.monotonic() + 3.5
        while time.monotonic() < end:
            sum(range(10_000))
    dist.barrier()
    return env.rank


@pytest.mark.parametrize("how", ["barrier", "order"])
def test_ranks_that_disagree_end_naming_the_call_where_they_part(tmp_path, capfd, how):
    from project.launch import launch

    with pytest.raises(RankError) as raised:
        launch(_disagree, 2, tmp_path, (file_rendezvous(tmp_path, "store"), how), still_limit_s=4)
    first = str(raised.value).splitlines()[0]
    assert first.startswith("ranks disagree on their collective call number "), first
    if how == "barrier":
        assert "rank 0 calls barrier" in first and "rank 1 calls all_reduce(float32 [64, 8])" in first, first
        assert "waiting: every one of the ranks still running waited" in str(raised.value)
    else:
        assert "rank 0 calls all_reduce(float32 [64, 8])" in first and "rank 1 calls all_reduce(float32 [8])" in first
    assert "test_project_launch:" in first, first       # where each call was made


def test_a_rank_that_computes_while_the_other_waits_is_not_ended(tmp_path):
    from project.launch import launch

    launch(_slow_rank_0, 2, tmp_path, (file_rendezvous(tmp_path, "store"),), still_limit_s=2)


class _Sleeper:
    """A stand-in rank for ``common.rank_launch.supervise``: a ``sleep`` process that says ``news``."""

    def __init__(self, rank: int, news: tuple | None = None):
        import subprocess

        self.proc = subprocess.Popen(["sleep", "60"])
        self.rank, self.pid, self.news = rank, self.proc.pid, news

    def poll(self):
        return self.proc.poll()

    def said(self):
        return self.news

    def wakers(self):
        return []

    def signal_group(self, sig):
        self.proc.send_signal(sig)


def test_the_supervision_core_ends_a_watch_at_each_of_its_limits(tmp_path):
    """``common.rank_launch.supervise``, which both launchers watch their ranks with: progress lines on the
    ranks' still time, then the still limit; a time limit; a failure's grace for its peers; a finished rank that
    lingers is killed. It kills nothing else."""
    import signal

    from common.rank_launch import OWN_GRACE_S, Limits, peer_grace, supervise

    ranks = [_Sleeper(0), _Sleeper(1)]
    try:
        seen = []
        out = supervise(ranks, Limits(still_limit_s=2.5, stacks={r.rank: tmp_path / f"{r.rank}.stack" for r in ranks},
                                      progress=lambda watch, waiting, s: seen.append((waiting, s)), progress_s=1))
        assert out.stuck and out.still_s >= 2.5 and out.waiting == [0, 1] and not out.timed_out, out
        # a line each second of still time before the limit: two on an idle machine, one where a wake-up comes late
        assert 1 <= len(seen) <= 2 and all(waiting == [0, 1] and s >= 1 for waiting, s in seen), seen
        assert out.watch.places([0]) == {0: "no stack dump"}       # ``sleep`` catches no dump signal: not asked
        out = supervise(ranks, Limits(limit_s=0.3, poll_s=0.05))
        assert out.timed_out and out.waiting == [0, 1] and [end.code for end in out.ends] == [None, None], out
        ranks[0].news = ("error", "ValueError: rank 0 gives up")
        began = time.monotonic()
        out = supervise(ranks, Limits(grace=peer_grace, poll_s=0.05))
        assert out.failures == {0: "ValueError: rank 0 gives up"} and out.waiting == [1], out
        assert not out.timed_out and not out.stuck and time.monotonic() - began >= OWN_GRACE_S, out   # the grace
        ranks[0].news = ranks[1].news = ("ok", 7)
        out = supervise(ranks, Limits(linger_s=0.2, poll_s=0.05))
        assert [(end.code, end.finished, end.said) for end in out.ends] == [(-signal.SIGKILL, True, 7)] * 2, out
    finally:
        for r in ranks:
            r.proc.kill()
            r.proc.wait()


@pytest.mark.parametrize(("usable", "ranks", "threads"), [(0.5, 1, 1), (2.0, 2, 1), (8.0, 1, 4), (8.0, 4, 2),
                                                          (7.5, 2, 3)])
def test_cpu_threads_per_rank_count_the_cpus_a_container_may_use(monkeypatch, usable, ranks, threads):
    """The runners' thread policy divides the CPUs this process may use (affinity and cgroup quota,
    ``common.cpus.available_cpus``), not the host's cores: half a vCPU gives one thread, not cores // 2."""
    import project.devices

    monkeypatch.setattr(project.devices, "available_cpus", lambda: usable)
    assert project.devices.cpu_threads_per_rank(ranks) == threads
