"""Zygotes (``grading.engine.zygote``): each grading run's fork servers are fresh children of a zygote, nothing of
one run reaches the next, and a missing or refusing zygote only means cold servers."""
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from grading.commands.batch import _wants_zygotes, zygote_imports
from grading.engine import forked_command, kit_command, zygote
from grading.engine.forkserver import parent_of
from grading.engine.forkservers import ForkServers
from grading.engine.zygotes import Zygotes
from grading.engine.launch import launch
from grading.engine.runner import FORKSERVER_ENV
from grading.engine.zygote import ZYGOTES_ENV
from tests.kit.variants import KIT_ROOT

pytestmark = pytest.mark.kit
PROBES = "tests.kit.launcher_probes"


@pytest.fixture(scope="module")
def zygotes_env():
    """The session's zygotes (``tests/kit/conftest.py``), or this module's own where the session has none."""
    if os.environ.get(ZYGOTES_ENV):
        yield os.environ[ZYGOTES_ENV]
        return
    with Zygotes(KIT_ROOT) as own:
        yield own.env()[ZYGOTES_ENV]


def _servers(folder: str) -> ForkServers:
    return ForkServers(KIT_ROOT, env={**os.environ, ZYGOTES_ENV: folder})


def _preloaded(tmp_path, servers, name: str, preload: tuple[str, ...]) -> list[dict]:
    result = launch(f"{PROBES}:reports_preloaded", 2, cwd=KIT_ROOT, out_dir=tmp_path / name, timeout_s=60,
                    init_group=False, servers=servers, args={"names": ["tabnanny"]}, preload=preload)
    assert result.ok, result.failure()
    return [torch.load(tmp_path / name / f"rank{r}" / "preloaded.pt", weights_only=True) for r in range(2)]


def test_each_run_gets_new_servers_forked_by_the_zygotes_and_its_preloads_stay_there(tmp_path, zygotes_env):
    """Both slots' servers are children of a zygote, new for each run; a module one run preloads (``tabnanny``,
    which no zygote imports) is in that run's ranks and not in the next run's."""
    with _servers(zygotes_env) as first:
        assert _preloaded(tmp_path, first, "first", ("tabnanny",)) == [{"tabnanny": True}] * 2
        first_pids = [first.server(rank).pid for rank in range(2)]
        assert all(first.server(rank).from_zygote for rank in range(2))
        zygote_pids = [parent_of(pid) for pid in first_pids]
    assert len(set(zygote_pids)) == 2
    for pid in zygote_pids:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            assert b"grading.engine.zygote" in handle.read()
    with _servers(zygotes_env) as second:
        assert _preloaded(tmp_path, second, "second", ()) == [{"tabnanny": False}] * 2
        assert [second.server(rank).pid for rank in range(2)] != first_pids
        assert [parent_of(second.server(rank).pid) for rank in range(2)] == zygote_pids


def test_no_zygote_or_a_refusing_one_means_cold_servers_with_the_same_result(tmp_path, zygotes_env, monkeypatch):
    """An empty zygote folder, or a run whose fork server code differs from the zygote's: the servers start cold
    and the run gives the same result; the zygote goes on serving runs that match it."""
    with _servers(str(tmp_path)) as servers:
        assert _preloaded(tmp_path, servers, "none", ("tabnanny",)) == [{"tabnanny": True}] * 2
        assert not any(servers.server(rank).from_zygote for rank in range(2))
    monkeypatch.setattr(zygote, "server_source_digest", lambda: "another kit version")  # as another version sends
    with _servers(zygotes_env) as servers:
        assert _preloaded(tmp_path, servers, "refused", ("tabnanny",)) == [{"tabnanny": True}] * 2
        assert not any(servers.server(rank).from_zygote for rank in range(2))
    monkeypatch.undo()
    with _servers(zygotes_env) as servers:
        assert servers.server(0).from_zygote


def test_a_batch_starts_zygotes_only_where_they_save_something(monkeypatch):
    """Several submissions, warm ranks and no zygotes named yet; not for one submission, under
    ``GRADING_FORKSERVER=0``, or where a test session already named its own."""
    monkeypatch.delenv(ZYGOTES_ENV, raising=False)
    monkeypatch.delenv(FORKSERVER_ENV, raising=False)
    assert _wants_zygotes(2) and not _wants_zygotes(1)
    monkeypatch.setenv(FORKSERVER_ENV, "0")
    assert not _wants_zygotes(2)
    monkeypatch.delenv(FORKSERVER_ENV)
    monkeypatch.setenv(ZYGOTES_ENV, "/somewhere")
    assert not _wants_zygotes(2)


