"""The rank launcher: hangs, crashes and exceptions become reports, never a hung test run.

Tests of what the two ways a rank starts do differently (``run``) run twice: ranks forked warm by the run's fork
servers (how grading runs them) and cold interpreters running the same worker (``GRADING_FORKSERVER=0``);
both must behave the same. The others (``warm_run``) run warm only.
"""
import json
import os
import select
import shutil
import time

import psutil
import pytest
import torch

from common import startup
from grading.engine.case_run import CaseRun
from grading.engine.run_servers import POOL_ENV, SERVERS_ENV, ForkServers, server_count
from grading.engine.launch import launch
from grading.commands.profile import case_profile, table
from grading.problems import all_cases, folders
from tests.kit.launcher_probes import alive_since
from common import ROOT

pytestmark = [pytest.mark.kit, pytest.mark.long_file]
PROBES = "tests.kit.launcher_probes"


@pytest.fixture(scope="module")
def servers():
    """Two fork servers of this module's own, the default of a grade (started here also where the suite's runs
    are cold: ``GRADING_FORKSERVER=0``)."""
    with ForkServers(ROOT, env={**os.environ, SERVERS_ENV: "2"}) as warm:
        assert warm.servers == 2
        yield warm


@pytest.fixture(params=["warm", "cold"])
def run(request, servers):
    """Ranks forked warm, then the same test with cold ranks (fresh interpreters): for what the two starts do
    differently (process groups, lingering interpreters, environment, stack dumps, a fresh state)."""
    def start(tmp_path, probe, world_size=2, **kw):
        return launch(f"{PROBES}:{probe}", world_size, cwd=ROOT, out_dir=tmp_path / "run",
                      servers=servers if request.param == "warm" else None, **kw)
    return start


@pytest.fixture
def warm_run(servers):
    """Ranks forked warm only: for what does not depend on how a rank starts (recording, reports, phases)."""
    def start(tmp_path, probe, world_size=2, **kw):
        return launch(f"{PROBES}:{probe}", world_size, cwd=ROOT, out_dir=tmp_path / "run", servers=servers, **kw)
    return start


def test_clean_run_records_results(tmp_path, warm_run):
    result = warm_run(tmp_path, "all_reduce_rank", world_size=3)
    assert result.ok, result.failure()
    for rank in range(3):
        assert torch.load(tmp_path / "run" / f"rank{rank}" / "sum.pt", weights_only=True) == 6.0


def test_one_fork_server_keeps_hash_orders_apart_only_where_ranks_must_agree(tmp_path):
    """With one server kept, the odd ranks of a case whose collectives are checked come from a second server of
    another hash seed (as torchrun's ranks differ); a case without collectives of its own keeps it while it
    imports nothing new, and stops it before the one server imports more; a bad server count is refused."""
    def hashes(name: str, checks: bool, preload: tuple[str, ...] = ()) -> list[int]:
        result = launch(f"{PROBES}:reports_fresh_state", 3, cwd=ROOT, out_dir=tmp_path / name, servers=one,
                        init_group=False, timeout_s=60, collective_checks=checks, preload=preload)
        assert result.ok, result.failure()
        return [torch.load(tmp_path / name / f"rank{r}" / "state.pt", weights_only=True)["hash"] for r in range(3)]
    with ForkServers(ROOT, env={**os.environ, SERVERS_ENV: "1"}) as one:
        checked = hashes("checked", checks=True)
        assert checked[0] == checked[2] != checked[1] and one.running == 2
        together = hashes("together", checks=False)
        assert len(set(together)) == 1 and one.running == 2
        assert len(set(hashes("more_libraries", checks=False, preload=("colorsys",)))) == 1 and one.running == 1
        result = launch(f"{PROBES}:all_reduce_rank", 3, cwd=ROOT, out_dir=tmp_path / "run", servers=one)
        assert result.ok, result.failure()
    for rank in range(3):
        assert torch.load(tmp_path / "run" / f"rank{rank}" / "sum.pt", weights_only=True) == 6.0
    for bad in ("0", "3", "two"):
        with pytest.raises(ValueError, match="GRADING_FORKSERVERS must be 1 or 2"):
            server_count({SERVERS_ENV: bad})


