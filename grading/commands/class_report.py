"""What the class got wrong, and what to do about it: the class report next to grades.csv.

``write_class_report`` reads every graded submission's ``results.json`` and writes, per criterion, the pass rate
among the submissions that attempted it and the largest failure groups with their likely causes
(``criterion_stats``: a CSV and a figure), per chosen problem the score distribution with its public and hidden
subtotals (``problem_scores``: a CSV and histograms), and one static page of it all (``render``), what to act on
first.
"""
from __future__ import annotations

import re
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from grading.commands.csv_cells import write_csv
from grading.commands.result_tests import (GRADESCOPE_PASSED, criterion_id, is_hidden, judged_tests, not_attempted,
                                           scored_tests)
from grading.commands.templates import render as render_template
from grading.kit.course import chosen_problems
from common.files import atomic_path, atomic_write
from grading.problems import titles

TOP_GROUPS = 3
COLUMNS = ["criterion", "problem", "title", "points", "visibility", "graded", "not_attempted", "attempted",
           "passed", "pass_rate",
           *[f"{name}_{k}" for k in range(1, TOP_GROUPS + 1) for name in ("failure", "likely_cause", "sharing")]]
SCORE_COLUMNS = ["problem", "sub_problems", "graded", "not_attempted", "attempted", "public_max", "public_mean",
                 "hidden_max", "hidden_mean", "max_score", "mean", "median", "full_marks"]
_NUMBERS = re.compile(r"[-+]?\d+(\.\d+)?([eE][-+]?\d+)?")
_CAUSE = "likely cause:"
_STUDENT_COLUMNS = ("score", "max_score", "status")


def report_paths(out_csv: Path) -> dict[str, Path]:
    """The class report's files for ``out_csv``, next to it (``<stem>_class_report``): ``csv``, ``png`` and
    ``html``, and the score distributions ``scores_csv`` and ``scores_png``."""
    out_csv = Path(out_csv)
    base = out_csv.with_name(out_csv.stem + "_class_report")
    scores = out_csv.with_name(out_csv.stem + "_class_report_scores")
    return {**{kind: base.with_suffix("." + kind) for kind in ("csv", "png", "html")},
            "scores_csv": scores.with_suffix(".csv"), "scores_png": scores.with_suffix(".png")}


# Per criterion: pass rate and failure groups (the report's CSV and its figure).


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
    """Sort key of a (sub-)problem id: numeric parts numerically ("2.10" after "2.9"), any other part after them."""
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


# Per chosen problem: the score distribution, public and hidden subtotals (a CSV and histograms).


@dataclass
class ProblemScores:
    """One problem's subtotals, one entry per graded submission that holds it (``names`` in the same order)."""

    problem: str
    sub_problems: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    public: list[float] = field(default_factory=list)
    hidden: list[float] = field(default_factory=list)
    public_max: float = 0.0
    hidden_max: float = 0.0
    not_attempted: int = 0
    attempted: list[bool] = field(default_factory=list)

    @property
    def totals(self) -> list[float]:
        return [p + h for p, h in zip(self.public, self.hidden)]

    def of_attempted(self, values: list[float]) -> list[float]:
        """``values`` (one per entry) of the submissions that attempted the problem."""
        return [v for v, tried in zip(values, self.attempted) if tried]


def problem_scores(results: dict[str, dict], problems: tuple[str, ...] | None = None) -> list[ProblemScores]:
    """Per chosen problem ("1", "2", ...; default ``course.chosen_problems()``), in that order: the public and
    hidden subtotal of every submission of ``results`` (name -> results.json data) that holds the problem.

    A submission did not attempt a problem when every sub-problem of it it holds is unattempted
    (``result_tests.not_attempted``).
    """
    spread = {p: ProblemScores(p) for p in (problems or chosen_problems())}
    for name in sorted(results):
        skipped = not_attempted(results[name])
        sums: dict[str, list[float]] = {}
        numbers: dict[str, set[str]] = {}
        for test in scored_tests(results[name]):
            number = str(test.get("number", ""))
            top = number.split(".")[0]
            if top not in spread:
                continue
            tally = sums.setdefault(top, [0.0, 0.0, 0.0, 0.0])      # public, hidden, public max, hidden max
            k = 1 if is_hidden(test) else 0
            tally[k] += float(test.get("score", 0) or 0)
            tally[k + 2] += float(test.get("max_score", 0) or 0)
            numbers.setdefault(top, set()).add(number)
        for top, (public, hidden, public_max, hidden_max) in sums.items():
            entry = spread[top]
            entry.names.append(name)
            entry.public.append(public)
            entry.hidden.append(hidden)
            entry.public_max, entry.hidden_max = max(entry.public_max, public_max), max(entry.hidden_max, hidden_max)
            entry.sub_problems = sorted(set(entry.sub_problems) | numbers[top], key=_problem_key)
            entry.not_attempted += numbers[top] <= skipped
            entry.attempted.append(not numbers[top] <= skipped)
    return list(spread.values())


def _mean(values: list[float]) -> str:
    return f"{statistics.fmean(values):.2f}" if values else ""


