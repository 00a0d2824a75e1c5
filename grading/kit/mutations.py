"""The in-region mutants of the reference: Cosmic Ray's operators applied to the region bodies only (staff).

A mutant is the kit's student file with one operator applied at one place strictly inside one student region
(``mutants_of``); ``equivalents`` reads the mutants staff judged equivalent to the reference.
"""
from __future__ import annotations

import difflib
import json
import random
from dataclasses import dataclass
from pathlib import Path

from common.regions import parse_regions, student_files
from grading.kit.splice import kit_text

MISSING = ("`python -m grading mutants` needs Cosmic Ray, a staff-only requirement: "
           "python3 -m pip install -r requirements-staff.txt")


@dataclass(frozen=True)
class Mutant:
    """One mutant: Cosmic Ray's ``operator`` applied at its ``occurrence`` in the kit's student file ``path``.

    ``id`` counts the operator's places in that function's regions only, so an id survives edits elsewhere in
    the file; ``original`` tells whether a recorded id still means the same change.
    """

    id: str            # "<sub-problem>/<function>/<operator>/<k>"
    problem: str       # the region's sub-problem, e.g. "1.2"
    path: str          # kit-relative student file
    line: int          # 1-based line of the change in ``path``
    operator: str      # Cosmic Ray's operator name, without its provider ("NumberReplacer")
    occurrence: int    # the operator's place among all its places in the file (Cosmic Ray's numbering)
    original: str      # the line before the change, stripped

    def text(self, root: Path) -> str:
        """The whole mutated file: the kit's text at ``root`` (``kit_text``) with this mutation applied."""
        from cosmic_ray.mutating import mutate_code
        mutated = mutate_code(kit_text(Path(root), self.path), dict(operators())[self.operator], self.occurrence)
        if mutated is None:
            raise ValueError(f"mutant {self.id} no longer applies to {self.path}")
        return mutated

    def diff(self, root: Path) -> str:
        """A unified diff (2 lines of context) from the kit's text to ``text(root)``."""
        old, new = kit_text(Path(root), self.path), self.text(root)
        return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{self.path}",
                                            f"b/{self.path}", n=2))


def operators() -> list[tuple[str, object]]:
    """(name, instance) of every Cosmic Ray core operator that takes no arguments, in Cosmic Ray's order.

    Raises SystemExit with one line (``MISSING``) when Cosmic Ray is not installed."""
    try:
        from cosmic_ray.plugins import get_operator, operator_names
    except ImportError:
        raise SystemExit(f"error: {MISSING}") from None
    found = []
    for name in operator_names():
        cls = get_operator(name)
        if name.startswith("core/") and not cls.arguments():
            found.append((name.split("/", 1)[1], cls()))
    return found


def mutants_of(root: Path, problems: tuple[str, ...] | None = None) -> list[Mutant]:
    """Every in-region mutant of the kit at ``root`` for the sub-problems that ``problems`` selects ("1" or
    "1.2"; default all), in file, operator and position order. Raises SystemExit when Cosmic Ray is absent."""
    chosen = operators()
    from cosmic_ray.ast import ast_nodes, get_ast

    found: list[Mutant] = []
    for rel in student_files(Path(root)):
        text = kit_text(Path(root), rel)
        regions = [r for r in parse_regions(text, rel) if _selected(r.id, problems)]
        if not regions:
            continue
        nodes, lines = list(ast_nodes(get_ast(text))), text.splitlines()
        for name, operator in chosen:
            places = (p for node in nodes for p in operator.mutation_positions(node))
            seen: dict[tuple[str, str], int] = {}
            for occurrence, (start, end) in enumerate(places):
                region = next((r for r in regions if r.begin_line < start[0] and end[0] < r.end_line), None)
                if region is None:
                    continue
                key = (region.id, region.function)
                k, seen[key] = seen.get(key, 0), seen.get(key, 0) + 1
                found.append(Mutant(f"{region.id}/{region.function}/{name}/{k}", region.id, rel, start[0], name,
                                    occurrence, lines[start[0] - 1].strip()))
    return found


def sample(mutants: list[Mutant], per_problem: int, seed: int) -> list[Mutant]:
    """Up to ``per_problem`` mutants of each sub-problem, drawn with ``random.Random(seed)``, in input order."""
    by_problem: dict[str, list[int]] = {}
    for k, mutant in enumerate(mutants):
        by_problem.setdefault(mutant.problem, []).append(k)
    rng = random.Random(seed)
    chosen = {k for ks in by_problem.values() for k in rng.sample(ks, min(per_problem, len(ks)))}
    return [m for k, m in enumerate(mutants) if k in chosen]


def _selected(region_id: str, problems: tuple[str, ...] | None) -> bool:
    return problems is None or any(region_id == p or region_id.startswith(p + ".") for p in problems)


EQUIVALENTS_FILE = "equivalent_mutants.json"     # in a sub-problem's folder: survivors staff judged equivalent


@dataclass(frozen=True)
class Equivalent:
    """A mutant staff judged equivalent to the reference: its ``mutant`` id, the ``line`` it changes (as
    ``Mutant.original``) and a one-line ``reason``."""

    mutant: str
    line: str
    reason: str


def equivalents(path: Path, problem: str) -> list[Equivalent]:
    """The equivalent mutants that ``path`` (sub-problem ``problem``'s ``EQUIVALENTS_FILE``) lists; none when
    there is no such file.

    The file is ``{"equivalent": [{"mutant": ID, "line": TEXT, "reason": ONE LINE}, ...]}``; ValueError naming
    the file and the entry when it is not so (no JSON, a field missing or empty, a reason on several lines,
    an id listed twice or of another sub-problem)."""
    path = Path(path)
    if not path.is_file():
        return []
    try:
        entries = json.loads(path.read_text())["equivalent"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: expected {{\"equivalent\": [...]}} ({exc})") from None
    found: list[Equivalent] = []
    for k, entry in enumerate(entries if isinstance(entries, list) else [None]):
        fields = {f: entry.get(f) if isinstance(entry, dict) else None for f in ("mutant", "line", "reason")}
        bad = [f for f, v in fields.items() if not isinstance(v, str) or not v.strip()]
        if bad or "\n" in fields["reason"] or not fields["mutant"].startswith(f"{problem}/"):
            why = f"{', '.join(bad)} missing or empty" if bad else "the reason is one line, the id of this problem"
            raise ValueError(f"{path}: entry {k}: {why}")
        if any(e.mutant == fields["mutant"] for e in found):
            raise ValueError(f"{path}: entry {k}: {fields['mutant']} is listed twice")
        found.append(Equivalent(**{f: v.strip() for f, v in fields.items()}))
    return found


def stale(listed: list[Equivalent], mutants: list[Mutant]) -> list[Equivalent]:
    """The listed equivalents that no longer apply: no mutant of ``mutants`` (all of the sub-problem's, not a
    sample) has that id, or it now changes another line."""
    current = {m.id: m.original for m in mutants}
    return [e for e in listed if current.get(e.mutant) != e.line]
