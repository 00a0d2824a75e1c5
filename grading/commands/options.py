"""Options several commands share: which problems, and the course secret."""
from __future__ import annotations

import argparse
import os

from grading.kit.course import PROBLEMS_ENV, parse_problems
from grading.kit.secret import SECRET_ENV


def add_course_options(parser: argparse.ArgumentParser) -> None:
    """``--problems`` and ``--course-secret`` on ``parser``."""
    parser.add_argument("--problems", dest="course_problems", help="grade these problems (default: the course's "
                        "choice in grading/course.json, else 1,2,3), e.g. 1,2,3,4")
    parser.add_argument("--course-secret", help=f"derive the hidden inputs from this secret (default: ${SECRET_ENV})")


def apply_course_options(args: argparse.Namespace) -> None:
    """Put --problems and --course-secret in the environment, where every case builder (and batch child) reads them.

    Raises ValueError for an unknown problem. A command that stores the secret itself (``keeps_secret``,
    the Gradescope bundle) leaves the environment alone.
    """
    if getattr(args, "course_problems", None):
        os.environ[PROBLEMS_ENV] = ",".join(parse_problems(args.course_problems))
    if getattr(args, "course_secret", None) and not getattr(args, "keeps_secret", False):
        os.environ[SECRET_ENV] = args.course_secret