def test_a_batchs_zygotes_import_what_its_cases_preload():
    """``--problem 1.1`` preloads nothing beyond torch; Problem 3 DeepSpeed, not GPT-2; no ``--problem``: all."""
    assert zygote_imports(["--problem", "1.1", "--timeout", "6"]) == ()
    assert "deepspeed" in zygote_imports(["--problem", "3"])
    assert "transformers.models.gpt2.modeling_gpt2" not in zygote_imports(["--problem", "3"])
    assert set(zygote_imports([])) == set(zygote.IMPORTS) - {"torch"}


@pytest.fixture
def killable_zygotes():
    """The session's ``Zygotes`` (``tests/kit/conftest.py``; started again after the test, whatever its outcome),
    or zygotes of the test's own where the session has none."""
    from tests.kit.conftest import _ZYGOTES
    if _ZYGOTES and _ZYGOTES[0].env() == {ZYGOTES_ENV: os.environ.get(ZYGOTES_ENV)}:
        yield _ZYGOTES[0]
        _ZYGOTES[0].env()
        return
    with Zygotes(KIT_ROOT) as own:
        yield own


def test_a_rank_that_kills_the_zygote_ends_no_run_and_the_zygote_is_started_again(tmp_path, killable_zygotes):
    """A zygote's servers outlive it: the run whose rank killed it finishes; the next run starts its servers cold,
    and once ``env()`` has started the zygote again, runs get their servers from it."""
    zygotes = killable_zygotes
    folder = zygotes.env()[ZYGOTES_ENV]
    with _servers(folder) as servers:
        result = launch(f"{PROBES}:kills_its_servers_parent", 2, cwd=KIT_ROOT, out_dir=tmp_path / "run",
                        timeout_s=60, init_group=False, servers=servers)
        assert result.ok, result.failure()
        assert servers.server(0).from_zygote and servers.server(0).alive()
    with _servers(folder) as servers:
        assert not servers.server(0).from_zygote
    assert zygotes.env() == {ZYGOTES_ENV: folder}
    with _servers(folder) as servers:
        assert servers.server(0).from_zygote


