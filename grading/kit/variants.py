"""Buggy variants (staff only, never released): plausible wrong code for a region, the criteria it loses, the
clauses it breaks.

Each sub-problem's folder declares its variants in ``variants.py`` (``VARIANTS``, and ``NOT_GRADED``: the
contract sentences no criterion judges, each with its reason), built from what this module offers. A variant
names its region by the function around it (``"forward#2"``: the third region inside a function of that name, in
file order, where several share it) and takes its sub-problem from that region's BEGIN_STUDENT marker
(``Variant.problem``), so nothing maps files to problems by hand. ``grading.commands.variants`` grades them and
writes the clause map.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

from common import ROOT
from common.regions import parse_regions
from grading.kit.splice import replace_bodies
from grading.engine.runner import CriterionResult
from grading.kit.submission import build_grading_copy


def find_region(text: str, path: str, function: str) -> int:
    """Index, among the regions of ``path``'s ``text``, of the one ``function`` names: ``"name"`` (the only region
    inside a function of that name) or ``"name#k"`` (the k-th, 0-based); ValueError when there is no such one."""
    name, _, nth = function.partition("#")
    matches = [k for k, r in enumerate(parse_regions(text, path)) if r.function == name]
    if nth.isdigit() and int(nth) < len(matches):
        return matches[int(nth)]
    if not nth and len(matches) == 1:
        return matches[0]
    raise ValueError(f"{path}: expected one region in {function}, found {len(matches)} in functions named {name}")


def reference(path: str, function: str) -> str:
    """The kit's reference body of the region ``function`` names (``find_region``) in ``path``."""
    text = (ROOT / path).read_text()
    return parse_regions(text, path)[find_region(text, path, function)].body


def edited(path: str, function: str, *swaps: tuple[str, str]) -> str:
    """The reference body of ``function`` with each (old, new) swapped; each old text must occur exactly once.
    A variant that differs from the reference in a few lines says only those lines."""
    body = reference(path, function)
    for old, new in swaps:
        assert body.count(old) == 1, f"{path}:{function}: {old!r} occurs {body.count(old)} times"
        body = body.replace(old, new)
    return body


def region_problem(path: str, function: str, root: Path = ROOT) -> str:
    """The sub-problem ("1.2") of the region ``function`` names (``find_region``) in ``root/path``: the id of its
    BEGIN_STUDENT marker."""
    text = (root / path).read_text()
    return parse_regions(text, path)[find_region(text, path, function)].id


@dataclass(frozen=True)
class Clause:
    """A sentence of a student contract: its row ``id`` in the clause map ("12i2"), the ``function`` whose
    docstring states it, its ``text``, and the ``criterion`` that fails when it is broken."""

    id: str
    function: str
    text: str
    criterion: str


@dataclass(frozen=True)
class Variant:
    """A named bug: ``body`` replaces the region ``function`` names in ``path`` (``find_region``); ``fails`` lists
    criterion ids; ``breaks`` the contract clauses it breaks (each names one of ``fails``; none for a variant
    the contract allows, which keeps full marks).

    A bug that spans regions (a blocking all-reduce changes the hook and what finish waits for) lists its
    other region edits in ``also`` as (path, function, body). ``alone``: graded in a copy of its own (its edit
    changes what another variant's criteria are judged on, or it is a race graded again by the race test).
    """

    name: str
    path: str
    function: str
    body: str
    fails: frozenset[str]
    hint: str = ""          # text a failed criterion's message must contain (a likely cause, a file:line)
    also: tuple[tuple[str, str, str], ...] = ()
    breaks: tuple[Clause, ...] = ()
    alone: bool = False

    @property
    def problem(self) -> str:
        """The sub-problem whose cases judge this bug: the id of the region ``function`` names in ``path``."""
        return region_problem(self.path, self.function)

    @property
    def edits(self) -> list[tuple[str, str, str]]:
        """Every (path, function, body) this bug writes."""
        return [(self.path, self.function, self.body), *self.also]


def make_variant_kit(dest: Path, edits: list[tuple[str, str, str]]) -> Path:
    """A gradable kit copy at ``dest`` with each (path, function, body) region replaced; returns ``dest``."""
    build_grading_copy(ROOT, ROOT, dest)
    for path, function, body in edits:
        (dest / path).write_text(with_body((dest / path).read_text(), path, function, body))
    return dest


def with_body(text: str, path: str, function: str, body: str) -> str:
    """``text`` (of the kit file ``path``) with the region of ``function`` holding ``body`` (re-indented)."""
    index = find_region(text, path, function)
    indent = parse_regions(text, path)[index].indent
    return replace_bodies(text, path, {index: textwrap.indent(textwrap.dedent(body).strip("\n") + "\n", indent)})


def failed_ids(verdicts: dict[str, CriterionResult]) -> set[str]:
    """Ids of the criteria that did not pass."""
    return {cid for cid, v in verdicts.items() if not v.passed}


def assert_verdicts(verdicts: dict[str, CriterionResult], variants: list[Variant]) -> None:
    """Exactly the criteria the ``variants`` name failed, and each variant's hint shows in a failure message."""
    assert verdicts, "no criteria graded"
    expected = set().union(*(v.fails for v in variants))
    assert failed_ids(verdicts) == expected, {cid: v.message[:300] for cid, v in verdicts.items() if not v.passed}
    messages = "\n".join(v.message for v in verdicts.values() if not v.passed)
    for variant in variants:
        assert variant.hint in messages, f"{variant.name}: no message says {variant.hint!r}:\n{messages[:2000]}"
