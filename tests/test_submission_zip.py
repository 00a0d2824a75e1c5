"""scripts/create_submission_zip.sh: exactly the student files + submit_figures/ (missing or broken figures are
warnings naming the problems they need, never a refusal; the written analysis goes in, a missing, empty or
unanswered one is a warning), graded from the zip with the same score as the kit."""
from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest

from common import ROOT
from common.handin import ANALYSIS_NAME, ANSWER_PLACEHOLDER
from common.regions import student_files
from grading.kit.course import DEFAULT_PROBLEMS, PROBLEMS_ENV
from project.bench import REQUIRED_FIGURES, SUMMARY_NAME
from project.bench.submission import create_zip, figure_files
from tests.commands import run_kit_command

pytestmark = pytest.mark.kit



def _figures(folder: Path) -> Path:
    """Real (tiny) PNGs and a summary that lists them, as run_benchmarks.py would leave them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    for name in REQUIRED_FIGURES:
        fig, ax = plt.subplots(figsize=(2, 1))
        ax.plot([0, 1], [0, 1])
        fig.savefig(folder / name)
        plt.close(fig)
    (folder / SUMMARY_NAME).write_text(json.dumps({"figures": list(REQUIRED_FIGURES)}))
    return folder


def _package(figures: Path, output: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "scripts/create_submission_zip.sh", "--figures_dir", str(figures),
                           "--output", str(output)], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_packages_the_student_files_without_figures_and_names_the_problems_they_need(tmp_path):
    done = _package(tmp_path / "empty", tmp_path / "s.zip")
    assert done.returncode == 0, done.stderr
    assert set(zipfile.ZipFile(tmp_path / "s.zip").namelist()) == set(student_files(ROOT, DEFAULT_PROBLEMS))
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning: ")]
    assert "Traceback" not in done.stderr
    for name, needs in (("data_parallel.png", "Problems 1.1 and 1.2"),
                        ("pipeline.png", "Problems 2.1, 2.2 and 2.3"),
                        ("pipeline_timeline.png", "Problems 2.1, 2.2 and 2.3"),
                        (SUMMARY_NAME, "Problems 1.1 and 1.2 or 2.1, 2.2 and 2.3")):
        assert any(f"{name} is missing: it needs {needs};" in line for line in warnings), (name, warnings)


def test_packs_only_the_student_files_of_the_course_problems(tmp_path, monkeypatch):
    """A default course (Problems 1-3) leaves the optional problems' files out, so its grade reports no ignored
    file; a course that chose Problem 4 (``GRADING_PROBLEMS``, as ``grading/course.json`` would) gets its files."""
    monkeypatch.delenv(PROBLEMS_ENV, raising=False)
    done = _package(tmp_path / "empty", tmp_path / "default.zip")
    assert done.returncode == 0, done.stderr
    names = set(zipfile.ZipFile(tmp_path / "default.zip").namelist())
    optional = set(student_files(ROOT)) - set(student_files(ROOT, DEFAULT_PROBLEMS))
    assert optional and not names & optional, sorted(names & optional)
    monkeypatch.setenv(PROBLEMS_ENV, "1,2,3,4")
    done = _package(tmp_path / "empty", tmp_path / "four.zip")
    assert done.returncode == 0, done.stderr
    names = set(zipfile.ZipFile(tmp_path / "four.zip").namelist())
    assert names == set(student_files(ROOT, ("1", "2", "3", "4"))) and "data_parallel/ddp.py" in names


@pytest.mark.parametrize("damage", ["missing", "not_png", "unlisted", "bad_json"])
def test_broken_or_stale_figures_are_warnings_never_a_refusal(tmp_path, damage):
    figures = _figures(tmp_path / "f")
    if damage == "missing":
        (figures / "pipeline_timeline.png").unlink()
        left_out, says = "pipeline_timeline.png", "pipeline_timeline.png is missing: it needs Problems 2.1, 2.2"
    elif damage == "not_png":
        (figures / "pipeline.png").write_text("a plot, honestly")
        left_out, says = "pipeline.png", "pipeline.png is not a PNG file: left out"
    elif damage == "unlisted":
        (figures / SUMMARY_NAME).write_text(json.dumps({"figures": ["data_parallel.png"]}))
        left_out, says = None, "does not list pipeline.png (figures from another run?)"
    else:
        (figures / SUMMARY_NAME).write_text("{not json")
        left_out, says = SUMMARY_NAME, f"{SUMMARY_NAME} is not a JSON object"
    files, warnings = figure_files(figures)
    assert any(says in w for w in warnings), warnings
    kept = {p.name for p in files}
    assert kept == {*REQUIRED_FIGURES, SUMMARY_NAME} - {left_out}


def _grade(target: str | None, json_path: Path) -> dict:
    """``python -m grading grade [target] --problem 1``'s results.json (no target: the kit itself)."""
    done = run_kit_command(["grade", *([target] if target else []), "--problem", "1", "--quiet", "--json", json_path],
                           cwd=ROOT)
    assert json_path.exists(), done.stdout + done.stderr
    return json.loads(json_path.read_text())


