"""What the tests of a results.json (Gradescope schema, ``results_json.gradescope_json``) say, for batch and its
reports.

Each test is one criterion: ``name`` (``"1.2.grads: title"``), ``number``
(its sub-problem, ``"1.2"``), ``score``, ``max_score``, ``status``,
``output`` (the failure message, with ``likely cause:`` lines) and
``visibility`` (``visible``, or a later one for a hidden criterion).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from grading.engine.runner import NOT_GRADED, NOT_IMPLEMENTED

HIDDEN_VISIBILITY = ("hidden", "after_due_date", "after_published")     # Gradescope's: shown later, or never
# A test's ``status`` is Gradescope's field, not ``runner.Status``: it has two values, and every verdict but
# ``Status.PASSED`` (failed, not implemented, grader error, not graded) is written as GRADESCOPE_FAILED.
GRADESCOPE_PASSED, GRADESCOPE_FAILED = "passed", "failed"


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
        stub = test.get("status") != GRADESCOPE_PASSED and bool(NOT_IMPLEMENTED.search(str(test.get("output", ""))))
        stubbed[number] = stubbed.get(number, True) and stub
    return {number for number, stub in stubbed.items() if stub}


def judged_tests(data: dict) -> dict:
    """``data`` (a results.json) with only the tests its grade judged: those listed as not graded are left out,
    so what a class counts of a row is what the row's score counts."""
    tests = data.get("tests", []) if isinstance(data, dict) else []
    return {**data, "tests": [t for t in tests if isinstance(t, dict) and not is_not_graded(t)]}


_REASON = re.compile(r"(skipped|cut): (.*?)(?: before Problem (\S+) started| while running Problem (\S+))?$")


@dataclass(frozen=True)
class Verdict:
    """A grade's score as every place states it (``verdict``): results.json, the grade's table, grades.csv (its
    ``score`` cell, notes and criterion columns) and the class report."""

    score: float | None          # the points of the criteria it judged; None (a blank, never 0) when it judged none
    max_score: float             # the points of every criterion it lists
    judged: int                  # criteria judged
    listed: int                  # criteria listed (judged or not graded)
    why: tuple[str, ...] = ()    # one line per reason some criteria were not graded, with their count

    @property
    def partial(self) -> bool:
        """Some listed criteria were not graded (the grade ran out of time, or was stopped)."""
        return self.judged < self.listed

    def marker(self, status: str) -> str:
        """The first entry of a grades.csv row's notes for a grade with ``status`` (a ``grades_csv.RowStatus``):
        ``score left blank (status)``, ``partial score (status): K of N check(s) graded``, or "" for a grade that
        judged every criterion."""
        if self.score is None:
            return f"score left blank ({status})"
        return f"partial score ({status}): {self.judged} of {self.listed} check(s) graded" if self.partial else ""


def verdict(data: dict) -> Verdict:
    """The one verdict on a results.json: its score is the points of the criteria it judged (a criterion listed
    as not graded earns nothing and counts as not judged), blank when it judged none; ``why`` states each reason
    a criterion was not graded once (``runner.skipped_reason``, ``runner.cut_reason``)."""
    tests = data.get("tests", []) if isinstance(data, dict) else []
    tests = [t for t in tests if isinstance(t, dict)] if isinstance(tests, list) else []
    judged = [t for t in tests if not is_not_graded(t)]
    score = sum(float(t.get("score", 0) or 0) for t in judged) if judged else None
    return Verdict(score, sum(float(t.get("max_score", 0) or 0) for t in tests), len(judged), len(tests),
                   not_graded_lines([str(t.get("output", "")) for t in tests if is_not_graded(t)]))


def not_graded_lines(outputs: list[str]) -> tuple[str, ...]:
    """One line per reason in ``outputs`` (the messages of criteria not graded, ``runner.NOT_GRADED`` ...): the
    criteria cut while a problem ran, and those skipped before their problems started, each with their count."""
    cut: dict[str, list[str]] = {}
    skipped: dict[str, list[str]] = {}
    for output in outputs:
        reason = output[len(NOT_GRADED):] if output.startswith(NOT_GRADED) else output
        match = _REASON.fullmatch(reason.strip())
        if match is None:
            cut.setdefault(reason.strip(), []).append("")
        elif match.group(1) == "cut":
            cut.setdefault(match.group(2) + (f" while running Problem {match.group(4)}" if match.group(4) else ""),
                           []).append("")
        else:
            skipped.setdefault(match.group(2), []).append(match.group(3) or "")
    lines = [f"{why}: {len(items)} check(s) cut, not graded" for why, items in cut.items()]
    for why, problems in skipped.items():
        named = ", ".join(dict.fromkeys(p for p in problems if p))
        lines.append(f"{why} before Problem(s) {named} started: {len(problems)} check(s) skipped, not graded"
                     if named else f"{why}: {len(problems)} check(s) skipped, not graded")
    return tuple(lines)
