"""The contract clause map (tests/kit/CLAUSES.md) names only criteria and buggy variants that exist.

Every row: clause -> criterion -> variant; the variant (in any ``tests/kit/test_variants_p<N>.py``, found by
name) must lose the criterion. Every public criterion of every problem backs at least one clause.
"""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from grading.problems import all_cases, folders

pytestmark = pytest.mark.kit
MAP = Path(__file__).with_name("CLAUSES.md")
MODULES = tuple(importlib.import_module(f"tests.kit.{path.stem}")
                for path in sorted(MAP.parent.glob("test_variants_p*.py")))
ALL_PROBLEMS = tuple(sorted({p.split(".")[0] for p in folders()}))


def _rows() -> list[tuple[str, str, str]]:
    rows = []
    for line in MAP.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and re.fullmatch(r"\d+(?:[a-z]\d*)?", cells[0]):
            rows.append((cells[2], cells[3], cells[4]))
    return rows


def test_every_clause_names_an_existing_criterion_and_variant():
    criteria = {c.id: c for case in all_cases(ALL_PROBLEMS) for c in case.criteria}
    variants = {v.name: v for module in MODULES for v in module.VARIANTS}
    rows = _rows()
    assert len(rows) >= 40
    for clause, criterion, variant in rows:
        assert criterion in criteria, f"clause '{clause}': no criterion {criterion}"
        assert variant in variants, f"clause '{clause}': no variant {variant}"
        assert criterion in variants[variant].fails, f"clause '{clause}': variant {variant} does not lose {criterion}"


def test_every_public_criterion_backs_a_clause():
    named = {criterion for _, criterion, _ in _rows()}
    public = {c.id for case in all_cases(ALL_PROBLEMS) for c in case.criteria if not c.hidden}
    assert public - named == set(), "criteria no clause maps to"
