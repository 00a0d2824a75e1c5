"""Issues 19.5, 36 and 37.5: the sub-problem guide, followed literally on a copy of the kit, is complete.

The test reads every file block of ``docs/adding-a-subproblem.md`` (``File `PATH`:`` followed by a fenced
block: the whole file; ``(append)``: added at its end; ``(table row)``: a row of the README's problem table,
in id order), writes them into a temporary copy of the kit and checks what the guide promises: the expected
values are written by ``grading fixtures``, the reference scores full marks (the hidden criterion included), a
released starter scores zero and holds neither the staff part nor anything shaped like the answer, and the
guide's variant loses exactly its criteria. The copy also gets a second toy of another shape (``SECOND``:
91.1, two ranks, in ``data_parallel/comm.py`` beside Problem 1.2's regions), written with the same kinds of
block into the same files only, so the guide's list of files is all a sub-problem needs: with both toys
present, the kit's tests that enumerate problems (the variants helper, handout, exception locations, partial
submissions, README) pass in the copy. The reserved ids (``grading.kit.course.is_example``) are refused as a
course's choice.
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

from grading import KIT_ROOT
from grading.engine.hints import STUDENT_PACKAGES
from grading.kit.course import EXAMPLE_PROBLEMS_FROM, is_example, parse_problems, record_text
from grading.kit.regions import parse_regions
from grading.problems import titles
from tests.kit.shapes import MIN_NODES, node_count, shape
from tests.commands import run_kit_command

pytestmark = pytest.mark.kit
GUIDE = KIT_ROOT / "docs" / "adding-a-subproblem.md"
TOY = "90.1"
TOY_FOLDER = "grading/problems/p90_1_chunks"
TOY_FILE, TOY_FUNCTION = "data_parallel/dataset.py", "chunk_sizes"
README_ROW = re.compile(r"^\| (\d+)\.(\d+) \|")

SECOND_TOY, SECOND_FOLDER = "91.1", "grading/problems/p91_1_allsum"
SECOND = '''
File `data_parallel/comm.py` (append):

```python
def all_sum(value: float) -> float:
    """The sum of every rank's ``value`` over the default process group; every rank returns the same sum.

    ``all_sum(rank + 1.0)`` on 2 ranks returns 3.0 on both.
    """
    # BEGIN_STUDENT 91.1
    total = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total.item()
    # END_STUDENT 91.1
```

File `grading/problems/p91_1_allsum/__init__.py`:

```python
"""Problem 91.1: Example: a sum over ranks (see checks.py)."""
ID = "91.1"
TITLE = "Example: a sum over ranks"
```

File `grading/problems/p91_1_allsum/checks.py`:

```python
"""Problem 91.1 checks: ``all_sum`` on two ranks against the sum stored as data."""
from __future__ import annotations

from dataclasses import dataclass

from grading.engine.expect import expect
from grading.engine.rubric import SplitRun
from grading.kit.problem import SubProblem
from grading.problems.p91_1_allsum import ID, TITLE

WORLD_SIZE = 2


@dataclass(frozen=True)
class Inputs:
    """The value each rank passes, by rank."""

    values: tuple[float, ...]


@dataclass(frozen=True)
class Expected:
    """The sum every rank must return."""

    total: float


PROBLEM = SubProblem(ID, TITLE, __package__, inputs=Inputs(values=(1.5, 2.25)), expected_type=Expected)
P_TOTAL = "total"


def probe_all_sum(ctx) -> None:
    """Record, on every rank, what all_sum returns for that rank's value of every split."""
    from data_parallel.comm import all_sum

    PROBLEM.each_split(ctx, lambda inputs: ctx.record(P_TOTAL, lambda: all_sum(inputs.values[ctx.rank])))


CASE = PROBLEM.case("p91_all_sum", probe_all_sum, world_size=WORLD_SIZE, timeout_s=60, split_parts=(P_TOTAL,))


@CASE.criterion("91.1.total", "all_sum: every rank returns the sum over all ranks", points=2)
def check_total(run: SplitRun) -> None:
    for rank in range(run.world_size):
        got = run.part(P_TOTAL, rank)
        expect(abs(got - run.expected.total) <= 1e-9,
               f"all_sum: rank {rank} returned {got}, expected {run.expected.total} (the sum over all ranks)")
