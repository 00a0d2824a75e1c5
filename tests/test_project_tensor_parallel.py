"""``project/run_tensor_parallel.py`` and the Problem 5 benchmark, end to end on the kit's reference code."""
from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def project_work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("p5_project")


def _tiny_run(work: Path, world_size: int) -> list[str]:
    return ["--world_size", str(world_size), "--workdir", str(work), "--out_dir", str(work / f"world{world_size}"),
            "--n_train", "48", "--n_valid", "16", "--batch_size", "8", "--n_epochs", "1", "--max_len", "32",
            "--lr", "3e-3", "--quiet"]


@pytest.mark.project
def test_run_tensor_parallel_two_ranks_match_one_rank(project_work, capsys):
    """2 ranks (every block split) run the missing unsplit baseline themselves and say the validation loss matches."""
    from project import run_tensor_parallel as runner

    two = runner.main(_tiny_run(project_work, 2) + ["--baseline_dir", str(project_work / "world1")])
    one = json.loads((project_work / "world1" / "summary.json").read_text())   # the baseline it ran
    assert one["world_size"] == 1 and one["optimizer_steps"] == two["optimizer_steps"] == 6
    assert two["val_loss_after"] < two["val_loss_before"]
    assert abs(two["val_loss_after"] - one["val_loss_after"]) <= runner.VAL_LOSS_TOLERANCE, (one, two)
    verdict = two["baseline"]
    assert verdict["source"] == "ran" and verdict["matches"] is True
    assert verdict["val_loss_after"] == one["val_loss_after"]
    held = [rank["block_matrices"] for rank in two["parameter_bytes_per_rank"]]
    assert held == [two["unsplit_parameter_bytes"]["block_matrices"] // 2] * 2
    per_rank = json.loads((project_work / "world2" / "metrics_rank1.json").read_text())
    assert per_rank["val_loss_after"] == pytest.approx(two["val_loss_after"], abs=1e-6)
    out = capsys.readouterr().out
    assert "validation loss" in out and "tolerance 1e-03: MATCH" in out


@pytest.mark.project
def test_run_tensor_parallel_reads_a_baseline_and_exits_1_when_it_does_not_match(project_work, capsys):
    """A baseline with the same options is read, not rerun; a validation loss off by more than 1e-3 exits 1."""
    from project import run_tensor_parallel as runner

    if not (project_work / "world1" / "summary.json").exists():
        pytest.skip("needs the baseline of the test above")
    bad = project_work / "bad_baseline"
    bad.mkdir(exist_ok=True)
    baseline = json.loads((project_work / "world1" / "summary.json").read_text())
    baseline["val_loss_after"] += 10 * runner.VAL_LOSS_TOLERANCE
    (bad / "summary.json").write_text(json.dumps(baseline))
    before = (bad / "summary.json").read_text()
    assert runner.cli(_tiny_run(project_work, 2) + ["--baseline_dir", str(bad)]) == 1
    out = capsys.readouterr().out
    assert f"unsplit baseline (read from {bad})" in out and ": MISMATCH" in out
    assert (bad / "summary.json").read_text() == before and not (bad / "metrics_rank0.json").exists()


@pytest.mark.project
def test_run_tensor_parallel_refuses_sizes_that_do_not_split(project_work, capsys):
    """The tiny preset has 4 heads: 3 ranks cannot split them; exit code 2 and one line naming the sizes."""
    from project import run_tensor_parallel as runner
    from project.cli import run_cli

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
        assert len(v["time_vs_serial"]["per_repeat"]) == 2
    assert variants["serial"]["time_vs_serial"]["value"] == 1.0
    assert variants["data_parallel"]["memory_vs_serial"] == 1.0
    assert variants["tensor_parallel"]["memory_vs_serial"] < 1.0 and variants["pipeline"]["memory_vs_serial"] < 1.0
    assert len(variants["tensor_parallel"]["parameter_bytes_per_rank"]) == 2
    assert (figures / bench.FIGURE_FILE).stat().st_size > 0
    assert json.loads((figures / bench.SUMMARY_FILE).read_text())["variants"].keys() == variants.keys()
    assert "tensor_parallel" in bench.table(summary)
