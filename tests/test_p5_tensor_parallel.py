"""Problem 5 (tensor parallel): ``pytest -m p5_1`` / ``pytest -m p5_2``. The checks live in grading/checks.

Each case spawns its ranks once per module (a cached run); every criterion is one test.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from grading.kit.course import all_cases
from grading.engine.runner import CriterionResult, run_case
from tests.conftest import KIT_ROOT, assert_passed

# Problem 5 is optional (not in the default course): its cases, hidden ones too on the staff side
CASES = {criterion.id: case for case in all_cases(("5",)) for criterion in case.criteria}


def _params() -> list:
    marks = {"5.1": pytest.mark.p5_1, "5.2": pytest.mark.p5_2}
    return [pytest.param(cid, id=cid, marks=marks[".".join(cid.split(".")[:2])]) for cid in CASES]


@pytest.fixture(scope="module")
def p5_grade(tmp_path_factory):
    """``p5_grade(criterion_id) -> CriterionResult``, spawning each case at most once per module."""
    results: dict[str, dict[str, CriterionResult]] = {}
    work = tmp_path_factory.mktemp("grading_p5")

    def verdict(criterion_id: str) -> CriterionResult:
        case = CASES[criterion_id]
        if case.name not in results:
            results[case.name] = {v.id: v for v in run_case(case, KIT_ROOT, work)}
        return results[case.name][criterion_id]
    return verdict


@pytest.mark.parametrize("criterion_id", _params())
def test_problem_5(criterion_id, p5_grade):
    assert_passed(p5_grade(criterion_id))


# ---------------------------------------------------------------- the entry point and the benchmark
@pytest.fixture(scope="module")
def project_work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("p5_project")


def _tiny_run(work: Path, world_size: int) -> list[str]:
    return ["--world_size", str(world_size), "--workdir", str(work), "--out_dir", str(work / f"world{world_size}"),
            "--n_train", "48", "--n_valid", "16", "--batch_size", "8", "--n_epochs", "1", "--max_len", "32",
            "--lr", "3e-3", "--quiet"]


@pytest.mark.project
def test_run_tensor_parallel_two_ranks_match_one_rank(project_work, capsys):
    """2 ranks (every block split) and 1 rank (unsplit) train on the same batches: same validation loss."""
    from project import run_tensor_parallel as runner

    one = runner.main(_tiny_run(project_work, 1))
    two = runner.main(_tiny_run(project_work, 2))
    assert one["optimizer_steps"] == two["optimizer_steps"] == 6
    assert two["val_loss_after"] < two["val_loss_before"]
    assert abs(two["val_loss_after"] - one["val_loss_after"]) <= runner.VAL_LOSS_TOLERANCE, (one, two)
    held = [rank["block_matrices"] for rank in two["parameter_bytes_per_rank"]]
    assert held == [two["unsplit_parameter_bytes"]["block_matrices"] // 2] * 2
    per_rank = json.loads((project_work / "world2" / "metrics_rank1.json").read_text())
    assert per_rank["val_loss_after"] == pytest.approx(two["val_loss_after"], abs=1e-6)
    assert "validation loss" in capsys.readouterr().out


@pytest.mark.project
def test_run_tensor_parallel_refuses_sizes_that_do_not_split(project_work, capsys):
    """The tiny preset has 4 heads: 3 ranks cannot split them; exit code 2 and one line naming the sizes."""
    from project import run_tensor_parallel as runner
    from project.train_lib import run_cli

    assert run_cli(runner.main, _tiny_run(project_work, 3)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "attention heads (n_head) 4" in err and "3 ranks" in err
    assert len(err.splitlines()) == 1
    assert not (project_work / "world3" / "summary.json").exists()


@pytest.mark.project
def test_benchmark_compares_memory_and_time_in_one_run(project_work):
    """Every variant measured in the same run; memory per rank: DP whole, TP and pipeline less."""
    from project.bench import tensor_parallel as bench

    figures = project_work / "figures"
    summary = bench.run(bench.TPOptions(quick=True, steps=1, repeats=2, max_len=32, workdir=str(project_work),
                                        figures_dir=str(figures)), echo=lambda text: None)
    variants = summary["variants"]
    assert set(variants) == {"serial", "data_parallel", "pipeline", "tensor_parallel"} and not summary["skipped"]
    for v in variants.values():
        assert len(v["run_times_s"]) == 2 and all(t > 0 for t in v["run_times_s"])
        assert len(v["time_vs_serial"]["paired"]) == 2
    assert variants["serial"]["time_vs_serial"]["median"] == 1.0
    assert variants["data_parallel"]["memory_vs_serial"] == 1.0
    assert variants["tensor_parallel"]["memory_vs_serial"] < 1.0 and variants["pipeline"]["memory_vs_serial"] < 1.0
    assert len(variants["tensor_parallel"]["parameter_bytes_per_rank"]) == 2
    assert (figures / bench.FIGURE_FILE).stat().st_size > 0
    assert json.loads((figures / bench.SUMMARY_FILE).read_text())["variants"].keys() == variants.keys()
    assert "tensor_parallel" in bench.table(summary)
