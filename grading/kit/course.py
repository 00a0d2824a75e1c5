"""Which problems this course hands out and grades.

The default assignment is Problems 1-3; ``release`` and ``gradescope`` record a course's choice
(``--problems 1,2,3,4``) in the ``grading/course.json`` of the starter or bundle, with what a starter cannot
count itself: the hidden points of every sub-problem and the points of the written analysis. Problem numbers
from ``EXAMPLE_PROBLEMS_FROM`` up are reserved for the examples of ``docs/adding-a-subproblem.md``.
"""
from __future__ import annotations

import json

from common import ROOT
from common.settings import PROBLEMS_ENV as PROBLEMS_ENV     # re-exported: many callers name course.PROBLEMS_ENV
from common.settings import settings

COURSE_RECORD = "grading/course.json"      # relative to the kit root
COURSE_FILE = ROOT / COURSE_RECORD
PROBLEM_FOLDERS = ROOT / "grading" / "problems"
DEFAULT_PROBLEMS = ("1", "2", "3")        # the default assignment (100 points); every other problem is optional
EXAMPLE_PROBLEMS_FROM = 90                # problems 90, 91, ...: the guide's examples, never a course's


def is_example(problem: str) -> bool:
    """True for a problem ("90") or sub-problem ("90.1") whose number is reserved for examples (>= 90)."""
    number = problem.split(".")[0]
    return number.isdigit() and int(number) >= EXAMPLE_PROBLEMS_FROM


def present_problems() -> list[str]:
    """The problems ("1", "2", ...) whose folders this kit or starter has (``grading/problems/p<N>_<M>_<name>``)."""
    found = {folder.name[1:].split("_")[0] for folder in PROBLEM_FOLDERS.glob("p*_*_*") if folder.is_dir()}
    return sorted(found, key=int)


def parse_problems(text: str, examples: bool = False) -> tuple[str, ...]:
    """``"1,2,3,4"`` -> ("1", "2", "3", "4"); raises ValueError naming an unknown problem, or an example problem
    (``is_example``) unless ``examples`` (only the ``GRADING_PROBLEMS`` override passes it)."""
    known = present_problems()
    chosen = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    unknown = [p for p in chosen if p not in known]
    if not chosen or unknown:
        offered = [p for p in known if examples or not is_example(p)]
        raise ValueError(f"--problems {text!r}: choose from {', '.join(offered)} (e.g. 1,2,3,4); "
                         f"{'unknown ' + ', '.join(unknown) if unknown else 'none given'}")
    reserved = [p for p in chosen if is_example(p)]
    if reserved and not examples:
        raise ValueError(f"--problems {text!r}: Problem {', '.join(reserved)} is an example (problems "
                         f"{EXAMPLE_PROBLEMS_FROM} and up are reserved for docs/adding-a-subproblem.md); "
                         f"a course cannot choose one")
    return chosen


def record_text(problems: tuple[str, ...], hidden_points: dict[str, float], analysis_points: float = 0.0) -> str:
    """The text of ``grading/course.json`` that ``release`` writes: the chosen ``problems``, the hidden points of
    each sub-problem (``{"1.1": 1, ...}``) and the points of the written analysis (0: ungraded). Raises
    ValueError for an example problem (``is_example``) among either: a course record never names one."""
    reserved = [p for p in (*problems, *hidden_points) if is_example(p)]
    if reserved:
        raise ValueError(f"course record: {', '.join(reserved)} is an example (problems {EXAMPLE_PROBLEMS_FROM} "
                         f"and up are reserved for docs/adding-a-subproblem.md), never part of a course")
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
    """The problems of this course: ``GRADING_PROBLEMS`` (which alone may name an example), else
    ``grading/course.json``, else Problems 1-3."""
    if settings().problems:
        return parse_problems(settings().problems, examples=True)
    try:
        return parse_problems(",".join(json.loads(COURSE_FILE.read_text())["problems"]))
    except (OSError, ValueError, KeyError, TypeError):
        return DEFAULT_PROBLEMS


__all__ = ["DEFAULT_PROBLEMS", "EXAMPLE_PROBLEMS_FROM", "chosen_problems", "is_example",
           "parse_problems", "present_problems", "read_record", "record_text", "recorded_analysis_points",
           "recorded_hidden_points"]