def _gone(pids: list[int], within_s: float = 30.0) -> bool:
    """Whether every process in ``pids`` has ended (waiting up to ``within_s`` for it)."""
    deadline = time.monotonic() + within_s
    while any(parent_of(pid) is not None for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return all(parent_of(pid) is None for pid in pids)


def test_zygotes_forked_from_running_ones_serve_at_once_and_end_with_their_owner(tmp_path, zygotes_env):
    """``Zygotes(source=...)``: each slot's zygote is a child of the source's zygote of that slot; its runs'
    servers are its own children; it ends when the process that asked for it ends (here: exits without closing
    anything), removing its socket and the emptied folder; a source that does not answer means zygotes started
    from scratch, children of the owner, which end and clean up the same way."""
    with Zygotes(KIT_ROOT, source=zygotes_env) as forked:
        sources = [parent_of(pid) for pid in forked.pids()]
        with _servers(forked.env()[ZYGOTES_ENV]) as servers:
            assert _preloaded(tmp_path, servers, "forked", ()) == [{"tabnanny": False}] * 2
            assert [parent_of(servers.server(rank).pid) for rank in range(2)] == forked.pids()
    assert len(set(sources)) == 2
    for pid in sources:                                                   # the source's zygotes
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            command = handle.read()
        assert b"grading.engine.zygote" in command, command
    for source, kind in ((zygotes_env, "forked"), (str(tmp_path / "nobody"), "started")):
        owner = subprocess.run([sys.executable, "-c", "import json, os\nfrom grading.engine.zygotes import Zygotes\n"
                                f"z = Zygotes({str(KIT_ROOT)!r}, source={source!r}, imports=())\n"
                                "print(json.dumps([z.pids(), str(z.folder), [open(f'/proc/{p}/stat').read().split()[3]"
                                " for p in z.pids()], os.getpid()]), flush=True)\nos._exit(0)\n"],
                               cwd=KIT_ROOT, capture_output=True, text=True, timeout=120)
        orphans, folder, parents, owner_pid = json.loads(owner.stdout)
        assert len(orphans) == 2 and _gone(orphans), (kind, owner.stderr)
        assert not Path(folder).exists(), kind            # their sockets and folder went with them
        assert (int(parents[0]) == owner_pid) == (kind == "started"), (kind, parents, owner_pid)


def _command(folder: str, work, name: str, *args: str, **env: str):
    """Run ``python -m tests.kit.command_probe`` through ``kit_command.start`` with the zygotes in ``folder``;
    (the process object, its exit code, what it recorded, its stdout, its stderr)."""
    work.mkdir(parents=True)
    out = work / "facts.json"
    (work / "stdin").write_text("typed in")
    with open(work / "stdin") as stdin, open(work / "stdout", "w") as stdout, open(work / "stderr", "w") as stderr:
        process = kit_command.start("tests.kit.command_probe", [str(out), *args], KIT_ROOT,
                                    {**os.environ, ZYGOTES_ENV: folder, "PROBE_MARKER": name, **env},
                                    stdin.fileno(), stdout.fileno(), stderr.fileno())
        code = process.wait(timeout=120)
    return process, code, json.loads(out.read_text()), (work / "stdout").read_text(), (work / "stderr").read_text()


def test_a_forked_command_starts_and_ends_as_a_cold_one(tmp_path, zygotes_env):
    """The same command forked by a zygote and started cold (``PYTHONWARNINGS`` set: another start-up setting, which
    the zygote refuses): the same argv, folder, environment, stdio, torch threads and exit code; each in a session
    of its own (the forked one under its waiter); different random seeds; its non-daemon thread joined and
    ``atexit`` run before the end; its title in ``ps`` is its own command line; ``tempfile`` finds the folder its
    own ``TMPDIR`` names (not the one the zygote read)."""
    (tmp_path / "own tmp").mkdir()
    tmp = {"TMPDIR": str(tmp_path / "own tmp")}
    forked, code, facts, stdout, stderr = _command(zygotes_env, tmp_path / "forked", "one", "3", **tmp)
    cold, cold_code, cold_facts, cold_stdout, cold_stderr = _command(zygotes_env, tmp_path / "cold", "one", "3",
                                                                     PYTHONWARNINGS="default", **tmp)
    assert isinstance(forked, kit_command.ForkedProcess) and isinstance(cold, subprocess.Popen)
    assert code == cold_code == 3
    assert (stdout, stderr) == (cold_stdout, cold_stderr) == ("probe on stdout\n", "probe on stderr\n")
    for work, seen in (("forked", facts), ("cold", cold_facts)):
        out = str(tmp_path / work / "facts.json")
        assert seen.pop("argv") == [str(KIT_ROOT / "tests" / "kit" / "command_probe.py"), out, "3"]
        assert seen.pop("cmdline") == [sys.executable, "-m", "tests.kit.command_probe", out, "3"]
    assert [facts.pop("sid_is_parent"), cold_facts.pop("sid_is_parent")] == [True, False]  # cold: leads its own
    random_draws = facts.pop("random"), cold_facts.pop("random")
    assert facts == cold_facts and facts["marker"] == "one" and facts["stdin"] == "typed in"
    assert facts["cwd"] == str(KIT_ROOT) and random_draws[0] != random_draws[1] and facts["tempdir"] == tmp["TMPDIR"]
    _, _, again, _, _ = _command(zygotes_env, tmp_path / "again", "two")
    assert again["random"] not in random_draws and again["marker"] == "two"
    for work in ("forked", "cold"):
        assert (tmp_path / work / "facts.json.thread").read_text() == "joined"
        assert (tmp_path / work / "facts.json.atexit").read_text() == "ran"


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_forked_command_stops_and_reports_as_a_cold_one(tmp_path, zygotes_env, stop):
    """``wait(timeout)`` raises ``TimeoutExpired`` while it runs; a signal to its process group (as ``batch`` sends
    at its limit) ends it, and its exit status is ``-signal`` as ``subprocess`` reports a cold one's (the waiter
    does not die of SIGTERM before the command can answer it)."""
    codes = []
    for work, env in (("forked", {}), ("cold", {"PYTHONWARNINGS": "default"})):
        with open(os.devnull, "w") as null:
            process = kit_command.start("tests.kit.command_probe", [str(tmp_path / work), "sleep"], KIT_ROOT,
                                        {**os.environ, ZYGOTES_ENV: zygotes_env, **env}, subprocess.DEVNULL,
                                        null.fileno(), null.fileno())
        with pytest.raises(subprocess.TimeoutExpired):
            process.wait(timeout=0.5)
        os.killpg(process.pid, stop)
        codes.append((type(process).__name__, process.wait(timeout=60)))
    assert codes == [("ForkedProcess", -stop), ("Popen", -stop)]


def test_a_forked_command_in_another_folder_imports_that_folders_modules_and_path(tmp_path, zygotes_env):
    """Forked in another kit copy (here a folder with its own ``grading``), a command imports that folder's
    package, not the zygote's, and its ``PYTHONPATH`` comes before the libraries; the kit is not on its path."""
    other = tmp_path / "other"
    (other / "grading").mkdir(parents=True)
    (other / "grading" / "__init__.py").write_text("")
    (other / "grading" / "__main__.py").write_text(
        "import sys, extra, grading\nprint(grading.__file__, extra.WHERE, sys.path[:2])\n"
        "print(any(p.startswith(%r) for p in sys.path))\n" % str(KIT_ROOT))
    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "extra.py").write_text("WHERE = 'extra'\n")
    outputs = []
    for env in ({}, {"PYTHONWARNINGS": "default"}):                 # forked, then cold
        with open(tmp_path / "out", "w+") as out:
            process = kit_command.start("grading", [], other, {**os.environ, ZYGOTES_ENV: zygotes_env,
                                                            "PYTHONPATH": str(tmp_path / "extra"), **env},
                                        subprocess.DEVNULL, out.fileno(), out.fileno())
            assert process.wait(timeout=60) == 0
            out.seek(0)
            outputs.append((type(process).__name__, out.read()))
    expected = f"{other / 'grading' / '__init__.py'} extra {[str(other), str(tmp_path / 'extra')]}\nFalse\n"
    assert outputs == [("ForkedProcess", expected), ("Popen", expected)]


