"""The rubric as plain data: problems, cases and criteria.

A *Case* is one spawn of N rank processes running a probe (child side); a
*Criterion* judges the probe's raw results in the parent process and is worth
points. Several criteria share one case, so one spawn serves many of them,
while each criterion reads only the parts it needs, so one bug costs one
criterion. Check modules declare criteria where they are written::

    CASE = Case("p1_partition", probe_partition, world_size=2)

    @CASE.criterion("1.1.coverage", "every index in exactly one part", points=2)
    def check_coverage(run): ...

A criterion that also has hidden inputs (staff side only) is declared with
``hidden_points``: the same function then runs twice, on the public data and
on the hidden data, as two criteria (``<id>`` and ``<id>_hidden``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from grading.kit.data import staff_side
from grading.engine.results import CaseRun

# Every sub-problem of the kit. Problems 1-3 are the default assignment (100 points); 4 and 5 are optional.
PROBLEMS = {
    "1.1": "Data parallel: dataset partitioning",
    "1.2": "Data parallel: gradient averaging",
    "2.1": "Pipeline: schedule and module splitting",
    "2.2": "Pipeline: Pipe forward on stage workers",
    "2.3": "Pipeline: GPT-2 as pipeline stages",
    "3.1": "Fine-tuning: apply LoRA",
    "3.2": "Fine-tuning: save and load adapters",
    "3.3": "Fine-tuning: DeepSpeed ZeRO config and micro-batch step",
    "4.1": "DDP: overlapped bucketed all-reduce",
    "4.2": "ZeRO-1: sharded optimizer",
    "4.3": "Sharded checkpoints with exact resume",
    "5.1": "Tensor parallel: column and row parallel layers",
    "5.2": "Tensor parallel: a GPT-2 block split across ranks",
}
DEFAULT_PROBLEMS = ("1", "2", "3")
OPTIONAL_PROBLEMS = ("4", "5")
PUBLIC, HIDDEN = "public", "hidden"


def split_part(part: str, split: str) -> str:
    """The name under which a probe records ``part`` for the inputs of ``split`` (PUBLIC or HIDDEN).

    Public and hidden inputs are recorded apart, so an exception on a hidden
    input never costs a public criterion.
    """
    return f"{part}_{split}"


def problem_of(criterion_id: str) -> str:
    """``"1.2"`` for ``"1.2.grads_2rank"``."""
    return ".".join(criterion_id.split(".")[:2])


def selects(selector: str | None, problem: str) -> bool:
    """True when ``selector`` (None: all, ``"1"``: Problem 1, ``"1.2"``: that sub-problem) covers ``problem``."""
    return selector is None or problem == selector or problem.startswith(selector + ".")


@dataclass(frozen=True)
class Criterion:
    """One graded statement about a case's results, worth ``points``."""

    id: str                                   # "1.2.grads_2rank"
    title: str                                # shown in the table
    points: float
    evaluate: Callable[[CaseRun], None]       # raises CheckFailed; returns None on success
    hidden: bool = False                      # staff only; Gradescope visibility "after_published"

    @property
    def problem(self) -> str:
        return problem_of(self.id)


@dataclass
class Case:
    """One spawn: ``probe`` (a module-level function of a check module) runs on ``world_size`` ranks."""

    name: str
    probe: Callable | str
    world_size: int = 1
    init_group: bool = True
    args: dict = field(default_factory=dict)
    timeout_s: float = 90.0
    criteria: list[Criterion] = field(default_factory=list)

    @property
    def target(self) -> str:
        """``"module:function"`` of the probe, as the worker imports it."""
        if isinstance(self.probe, str):
            return self.probe
        return f"{self.probe.__module__}:{self.probe.__name__}"

    def criterion(self, id: str, title: str, points: float, hidden_points: float = 0.0) -> Callable:
        """Decorator: register ``fn(run)`` (or ``fn(run, split)`` with ``hidden_points``) as criteria of this case.

        With ``hidden_points`` the function takes the data split (PUBLIC or
        HIDDEN) as second argument and is registered twice: ``id`` on the
        public data and ``id + "_hidden"`` on the hidden data, the latter only
        on the staff side (where ``grading.hidden`` and so hidden inputs exist).
        """
        def register(fn: Callable) -> Callable:
            if hidden_points:
                self.criteria.append(Criterion(id, title, points, lambda run: fn(run, PUBLIC)))
                if staff_side():
                    self.criteria.append(Criterion(id + "_hidden", title + " (hidden inputs)", hidden_points,
                                                   lambda run: fn(run, HIDDEN), hidden=True))
            else:
                self.criteria.append(Criterion(id, title, points, fn))
            return fn
        return register


def criteria_of(cases: list[Case], selector: str | None = None) -> list[Criterion]:
    """The criteria of ``cases`` whose problem ``selector`` covers (all when None), in rubric order."""
    return [c for case in cases for c in case.criteria if selects(selector, c.problem)]


def check_rubric(cases: list[Case]) -> None:
    """Raise ValueError for duplicate case names or criterion ids, or unknown problems."""
    seen_cases, seen_ids = set(), set()
    for case in cases:
        if case.name in seen_cases:
            raise ValueError(f"duplicate case name {case.name}")
        seen_cases.add(case.name)
        for criterion in case.criteria:
            if criterion.id in seen_ids:
                raise ValueError(f"duplicate criterion id {criterion.id}")
            if criterion.problem not in PROBLEMS:
                raise ValueError(f"criterion {criterion.id}: unknown problem {criterion.problem}")
            seen_ids.add(criterion.id)
