"""Cases and criteria: the one way a check is written.

A *Case* is one spawn of N rank processes running a probe (child side); a
*Criterion* judges the probe's raw results in the parent process and is worth
points. Several criteria share one case, so one spawn serves many of them,
while each criterion reads only the parts it needs, so one bug costs one
criterion. A sub-problem's ``checks.py`` declares them next to the code::

    CASE = PROBLEM.case("p1_partition", probe_partition, world_size=2)

    @CASE.criterion("1.1.coverage", "every index in exactly one part", points=2)
    def check_coverage(run: CaseRun, split: str) -> None: ...

Every criterion function takes the case's run and the data *split* it judges
(PUBLIC, or HIDDEN for the staff-only copy of it that a sub-problem's
``staff.py`` asks for; see ``grading.kit.problem``). Probes record the parts
that depend on the inputs once per split, under ``split_part(P_NAME, split)``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from grading.engine.results import CaseRun

PUBLIC, HIDDEN = "public", "hidden"
SPLITS = (PUBLIC, HIDDEN)


def split_part(part: str, split: str) -> str:
    """The name under which a probe records ``part`` for the inputs of ``split`` (PUBLIC or HIDDEN).

    Public and hidden inputs are recorded apart, so an exception on a hidden
    input never costs a public criterion.
    """
    if split not in SPLITS:
        raise ValueError(f"split_part: unknown split {split!r}")
    return f"{part}_{split}"


def problem_of(criterion_id: str) -> str:
    """``"1.2"`` for ``"1.2.grads_2rank"``."""
    return ".".join(criterion_id.split(".")[:2])


def selects(selector: str | None, problem: str) -> bool:
    """True when ``selector`` (None: all, ``"1"``: Problem 1, ``"1.2"``: that sub-problem) covers ``problem``."""
    return selector is None or problem == selector or problem.startswith(selector + ".")


Judge = Callable[[CaseRun, str], None]


@dataclass(frozen=True)
class Criterion:
    """One graded statement about a case's results, worth ``points``; ``judge(run, split)`` raises CheckFailed."""

    id: str                                   # "1.2.grads_2rank"
    title: str                                # shown in the table
    points: float
    judge: Judge
    split: str = PUBLIC                       # HIDDEN: staff only; Gradescope visibility "after_published"

    @property
    def hidden(self) -> bool:
        return self.split == HIDDEN

    @property
    def problem(self) -> str:
        return problem_of(self.id)

    def evaluate(self, run: CaseRun) -> None:
        """Judge ``run`` on this criterion's split; raises CheckFailed when it does not hold."""
        self.judge(run, self.split)


@dataclass
class Case:
    """One spawn: ``probe(ctx)`` (a module-level function of a ``checks.py``) runs on ``world_size`` ranks."""

    name: str
    probe: Callable
    world_size: int = 1
    init_group: bool = True
    args: dict = field(default_factory=dict)
    timeout_s: float = 90.0
    criteria: list[Criterion] = field(default_factory=list)
    preload: tuple[str, ...] = ()      # library modules the probe's ranks import (``ForkServers.preload``)

    @property
    def target(self) -> str:
        """``"module:function"`` of the probe, as the worker imports it."""
        return f"{self.probe.__module__}:{self.probe.__name__}"

    def criterion(self, id: str, title: str, points: float) -> Callable[[Judge], Judge]:
        """Decorator: register ``judge(run, split)`` as the public criterion ``id`` of this case."""
        def register(judge: Judge) -> Judge:
            self.criteria.append(Criterion(id, title, points, judge))
            return judge
        return register


def criteria_of(cases: list[Case], selector: str | None = None) -> list[Criterion]:
    """The criteria of ``cases`` whose problem ``selector`` covers (all when None), in rubric order."""
    return [c for case in cases for c in case.criteria if selects(selector, c.problem)]


def check_rubric(cases: list[Case], known: set[str] | frozenset[str]) -> None:
    """Raise ValueError for duplicate case names or criterion ids, or problems not in ``known``."""
    seen_cases, seen_ids = set(), set()
    for case in cases:
        if case.name in seen_cases:
            raise ValueError(f"duplicate case name {case.name}")
        seen_cases.add(case.name)
        for criterion in case.criteria:
            if criterion.id in seen_ids:
                raise ValueError(f"duplicate criterion id {criterion.id}")
            if criterion.problem not in known:
                raise ValueError(f"criterion {criterion.id}: unknown problem {criterion.problem}")
            seen_ids.add(criterion.id)
