"""Issues 19.5, 36 and 37.5: the sub-problem guide, followed literally on a copy of the kit, is complete.

The test reads every file block of ``docs/adding-a-subproblem.md`` (``File `PATH`:`` followed by a fenced
block: the whole file; ``(append)``: added at its end; ``(table row)``: a row of the README's problem table,
in problem order; ``(into NAME)``: added at the end of the literal list or dict ``NAME``), writes them into a
temporary copy of the kit and checks what the guide promises: the expected values are written by ``grading
fixtures``, the reference scores full marks (the hidden criterion included), a released starter scores zero
and holds neither the staff part nor anything shaped like the answer, and the guide's variants lose exactly
their criteria. The copy also gets a second toy of another shape in an *existing* problem (``SECOND``: the
next free id of Problem 1, two ranks, in ``data_parallel/comm.py`` beside Problem 1.2's regions), written
with the same kinds of block into its student file and its folder only, and a new optional problem *number*
(``NEW``: the next free number, e.g. Problem 6, with one sub-problem in a new student file, its handout
section, README row, written-analysis questions and optional files), so the guide's list of files is all a
sub-problem or a problem needs: with all three present and the clause map written, the kit's tests that
enumerate problems (the toys' variants, graded in groups of their own, and the variants' checks over every folder,
the clause map, the handout's sections, points, plurals, markers, plan, FAQ and analysis, the starter's data,
the Gradescope bundle, exception locations, hidden inputs, partial submissions, README) pass in the copy, so a
fact a test holds by hand fails here first. The tests that grade a whole problem (the starter's ``grade
--problem 1`` in test_handout.py, the bundle's run on Problem 1 in test_gradescope.py, the kit's variant
groups) derive their markers and totals from the same rubric and run in the kit only: too slow to repeat here.
The reserved ids (``grading.kit.course.is_example``) are refused as a course's choice.
"""
from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from common import ROOT
from grading.kit.course import (DEFAULT_PROBLEMS, EXAMPLE_PROBLEMS_FROM, is_example, parse_problems,
                                 present_problems, record_text)
from common.regions import STUDENT_PACKAGES, parse_regions
from grading.problems import titles
from grading.staff.handout.rubric import marker
from tests.kit.shapes import MIN_NODES, node_count, shape
from tests.commands import run_kit_command

pytestmark = [pytest.mark.kit, pytest.mark.long_file]
GUIDE = ROOT / "docs" / "adding-a-subproblem.md"
TOY = "90.1"
TOY_FOLDER = "grading/problems/p90_1_chunks"
TOY_FILE, TOY_FUNCTION = "data_parallel/dataset.py", "chunk_sizes"
README_ROW = re.compile(r"^\| (\d+) \|")          # a row of the README's problem table: one per problem

SECOND_TOY = f"1.{max(int(sub.split('.')[1]) for sub in titles() if sub.split('.')[0] == '1') + 1}"   # 1.3
SECOND_FOLDER = f"grading/problems/{marker(SECOND_TOY)}_allsum"
# The second toy, in the guide's kinds of block; @ID@ and @PKG@ stand for its id ("1.3") and marker ("p1_3").
SECOND_TEMPLATE = (Path(__file__).parent / "second_subproblem.md").read_text()
SECOND = SECOND_TEMPLATE.replace("@PKG@", marker(SECOND_TOY)).replace("@ID@", SECOND_TOY)
# A new optional problem number, the next free one (6 today), with one sub-problem; @N@ stands for its number.
NEW_PROBLEM = str(max(int(p) for p in present_problems() if not is_example(p)) + 1)
NEW_SUB = f"{NEW_PROBLEM}.1"
NEW_FOLDER = f"grading/problems/{marker(NEW_SUB)}_commcost"
NEW = ((Path(__file__).parent / "new_problem.md").read_text().replace("@PKG@", marker(NEW_SUB))
       .replace("@ID@", NEW_SUB).replace("@N@", NEW_PROBLEM))
