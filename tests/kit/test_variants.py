"""Every sub-problem's buggy variants (its folder's ``variants.py``): each loses exactly its criteria.

Variants are graded in groups (``grading.commands.variants.variant_groups``: no function edited twice, no
criterion named twice), so one kit copy and one run serve several bugs; the union of their criteria must fail,
nothing else, and each variant's hint must show. The starter loses every criterion as not implemented.
"""
from __future__ import annotations

import pytest

from common import ROOT
from common.regions import parse_regions
from grading.kit.course import DEFAULT_PROBLEMS
from grading.kit.splice import stub_body
from grading.kit.variants import make_variant_kit
from grading.commands.variants import all_variants, check_group, clause_map, declared, variant_groups
from grading.problems import all_cases, folders
from grading.engine.runner import run_cases

pytestmark = [pytest.mark.kit, pytest.mark.long_file]
VARIANTS = all_variants()
GROUPS = variant_groups(VARIANTS)
TOPS = sorted({problem.split(".")[0] for problem in folders()}, key=int)


@pytest.mark.parametrize("group", GROUPS, ids=["+".join(v.name for v in g) for g in GROUPS])
def test_variant_loses_only_its_criteria(group, tmp_path, fork_servers):
    check_group(group, tmp_path, fork_servers)


def test_every_criterion_is_lost_by_some_variant():
    lost = set().union(*(v.fails for v in VARIANTS))
    criteria = {c.id for case in all_cases(tuple(TOPS)) for c in case.criteria}
    assert criteria - lost == set(), "criteria no variant loses"


def test_every_variant_that_loses_marks_names_a_clause_it_breaks():
    for variant in VARIANTS:
        assert bool(variant.breaks) or not variant.fails, f"{variant.name}: breaks no clause"
        for clause in variant.breaks:
            assert clause.criterion in variant.fails, f"{variant.name}: clause {clause.id} names {clause.criterion}"


def test_variant_names_and_clause_ids_are_unique():
    names = [v.name for v in VARIANTS]
    ids = [c.id for v in VARIANTS for c in v.breaks]
    assert len(names) == len(set(names)) and len(ids) == len(set(ids))


def test_every_public_criterion_backs_a_clause():
    named = {clause.criterion for v in VARIANTS for clause in v.breaks}
    public = {c.id for case in all_cases(tuple(TOPS)) for c in case.criteria if not c.hidden}
    assert public - named == set(), "criteria no clause maps to"


def test_every_sub_problem_has_variants():
    assert [p for p in folders() if not declared(p)] == []


def test_the_clause_map_is_generated_from_the_variants():
    assert (ROOT / "docs" / "clauses.md").read_text() == clause_map(), "run: python -m grading docs"


@pytest.mark.parametrize("top", [top for top in TOPS if top not in DEFAULT_PROBLEMS])
def test_starter_loses_every_criterion_as_not_implemented(top, tmp_path, fork_servers):
    """The optional problems' stubs (the default assignment's: the released starter's own grade,
    tests/kit/test_grade_cli.py)."""
    paths = sorted({v.path for v in VARIANTS if v.problem.split(".")[0] == top})
    edits = []
    for path in paths:
        regions = parse_regions((ROOT / path).read_text(), path)
        edits += [(path, f"{r.function}#{[q.function for q in regions[:k]].count(r.function)}", stub_body(r).strip())
                  for k, r in enumerate(regions)]
    kit = make_variant_kit(tmp_path / "kit", edits)
    verdicts = {v.id: v for v in run_cases(all_cases((top,)), kit, tmp_path / "runs", servers=fork_servers)}
    assert verdicts and all(v.status == "not_implemented" for v in verdicts.values()), {
        cid: (v.status, v.message[:200]) for cid, v in verdicts.items() if v.status != "not_implemented"}