```

File `grading/problems/p91_1_allsum/staff.py`:

```python
"""Staff only (never released): the 91.1 answer, hidden inputs and hidden criteria."""
from __future__ import annotations

import random

from grading.problems.p91_1_allsum import checks
from grading.problems.p91_1_allsum.checks import Expected, Inputs


def expected(inputs: Inputs) -> Expected:
    """The sum every rank must return on ``inputs``."""
    return Expected(total=sum(inputs.values))


def hidden_inputs(rng: random.Random) -> Inputs:
    """A value per rank no public input covers."""
    return Inputs(values=tuple(rng.randint(3, 90) + 0.5 for _ in range(checks.WORLD_SIZE)))


HIDDEN_POINTS = {checks.check_total: 1}
```

File `README.md` (table row):

```markdown
| 91.1 | `data_parallel/comm.py` | (example) `all_sum` |
```

File `tests/kit/test_variants_p91.py`:

```python
"""Problem 91 (the guide test's second example) buggy variants."""
import pytest

from tests.kit.variants import Variant, assert_verdicts, grade_variant

VARIANTS = [
    Variant("own_value_only", "data_parallel/comm.py", "all_sum", "return float(value)",
            frozenset({"91.1.total", "91.1.total_hidden"}), hint="all_sum: rank 0 returned 1.5"),
]


@pytest.mark.kit
@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
def test_variant_loses_only_its_criteria(variant, tmp_path, fork_servers):
    assert_verdicts(grade_variant(variant, variant.problem, tmp_path, fork_servers), [variant])
