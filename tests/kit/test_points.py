"""Points are stated one way (issue 38, item 3): ``grading.kit.points`` words them for ``list``, the ``grade``
table (each sub-problem's header and TOTAL), the pytest summary and the handout.

A starter's view is made here by pointing the course record at a file that
records the hidden points (as ``release`` writes it) and grading only public
criteria; the staff view grades the hidden ones too. Nothing runs ranks.
"""
from __future__ import annotations

import pytest

from grading.commands import report
from grading.engine.runner import CriterionResult
from grading.kit import course, points
from grading.kit.course import record_text

pytestmark = pytest.mark.kit


def _result(criterion_id: str, max_score: float, score: float, hidden: bool = False) -> CriterionResult:
    problem = ".".join(criterion_id.split(".")[:2])
    return CriterionResult(criterion_id, problem, "a criterion", max_score, score,
                           "passed" if score == max_score else "failed", "", 0.1, hidden)


PUBLIC = [_result("1.1.a", 8, 8), _result("1.1.b", 4, 0), _result("1.2.a", 12, 0)]
HIDDEN = [_result("1.1.a_hidden", 1, 1, hidden=True), _result("1.2.a_hidden", 2, 0, hidden=True)]


@pytest.fixture
def starter_record(tmp_path, monkeypatch):
    """The course record of a starter whose release found 1 hidden point in 1.1 and 2 in 1.2."""
    record = tmp_path / "course.json"
    record.write_text(record_text(("1",), {"1.1": 1, "1.2": 2}, 0))
    monkeypatch.setattr(course, "COURSE_FILE", record)


def test_the_four_ways_a_tally_reads():
    assert str(points.Tally(24, 3)) == "24 public points + 3 hidden points the course adds when it grades (27 in all)"
    assert str(points.Tally(24, 3, earned=8)) == \
        "8/24 public points + 3 hidden points the course adds when it grades (8/27 in all)"
    assert str(points.Tally(24, 3, earned=8, hidden_earned=2)) == \
        "8/24 public points + 2/3 hidden points (10/27 in all)"
    assert str(points.Tally(8, 0, earned=8)) == "8/8 public points, no hidden points"
    assert str(points.Tally(1, 1)) == "1 public point + 1 hidden point the course adds when it grades (2 in all)"
    assert str(points.Tally(2, 1, earned=1, hidden_earned=1)) == "1/2 public points + 1/1 hidden point (2/3 in all)"


def test_a_count_of_points_agrees_with_its_number():
    """What the handout's sentences use for a number of points (the plural is the noun's, never typed by hand)."""
    assert [points.count(n, "hidden") for n in (0, 0.5, 1, 2)] == \
        ["0 hidden points", "0.5 hidden points", "1 hidden point", "2 hidden points"]
    assert points.count(1) == "1 point" and points.count(11) == "11 points"


def test_a_starters_grade_table_states_the_hidden_points_the_course_adds(starter_record):
    table = report.table(PUBLIC).splitlines()
    headers = [table[k + 1].removeprefix("  [") for k, line in enumerate(table) if line.startswith("Problem ")]
    assert headers == ["8/12 public points + 1 hidden point the course adds when it grades (8/13 in all)]",
                       "0/12 public points + 2 hidden points the course adds when it grades (0/14 in all)]"]
    assert table[-1] == "TOTAL 8/24 public points + 3 hidden points the course adds when it grades (8/27 in all)"


def test_the_course_grade_table_states_the_hidden_points_earned(starter_record):
    table = report.table(PUBLIC + HIDDEN).splitlines()
    assert [table[k + 1].removeprefix("  [") for k, line in enumerate(table) if line.startswith("Problem ")] == \
        ["8/12 public points + 1/1 hidden point (9/13 in all)]",
         "0/12 public points + 0/2 hidden points (0/14 in all)]"]
    assert table[-1] == "TOTAL 8/24 public points + 1/3 hidden points (9/27 in all)"


def test_list_and_the_pytest_summary_use_the_same_lines(starter_record):
    from grading.engine.rubric import Criterion

    criteria = [Criterion(r.id, r.title, r.max_score, judge=lambda run: None, reads=()) for r in PUBLIC]
    assert points.problem_lines(criteria, points.worth) == [
        "Problem 1: 24 public points + 3 hidden points the course adds when it grades (27 in all)",
        "TOTAL 24 public points + 3 hidden points the course adds when it grades (27 in all)"]
    assert points.problem_lines(PUBLIC, points.scored) == [
        "Problem 1: 8/24 public points + 3 hidden points the course adds when it grades (8/27 in all)",
        "TOTAL 8/24 public points + 3 hidden points the course adds when it grades (8/27 in all)"]


def test_without_a_course_record_only_the_hidden_criteria_present_count(tmp_path, monkeypatch):
    monkeypatch.setattr(course, "COURSE_FILE", tmp_path / "absent.json")      # the kit: no record
    assert str(points.scored(PUBLIC)) == "8/24 public points, no hidden points"
    assert points.scored(PUBLIC + HIDDEN) == points.Tally(24, 3, 8, 1)


def test_a_fresh_starter_shows_one_line_per_unwritten_function_and_verbose_every_criterion():
    def stub(criterion_id: str, function: str, worth: float) -> CriterionResult:
        message = (f"rank 0: NotImplementedError: Problem 1.2: {function} is not implemented yet (fill in the region "
                   "marked BEGIN_STUDENT 1.2) (at data_parallel/comm.py:66 (in average_gradients))")
        return CriterionResult(criterion_id, "1.2", "a criterion", worth, 0.0, "not_implemented", message, 0.1)
    results = [stub("1.2.a", "average_gradients", 3), _result("1.2.b", 1, 0), stub("1.2.c", "average_gradients", 2),
               stub("1.2.d", "train_step", 1)]
    results[1].message = "a wrong answer"
    lines = report.table(results).splitlines()
    todo = [line for line in lines if line.lstrip().startswith("TODO")]
    assert [line.split()[1:] for line in todo] == [
        "0/5 average_gradients is not implemented yet (BEGIN_STUDENT 1.2): 2 check(s)".split(),
        "0/1 train_step is not implemented yet (BEGIN_STUDENT 1.2): 1 check(s)".split()]
    assert lines.index(todo[0]) < next(i for i, line in enumerate(lines) if "1.2.b" in line) < lines.index(todo[1])
    assert not any("NotImplementedError" in line for line in lines) and "a wrong answer" in "\n".join(lines)
    assert sum("NotImplementedError" in line for line in report.table(results, verbose=True).splitlines()) == 3
