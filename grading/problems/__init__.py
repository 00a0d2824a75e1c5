"""The sub-problems, one folder each, found by import (no list to keep in step).

A folder is a package whose ``__init__.py`` sets ``ID`` and ``TITLE``; its ``checks.py`` defines ``PROBLEM`` (a
``grading.kit.problem.SubProblem``, whose module says what a folder holds). A starter holds only the folders of
the problems its course chose, so discovery finds just those.
"""
from __future__ import annotations

import functools
import importlib
import pkgutil
from types import ModuleType

from grading.engine.rubric import Case, check_rubric, selects
from grading.kit.course import chosen_problems
from grading.kit.problem import SubProblem


def _order(problem: str) -> list[int]:
    return [int(part) for part in problem.split(".")]


@functools.cache
def folders() -> dict[str, ModuleType]:
    """Sub-problem id ("2.2") -> its folder's package, in rubric order (imports only the ``__init__`` files)."""
    found: dict[str, ModuleType] = {}
    for info in pkgutil.iter_modules(__path__):
        if not info.ispkg:
            continue
        package = importlib.import_module(f"{__name__}.{info.name}")
        prefix = "p" + package.ID.replace(".", "_") + "_"
        if not info.name.startswith(prefix):
            raise ValueError(f"folder {info.name} declares ID {package.ID!r}: name it {prefix}<name>")
        if package.ID in found:
            raise ValueError(f"two folders declare sub-problem {package.ID}: {found[package.ID].__name__}, "
                             f"{package.__name__}")
        found[package.ID] = package
    return dict(sorted(found.items(), key=lambda item: _order(item[0])))


def titles() -> dict[str, str]:
    """Sub-problem id -> title, for every folder present."""
    return {problem: package.TITLE for problem, package in folders().items()}


def sub_problem(problem: str) -> SubProblem:
    """The ``SubProblem`` of ``problem`` ("2.2"), declared in its folder's ``checks.py``."""
    declared = importlib.import_module(f"{folders()[problem].__name__}.checks").PROBLEM
    if declared.id != problem:
        raise ValueError(f"{folders()[problem].__name__}: checks.py declares {declared.id}, the folder {problem}")
    return declared


def load_cases(problems: tuple[str, ...] | list[str]) -> list[Case]:
    """Every case to run for the chosen ``problems`` (e.g. ("1", "2", "3")), hidden ones on the staff side."""
    cases: list[Case] = []
    for problem in folders():
        if any(selects(p, problem) for p in problems):
            cases.extend(sub_problem(problem).graded_cases())
    check_rubric(cases, set(folders()))
    return cases


def all_cases(problems: tuple[str, ...] | None = None) -> list[Case]:
    """Every case of ``problems`` (default: this course's choice), hidden ones on the staff side."""
    return load_cases(problems if problems is not None else chosen_problems())
