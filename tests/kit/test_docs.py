"""The staff documents say what the kit does (issues 12 and 36).

``README.md`` (the map, at most 200 lines) and the guides in ``docs/``: the
README's problem table has a row per problem of the folders, whose student files
are those holding its regions (so a sub-problem adds nothing to it), and its
points the rubric; every relative link leads to a file; every
``python -m grading`` command names a real subcommand and only options it
accepts, every script or test file a command names exists and accepts the
options given; no dated timings in prose. The student handout's sections,
points and markers are tested in ``test_handout.py``; the sub-problem guide is
followed literally in ``test_adding_a_subproblem.py``.
"""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from common import ROOT
from grading.__main__ import main
from grading.commands.release import student_readme
from grading.engine.rubric import selects
from grading.kit.course import DEFAULT_PROBLEMS, is_example, present_problems
from grading.problems import titles
from common.regions import student_files

pytestmark = pytest.mark.kit

README = ROOT / "README.md"
GUIDES = ("adding-a-subproblem", "grading-a-class", "gradescope", "sandbox", "design", "distributed-failures",
          "mutation-analysis", "settings", "clauses")
# Written by ``python -m grading docs`` from the folders' variants (test_variants.py keeps it fresh): a table of
# contract sentences, which need not link anything and may quote a contract's durations ("a 60 s timeout").
GENERATED = ("clauses",)
DOCUMENTS = [README, *(ROOT / "docs" / f"{name}.md" for name in GUIDES)]
WRITTEN = [doc for doc in DOCUMENTS if doc.stem not in GENERATED]
README_MAX_LINES = 200
PLACEHOLDER = re.compile(r"^[A-Z][A-Z_]*(/.*)?$|^/tmp/|^S$")     # SUBMISSIONS_DIR, OUT_DIR/..., /tmp/starter, S
GRADING, PYTEST = ("python", "-m", "grading"), ("python", "-m", "pytest")


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _table_ids(text: str) -> list[str]:
    return re.findall(r"^\| (\d+\.\d+) \|", text, flags=re.MULTILINE)


def _problem_rows(text: str) -> dict[str, str]:
    """Problem number -> the rest of its row in the README's problem table (``| 2 | files | what |``)."""
    return dict(re.findall(r"^\| (\d+) \| (.*)$", text, flags=re.MULTILINE))


def commands(text: str) -> list[list[str]]:
    """Every command a document gives: the lines of its indented or fenced blocks and the inline code spans that
    start with ``python``, ``bash`` or ``pip``, split at ``&&``/``;``, without comments or optional brackets."""
    lines, fence = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            fence = None if fence is not None else line[3:].strip()
        elif fence in ("", "sh", "bash", "console") or (fence is None and line.startswith("    ")):
            lines.append(line.strip())
    lines += [span for span in re.findall(r"`([^`\n]+)`", text) if span.startswith(("python ", "bash ", "pip "))]
    found = []
    for line in lines:
        for part in re.split(r"&&|;", line.split("  #")[0]):
            if not re.match(r"\s*(?:[A-Z_]+=\S*\s+)*(?:python3?|bash|pip) ", part):
                continue
            words = [w for w in shlex.split(part.replace("[", " ").replace("]", " ")) if w != "|"]
            while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):     # VAR=value before the command
                words = words[1:]
            if words and words[0] in ("python", "python3", "bash", "pip"):
                found.append(words)
    return found


def _options(words: list[str]) -> list[str]:
    return sorted({w.split("=")[0] for w in words if re.fullmatch(r"--[a-z][\w-]*(=\S*)?", w)})


def _all_commands() -> list[tuple[str, list[str]]]:
    return [(_name(doc), words) for doc in DOCUMENTS for words in commands(doc.read_text())]