def test_zip_holds_exactly_the_student_files_and_figures_and_grades_like_the_kit(tmp_path):
    figures = _figures(tmp_path / "figures")
    (figures / "notes.txt").write_text("not a figure")        # only PNGs and the summary go in
    done = _package(figures, tmp_path / "submission.zip")
    assert done.returncode == 0, done.stderr
    names = set(zipfile.ZipFile(tmp_path / "submission.zip").namelist())
    expected = set(student_files(ROOT, DEFAULT_PROBLEMS)) | {f"submit_figures/{n}"
                                                             for n in (*REQUIRED_FIGURES, SUMMARY_NAME)}
    assert names == expected
    assert not any(n.startswith(("workdir/", ".git", "grading/", "tests/")) or "__pycache__" in n for n in names)

    from_zip = _grade(str(tmp_path / "submission.zip"), tmp_path / "zip.json")
    from_kit = _grade(None, tmp_path / "kit.json")
    assert from_zip["max_score"] == from_kit["max_score"] > 0
    assert from_zip["score"] == from_kit["score"]
    intake = [n for n in from_zip["output"].splitlines() if not n.startswith("figures (not scored by the autograder)")]
    assert not intake, from_zip["output"]                     # a clean intake: no tamper/missing-file notes
    assert "every required plot is there" in from_zip["output"]    # the figures are listed, marked not scored
    assert sorted((t["name"], t["status"]) for t in from_zip["tests"]) == \
        sorted((t["name"], t["status"]) for t in from_kit["tests"])


@pytest.mark.parametrize("state", ["missing", "empty", "unanswered", "answered"])
def test_the_written_analysis_is_zipped_and_a_missing_or_unanswered_one_is_a_warning(tmp_path, state):
    figures = tmp_path / "figures"
    figures.mkdir()
    analysis = figures / ANALYSIS_NAME
    if state == "empty":
        analysis.write_text("\n")
    elif state == "unanswered":        # the starter's template, one of its two questions answered
        analysis.write_text(f"# Written analysis\n\n### Q1\n\n1.3x of an ideal 2x\n\n### Q2\n\n{ANSWER_PLACEHOLDER}\n")
    elif state == "answered":
        analysis.write_text("# Written analysis\n\n### Q1\n\n1.3x of an ideal 2x: efficiency 0.65\n")
    warnings: list[str] = []
    create_zip(ROOT, figures, tmp_path / "s.zip", warn=warnings.append)
    zipped = f"submit_figures/{ANALYSIS_NAME}" in zipfile.ZipFile(tmp_path / "s.zip").namelist()
    about = [w for w in warnings if ANALYSIS_NAME in w]
    if state == "answered":
        assert zipped and not about, about
    elif state == "unanswered":
        assert zipped and about == [f"{analysis} has 1 question(s) still unanswered (the template's placeholder "
                                    "is still there)"]
    else:
        assert not zipped and len(about) == 1 and f"{analysis} is {state}" in about[0], about
