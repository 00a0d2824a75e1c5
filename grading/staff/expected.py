"""Write and check the public expected values (``grading/problems/*/expected.json``) from the staff answers.

``python -m grading fixtures`` rewrites those that changed; ``python -m grading fixtures
--check`` (and a kit test) fails when a committed file differs from what the
answers give; ``grading release`` writes them fresh into every starter.
"""
from __future__ import annotations

from pathlib import Path

from common import ROOT
from grading.engine.rubric import selects
from grading.kit.problem import EXPECTED_FILE, render_expected
from grading.problems import folders, sub_problem


def rendered(problems: tuple[str, ...] | None = None) -> dict[str, str]:
    """Kit-relative path -> text of every ``expected.json`` of ``problems`` (all when None), from the answers."""
    texts = {}
    for problem in folders():
        if problems is not None and not any(selects(p, problem) for p in problems):
            continue
        declared = sub_problem(problem)
        staff = declared.staff()
        if declared.expected_type is None or staff is None:
            continue
        rel = (declared.folder / EXPECTED_FILE).relative_to(ROOT).as_posix()
        texts[rel] = render_expected(staff.expected(declared.inputs))
    return texts


def write() -> tuple[list[Path], list[Path]]:
    """Write every ``expected.json`` of the kit that is missing or differs from the staff answers (``stale``);
    return the paths written and those left as they were (they already held the answers)."""
    written, unchanged = [], []
    for rel, text in rendered().items():
        path = ROOT / rel
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            written.append(path)
        else:
            unchanged.append(path)
    return written, unchanged


def stale() -> list[str]:
    """Kit-relative paths of the ``expected.json`` files that are missing or differ from the staff answers."""
    return [rel for rel, text in rendered().items()
            if not (ROOT / rel).is_file() or (ROOT / rel).read_text() != text]
