"""Which problems this course hands out and grades.

The default assignment is Problems 1-3; a course adds the optional Problems 4
and 5 with ``grading release OUT --problems 1,2,3,4`` (and the same on
``gradescope``), which records the choice in ``grading/course.json`` of the
starter or bundle. ``GRADING_PROBLEMS=1,2,3,4`` overrides it for one run.

The same record holds what a starter cannot count itself: the hidden points
of every sub-problem (its hidden criteria are staff only) and the points the
course gives the written analysis (``release --analysis_points``).
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


def record_text(problems: tuple[str, ...], hidden_points: dict[str, float], analysis_points: float = 0.0) -> str:
    """The text of ``grading/course.json`` that ``release`` writes: the chosen ``problems``, the hidden points of
    each sub-problem (``{"1.1": 1, ...}``) and the points of the written analysis (0: ungraded)."""
    return json.dumps({"problems": list(problems), "hidden_points": hidden_points,
                       "analysis_points": analysis_points}) + "\n"


def read_record() -> dict:
    """``grading/course.json`` as a dict; ``{}`` where there is none (the kit itself) or it is not a JSON object."""
    try:
        record = json.loads(COURSE_FILE.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def recorded_hidden_points() -> dict[str, float]:
    """Sub-problem ("1.2") -> the points of its hidden checks, as the release recorded them (``{}`` in the kit,
    whose hidden criteria are present and counted directly)."""
    found = read_record().get("hidden_points")
    if not isinstance(found, dict):
        return {}
    return {str(k): float(v) for k, v in found.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def recorded_analysis_points() -> float:
    """The points the course gives the written analysis (``release --analysis_points``); 0 when not recorded."""
    value = read_record().get("analysis_points", 0)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def chosen_problems() -> tuple[str, ...]:
    """The problems of this course: ``GRADING_PROBLEMS``, else ``grading/course.json``, else Problems 1-3."""
    if os.environ.get(PROBLEMS_ENV):
        return parse_problems(os.environ[PROBLEMS_ENV])
    try:
        return parse_problems(",".join(json.loads(COURSE_FILE.read_text())["problems"]))
    except (OSError, ValueError, KeyError, TypeError):
        return DEFAULT_PROBLEMS


__all__ = ["DEFAULT_PROBLEMS", "OPTIONAL_PROBLEMS", "chosen_problems", "parse_problems", "present_problems",
           "read_record", "record_text", "recorded_analysis_points", "recorded_hidden_points"]
