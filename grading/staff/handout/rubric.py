"""Points of the handout, read from the rubric (``grading.problems.all_cases``), never typed by hand.

What ``python -m grading list`` prints is the same sum over the same
criteria: a sub-problem's points are those of its public criteria plus its
hidden twins (``<id>_hidden``), and the hidden share is the latter alone.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from grading.problems import all_cases, titles

HIDDEN_SUFFIX = " (hidden inputs)"


@dataclass
class SubPoints:
    """One sub-problem's share of the rubric."""

    id: str                                       # "1.2"
    title: str
    points: float = 0.0                           # public + hidden
    hidden: float = 0.0
    hidden_titles: list[str] = field(default_factory=list)   # the criteria that also run on hidden inputs

    @property
    def problem(self) -> str:
        return self.id.split(".")[0]


def sub_points(problems: tuple[str, ...]) -> dict[str, SubPoints]:
    """Sub-problem id -> its points, for every sub-problem of ``problems``, in rubric order (hidden included)."""
    names = titles()
    found: dict[str, SubPoints] = {}
    for case in all_cases(problems):
        for criterion in case.criteria:
            entry = found.setdefault(criterion.problem, SubPoints(criterion.problem, names[criterion.problem]))
            entry.points += criterion.points
            if criterion.hidden:
                entry.hidden += criterion.points
                title = criterion.title.removesuffix(HIDDEN_SUFFIX)
                if title not in entry.hidden_titles:
                    entry.hidden_titles.append(title)
    return dict(sorted(found.items(), key=lambda item: [int(x) for x in item[0].split(".")]))


def problem_points(rows: dict[str, SubPoints], problem: str) -> tuple[float, float]:
    """``(points, hidden points)`` of Problem ``problem`` ("1"), summed over its sub-problems in ``rows``."""
    mine = [row for row in rows.values() if row.problem == problem]
    return sum(r.points for r in mine), sum(r.hidden for r in mine)


def marker(sub_problem: str) -> str:
    """The pytest marker of a sub-problem: ``p1_2`` for "1.2" (``tests/conftest.py`` registers them)."""
    return "p" + sub_problem.replace(".", "_")


def points_table(rows: dict[str, SubPoints], problem: str) -> str:
    """The markdown table of Problem ``problem``'s sub-problems: points, hidden points, what the hidden part runs."""
    lines = ["| sub-problem | what | points | of them hidden | run again on hidden inputs |", "|---|---|---|---|---|"]
    for row in rows.values():
        if row.problem == problem:
            again = "; ".join(row.hidden_titles) or "none"
            lines.append(f"| {row.id} | {_cell(row.title)} | {row.points:g} | {row.hidden:g} | {_cell(again)} |")
    total, hidden = problem_points(rows, problem)
    lines.append(f"| **Problem {problem}** | | **{total:g}** | **{hidden:g}** | |")
    return "\n".join(lines)


def _cell(text: str) -> str:
    """``text`` safe inside a markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def markers_line(rows: dict[str, SubPoints], problem: str) -> str:
    """``python -m pytest -m "p1_1 or p1_2"``: the command that runs every check of Problem ``problem``."""
    marks = [marker(r.id) for r in rows.values() if r.problem == problem]
    selector = marks[0] if len(marks) == 1 else '"' + " or ".join(marks) + '"'
    return f"python -m pytest -m {selector}"
