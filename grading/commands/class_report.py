"""What the class got wrong: per criterion, the pass rate and the most common failure, next to grades.csv.

``write_class_report(out_csv, results)`` reads every graded submission's
``results.json`` (Gradescope schema, as ``batch`` keeps them) and writes,
next to ``grades.csv``::

    grades_class_report.csv    criterion, problem, title, points, graded, passed, pass_rate,
                               common_failure, likely_cause, sharing
    grades_class_report.png    pass rate per criterion, grouped (coloured) by problem
    grades_class_report.html   the table and the figure on one page (the similarity report links to it)

Only graded submissions count (``batch.GRADED``: not a rejected one, nor one
whose grader did not finish; the page names those). A criterion counts as
graded for a submission when its results hold it with points to earn; it
passed when its status is ``passed``, which in this kit means full points.
Failure messages are grouped with their numbers masked (``max abs diff
3.1e-02`` and ``4.0e-01`` are one mistake); ``common_failure`` is the first
line of the largest group (an example of it), ``sharing`` how many
submissions failed with it, ``likely_cause`` the grader's hint when it gave one.
"""
from __future__ import annotations

import html
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from grading.commands.csv_cells import write_csv
from grading.kit.files import atomic_path, atomic_write
from grading.problems import titles

COLUMNS = ["criterion", "problem", "title", "points", "graded", "passed", "pass_rate", "common_failure",
           "likely_cause", "sharing"]
_NUMBERS = re.compile(r"[-+]?\d+(\.\d+)?([eE][-+]?\d+)?")
_CAUSE = "likely cause:"


@dataclass
class CriterionStats:
    """One row of the class report."""

    criterion: str
    problem: str
    title: str
    points: float
    graded: int = 0
    passed: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)     # (first line, likely cause) per failure

    @property
    def pass_rate(self) -> float:
        return self.passed / self.graded if self.graded else 0.0

    def common_failure(self) -> tuple[str, str, int]:
        """(an example message of the largest failure group, its likely cause, the group's size); empty when none."""
        if not self.failures:
            return "", "", 0
        groups = Counter(_NUMBERS.sub("#", message) for message, _ in self.failures)
        key, count = max(groups.items(), key=lambda item: (item[1], -list(groups).index(item[0])))
        message, cause = next(f for f in self.failures if _NUMBERS.sub("#", f[0]) == key)
        causes = Counter(c for m, c in self.failures if _NUMBERS.sub("#", m) == key and c)
        return message, (causes.most_common(1)[0][0] if causes else cause), count


def report_paths(out_csv: Path) -> dict[str, Path]:
    """The class report's files for ``out_csv``: ``csv``, ``png`` and ``html`` next to it (``<stem>_class_report``)."""
    out_csv = Path(out_csv)
    base = out_csv.with_name(out_csv.stem + "_class_report")
    return {kind: base.with_suffix("." + kind) for kind in ("csv", "png", "html")}


def criterion_id(test: dict) -> str:
    """The criterion id of a results.json test (``"1.2.grads_2rank: title"`` -> ``"1.2.grads_2rank"``)."""
    return str(test.get("name", "")).split(": ", 1)[0].strip()


def _split_message(output: str) -> tuple[str, str]:
    lines = [line.strip() for line in str(output).splitlines() if line.strip()]
    cause = next((line[len(_CAUSE):].strip() for line in lines if line.lower().startswith(_CAUSE)), "")
    first = next((line for line in lines if not line.lower().startswith(_CAUSE)), "")
    return first[:300], cause[:300]


def criterion_stats(results: dict[str, dict]) -> list[CriterionStats]:
    """Per criterion (in the order the results list them, grouped by problem): how many graded, passed, and why not.

    ``results`` maps a submission name to its results.json data.
    """
    stats: dict[str, CriterionStats] = {}
    for name in sorted(results):
        for test in results[name].get("tests", []) if isinstance(results[name], dict) else []:
            if not isinstance(test, dict) or float(test.get("max_score", 0) or 0) <= 0:
                continue
            cid = criterion_id(test)
            title = str(test.get("name", "")).split(": ", 1)[-1]
            entry = stats.setdefault(cid, CriterionStats(cid, str(test.get("number", "")), title,
                                                         float(test.get("max_score", 0))))
            entry.graded += 1
            if test.get("status") == "passed":
                entry.passed += 1
            else:
                entry.failures.append(_split_message(str(test.get("output", ""))))
    order = list(stats)
    return sorted(stats.values(), key=lambda s: (_problem_key(s.problem), order.index(s.criterion)))


