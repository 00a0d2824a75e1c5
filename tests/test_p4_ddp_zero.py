"""Problem 4 (DDP, ZeRO-1, sharded checkpoints): ``pytest -m p4_1`` / ``p4_2`` / ``p4_3``.

Thin wrappers: the checks live in ``grading/checks/p4_*.py``; each case is
spawned once per module and every test reads one criterion's verdict.
"""
from __future__ import annotations

import importlib.util

import pytest

from grading.problems.p4_1_ddp import checks as p4_1_ddp
from grading.problems.p4_2_zero1 import checks as p4_2_zero1
from grading.problems.p4_3_checkpoint import checks as p4_3_checkpoint
from grading.engine.runner import run_case
from tests.conftest import KIT_ROOT, assert_passed

CASES = [*p4_1_ddp.CASES, *p4_2_zero1.CASES, *p4_3_checkpoint.CASES]
if importlib.util.find_spec("grading.hidden") is not None:     # staff side: the hidden cases too
    from grading.hidden import p4_hidden
    CASES += p4_hidden.CASES

PARAMS = [pytest.param(case.name, c.id, id=c.id, marks=getattr(pytest.mark, "p" + c.problem.replace(".", "_")))
          for case in CASES for c in case.criteria]


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    """``verdicts(case_name) -> {criterion id: CriterionResult}``, each case spawned at most once per module."""
    by_name = {case.name: case for case in CASES}
    cache: dict = {}
    work = tmp_path_factory.mktemp("p4")

    def get(name: str) -> dict:
        if name not in cache:
            cache[name] = {v.id: v for v in run_case(by_name[name], KIT_ROOT, work)}
        return cache[name]
    return get


@pytest.mark.parametrize("case_name, criterion_id", PARAMS)
def test_problem_4(case_name, criterion_id, verdicts):
    assert_passed(verdicts(case_name)[criterion_id])