def summary_rows(spread: list[ProblemScores]) -> list[dict]:
    """One row per problem (columns ``SCORE_COLUMNS``): graded, not attempted, attempted, public and hidden max and
    mean, the total's max, mean and median, and how many submissions earned every point. Means, median and full
    marks count only the submissions that attempted the problem; means are empty when none did."""
    rows = []
    for s in spread:
        totals, top = s.of_attempted(s.totals), s.public_max + s.hidden_max
        rows.append({"problem": s.problem, "sub_problems": " ".join(s.sub_problems), "graded": len(s.totals),
                     "not_attempted": s.not_attempted, "attempted": len(totals), "public_max": f"{s.public_max:g}",
                     "public_mean": _mean(s.of_attempted(s.public)), "hidden_max": f"{s.hidden_max:g}",
                     "hidden_mean": _mean(s.of_attempted(s.hidden)),
                     "max_score": f"{top:g}", "mean": _mean(totals),
                     "median": f"{statistics.median(totals):g}" if totals else "",
                     "full_marks": sum(t >= top for t in totals) if totals else 0})
    return rows


def _bins(top: float, values: list[float]) -> list[float]:
    """Histogram edges over 0..``top``: one bin per point when every value is a whole number and ``top`` is at most
    20 (each bar then reads as "k points"), else ten equal bins."""
    if top <= 20 and all(float(v).is_integer() for v in values):
        return [k - 0.5 for k in range(int(top) + 2)]
    return [top * k / 10 for k in range(11)]


def draw(spread: list[ProblemScores], path: Path) -> str:
    """Write the histograms of every problem that has graded submissions to ``path``; returns "" or why no figure
    was drawn. Per problem, a column: on top the total and the public subtotal on the same bins, below the hidden
    subtotal on an axis of its own (its points are few: on the totals' axis it would be a spike at zero)."""
    shown = [s for s in spread if s.of_attempted(s.totals)]
    if not shown:
        Path(path).unlink(missing_ok=True)
        return "no score distributions: no graded submission attempted a chosen problem"
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        return f"no figure: matplotlib is not available ({exc})"
    fig, axes = plt.subplots(2, len(shown), figsize=(4.2 * len(shown), 5.4), squeeze=False,
                             gridspec_kw={"height_ratios": [3, 2]})
    for column, s in enumerate(shown):
        ax, below = axes[0][column], axes[1][column]
        top = max(s.public_max + s.hidden_max, 1.0)
        totals, public, hidden = s.of_attempted(s.totals), s.of_attempted(s.public), s.of_attempted(s.hidden)
        bins = _bins(top, totals + public)
        ax.hist(totals, bins=bins, color="tab:blue", alpha=0.6, label=f"total (of {top:g})")
        ax.hist(public, bins=bins, histtype="step", linewidth=1.5, color="tab:green",
                label=f"public (of {s.public_max:g})")
        ax.set_title(f"Problem {s.problem} ({len(totals)} attempted of {len(s.totals)})", fontsize=9)
        ax.set_xlabel("points (total and public)", fontsize=8)
        ax.set_ylabel("submissions")
        ax.set_xlim(bins[0], bins[-1])
        ax.legend(fontsize=7, loc="upper left")
        if s.hidden_max > 0:
            hidden_bins = _bins(s.hidden_max, hidden)
            below.hist(hidden, bins=hidden_bins, color="tab:red", alpha=0.6, rwidth=0.9,
                       label=f"hidden (of {s.hidden_max:g})")
            below.set_xlim(hidden_bins[0], hidden_bins[-1])
            below.set_xlabel(f"hidden points (of {s.hidden_max:g})", fontsize=8)
            below.set_ylabel("submissions")
            below.legend(fontsize=7, loc="upper left")
        else:
            below.set_axis_off()
            below.text(0.5, 0.5, "no hidden points in these results", ha="center", va="center", fontsize=8,
                       transform=below.transAxes)
        for a in (ax, below):
            a.yaxis.get_major_locator().set_params(integer=True)
            a.xaxis.get_major_locator().set_params(integer=True)
    fig.tight_layout()
    with atomic_path(path) as scratch:
        fig.savefig(scratch, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return ""


# The page (grades_class_report.html).


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
    """The class report as one static page (``grades_class_report.html``): what to act on, first.

    Sections, top to bottom: who was not counted and why; the score distribution per problem (public and hidden
    subtotals, and the histogram); per criterion the pass rate among the submissions that attempted it and its
    largest failure groups with their likely causes; the pass-rate figure; one row per student, linking to that
    student's ``results.json`` and ``report.txt`` (relative links, so the folder can be copied or zipped).
    Rendered from ``templates/class_report.html``: every piece of student-controlled text (names, messages) is
    HTML-escaped.

    ``paths``: ``report_paths``; ``rows``: the criterion rows of the report's CSV; ``score_rows``:
    ``summary_rows``; ``submissions``: how many were counted; ``not_graded``: name -> status of those that were
    not; ``students``: grades.csv rows (with their ``results`` link); ``notes``: figure kind (``png``,
    ``scores_png``) -> why it is missing, or ""."""
    student_header, student_rows = _students(students)
    return render_template("class_report.html", submissions=submissions, not_graded=sorted(not_graded.items()),
                           score_rows=score_rows, criteria=[{**r, "groups": _groups(r)} for r in rows],
                           csv=paths["csv"].name, png=paths["png"].name, scores_csv=paths["scores_csv"].name,
                           scores_png=paths["scores_png"].name, notes=notes, student_header=student_header,
                           students=student_rows)


# Writing it all.


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
    spread = problem_scores(results, problems)
    write_csv(paths["scores_csv"], SCORE_COLUMNS, summary_rows(spread))
    notes = {"png": _figure(stats, paths["png"]), "scores_png": draw(spread, paths["scores_png"])}
    page = render(paths, rows, summary_rows(spread), len(results), dict(not_graded or {}), list(students or []),
                  notes)
    atomic_write(paths["html"], page)
    return paths
