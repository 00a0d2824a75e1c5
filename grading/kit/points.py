"""How points are stated, one way everywhere: public points (earned of the maximum), then the hidden points.

``grading list``, the ``grade`` table (each sub-problem's header and its TOTAL line), the pytest summary and the
student handout all print a ``Tally`` with ``str()``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Protocol

from grading.kit.course import recorded_hidden_points

COURSE_ADDS = "the course adds when it grades"


class _Criterion(Protocol):          # grading.engine.rubric.Criterion
    problem: str
    points: float
    hidden: bool


class _Result(Protocol):             # grading.engine.runner.CriterionResult
    problem: str
    score: float
    max_score: float
    hidden: bool


def count(value: float, what: str = "") -> str:
    """``value`` points, the noun agreeing with the number: ``count(1, "hidden")`` is "1 hidden point",
    ``count(2, "hidden")`` "2 hidden points", ``count(0.5)`` "0.5 points"."""
    return f"{value:g} {what + ' ' if what else ''}point{'' if value == 1 else 's'}"


@dataclass(frozen=True)
class Tally:
    """Points of some criteria: the public maximum, the hidden maximum and, once graded, what was earned.

    ``earned`` is None before grading (``list``, the handout); ``hidden_earned``
    is None where the hidden checks did not run (a starter), so ``str()``
    says the course adds them::

        24 public points + 3 hidden points the course adds when it grades (27 in all)     not graded yet
        8/24 public points + 3 hidden points the course adds when it grades (8/27 in all) graded without hidden checks
        8/24 public points + 2/3 hidden points (10/27 in all)                             graded with them (the course)
        8/8 public points, no hidden points                                               nothing hidden to add
    """

    public: float
    hidden: float
    earned: float | None = None
    hidden_earned: float | None = None

    def __str__(self) -> str:
        public = count(self.public, "public") if self.earned is None else \
            f"{self.earned:g}/{count(self.public, 'public')}"
        if not self.hidden:
            return f"{public}, no hidden points"
        if self.hidden_earned is None:
            done = "" if self.earned is None else f"{self.earned:g}/"
            return (f"{public} + {count(self.hidden, 'hidden')} {COURSE_ADDS} "
                    f"({done}{self.public + self.hidden:g} in all)")
        got = (self.earned or 0.0) + self.hidden_earned
        return (f"{public} + {self.hidden_earned:g}/{count(self.hidden, 'hidden')} "
                f"({got:g}/{self.public + self.hidden:g} in all)")


def worth(criteria: Iterable[_Criterion], recorded: dict[str, float] | None = None) -> Tally:
    """The points ``criteria`` are worth (nothing earned): public ones summed; hidden ones summed where a
    sub-problem has them, else taken from ``recorded`` (default: the course record) for each sub-problem."""
    criteria = list(criteria)
    recorded = recorded_hidden_points() if recorded is None else recorded
    present = {c.problem for c in criteria if c.hidden}
    hidden = sum(c.points for c in criteria if c.hidden)
    hidden += sum(recorded.get(sub, 0.0) for sub in {c.problem for c in criteria} - present)
    return Tally(sum(c.points for c in criteria if not c.hidden), hidden)


def scored(results: Iterable[_Result], recorded: dict[str, float] | None = None) -> Tally:
    """What ``results`` earned: public points of the public maximum; hidden points earned where the hidden
    checks ran, else (a starter) the hidden points of their sub-problems from ``recorded`` (default: the course
    record), not earned yet."""
    results = list(results)
    recorded = recorded_hidden_points() if recorded is None else recorded
    public = [r for r in results if not r.hidden]
    ran = [r for r in results if r.hidden]
    missing = sum(recorded.get(sub, 0.0) for sub in {r.problem for r in results} - {r.problem for r in ran})
    return Tally(sum(r.max_score for r in public), sum(r.max_score for r in ran) + missing,
                 sum(r.score for r in public), None if missing else sum(r.score for r in ran))


def _order(problem: str) -> list:
    return [(0, int(part)) if part.isdigit() else (1, part) for part in problem.split(".")]


def problem_lines(items: Iterable, count: Callable[[list], Tally]) -> list[str]:
    """``Problem <N>: <tally>`` for each top-level problem of ``items``, then ``TOTAL <tally>``.

    ``items`` are criteria (``count=worth``: what ``grading list`` prints) or
    criterion results (``count=scored``: the pytest summary, e.g.
    ``problem_lines(results, scored)`` in ``pytest_terminal_summary``).
    """
    items = list(items)
    problems = sorted({item.problem.split(".")[0] for item in items}, key=_order)
    lines = [f"Problem {p}: {count([i for i in items if i.problem.split('.')[0] == p])}" for p in problems]
    return lines + [f"TOTAL {count(items)}"]


__all__ = ["COURSE_ADDS", "Tally", "count", "problem_lines", "scored", "worth"]
