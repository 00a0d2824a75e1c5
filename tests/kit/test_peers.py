"""Messages that read as what they are (issue 61): calls compared by where they come from, a skipped step, a
deadlock in point-to-point calls, a crashed peer, a probe's own failure, a wrong world size, a multi-line error.

The ranks are tests/kit/peer_probes.py's (gloo, forked warm by the session's fork servers); each case reads the
message ``CaseRun.part`` raises, as a criterion would. The helpers below it (the call log, ``plain``,
``traceback_line``) are tested without ranks.
"""
from __future__ import annotations

import os
import re
import traceback
import types

import pytest

from common import call_log
from common import ROOT
from common.rank_reports import library_of, traceback_line
from common.regions import STUDENT_PACKAGES
from grading.commands.report import summary
from grading.engine.case_run import CaseRun
from grading.engine.expect import CheckFailed
from common.error_words import format_error, plain
from grading.engine.launch import launch

pytestmark = pytest.mark.kit
PROBES = "tests.kit.peer_probes"
PLACE = r"inside tests\.kit\.peer_probes:\d+ \(in {}\)"


def _message(tmp_path, servers, probe: str, name: str, rank: int, world_size: int = 2, **options) -> str:
    result = launch(f"{PROBES}:{probe}", world_size, cwd=ROOT, out_dir=tmp_path / probe, timeout_s=30,
                    servers=servers, **options)
    with pytest.raises(CheckFailed) as failed:
        CaseRun(world_size, result).part(name, rank)
    return str(failed.value)


def test_a_skipped_call_is_named_by_where_the_calls_come_from(tmp_path, fork_servers):
    """Rank 1 skips a forward all-reduce whose shape its backward all-reduce shares: the calls agree on op and
    shape and part on their place (not "rank 1 returned without the all_reduce that rank 0 waits in")."""
    first = _message(tmp_path, fork_servers, "skips_forward_all_reduce", "grads", 0).splitlines()[0]
    assert re.fullmatch(r"ranks disagree on where their collective call number 1 comes from: rank 0 calls "
                        rf"all_reduce\(float32 \[4\]\) {PLACE.format('_forward')}; rank 1 calls all_reduce\(float32 "
                        rf"\[4\]\) {PLACE.format('_backward')}", first), first


def test_a_skipped_step_is_named_also_under_a_wrong_number(tmp_path, fork_servers):
    """Rank 1 makes two steps' calls where rank 0 makes three: rank 0's failure names the skipped step, and a
    criterion that finds rank 1's numbers wrong says why on a ``likely cause:`` line."""
    result = launch(f"{PROBES}:skips_a_step", 2, cwd=ROOT, out_dir=tmp_path / "run", timeout_s=30,
                    servers=fork_servers)
    run = CaseRun(2, result)
    with pytest.raises(CheckFailed) as failed:
        run.part("losses", 0)
    shown = summary(str(failed.value), width=10_000)
    assert shown[0].startswith("rank 1 made 4 collective calls where rank 0 made 5"), shown
    assert shown[1].startswith("likely cause: rank 1 skipped a whole step"), shown
    assert str(failed.value).count("skipped a whole step") == 1, failed.value       # no second note
    assert run.part("losses", 1) == [6.0, 6.0]
    note = run.calls_note("losses: rank 1 has 2 values, expected 3")       # what judge_case adds to that failure
    assert run.calls_note(note) == ""                                       # once
    wrong = ["losses: rank 1 has 2 values, expected 3", note]
    assert wrong == ["losses: rank 1 has 2 values, expected 3", "likely cause: the ranks' collective calls part ways: "
                     "rank 1 made 4 collective calls where rank 0 made 5: rank 0's calls from number 5 on (all_reduce("
                     "float32 [3]) inside tests.kit.peer_probes:27 (in _train_step)) have no partner on rank 1, whose "
                     "last call was all_reduce(float32 [3]) inside tests.kit.peer_probes:28 (in _train_step)"], wrong