```
'''
# The kit's tests that enumerate problems, run in the toy copy (cheap ones: one release, the toys' grades).
ENUMERATING = [
    "tests/kit/test_variants_p90.py", "tests/kit/test_variants_p91.py",
    "tests/kit/test_docs.py::test_readme_is_the_map_of_at_most_200_lines",
    "tests/kit/test_docs.py::test_readme_tables_list_the_default_problems",
    "tests/kit/test_docs.py::test_readme_states_the_default_assignments_points",
    "tests/kit/test_docs.py::test_pytest_commands_name_real_markers_and_files",
    "tests/kit/test_handout.py::test_a_section_per_chosen_problem_with_the_rubric_points[default]",
    "tests/kit/test_handout.py::test_default_release_mentions_neither_optional_problem",
    "tests/kit/test_exception_locations.py::test_every_sub_problem_has_a_planted_region",
    f"tests/kit/test_exception_locations.py::test_the_failure_names_the_file_and_line_inside_the_region[{TOY}]",
    "tests/kit/test_exception_locations.py::test_the_failure_names_the_file_and_line_inside_the_region"
    f"[{SECOND_TOY}]",
]
# What the partial-submission test derives, checked in the toy copy without its benchmark run.
PARTIAL = """
from tests.test_partial_submission import ROOT, done_subs
from grading.kit.regions import student_files
assert done_subs() == ("1.1", "1.2"), done_subs()
assert "data_parallel/comm.py" in student_files(ROOT, ("1",))      # it holds 91.1 too: only 1.x regions are filled
print("partial ok")
"""


def guide_files(text: str | None = None) -> list[tuple[str, str, str]]:
    """(path, kind, code) for every file block of ``text`` (default: the guide), in order; kind is "" (the whole
    file), "append" or "table row"."""
    blocks = re.finditer(r"File `(?P<path>[^`]+)`(?: \((?P<kind>append|table row)\))?:\s*\n+```\w+\n(?P<code>.*?)```",
                         GUIDE.read_text() if text is None else text, flags=re.S)
    return [(m.group("path"), m.group("kind") or "", m.group("code")) for m in blocks]


def _add_row(text: str, row: str) -> str:
    """``text`` with the table ``row`` inserted among the problem table's rows, in id order."""
    lines = text.splitlines(keepends=True)
    key = [int(n) for n in README_ROW.match(row).groups()]
    rows = [k for k, line in enumerate(lines) if README_ROW.match(line)]
    assert rows, "README.md has no problem table"
    after = [k for k in rows if [int(n) for n in README_ROW.match(lines[k]).groups()] < key]
    lines.insert((after[-1] if after else rows[0] - 1) + 1, row if row.endswith("\n") else row + "\n")
    return "".join(lines)


def _write_blocks(kit: Path, blocks: list[tuple[str, str, str]]) -> None:
    for path, kind, code in blocks:
        target = kit / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if kind == "table row":
            target.write_text(_add_row(target.read_text(), code))
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
    shutil.copytree(KIT_ROOT, kit, ignore=shutil.ignore_patterns(".git", "__pycache__", "workdir", "*.pyc",
                                                                   ".pytest_cache", "submit_figures"))
    (kit / "submit_figures").mkdir()
    _write_blocks(kit, guide_files() + guide_files(SECOND))
    done = _run(kit, "fixtures")
    assert done.returncode == 0, done.stderr[-2000:]
    return kit


def test_the_guide_has_a_block_for_every_file_it_names():
    paths = [path for path, _, _ in guide_files()]
    assert paths == [TOY_FILE, f"{TOY_FOLDER}/__init__.py", f"{TOY_FOLDER}/checks.py", f"{TOY_FOLDER}/staff.py",
                     "README.md", "tests/kit/test_variants_p90.py"]
    table = GUIDE.read_text().split("## Every file a new sub-problem touches")[1].split("\n## ")[0]
    for path, _, _ in guide_files() + guide_files(SECOND):      # every file either toy writes, in general form
        if path.split("/")[0] in STUDENT_PACKAGES:
            assert "| the student file (" in table, path
            continue
        generic = re.sub(r"^grading/problems/p\d+_\d+_\w+/.*", "grading/problems/p<N>_<M>_<name>/",
                         re.sub(r"_p\d+\.py$", "_p<N>.py", path))
        assert f"`{generic}`" in table, f"a toy writes {path}, which the guide's list of files does not name"


def test_the_toy_ids_are_reserved_and_no_real_problem_takes_one():
    assert is_example(TOY) and is_example(SECOND_TOY) and not is_example("5.2")
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


def test_fixtures_write_the_expected_values(toy_kit):
    expected = json.loads((toy_kit / TOY_FOLDER / "expected.json").read_text())
    assert [[10, 3], [4, 3, 3]] in expected["sizes"]
    assert json.loads((toy_kit / SECOND_FOLDER / "expected.json").read_text()) == {"total": 3.75}


def test_the_reference_scores_full_marks_hidden_criterion_included(toy_kit):
    scores = _grade(toy_kit)
    assert scores == {"90.1.sizes": 2, "90.1.errors": 1, "90.1.sizes_hidden": 1}
    assert _grade(toy_kit, problem=SECOND_TOY) == {"91.1.total": 2, "91.1.total_hidden": 1}


def test_the_starter_scores_zero_and_holds_no_answer(toy_kit, tmp_path):
    starter = tmp_path / "starter"
    done = _run(toy_kit, "release", str(starter))
    assert done.returncode == 0, done.stderr[-2000:]
    for folder in (TOY_FOLDER, SECOND_FOLDER):
        assert not (starter / folder / "staff.py").exists()
        assert (starter / folder / "expected.json").is_file()
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


def test_with_both_toys_the_kit_tests_that_enumerate_problems_pass_unedited(toy_kit):
    """The variants (each toy's variant graded as ``variant.problem``: 91.1 although its file holds 1.2's
    regions), the handout's points and totals, the exception locations (the toys' own regions), the README
    table and markers, and what the partial-submission test fills, all in the copy holding both toys."""
    env = _clean_env()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *ENUMERATING],
                          cwd=toy_kit, env=env, capture_output=True, text=True, timeout=1200,
                          stdin=subprocess.DEVNULL)
    tail = done.stdout[-4000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    passed = re.search(r"(\d+) passed", done.stdout)
    assert passed and int(passed.group(1)) == len(ENUMERATING) + 1, tail      # docs' README test runs twice
    assert not re.search(r"\d+ (?:skipped|xfailed|deselected)", done.stdout), tail
    partial = subprocess.run([sys.executable, "-c", PARTIAL], cwd=toy_kit, env=env, capture_output=True, text=True,
                             timeout=300, stdin=subprocess.DEVNULL)
    assert partial.returncode == 0 and "partial ok" in partial.stdout, partial.stdout + partial.stderr[-2000:]
