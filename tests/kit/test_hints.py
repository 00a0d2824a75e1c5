"""Messages that point at the cause (issue 11): the student file and line, and likely causes."""
from __future__ import annotations

import traceback

import pytest

from common.error_words import format_error, likely_cause, self_contained
from common.rank_reports import dump_place, traceback_line
from common.regions import STUDENT_PACKAGES
from grading.check import describe_exception, student_frame
from grading.kit.region_hints import static_hints
from grading.engine.case_run import describe_error
from grading.problems.probe_helpers import call_outcome, labelled

pytestmark = pytest.mark.kit

LATE = """\
        for wave in schedule.clock_cycles(m, n):
            for i, j in wave:
                self.workers.submit(j, lambda: self.stages[j](batches[i]))
"""
BOUND = """\
        for wave in schedule.clock_cycles(m, n):
            for i, j in wave:
                self.workers.submit(j, lambda i=i, j=j: self.stages[j](batches[i]))
                def task(x=batches[i], j=j):
                    return self.stages[j](x)
"""


def test_a_late_binding_closure_is_named_with_its_line():
    hints = static_hints(LATE, 40, "pipeline/pipe.py")
    assert len(hints) == 1 and "pipeline/pipe.py:42" in hints[0] and "'i', 'j'" in hints[0]
    assert "lambda i=i, j=j" in hints[0]


ASSIGNED = """\
        for wave in schedule.clock_cycles(m, n):
            for i, j in wave:
                x = batches[i]
                self.workers.submit(j, lambda: self.stages[j](x))
                def task(k=j):
                    return self.stages[k](y)
                y = x
"""
WHILE = """\
        k = 0
        while k < m:
            x = batches[k]
            tasks.append(lambda: stage(x))
            k += 1
"""
OWN_NAMES = """\
        for x in batches:
            def task(i=0):
                x = batches[i]
                return [stage(j) for j in x]
            tasks.append(task)
"""


def test_every_name_the_loop_assigns_and_a_closure_reads_is_named_once():
    hints = static_hints(ASSIGNED, 40, "pipeline/pipe.py")
    assert len(hints) == 2, hints                       # one per function, though two loops enclose each
    assert "pipeline/pipe.py:43: " in hints[0] and "reads 'j', 'x' when it runs" in hints[0]
    assert "(lambda j=j, x=x: ...)" in hints[0]
    assert "pipeline/pipe.py:44: " in hints[1] and "reads 'y' when it runs" in hints[1]    # assigned after the def
    hint, = static_hints(WHILE, 1, "p.py")
    assert "p.py:4: " in hint and "reads 'x' when it runs" in hint


def test_names_a_closure_binds_itself_give_no_hint():
    assert static_hints(OWN_NAMES, 1, "p.py") == []


def test_bound_loop_variables_give_no_hint():
    assert static_hints(BOUND, 40, "pipeline/pipe.py") == []
    assert static_hints("this is not python (", 1, "x.py") == []


def test_the_innermost_student_frame_is_named(tmp_path):
    student = tmp_path / "data_parallel" / "dataset.py"
    student.parent.mkdir()
    student.write_text("def pick(items, i):\n    return items[i + 1]\n")
    namespace: dict = {}
    exec(compile(student.read_text(), str(student), "exec"), namespace)
    try:
        namespace["pick"]([1, 2], 1)
    except IndexError as exc:
        where = student_frame(traceback.extract_tb(exc.__traceback__))
    assert where == "data_parallel/dataset.py:2 (in pick)"
    info = {"type": "IndexError", "message": "list index out of range", "where": where}
    assert describe_error(info) == "IndexError: list index out of range (at data_parallel/dataset.py:2 (in pick))"


REGION_CALLS_HELPER = """\
def helper(items, i):
    return items[i + 1]


def pick(items, i):
    # BEGIN_STUDENT pick
    return helper(items, i)
    # END_STUDENT pick
"""


def test_the_region_line_is_named_before_a_provided_helper_it_called_the_same_way_everywhere(tmp_path):
    """One rule for a caught exception's frames, a rank's formatted traceback and its stack dump: the student's
    region line, not the provided helper below it (whose innermost frame is named only when no region is on the
    stack)."""
    student = tmp_path / "data_parallel" / "dataset.py"
    student.parent.mkdir()
    student.write_text(REGION_CALLS_HELPER)
    namespace: dict = {}
    exec(compile(student.read_text(), str(student), "exec"), namespace)
    try:
        namespace["pick"]([1, 2], 1)
    except IndexError as exc:
        frames, text = traceback.extract_tb(exc.__traceback__), traceback.format_exc()
        try:
            namespace["helper"]([1, 2], 1)
        except IndexError as bare:
            helper_only = traceback.extract_tb(bare.__traceback__)
    region, helper = "data_parallel/dataset.py:7 (in pick)", "data_parallel/dataset.py:2 (in helper)"
    assert student_frame(frames) == region and student_frame(helper_only) == helper
    assert traceback_line(text, STUDENT_PACKAGES) == f"IndexError: list index out of range (at {region})"
    dump = "\n".join(f'  File "{f.filename}", line {f.lineno} in {f.name}' for f in reversed(frames))
    assert dump_place(dump, STUDENT_PACKAGES) == ("", region)


