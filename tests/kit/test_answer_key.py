"""Issue 10 and 16.1: the starter carries no answer key, public checks use data, hidden checks follow the secret.

(a) no function in a released starter has a body shaped like a reference region;
(b) region code that reaches into the grader scores zero for its problem, naming file and line;
(c) the public fixtures match the staff answers, and a release writes them;
(d) hidden inputs follow the course secret, and a submission that hard-codes one secret's answers (or the
    public fixtures) loses the hidden points under another secret.
"""
from __future__ import annotations

import ast
import json
import os
import re
import textwrap
from pathlib import Path

import pytest

from grading.commands.release import release
from grading.kit.course import is_example, present_problems
from grading.engine.rubric import HIDDEN, PUBLIC
from grading.engine.runner import run_cases
from grading.kit.problem import SubProblem
from common import ROOT
from common.regions import parse_regions, student_files
from grading.kit.secret import SECRET_ENV
from grading.kit.submission import build_grading_copy, grader_access
from grading.staff import expected as expected_files
from grading.problems import all_cases, folders, sub_problem
from tests.kit.shapes import MIN_NODES, node_count, shape
from grading.kit.variants import make_variant_kit
from tests.commands import run_kit_command

pytestmark = pytest.mark.kit
ALL = tuple(p for p in present_problems() if not is_example(p))      # every problem a course may hand out