# The kit's tests that enumerate problems, run in the toy copy in one pytest process (cheap ones: five releases,
# one Gradescope bundle, one `list`, the toys' grades). Of tests/kit/test_variants.py only the tests that grade
# nothing (``variants_k``): its groups mix every sub-problem's variants, so the toys' variants are graded in groups
# of their own (``TOY_VARIANTS``), by the function the kit's groups are graded with.
_HANDOUT = "tests/kit/test_handout.py::test_"
VARIANTS_TEST = "tests/kit/test_variants.py"
GRADING_TESTS = ("test_variant_loses_only_its_criteria", "test_starter_loses_every_criterion_as_not_implemented")
ENUMERATING = [
    VARIANTS_TEST,
    "tests/kit/test_docs.py::test_readme_is_the_map_of_at_most_200_lines",
    "tests/kit/test_docs.py::test_readme_tables_list_the_default_problems",
    "tests/kit/test_docs.py::test_readme_problem_rows_name_the_files_of_their_regions",
    "tests/kit/test_docs.py::test_pytest_commands_name_real_markers_and_files",
    f"{_HANDOUT}a_section_per_chosen_problem_with_the_rubric_points",       # [everything] and [default]
    f"{_HANDOUT}default_release_mentions_no_optional_problem",
    f"{_HANDOUT}markers_and_entry_points_of_optional_problems_only_in_their_sections",
    f"{_HANDOUT}optional_problems_are_stated_as_part_of_the_grade_when_handed_out",
    f"{_HANDOUT}every_section_says_what_to_observe_and_the_suggested_order_and_time",
    f"{_HANDOUT}the_written_analysis_in_the_readme_the_template_and_the_course_record",
    f"{_HANDOUT}the_starters_list_states_each_problems_points_as_its_handout_does",
    f"{_HANDOUT}faq_holds_every_exception_hint_and_a_section_per_folder_with_likely_causes",
    f"{_HANDOUT}a_problems_plan_is_its_sub_problems_steps_in_id_order",
    "tests/kit/test_answer_key.py::test_the_starter_leaves_out_the_staff_answers_and_keeps_data",
    "tests/kit/test_answer_key.py::test_committed_expected_values_match_the_staff_answers",
    "tests/kit/test_gradescope.py::test_bundle_holds_the_grader_but_no_reference_solution",
    "tests/kit/test_starter_entry_points.py::test_the_starters_files_mention_only_what_the_starter_has",
    "tests/kit/test_hidden_view.py::test_every_sub_problem_with_hidden_criteria_says_their_kind_in_a_students_words",
    "tests/kit/test_answer_key.py::test_hidden_inputs_follow_the_course_secret",
    "tests/kit/test_exception_locations.py::test_every_sub_problem_has_a_planted_region",
    f"tests/kit/test_exception_locations.py::test_the_failure_names_the_file_and_line_inside_the_region[{TOY}]",
    "tests/kit/test_exception_locations.py::test_the_failure_names_the_file_and_line_inside_the_region"
    f"[{SECOND_TOY}]",
    f"tests/kit/test_exception_locations.py::test_the_failure_names_the_file_and_line_inside_the_region[{NEW_SUB}]",
]
# The toys' variants (argv), in groups of their own, graded in the toy copy as tests/kit/test_variants.py grades a
# group; it prints each group it graded.
TOY_VARIANTS = """
import sys, tempfile
from pathlib import Path
from grading.commands.variants import all_variants, check_group, variant_groups
toys = set(sys.argv[1:])
with tempfile.TemporaryDirectory() as work:
    for k, group in enumerate(variant_groups([v for v in all_variants() if v.name in toys])):
        check_group(group, Path(work) / str(k))
        print("graded", "+".join(v.name for v in group))
"""
# What the partial-submission test derives, checked in the toy copy without its benchmark run.
PARTIAL = """
from common import ROOT
from tests.test_partial_submission import DONE_PROBLEM, done_subs
from common.regions import parse_regions, student_files
marked = {r.id for rel in student_files(ROOT) for r in parse_regions((ROOT / rel).read_text(), rel)}
mine = sorted((s for s in marked if s.split(".")[0] == DONE_PROBLEM), key=lambda s: int(s.split(".")[1]))
assert "@ID@" in done_subs() and done_subs() == tuple(mine), (done_subs(), mine)
print("partial ok")
""".replace("@ID@", SECOND_TOY)


def guide_files(text: str | None = None) -> list[tuple[str, str, str]]:
    """(path, kind, code) for every file block of ``text`` (default: the guide), in order; kind is "" (the whole
    file), "append", "table row" or "into NAME". A block fenced with four backticks may hold a fence of three."""
    blocks = re.finditer(r"File `(?P<path>[^`]+)`(?: \((?P<kind>append|table row|into \w+)\))?:\s*\n+"
                         r"(?P<fence>````?)\w+\n(?P<code>.*?)(?P=fence)",
                         GUIDE.read_text() if text is None else text, flags=re.S)
    return [(m.group("path"), m.group("kind") or "", m.group("code")) for m in blocks]


