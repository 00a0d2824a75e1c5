"""Issue 19.5 (issue 36: moved to docs/): the sub-problem guide, followed literally on a copy of the kit.

The test reads every file block of ``docs/adding-a-subproblem.md`` (``File `PATH`:`` or
``File `PATH` (append):`` followed by a ```python block), writes them into a
temporary copy of the kit and checks what the guide promises: the expected
values are written by ``grading fixtures``, the reference scores full marks
(the hidden criterion included), a released starter scores zero and holds
neither the staff part nor anything shaped like the answer, and the variant
the guide names loses exactly its criterion.
"""
from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from grading import KIT_ROOT
from grading.kit.regions import parse_regions, replace_bodies
from grading.problems import titles
from tests.kit.shapes import MIN_NODES, node_count, shape
from tests.commands import run_kit_command

pytestmark = pytest.mark.kit
GUIDE = KIT_ROOT / "docs" / "adding-a-subproblem.md"
TOY = "9.1"
TOY_FOLDER = "grading/problems/p9_1_chunks"
TOY_FILE, TOY_FUNCTION = "data_parallel/dataset.py", "chunk_sizes"
BUGGY_BODY = """
        if total < 0 or parts < 1:
            raise ValueError("bad sizes")
        base, extra = divmod(total, parts)
        return [base] * parts
"""


def guide_files() -> list[tuple[str, bool, str]]:
    """(path, append, code) for every file block of the guide, in order."""
    blocks = re.finditer(r"File `(?P<path>[^`]+)`(?P<append> \(append\))?:\s*\n+```python\n(?P<code>.*?)```",
                         GUIDE.read_text(), flags=re.S)
    return [(m.group("path"), bool(m.group("append")), m.group("code")) for m in blocks]


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return run_kit_command(list(args), cwd=cwd)


def _grade(cwd: Path, *args: str) -> dict[str, float]:
    out = cwd / "toy_results.json"
    done = _run(cwd, "grade", *args, "--problem", TOY, "--quiet", "--json", str(out))
    assert out.is_file(), done.stdout[-2000:] + done.stderr[-2000:]
    return {t["name"].split(":")[0]: t["score"] for t in json.loads(out.read_text())["tests"]}


@pytest.fixture(scope="module")
def toy_kit(tmp_path_factory) -> Path:
    kit = tmp_path_factory.mktemp("toy") / "kit"
    shutil.copytree(KIT_ROOT, kit, ignore=shutil.ignore_patterns(".git", "__pycache__", "workdir", "*.pyc",
                                                                   ".pytest_cache", "submit_figures"))
    (kit / "submit_figures").mkdir()
    for path, append, code in guide_files():
        target = kit / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text((target.read_text() + "\n\n" if append else "") + code)
    done = _run(kit, "fixtures")
    assert done.returncode == 0, done.stderr[-2000:]
    return kit


def test_the_guide_has_a_block_for_every_step():
    paths = [path for path, _, _ in guide_files()]
    assert paths == [TOY_FILE, f"{TOY_FOLDER}/__init__.py", f"{TOY_FOLDER}/checks.py", f"{TOY_FOLDER}/staff.py"]


def test_the_toy_id_is_no_real_problem():
    assert TOY not in titles() and not (KIT_ROOT / TOY_FOLDER).exists()


def test_the_guides_criteria_judge_one_split_run():
    """The toy is written in the framework's one style: a criterion takes ``run: SplitRun`` alone, and neither
    it nor the probe handles splits (no loop over them, no part names built from them)."""
    code = dict((path, code) for path, _, code in guide_files())[f"{TOY_FOLDER}/checks.py"]
    criteria = [node for node in ast.walk(ast.parse(code)) if isinstance(node, ast.FunctionDef)
                and any("criterion" in ast.unparse(d) for d in node.decorator_list)]
    assert criteria
    for node in criteria:
        assert [(a.arg, ast.unparse(a.annotation)) for a in node.args.args] == [("run", "SplitRun")], node.name
    for old in ("split_part", "rank_inputs", "rank_expected", "splits", "inputs_for", "expected_for"):
        assert not re.search(rf"\b{old}\b", code), f"the guide's checks.py uses {old}: leave splits to the framework"


def test_fixtures_write_the_expected_values(toy_kit):
    expected = json.loads((toy_kit / TOY_FOLDER / "expected.json").read_text())
    assert [[10, 3], [4, 3, 3]] in expected["sizes"]


def test_the_reference_scores_full_marks_hidden_criterion_included(toy_kit):
    scores = _grade(toy_kit)
    assert scores == {"9.1.sizes": 2, "9.1.errors": 1, "9.1.sizes_hidden": 1}


def test_the_starter_scores_zero_and_holds_no_answer(toy_kit, tmp_path):
    starter = tmp_path / "starter"
    done = _run(toy_kit, "release", str(starter))
    assert done.returncode == 0, done.stderr[-2000:]
    assert not (starter / TOY_FOLDER / "staff.py").exists()
    assert (starter / TOY_FOLDER / "expected.json").is_file()
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


def test_the_guides_variant_loses_exactly_its_criterion(toy_kit, tmp_path):
    buggy = tmp_path / "buggy"
    shutil.copytree(toy_kit, buggy, ignore=shutil.ignore_patterns("__pycache__"))
    text = (buggy / TOY_FILE).read_text()
    regions = parse_regions(text, TOY_FILE)
    index = next(k for k, r in enumerate(regions) if r.function == TOY_FUNCTION)
    body = textwrap.indent(textwrap.dedent(BUGGY_BODY).strip("\n") + "\n", regions[index].indent)
    (buggy / TOY_FILE).write_text(replace_bodies(text, TOY_FILE, {index: body}))
    scores = _grade(toy_kit, str(buggy))
    assert scores == {"9.1.sizes": 0, "9.1.errors": 1, "9.1.sizes_hidden": 0}