def test_ranks_that_both_wait_in_recv_read_as_a_deadlock(tmp_path, fork_servers):
    first = _message(tmp_path, fork_servers, "recv_recv", "exchange", 0, pg_timeout_s=2).splitlines()[0]
    assert re.fullmatch(rf"both ranks wait in recv, so none gets what it waits for \(a deadlock\): rank 0 "
                        rf"recv\(float32 \[2\], from 1\) {PLACE.format('exchange')}; rank 1 recv\(float32 \[2\], "
                        rf"from 0\) {PLACE.format('exchange')}", first), first


def test_a_peers_own_error_explains_a_rank_cut_off_before_recording(tmp_path, fork_servers):
    """Rank 0 never recorded because rank 1 left (rank 1 recorded its own NotImplementedError): rank 0's criterion
    names rank 1's error, so the starter's criterion reads as not implemented, not as a grader failure."""
    result = launch(f"{PROBES}:rank1_not_implemented_rank0_cut_off", 2, cwd=ROOT, out_dir=tmp_path / "run",
                    timeout_s=30, init_group=False, servers=fork_servers)
    with pytest.raises(CheckFailed) as failed:
        CaseRun(2, result).part("grads", 0)
    shown = summary(str(failed.value), width=10_000)
    assert shown[0].startswith("rank 1: NotImplementedError: Problem 1.2: setup_process_group"), shown
    assert shown[1].startswith("symptom: rank 0 then failed: RuntimeError: Gloo connectFullMesh failed"), shown


def test_a_crashed_peer_is_no_disagreement(tmp_path, fork_servers):
    """Rank 1 dies while rank 0 waits: rank 0's later part names the crash, not calls "out of step"."""
    result = launch(f"{PROBES}:rank1_crashes", 2, cwd=ROOT, out_dir=tmp_path / "run", timeout_s=30,
                    servers=fork_servers)
    run = CaseRun(2, result)
    for name in ("first", "second"):
        with pytest.raises(CheckFailed) as failed:
            run.part(name, 0)
        shown = summary(str(failed.value), width=10_000)
        assert shown[0] == "rank 1 exited with code 3 before finishing", shown
        assert "out of step" not in str(failed.value) and "skipped" not in str(failed.value), shown


def test_a_probe_that_fails_says_so(tmp_path, fork_servers):
    message = _message(tmp_path, fork_servers, "probe_fails", "grads", 0, world_size=1, init_group=False)
    assert message == ("rank 0: no result for 'grads': the grader's probe failed before recording it: KeyError: "
                       "'missing_setting' (at the grader's tests/kit/peer_probes.py:66 (in probe_fails)); no frame "
                       "of your code was running"), message


def test_a_wrong_world_size_is_said_in_words(tmp_path, fork_servers):
    message = _message(tmp_path, fork_servers, "wrong_world_size", "joined", 1, init_group=False)
    shown = summary(message, width=10_000)
    assert shown[0] == ("rank 1: RuntimeError: the communication library refused to join the group: rank 1 is not "
                        "below the world size 1 (raised inside torch.distributed)"), shown
    assert "likely cause: a rank number not below the world size: the group was joined with a wrong world size or " \
           "rank" in shown[1], shown
    assert "enforce fail" not in "\n".join(shown) and "context.cc" not in message, message


def test_a_multi_line_error_keeps_its_location_on_its_first_line(tmp_path, fork_servers):
    first = _message(tmp_path, fork_servers, "multi_line_error", "reduced", 0).splitlines()[0]
    assert first == ("rank 0: TypeError: Invalid function argument. Expected parameter `tensor` of type torch.Tensor "
                     "but got <class 'list'> instead. (raised inside torch.distributed)"), first