def test_a_zygote_refuses_a_command_with_other_start_up_settings_or_malformed():
    """``refusal``: another ``PYTHON*`` start-up setting, or a malformed request, makes the command start cold."""
    env = dict(os.environ)
    request = {"module": "grading", "args": ["list"], "cwd": str(KIT_ROOT), "env": env}
    settings = forked_command.startup_settings(env)
    assert forked_command.refusal(request, settings) is None
    assert forked_command.refusal({**request, "env": {**env, "PYTHONPATH": "/elsewhere"}}, settings) is None
    assert forked_command.refusal({**request, "env": {**env, "PYTHONWARNINGS": "error"}}, settings) == \
        "other start-up settings"
    assert forked_command.refusal({**request, "args": "list"}, settings) == "a malformed command"


def test_a_command_whose_launcher_gave_up_waiting_never_runs(tmp_path, zygotes_env):
    """A launcher whose request times out starts the command cold; the zygote may still read that request later,
    so it runs a command only after the launcher's ``GO``: here the launcher hangs up without it, and the waiter
    exits without running the command (no status, no output)."""
    out = tmp_path / "facts.json"
    read, write = os.pipe()
    request = {"module": "tests.kit.command_probe", "args": [str(out)], "cwd": str(KIT_ROOT), "env": dict(os.environ),
               "digest": zygote.server_source_digest()}
    with open(os.devnull) as null, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(str(zygote.socket_path(Path(zygotes_env), 0)))
        socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [null.fileno()] * 3 + [write])
    os.close(write)
    assert select.select([read], [], [], 60)[0], "the waiter did not end"
    assert os.read(read, 64) == b"" and not out.exists()
    os.close(read)


def test_a_server_whose_launcher_gave_up_waiting_never_serves(zygotes_env):
    """The same for a fork server: a launcher that timed out starts a cold server on the run's socket, so the late
    request must not add a second server on it: without ``GO`` the forked one exits before serving."""
    ours, theirs = socket.socketpair()
    request = {"digest": zygote.server_source_digest()}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(str(zygote.socket_path(Path(zygotes_env), 0)))
        socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [theirs.fileno()])
    theirs.close()
    ours.settimeout(60)
    assert ours.recv(4096) == b""            # closed unserved: a server would have said it was ready
    ours.close()
