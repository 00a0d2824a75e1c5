"""Every ``file:line`` names the file the student submitted, and the outside-regions note names what it dropped
(issue 48, item 5).

The ranks run the grading copy (the kit's text around the submitted region bodies), so its lines move when a
student adds a helper above a function or a region body is longer than the kit's. ``SpliceReport.line_maps``
maps them back; ``SpliceReport.student_lines`` rewrites a message with it.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import grading.commands.grade as grade_command
from common import ROOT
from grading.__main__ import main as grading_main
from grading.kit.student_lines import line_map, outside_note
from grading.kit.submission import SpliceReport, build_grading_copy
from grading.problems import all_cases
from grading.kit.variants import with_body

pytestmark = pytest.mark.kit

COMM, PIPE, SCHEDULE = "data_parallel/comm.py", "pipeline/pipe.py", "pipeline/schedule.py"
HELPER = "_WORLD = 2\n\n\ndef _world() -> int:\n    return _WORLD\n\n\n"      # added above average_gradients


def _line_of(text: str, needle: str) -> int:
    """The 1-based line of the only line of ``text`` that contains ``needle``."""
    found = [n for n, line in enumerate(text.splitlines(), start=1) if needle in line]
    assert len(found) == 1, f"{needle!r} is on lines {found}"
    return found[0]


def _submission(root: Path, rel: str, edits: list[tuple[str, str]], before: str = "", helper: str = "") -> str:
    """Write ``root/rel``: the kit's text with each (function, body) region edit and ``helper`` inserted before
    the line that starts with ``before``; return the text."""
    text = (ROOT / rel).read_text()
    for function, body in edits:
        text = with_body(text, rel, function, body)
    if helper:
        assert text.count("\n" + before) == 1
        text = text.replace("\n" + before, "\n" + helper + before)
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_text(text)
    return text


# ------------------------------------------------------------------------------------------ the line map
def test_the_line_map_follows_region_bodies_and_places_kit_lines_the_student_changed():
    graded = "a\nb\nBEGIN\nbody 1\nbody 2\nEND\nc\nd\ne\n"
    submitted = "a\nhelper 1\nhelper 2\nb\nBEGIN\nbody 1\nbody 2\nEND\nC changed\ne\n"
    lines = line_map(graded, submitted)
    assert lines == (1, 4, 5, 6, 7, 8, 9, 9, 10)        # c -> its replacement, d (removed) -> where it stood
    assert line_map(graded, graded) == tuple(range(1, 10))
    assert line_map("a\nb\n", "a\n") == (1, 1)             # a line removed at the end -> the file's last line
    assert line_map("a\r\nb\x0cc\n", "x\na\nb\x0cc\n") == (2, 3)     # Python's lines: a form feed ends none


def test_student_lines_rewrites_every_location_in_a_submitted_file_and_nothing_else():
    report = SpliceReport(files=[COMM, PIPE], line_maps={COMM: (1, 2, 10, 11, 12)})
    message = ("NameError: name 'x' is not defined (at data_parallel/comm.py:3 (in average_gradients))\n"
               '  File "/tmp/grading-run-1/kit/data_parallel/comm.py", line 5 in average_gradients\n'
               "pipeline/pipe.py:3, tests/data_parallel/comm.py.bak:4, my_data_parallel/comm.py:3, "
               "data_parallel/comm.py:99")
    assert report.student_lines(message) == (
        "NameError: name 'x' is not defined (at data_parallel/comm.py:10 (in average_gradients))\n"
        '  File "/tmp/grading-run-1/kit/data_parallel/comm.py", line 12 in average_gradients\n'
        "pipeline/pipe.py:3, tests/data_parallel/comm.py.bak:4, my_data_parallel/comm.py:3, "
        "data_parallel/comm.py:99")
    assert SpliceReport().student_lines(message) == message


# ------------------------------------------------------------------------------------------ the outside note
PRISTINE = '''"""Doc."""
import torch

LIMIT = 3


class Pipe:
    def forward(self):
        # BEGIN_STUDENT 2.2
        pass
        # END_STUDENT 2.2
'''


def test_the_outside_note_names_each_new_name_with_its_line():
    submitted = PRISTINE.replace("import torch\n", "import torch\nimport numpy as np\nfrom os import path\n")
    submitted = submitted.replace("class Pipe:\n", "def _world():\n    return 2\n\n\nclass Pipe:\n    SIZE = 4\n\n"
                                  "    def _helper(self):\n        return 1\n\n")
    assert outside_note(PIPE, PRISTINE, PRISTINE, submitted) == (
        "pipeline/pipe.py: `_world` (line 9), `Pipe.SIZE` (line 14), `Pipe._helper` (line 16), defined outside a "
        "region, and `np` (line 3), `path` (line 4), imported outside a region, are not graded: move them into "
        "the regions that use them")
    one = PRISTINE.replace("LIMIT = 3\n", "LIMIT = 3\n_world = 2\n")
    assert outside_note(PIPE, PRISTINE, PRISTINE, one) == (
        "pipeline/pipe.py: `_world` (line 5), defined outside a region, is not graded: move it into the region "
        "that uses it")


def test_a_change_that_defines_no_new_name_names_its_first_line_and_a_broken_file_its_path():
    changed = PRISTINE.replace('"""Doc."""', '"""Doc."""\n# my notes').replace("LIMIT = 3", "LIMIT = 4")
    assert outside_note(PIPE, PRISTINE, PRISTINE, changed) == "pipeline/pipe.py (first change at line 2)"
    assert outside_note(PIPE, PRISTINE, PRISTINE, PRISTINE.replace("LIMIT = 3", "LIMIT = (")) == PIPE


# ------------------------------------------------------------------------------------------ through the splice
def test_notes_and_static_hints_name_the_submitted_lines(tmp_path):
    """A longer first region and a helper move every later line; the refused region's line, the late-binding
    hint and the syntax error are all named on the submitted file's lines."""
    sub = tmp_path / "sub"
    setup = "import os\n" * 4 + "dist.init_process_group(backend, init_method=init_method, rank=rank, " \
        "world_size=world_size)\n"
    comm = _submission(sub, COMM, [("setup_process_group", setup), ("train_step", "import grading\nreturn 0.0\n")],
                       "def average_gradients(", HELPER)
    late = ("batches = list(torch.split(x, self.split_size))\n"
            "for wave in schedule.clock_cycles(len(batches), len(self.stages)):\n"
            "    for i, j in wave:\n"
            "        xb = batches[i]\n"
            "        self.workers.submit(j, lambda: self.stages[j](xb))\n"
            "    for i, j in wave:\n"
            "        batches[i] = self.workers.receive(j)\n"
            "return torch.cat(batches)\n")
    pipe = _submission(sub, PIPE, [("forward", late)], "    def forward(", "    def _helper(self):\n        pass\n\n")
    schedule = _submission(sub, SCHEDULE, [("clock_cycles", "return [(\n")], "def clock_cycles(", HELPER)
    report = build_grading_copy(ROOT, sub, tmp_path / "copy")
    copy_comm = (tmp_path / "copy" / COMM).read_text()
    assert _line_of(copy_comm, "import grading") != _line_of(comm, "import grading")       # the lines moved
    notes = "\n".join(report.notes())
    assert f"Problem 1.2 scores 0: {COMM}:{_line_of(comm, 'import grading')}: region 1.2 (train_step)" in notes
    assert (f"{COMM}: `_WORLD` (line {_line_of(comm, '_WORLD = 2')}), `_world` (line {_line_of(comm, 'def _world')}"
            "), defined outside a region, are not graded") in notes
    assert f"{PIPE}: `Pipe._helper` (line {_line_of(pipe, 'def _helper')}), defined outside a region" in notes
    assert f"does not compile (the checks that import it fail): {SCHEDULE}:{_line_of(schedule, 'return [(')}: " \
        in notes
    hint = report.student_lines(report.hints["2.2"][0])
    assert f"at {PIPE}:{_line_of(pipe, 'lambda: self.stages')}: " in hint and "'j', 'xb'" in hint


def test_a_rank_exception_names_the_submitted_line(tmp_path, monkeypatch, fork_servers):
    """``grade`` on a submission with a helper above ``average_gradients`` that the region calls: the NameError
    (the helper is not graded) names the submitted line, in the table's verdicts and in results.json."""
    sub = tmp_path / "sub"
    comm = _submission(sub, COMM, [("average_gradients", "world_size = _world()\n")], "def average_gradients(",
                       HELPER)
    case = next(c for c in all_cases(("1.2",)) if c.name == "p1_comm_2rank")
    monkeypatch.setattr(grade_command, "all_cases", lambda *args, **kwargs: [case])      # one case: ~10 s
    results = tmp_path / "results.json"
    grading_main(["grade", str(sub), "--quiet", "--problem", "1.2", "--timeout", "60", "--json", str(results)])
    data = json.loads(results.read_text())
    where = f"(at {COMM}:{_line_of(comm, 'world_size = _world()')} (in average_gradients))"
    outputs = "\n".join(test["output"] for test in data["tests"])
    assert f"NameError: name '_world' is not defined {where}" in outputs, outputs[:3000]
    assert f"`_world` (line {_line_of(comm, 'def _world')}), defined outside a region" in data["output"]