def test_a_student_frame_comes_first_on_the_line_and_the_library_next_to_it(tmp_path):
    student = tmp_path / "data_parallel" / "comm.py"
    student.parent.mkdir()
    student.write_text("import torch.distributed as dist\n\ndef f(t):\n    dist.all_reduce([t])\n")
    namespace: dict = {}
    exec(compile(student.read_text(), str(student), "exec"), namespace)
    try:
        namespace["f"](1)
    except TypeError:
        text = traceback.format_exc()
    assert traceback_line(text, STUDENT_PACKAGES) == (
        "TypeError: Invalid function argument. Expected parameter `tensor` of type torch.Tensor but got <class "
        "'list'> instead. (at data_parallel/comm.py:4 (in f); raised inside torch.distributed)")


def test_no_library_source_path_reaches_a_message():
    assert plain("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error") == "Read error"
    assert plain("Connection reset by peer. This is typically caused by a remote worker hanging or bugs in the "
                 "application. Check the logs of the remote worker before reporting an error. GLHF! \U0001F3D6\uFE0F"
                 ) == "Connection reset by peer."
    assert plain('bad value in "/usr/lib/python3/site-packages/transformers/models/gpt2/modeling_gpt2.py"') == \
        'bad value in "transformers"'
    assert format_error("RuntimeError", "[enforce fail at /__w/pytorch/third_party/gloo/gloo/context.cc:23] "
                        "rank < size. 2 vs 2").splitlines()[0] == (
        "RuntimeError: the communication library refused to join the group: rank 2 is not below the world size 2")
    assert library_of("/opt/venv/lib/python3.12/site-packages/torch/nn/functional.py") == "torch.nn"
    assert library_of("/work/kit/data_parallel/comm.py") == ""


def test_the_call_log_is_bounded_and_read_as_data(tmp_path, monkeypatch):
    """A rank logs its first MAX_CALLS calls, then one STOPPED line; ``parting`` compares the calls both logged; a
    log that is a link, or holds other lines, is data that cannot mislead."""
    log = tmp_path / "calls.txt"
    monkeypatch.setattr(call_log, "MAX_CALLS", 2)
    with open(log, "w") as stream:
        traced = call_log._traced("barrier", lambda *a: "ran", stream, iter(range(1, 4)), STUDENT_PACKAGES)
        assert [traced() for _ in range(4)] == ["ran"] * 4
    calls = call_log.read(log)
    assert [c.op for c in calls] == ["barrier", "barrier", call_log.STOPPED], log.read_text()
    one = call_log.parse(f"1\tbarrier\t\t\t{calls[0].site}\n")
    assert call_log.parting({0: calls, 1: one}) is None               # rank 0's log was cut short: no "skipped"
    (tmp_path / "link.txt").symlink_to(log)
    assert call_log.read(tmp_path / "link.txt") == []
    assert call_log.parse("junk\n1\tall_reduce\tx\n" + "2\tbarrier\t\t\t" + "p" * 5000 + "\n")[0].site == "p" * 300


def test_a_later_phase_continues_its_ranks_call_log(tmp_path):
    """A case's second phase (new rank processes) adds to the rank's log, numbering on, so the calls where the
    ranks parted in the first phase stay in it; a pipe or a link left in its place is refused at once, never
    waited on."""
    log = tmp_path / "calls.txt"
    for phase, calls in ((1, 2), (2, 1)):
        dist = types.ModuleType(f"phase{phase}_dist")
        dist.barrier = lambda *a: "ran"
        call_log.install(log, STUDENT_PACKAGES, dist)
        assert [dist.barrier() for _ in range(calls)] == ["ran"] * calls
    assert [(c.number, c.op) for c in call_log.read(log)] == [(1, "barrier"), (2, "barrier"), (3, "barrier")]
    os.mkfifo(tmp_path / "pipe.txt")
    (tmp_path / "link.txt").symlink_to(log)
    for odd in ("pipe.txt", "link.txt"):
        with pytest.raises(OSError):
            call_log.install(tmp_path / odd, STUDENT_PACKAGES, types.ModuleType("odd_dist"))