def toy_variants() -> list[str]:
    """The names of the toys' buggy variants, as their ``variants.py`` blocks declare them."""
    names = []
    for path, _, code in guide_files() + guide_files(SECOND) + guide_files(NEW):
        if path.endswith("/variants.py"):
            names += [node.args[0].value for node in ast.walk(ast.parse(code)) if isinstance(node, ast.Call)
                      and ast.unparse(node.func) == "Variant"]
    return names


def variants_k() -> str:
    """The ``-k`` of the nested run: every test of ``ENUMERATING`` but, of ``VARIANTS_TEST``, only the tests that
    grade nothing."""
    return f"not ({' or '.join(GRADING_TESTS)})"


def _add_row(text: str, row: str) -> str:
    """``text`` with the table ``row`` (one or more lines) inserted: a problem table row among the problem table's
    rows, in problem order; any other row after the last row of the text's last table."""
    lines = text.splitlines(keepends=True)
    row = row if row.endswith("\n") else row + "\n"
    if not README_ROW.match(row):
        last = max(k for k, line in enumerate(lines) if line.startswith("|"))
        return "".join(lines[:last + 1] + [row] + lines[last + 1:])
    key = int(README_ROW.match(row)[1])
    rows = [k for k, line in enumerate(lines) if README_ROW.match(line)]
    assert rows, "README.md has no problem table"
    after = [k for k in rows if int(README_ROW.match(lines[k])[1]) < key]
    lines.insert((after[-1] if after else rows[0] - 1) + 1, row)
    return "".join(lines)


def _into(text: str, name: str, code: str) -> str:
    """``text`` with ``code`` added at the end of the literal list or dict ``NAME = [`` / ``NAME = {``, before
    its closing bracket at the start of a line."""
    opened = re.search(rf"^{name} = [\[{{]\n", text, flags=re.M)
    assert opened, f"no literal {name} to add to"
    close = re.compile(r"^[\]}]", flags=re.M).search(text, opened.end())
    return text[:close.start()] + (code if code.endswith("\n") else code + "\n") + text[close.start():]


def _points(blocks: list[tuple[str, str, str]]) -> float:
    """The points of a toy's criteria, hidden ones included, as its blocks declare them (``points=`` of each
    criterion, the values of ``HIDDEN_POINTS``)."""
    total = 0.0
    for path, _, code in blocks:
        if not path.startswith("grading/problems/"):
            continue
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith(".criterion"):
                total += sum(ast.literal_eval(k.value) for k in node.keywords if k.arg == "points")
            elif isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["HIDDEN_POINTS"]:
                total += sum(ast.literal_eval(v) for v in node.value.values)
    return total


def _restate_default_points(kit: Path, blocks: list[tuple[str, str, str]]) -> None:
    """What the guide asks of a sub-problem in Problems 1-3: the README's "default assignment of N points" grows
    by its points."""
    readme = kit / "README.md"
    grown = re.sub(r"(default assignment of )(\d+)( points)",
                   lambda m: f"{m[1]}{float(m[2]) + _points(blocks):g}{m[3]}", readme.read_text())
    readme.write_text(grown)


def _write_blocks(kit: Path, blocks: list[tuple[str, str, str]]) -> None:
    for path, kind, code in blocks:
        target = kit / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if kind == "table row":
            target.write_text(_add_row(target.read_text(), code))
        elif kind.startswith("into "):
            target.write_text(_into(target.read_text(), kind.split()[1], code))
        else:
            target.write_text((target.read_text() + "\n\n" if kind == "append" else "") + code)


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return run_kit_command(list(args), cwd=cwd)


def _grade(cwd: Path, *args: str, problem: str = TOY) -> dict[str, float]:
    out = cwd / "toy_results.json"
    done = _run(cwd, "grade", *args, "--problem", problem, "--quiet", "--json", str(out))
    assert out.is_file(), done.stdout[-2000:] + done.stderr[-2000:]
    return {t["name"].split(":")[0]: t["score"] for t in json.loads(out.read_text())["tests"]}


def _clean_env() -> dict[str, str]:
    """This process's environment without what would point a nested run at this kit or this pytest session."""
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "GRADING_PROBLEMS") and not k.startswith(("PYTEST_", "COV_"))}


