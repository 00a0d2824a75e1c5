"""The released README is a handout for the course's chosen problems (issue 21, item 1).

Two releases per module (all five problems with a preface, and the default),
read back: a section per chosen problem, the points of every sub-problem as
the rubric sums them (what ``grading list`` prints), the markers and entry
points of Problems 4 and 5 only where chosen, the preface first, a bad
preface refused before anything is written. Nothing is graded here.
"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from grading import KIT_ROOT
from grading.__main__ import main
from grading.engine import hints
from grading.kit.course import DEFAULT_PROBLEMS
from grading.problems import all_cases, folders
from grading.staff import handout
from grading.staff.handout import faq, figures

pytestmark = pytest.mark.kit

ALL = ("1", "2", "3", "4", "5")
PREFACE = "# CS 11-868, Spring 2026\n\nDue May 1, 23:59. Late days: see the syllabus.\n"
ENTRY_POINTS = {"4": ("project/run_capstone.py",), "5": ("project/run_tensor_parallel.py",)}


def _release(tmp_path_factory, name: str, *args: str) -> tuple[int, str]:
    out = tmp_path_factory.mktemp(name) / "starter"
    code = main(["release", str(out), *args])
    return code, (out / "README.md").read_text()


@pytest.fixture(scope="module")
def everything(tmp_path_factory) -> str:
    preface = tmp_path_factory.mktemp("preface") / "preface.md"
    preface.write_text(PREFACE)
    code, text = _release(tmp_path_factory, "all", "--problems", ",".join(ALL), "--preface", str(preface))
    assert code == 0
    return text


@pytest.fixture(scope="module")
def default(tmp_path_factory) -> str:
    code, text = _release(tmp_path_factory, "default")
    assert code == 0
    return text


def _sections(text: str) -> dict[str, str]:
    """Problem number -> the text of its ``## Problem N: ...`` section (up to the next ``## ``)."""
    found = {}
    for match in re.finditer(r"^## Problem (\d): .*?(?=^## )", text, flags=re.MULTILINE | re.DOTALL):
        found[match.group(1)] = match.group(0)
    return found


def _rubric(problems: tuple[str, ...]) -> dict[str, tuple[float, float]]:
    """Sub-problem -> (points, hidden points), summed from the criteria as ``grading list`` sums them."""
    sums: dict[str, list[float]] = {}
    for case in all_cases(problems):
        for criterion in case.criteria:
            entry = sums.setdefault(criterion.problem, [0.0, 0.0])
            entry[0] += criterion.points
            entry[1] += criterion.points if criterion.hidden else 0.0
    return {sub: (points, hidden) for sub, (points, hidden) in sums.items()}


def _points_rows(section: str) -> dict[str, tuple[float, float]]:
    rows = re.findall(r"^\| (\d\.\d) \| [^|]+ \| ([\d.]+) \| ([\d.]+) \|", section, flags=re.MULTILINE)
    return {sub: (float(points), float(hidden)) for sub, points, hidden in rows}


@pytest.mark.parametrize("which", ["everything", "default"])
def test_a_section_per_chosen_problem_with_the_rubric_points(which, request):
    text = request.getfixturevalue(which)
    problems = ALL if which == "everything" else DEFAULT_PROBLEMS
    sections = _sections(text)
    assert list(sections) == list(problems)
    rubric = _rubric(problems)
    for problem, section in sections.items():
        mine = {sub: pts for sub, pts in rubric.items() if sub.split(".")[0] == problem}
        assert _points_rows(section) == mine, f"Problem {problem}: README points differ from the rubric"
        total = sum(p for p, _ in mine.values())
        assert section.startswith(f"## Problem {problem}: ") and f"({total:g} points)" in section.splitlines()[0]
        assert f"**Problem {problem}** | | **{total:g}** | **{sum(h for _, h in mine.values()):g}** |" in section
        for part in ("what it is", "why it matters"):
            assert part in section.lower(), f"Problem {problem}: no background ({part!r})"
        assert "```" in section, f"Problem {problem}: no figure"
    grand = sum(p for p, _ in rubric.values())
    assert f"| **total** | **{grand:g}** |" in text


