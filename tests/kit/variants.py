"""Buggy variants: grade a copy of the kit in which one region body is replaced by plausible wrong code.

Used by ``tests/kit/test_variants_p*.py`` to prove that each bug costs the
intended criteria and only those. The copy is built with the grader's own
splice (``build_grading_copy``), then the chosen region bodies are rewritten.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

from grading.regions import parse_regions, replace_bodies
from grading.rubric import all_cases
from grading.runner import CriterionResult, run_cases
from grading.submission import build_grading_copy

KIT_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Variant:
    """A named bug: ``body`` replaces the region inside ``function`` of ``path``; ``fails`` lists criterion ids."""

    name: str
    path: str
    function: str
    body: str
    fails: frozenset[str]


def make_variant_kit(dest: Path, edits: list[tuple[str, str, str]]) -> Path:
    """A gradable kit copy at ``dest`` with each (path, function, body) region replaced; returns ``dest``."""
    build_grading_copy(KIT_ROOT, KIT_ROOT, dest)
    for path, function, body in edits:
        text = (dest / path).read_text()
        regions = parse_regions(text, path)
        matches = [k for k, r in enumerate(regions) if r.function == function]
        if len(matches) != 1:
            raise ValueError(f"{path}: expected one region in {function}, found {len(matches)}")
        indent = regions[matches[0]].indent
        new_body = textwrap.indent(textwrap.dedent(body).strip("\n") + "\n", indent)
        (dest / path).write_text(replace_bodies(text, path, {matches[0]: new_body}))
    return dest


def grade_variant(variant: Variant, problem: str, work: Path) -> dict[str, CriterionResult]:
    """Grade ``problem`` on a copy of the kit carrying ``variant``; verdicts by criterion id."""
    kit = make_variant_kit(work / "kit", [(variant.path, variant.function, variant.body)])
    return {v.id: v for v in run_cases(all_cases(), kit, work / "runs", problem=problem)}


def failed_ids(verdicts: dict[str, CriterionResult]) -> set[str]:
    """Ids of the criteria that did not pass."""
    return {cid for cid, v in verdicts.items() if not v.passed}
