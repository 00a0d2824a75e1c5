"""Issue 21, item 2: a partial solution submits. A starter with only Problem 1 done (every region of its
sub-problems, found from the markers: 1.1 and 1.2 today) runs the real ``scripts/run_benchmarks.py`` (the
pipeline part skipped and named, data parallel measured) and ``scripts/create_submission_zip.sh`` (warnings
naming the problems the missing figures need, never a refusal); ``python -m grading grade submission.zip`` then
gives the same criterion scores as grading the starter folder: full marks on Problem 1, nothing elsewhere.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from grading.commands.release import release
from common import ROOT
from common.regions import parse_regions, student_files
from grading.kit.splice import replace_bodies
from grading.problems import titles
from tests.commands import run_kit_command

pytestmark = pytest.mark.kit

DONE_PROBLEM = "1"


def done_subs() -> tuple[str, ...]:
    """The sub-problems of Problem ``DONE_PROBLEM`` ("1.1", "1.2", ...), from the kit's folders."""
    return tuple(sub for sub in titles() if sub.split(".")[0] == DONE_PROBLEM)


def _fill(starter: Path, rel: str, subs: tuple[str, ...]) -> None:
    """Put the kit's bodies of the regions of ``subs`` in ``rel`` into the starter's working file (as
    tests/kit/test_local_grade.py); other regions stay as released."""
    kit_regions = parse_regions((ROOT / rel).read_text(), rel)
    text = (starter / rel).read_text()
    bodies = {k: r.body for k, r in enumerate(kit_regions) if r.id in subs}
    (starter / rel).write_text(replace_bodies(text, rel, bodies))


def _run(starter: Path, *command: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.run(list(command), cwd=starter, env=env, capture_output=True, text=True, timeout=timeout)


def _criteria(starter: Path, *target: str) -> dict[str, float]:
    out = starter / "results.json"
    done = run_kit_command(["grade", *target, "--quiet", "--json", out], cwd=starter,
                           env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.is_file(), done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(out.read_text())
    out.unlink()
    return {t["name"]: (t["score"], t["max_score"]) for t in results["tests"]}, results


@pytest.fixture(scope="module")
def starter(tmp_path_factory) -> Path:
    starter = tmp_path_factory.mktemp("partial") / "starter"
    release(ROOT, starter)
    subs = done_subs()
    assert subs and set(subs) >= {"1.1", "1.2"}
    for rel in student_files(ROOT, (DONE_PROBLEM,)):
        _fill(starter, rel, subs)
    return starter


def test_a_starter_with_only_problem_1_done_benchmarks_packages_and_grades_like_the_tree(starter):
    bench = _run(starter, sys.executable, "scripts/run_benchmarks.py", "--quick", "--steps", "1", "--warmup", "0",
                 "--repeats", "1", "--batch_size", "4", "--n_chunks", "2", "--max_len", "32",
                 "--workdir", str(starter / "workdir"))
    assert bench.returncode == 0, bench.stdout[-3000:] + bench.stderr[-3000:]
    assert "not measured: pipeline (needs Problems 2.1, 2.2 and 2.3: " in bench.stdout
    summary = json.loads((starter / "submit_figures" / "performance_summary.json").read_text())
    assert summary["figures"] == ["data_parallel.png"] and not summary["errors"]
    assert set(summary["skipped"]) == {"pipeline"} and "data_parallel" in summary

    packed = _run(starter, "bash", "scripts/create_submission_zip.sh")
    assert packed.returncode == 0, packed.stderr
    names = set(zipfile.ZipFile(starter / "submission.zip").namelist())
    assert names == set(student_files(starter)) | {"submit_figures/data_parallel.png",
                                                    "submit_figures/performance_summary.json",
                                                    "submit_figures/analysis.md"}   # the starter's template
    warnings = [line for line in packed.stderr.splitlines() if line.startswith("warning: ")]
    for name in ("pipeline.png", "pipeline_timeline.png"):
        assert any(f"{name} is missing: it needs Problems 2.1, 2.2 and 2.3" in w for w in warnings), warnings
    assert not any("data_parallel.png" in w for w in warnings)

    from_zip, zip_results = _criteria(starter, "submission.zip")
    from_tree, tree_results = _criteria(starter)
    assert from_zip == from_tree
    assert zip_results["score"] == tree_results["score"] > 0
    done, others = (tuple(f"{sub}." for sub in titles() if (sub in done_subs()) == want) for want in (True, False))
    assert any(name.startswith(done) for name in from_tree), from_tree
    assert all(score == points for name, (score, points) in from_tree.items() if name.startswith(done)), from_tree
    assert not any(score for name, (score, _) in from_tree.items() if name.startswith(others)), from_tree
    assert "missing pipeline.png, pipeline_timeline.png" in zip_results["output"]
