"""Cases and criteria: the one way a check is written.

A ``Case`` is one spawn of N rank processes running a probe (child side); a ``Criterion`` judges the probe's raw
results in the parent process, as seen from one data split (``SplitRun``), and is worth points. Several criteria
share one case and each reads only the parts it names (``reads=``), so one spawn serves many of them and one bug
costs one criterion. Hidden inputs are the framework's job: a criterion is written once, never branching on its split.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Iterable, Protocol

from grading.engine.case_run import CaseRun

PUBLIC, HIDDEN = "public", "hidden"


def recorded_name(part: str, split: str) -> str:
    """The name under which a split part is recorded for ``split``: ``part`` (PUBLIC) or ``part_hidden``.

    Public and hidden inputs are recorded apart, so an exception on a hidden
    input never costs a public criterion. Only the framework calls this.
    """
    if split not in (PUBLIC, HIDDEN):
        raise ValueError(f"recorded_name: unknown split {split!r}")
    return part if split == PUBLIC else f"{part}_{split}"


class InputSource(Protocol):
    """Where a split's inputs and expected values come from (a ``grading.kit.problem.SubProblem``)."""

    def inputs_for(self, split: str) -> Any: ...

    def expected_for(self, split: str) -> Any: ...

    @property
    def hidden_kind(self) -> str:
        """The kind of the hidden inputs, in words a student may read (never their values); '' when unsaid."""


class SplitRun:
    """What a criterion judges: a finished case's results as seen from one split, with its inputs and expected.

    ``part(name, rank)`` reads the split's own recording of a split part and every
    other part as recorded; ``parts``, ``world_size`` and ``launch`` are the
    case run's. ``inputs`` and ``expected`` are the split's (public: the
    sub-problem's inputs and ``expected.json``; hidden: the staff's).
    ``reads``: the parts criterion ``criterion`` declares; reading any other
    is a bug in the checks (ValueError, a grader error), so the declaration
    stays true.
    """

    def __init__(self, run: CaseRun, split: str, split_parts: frozenset[str] = frozenset(),
                 source: InputSource | None = None, *, reads: Iterable[str], criterion: str):
        self._run, self._split, self._split_parts, self._source = run, split, split_parts, source
        self._reads, self._criterion = frozenset(reads), criterion

    @property
    def world_size(self) -> int:
        return self._run.world_size

    @property
    def launch(self):
        return self._run.launch

    def part(self, name: str, rank: int = 0) -> Any:
        """The value rank ``rank`` recorded as ``name`` for this split (``CaseRun.part``; raises CheckFailed).

        Raises ValueError (a grader error, never the student's) when ``name`` is not among the criterion's reads.
        """
        if name not in self._reads:
            raise ValueError(f"criterion {self._criterion} read the part {name!r}, which its reads= does not "
                             f"name ({', '.join(map(repr, sorted(self._reads))) or 'none'}): a bug in the checks; "
                             f"add {name!r} to reads= of @CASE.criterion({self._criterion!r}, ...)")
        return self._run.part(recorded_name(name, self._split) if name in self._split_parts else name, rank)

    def parts(self, name: str) -> list[Any]:
        """``part(name, r)`` for every rank r."""
        return [self.part(name, rank) for rank in range(self.world_size)]

    @cached_property
    def inputs(self) -> Any:
        """The inputs this split's probe ran on."""
        return self._source.inputs_for(self._split)

    @cached_property
    def expected(self) -> Any:
        """The values the criteria expect on this split's inputs (never computed from a student function)."""
        return self._source.expected_for(self._split)


def selects(selector: str | None, problem: str) -> bool:
    """True when ``selector`` (None: all, ``"1"``: Problem 1, ``"1.2"``: that sub-problem) covers ``problem``."""
    return selector is None or problem == selector or problem.startswith(selector + ".")


Judge = Callable[[SplitRun], None]


