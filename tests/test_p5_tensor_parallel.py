"""Problem 5 (tensor parallel): ``pytest -m p5_1`` / ``pytest -m p5_2``. The checks live in grading/checks.

Each case spawns its ranks once per module (a cached run); every criterion is one test.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from grading.kit.course import all_cases
from grading.engine.runner import CriterionResult, run_case
from tests.conftest import KIT_ROOT, assert_passed

# Problem 5 is optional (not in the default course): its cases, hidden ones too on the staff side
CASES = {criterion.id: case for case in all_cases(("5",)) for criterion in case.criteria}


def _params() -> list:
    marks = {"5.1": pytest.mark.p5_1, "5.2": pytest.mark.p5_2}
    return [pytest.param(cid, id=cid, marks=marks[".".join(cid.split(".")[:2])]) for cid in CASES]


@pytest.fixture(scope="module")
def p5_grade(tmp_path_factory):
    """``p5_grade(criterion_id) -> CriterionResult``, spawning each case at most once per module."""
    results: dict[str, dict[str, CriterionResult]] = {}
    work = tmp_path_factory.mktemp("grading_p5")

    def verdict(criterion_id: str) -> CriterionResult:
        case = CASES[criterion_id]
        if case.name not in results:
            results[case.name] = {v.id: v for v in run_case(case, KIT_ROOT, work)}
        return results[case.name][criterion_id]
    return verdict


@pytest.mark.parametrize("criterion_id", _params())
def test_problem_5(criterion_id, p5_grade):
    assert_passed(p5_grade(criterion_id))
