"""What the tests of a results.json (Gradescope schema, ``report.gradescope_json``) say, for batch and its reports.

Each test is one criterion: ``name`` (``"1.2.grads: title"``), ``number``
(its sub-problem, ``"1.2"``), ``score``, ``max_score``, ``status``,
``output`` (the failure message, with ``likely cause:`` lines) and
``visibility`` (``visible``, or a later one for a hidden criterion).
"""
from __future__ import annotations

from grading.engine.runner import NOT_GRADED, NOT_IMPLEMENTED

HIDDEN_VISIBILITY = ("hidden", "after_due_date", "after_published")     # Gradescope's: shown later, or never


def criterion_id(test: dict) -> str:
    """The criterion id of a results.json test (``"1.2.grads_2rank: title"`` -> ``"1.2.grads_2rank"``)."""
    return str(test.get("name", "")).split(": ", 1)[0].strip()


def is_hidden(test: dict) -> bool:
    """Whether a results.json test is a hidden criterion (Gradescope shows it later, or never)."""
    return test.get("visibility") in HIDDEN_VISIBILITY


def is_not_graded(test: dict) -> bool:
    """Whether a results.json test is a criterion its grade never reached (output ``runner.NOT_GRADED`` ...)."""
    return str(test.get("output", "")).startswith(NOT_GRADED)


def scored_tests(data: dict) -> list[dict]:
    """The tests of a results.json with points to earn (0-point entries, e.g. thresholds that do not apply,
    are left out); [] for anything that is not a results.json."""
    tests = data.get("tests", []) if isinstance(data, dict) else []
    tests = tests if isinstance(tests, list) else []
    return [t for t in tests if isinstance(t, dict) and float(t.get("max_score", 0) or 0) > 0]


def not_attempted(data: dict) -> set[str]:
    """The sub-problems ("1.2") a results.json shows unattempted: every criterion of it failed at a starter stub
    (``runner.NOT_IMPLEMENTED``, ``NotImplementedError: Problem X.Y``: the runner's own test of unfinished work).

    A sub-problem with one criterion that got further (passed, or failed otherwise) was attempted.
    """
    stubbed: dict[str, bool] = {}
    for test in scored_tests(data):
        number = str(test.get("number", ""))
        stub = test.get("status") != "passed" and bool(NOT_IMPLEMENTED.search(str(test.get("output", ""))))
        stubbed[number] = stubbed.get(number, True) and stub
    return {number for number, stub in stubbed.items() if stub}