@dataclass(frozen=True)
class Criterion:
    """One graded statement about a case's results, worth ``points``; ``judge(run)`` raises CheckFailed.

    ``reads``: the names of the parts its judges read (``SplitRun.part``), on any path: reading another one is a
    grader error. ``public_only`` / ``hidden_only``: further judges run after ``judge`` on that split only (what
    the public inputs check beyond the hidden ones, or the reverse), declared here rather than branched on.
    """

    id: str                                   # "1.2.grads_2rank"
    title: str                                # shown in the table
    points: float
    judge: Judge
    reads: tuple[str, ...]                    # (P_GRADS,): the parts it reads, under their split-free names
    split: str = PUBLIC                       # HIDDEN: staff only; Gradescope visibility "after_published"
    public_only: tuple[Judge, ...] = ()
    hidden_only: tuple[Judge, ...] = ()
    split_parts: frozenset[str] = frozenset()  # the case's split parts (see SplitRun)
    source: InputSource | None = None         # the sub-problem whose inputs the splits are

    @property
    def hidden(self) -> bool:
        return self.split == HIDDEN

    @property
    def problem(self) -> str:
        """``"1.2"`` for ``"1.2.grads_2rank"``."""
        return ".".join(self.id.split(".")[:2])

    def evaluate(self, run: CaseRun) -> None:
        """Judge ``run`` as seen from this criterion's split; raises CheckFailed when it does not hold."""
        view = SplitRun(run, self.split, self.split_parts, self.source, reads=self.reads, criterion=self.id)
        for judge in (self.judge, *(self.public_only if self.split == PUBLIC else self.hidden_only)):
            judge(view)


@dataclass(frozen=True)
class Phase:
    """A probe that new rank processes run after the ranks before them finished (``Case.next_phases``)."""

    probe: Callable
    collective_checks: bool = True     # off: this phase's ranks run without torch's per-call checks
    public_only: bool = False          # it records only parts of the public split: a hidden spawn leaves it out


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
    split_parts: frozenset[str] = frozenset()   # parts recorded once per split (``SubProblem.each_split``)
    source: InputSource | None = None           # the sub-problem whose public and hidden inputs this case runs
    next_phases: tuple[Phase, ...] = ()   # run next, each by new rank processes (``grading.engine.launch``)
    # torch compares every collective call across ranks before running it (``launch``'s ``collective_checks``);
    # off where the student makes no collective call of their own, and in a phase that turns it off
    collective_checks: bool = True

    @property
    def phases(self) -> tuple[str, ...]:
        """``"module:function"`` of the probe, then of each of ``next_phases``: what each phase's ranks run."""
        probes = (self.probe, *(phase.probe for phase in self.next_phases))
        return tuple(f"{probe.__module__}:{probe.__name__}" for probe in probes)

    @property
    def phase_checks(self) -> tuple[bool, ...]:
        """Whether each phase's ranks run with torch's per-call checks (``collective_checks``), in ``phases`` order."""
        return (self.collective_checks, *(self.collective_checks and p.collective_checks for p in self.next_phases))

    def criterion(self, id: str, title: str, points: float, *, reads: tuple[str, ...],
                  public_only: tuple[Judge, ...] = (), hidden_only: tuple[Judge, ...] = ()) -> Callable[[Judge], Judge]:
        """Decorator: register ``judge(run: SplitRun)`` as the public criterion ``id`` of this case.

        ``reads`` (required): every part name that ``judge``, its ``public_only`` / ``hidden_only`` judges and
        the helpers they call pass to ``run.part`` / ``run.parts``, on every path (a read made only to report
        a failure included); ``SplitRun`` refuses any other (ValueError, a grader error).
        ``public_only`` / ``hidden_only``: judges that also run, after ``judge``, on that split only.
        """
        if isinstance(reads, str) or not all(isinstance(name, str) for name in reads):
            raise ValueError(f"criterion {id}: reads= must be a tuple of part names, got {reads!r}")

        def register(judge: Judge) -> Judge:
            self.criteria.append(Criterion(id, title, points, judge, tuple(reads), public_only=tuple(public_only),
                                           hidden_only=tuple(hidden_only), split_parts=frozenset(self.split_parts),
                                           source=self.source))
            return judge
        return register


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
