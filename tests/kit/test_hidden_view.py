"""A failed hidden criterion tells a student the kind of input and the likely cause, never a secret value."""
from __future__ import annotations

import re

from grading.commands.results_json import gradescope_json
from grading.kit.hidden_view import GRADER_ERROR_HIDDEN, student_view
from grading.engine.runner import CriterionResult
from grading.problems import folders, sub_problem

MESSAGE = """clock_cycles(14, 8) yielded 20 cycle(s), expected 21 (at pipeline/schedule.py:41 (in clock_cycles))
Traceback (most recent call last):
  File "pipeline/schedule.py", line 41, in clock_cycles
tensor([14.0000, 8.0000])
pattern: only rank 3 differs (rank 0, 1, 2 match)
likely cause: a sum without the division by the world size (every gradient is 4 x the expected one)"""


def _numbers(text: str) -> set[str]:
    return set(re.findall(r"(?<![A-Za-z_\d])\d+(?:\.\d+)?", text))


def test_student_view_keeps_the_kind_and_the_likely_cause_and_masks_every_number():
    view = student_view(MESSAGE, "more micro-batches than stages")
    lines = view.splitlines()
    assert lines[0].startswith("failed on the hidden inputs (more micro-batches than stages): clock_cycles(…, …) "
                               "yielded … cycle(s), expected …"), view
    assert "pipeline/schedule.py:41" in lines[0]                      # the student's own line is no secret
    assert lines[1] == "pattern: only rank … differs (rank …, …, … match)"
    assert lines[2].startswith("likely cause: a sum without the division by the world size")
    assert "staff" in lines[-1] and len(lines) == 4                     # no traceback, no tensor
    assert _numbers(view.replace("schedule.py:41", "")) == set(), view


def test_names_keep_their_digits_and_a_view_without_kind_still_says_hidden():
    view = student_view("grad of h.6.mlp.c_fc.weight in GPT2 x_1 differs by 0.25", "")
    assert view.startswith("failed on the hidden inputs: grad of h.….mlp.c_fc.weight in GPT2 x_1 differs by …")


def _result(status: str, message: str, hidden: bool) -> CriterionResult:
    return CriterionResult("2.1.schedule" + ("_hidden" if hidden else ""), "2.1", "the waves", 1.0, 0.0, status,
                           message, 0.1, hidden, "more micro-batches than stages" if hidden else "")


def test_results_json_shows_students_the_view_of_hidden_failures_only():
    stub = "NotImplementedError: Problem 2.1: clock_cycles"
    crash = "grader error while judging:\nKeyError: (14, 8)"
    tests = gradescope_json([_result("failed", MESSAGE, False), _result("failed", MESSAGE, True),
                             _result("not_implemented", stub, True), _result("grader_error", crash, True)])["tests"]
    assert tests[0]["output"] == MESSAGE                               # public: the whole message
    assert tests[1]["output"] == student_view(MESSAGE, "more micro-batches than stages")
    assert "14" not in tests[1]["output"] and tests[1]["visibility"] != "visible"
    assert tests[2]["output"] == stub                                  # an unfinished stub names no input
    assert tests[3]["output"] == GRADER_ERROR_HIDDEN                   # a judge's traceback may name one


def test_every_sub_problem_with_hidden_criteria_says_their_kind_in_a_students_words():
    for problem in folders():
        staff = sub_problem(problem).staff()
        if staff is not None and getattr(staff, "HIDDEN_POINTS", None):
            kind = sub_problem(problem).hidden_kind
            assert kind and kind == kind.strip() and "\n" not in kind, f"{problem}: HIDDEN_KIND {kind!r}"


def test_hidden_text_inputs_and_the_shape_of_hidden_lists_are_masked():
    view = student_view("apply_lora(model, ['embed', 'blocks.3.fc'], rank=3, alpha=6) raised TypeError", "")
    assert "apply_lora(model, […], rank=…, alpha=…) raised TypeError" in view and "embed" not in view, view
    view = student_view("clock_cycles(3, 2) yielded [[(0, 0)], [(1, 0), (0, 1)], [(2, 0), (1, 1)]]", "")
    assert view.splitlines()[0].endswith("yielded […]"), view        # no count of cycles or pairs
    assert student_view("rank 1's grad of 'fc' differs", "").startswith(
        "failed on the hidden inputs: rank …'s grad of '…' differs")


def _leaves(value) -> list:
    if isinstance(value, dict):
        return [leaf for item in value.items() for part in item for leaf in _leaves(part)]
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


def test_no_sub_problems_hidden_input_shows_through_a_message_that_prints_it():
    from grading.engine.rubric import HIDDEN
    from grading.kit.typed import to_data
    for problem in folders():
        sub = sub_problem(problem)
        staff = sub.staff()
        if staff is None or not hasattr(staff, "hidden_inputs") or sub.inputs is None:
            continue
        data = to_data(sub.inputs_for(HIDDEN))
        view = student_view(f"run({data!r}) failed on {data!r}", "")
        texts = [leaf for leaf in _leaves(data) if isinstance(leaf, str) and len(leaf) > 1]
        assert not [t for t in texts if t in view.split(":", 1)[1]], (problem, view)
        assert not re.search(r"\d", view.split(":", 1)[1]), (problem, view)
