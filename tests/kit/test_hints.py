"""Messages that point at the cause (issue 11): the student file and line, and likely causes."""
from __future__ import annotations

import traceback

import pytest

from grading.engine.hints import likely_cause, static_hints, student_frame
from grading.engine.results import describe_error

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
        where = student_frame(traceback.extract_tb(exc.__traceback__), root=tmp_path)
    assert where == "data_parallel/dataset.py:2 (in pick)"
    info = {"type": "IndexError", "message": "list index out of range", "where": where}
    assert describe_error(info) == "IndexError: list index out of range (at data_parallel/dataset.py:2 (in pick))"


def test_known_failure_shapes_get_a_likely_cause():
    assert "torch.distributed is used before" in likely_cause(
        "ValueError", "Default process group has not been initialized, please make sure to call init_process_group.")
    assert likely_cause("KeyError", "'x'") == ""
