"""``python -m grading mutants``: in-region mutants only, stable ids, equivalents checked, an honest score.

The seeded sample of one mutant per sub-problem of the default assignment is graded for real (the CI sample):
every sampled mutant must lose points or be listed as equivalent with its reason.
"""
import json
import textwrap
from pathlib import Path

import pytest

from common import ROOT
from grading.commands import mutants
from grading.commands.mutants import run_mutants, selection, verdict
from grading.kit import mutations
from grading.kit.mutations import Equivalent, Mutant, mutants_of, sample, stale
from grading.kit.course import DEFAULT_PROBLEMS
from grading.problems import titles

pytestmark = pytest.mark.kit
TOY = '''\
LIMIT = 3 + 4            # outside the region: never mutated


def clip(x: int) -> int:
    """The contract."""
    # BEGIN_STUDENT 1.1
    if x > 2:
        return 2
    # END_STUDENT 1.1
    return x * 5
'''


def _kit(root: Path, text: str) -> Path:
    (root / "data_parallel").mkdir(parents=True, exist_ok=True)
    (root / "data_parallel" / "toy.py").write_text(text)
    return root


def test_mutants_change_region_bodies_only_and_keep_their_ids_when_the_file_grows(tmp_path):
    found = mutants_of(_kit(tmp_path / "a", TOY))
    assert found and all(7 <= m.line <= 8 for m in found), [(m.id, m.line) for m in found]
    assert {m.operator for m in found} >= {"NumberReplacer", "ReplaceComparisonOperator_Gt_Lt", "AddNot"}
    assert len({m.id for m in found}) == len(found) and all(m.id.startswith("1.1/clip/") for m in found)
    number = next(m for m in found if m.operator == "NumberReplacer")
    assert "-    if x > 2:" in number.diff(tmp_path / "a") and "LIMIT = 3 + 4" in number.text(tmp_path / "a")
    grown = mutants_of(_kit(tmp_path / "b", "import os\n\n\n" + TOY))
    assert [(m.id, m.original) for m in grown] == [(m.id, m.original) for m in found]
    assert mutants_of(_kit(tmp_path / "c", TOY), ("2",)) == []


def test_the_sample_is_seeded_and_per_sub_problem():
    every = [Mutant(f"{p}/f/Op/{k}", p, "x.py", k, "Op", k, "") for p in ("1.1", "1.2") for k in range(5)]
    drawn = sample(every, 2, seed=3)
    assert drawn == sample(every, 2, seed=3) and [m.problem for m in drawn] == ["1.1", "1.1", "1.2", "1.2"]
    assert sample(every, 9, seed=3) == every


def test_selection_takes_problems_and_sub_problems_and_names_the_unknown():
    assert selection("1.2, 2") == ("1.2", "2")
    with pytest.raises(ValueError, match="unknown 7.4"):
        selection("1,7.4")


@pytest.mark.parametrize("content, why", [
    ("not json", "expected"), ('{"equivalent": [{"mutant": "1.2/f/Op/0", "line": "x"}]}', "reason missing"),
    ('{"equivalent": [{"mutant": "2.1/f/Op/0", "line": "x", "reason": "r"}]}', "id of this problem"),
    ('{"equivalent": [{"mutant": "1.2/f/Op/0", "line": "x", "reason": "two\\nlines"}]}', "one line"),
])
def test_a_malformed_equivalents_file_is_refused_with_its_name(tmp_path, content, why):
    (tmp_path / mutations.EQUIVALENTS_FILE).write_text(content)
    with pytest.raises(ValueError, match=why) as info:
        mutations.equivalents(tmp_path / mutations.EQUIVALENTS_FILE, "1.2")
    assert mutations.EQUIVALENTS_FILE in str(info.value)


def test_a_listed_equivalent_that_no_longer_applies_is_stale():
    now = [Mutant("1.2/f/Op/0", "1.2", "x.py", 3, "Op", 0, "y = a + b")]
    kept, moved, gone = (Equivalent("1.2/f/Op/0", "y = a + b", "r"), Equivalent("1.2/f/Op/0", "y = a - b", "r"),
                         Equivalent("1.2/f/Op/1", "y = a + b", "r"))
    assert stale([kept, moved, gone], now) == [moved, gone]