@pytest.fixture(scope="module")
def toy_kit(tmp_path_factory) -> Path:
    kit = tmp_path_factory.mktemp("toy") / "kit"
    shutil.copytree(ROOT, kit, ignore=shutil.ignore_patterns(".git", "__pycache__", "workdir", "*.pyc",
                                                                   ".pytest_cache", "submit_figures"))
    (kit / "submit_figures").mkdir()
    _write_blocks(kit, guide_files() + guide_files(SECOND) + guide_files(NEW))
    assert SECOND_TOY.split(".")[0] in DEFAULT_PROBLEMS
    _restate_default_points(kit, guide_files(SECOND))
    done = _run(kit, "fixtures")
    assert done.returncode == 0, done.stderr[-2000:]
    written = {Path(line[len("wrote "):]).resolve() for line in done.stdout.splitlines() if line.startswith("wrote ")}
    assert written == {(kit / folder / "expected.json").resolve() for folder in (TOY_FOLDER, SECOND_FOLDER,
                                                                                  NEW_FOLDER)}, \
        done.stdout                                    # the kit's own expected values were already up to date
    done = _run(kit, "docs")                           # step 6: the clause map, with the toys' clauses
    assert done.returncode == 0 and "wrote " in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    return kit


def test_the_guide_has_a_block_for_every_file_it_names():
    paths = [path for path, _, _ in guide_files()]
    assert paths == [TOY_FILE, f"{TOY_FOLDER}/__init__.py", f"{TOY_FOLDER}/checks.py", f"{TOY_FOLDER}/staff.py",
                     f"{TOY_FOLDER}/variants.py"]
    table = GUIDE.read_text().split("## Every file a new sub-problem touches")[1].split("\n## ")[0]
    for path, _, _ in guide_files() + guide_files(SECOND) + guide_files(NEW):    # every file a toy writes, in
        if path.split("/")[0] in STUDENT_PACKAGES:                                  # general form
            assert "| the student file (" in table, path
            continue
        generic = re.sub(r"^grading/problems/p\d+_\d+_\w+/.*", "grading/problems/p<N>_<M>_<name>/",
                         re.sub(r"(_p|/problem)\d+\.(py|md)$", r"\1<N>.\2", path))
        assert f"`{generic}`" in table, f"a toy writes {path}, which the guide's list of files does not name"


def test_the_toy_ids_are_reserved_and_no_real_problem_takes_one():
    assert is_example(TOY) and not is_example(SECOND_TOY) and not is_example("5.2")
    assert not [sub for sub in titles() if is_example(sub)], "a kit folder uses an example id"
    assert f"from {EXAMPLE_PROBLEMS_FROM} up are reserved for examples" in " ".join(GUIDE.read_text().split())
    with pytest.raises(ValueError, match=r"course record: 90 is an example"):
        record_text(("1", "90"), {})
    with pytest.raises(ValueError, match=r"course record: 90\.1 is an example"):
        record_text(("1",), {"90.1": 1.0})


def test_a_course_cannot_choose_an_example(toy_kit, tmp_path):
    out = tmp_path / "starter"
    done = _run(toy_kit, "release", str(out), "--problems", "1,2,3,90")
    err = done.stderr.strip()
    assert done.returncode == 2 and len(err.splitlines()) == 1, done.stdout[-1000:] + err[-2000:]
    assert "Problem 90 is an example" in err and "a course cannot choose one" in err, err
    assert not out.exists()
    with pytest.raises(ValueError, match="unknown 90"):        # the kit itself has no Problem 90
        parse_problems("1,90")


def test_the_guides_criteria_judge_one_split_run():
    """The toy is written in the framework's one style: a criterion takes ``run: SplitRun`` alone, and neither
    it nor the probe handles splits (no loop over them, no part names built from them)."""
    for text in (None, SECOND):
        files = {path: code for path, _, code in guide_files(text)}
        code = next(code for path, code in files.items() if path.endswith("/checks.py"))
        criteria = [node for node in ast.walk(ast.parse(code)) if isinstance(node, ast.FunctionDef)
                    and any("criterion" in ast.unparse(d) for d in node.decorator_list)]
        assert criteria
        for node in criteria:
            assert [(a.arg, ast.unparse(a.annotation)) for a in node.args.args] == [("run", "SplitRun")], node.name
        for old in ("split_part", "rank_inputs", "rank_expected", "splits", "inputs_for", "expected_for"):
            assert not re.search(rf"\b{old}\b", code), f"a toy's checks.py uses {old}: leave splits to the framework"


