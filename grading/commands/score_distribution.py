"""Per-problem score distributions of a class, with public and hidden subtotals (part of the class report).

``problem_scores`` sums each graded submission's public and hidden points per chosen problem, ``summary_rows``
states them one row per problem, and ``draw`` plots a histogram per problem of the submissions that attempted it.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from grading.commands.result_tests import is_hidden, not_attempted, scored_tests
from grading.kit.course import chosen_problems
from common.files import atomic_path

COLUMNS = ["problem", "sub_problems", "graded", "not_attempted", "attempted", "public_max", "public_mean", "hidden_max",
           "hidden_mean", "max_score", "mean", "median", "full_marks"]


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
            entry.sub_problems = sorted(set(entry.sub_problems) | numbers[top], key=_order)
            entry.not_attempted += numbers[top] <= skipped
            entry.attempted.append(not numbers[top] <= skipped)
    return list(spread.values())


def _order(number: str) -> list[int]:
    return [int(x) if x.isdigit() else 0 for x in number.split(".")]


def _mean(values: list[float]) -> str:
    return f"{statistics.fmean(values):.2f}" if values else ""


def summary_rows(spread: list[ProblemScores]) -> list[dict]:
    """One row per problem (columns ``COLUMNS``): graded, not attempted, attempted, public and hidden max and
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