@pytest.mark.parametrize("status, scores, expected", [
    ("passed", [(1, 1), (2, 2)], "survived"), ("failed", [(1, 1), (0, 2)], "killed"),
    ("timeout", [(1, 1)], "killed"), ("grader_error", [(1, 1)], "error"), ("rejected", [], "error"),
    ("passed", [], "error"),
])
def test_a_mutant_is_killed_by_any_lost_point_and_only_a_full_grade_survives(status, scores, expected):
    assert verdict(status, [{"score": s, "max_score": m} for s, m in scores]) == expected


def test_the_score_leaves_out_listed_equivalents_and_flags_what_needs_a_look(monkeypatch):
    every = [Mutant(f"1.2/f/Op/{k}", "1.2", "x.py", k + 1, "Op", k, f"line {k}") for k in range(5)]
    listed = [Equivalent("1.2/f/Op/3", "line 3", "same result"), Equivalent("1.2/f/Op/4", "line 4", "same"),
              Equivalent("1.2/f/Op/9", "line 9", "gone")]
    monkeypatch.setattr(mutants, "listed_equivalents", lambda problem: listed)
    records = [{"verdict": v, "seconds": 1.0, "passed": ["1.2.a"], "failed": ["1.2.b"] if v == "killed" else [],
                "status": "failed" if v == "killed" else "passed", "diff": f"diff {k}"}
               for k, v in enumerate(["killed", "survived", "killed", "survived", "killed"])]
    report = mutants.summary(every, every, records, {"seconds": 9.0, "jobs": 1, "sample": None, "seed": None})
    assert report["problems"]["1.2"] == {"mutants": 5, "killed": 3, "survived": 1, "equivalent": 1, "errors": 0,
                                         "score": 0.75}
    assert [s["id"] for s in report["survivors"]] == ["1.2/f/Op/1"] and report["survivors"][0]["diff"] == "diff 1"
    assert [e["id"] for e in report["equivalent"]] == ["1.2/f/Op/3"]
    assert [e["id"] for e in report["equivalent_killed"]] == ["1.2/f/Op/4"]
    assert [e["mutant"] for e in report["stale"]] == ["1.2/f/Op/9"] and not report["complete"]
    lines = mutants.table(report)
    assert any(line.startswith("1.2") and line.endswith("75.0 %") for line in lines)
    assert any("survived: 1.2/f/Op/1" in line and "1.2.a" in line for line in lines)
    assert "<pre>diff 1</pre>" in mutants.page(report) and "same result" in mutants.page(report)


def test_the_ci_sample_loses_points_on_every_sub_problem(tmp_path):
    """One seeded mutant per sub-problem of the default assignment, graded for real: killed, or listed as
    equivalent with its reason (the optional problems' mutants: the full run, docs/mutation-analysis.md)."""
    report = run_mutants(tmp_path, DEFAULT_PROBLEMS, per_problem=1, seed=0)
    default = {sub for sub in titles() if sub.split(".")[0] in DEFAULT_PROBLEMS}
    assert set(report["problems"]) == default
    assert report["complete"], "\n".join(mutants.table(report))
    assert json.loads((tmp_path / mutants.JSON_NAME).read_text())["mutants"] == len(default)
    ledger = (tmp_path / "mutants.jsonl").read_text()
    again = run_mutants(tmp_path, DEFAULT_PROBLEMS, per_problem=1, seed=0)     # resumed: nothing graded again
    assert (tmp_path / "mutants.jsonl").read_text() == ledger and again["problems"] == report["problems"]


def test_every_listed_equivalent_of_the_kit_still_applies():
    every = mutants_of(ROOT)
    for problem in titles():
        listed = mutants.listed_equivalents(problem)
        assert not stale(listed, [m for m in every if m.problem == problem]), textwrap.shorten(str(listed), 300)


def test_without_cosmic_ray_the_command_says_what_to_install_in_one_line(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "cosmic_ray.plugins", None)
    with pytest.raises(SystemExit, match="requirements-staff.txt") as info:
        mutations.operators()
    assert "\n" not in str(info.value)