def test_a_judge_reading_a_part_its_criterion_does_not_name_is_a_grader_error(tmp_path):
    """``reads=`` stays true: a judge that reads a part its criterion does not declare fails as a bug in the checks
    (a grader error naming the criterion and the part), never as the student's; a declared read goes on to the
    run's own verdict. ``reads`` is required, and a bare string is refused."""
    from grading.engine.case_run import LaunchResult
    from grading.engine.rubric import Case
    from grading.engine.runner import Status, judge_case

    case = Case("toy_reads", probe=lambda ctx: None)

    @case.criterion("90.1.declared", "reads the part it declares", points=1, reads=("sizes",))
    def check_declared(run) -> None:
        run.part("sizes")

    @case.criterion("90.1.undeclared", "reads a part it does not declare", points=1, reads=("sizes",))
    def check_undeclared(run) -> None:
        run.parts("errors")

    declared, undeclared = judge_case(case, LaunchResult(tmp_path, 1))     # a run that recorded nothing
    assert declared.status == Status.FAILED and "no result for 'sizes'" in declared.message, declared.message
    assert undeclared.status == Status.GRADER_ERROR and undeclared.score == 0, undeclared.message
    assert ("ValueError: criterion 90.1.undeclared read the part 'errors', which its reads= does not name ('sizes')"
            in undeclared.message), undeclared.message
    with pytest.raises(TypeError, match="reads"):
        case.criterion("90.1.unstated", "states no reads", points=1)
    with pytest.raises(ValueError, match="reads= must be a tuple of part names"):
        case.criterion("90.1.string", "reads a bare string", points=1, reads="sizes")


def test_fixtures_write_the_expected_values(toy_kit):
    expected = json.loads((toy_kit / TOY_FOLDER / "expected.json").read_text())
    assert [[10, 3], [4, 3, 3]] in expected["sizes"]
    assert json.loads((toy_kit / SECOND_FOLDER / "expected.json").read_text()) == {"total": 3.75}


def test_the_reference_scores_full_marks_hidden_criterion_included(toy_kit):
    scores = _grade(toy_kit)
    assert scores == {"90.1.sizes": 2, "90.1.errors": 1, "90.1.sizes_hidden": 1}
    assert _grade(toy_kit, problem=SECOND_TOY) == {f"{SECOND_TOY}.total": 2, f"{SECOND_TOY}.total_hidden": 1}


def test_the_starter_scores_zero_and_holds_no_answer(toy_kit, tmp_path):
    starter = tmp_path / "starter"
    done = _run(toy_kit, "release", str(starter))
    assert done.returncode == 0, done.stderr[-2000:]
    for folder in (TOY_FOLDER, SECOND_FOLDER):
        assert not (starter / folder / "staff.py").exists()
        assert (starter / folder / "expected.json").is_file()
    assert not (starter / NEW_FOLDER).exists() and not (starter / "data_parallel/comm_cost.py").exists(), \
        f"the default starter holds optional Problem {NEW_PROBLEM}'s files (OPTIONAL_FILES)"
    assert set(_grade(starter).values()) == {0}
    region = next(r for r in parse_regions((toy_kit / TOY_FILE).read_text(), TOY_FILE)
                  if r.function == TOY_FUNCTION)
    answer = ast.parse(textwrap.dedent(region.body)).body
    assert node_count(answer) >= MIN_NODES
    for path in starter.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
                body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
                assert not body or shape(body) != shape(answer), f"{path}: {node.name} is shaped like the answer"


def test_a_starter_with_the_new_problem_states_its_one_point_and_one_hour_in_the_singular(toy_kit, tmp_path):
    """The new problem's blocks give it 3 public points, 1 hidden point and a step of (1, 1) hours: its handout
    section, the overview and the plan say so in the singular, and its range of equal ends as one number."""
    starter = tmp_path / "starter"
    done = _run(toy_kit, "release", str(starter), "--problems", ",".join((*DEFAULT_PROBLEMS, NEW_PROBLEM)))
    assert done.returncode == 0, done.stderr[-2000:]
    assert (starter / NEW_FOLDER / "expected.json").is_file() and (starter / "data_parallel/comm_cost.py").is_file()
    readme = " ".join((starter / "README.md").read_text().split())
    section = readme.split(f"## Problem {NEW_PROBLEM}: ")[1].split(" ## ")[0]
    assert section.startswith("Communication cost **Points:** 3 public points + 1 hidden point the course adds "
                              "when it grades (4 in all)."), section[:300]
    assert "; about 1 hour." in section and f"python -m pytest -m {marker(NEW_SUB)} " in section, section
    assert (f"Problem {NEW_PROBLEM} goes beyond the usual assignment (Problems 1-3) and your course hands it out, so "
            "it counts toward your grade like the others: 3 public points + 1 hidden point of the total above.") \
        in readme
    wrong = [m[0] for m in re.finditer(r"(?<![\d.-])(?:1 (?:hidden |public )?points|(\d+)-\1 hours|1 hours)\b",
                                       readme)]
    assert not wrong, f"the handout says {wrong}"


