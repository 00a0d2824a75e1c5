"""A student exception is reported with its file and line in every sub-problem (issue 21, item 5).

Every region of every sub-problem (found from the BEGIN_STUDENT markers, no table to keep in step) gets a
planted ``raise IndexError(...)`` as its first statement, in one kit copy per problem; each problem is graded
once on its copy. For each sub-problem, some failed criterion's message must name the file of one of its
regions and a line inside that region (``hints.describe_exception`` / ``case_run.describe_error``: "(at
path:line (in fn))"), whether ``ctx.record`` caught the exception or a probe helper did (``call_outcome``,
``labelled``, a probe's own ``except``).
"""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from common import ROOT
from grading.engine.runner import run_cases
from grading.kit.course import PROBLEMS_ENV
from common.regions import parse_regions, student_files
from grading.kit.splice import replace_bodies
from grading.kit.submission import build_grading_copy
from grading.problems import all_cases, folders
from grading.kit.variants import make_variant_kit

pytestmark = pytest.mark.kit

# Sub-problems whose probes still format a caught exception by hand (other folders' owners): none known today.
HAND_FORMATTED: dict[str, str] = {}


def plants(root: Path = ROOT) -> dict[str, list[str]]:
    """Sub-problem -> the student files of ``root`` that hold its regions (every region of it gets a raise), in
    rubric order."""
    found: dict[str, list[str]] = {}
    for rel in student_files(root):
        for sub in dict.fromkeys(r.id for r in parse_regions((root / rel).read_text(), rel)):
            found.setdefault(sub, []).append(rel)
    return dict(sorted(found.items(), key=lambda item: [int(n) for n in item[0].split(".")]))


PLANTS = plants()


def _plant(kit: Path, rel: str, problem: str) -> None:
    """Make ``raise IndexError("planted in <sub>")`` the first statement of every region of Problem ``problem``
    in ``kit/rel``."""
    text = (kit / rel).read_text()
    bodies = {k: textwrap.indent(f'raise IndexError("planted in {r.id}")\n' + textwrap.dedent(r.body), r.indent)
              for k, r in enumerate(parse_regions(text, rel)) if r.id.split(".")[0] == problem}
    (kit / rel).write_text(replace_bodies(text, rel, bodies))


def _planted_lines(graded: Path, sub: str) -> dict[str, list[range]]:
    """File -> the line ranges of ``sub``'s regions there, in the graded copy."""
    return {rel: [range(r.begin_line + 1, r.end_line) for r in parse_regions((graded / rel).read_text(), rel)
                  if r.id == sub] for rel in PLANTS[sub]}


@pytest.fixture(scope="module")
def graded_problems(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """Problem ("1") -> (graded copy, verdicts by sub-problem), filled as the tests ask (so ``-k 2.1`` grades
    Problem 2 alone)."""
    return {}


def _graded(problem: str, cache: dict, tmp_path_factory, servers) -> tuple[Path, dict]:
    """Problem ``problem`` graded once on a grading copy with a raise planted in every region of its files (ranks
    forked by ``servers``, the session's fork servers)."""
    if problem not in cache:
        work = tmp_path_factory.mktemp(f"exception_locations_{problem}")
        kit = make_variant_kit(work / "kit", [])
        for rel in sorted({rel for sub, rels in PLANTS.items() if sub.split(".")[0] == problem for rel in rels}):
            _plant(kit, rel, problem)
        by_sub: dict[str, list] = {}
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(PROBLEMS_ENV, problem)                     # splice an optional problem's regions too
            splice = build_grading_copy(ROOT, kit, work / "graded")
            for verdict in run_cases(all_cases((problem,)), work / "graded", work / "runs", refused=splice.refused,
                                     hints=splice.hints, servers=servers):
                by_sub.setdefault(verdict.problem, []).append(verdict)
        cache[problem] = (work / "graded", by_sub)
    return cache[problem]


def test_every_sub_problem_has_a_planted_region():
    assert set(PLANTS) == set(folders()), "every sub-problem folder has regions, and every region id a folder"


@pytest.mark.parametrize("sub", [
    pytest.param(sub, marks=pytest.mark.xfail(strict=True, reason=HAND_FORMATTED[sub]))
    if sub in HAND_FORMATTED else sub for sub in PLANTS])
def test_the_failure_names_the_file_and_line_inside_the_region(sub, graded_problems, tmp_path_factory, fork_servers):
    root, by_sub = _graded(sub.split(".")[0], graded_problems, tmp_path_factory, fork_servers)
    lines = _planted_lines(root, sub)
    failed = [v for v in by_sub.get(sub, []) if not v.passed]
    assert failed, f"{sub}: no criterion failed with a raise in each region of {', '.join(lines)}"
    found = [(v.id, rel, int(n)) for v in failed for rel in lines
             for n in re.findall(rf"\(at {re.escape(rel)}:(\d+) \(in ", v.message)]
    inside = [(cid, rel, n) for cid, rel, n in found if any(n in span for span in lines[rel])]
    assert inside, (f"{sub}: no failure message names a line inside one of its regions {lines} "
                    f"(found {found[:5]}):\n" + "\n".join(f"{v.id}: {v.message[:300]}" for v in failed))