@pytest.fixture(scope="module")
def starter(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("answer_key") / "starter"
    release(ROOT, out, ALL)                          # every problem, optional ones included
    return out


def test_no_function_in_the_starter_is_shaped_like_a_reference_region(starter):
    regions = []
    for rel in student_files(ROOT):
        for region in parse_regions((ROOT / rel).read_text(), rel):
            body = ast.parse(textwrap.dedent(region.body)).body
            if node_count(body) >= MIN_NODES:
                regions.append((f"{rel}:{region.begin_line} ({region.id}, {region.function})", shape(body)))
    assert len(regions) >= 10, "the scan must cover most regions"
    shapes = {}
    for path in sorted(starter.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
                for start in range(len(body)):          # any run of statements that ends the function
                    shapes.setdefault(shape(body[start:]), f"{path.relative_to(starter)}:{node.lineno}")
    leaks = [(where, shapes[shape]) for where, shape in regions if shape in shapes]
    assert not leaks, f"starter functions shaped like reference regions: {leaks}"


def test_the_starter_leaves_out_the_staff_answers_and_keeps_data(starter):
    assert not (starter / "grading" / "staff").exists()
    assert not list((starter / "grading" / "problems").rglob("staff.py"))
    shipped = {p.relative_to(starter).as_posix() for p in starter.rglob("*.py")}
    assert not {p for p in shipped if p.endswith("variants.py") or "settings_page" in p}, "variants, staff pages"
    for rel in expected_files.rendered(ALL):              # the data of every problem it was released with
        assert json.loads((starter / rel).read_text())
    text = "\n".join(p.read_text() for p in (starter / "grading").rglob("*.py") if "pristine" not in p.parts)
    for answer in ("def partition_indices", "def clock_cycles", "def config_entries", "def block_split"):
        assert not re.search(f"^{answer}", text, flags=re.MULTILINE), answer       # the staff answers' names
    for old in ("ReferencePipe", "reference_average_gradients", "reference_partition_indices", "grader_config"):
        assert old not in text, old
    assert "tests/kit" not in {p.relative_to(starter).as_posix()[:9] for p in starter.rglob("*")}
    readme = (starter / "README.md").read_text()
    assert "BEGIN_STUDENT" in readme and "For staff" not in readme and "release" not in readme


def test_committed_expected_values_match_the_staff_answers():
    assert expected_files.stale() == [], "run `python -m grading fixtures`"


@pytest.mark.parametrize("body, caught", [
    ("from grading.problems.p1_1_partition import staff\nreturn staff.partition_indices(size, world_size, seed)",
     "grading"),
    ("import importlib\nm = importlib.import_module('grad' + 'ing.problems.p1_1_partition.staff')\n"
     "return m.partition_indices(size, world_size, seed)", "importlib"),
    ("m = __import__('grad' + 'ing')\nreturn m", "__import__"),
    ("text = open('grading/problems/p1_1_partition/expected.json').read()\nreturn text", "grading"),
])
def test_grader_access_is_found_in_code_not_comments(body, caught):
    assert grader_access(body)[1].lower() == caught
    assert grader_access("# import grading would be cheating\nreturn 1\n") is None


def test_a_region_that_delegates_to_the_grader_scores_zero_for_its_problem(tmp_path, fork_servers):
    body = ("from grading.problems.p1_1_partition import staff  # the answers, only on the course's grader\n"
            "return staff.partition_indices(size, world_size, seed)")
    kit = make_variant_kit(tmp_path / "sub", [("data_parallel/dataset.py", "partition_indices", body)])
    splice = build_grading_copy(ROOT, kit, tmp_path / "copy")
    assert set(splice.refused) == {"1.1"}
    assert "data_parallel/dataset.py:" in splice.refused["1.1"] and "reaches into the grader" in splice.refused["1.1"]
    verdicts = run_cases(all_cases(), tmp_path / "copy", tmp_path / "runs", problem="1.1", refused=splice.refused,
                         servers=fork_servers)
    assert verdicts and all(v.score == 0 and "reaches into the grader" in v.message for v in verdicts)


def _hidden(problem: SubProblem, secret: str, monkeypatch) -> object:
    monkeypatch.setenv(SECRET_ENV, secret)
    return problem.inputs_for(HIDDEN)


def test_hidden_inputs_follow_the_course_secret(monkeypatch):
    """Every sub-problem whose hidden criteria run on other inputs draws them anew for every secret."""
    drawn = [sub_problem(p) for p in folders() if getattr(sub_problem(p).staff(), "hidden_inputs", None)]
    assert len(drawn) >= 10, [p.id for p in drawn]
    secrets = ["term-a", "term-b", "term-c", "term-d"]
    for problem in drawn:
        assert _hidden(problem, "term-a", monkeypatch) == _hidden(problem, "term-a", monkeypatch)
        assert len({repr(_hidden(problem, s, monkeypatch)) for s in secrets}) > 1, f"{problem.id}: same under all"
        assert type(_hidden(problem, "term-a", monkeypatch)) is type(problem.inputs_for(PUBLIC))
    p1_1 = sub_problem("1.1")
    assert not set(p1_1.inputs_for(PUBLIC).partitions) & set(_hidden(p1_1, "term-a", monkeypatch).partitions)


def _grade_1_1(kit: Path, secret: str, out: Path) -> dict[str, float]:
    env = {**os.environ, "GRADING_COURSE_SECRET": secret}
    done = run_kit_command(["grade", kit, "--problem", "1.1", "--quiet", "--json", out], env=env)
    assert out.is_file(), done.stdout + done.stderr
    return {t["name"].split(":")[0]: t["score"] for t in json.loads(out.read_text())["tests"]}


def test_hard_coded_answers_lose_the_hidden_points_under_another_secret(tmp_path, monkeypatch):
    p1_1 = sub_problem("1.1")
    public = p1_1.expected_for(PUBLIC)
    monkeypatch.setenv(SECRET_ENV, "term-a")
    hidden = p1_1.expected_for(HIDDEN)
    monkeypatch.delenv(SECRET_ENV)
    table = {",".join(map(str, call)): parts for e in (public, hidden) for table in (e.partitions, e.loader)
             for call, parts in table.items()}
    body = f"""
        if size < 0 or world_size < 1:
            raise ValueError("bad arguments")
        table = {table!r}
        key = f"{{size}},{{world_size}},{{seed}}"
        if key in table:
            return [list(part) for part in table[key]]
        return [list(range(size))[r::world_size] for r in range(world_size)]
    """
    kit = make_variant_kit(tmp_path / "sub", [("data_parallel/dataset.py", "partition_indices", body)])
    under_a = _grade_1_1(kit, "term-a", tmp_path / "a.json")
    under_b = _grade_1_1(kit, "term-b", tmp_path / "b.json")
    assert under_a["1.1.exact"] > 0 and under_a["1.1.exact_hidden"] > 0, under_a
    assert under_b["1.1.exact"] > 0 and under_b["1.1.exact_hidden"] == 0, under_b
    shown = next(t["output"] for t in json.loads((tmp_path / "b.json").read_text())["tests"]
                 if t["name"].startswith("1.1.exact_hidden"))             # what the student reads once published
    monkeypatch.setenv(SECRET_ENV, "term-b")
    secret_values = {str(n) for call in p1_1.expected_for(HIDDEN).partitions for n in call if n > 9}
    assert shown.startswith(f"failed on the hidden inputs ({p1_1.hidden_kind})"), shown
    assert not secret_values & set(re.findall(r"\d+", shown)), (secret_values, shown)
    reference = _grade_1_1(ROOT, "term-b", tmp_path / "ref.json")
    assert reference["1.1.exact_hidden"] > 0 and all(score > 0 for score in reference.values()), reference


def test_answers_agree_with_the_contract_examples():
    p1_1, p2_1, p2_3 = (sub_problem(p).staff() for p in ("1.1", "2.1", "2.3"))
    assert p2_3.block_split(4, 3) == [2, 1, 1]
    assert p2_1.schedule(2, 2) == [[(0, 0)], [(1, 0), (0, 1)], [(1, 1)]]
    assert sorted(i for part in p1_1.partition_indices(10, 3, 0) for i in part) == list(range(10))