def _grading_help(subcommand: str, capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        main([subcommand, "--help"])
    assert stop.value.code == 0, f"python -m grading {subcommand}: no such command"
    return capsys.readouterr().out


# ------------------------------------------------------------------------------------------- the README
@pytest.mark.parametrize("readme", ["README.md", "student"])
def test_readme_tables_list_the_default_problems(readme):
    if readme == "README.md":                      # a row per problem
        rows = list(_problem_rows(README.read_text()))
        assert rows[:len(DEFAULT_PROBLEMS)] == list(DEFAULT_PROBLEMS), f"README.md: the problem table lists {rows}"
        return
    ids = _table_ids(student_readme(ROOT, DEFAULT_PROBLEMS))      # a row per sub-problem
    default = [p for p in titles() if any(selects(d, p) for d in DEFAULT_PROBLEMS)]
    assert ids[:len(default)] == default, f"{readme}: the problem table lists {ids}, the rubric {default}"
    assert set(ids) <= set(titles())


def test_readme_is_the_map_of_at_most_200_lines():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; guides belong in docs/"
    courses = [p for p in present_problems() if not is_example(p)]
    assert list(_problem_rows(README.read_text())) == courses, "the README's table lists every problem a course " \
        "may choose (not the examples), in order"


def test_readme_problem_rows_name_the_files_of_their_regions():
    """A row's student files are exactly those holding its problem's regions (read from the markers, so a new
    sub-problem in a file its problem has already changes nothing), and "(optional)" marks exactly the problems
    beyond the default assignment."""
    for problem, row in _problem_rows(README.read_text()).items():
        named, regions_in = re.findall(r"`([^`]+)`", row.split(" | ")[0]), student_files(ROOT, (problem,))
        assert sorted(named) == regions_in, f"README.md: Problem {problem}'s row names {named}, its regions are in " \
            f"{regions_in}"
        assert ("(optional)" in row) == (problem not in DEFAULT_PROBLEMS), f"README.md: Problem {problem}: {row}"


# ------------------------------------------------------------------------------------------- every document
def test_every_guide_exists_and_the_readme_links_it():
    text = README.read_text()
    for doc in DOCUMENTS[1:]:
        assert doc.is_file(), f"{_name(doc)} is missing"
        assert f"]({_name(doc)})" in text, f"README.md does not link {_name(doc)}"
    assert sorted(p.name for p in (ROOT / "docs").glob("*.md")) == sorted(f"{n}.md" for n in GUIDES)


@pytest.mark.parametrize("doc", DOCUMENTS, ids=_name)
def test_relative_links_lead_to_files(doc):
    links = re.findall(r"\]\(([^)\s]+)\)", doc.read_text())
    assert links or doc not in WRITTEN, f"{_name(doc)} links nothing"
    for link in links:
        if re.match(r"[a-z]+://|#|mailto:", link):
            continue
        target = (doc.parent / link.split("#")[0]).resolve()
        assert target.exists(), f"{_name(doc)}: the link ({link}) leads nowhere"


@pytest.mark.parametrize("doc", WRITTEN, ids=_name)
def test_no_dated_timings_in_prose(doc):
    """Timings live in what the benchmarks print: no dates, no measured seconds or minutes in the documents."""
    text = doc.read_text()
    assert not re.findall(r"\b20\d\d-\d\d-\d\d\b", text), f"{_name(doc)}: a dated entry"
    timings = re.findall(r"\b\d+(?:\.\d+)?(?:[-–]\d+(?:\.\d+)?)?\s*(?:s|min|minutes|seconds|CPU-s|CPU-seconds)\b",
                         text)
    assert not timings, f"{_name(doc)}: timings in prose {timings}"


def test_the_documents_give_commands():
    found = _all_commands()
    assert sum(words[:3] == list(GRADING) for _, words in found) >= 15
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1].split()     # .ci/run's test command
    assert ci[:3] == ["python3", "-m", "pytest"] and ("README.md", ["python", *ci[1:]]) in found, ci


def test_grading_commands_exist_with_the_options_given(capsys):
    by_command: dict[str, set[str]] = {}
    for where, words in _all_commands():
        if words[:3] == list(GRADING):
            assert len(words) > 3, f"{where}: {' '.join(words)} names no command"
            by_command.setdefault(words[3], set()).update(_options(words[4:]))
    documented = {"grade", "list", "release", "gradescope", "batch", "fixtures", "similarity", "benchmarks"}
    assert documented <= set(by_command), f"no document shows {documented - set(by_command)}"
    for command, options in sorted(by_command.items()):
        accepted = _grading_help(command, capsys)
        unknown = [o for o in sorted(options) if not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", accepted)]
        assert not unknown, f"python -m grading {command} does not accept {unknown}"


def _script_targets() -> dict[tuple[str, ...], set[str]]:
    """(how to run it) -> the options the documents pass, for every kit script or module a command runs."""
    targets: dict[tuple[str, ...], set[str]] = {}
    for where, words in _all_commands():
        if words[0] == "pip" or words[:3] in (list(GRADING), list(PYTEST)) or words[1] == "-c":
            continue
        if words[1] == "-m":
            module = words[2]
            assert (ROOT / (module.replace(".", "/") + ".py")).is_file(), f"{where}: no module {module}"
            target = (words[0], "-m", module)
        else:
            path = words[1]
            if PLACEHOLDER.match(path):
                continue
            assert (ROOT / path).is_file(), f"{where}: {path} does not exist"
            target = (words[0], path)
        targets.setdefault(target, set()).update(_options(words))
    return targets


def test_scripts_exist_and_accept_the_options_given():
    targets = _script_targets()
    assert ("python", "project/run_data_parallel.py") in targets
    for target, options in sorted(targets.items()):
        if target[0] == "bash":       # a shell script documents its options in its opening comment
            accepted = (ROOT / target[1]).read_text()
        else:
            argv = [sys.executable, *target[1:], "--help"]
            done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, f"{' '.join(target)} --help: {done.stderr[-1500:]}"
            accepted = done.stdout
        unknown = [o for o in sorted(options) if not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", accepted)]
        assert not unknown, f"{' '.join(target)} does not accept {unknown}"


def test_pytest_commands_name_real_markers_and_files():
    markers = {"p" + p.replace(".", "_") for p in titles()} | {"kit", "project"}
    for where, words in _all_commands():
        if words[:3] != list(PYTEST):
            continue
        args = words[3:]
        for flag, value in zip(args, args[1:]):
            if flag == "-m":
                named = set(re.findall(r"\w+", value)) - {"or", "and", "not"}
                assert named <= markers, f"{where}: unknown markers {named - markers}"
        for path in (a for a in args if a.startswith("tests/")):
            assert (ROOT / path.split("::")[0]).exists(), f"{where}: {path} does not exist"
