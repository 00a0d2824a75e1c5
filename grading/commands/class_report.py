"""What the class got wrong, and what to do about it: the class report next to grades.csv.

``write_class_report`` reads every graded submission's ``results.json`` and writes, per criterion, the pass rate
among the submissions that attempted it and the largest failure groups with their likely causes
(``criterion_stats``), per chosen problem the score distribution (``score_distribution``), and one page of it all
(``class_report_page``).
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from grading.commands import class_report_page, score_distribution
from grading.commands.csv_cells import write_csv
from grading.commands.result_tests import (GRADESCOPE_PASSED, criterion_id, is_hidden, judged_tests, not_attempted,
                                           scored_tests)
from common.files import atomic_path, atomic_write
from grading.problems import titles

TOP_GROUPS = 3
COLUMNS = ["criterion", "problem", "title", "points", "visibility", "graded", "not_attempted", "attempted",
           "passed", "pass_rate",
           *[f"{name}_{k}" for k in range(1, TOP_GROUPS + 1) for name in ("failure", "likely_cause", "sharing")]]
_NUMBERS = re.compile(r"[-+]?\d+(\.\d+)?([eE][-+]?\d+)?")
_CAUSE = "likely cause:"


@dataclass
class CriterionStats:
    """One row of the class report: counts over graded submissions, failures of those that attempted it."""

    criterion: str
    problem: str
    title: str
    points: float
    hidden: bool = False
    graded: int = 0
    not_attempted: int = 0
    passed: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)     # (first line, likely cause) per failure

    @property
    def attempted(self) -> int:
        return self.graded - self.not_attempted

    @property
    def pass_rate(self) -> float | None:
        """passed / attempted; None when nobody attempted it."""
        return self.passed / self.attempted if self.attempted else None

    def failure_groups(self, top: int = TOP_GROUPS) -> list[tuple[str, str, int]]:
        """The ``top`` largest failure groups, largest first (ties: first seen): (an example message, the
        group's most frequent likely cause or "", the group's size). Messages are grouped with their numbers
        masked (``max abs diff 3.1e-02`` and ``4.0e-01`` are one mistake)."""
        groups: dict[str, list[tuple[str, str]]] = {}
        for message, cause in self.failures:
            groups.setdefault(_NUMBERS.sub("#", message), []).append((message, cause))
        ranked = sorted(groups.values(), key=len, reverse=True)[:top]      # stable: ties stay in first-seen order
        found = []
        for members in ranked:
            causes = Counter(cause for _, cause in members if cause)
            found.append((members[0][0], causes.most_common(1)[0][0] if causes else "", len(members)))
        return found


def report_paths(out_csv: Path) -> dict[str, Path]:
    """The class report's files for ``out_csv``, next to it (``<stem>_class_report``): ``csv``, ``png`` and
    ``html``, and the score distributions ``scores_csv`` and ``scores_png``."""
    out_csv = Path(out_csv)
    base = out_csv.with_name(out_csv.stem + "_class_report")
    scores = out_csv.with_name(out_csv.stem + "_class_report_scores")
    return {**{kind: base.with_suffix("." + kind) for kind in ("csv", "png", "html")},
            "scores_csv": scores.with_suffix(".csv"), "scores_png": scores.with_suffix(".png")}


def _split_message(output: str) -> tuple[str, str]:
    """(the first line of a failure message, its likely cause lines joined), each cut to 300 characters."""
    lines = [line.strip() for line in str(output).splitlines() if line.strip()]
    causes = [line[len(_CAUSE):].strip() for line in lines if line.lower().startswith(_CAUSE)]
    first = next((line for line in lines if not line.lower().startswith(_CAUSE)), "")
    return first[:300], "; ".join(dict.fromkeys(causes))[:300]


def criterion_stats(results: dict[str, dict]) -> list[CriterionStats]:
    """Per criterion (in the order the results list them, grouped by problem): how many graded, not attempted,
    passed, and why the others failed. ``results`` maps a submission name to its results.json data.

    A criterion passed when its status is ``passed``. In a sub-problem the submission did not attempt (every
    criterion stopped at a starter stub, ``result_tests.not_attempted``) it counts neither as passed nor as
    failed, so a class of unopened starters never becomes the most common failure.
    """
    stats: dict[str, CriterionStats] = {}
    for name in sorted(results):
        skipped = not_attempted(results[name])
        for test in scored_tests(results[name]):
            cid, number = criterion_id(test), str(test.get("number", ""))
            title = str(test.get("name", "")).split(": ", 1)[-1]
            entry = stats.setdefault(cid, CriterionStats(cid, number, title, float(test.get("max_score", 0)),
                                                         is_hidden(test)))
            entry.graded += 1
            if number in skipped:
                entry.not_attempted += 1
            elif test.get("status") == GRADESCOPE_PASSED:
                entry.passed += 1
            else:
                entry.failures.append(_split_message(str(test.get("output", ""))))
    order = list(stats)
    return sorted(stats.values(), key=lambda s: (_problem_key(s.problem), order.index(s.criterion)))


def _problem_key(problem: str) -> list[tuple[int, int | str]]:
    return [(0, int(x)) if x.isdigit() else (1, x) for x in problem.split(".")]


def rows_of(stats: list[CriterionStats]) -> list[dict]:
    """The CSV rows of ``stats`` (columns ``COLUMNS``; pass_rate empty where nobody attempted the criterion)."""
    rows = []
    for s in stats:
        row = {"criterion": s.criterion, "problem": s.problem, "title": s.title, "points": f"{s.points:g}",
               "visibility": "hidden" if s.hidden else "public", "graded": s.graded,
               "not_attempted": s.not_attempted, "attempted": s.attempted, "passed": s.passed,
               "pass_rate": "" if s.pass_rate is None else f"{s.pass_rate:.3f}"}
        for k, (message, cause, sharing) in enumerate(s.failure_groups(), start=1):
            row.update({f"failure_{k}": message, f"likely_cause_{k}": cause, f"sharing_{k}": sharing})
        rows.append(row)
    return rows


def _figure(stats: list[CriterionStats], path: Path) -> str:
    """Write the pass-rate figure; returns "" or why it was not drawn.

    One bar per criterion, sized to its rows (the plot takes the figure's width; the problems' legend sits above
    it), each labelled with its rate and ``passed/attempted``; the rate axis is drawn at the top and the bottom,
    with gridlines. A criterion nobody attempted has no bar and says so."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        return f"no figure: matplotlib is not available ({exc})"
    problems = list(dict.fromkeys(s.problem for s in stats))
    colours = plt.get_cmap("tab10")
    legend_rows = -(-len(problems) // 2)
    fig, ax = plt.subplots(figsize=(8, 1.3 + 0.22 * legend_rows + 0.24 * max(1, len(stats))))
    y = list(range(len(stats)))[::-1]
    for k, problem in enumerate(problems):
        picked = [(yy, s) for yy, s in zip(y, stats) if s.problem == problem]
        ax.barh([yy for yy, _ in picked], [s.pass_rate or 0.0 for _, s in picked], height=0.7,
                color=colours(k % 10), label=f"{problem} {titles().get(problem, '')}".strip())
    for yy, s in zip(y, stats):
        rate = s.pass_rate
        label = "not attempted" if rate is None else f"{100 * rate:.0f} % ({s.passed}/{s.attempted})"
        inside = rate is not None and rate > 0.8
        ax.text(rate - 0.01 if inside else (rate or 0.0) + 0.01, yy, label, va="center", fontsize=7,
                ha="right" if inside else "left", color="white" if inside else "black")
    ax.set_yticks(y, [s.criterion + (" (hidden)" if s.hidden else "") for s in stats], fontsize=7)
    ax.set_ylim(-0.6, len(stats) - 0.4)
    ax.set_xlim(0, 1)
    ax.set_xticks([k / 5 for k in range(6)], [f"{20 * k} %" for k in range(6)], fontsize=8)
    ax.tick_params(axis="x", top=True, labeltop=True)
    ax.grid(axis="x", alpha=0.35)
    ax.set_axisbelow(True)
    ax.set_xlabel("pass rate among the submissions that attempted the sub-problem", fontsize=8)
    if stats:
        ax.legend(fontsize=7, ncol=2, loc="lower left", bbox_to_anchor=(0.0, 1.06, 1.0, 0.0), mode="expand",
                  borderaxespad=0.0, frameon=False, title="Pass rate per criterion, by problem",
                  title_fontproperties={"size": 9, "weight": "bold"})
    fig.tight_layout()
    with atomic_path(path) as scratch:
        fig.savefig(scratch, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return ""


def write_class_report(out_csv: Path, results: dict[str, dict], not_graded: dict[str, str] | None = None,
                       students: list[dict] | None = None, problems: tuple[str, ...] | None = None
                       ) -> dict[str, Path]:
    """Write the class report of ``results`` (graded submission -> results.json data) next to ``out_csv``.

    A submission whose grade did not finish counts with the criteria it judged (``result_tests.judged_tests``),
    as its score does; ``not_graded`` (submission -> status) are named on the page and count nowhere.
    ``students`` are the rows of ``grades.csv`` (with their ``results`` link, relative to ``out_csv``'s folder)
    for the page's table of students; ``problems`` the course's chosen problems for the score distributions (default
    ``course.chosen_problems()``). Returns the report's paths (``report_paths``); a figure is left out (and
    the page says why) when matplotlib is missing.
    """
    paths = report_paths(out_csv)
    results = {name: judged_tests(data) for name, data in results.items()}   # what each row's score counts
    stats = criterion_stats(results)
    rows = rows_of(stats)
    write_csv(paths["csv"], COLUMNS, rows)
    spread = score_distribution.problem_scores(results, problems)
    write_csv(paths["scores_csv"], score_distribution.COLUMNS, score_distribution.summary_rows(spread))
    notes = {"png": _figure(stats, paths["png"]), "scores_png": score_distribution.draw(spread, paths["scores_png"])}
    page = class_report_page.render(paths, rows, score_distribution.summary_rows(spread), len(results),
                                    dict(not_graded or {}), list(students or []), notes)
    atomic_write(paths["html"], page)
    return paths
