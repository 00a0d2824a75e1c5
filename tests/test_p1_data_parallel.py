"""Problem 1 (data parallel): ``pytest -m p1_1`` / ``pytest -m p1_2``. The checks live in grading/checks."""
import pytest

from tests.conftest import assert_passed, criterion_params


@pytest.mark.parametrize("criterion_id", criterion_params("1.1") + criterion_params("1.2"))
def test_problem_1(criterion_id, grade):
    assert_passed(grade(criterion_id))