def test_with_both_toys_the_kit_tests_that_enumerate_problems_pass_unedited(toy_kit, fork_servers):
    """The variants (the toys' variants graded in groups of their own, as a kit group is graded, the second toy's
    although its file holds 1.2's regions, and the checks over every folder's variants), the clause map, the handout's
    sections, points, totals, plurals, markers, plan, FAQ and written analysis (the new optional problem's among
    them), the starters' data and files and the Gradescope bundle's (the new problem's left out unless chosen),
    the exception locations (the toys' own regions), the hidden inputs and their kind, the README table, points
    and markers, and what the partial-submission test fills (every region of Problem 1, the new one too), all in
    the copy holding both toys and the new problem."""
    env = _clean_env()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-k", variants_k(),
                           *ENUMERATING], cwd=toy_kit, env=env, capture_output=True, text=True, timeout=1200,
                          stdin=subprocess.DEVNULL)
    tail = done.stdout[-4000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    assert not re.search(r"\d+ (?:skipped|xfailed)", done.stdout), tail
    passed = re.findall(r"^PASSED (\S+)", done.stdout, flags=re.MULTILINE)
    for node in (n for n in ENUMERATING if n != VARIANTS_TEST):       # each passed (a parametrised id: each case)
        assert [p for p in passed if p == node or p.startswith(node + "[")], f"{node} did not pass:\n{tail}"
    tree = ast.parse((ROOT / VARIANTS_TEST).read_text())
    grading_nothing = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")
                       and n.name not in GRADING_TESTS]
    for name in grading_nothing:
        assert f"{VARIANTS_TEST}::{name}" in passed, f"{VARIANTS_TEST}::{name} did not pass:\n{tail}"
    assert not [p for p in passed if any(name in p for name in GRADING_TESTS)], "the nested run graded a group"
    graded = subprocess.run([sys.executable, "-c", TOY_VARIANTS, *toy_variants()], cwd=toy_kit, env=env,
                            capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert graded.returncode == 0, graded.stdout[-2000:] + graded.stderr[-4000:]
    groups = [line.split()[1].split("+") for line in graded.stdout.splitlines() if line.startswith("graded ")]
    assert sorted(n for g in groups for n in g) == sorted(toy_variants()), graded.stdout
    partial = subprocess.run([sys.executable, "-c", PARTIAL], cwd=toy_kit, env=env, capture_output=True, text=True,
                             timeout=300, stdin=subprocess.DEVNULL)
    assert partial.returncode == 0 and "partial ok" in partial.stdout, partial.stdout + partial.stderr[-2000:]


MUTANTS_SAMPLE = ("--sample", "2", "--seed", "12")       # two of the toy's 39 mutants: `parts <= 1`, `or` -> `and`


def test_mutants_on_the_toy_shows_a_killed_and_a_survived_mutant(toy_kit, tmp_path):
    """The guide's last step: ``mutants`` on the new sub-problem, before students see it (a seeded sample)."""
    command = re.search(r"python -m grading (mutants --problem \S+) --out \S+", GUIDE.read_text())
    assert command and command[1] == f"mutants --problem {TOY}", "the guide's last step runs mutants on the toy"
    done = _run(toy_kit, *command[1].split(), *MUTANTS_SAMPLE, "--out", str(tmp_path))
    report = json.loads((tmp_path / "mutants.json").read_text())
    counts = report["problems"][TOY]
    assert counts["killed"] >= 1 and counts["survived"] >= 1 and done.returncode == 1, done.stdout[-3000:]
    survivor = report["survivors"][0]
    assert survivor["diff"].startswith(f"--- a/{TOY_FILE}") and survivor["passed"], survivor
    assert survivor["id"] in (tmp_path / "mutants.html").read_text() and f"survived: {survivor['id']}" in done.stdout
