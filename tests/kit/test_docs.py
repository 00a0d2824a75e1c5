"""One source for the problem list (issue 12).

The READMEs' tables follow the problem folders (``grading.problems.titles()``); the student handout's
sections, points and markers are tested in ``test_handout.py``.
"""
from __future__ import annotations

import re

import pytest

from grading import KIT_ROOT
from grading.commands.release import student_readme
from grading.engine.rubric import selects
from grading.kit.course import DEFAULT_PROBLEMS
from grading.problems import titles

pytestmark = pytest.mark.kit


def _table_ids(text: str) -> list[str]:
    return re.findall(r"^\| (\d\.\d) \|", text, flags=re.MULTILINE)


@pytest.mark.parametrize("readme", ["README.md", "student"])
def test_readme_tables_list_the_default_problems(readme):
    text = (student_readme(KIT_ROOT, DEFAULT_PROBLEMS) if readme == "student" else (KIT_ROOT / readme).read_text())
    ids = _table_ids(text)
    default = [p for p in titles() if any(selects(d, p) for d in DEFAULT_PROBLEMS)]
    assert ids[:len(default)] == default, f"{readme}: the problem table lists {ids}, the rubric {default}"
    assert set(ids) <= set(titles())
