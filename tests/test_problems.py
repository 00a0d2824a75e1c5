"""Every criterion of the course's problems, graded exactly as the course grades it.

    pytest -m p1_2          # one sub-problem (markers p1_1 ... p5_2)
    pytest tests/test_problems.py

One parametrised test per criterion; the checks live in
``grading/problems/<folder>/checks.py``. The session splices this folder's
region bodies into a fresh copy of the kit first (``tests/conftest.py``), so
the verdicts are those of ``python -m grading grade``.
"""
import pytest

from tests.conftest import assert_passed, criterion_params, record_points


@pytest.mark.parametrize("criterion_id", criterion_params())
def test_criterion(criterion_id, grade, request):
    result = grade(criterion_id)
    record_points(request, result)
    assert_passed(result)
