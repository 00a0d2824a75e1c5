"""The course secret, and whether this is the staff side.

Hidden inputs exist only where the staff-only parts exist (``grading/staff``
and each sub-problem's ``staff.py``: the kit and the staff autograder, never
the starter). They are drawn from the course secret (``--course-secret`` or
``GRADING_COURSE_SECRET``, else the bundle's ``grading/staff/course_secret.txt``;
without one, the kit's fixed defaults), so last term's hidden answers do not
fit this term's inputs.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import random
from pathlib import Path

from common.settings import SECRET_ENV      # its value is read here only (never held in common.settings.Settings)

STAFF_PACKAGE = "grading.staff"
SECRET_FILE = Path(__file__).resolve().parent.parent / "staff" / "course_secret.txt"


SECRET_OPTION = "--course-secret"


def off_the_command_line(argv: list[str]) -> list[str] | None:
    """``argv`` without ``--course-secret S`` (or ``--course-secret=S``), with S put in ``GRADING_COURSE_SECRET``,
    or None when it holds none. A command line is readable by every user of the machine (``/proc/<pid>/cmdline``),
    the environment only by its own; ``python -m grading`` starts itself again with the result."""
    for index, arg in enumerate(argv):
        if arg == SECRET_OPTION and index + 1 < len(argv):
            os.environ[SECRET_ENV] = argv[index + 1]
            return argv[:index] + argv[index + 2:]
        if arg.startswith(SECRET_OPTION + "="):
            os.environ[SECRET_ENV] = arg.split("=", 1)[1]
            return argv[:index] + argv[index + 1:]
    return None


def staff_side() -> bool:
    """True where the staff-only package ``grading.staff`` exists (the kit, the Gradescope bundle)."""
    return importlib.util.find_spec(STAFF_PACKAGE) is not None


def course_secret() -> str:
    """The course secret: the environment variable, else the bundle's secret file, else "" (kit defaults)."""
    if os.environ.get(SECRET_ENV):
        return os.environ[SECRET_ENV]
    try:
        return SECRET_FILE.read_text().strip()
    except OSError:
        return ""


def secret_rng(problem: str, secret: str) -> random.Random:
    """The random source of sub-problem ``problem``'s ("1.1") hidden inputs under ``secret``.

    The same secret always gives the same draw; another secret, other inputs.
    """
    name = "p" + problem.replace(".", "_")
    digest = hashlib.sha256(f"{secret}\x00{name}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))