def test_grading_runs_share_a_pool_until_its_server_has_gone(tmp_path):
    """``batch`` shares its fork servers with its grades (``pool_env``): another run's ranks fork from them, in
    sessions of its own (a module the first run had them preload is already imported in the second's ranks); a pool
    whose server has ended is left for servers of the run's own, still warm."""
    def preloaded(servers, name, preload=()):
        result = launch(f"{PROBES}:reports_preloaded", 1, cwd=ROOT, out_dir=tmp_path / name, timeout_s=60,
                        init_group=False, args={"names": ["colorsys"]}, servers=servers, preload=preload)
        assert result.ok, result.failure()
        assert json.loads((tmp_path / name / "launch.json").read_text())["started_cold"] == []
        return torch.load(tmp_path / name / "rank0" / "preloaded.pt", weights_only=True)["colorsys"]

    def session(servers):
        session = servers.session(0)
        session.ready()
        return psutil.Process(session.pid)

    with ForkServers(ROOT) as owner:
        pool = owner.pool_env()[POOL_ENV]
        assert preloaded(owner, "owner", preload=("colorsys",))
        with ForkServers(ROOT, pool=pool) as guest:
            assert preloaded(guest, "guest")
            assert session(guest).pid != session(owner).pid and session(guest).ppid() == session(owner).ppid()
        server = session(owner).parent()
        server.kill()
        server.wait(timeout=30)                # gone before the next run looks for it
        with ForkServers(ROOT, pool=pool) as late:
            assert not preloaded(late, "late") and late.pool == []


def test_hung_rank_is_killed_and_its_stack_reported(tmp_path, run):
    result = run(tmp_path, "rank1_hangs_in_collective", timeout_s=5, pg_timeout_s=60)
    assert result.timed_out and not result.ok
    message = result.failure()
    assert "timed out" in message and ("rank(s) 0, 1" in message or "rank(s) 1" in message), message
    assert "launcher_probes.py" in message, message      # the stuck frame is named


def test_a_rank_that_the_stack_dump_request_ends_is_still_running_at_the_limit(tmp_path, servers):
    result = launch(f"{PROBES}:hangs_deaf_to_stack_dumps", 1, cwd=ROOT, out_dir=tmp_path / "run", timeout_s=3,
                    init_group=False, servers=servers)
    assert result.timed_out and "with rank(s) 0 still running" in result.failure(), result.failure()


def test_crashed_and_failing_ranks_are_all_reported(tmp_path, warm_run):
    result = warm_run(tmp_path, "rank0_raises_rank1_segfaults", timeout_s=30)
    message = result.failure()
    assert "rank 0 failed: RuntimeError: boom on rank 0" in message
    assert "rank 1 died from signal SIGSEGV" in message


def test_exit_without_finishing_is_reported(tmp_path, warm_run):
    result = warm_run(tmp_path, "exits_early", world_size=1, timeout_s=30, init_group=False)
    assert "rank 0 exited with code 0 before finishing" in result.failure()


def test_an_exit_read_in_one_go_with_the_spawn_reply_still_ends_the_run(tmp_path, servers, monkeypatch):
    """A rank that ends at once, and a launcher that load holds back before each read: the server's ``spawned``
    reply and the rank's exit report arrive in one read, and the run ends there, not at its limit."""
    real_select = select.select

    def held_back(readers, writers, errors, timeout):
        if timeout:                           # a wait for a reply (a poll passes 0)
            time.sleep(1.0)
        return real_select(readers, writers, errors, timeout)
    monkeypatch.setattr(select, "select", held_back)
    result = launch(f"{PROBES}:exits_early", 1, cwd=ROOT, out_dir=tmp_path / "run", timeout_s=20,
                    init_group=False, servers=servers)
    assert not result.timed_out, result.failure()
    assert "rank 0 exited with code 0 before finishing" in result.failure()


def test_a_finished_rank_that_a_stray_thread_keeps_alive_ends_the_run_at_once(tmp_path, run):
    """A probe that leaves a non-daemon thread sleeping for ten minutes: a forked rank ends with its worker, a
    cold one (whose interpreter would wait for the thread at its exit) is stopped once it has finished; either
    way the run ends long before its limit."""
    result = run(tmp_path, "leaves_a_thread", world_size=2, timeout_s=120, init_group=False)
    assert result.ok and not result.timed_out, result.failure()
    assert all(r.finished for r in result.ranks)


