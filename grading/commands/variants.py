"""Grading the buggy variants (staff only, never released), and the clause map written from them.

``tests/kit/test_variants.py`` grades every folder's variants (``declared``) in groups (``variant_groups``, one
rule for all) on a copy of the kit with their regions rewritten, and proves each costs exactly the criteria it
names (``check_group``); ``python -m grading docs`` writes ``docs/clauses.md`` from the clauses they break
(``clause_map``).
"""
from __future__ import annotations

import importlib
import os
import re
import textwrap
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from common import ROOT
from grading.kit.course import PROBLEMS_ENV
from grading.kit.submission import build_grading_copy
from grading.kit.variants import Variant, assert_verdicts, make_variant_kit
from grading.problems import all_cases, folders
from grading.engine.runner import CriterionResult, run_cases


@contextmanager
def _course_problems(problems: str):
    """The course's problem choice (``PROBLEMS_ENV``) set to ``problems`` inside the block, restored after it."""
    before = os.environ.get(PROBLEMS_ENV)
    os.environ[PROBLEMS_ENV] = problems
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(PROBLEMS_ENV, None)
        else:
            os.environ[PROBLEMS_ENV] = before


def declared(problem: str) -> list[Variant]:
    """The ``VARIANTS`` of sub-problem ``problem``'s ``variants.py`` ([] where its folder has none)."""
    module = _variants_module(problem)
    return list(module.VARIANTS) if module else []


def _variants_module(problem: str):
    name = f"{folders()[problem].__name__}.variants"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        return None


def all_variants() -> list[Variant]:
    """Every sub-problem's variants, in rubric order."""
    return [variant for problem in folders() for variant in declared(problem)]


def variant_groups(variants: list[Variant]) -> list[tuple[Variant, ...]]:
    """The variants graded together, one rule for all: a variant joins the first group none of whose variants
    edits a function it edits or names a criterion it names (the group's cases are those of its variants'
    sub-problems: each runs once for all of them); an ``alone`` variant gets a group of its own. In declaration
    order."""
    groups: list[list[Variant]] = []
    for variant in variants:
        home = None if variant.alone else next((g for g in groups if _fits(variant, g)), None)
        if home is None:
            groups.append([variant])
        else:
            home.append(variant)
    return [tuple(group) for group in groups]


def _fits(variant: Variant, group: list[Variant]) -> bool:
    edited_here = {(path, function) for v in group for path, function, _ in v.edits}
    return (not group[0].alone and not edited_here & {(path, function) for path, function, _ in variant.edits}
            and not set().union(*(v.fails for v in group)) & variant.fails)


def grade_group(group: tuple[Variant, ...], work: Path, servers=None) -> dict[str, CriterionResult]:
    """Verdicts of the sub-problems ``group``'s variants belong to, on one kit copy carrying all their edits.

    A case whose criteria are all hidden runs only where a variant of the group names one of its criteria (it
    holds the same judges as public criteria on other inputs, which the group's verdicts already cover)."""
    problems = sorted({v.problem for v in group}, key=lambda p: [int(n) for n in p.split(".")])
    named = set().union(*(v.fails for v in group))
    cases = [case for case in all_cases(tuple(problems))
             if not all(c.hidden for c in case.criteria) or named & {c.id for c in case.criteria}]
    kit = make_variant_kit(work / "kit", [edit for v in group for edit in v.edits])
    with _course_problems(",".join(sorted({p.split(".")[0] for p in problems}))):
        splice = build_grading_copy(ROOT, kit, work / "graded")
    return {v.id: replace(v, message=splice.student_lines(v.message))
            for v in run_cases(cases, work / "graded", work / "runs", refused=splice.refused, hints=splice.hints,
                               servers=servers)}


def check_group(group: tuple[Variant, ...], work: Path, servers=None) -> None:
    """Grade ``group`` in ``work`` (``grade_group``) and assert what a group must show: exactly its variants'
    criteria fail and each variant's hint shows (``assert_verdicts``), and no rank JIT-builds a library op (the
    kit's ``init_engine`` keeps DeepSpeed from building its CPU shared-memory all-reduce op; DeepSpeed prints
    "... built successfully" after building or loading one)."""
    assert_verdicts(grade_group(group, work, servers), list(group))
    logs = sorted(work.glob("runs/*/rank*.stdout"))
    assert logs, "no rank logs"
    assert not [log for log in logs if "built successfully" in log.read_text(errors="replace")], logs


def _row_order(clause_id: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.findall(r"\d+|[a-z]+", clause_id)]


def clause_map() -> str:
    """The staff's contract clause map (``docs/clauses.md``): per problem, every clause a variant breaks (clause
    -> criterion -> variant), then each sub-problem's sentences that no criterion judges (``NOT_GRADED``)."""
    lines = ["# Contract clause map (staff)", "",
             "Generated by `python -m grading docs` from the `variants.py` of every sub-problem folder: do not",
             "edit. Every sentence of a student docstring that states a requirement, the criterion that fails when",
             "it is broken, and the buggy variant that proves it (`tests/kit/test_variants.py` grades each one).",
             "Clauses marked *GPU only* are recorded on CPU where the behaviour can be (noted), otherwise they are",
             "stated for the student and not graded."]
    by_problem: dict[str, list[str]] = {}
    for problem in folders():
        by_problem.setdefault(problem.split(".")[0], []).append(problem)
    for top, problems in by_problem.items():
        rows = sorted(((clause, v) for p in problems for v in declared(p) for clause in v.breaks),
                      key=lambda row: _row_order(row[0].id))
        lines += ["", f"## Problem {top}", "", "| # | function | clause | criterion | variant |",
                  "|---|---|---|---|---|"]
        lines += [f"| {c.id} | {c.function} | {c.text} | {c.criterion} | {v.name} |" for c, v in rows]
        for problem in problems:
            module = _variants_module(problem)
            if module is not None and getattr(module, "NOT_GRADED", ""):
                lines += ["", f"### {problem}: stated but not graded", "", textwrap.dedent(module.NOT_GRADED).strip()]
    return "\n".join(lines) + "\n"
