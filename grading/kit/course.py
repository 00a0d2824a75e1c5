"""Which problems this course hands out and grades.

The default assignment is Problems 1-3; a course adds the optional Problems 4
and 5 with ``grading release OUT --problems 1,2,3,4`` (and the same on
``gradescope``), which records the choice in ``grading/course.json`` of the
starter or bundle. ``GRADING_PROBLEMS=1,2,3,4`` overrides it for one run.
"""
from __future__ import annotations

import json
import os

from grading import KIT_ROOT

COURSE_RECORD = "grading/course.json"      # relative to the kit root
COURSE_FILE = KIT_ROOT / COURSE_RECORD
PROBLEMS_ENV = "GRADING_PROBLEMS"
PROBLEM_FOLDERS = KIT_ROOT / "grading" / "problems"
DEFAULT_PROBLEMS = ("1", "2", "3")        # the default assignment (100 points)
OPTIONAL_PROBLEMS = ("4", "5")            # a course adds them with --problems


def present_problems() -> list[str]:
    """The problems ("1", "2", ...) whose folders this kit or starter has (``grading/problems/p<N>_<M>_<name>``)."""
    found = {folder.name[1:].split("_")[0] for folder in PROBLEM_FOLDERS.glob("p*_*_*") if folder.is_dir()}
    return sorted(found, key=int)


def parse_problems(text: str) -> tuple[str, ...]:
    """``"1,2,3,4"`` -> ("1", "2", "3", "4"); raises ValueError naming an unknown problem."""
    known = present_problems()
    chosen = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    unknown = [p for p in chosen if p not in known]
    if not chosen or unknown:
        raise ValueError(f"--problems {text!r}: choose from {', '.join(known)} (e.g. 1,2,3,4); "
                         f"{'unknown ' + ', '.join(unknown) if unknown else 'none given'}")
    return chosen


def chosen_problems() -> tuple[str, ...]:
    """The problems of this course: ``GRADING_PROBLEMS``, else ``grading/course.json``, else Problems 1-3."""
    if os.environ.get(PROBLEMS_ENV):
        return parse_problems(os.environ[PROBLEMS_ENV])
    try:
        return parse_problems(",".join(json.loads(COURSE_FILE.read_text())["problems"]))
    except (OSError, ValueError, KeyError, TypeError):
        return DEFAULT_PROBLEMS


__all__ = ["DEFAULT_PROBLEMS", "OPTIONAL_PROBLEMS", "chosen_problems", "parse_problems", "present_problems"]
