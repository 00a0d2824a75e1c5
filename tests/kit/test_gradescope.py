"""``python -m grading gradescope``: the bundle's layout, and run_autograder on a folder laid out like /autograder."""
import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from grading.kit.course import DEFAULT_PROBLEMS
from grading.kit.regions import parse_regions, student_files
from tests.kit.variants import KIT_ROOT
from tests.commands import run_kit_command

pytestmark = pytest.mark.kit


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("bundle") / "out"
    done = run_kit_command(["gradescope", out], timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def autograder(tmp_path, bundle, submission_files: dict[str, str], **env) -> tuple[subprocess.CompletedProcess, dict]:
    """Lay out tmp_path/autograder like Gradescope's /autograder, run run_autograder, return results.json."""
    root = tmp_path / "autograder"
    shutil.copytree(bundle / "source", root / "source")
    for rel, text in submission_files.items():
        (root / "submission" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "submission" / rel).write_text(text)
    (root / "submission").mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["bash", str(root / "source" / "run_autograder")], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "AUTOGRADER_ROOT": str(root),
                                            "GRADING_PYTHON": sys.executable, **env})
    return done, json.loads((root / "results" / "results.json").read_text())


def test_bundle_holds_the_grader_but_no_reference_solution(bundle):
    with zipfile.ZipFile(bundle / "autograder.zip") as archive:
        names = set(archive.namelist())
        for script in ("setup.sh", "run_autograder"):
            assert script in names
            assert (archive.getinfo(script).external_attr >> 16) & 0o111, f"{script} is not executable"
        assert {"grading/staff/expected.py", "grading/problems/p1_1_partition/staff.py",
                "grading/problems/p3_3_zero/staff.py", "grading/__main__.py"} <= names
        assert not any(n.startswith(("grading/problems/p4_", "grading/problems/p5_")) for n in names)  # not chosen
        assert "grading/staff/course_secret.txt" not in names        # no --course-secret given
        assert not any("__pycache__" in n or n.startswith((".git/", "tests/kit/")) for n in names)
        requirements = archive.read("requirements.txt").decode()
    assert "torch==" in requirements
    for script in ("setup.sh", "run_autograder"):
        assert subprocess.run(["bash", "-n", str(bundle / "source" / script)]).returncode == 0
    for rel in student_files(KIT_ROOT, DEFAULT_PROBLEMS):
        reference = {r.body for r in parse_regions((KIT_ROOT / rel).read_text(), rel)}
        shipped = parse_regions((bundle / "source" / rel).read_text(), rel)
        assert shipped and all("NotImplementedError" in r.body and r.body not in reference for r in shipped), rel


def test_run_autograder_grades_the_submission_into_results_json(tmp_path, bundle):
    files = {rel: (KIT_ROOT / rel).read_text() for rel in ("data_parallel/dataset.py", "data_parallel/comm.py")}
    done, results = autograder(tmp_path, bundle, files, GRADING_ARGS="--problem 1.1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert results["score"] == results["max_score"] == 13, results        # 12 public + 1 hidden
    assert {t["status"] for t in results["tests"]} == {"passed"}
    assert {t["visibility"] for t in results["tests"] if "hidden" in t["name"]} == {"after_published"}


def test_a_course_secret_goes_into_the_bundle_only(tmp_path):
    from grading.commands.gradescope import build_bundle
    build_bundle(KIT_ROOT, tmp_path / "b", course_secret="fall-2026")
    assert (tmp_path / "b" / "source" / "grading" / "staff" / "course_secret.txt").read_text().strip() == "fall-2026"
    assert not (KIT_ROOT / "grading" / "staff" / "course_secret.txt").exists()


def test_run_autograder_reports_a_rejected_submission(tmp_path, bundle):
    done, results = autograder(tmp_path, bundle, {"notes.txt": "I forgot my code"}, GRADING_ARGS="--problem 1")
    assert results["score"] == 0 and results["max_score"] > 0
    assert all("no student file found" in t["output"] for t in results["tests"]), results


def test_run_autograder_leaves_a_report_when_the_grader_is_cut_off(tmp_path, bundle):
    files = {"data_parallel/dataset.py": (KIT_ROOT / "data_parallel/dataset.py").read_text()}
    done, results = autograder(tmp_path, bundle, files, GRADING_TOTAL_TIMEOUT="2")
    assert done.returncode == 0
    assert results["score"] == 0 and "ran out of time" in results["output"], results