def test_a_report_naming_a_pipe_a_link_or_a_huge_file_is_placed_without_reading_it(tmp_path):
    """A rank's report is the rank's to write: where it names a pipe (opening one to read would wait for a writer),
    a link to a file outside the student's code or a file past ``REGION_FILE_BYTES`` in a student folder, the
    reader places the error at the innermost package frame and returns at once."""
    import os
    import threading

    from common.rank_reports import REGION_FILE_BYTES

    folder = tmp_path / "data_parallel"
    folder.mkdir()
    os.mkfifo(folder / "pipe.py")
    (folder / "huge.py").write_text(REGION_CALLS_HELPER + "#" * REGION_FILE_BYTES)
    (tmp_path / "outside.py").write_text(REGION_CALLS_HELPER)
    (folder / "link.py").symlink_to(tmp_path / "outside.py")
    for name in ("pipe.py", "huge.py", "link.py"):
        text = (f'Traceback (most recent call last):\n  File "{folder / name}", line 7, in pick\n'
                f'  File "{folder / name}", line 2, in helper\nIndexError: list index out of range\n')
        found: list[str] = []
        reader = threading.Thread(target=lambda: found.append(traceback_line(text, STUDENT_PACKAGES)), daemon=True)
        reader.start()
        reader.join(30)
        assert found == [f"IndexError: list index out of range (at data_parallel/{name}:2 (in helper))"], name


def test_known_failure_shapes_get_a_likely_cause():
    assert "torch.distributed is used before" in likely_cause(
        "ValueError", "Default process group has not been initialized, please make sure to call init_process_group.")
    assert likely_cause("KeyError", "'x'") == ""


def test_a_first_line_ending_at_a_colon_gets_its_details_joined():
    """torch's load_state_dict error opens with "...for ZeroNet:"; the grade table's first line says what is wrong."""
    torch_error = ('Error(s) in loading state_dict for ZeroNet:\n\tMissing key(s) in state_dict: "layers.2.bias". '
                   '\n\tsize mismatch for w: copying a param with shape [3] from checkpoint.')
    first = format_error("RuntimeError", torch_error).split("\n")[0]
    assert first == ('RuntimeError: Error(s) in loading state_dict for ZeroNet: Missing key(s) in state_dict: '
                     '"layers.2.bias".')
    assert self_contained(torch_error).split("\n")[1:] == [
        "\tsize mismatch for w: copying a param with shape [3] from checkpoint."]
    assert self_contained("Error(s):\n\n  \tsize mismatch for w") == "Error(s): size mismatch for w"
    assert self_contained("no details:") == "no details:"
    assert self_contained("a: b\nc:") == "a: b\nc:"


def _student_module(root, rel: str, source: str) -> dict:
    """Execute ``source`` as if it were the student file ``root/rel``; its namespace."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    namespace: dict = {}
    exec(compile(source, str(path), "exec"), namespace)
    return namespace


def test_every_caught_exception_is_described_one_way(tmp_path, monkeypatch):
    """record (describe_error), call_outcome and labelled all give "Type: message (at path:line (in fn))"."""
    monkeypatch.chdir(tmp_path)                      # student_frame's paths are relative to the grading copy
    student = _student_module(tmp_path, "pipeline/schedule.py", "def clock_cycles(m, n):\n    return [m][n]\n\n"
                              "def refuse():\n    raise ValueError('no')\n")
    try:
        student["clock_cycles"](1, 1)
    except IndexError as exc:
        described = describe_exception(exc)
        where = student_frame(traceback.extract_tb(exc.__traceback__))
    assert described == "IndexError: list index out of range (at pipeline/schedule.py:2 (in clock_cycles))"
    assert describe_error({"type": "IndexError", "message": "list index out of range", "where": where}) == described
    assert call_outcome(lambda: student["clock_cycles"](1, 1)) == described
    assert call_outcome(lambda: student["refuse"]()) == "ValueError"
    with pytest.raises(RuntimeError) as raised:
        labelled("clock_cycles(1, 1)", student["clock_cycles"], 1, 1)
    assert str(raised.value) == f"clock_cycles(1, 1) raised {described}"


def test_a_caught_exception_keeps_its_likely_cause(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    student = _student_module(tmp_path, "data_parallel/comm.py", "def average():\n    raise ValueError("
                              "'Default process group has not been initialized')\n")
    text = call_outcome(lambda: student["average"](), message=True)
    assert text == "ValueError: Default process group has not been initialized"      # ValueError: as asked
    try:
        student["average"]()
    except ValueError as exc:
        described = describe_exception(exc)
    assert described.startswith("ValueError: Default process group has not been initialized "
                                "(at data_parallel/comm.py:2 (in average))\nlikely cause: torch.distributed")
    assert format_error("KeyError", "'x'") == "KeyError: 'x'"
