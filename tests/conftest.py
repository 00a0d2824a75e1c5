"""Shared pytest plumbing: run each grading case once per session and look up criteria.

The tests are thin wrappers: every check lives in ``grading/checks``; a test
only asks the cached runner for one criterion's verdict.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from grading.rubric import all_cases, criteria_for
from grading.runner import CriterionResult, run_case

KIT_ROOT = Path(__file__).resolve().parent.parent


def criterion_params(problem: str) -> list:
    """pytest params (one per criterion of ``problem``), marked ``p<problem with _>``, e.g. p1_2."""
    marker = getattr(pytest.mark, "p" + problem.replace(".", "_"))
    return [pytest.param(c.id, id=c.id, marks=marker) for c in criteria_for(all_cases(), problem)]


@pytest.fixture(scope="session")
def grade(tmp_path_factory):
    """``grade(criterion_id) -> CriterionResult``, spawning each case at most once per session."""
    cases = {c.id: case for case in all_cases() for c in case.criteria}
    results: dict[str, dict[str, CriterionResult]] = {}
    work = tmp_path_factory.mktemp("grading")

    def verdict(criterion_id: str) -> CriterionResult:
        case = cases[criterion_id]
        if case.name not in results:
            results[case.name] = {v.id: v for v in run_case(case, KIT_ROOT, work)}
        return results[case.name][criterion_id]
    return verdict


def assert_passed(result: CriterionResult) -> None:
    """Fail the test with the criterion's own message unless it passed."""
    if not result.passed:
        pytest.fail(f"{result.id} ({result.title}): {result.status}\n{result.message}", pytrace=False)
