"""Problem 2 (pipeline): ``pytest -m p2_1`` / ``p2_2`` / ``p2_3``. The checks live in grading/checks/p2_pipeline.py."""
import pytest

from tests.conftest import assert_passed, criterion_params


@pytest.mark.parametrize("criterion_id",
                         criterion_params("2.1") + criterion_params("2.2") + criterion_params("2.3"))
def test_problem_2(criterion_id, grade):
    assert_passed(grade(criterion_id))
