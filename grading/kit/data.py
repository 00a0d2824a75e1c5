"""The data the checks are fed: public fixtures, and hidden inputs on the staff side.

Public criteria compare student results with expected values recorded as
data in ``grading/fixtures/<name>.json``. Those files are generated from the
staff references (``grading/hidden/answers.py``) by ``python -m grading
fixtures`` and written fresh into every release; a kit test checks that the
committed files match the references. The starter therefore holds expected
*values* for the public inputs, never code that computes them.

Hidden inputs exist only where ``grading/hidden`` does (the kit and the staff
autograder, never the starter). They are derived from the course secret
(``--course-secret`` or ``GRADING_COURSE_SECRET``; without one, the kit's
fixed defaults), so last term's hidden answers do not fit this term's inputs.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

FIXTURE_DIR = Path(__file__).resolve().parent.parent / "fixtures"
SECRET_ENV = "GRADING_COURSE_SECRET"
SECRET_FILE = Path(__file__).resolve().parent.parent / "hidden" / "course_secret.txt"


def fixture_key(*args: Any) -> str:
    """The key of one call's recorded result in a fixture: its arguments joined by commas (``"10,3,0"``)."""
    return ",".join(str(a) for a in args)


@functools.cache
def fixture(name: str) -> Any:
    """The public fixture ``grading/fixtures/<name>.json`` (JSON lists/dicts/numbers)."""
    path = FIXTURE_DIR / f"{name}.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} is missing: run `python -m grading fixtures` (staff) to write it") from None


def staff_side() -> bool:
    """True where the staff-only package ``grading.hidden`` exists (the kit, the Gradescope bundle)."""
    return importlib.util.find_spec("grading.hidden") is not None


def course_secret() -> str:
    """The course secret: the environment variable, else the bundle's secret file, else "" (kit defaults)."""
    if os.environ.get(SECRET_ENV):
        return os.environ[SECRET_ENV]
    try:
        return SECRET_FILE.read_text().strip()
    except OSError:
        return ""


def hidden(name: str) -> Any:
    """The hidden inputs (and staff expected values) of ``name`` for the current course secret; None in a starter."""
    if not staff_side():
        return None
    staff = importlib.import_module("grading.hidden.inputs")
    return staff.hidden_data(name, course_secret())
