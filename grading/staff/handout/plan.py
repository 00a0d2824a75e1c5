"""The suggested order and time per problem: shown in the overview and in each problem's section.

A problem's plan is derived from its sub-problems (the kit's folders, in id
order): "1.1 (...), then 1.2 (...)", its hours the sum of theirs. What staff
write is one step per sub-problem, in its folder's ``__init__.py``::

    PLAN = ("`Partition`, `partition_indices`, then `partition_dataset`", (1, 2))

(what to write, in order, in markdown, and a time estimate in hours, low and
high) and here, where it helps, a closing note per problem (``NOTES``). Times
are rough estimates for a student new to ``torch.distributed``, for writing
and checking the code; the training runs' own time comes on
top. A sub-problem without a step is refused when the handout is written.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from common import ROOT
from grading.problems import folders, titles


@dataclass(frozen=True)
class Step:
    """One sub-problem's part of the plan: what to write, in order (markdown), and its hours (low, high)."""

    what: str
    hours: tuple[int, int]


@dataclass(frozen=True)
class Plan:
    """One problem's suggested order of work and its time estimate in hours (low, high)."""

    order: str
    hours: tuple[int, int]

    @property
    def time(self) -> str:
        return hours(*self.hours)


def hours(low: int, high: int) -> str:
    """A time estimate in words: "1 hour", "2 hours", "1-2 hours" (a range whose ends are equal is one number)."""
    span = f"{low:g}" if low == high else f"{low:g}-{high:g}"
    return f"{span} hour{'' if span == '1' else 's'}"


NOTES = {"4": "`run_capstone.py` needs all three"}       # closes the problem's order, after its last step
WRITE_UP = Plan("after the problems: `scripts/run_benchmarks.py`, then the written analysis", (2, 4))


def init_file(sub: str) -> str:
    """The kit-relative ``__init__.py`` of sub-problem ``sub``'s folder, where its ``PLAN`` is set
    (``grading/problems/p1_3_<name>/__init__.py`` for a sub-problem without a folder yet)."""
    package = folders().get(sub)
    if package is None:
        return f"grading/problems/p{sub.replace('.', '_')}_<name>/__init__.py"
    return Path(package.__file__).resolve().relative_to(ROOT.resolve()).as_posix()


def steps() -> dict[str, Step]:
    """Sub-problem id -> its ``Step``, for every folder that sets ``PLAN``; ValueError, naming the folder's
    ``__init__.py``, for a ``PLAN`` that is not ("what to write", (low, high)) with whole hours 0 <= low <= high."""
    found = {}
    for sub, package in folders().items():
        if not hasattr(package, "PLAN"):
            continue
        declared = package.PLAN
        shaped = isinstance(declared, tuple) and len(declared) == 2 and isinstance(declared[1], tuple)
        what, span = declared if shaped else ("", ())
        if not (isinstance(what, str) and what.strip() and len(span) == 2
                and all(isinstance(h, int) for h in span) and 0 <= span[0] <= span[1]):
            raise ValueError(f"{init_file(sub)}: PLAN must be (\"what to write, in order\", (low, high)) with whole "
                             f"hours 0 <= low <= high, not {declared!r}")
        found[sub] = Step(what, span)
    return found


def _listed(parts: list[str]) -> str:
    """``a``; ``a, then b``; ``a, b, then c``."""
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + ", then " + parts[-1]


def plan(problem: str) -> Plan:
    """The plan of Problem ``problem``: its sub-problems' steps in id order, their hours summed; ValueError when
    it has no sub-problem or one of them has no step."""
    subs = [sub for sub in titles() if sub.split(".")[0] == problem]
    if not subs:
        raise ValueError(f"no suggested order and time for Problem {problem}: it has no sub-problem")
    declared = steps()
    missing = [sub for sub in subs if sub not in declared]
    if missing:
        raise ValueError(f"no suggested order and time for {', '.join(missing)}: set PLAN = (\"what to write, in "
                         f"order\", (low, high)) in {', '.join(init_file(sub) for sub in missing)}")
    order = _listed([f"{sub} ({declared[sub].what})" for sub in subs])
    if problem in NOTES:
        order += f"; {NOTES[problem]}"
    return Plan(order, (sum(declared[s].hours[0] for s in subs), sum(declared[s].hours[1] for s in subs)))


def line(problem: str) -> str:
    """The sentence of Problem ``problem``'s section: its order and time."""
    chosen = plan(problem)
    return f"**Suggested order and time.** {chosen.order}; about {chosen.time}."


def table(problems: tuple[str, ...]) -> str:
    """The overview's table: one row per chosen problem, then the benchmarks and written analysis, then the sum."""
    rows = ["| step | order | time |", "|---|---|---|"]
    rows += [f"| Problem {p} | {plan(p).order} | {plan(p).time} |" for p in problems]
    rows.append(f"| figures and analysis | {WRITE_UP.order} | {WRITE_UP.time} |")
    low = sum(plan(p).hours[0] for p in problems) + WRITE_UP.hours[0]
    high = sum(plan(p).hours[1] for p in problems) + WRITE_UP.hours[1]
    rows.append(f"| **in all** | | **{hours(low, high)}** |")
    return "\n".join(rows)
