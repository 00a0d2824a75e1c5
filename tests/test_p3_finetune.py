"""Problem 3 (fine-tuning): ``pytest -m p3_1`` / ``p3_2`` / ``p3_3``. The checks live in grading/checks."""
import pytest

from tests.conftest import assert_passed, criterion_params


@pytest.mark.parametrize("criterion_id", criterion_params("3.1") + criterion_params("3.2") + criterion_params("3.3"))
def test_problem_3(criterion_id, grade):
    assert_passed(grade(criterion_id))
