"""scripts/create_submission_zip.sh: exactly the student files + submit_figures/, refused without figures,
and graded from the zip with the same score as the kit itself."""
from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from grading.kit.regions import student_files
from project.bench import REQUIRED_FIGURES, SUMMARY_NAME
from project.bench.submission import PackagingError, figure_files

pytestmark = pytest.mark.kit

ROOT = Path(__file__).resolve().parent.parent


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


def test_refuses_to_package_without_the_figures_and_the_summary(tmp_path):
    done = _package(tmp_path / "empty", tmp_path / "s.zip")
    assert done.returncode == 1
    for name in (*REQUIRED_FIGURES, SUMMARY_NAME):
        assert name in done.stderr
    assert not (tmp_path / "s.zip").exists()


@pytest.mark.parametrize("damage", ["missing", "not_png", "unlisted", "bad_json"])
def test_refuses_broken_or_stale_figures(tmp_path, damage):
    figures = _figures(tmp_path / "f")
    if damage == "missing":
        (figures / "pipeline_timeline.png").unlink()
    elif damage == "not_png":
        (figures / "pipeline.png").write_text("a plot, honestly")
    elif damage == "unlisted":
        (figures / SUMMARY_NAME).write_text(json.dumps({"figures": ["data_parallel.png"]}))
    else:
        (figures / SUMMARY_NAME).write_text("{not json")
    with pytest.raises(PackagingError):
        figure_files(figures)


def _grade(target: str | None, json_path: Path) -> dict:
    """``python -m grading grade [target] --problem 1``'s results.json (no target: the kit itself)."""
    done = subprocess.run([sys.executable, "-m", "grading", "grade", *([target] if target else []), "--problem", "1",
                           "--quiet",
                           "--json", str(json_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert json_path.exists(), done.stdout + done.stderr
    return json.loads(json_path.read_text())


def test_zip_holds_exactly_the_student_files_and_figures_and_grades_like_the_kit(tmp_path):
    figures = _figures(tmp_path / "figures")
    (figures / "notes.txt").write_text("not a figure")        # only PNGs and the summary go in
    done = _package(figures, tmp_path / "submission.zip")
    assert done.returncode == 0, done.stderr
    names = set(zipfile.ZipFile(tmp_path / "submission.zip").namelist())
    expected = set(student_files(ROOT)) | {f"submit_figures/{n}" for n in (*REQUIRED_FIGURES, SUMMARY_NAME)}
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
