"""``python -m grading``: end to end on the reference, the released starter, zips and tampered submissions."""
import json
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

from grading.kit.course import DEFAULT_PROBLEMS
from grading.kit.regions import student_files
from grading.commands.release import release
from tests.commands import run_kit_command
from tests.kit.variants import KIT_ROOT

pytestmark = pytest.mark.kit


def grade(*args, cwd=KIT_ROOT):
    """``python -m grading grade --quiet ARGS`` in ``cwd``, as ``batch`` starts it (``tests/commands.py``)."""
    return run_kit_command(["grade", "--quiet", *args], cwd=cwd, timeout=900)


@pytest.fixture(scope="module")
def starter(tmp_path_factory):
    out = tmp_path_factory.mktemp("starter") / "s"
    release(KIT_ROOT, out)
    return out


def test_reference_scores_full_marks_on_problem_1(tmp_path):
    done = subprocess.run([sys.executable, "-m", "grading", "grade", "--quiet", "--problem", "1", "--json",
                           str(tmp_path / "r.json")], cwd=KIT_ROOT, capture_output=True, text=True, timeout=900)
                                                    # a new interpreter, as a student starts it
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((tmp_path / "r.json").read_text())
    assert results["score"] == results["max_score"] > 0
    assert {t["status"] for t in results["tests"]} == {"passed"}
    for test in results["tests"]:
        assert set(test) >= {"name", "score", "max_score", "status", "output", "visibility"}
    assert "TOTAL" in done.stdout


def test_released_starter_scores_zero_everywhere_with_not_implemented(starter, tmp_path):
    done = grade(starter, "--json", tmp_path / "r.json")
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    assert done.returncode == 3, done.stdout + done.stderr        # incomplete, not a grader crash
    results = json.loads((tmp_path / "r.json").read_text())
    assert results["max_score"] > 0 and results["score"] == 0
    problems = {t["number"] for t in results["tests"]}
    assert {"1.1", "1.2"} <= problems
    for test in results["tests"]:
        assert test["score"] == 0
        assert f"Problem {test['number']}" in test["output"] and "NotImplementedError" in test["output"], test


def test_students_own_grader_in_the_starter_runs(starter):
    done = grade("--problem", "1.1", cwd=starter)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "TOTAL 0/" in done.stdout


def _submission_from(starter, tmp_path, fill_from_kit=("data_parallel/dataset.py",)):
    sub = tmp_path / "sub"
    for rel in student_files(KIT_ROOT, DEFAULT_PROBLEMS):
        source = KIT_ROOT / rel if rel in fill_from_kit else starter / rel
        (sub / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, sub / rel)
    return sub


def test_zip_submission_wrapped_in_a_folder_is_graded(starter, tmp_path):
    sub = _submission_from(starter, tmp_path)
    archive = tmp_path / "submission.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for file in sub.rglob("*.py"):
            z.write(file, "my_work/" + file.relative_to(sub).as_posix())
    done = grade(archive, "--problem", "1.1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"TOTAL (\d+)/\1\b", done.stdout), done.stdout


def test_edits_outside_regions_are_reported_and_ignored(starter, tmp_path):
    sub = _submission_from(starter, tmp_path)
    target = sub / "data_parallel" / "dataset.py"
    target.write_text(target.read_text().replace("DEFAULT_SEED = 1234", "DEFAULT_SEED = 99\nHACKED = True"))
    done = grade(sub, "--problem", "1.1", "--json", tmp_path / "r.json")
    assert "changed outside the student regions (ignored; the kit's text was used): data_parallel/dataset.py" \
        in done.stdout
    assert done.returncode == 0, done.stdout
    assert "data_parallel/dataset.py" in json.loads((tmp_path / "r.json").read_text())["output"]


def test_malformed_markers_in_a_submission_cost_only_that_file(starter, tmp_path):
    sub = _submission_from(starter, tmp_path, fill_from_kit=("data_parallel/dataset.py", "data_parallel/comm.py"))
    target = sub / "data_parallel" / "comm.py"
    target.write_text(target.read_text().replace("# END_STUDENT 1.2", "", 1))
    done = grade(sub, "--problem", "1")
    assert "malformed markers (file graded as not implemented): data_parallel/comm.py" in done.stdout
    assert re.search(r"Problem 1\.1 .*\n\s*\[(\d+)/\1 public", done.stdout) and "[0/" in done.stdout, done.stdout


@pytest.mark.parametrize("make, message", [
    (lambda p: p / "missing", "no such file or folder"),
    (lambda p: (p / "empty").mkdir() or p / "empty", "no student file found"),
])
def test_bad_submission_paths_get_a_clear_error(tmp_path, make, message):
    done = grade(make(tmp_path))
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


def test_zip_slip_is_rejected(tmp_path):
    archive = tmp_path / "evil.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("../../escape.py", "x = 1")
    done = grade(archive)
    assert done.returncode == 2 and "unsafe path" in done.stderr


def test_the_default_table_wraps_the_likely_cause_instead_of_cutting_it(tmp_path, fork_servers):
    from grading.commands import report
    from tests.kit.test_variants_p1 import VARIANTS
    from tests.kit.variants import grade_variant
    variant = next(v for v in VARIANTS if v.name == "sum_without_dividing")
    table = report.table(list(grade_variant(variant, "1.2", tmp_path, fork_servers).values()))
    assert "likely cause: a sum without the division by the world size (every gradient is 2 x the expected one)" \
        in " ".join(line.strip() for line in table.splitlines()), table
    assert "…" not in table and max(len(line) for line in table.splitlines()) <= 160, table
    assert "4 of 4 entries differ: fc1.weight, fc1.bias, fc2.weight, fc2.bias" in \
        " ".join(line.strip() for line in table.splitlines())