def test_default_release_mentions_neither_optional_problem(default):
    assert "| **total** | **100** |" in default
    for word in ("Problem 4", "Problem 5", "p4_", "p5_", "run_capstone", "run_tensor_parallel", "tensor_parallel",
                 "BucketedDDP", "ShardedOptimizer", "--problems", "optional"):
        assert word not in default, f"the default handout mentions {word!r}"


def test_markers_and_entry_points_of_problems_4_and_5_only_in_their_sections(everything):
    sections = _sections(everything)
    for problem in ALL:
        subs = [sub for sub in _rubric(ALL) if sub.split(".")[0] == problem]
        marks = [f"p{sub.replace('.', '_')}" for sub in subs]
        assert f'python -m pytest -m "{" or ".join(marks)}"' in sections[problem]
        for mark in marks:
            assert mark in everything.split("## How grading works")[1].splitlines()[2]   # the list of markers
    for problem, entry_points in ENTRY_POINTS.items():
        for entry in entry_points:
            holders = [p for p, text in sections.items() if entry in text]
            assert holders == [problem], f"{entry} appears in the sections of Problems {holders}"


def test_preface_comes_first(everything):
    assert everything.startswith(PREFACE.rstrip() + "\n\n# Assignment 5")


@pytest.mark.parametrize("kind", ["missing", "folder", "empty", "binary"])
def test_a_bad_preface_is_refused_in_one_line_and_nothing_written(kind, tmp_path, capsys):
    preface = tmp_path / "preface.md"
    if kind == "folder":
        preface.mkdir()
    elif kind == "empty":
        preface.write_text(" \n")
    elif kind == "binary":
        preface.write_bytes(b"\xff\xfe\x00course")
    out = tmp_path / "starter"
    assert main(["release", str(out), "--preface", str(preface)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"error: --preface {preface}"), err
    assert not out.exists()


def test_performance_thresholds_are_the_benchmark_defaults(everything):
    spec = importlib.util.spec_from_file_location("run_benchmarks_defaults", KIT_ROOT / "scripts/run_benchmarks.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    defaults = script.parse_args([])
    assert handout.thresholds(KIT_ROOT) == {"dp_threshold": defaults.dp_threshold,
                                            "pp_threshold": defaults.pp_threshold}
    sections = _sections(everything)
    assert f"**{defaults.dp_threshold:g}x**" in sections["1"]
    assert f"**{defaults.pp_threshold:g}x**" in sections["2"]


def test_faq_holds_every_exception_hint_and_a_section_per_folder_with_likely_causes(everything):
    faq_text = everything.split("## FAQ")[1]
    for _, _, hint in hints._EXCEPTION_HINTS:
        assert hint in faq_text
    assert "likely cause: a late-binding closure at pipeline/pipe.py:" in faq_text
    written = faq.sections()
    for sub, package in folders().items():
        folder = Path(package.__file__).parent
        if any("likely cause:" in (folder / name).read_text() for name in ("checks.py", "hints.py")
               if (folder / name).is_file()):
            assert sub in written, f"{folder.name} prints likely causes: give it a '## {sub}' section in faq.md"


def test_gpipe_figure_follows_the_schedule_contract():
    lines = figures.gpipe_schedule(4, 3).splitlines()
    waves = [line for line in lines if line.startswith("cycle ")]
    assert len(waves) == 4 + 3 - 1
    for k, line in enumerate(waves):
        want = [(k - j, j) for j in range(3) if 0 <= k - j < 4]
        assert line == f"cycle {k}: [" + ", ".join(f"({i}, {j})" for i, j in want) + "]"


def test_a_placeholder_without_a_value_is_refused():
    with pytest.raises(ValueError, match=r"unknown placeholder\(s\) \{\{nope\}\}"):
        handout.fill("a {{known}} and {{nope}}", {"known": "x"}, "t.md")
