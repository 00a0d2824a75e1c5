"""The class report as one static page (``grades_class_report.html``): what to act on, first.

Sections, top to bottom: who was not counted and why; the score
distribution per problem (public and hidden subtotals, and the histogram);
per criterion the pass rate among the submissions that attempted it and
its largest failure groups with their likely causes; the pass-rate figure;
one row per student, linking to that student's ``results.json`` and
``report.txt`` (relative links, so the folder can be copied or zipped).
Rendered from ``templates/class_report.html``: every piece of student-controlled text (names,
messages) is HTML-escaped.
"""
from __future__ import annotations

from pathlib import Path

from grading.commands.templates import render as render_template

_STUDENT_COLUMNS = ("score", "max_score", "status")


def _groups(row: dict) -> list[dict]:
    """The criterion's failure groups: example message, how many share it, likely cause ("" when none)."""
    groups = []
    k = 1
    while row.get(f"failure_{k}") is not None:
        groups.append({"failure": row[f"failure_{k}"], "sharing": row[f"sharing_{k}"],
                       "cause": row.get(f"likely_cause_{k}", "")})
        k += 1
    return groups


def _students(students: list[dict]) -> tuple[list[str], list[dict]]:
    """The students table's header and rows (by submission name), each row linking to its grade's files."""
    problems = [c for c in dict.fromkeys(k for s in students for k in s) if c.startswith("problem_")]
    rows = []
    for s in sorted(students, key=lambda s: str(s.get("submission", ""))):
        target = str(s.get("results", ""))
        rows.append({"submission": s.get("submission", ""), "results": target,
                     "report": str(Path(target).with_name("report.txt")) if target else "",
                     "cells": [s.get(c, "") for c in (*_STUDENT_COLUMNS, *problems, "notes")]})
    return ["submission", *_STUDENT_COLUMNS, *problems, "notes"], rows


def render(paths: dict[str, Path], rows: list[dict], score_rows: list[dict], submissions: int,
           not_graded: dict[str, str], students: list[dict], notes: dict[str, str]) -> str:
    """The page's HTML. ``paths``: ``class_report.report_paths``; ``rows``: the criterion rows of the report's
    CSV; ``score_rows``: ``score_distribution.summary_rows``; ``submissions``: how many were counted;
    ``not_graded``: name -> status of those that were not; ``students``: grades.csv rows (with their
    ``results`` link); ``notes``: figure kind (``png``, ``scores_png``) -> why it is missing, or ""."""
    student_header, student_rows = _students(students)
    return render_template("class_report.html", submissions=submissions, not_graded=sorted(not_graded.items()),
                           score_rows=score_rows, criteria=[{**r, "groups": _groups(r)} for r in rows],
                           csv=paths["csv"].name, png=paths["png"].name, scores_csv=paths["scores_csv"].name,
                           scores_png=paths["scores_png"].name, notes=notes, student_header=student_header,
                           students=student_rows)
