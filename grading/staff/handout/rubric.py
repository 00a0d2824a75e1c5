"""Points of the handout, read from the rubric (``grading.problems.all_cases``), never typed by hand.

The same criteria ``python -m grading list`` sums, stated the same way
(``grading.kit.points``): a sub-problem's public points are those of its
public criteria, its hidden points those of its hidden twins (``<id>_hidden``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from grading.kit import points
from grading.problems import all_cases, titles

HIDDEN_SUFFIX = " (hidden inputs)"


@dataclass
class SubPoints:
    """One sub-problem's share of the rubric: its criteria (public and hidden) and what the hidden ones rerun."""

    id: str                                       # "1.2"
    title: str
    criteria: list = field(default_factory=list)
    hidden_titles: list[str] = field(default_factory=list)   # the criteria that also run on hidden inputs

    @property
    def problem(self) -> str:
        return self.id.split(".")[0]

    @property
    def tally(self) -> points.Tally:
        """Its public and hidden points, counted from its criteria (the kit has the hidden ones)."""
        return points.worth(self.criteria, recorded={})


def sub_points(problems: tuple[str, ...]) -> dict[str, SubPoints]:
    """Sub-problem id -> its points, for every sub-problem of ``problems``, in rubric order (hidden included)."""
    names = titles()
    found: dict[str, SubPoints] = {}
    for case in all_cases(problems):
        for criterion in case.criteria:
            entry = found.setdefault(criterion.problem, SubPoints(criterion.problem, names[criterion.problem]))
            entry.criteria.append(criterion)
            if criterion.hidden:
                title = criterion.title.removesuffix(HIDDEN_SUFFIX)
                if title not in entry.hidden_titles:
                    entry.hidden_titles.append(title)
    return dict(sorted(found.items(), key=lambda item: [int(x) for x in item[0].split(".")]))


def problem_points(rows: dict[str, SubPoints], problem: str | None = None) -> points.Tally:
    """The points of Problem ``problem`` ("1"), summed over its sub-problems in ``rows``; None: of all ``rows``."""
    mine = [c for row in rows.values() if problem is None or row.problem == problem for c in row.criteria]
    return points.worth(mine, recorded={})


def marker(sub_problem: str) -> str:
    """The pytest marker of a sub-problem: ``p1_2`` for "1.2" (``tests/conftest.py`` registers them)."""
    return "p" + sub_problem.replace(".", "_")


def points_table(rows: dict[str, SubPoints], problem: str) -> str:
    """The markdown table of Problem ``problem``'s sub-problems: public points, hidden points, what the hidden
    part runs again."""
    lines = ["| sub-problem | what | public points | hidden points | run again on hidden inputs |",
             "|---|---|---|---|---|"]
    for row in rows.values():
        if row.problem == problem:
            again = "; ".join(row.hidden_titles) or "none"
            tally = row.tally
            lines.append(f"| {row.id} | {_cell(row.title)} | {tally.public:g} | {tally.hidden:g} | {_cell(again)} |")
    total = problem_points(rows, problem)
    lines.append(f"| **Problem {problem}** | | **{total.public:g}** | **{total.hidden:g}** | |")
    return "\n".join(lines)


def _cell(text: str) -> str:
    """``text`` safe inside a markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def markers_line(rows: dict[str, SubPoints], problem: str) -> str:
    """``python -m pytest -m "p1_1 or p1_2"``: the command that runs every check of Problem ``problem``."""
    marks = [marker(r.id) for r in rows.values() if r.problem == problem]
    selector = marks[0] if len(marks) == 1 else '"' + " or ".join(marks) + '"'
    return f"python -m pytest -m {selector}"