def _problem_key(problem: str) -> list[tuple[int, int | str]]:
    return [(0, int(x)) if x.isdigit() else (1, x) for x in problem.split(".")]


def rows_of(stats: list[CriterionStats]) -> list[dict]:
    """The CSV rows of ``stats`` (columns ``COLUMNS``)."""
    rows = []
    for s in stats:
        message, cause, sharing = s.common_failure()
        rows.append({"criterion": s.criterion, "problem": s.problem, "title": s.title, "points": f"{s.points:g}",
                     "graded": s.graded, "passed": s.passed, "pass_rate": f"{s.pass_rate:.3f}",
                     "common_failure": message, "likely_cause": cause, "sharing": sharing or ""})
    return rows


def _figure(stats: list[CriterionStats], path: Path) -> str:
    """Write the pass-rate figure; returns "" or why it was not drawn."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        return f"no figure: matplotlib is not available ({exc})"
    problems = list(dict.fromkeys(s.problem for s in stats))
    colours = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.28 * max(1, len(stats))))
    y = list(range(len(stats)))[::-1]
    for k, problem in enumerate(problems):
        picked = [(yy, s) for yy, s in zip(y, stats) if s.problem == problem]
        ax.barh([yy for yy, _ in picked], [s.pass_rate for _, s in picked], color=colours(k % 10),
                label=f"{problem} {titles().get(problem, '')}".strip())
    ax.set_yticks(y, [s.criterion for s in stats], fontsize=7)
    ax.set_xlim(0, 1)
    ax.set_xlabel("pass rate (share of graded submissions)")
    ax.set_title("Pass rate per criterion, by problem")
    if stats:
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    with atomic_path(path) as scratch:
        fig.savefig(scratch, format="png", dpi=110)
    plt.close(fig)
    return ""


def _html(rows: list[dict], paths: dict[str, Path], submissions: int, not_graded: dict[str, str], note: str) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(r[c]))}</td>" for c in COLUMNS) + "</tr>" for r in rows)
    missing = ("<p>Not counted (not graded): " + ", ".join(f"{html.escape(n)} ({html.escape(s)})"
                                                         for n, s in sorted(not_graded.items())) + "</p>"
               ) if not_graded else ""
    image = f"<p>{html.escape(note)}</p>" if note else f"<img src='{html.escape(paths['png'].name)}' alt='pass rates'>"
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>Class report</title><style>"
            "body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}td,th{border:1px solid #bbb;"
            "padding:2px 6px;font-size:13px;vertical-align:top}</style></head><body><h1>Class report</h1>"
            f"<p>{submissions} graded submission(s). Pass rate: passed / graded per criterion. The most common "
            "failure is one example of the largest group of failure messages (numbers masked); sharing: how "
            f"many submissions failed with it. Table as CSV: <a href='{html.escape(paths['csv'].name)}'>"
            f"{html.escape(paths['csv'].name)}</a>.</p>{missing}{image}<table><tr>{head}</tr>{body}</table>"
            "</body></html>\n")


def write_class_report(out_csv: Path, results: dict[str, dict], not_graded: dict[str, str] | None = None
                       ) -> dict[str, Path]:
    """Write the class report of ``results`` (graded submission -> results.json data) next to ``out_csv``.

    ``not_graded`` (submission -> status) are named on the page and count nowhere. Returns the report's
    paths (``report_paths``); the figure is left out (and the page says why) when matplotlib is missing.
    """
    paths = report_paths(out_csv)
    stats = criterion_stats(results)
    rows = rows_of(stats)
    write_csv(paths["csv"], COLUMNS, rows)
    note = _figure(stats, paths["png"])
    atomic_write(paths["html"], _html(rows, paths, len(results), dict(not_graded or {}), note))
    return paths
