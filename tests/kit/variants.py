"""Buggy variants: grade a copy of the kit in which one region body is replaced by plausible wrong code.

Used by ``tests/kit/test_variants_p*.py`` to prove that each bug costs the
intended criteria and only those. The copy is built with the grader's own
splice (``build_grading_copy``), then the chosen region bodies are rewritten.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

from grading import KIT_ROOT
from grading.problems import all_cases
from grading.kit.regions import parse_regions, replace_bodies
from grading.engine.runner import CriterionResult, run_cases
from grading.kit.submission import build_grading_copy



@dataclass(frozen=True)
class Variant:
    """A named bug: ``body`` replaces the region inside ``function`` of ``path``; ``fails`` lists criterion ids.

    A bug that spans regions (a blocking all-reduce changes the hook and what finish waits for) lists its
    other region edits in ``also`` as (path, function, body).
    """

    name: str
    path: str
    function: str
    body: str
    fails: frozenset[str]
    hint: str = ""          # text a failed criterion's message must contain (a likely cause, a file:line)
    also: tuple[tuple[str, str, str], ...] = ()

    @property
    def edits(self) -> list[tuple[str, str, str]]:
        """Every (path, function, body) this bug writes."""
        return [(self.path, self.function, self.body), *self.also]


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


def grade_variant(variant: Variant, problem: str, work: Path, servers=None) -> dict[str, CriterionResult]:
    """Grade ``problem`` on a copy of the kit carrying ``variant`` (ranks forked by ``servers``, the session's
    ``fork_servers``, when given); verdicts by criterion id."""
    kit = make_variant_kit(work / "kit", variant.edits)
    splice = build_grading_copy(KIT_ROOT, kit, work / "graded")
    return {v.id: v for v in run_cases(all_cases((problem,)), work / "graded", work / "runs", problem=problem,
                                       barred=splice.barred, hints=splice.hints, servers=servers)}


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
