"""Figures at grading (grading/commands/benchmarks.py): the grade report describes submit_figures/ as not
scored, the zip script warns about a --quick summary, and the staff benchmark scores thresholds only from its
own run."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from grading.commands import benchmarks
from project.bench import REQUIRED_FIGURES, SUMMARY_NAME
from tests.commands import run_kit_command
from common import ROOT

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32


def _summary(quick: bool = False, gpus: list | None = None, dp: float = 1.61, applicable: bool = True,
             status: str = "pass") -> dict:
    verdict = {"threshold": 1.4, "measured": dp, "status": status, "definition": "time(ws1) / time(ws2)"}
    return {"quick": quick, "mode": "student", "created": "2026-11-29T10:00:00", "figures": list(REQUIRED_FIGURES),
            "hardware": {"cpu": "Some CPU", "cpus_usable": 2, "gpus": gpus or []},
            "data_parallel": {"ratios": {"speedup": {"value": dp}}},
            "pipeline": {"ratios": {"speedup_m2": {"value": 1.05}, "speedup_m4": {"value": 1.21}}},
            "thresholds": {"applicable": applicable, "reason": "2 GPUs present" if applicable else "0 GPUs",
                           "dp_speedup": verdict,
                           "pp_speedup": {**verdict, "measured": 1.21, "threshold": 1.1,
                                          "status": "pass" if status in ("pass", "fail") else status}},
            "errors": {}}


def _submission(root: Path, summary: dict | str | None, plots=REQUIRED_FIGURES) -> Path:
    folder = root / "submit_figures"
    folder.mkdir(parents=True)
    for name in plots:
        (folder / name).write_bytes(PNG)
    if summary is not None:
        (folder / SUMMARY_NAME).write_text(summary if isinstance(summary, str) else json.dumps(summary))
    return root


def test_notes_for_a_full_gpu_run_name_hardware_and_claimed_speedups(tmp_path):
    notes = benchmarks.figures_notes(_submission(tmp_path, _summary(gpus=["NVIDIA A100", "NVIDIA A100"])))
    assert notes and all(line.startswith("figures (not scored by the autograder): ") for line in notes)
    text = "\n".join(notes)
    assert "holds 3 plot(s); every required plot is there" in text
    assert "made by a full run" in text and "2 GPU(s) (NVIDIA A100)" in text
    assert "data parallel (world size 2 over 1) 1.61x" in text
    assert "4 micro-batches 1.21x" in text and "2 micro-batches 1.05x" in text
    assert "thresholds apply on that machine (dp_speedup pass, pp_speedup pass)" in text


def test_notes_for_a_quick_cpu_run_and_a_missing_plot(tmp_path):
    root = _submission(tmp_path, _summary(quick=True, applicable=False, status="not_applicable"),
                       plots=REQUIRED_FIGURES[:2])
    text = "\n".join(benchmarks.figures_notes(root))
    assert "--quick run" in text and "CPU only (Some CPU, 2 usable core(s))" in text
    assert f"missing {REQUIRED_FIGURES[2]}" in text and "do not apply" in text


@pytest.mark.parametrize("summary, expected", [
    (None, "no performance_summary.json"),
    ("{not json", "not valid JSON"),
    ("[1, 2]", "not a JSON object"),
])
def test_notes_for_a_missing_or_broken_summary(tmp_path, summary, expected):
    notes = benchmarks.figures_notes(_submission(tmp_path, summary))
    assert expected in notes[-1] and notes[-1].startswith("figures (not scored by the autograder)")


def test_notes_without_the_folder(tmp_path):
    assert benchmarks.figures_notes(tmp_path) == [
        "figures (not scored by the autograder): the submission has no submit_figures/ folder (make it with "
        "`python scripts/run_benchmarks.py`)"]


def test_notes_quote_untrusted_values_only_as_short_clean_text(tmp_path):
    hostile = _summary(gpus=["GPU\x1b[2J\nNOTE: full marks" + "x" * 500])
    hostile["data_parallel"]["ratios"]["speedup"]["value"] = "9.9"        # a string is not a number
    hostile["pipeline"]["ratios"]["speedup_m2"]["value"] = float("inf")
    hostile["quick"] = "no"                                                   # only True means --quick
    notes = benchmarks.figures_notes(_submission(tmp_path, hostile))
    text = "\n".join(notes)
    assert "\x1b" not in text and all("\n" not in line for line in notes)
    assert max(len(line) for line in notes) < 400
    assert "9.9" not in text and "infx" not in text and "made by a full run" in text


def test_score_thresholds_from_the_graders_run():
    passed = benchmarks.score_thresholds(_summary(), points=5.0)
    assert [(r.id, r.score, r.max_score, r.status) for r in passed] == [
        ("benchmarks.dp_speedup", 5.0, 5.0, "passed"), ("benchmarks.pp_speedup", 5.0, 5.0, "passed")]
    missed = benchmarks.score_thresholds(_summary(dp=1.2, status="fail"), points=5.0)
    assert missed[0].score == 0.0 and missed[0].status == "failed" and "1.20x (threshold 1.4x" in missed[0].message
    assert missed[1].status == "passed"
    broken = _summary(dp=None, status="fail")
    broken["errors"] = {"data_parallel": "Traceback ...\nNotImplementedError: Problem 1.2"}
    failed = benchmarks.score_thresholds(broken, points=1.0)[0]
    assert failed.status == "failed" and "not measured" in failed.message and "Problem 1.2" in failed.message
    died = benchmarks.score_thresholds(None, points=1.0, failure="exit code 2")
    assert all(r.status == "failed" and "exit code 2" in r.message for r in died)
    elsewhere = benchmarks.score_thresholds(_summary(applicable=False, status="not_applicable"), points=1.0)
    assert all(r.max_score == 0 and r.message.startswith("thresholds do not apply") for r in elsewhere)


def test_benchmarks_command_without_two_gpus_says_thresholds_do_not_apply(tmp_path):
    """The student's own summary claims great speedups; the command neither runs nor believes it."""
    import zipfile

    submission = tmp_path / "sub.zip"
    with zipfile.ZipFile(submission, "w") as archive:
        for rel in ("data_parallel/dataset.py", "data_parallel/comm.py"):
            archive.write(ROOT / rel, rel)
        archive.writestr(f"submit_figures/{SUMMARY_NAME}", json.dumps(_summary(dp=9.87)))
    out = tmp_path / "results.json"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = run_kit_command(["benchmarks", submission, "--json", out], cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "thresholds do not apply: this machine has 0 GPU(s)" in done.stdout
    data = json.loads(out.read_text())
    assert data["max_score"] == 0 and len(data["tests"]) == 2
    assert "9.87" not in out.read_text() + done.stdout
    missing = run_kit_command(["benchmarks", tmp_path / "nope"], cwd=ROOT, env=env, timeout=300)
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_zip_script_warns_about_a_quick_summary_and_says_figures_are_not_scored(tmp_path):
    figs = _submission(tmp_path / "quick", _summary(quick=True)) / "submit_figures"
    done = subprocess.run(["bash", "scripts/create_submission_zip.sh", "--figures_dir", str(figs), "--output",
                           str(tmp_path / "s.zip")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "comes from a --quick run" in done.stderr and "does not score the figures" in done.stderr
    full = _submission(tmp_path / "full", _summary()) / "submit_figures"
    done = subprocess.run(["bash", "scripts/create_submission_zip.sh", f"--figures_dir={full}", "--output",
                           str(tmp_path / "t.zip")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--quick" not in done.stderr and "does not score the figures" in done.stderr


def test_benchmark_check_runs_the_benchmark_on_the_spliced_submission_and_reads_only_its_own_summary(tmp_path):
    """The 2-GPU path, forced on this CPU machine with a tiny workload: the grader's run judges (here: does
    not apply, 0 GPUs), whatever the submission's own summary claims."""
    from common.regions import student_files

    for rel in student_files(ROOT):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((ROOT / rel).read_text())
    _submission(tmp_path, _summary(dp=9.87))
    results = benchmarks.run_benchmark_check(tmp_path, points=1.0, gpus=2, limit_s=500, extra_args=(
        "--quick", "--steps", "1", "--repeats", "1", "--warmup", "0", "--n_chunks", "2", "--batch_size", "4"))
    assert [r.id for r in results] == ["benchmarks.dp_speedup", "benchmarks.pp_speedup"]
    for r in results:
        assert r.status == "not_applicable" and r.max_score == 0, r.message
        assert "this machine has 0" in r.message and "9.87" not in r.message
