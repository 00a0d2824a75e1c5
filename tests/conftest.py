"""Shared pytest plumbing: grade exactly as the course does, once per session, and look up criteria.

``tests/test_problems.py`` is one thin wrapper: every check lives in
``grading/problems/<folder>/checks.py``; a test only asks the cached runner
for one criterion's verdict. Like ``python -m grading grade``, the session
first splices the region bodies of this folder into a fresh copy of the kit
(in a starter: into the pristine files), so a helper added outside a region,
or a changed provided file, counts here exactly as it counts for the course;
every such change is listed at the end. The problems under test are those
whose folders are present: in a starter, exactly the course's choice; in the
kit, all of them. Markers (``p1_1`` ... ``p5_2``) come from the folders.

Tests marked ``project`` run the entry points in this process where they can;
their ranks then fork from this process's rank server (``project.rank_start``),
which lives as long as the process and keeps what it imported: it is started
before the first such test (or run: ``start_project_rank_server``) and imports
every library a project rank preloads while that test prepares its data.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from common import ROOT
from common.startup import collect_less
from grading.engine.rubric import selects
from grading.engine.runner import CriterionResult, run_case, warm_servers
from grading.kit import points
from grading.kit.course import present_problems
from grading.kit.submission import SpliceReport, build_grading_copy
from grading.problems import all_cases, titles

_NOTES: list[str] = []


def pytest_configure(config) -> None:
    collect_less()      # a test process imports torch, transformers and DeepSpeed, as the grader's do
    for problem, title in titles().items():
        config.addinivalue_line("markers", f"p{problem.replace('.', '_')}: Problem {problem} {title}")


def pytest_collection_modifyitems(items) -> None:
    """The files marked ``long_file`` first, each file's tests and the other files in their order: under the
    README's ``-n 3 --dist loadfile --no-loadscope-reorder`` workers take files in this order, so no long file
    starts last."""
    items.sort(key=lambda item: item.get_closest_marker("long_file") is None)


POINTS_PROPERTY = "criterion_points"     # a test's user property: what its criterion earned (record_points)
_POINTS: list[SimpleNamespace] = []      # in the process that prints the summary (with -n, the controller)


def record_points(request, result: CriterionResult) -> None:
    """Attach what ``result`` earned to the running test, for the summary's points lines (pytest carries a test's
    user properties to the controller under ``-n``)."""
    request.node.user_properties.append((POINTS_PROPERTY, {"problem": result.problem, "hidden": result.hidden,
                                                           "score": result.score, "max_score": result.max_score}))


def pytest_runtest_logreport(report) -> None:
    if report.when == "call":
        _POINTS.extend(SimpleNamespace(**value) for name, value in report.user_properties if name == POINTS_PROPERTY)


def pytest_terminal_summary(terminalreporter) -> None:
    for note in _NOTES:
        terminalreporter.write_line(f"NOTE (graded as the course grades it): {note}")
    if _POINTS:     # the same wording as `python -m grading grade` (grading/kit/points.py)
        for line in points.problem_lines(_POINTS, points.scored):
            terminalreporter.write_line(line)


KIT_SETTINGS = ("GRADING_", "KIT_")     # the prefixes of the kit's own environment settings


def _kit_settings() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(KIT_SETTINGS)}


@pytest.fixture(autouse=True)
def _kit_settings_kept():
    """Fail a test that leaves one of the kit's settings (``GRADING_*``, ``KIT_*``) changed in ``os.environ``, and
    undo the change: a course choice set in this process (an in-process ``grade --problems``, say) would change
    what every later test of the process grades. (Libraries' own variables, set once, are not the tests'.)"""
    before = _kit_settings()
    yield
    after = _kit_settings()
    if after != before:
        for key in after:
            os.environ.pop(key)
        os.environ.update(before)
        changed = sorted(k for k in {*before, *after} if before.get(k) != after.get(k))
        pytest.fail(f"the test left the kit's settings changed (now undone): {', '.join(changed)}", pytrace=False)


def start_project_rank_server() -> None:
    """This process's rank server, importing every project preload (see the module docstring), if it is not
    running yet; nothing where ranks start fresh. Call it before the first run that starts ranks."""
    from project.rank_start import start_rank_server
    from project.run_finetune import RANK_IMPORTS      # GPT-2 and DeepSpeed: every project rank's preloads

    start_rank_server(RANK_IMPORTS)


@pytest.fixture(autouse=True)
def _project_rank_server(request) -> None:
    """Before a ``project`` test: ``start_project_rank_server``."""
    if request.node.get_closest_marker("project"):
        start_project_rank_server()


def graded_cases() -> list:
    """The cases of every problem present (hidden ones on the staff side)."""
    return all_cases(tuple(present_problems()))


def criterion_params(problem: str | None = None) -> list:
    """pytest params, one per criterion (of ``problem``, or all), each marked ``p<sub-problem with _>``, e.g. p1_2."""
    return [pytest.param(c.id, id=c.id, marks=getattr(pytest.mark, "p" + c.problem.replace(".", "_")))
            for case in graded_cases() for c in case.criteria if selects(problem, c.problem)]


@pytest.fixture(scope="session")
def graded_copy(tmp_path_factory) -> tuple[Path, SpliceReport]:
    """(grading copy with this folder's region bodies spliced in, what the splice found: notes, refused problems,
    hints)."""
    dest = tmp_path_factory.mktemp("grading") / "graded"
    splice = build_grading_copy(ROOT, ROOT, dest)
    _NOTES.extend(splice.notes())
    return dest, splice


@pytest.fixture(scope="session", autouse=True)
def session_tmpdir(tmp_path_factory) -> Path:
    """Where every temporary file of this process, and of what it starts, goes (``TMPDIR``): a folder of pytest's
    for the session, which pytest removes a few sessions later, instead of /tmp (the scratch folder of a grade a
    test kills, torchrun's error files)."""
    folder = tmp_path_factory.mktemp("tmp", numbered=False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(folder))
        tempfile.tempdir = None         # the standard library reads TMPDIR once: have it read it again
        yield folder
    tempfile.tempdir = None


@pytest.fixture(scope="session", autouse=True)
def fork_servers(session_tmpdir):
    """The session's fork servers (``common.forkserver``: they hold library modules only and fork ranks for
    any grading copy), shared by the grading runs of the tests and, through ``GRADING_FORKSERVER_POOL``, by every
    ``python -m grading`` a test starts (they fork its ``grade`` too), as ``batch`` shares its own with its grades;
    None under ``GRADING_FORKSERVER=0`` (cold ranks). Two of them, the default ``GRADING_FORKSERVERS``: a grade
    that shares a pool of one starts a second server of its own for each case whose ranks must differ in hash
    seed (``ForkServers.holders``)."""
    servers = warm_servers(ROOT)
    with pytest.MonkeyPatch.context() as patch:
        for key, value in (servers.pool_env() if servers is not None else {}).items():
            patch.setenv(key, value)
        yield servers
    if servers is not None:
        servers.close()


@pytest.fixture(scope="session")
def grade(tmp_path_factory, graded_copy, fork_servers):
    """``grade(criterion_id) -> CriterionResult``, spawning each case at most once per session (warm ranks, as
    ``grade`` runs them)."""
    code_root, splice = graded_copy
    cases = {c.id: case for case in graded_cases() for c in case.criteria}
    results: dict[str, dict[str, CriterionResult]] = {}
    work = tmp_path_factory.mktemp("grading")

    def verdict(criterion_id: str) -> CriterionResult:
        case = cases[criterion_id]
        if case.name not in results:
            results[case.name] = {v.id: replace(v, message=splice.student_lines(v.message))
                                  for v in run_case(case, code_root, work, refused=splice.refused, hints=splice.hints,
                                                    servers=fork_servers)}
        return results[case.name][criterion_id]
    return verdict


def assert_passed(result: CriterionResult) -> None:
    """Fail the test with the criterion's own message unless it passed."""
    if not result.passed:
        pytest.fail(f"{result.id} ({result.title}): {result.status}\n{result.message}", pytrace=False)
