"""``python -m grading gradescope``: the bundle's layout, and run_autograder on a folder laid out like /autograder."""
import contextlib
import json
import os
import subprocess
import sys
import threading
import zipfile

import psutil
import pytest

from grading.kit import points
from grading.kit.course import DEFAULT_PROBLEMS, is_example, present_problems
from common import ROOT
from common.regions import parse_regions, student_files
from grading.problems import all_cases
from grading.kit.variants import make_variant_kit
from tests.commands import run_kit_command

pytestmark = pytest.mark.kit
DATASET = "data_parallel/dataset.py"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("bundle") / "out"
    done = run_kit_command(["gradescope", out], timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


VISIBILITIES = {"hidden", "after_due_date", "after_published", "visible"}


def autograder(tmp_path, bundle, submission_files: dict[str, str], **env) -> tuple[subprocess.CompletedProcess, dict]:
    """Run the bundle as Gradescope does: unpack autograder.zip into tmp_path/autograder/source (a folder laid
    out like /autograder), put the submission in .../submission, run run_autograder with the kit's own
    environment standing in for what setup.sh installs; return the run and results.json, checked against
    Gradescope's specification, with no traceback of the kit's own in stdout or stderr."""
    root = tmp_path / "autograder"
    with zipfile.ZipFile(bundle / "autograder.zip") as archive:
        archive.extractall(root / "source")
    for name in ("setup.sh", "run_autograder"):       # zipfile drops permissions; Gradescope runs them as scripts
        (root / "source" / name).chmod(0o755)
    for rel, text in submission_files.items():
        (root / "submission" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "submission" / rel).write_text(text)
    (root / "submission").mkdir(parents=True, exist_ok=True)
    done = subprocess.run([str(root / "source" / "run_autograder")], capture_output=True, text=True, cwd=root,
                          timeout=600, env={**os.environ, "AUTOGRADER_ROOT": str(root),
                                            "GRADING_PYTHON": sys.executable, **env})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    results = json.loads((root / "results" / "results.json").read_text())
    assert isinstance(results["score"], (int, float)) and results.get("visibility", "visible") in VISIBILITIES
    assert isinstance(results.get("output", ""), str) and isinstance(results["tests"], list), results
    for test in results["tests"]:
        assert isinstance(test["name"], str) and isinstance(test["output"], str), test
        assert isinstance(test["score"], (int, float)) and isinstance(test["max_score"], (int, float)), test
        assert test["status"] in ("passed", "failed") and test["visibility"] in VISIBILITIES, test
    return done, results


def test_bundle_holds_the_grader_but_no_reference_solution(bundle):
    with zipfile.ZipFile(bundle / "autograder.zip") as archive:
        names = set(archive.namelist())
        for script in ("setup.sh", "run_autograder"):
            assert script in names
            assert (archive.getinfo(script).external_attr >> 16) & 0o111, f"{script} is not executable"
        assert {"grading/staff/expected.py", "grading/problems/p1_1_partition/staff.py",
                "grading/problems/p3_3_zero/staff.py", "grading/__main__.py"} <= names
        optional = tuple(f"grading/problems/p{p}_" for p in present_problems()
                         if p not in DEFAULT_PROBLEMS and not is_example(p))
        assert optional and not any(n.startswith(optional) for n in names)          # not chosen
        assert "grading/staff/course_secret.txt" not in names        # no --course-secret given
        assert not any("__pycache__" in n or n.startswith((".git/", "tests/kit/")) for n in names)
        requirements = archive.read("requirements.txt").decode()
    assert "torch==" in requirements
    for script in ("setup.sh", "run_autograder"):
        assert subprocess.run(["bash", "-n", str(bundle / "source" / script)]).returncode == 0
    for rel in student_files(ROOT, DEFAULT_PROBLEMS):
        reference = {r.body for r in parse_regions((ROOT / rel).read_text(), rel)}
        shipped = parse_regions((bundle / "source" / rel).read_text(), rel)
        assert shipped and all("NotImplementedError" in r.body and r.body not in reference for r in shipped), rel


def test_run_autograder_grades_the_reference_into_results_json(tmp_path, bundle):
    files = {rel: (ROOT / rel).read_text() for rel in student_files(ROOT, DEFAULT_PROBLEMS)}
    done, results = autograder(tmp_path, bundle, files, GRADING_ARGS="--problem 1")
    worth = points.worth(c for case in all_cases(("1",)) for c in case.criteria)      # public + hidden, the rubric's
    assert results["score"] == results["max_score"] == worth.public + worth.hidden, results
    assert {t["status"] for t in results["tests"]} == {"passed"}
    hidden = [t for t in results["tests"] if "_hidden" in t["name"]]
    assert hidden and {t["visibility"] for t in hidden} == {"after_published"}     # the spec then hides the total
    shown = [results["output"], *(t["name"] + t["output"] for t in results["tests"] if t not in hidden)]
    assert not any("hidden" in text for text in shown), shown      # nothing visible before publication names them


def test_a_course_secret_and_the_total_timeout_go_into_the_bundle_only(tmp_path):
    from grading.commands.gradescope import build_bundle
    with pytest.raises(ValueError, match="at least 1 second"):
        build_bundle(ROOT, tmp_path / "refused", total_timeout_s=0)
    assert not (tmp_path / "refused").exists()
    build_bundle(ROOT, tmp_path / "b", course_secret="fall-2026", total_timeout_s=777)
    assert 'LIMIT="${GRADING_TOTAL_TIMEOUT:-777}"' in (tmp_path / "b" / "source" / "run_autograder").read_text()
    assert (tmp_path / "b" / "source" / "grading" / "staff" / "course_secret.txt").read_text().strip() == "fall-2026"
    assert not (ROOT / "grading" / "staff" / "course_secret.txt").exists()


def test_run_autograder_reports_a_rejected_submission(tmp_path, bundle):
    done, results = autograder(tmp_path, bundle, {"notes.txt": "I forgot my code"}, GRADING_ARGS="--problem 1")
    assert results["score"] == 0 and results["max_score"] > 0
    assert all("no student file found" in t["output"] for t in results["tests"]), results


def test_run_autograder_reports_a_grade_that_exceeds_the_total_timeout(tmp_path, bundle):
    hang = make_variant_kit(tmp_path / "hang", [(DATASET, "partition_indices", "while True:\n    pass\n")])
    done, results = autograder(tmp_path, bundle, {DATASET: (hang / DATASET).read_text()}, GRADING_TOTAL_TIMEOUT="4")
    assert results["score"] == 0 and "ran out of time (GRADING_TOTAL_TIMEOUT)" in results["output"], results


def test_a_submission_cannot_kill_its_grader_on_gradescope(tmp_path, bundle):
    kill = ("import os, signal\n"            # the grade's own process: `python -m grading grade <submission>`
            "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
            "    try:\n        line = open(f'/proc/{pid}/cmdline', 'rb').read()\n"
            "    except OSError:\n        continue\n"
            "    if line.startswith(b'timeout'):\n        continue\n"
            "    if b'\\x00grade\\x00' in line and b'/autograder/submission\\x00' in line:\n"
            "        os.kill(int(pid), signal.SIGKILL)\n")
    killer = make_variant_kit(tmp_path / "killer", [(DATASET, "partition_indices", kill)])
    done, results = autograder(tmp_path, bundle, {DATASET: (killer / DATASET).read_text()},
                               GRADING_ARGS="--problem 1.1")
    assert "stopped by signal" not in results["output"], results        # the grade is not among its processes
    assert results["tests"] and all(not t["output"].startswith("not graded") for t in results["tests"]), results
    assert "tried to open another process's /proc/" in results["output"], results    # flagged for staff


def test_run_autograder_reports_a_grade_killed_from_outside(tmp_path, bundle):
    """A grade killed by something else (the container out of memory) still leaves a report that says so."""
    hang = make_variant_kit(tmp_path / "hang", [(DATASET, "partition_indices", "import time\nwhile True:\n"
                                                                                  "    time.sleep(0.1)\n")])
    stop = threading.Event()

    def kill_the_grade() -> None:
        while not stop.wait(0.1):
            for process in psutil.process_iter():
                with contextlib.suppress(psutil.Error):
                    line = process.cmdline()
                    if line[1:4] == ["-m", "grading", "grade"] and str(tmp_path / "autograder" / "submission") \
                            in line:
                        process.kill()
                        return
    killer = threading.Thread(target=kill_the_grade, daemon=True)
    killer.start()
    try:
        done, results = autograder(tmp_path, bundle, {DATASET: (hang / DATASET).read_text()},
                                   GRADING_ARGS="--problem 1.1")
    finally:
        stop.set()
    assert results["score"] == 0, results
    assert "stopped by signal 9 before it finished" in results["output"], results
