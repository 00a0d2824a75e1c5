"""grades.csv's columns: a row per submission, its problems' points, then a column per criterion judged.

``base_columns`` are a course's fixed columns (``HEAD``, one ``problem_X.Y`` per chosen sub-problem, ``TAIL``);
``criterion_cells`` the last ones of a row, ``columns_of`` the header of a whole class; ``RowStatus`` the values
of its ``status`` column.
"""
from __future__ import annotations

import re

from grading.commands.result_tests import criterion_id, is_not_graded
from grading.engine.runner import TextEnum
from grading.kit.course import chosen_problems
from grading.problems import titles

HEAD = ["submission", "score", "max_score", "status", "exit_code", "seconds"]
TAIL = ["notes", "results"]                # then the criterion columns


class RowStatus(TextEnum):
    """How one submission's whole grade ended: a grades.csv row's ``status`` (not a criterion's ``runner.Status``).
    A ``str``: it compares, hashes, prints and is written as its value, the text the CSV holds."""

    PASSED = "passed"                # every criterion passed (exit code 0)
    FAILED = "failed"                # some criterion failed (exit code 1)
    REJECTED = "rejected"            # the submission could not be opened: nothing graded, no criterion cells (exit 2)
    INCOMPLETE = "incomplete"        # nothing failed, but some work is not implemented (exit code 3)
    GRADER_ERROR = "grader_error"    # the grader failed or did not finish by itself (exit code 4, a signal, a crash)
    TIMEOUT = "timeout"              # the grade ran out of time: killed at its limit, or criteria left not graded


def problem_columns(problems: tuple[str, ...] | None = None) -> list[str]:
    """``problem_X.Y`` for every sub-problem of the chosen ``problems`` (default ``course.chosen_problems()``)."""
    chosen = problems or chosen_problems()
    return [f"problem_{p}" for p in titles() if p.split(".")[0] in chosen]


def base_columns(problems: tuple[str, ...] | None = None) -> list[str]:
    """grades.csv's first columns: ``HEAD``, the chosen problems' columns, ``TAIL``."""
    return HEAD + problem_columns(problems) + TAIL


def is_criterion_column(column: str) -> bool:
    """Whether a grades.csv key is a criterion's points (the columns after ``TAIL``)."""
    return column not in HEAD and column not in TAIL and not column.startswith("problem_")


def criterion_cells(data: dict) -> dict[str, str]:
    """Criterion id -> points earned, for every test of a results.json with points to earn that was graded (the
    CSV's last columns; a criterion listed as not graded gets none).

    ``row_of`` adds them for every submission that was not rejected (none where its grade judged nothing).
    """
    return {criterion_id(t): f"{float(t.get('score', 0.0)):g}" for t in data.get("tests", [])
            if isinstance(t, dict) and float(t.get("max_score", 0) or 0) > 0 and not is_not_graded(t)}


def columns_of(rows: list[dict], problems: tuple[str, ...] | None = None) -> list[str]:
    """``base_columns(problems)``, then every criterion key of ``rows`` in first-seen order, grouped by problem
    (problem columns of problems not chosen are left out)."""
    extra = list(dict.fromkeys(k for row in sorted(rows, key=lambda r: r["submission"]) for k in row
                               if is_criterion_column(k)))
    return base_columns(problems) + sorted(extra, key=lambda k: (_problem_key(k), extra.index(k)))


def _problem_key(column: str) -> list[tuple[int, int | str]]:
    """Sort key of an extra column: its problem ("1.2.grads" -> 1, 2), else its first word ("benchmarks")."""
    head = re.split(r"[._]", column)
    return [(0, int(x)) for x in head[:2] if x.isdigit()] or [(1, head[0])]