def test_a_case_goes_on_in_new_processes_that_record_into_the_same_results(tmp_path, warm_run):
    """``next_phases``: each rank of the second phase is a new process, finds what its predecessor left in the handoff
    folder, and records into the same signed results; a first phase that does not finish ends the case there."""
    result = warm_run(tmp_path / "a", "hands_a_file_over", world_size=2, timeout_s=60, init_group=False,
                 next_phases=(f"{PROBES}:takes_the_file",))
    assert result.ok, result.failure()
    run_view = CaseRun(2, result)
    for rank in range(2):
        first, second = run_view.part("first", rank), run_view.part("second", rank)
        assert second["left"] == first != second["pid"]
    stopped = warm_run(tmp_path / "b", "exits_early", world_size=1, timeout_s=60, init_group=False,
                  next_phases=(f"{PROBES}:takes_the_file",))
    assert "rank 0 exited with code 0 before finishing" in stopped.failure()
    assert not list((tmp_path / "b" / "run" / "rank0").glob("second.*"))         # no second phase ran


def test_each_phase_runs_with_its_own_collective_checks(tmp_path, warm_run):
    """A later phase may run without torch's per-call checks (``collective_checks``, one flag per phase); a count
    of flags other than the phases' is refused before anything starts."""
    import torch.distributed as dist
    result = warm_run(tmp_path / "a", "records_debug_level", timeout_s=60, collective_checks=(True, False),
                      next_phases=(f"{PROBES}:records_debug_level",))
    assert result.ok, result.failure()
    view = CaseRun(2, result)
    assert [(view.part("level1", r), view.part("level2", r)) for r in range(2)] == \
        [(str(dist.DebugLevel.DETAIL), str(dist.DebugLevel.OFF))] * 2
    with pytest.raises(ValueError, match="2 flags for 1 phases"):
        warm_run(tmp_path / "b", "all_reduce_rank", collective_checks=(True, False))
    assert not (tmp_path / "b" / "run").exists()


def test_a_hidden_spawn_leaves_out_the_public_only_phases():
    """A ``Phase(public_only=True)`` records public parts only: a spawn of the hidden split alone does not start
    its ranks (4.3's resume, 4.1's unchecked ManyScalarsNet phase); the public spawn does."""
    cases = {case.name: case for case in all_cases(("4",))}
    assert [len(cases[name].phases) for name in ("p4_checkpoint", "p4_checkpoint_hidden")] == [2, 1]
    assert cases["p4_ddp"].phase_checks == (True, False) and cases["p4_ddp_hidden"].phase_checks == (True,)


def test_spawned_grandchild_is_killed(tmp_path, warm_run):
    """Warm only: a daemon that leaves the rank's session, the harder case, is killed both ways (next test)."""
    result = warm_run(tmp_path, "spawns_sleeper", world_size=1, timeout_s=30, init_group=False)
    assert result.ok, result.failure()
    started = (tmp_path / "run" / "rank0" / "child_pid.txt").read_text()
    time.sleep(0.2)
    assert not alive_since(started), "a process spawned by a rank survived the run"


def test_a_bare_forked_setsid_daemon_is_killed(tmp_path, run):
    """No exec, so the run marker is not in its /proc environ: the fork server (its subreaper) still finds it."""
    result = run(tmp_path, "forks_a_setsid_daemon", world_size=1, timeout_s=30, init_group=False)
    assert result.ok, result.failure()
    daemon = torch.load(tmp_path / "run" / "rank0" / "daemon.pt", weights_only=True)
    time.sleep(0.2)
    assert not alive_since(daemon), "a daemon forked by a rank survived the run"


