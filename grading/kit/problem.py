"""A sub-problem of the assignment, as its folder ``grading/problems/pX_Y_name/`` declares it (``SubProblem``).

    __init__.py     ID ("2.2"), TITLE and PLAN (its step of the handout's suggested order): plain data
    checks.py       PROBLEM = SubProblem(...), the probe(s) and the criteria (one style for all; the grader is
                    imported from ``grading.check`` only)
    reference.py    the serial computation the criteria compare with (never a student function's answer)
    expected.json   the expected values of the public inputs, as data (written by ``grading fixtures``)
    faq.md          the handout's FAQ entry for each likely cause its checks print (where they print one)
    staff.py        staff only, never released: the answers, the hidden inputs, which criteria run hidden
    variants.py     staff only, never released: buggy variants, the criteria each loses and the contract
                    clauses each breaks (``grading.kit.variants``; ``docs/clauses.md`` is written from them)
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from grading.engine.rubric import HIDDEN, PUBLIC, Case, recorded_name
from grading.kit.secret import course_secret, secret_rng
from grading.kit.typed import from_data, to_data

EXPECTED_FILE = "expected.json"
STAFF_MODULE = "staff"


@dataclass(frozen=True)
class Spawn:
    """How the hidden inputs run when they need their own spawn (another world size).

    ``world_size`` is a number, or a function of the hidden inputs (when the
    secret draws the world size too).
    """

    world_size: int | Callable[[Any], int]
    timeout_s: float | None = None        # default: the public case's

    def size_for(self, inputs: Any) -> int:
        """The number of ranks the hidden spawn runs on ``inputs``."""
        return self.world_size(inputs) if callable(self.world_size) else self.world_size


@dataclass
class SubProblem:
    """One sub-problem's grading: its id, its input and expected-value types, its cases.

    The inputs a probe runs on are one frozen dataclass (``Inputs``), the values the criteria expect another
    (``Expected``). The public ones are ``PROBLEM.inputs`` and ``expected.json``; on the staff side, ``staff.py``
    adds hidden ones of the same types::

        def expected(inputs: Inputs) -> Expected: ...          # the answer key (computes what students must return)
        def hidden_inputs(rng: random.Random) -> Inputs: ...   # drawn from the course secret
        HIDDEN_POINTS = {checks.check_exact: 1}                # these criteria also run on the hidden inputs
        HIDDEN_SPAWN = Spawn(world_size=3)                     # optional: the hidden inputs need their own spawn
        HIDDEN_KIND = "three ranks, more buckets"              # what a student reads of a failed hidden criterion

    That is the one mechanism for hidden criteria: the same judge, run on the HIDDEN split, as ``<id>_hidden``
    worth the given points. Neither a probe nor a criterion handles splits: a probe records inside
    ``each_split`` and ``on_public_spawn``, and a criterion judges a ``SplitRun`` (``grading.engine.rubric``)
    whose ``run.part(name)``, ``run.inputs`` and ``run.expected`` are its split's. So a criterion is followed
    from its region to its expected value in two steps: the probe in ``checks.py`` calls the region's function
    on ``inputs``; the criterion compares ``run.part(...)`` with ``run.expected`` (``expected.json`` publicly,
    ``staff.expected(hidden inputs)`` hidden).
    """

    id: str                                       # "2.2"
    title: str
    package: str                                  # __package__ of its folder
    inputs: Any = None                            # the public inputs (an ``Inputs`` instance), or None
    expected_type: type | None = None             # the ``Expected`` dataclass, or None when nothing is stored
    expected_in_ranks: tuple[str, ...] = ()       # splits whose expected values a stand-in replays in the ranks
    cases: list[Case] = field(default_factory=list)

    # ------------------------------------------------------------ declaring
    def case(self, name: str, probe: Callable, split_parts: tuple[str, ...] = (), **options: Any) -> Case:
        """A new case of this sub-problem (``Case`` options: world_size, init_group, args, timeout_s, preload).

        ``split_parts``: the parts the probe records inside ``each_split`` (once per split).
        """
        case = Case(name, probe, split_parts=frozenset(split_parts), source=self, **options)
        self.cases.append(case)
        return case

    @property
    def folder(self) -> Path:
        return Path(importlib.import_module(self.package).__file__).resolve().parent

    # ------------------------------------------------------------ staff side
    def staff(self) -> ModuleType | None:
        """The folder's ``staff.py`` module, or None where it is absent (a student starter)."""
        name = f"{self.package}.{STAFF_MODULE}"
        return importlib.import_module(name) if importlib.util.find_spec(name) else None

    @property
    def hidden_kind(self) -> str:
        """``staff.HIDDEN_KIND``: what kind of input the hidden criteria run on, in words a student may read
        (``grading.kit.hidden_view``); '' without a staff part or where it is unsaid."""
        staff = self.staff()
        return str(getattr(staff, "HIDDEN_KIND", "")) if staff else ""

    # ------------------------------------------------------------ parent side
    def inputs_for(self, split: str) -> Any:
        """The inputs of ``split``: the public ones, or the staff's hidden ones under the course secret."""
        if split == PUBLIC:
            return self.inputs
        return _hidden_inputs(self, course_secret())

    def expected_for(self, split: str) -> Any:
        """The expected values of ``split``: ``expected.json`` (public), or the staff answers for the hidden inputs."""
        if split == PUBLIC:
            return _public_expected(self)
        return _hidden_expected(self, course_secret())

    def graded_cases(self) -> list[Case]:
        """The cases to run: each public case with its inputs, plus the hidden criteria on the staff side (in the
        public case's spawn, or in a spawn of their own without the case's ``public_only`` phases)."""
        staff = self.staff()
        hidden_points: dict = getattr(staff, "HIDDEN_POINTS", {}) if staff else {}
        spawn: Spawn | None = getattr(staff, "HIDDEN_SPAWN", None) if staff else None
        out = []
        for case in self.cases:
            hidden = [dataclasses.replace(c, id=c.id + "_hidden", title=c.title + " (hidden inputs)",
                                          points=hidden_points[c.judge], split=HIDDEN)
                      for c in case.criteria if c.judge in hidden_points]
            same_spawn = bool(hidden) and spawn is None
            public = dataclasses.replace(case, criteria=[*case.criteria, *(hidden if same_spawn else [])],
                                         args={**case.args, **self._split_args(case, [PUBLIC, HIDDEN] if same_spawn
                                                                                      else [PUBLIC])})
            out.append(public)
            if hidden and spawn is not None:
                out.append(dataclasses.replace(
                    case, name=case.name + "_hidden", world_size=spawn.size_for(self.inputs_for(HIDDEN)),
                    timeout_s=spawn.timeout_s or case.timeout_s, criteria=hidden,
                    next_phases=tuple(phase for phase in case.next_phases if not phase.public_only),
                    args={**case.args, **self._split_args(case, [HIDDEN])}))
        return out

    def _split_args(self, case: Case, splits: list[str]) -> dict:
        """The case arguments for ``splits``: their inputs, the case's split parts, and the expected values only
        of the splits that ``expected_in_ranks`` names (the answers stay in the grader unless a stand-in must
        replay them)."""
        args: dict = {"splits": splits, "inputs": {s: to_data(self.inputs_for(s)) for s in splits},
                      "split_parts": sorted(case.split_parts)}
        shipped = [s for s in splits if s in self.expected_in_ranks]
        if shipped:
            args["expected"] = {s: to_data(self.expected_for(s)) for s in shipped}
        return args

    # ------------------------------------------------------------ rank side
    def each_split(self, ctx, record: Callable[[Any], None]) -> None:
        """In a rank: call ``record(inputs)`` once per split this spawn runs (public, and hidden on the staff
        side), with that split's typed inputs; the parts it records are the case's ``split_parts``, each
        written under its split's name (``recorded_name``). Any other name raises ValueError (a grader bug)."""
        allowed = ctx.args.get("split_parts")      # absent only in a hand-made public run (names unchanged)
        for split in ctx.args.get("splits", [PUBLIC]):
            data = ctx.args.get("inputs", {}).get(split)
            inputs = self.inputs if data is None else from_data(type(self.inputs), data)
            with ctx.recording_as(functools.partial(recorded_name, split=split),
                                  None if allowed is None else frozenset(allowed)):
                record(inputs)

    def on_public_spawn(self, ctx, record: Callable[[], None]) -> None:
        """In a rank: call ``record()`` (the parts that do not depend on the inputs) unless this spawn runs the
        hidden split alone (``HIDDEN_SPAWN``), where no criterion reads them."""
        if PUBLIC in ctx.args.get("splits", [PUBLIC]):
            record()

    def shipped_expected(self, ctx) -> list[Any]:
        """In a rank: the typed expected values sent to this spawn (the splits ``expected_in_ranks`` names),
        for stand-ins that replay recorded answers; empty when none was sent."""
        shipped = ctx.args.get("expected", {})
        return [from_data(self.expected_type, shipped[s]) for s in ctx.args.get("splits", [PUBLIC]) if s in shipped]


def render_expected(value: Any) -> str:
    """The canonical JSON text of an ``expected.json``."""
    return json.dumps(to_data(value), indent=1, sort_keys=True) + "\n"


@functools.cache
def _public_expected(problem: SubProblem) -> Any:
    path = problem.folder / EXPECTED_FILE
    try:
        return from_data(problem.expected_type, json.loads(path.read_text()))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} is missing: run `python -m grading fixtures` (staff) to write it") from None


@functools.cache
def _hidden_inputs(problem: SubProblem, secret: str) -> Any:
    staff = problem.staff()
    if staff is None:
        raise LookupError(f"{problem.id}: hidden inputs exist only on the staff side")
    make = getattr(staff, "hidden_inputs", None)
    return make(secret_rng(problem.id, secret)) if make else problem.inputs


@functools.cache
def _hidden_expected(problem: SubProblem, secret: str) -> Any:
    return problem.staff().expected(_hidden_inputs(problem, secret))


SubProblem.__hash__ = object.__hash__      # one object per folder: cache by identity
