"""How a criterion says no: ``CheckFailed`` and ``expect``.

Criteria run in the grader process and raise ``CheckFailed`` with a message
that names the quantity, the rank and the difference; ``expect`` is the
one-line form. Nothing else in the grader decides a verdict.
"""
from __future__ import annotations


class CheckFailed(Exception):
    """Raised by a criterion with a message that names what is wrong."""


def expect(condition: bool, message: str) -> None:
    """Raise CheckFailed(message) unless ``condition``."""
    if not condition:
        raise CheckFailed(message)