def test_ranks_get_the_launchers_environment_as_it_is_at_their_start(tmp_path, run, servers, monkeypatch):
    """Warm or cold, a rank sees the launcher's environment when it starts (fork servers started earlier
    included), of it only what ``isolation.rank_environment`` keeps (no course secret), and nothing of a server's
    own, nor what the server read from its own (``tempfile``'s folder: a rank's is its own folder), nor a pool of
    servers that the launcher was named (``batch``'s, shared by its grades, not by their ranks)."""
    servers.warm_up(2)
    monkeypatch.setenv("TORCH_LAUNCHER_TEST_VARIABLE", "set after the servers started")
    monkeypatch.setenv("GRADING_COURSE_SECRET", "never in a rank")
    monkeypatch.setenv(POOL_ENV, servers.pool_env()[POOL_ENV])
    (tmp_path / "own tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "own tmp"))
    result = run(tmp_path, "reports_fresh_state", world_size=2, timeout_s=60, init_group=False)
    assert result.ok, result.failure()
    states = [torch.load(tmp_path / "run" / f"rank{r}" / "state.pt", weights_only=True) for r in range(2)]
    assert [(s["variable"], s["secret"], s["server_kit"], s["pool"], s["tempdir"]) for s in states] == \
        [("set after the servers started", None, None, None, str(tmp_path / "run" / f"rank{r}" / "home"))
         for r in range(2)]


def test_every_rank_starts_as_fresh_as_a_new_interpreter(tmp_path, run):
    """Hash seed, random state and torch's default seed differ between ranks and between runs; the marker is
    the run's own; no student module is loaded before the probe; the garbage collector runs as in a fresh
    interpreter (not as in the fork server, ``common.startup.collect_less``)."""
    first = run(tmp_path / "a", "reports_fresh_state", world_size=2, timeout_s=60, init_group=False)
    second = run(tmp_path / "b", "reports_fresh_state", world_size=2, timeout_s=60, init_group=False)
    assert first.ok and second.ok, first.failure() + second.failure()
    states = [torch.load(tmp_path / name / "run" / f"rank{r}" / "state.pt", weights_only=True)
              for name in ("a", "b") for r in range(2)]
    assert len({s["random"] for s in states}) == 4 and len({s["torch_seed"] for s in states}) == 4
    assert states[0]["hash"] != states[1]["hash"] and states[2]["hash"] != states[3]["hash"]
    assert states[0]["marker"] == states[1]["marker"] != states[2]["marker"] and states[0]["marker"]
    assert all(s["modules"] == [] for s in states)
    assert all(tuple(s["gc"]) == startup.PYTHON_GC_THRESHOLDS != startup.FEWER_COLLECTIONS for s in states), states


def test_preloads_are_imported_by_the_fork_servers_before_the_ranks_start(tmp_path, warm_run):
    """Warm ranks find a case's preloads already imported (a missing module is skipped)."""
    names = ["colorsys", "no_such_module_for_the_grader"]
    result = warm_run(tmp_path, "reports_preloaded", world_size=2, timeout_s=60, init_group=False,
                 args={"names": names}, preload=tuple(names))
    assert result.ok, result.failure()
    for rank in range(2):
        seen = torch.load(tmp_path / "run" / f"rank{rank}" / "preloaded.pt", weights_only=True)
        assert seen == {"colorsys": True, "no_such_module_for_the_grader": False}


def test_a_preload_that_starts_a_thread_stops_preloading_for_the_run(tmp_path):
    """A forked copy of a threaded process may deadlock: that server is replaced and the run preloads no more."""
    with ForkServers(ROOT) as servers:
        for attempt in ("first", "second"):
            result = launch(f"{PROBES}:reports_preloaded", 2, cwd=ROOT, out_dir=tmp_path / attempt,
                            timeout_s=60, init_group=False, args={"names": ["tests.kit.thread_on_import"]},
                            servers=servers, preload=("tests.kit.thread_on_import",))
            assert result.ok, result.failure()
            assert json.loads((tmp_path / attempt / "launch.json").read_text())["started_cold"] == []
            for rank in range(2):
                assert torch.load(tmp_path / attempt / f"rank{rank}" / "preloaded.pt", weights_only=True) == {
                    "tests.kit.thread_on_import": False}
        assert "2 threads after preloading" in servers.refused and not servers.preloads_allowed


def test_a_fork_server_that_cannot_start_leaves_its_ranks_cold(tmp_path):
    """Grading never depends on the fork servers: a server that dies at start-up means cold ranks, same result."""
    broken = {**os.environ, "PYTHONHOME": str(tmp_path / "none")}
    with ForkServers(ROOT, env=broken) as servers:
        result = launch(f"{PROBES}:all_reduce_rank", 2, cwd=ROOT, out_dir=tmp_path / "run", timeout_s=60,
                        servers=servers)
    assert result.ok, result.failure()
    started_cold = json.loads((tmp_path / "run" / "launch.json").read_text())["started_cold"]
    assert [reason.split(":")[0] for reason in started_cold] == ["rank 0", "rank 1"], started_cold
    assert torch.load(tmp_path / "run" / "rank1" / "sum.pt", weights_only=True) == 3.0


def test_the_kits_own_preloads_keep_the_fork_servers_forking(tmp_path):
    """Every module a case of the kit or a runner's ranks preload (``common.startup``) imports in a fork server
    without starting a thread."""
    names = sorted({name for case in all_cases(tuple(folders())) for name in case.preload})
    assert names, "no case preloads anything"
    lists = [value for value in vars(startup).values() if isinstance(value, tuple) and value and
             all(isinstance(name, str) for name in value)]       # the module lists (not the collector's numbers)
    names = sorted({*names, *(name for value in lists for name in value)})
    with ForkServers(ROOT) as servers:
        result = launch(f"{PROBES}:reports_preloaded", 1, cwd=ROOT, out_dir=tmp_path / "run", timeout_s=120,
                        init_group=False, args={"names": names}, servers=servers, preload=tuple(names))
    assert result.ok, result.failure()
    assert json.loads((tmp_path / "run" / "launch.json").read_text())["started_cold"] == []
    seen = torch.load(tmp_path / "run" / "rank0" / "preloaded.pt", weights_only=True)
    assert seen == dict.fromkeys(names, True), seen


def test_a_fork_server_forks_ranks_that_import_only_their_own_kit_copy(tmp_path, servers):
    """Servers hold library modules only: a rank forked for another grading copy imports ``grading``, ``common`` (which
    the server imported itself), the probe and its subprocesses' modules from that copy, never from the server's."""
    copy = tmp_path / "copy"
    for folder in ("common", "grading", "tests"):
        shutil.copytree(ROOT / folder, copy / folder, ignore=shutil.ignore_patterns("__pycache__"))
    result = launch(f"{PROBES}:reports_kit", 1, cwd=copy, out_dir=tmp_path / "run", timeout_s=60, init_group=False,
                    servers=servers)
    assert result.ok, result.failure()
    seen = torch.load(tmp_path / "run" / "rank0" / "kit.pt", weights_only=True)
    root = str(copy.resolve())
    assert all(seen[name].startswith(root) for name in ("grading", "common", "probes")), seen
    assert seen["pythonpath"] == root and seen["path0"] == root, seen


def test_profile_lists_what_the_ranks_imported_themselves(tmp_path, servers):
    """``grade --profile``'s note: a package a probe imports is listed, unless the case preloads it."""
    for name, preload in (("cold", ()), ("preloaded", ("matplotlib",))):
        result = launch(f"{PROBES}:imports_matplotlib", 2, cwd=ROOT, out_dir=tmp_path / "runs" / name,
                        timeout_s=60, init_group=False, servers=servers, preload=preload)
        assert result.ok, result.failure()
    assert case_profile(tmp_path / "runs" / "cold")["cold_imports"] == ["matplotlib"]
    assert case_profile(tmp_path / "runs" / "preloaded")["cold_imports"] == []
    assert "  cold: matplotlib" in table(tmp_path / "runs") and "preloaded:" not in table(tmp_path / "runs")
    assert table(tmp_path / "runs").split()[:3] == ["case", "preload", "start"]    # the wall's first part shown


def test_ranks_that_all_wait_end_early_saying_where_each_waits(tmp_path, servers):
    """Every rank waiting (a barrier, a poll loop): the case ends at the waiting limit, not its time limit, with a
    progress line before that naming where each rank is."""
    lines: list[str] = []
    result = launch(f"{PROBES}:rank1_polls_rank0_waits", 2, cwd=ROOT, out_dir=tmp_path / "run", timeout_s=120,
                    pg_timeout_s=120, servers=servers, progress=lines.append, progress_s=1.5, still_limit_s=4)
    assert result.timed_out and result.still_s >= 4, (result.wall_s, result.still_s)     # the watchdog ended it
    assert "without using the CPU" in result.failure(), result.failure()
    assert lines and all(line.startswith("run: ") for line in lines), lines
    assert "rank 0 in " in lines[-1] and "rank 1 in " in lines[-1], lines


def test_a_rank_that_computes_while_the_other_waits_is_not_ended(tmp_path, servers):
    result = launch(f"{PROBES}:rank0_computes_rank1_waits", 2, cwd=ROOT, out_dir=tmp_path / "run", timeout_s=120,
                    servers=servers, progress=lambda line: None, still_limit_s=2)
    assert result.ok and result.still_s == 0, result.failure()
