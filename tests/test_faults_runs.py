"""Fault injection on real runs (issue 24): damaged checkpoints, a SIGKILL and a file-size limit mid-save, torn logs.

Real training runs (tiny preset, a few steps, gloo, ``--world_size 1`` where
one rank shows the behaviour): a damaged newest checkpoint is skipped with
one line and training continues from the one before it; a run killed during
a save (a real SIGKILL) or stopped by ``RLIMIT_FSIZE`` (a real write error,
also on 2 ranks) leaves the previous checkpoint and ``latest`` resumable
and, where it can speak, one line and a non-zero exit instead of a
traceback; ``plot.py`` draws from a torn ``metrics.jsonl`` of a run stopped
by ``--max_steps``. The same verification serves the pipeline and the
DeepSpeed fine-tuning runner.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from project import run_data_parallel, run_finetune, run_pipeline
from project.cli import run_cli
from project.output import read_steps
from common import ROOT

pytestmark = [pytest.mark.project, pytest.mark.long_file]

SMALL = ["--n_train", "32", "--n_valid", "8", "--batch_size", "4", "--n_epochs", "1", "--quiet"]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A run stopped by --max_steps 6 with a checkpoint every 2 steps, in <work>/out/data_parallel/ws1-<options>."""
    work = tmp_path_factory.mktemp("faults")
    run_data_parallel.main(["--workdir", str(work), *SMALL, "--world_size", "1", "--max_steps", "6",
                            "--save_every", "2"])
    return work


def _copy(work: Path, name: str) -> Path:
    """A copy of the fixture's run folder (metrics and checkpoints) to damage."""
    [folder] = (work / "out" / "data_parallel").glob("ws1-*")   # the one configuration the fixture ran
    return Path(shutil.copytree(folder, work / name))


RUN_SCRIPT = "import runpy, sys\nsys.argv = sys.argv[1:]\nrunpy.run_path(sys.argv[0], run_name='__main__')\n"


def _script(script: str, *args: str, limit: int | None = None, prelude: str = "") -> subprocess.CompletedProcess:
    """``python SCRIPT ARGS`` as a process of its own, warnings off so that stderr holds only the run's own lines.

    A fault set up first, in that process, makes it ``python -c SETUP+RUN_SCRIPT SCRIPT ARGS``: ``limit`` sets its
    ``RLIMIT_FSIZE`` in bytes (inherited by its ranks; a write past it fails with EFBIG, Python ignores SIGXFSZ),
    ``prelude`` is Python run before the script (e.g. one that kills the process mid-save)."""
    setup = textwrap.dedent(prelude)
    if limit is not None:
        setup = f"import resource\nresource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))\n{setup}"
    command = [sys.executable, "-c", f"{setup}\n{RUN_SCRIPT}"] if setup else [sys.executable]
    return subprocess.run([*command, script, *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"},
                          stdin=subprocess.DEVNULL)


def _dp(work: Path, out: Path, *extra: str, limit: int | None = None, prelude: str = "",
        world_size: int = 1) -> subprocess.CompletedProcess:
    """``project/run_data_parallel.py`` in a process of its own (``_script``)."""
    argv = ["--workdir", str(work), "--out_dir", str(out), *SMALL, "--world_size", str(world_size), *extra]
    return _script("project/run_data_parallel.py", *argv, limit=limit, prelude=prelude)


def _steps(folder: Path) -> list[int]:
    return [s["step"] for s in read_steps(folder / "metrics.jsonl")[0]]


def _latest(folder: Path) -> str:
    return (folder / "checkpoints" / "latest").read_text().strip()


def test_fault_truncated_newest_step_is_skipped_and_training_continues_from_the_one_before(work, capsys):
    """The issue's reproduction: step 6's state.pt cut to 1000 bytes; --resume <checkpoints> uses step 4."""
    run = _copy(work, "truncated")
    ckpt = run / "checkpoints"
    (ckpt / "step_00000006" / "state.pt").write_bytes((ckpt / "step_00000006" / "state.pt").read_bytes()[:1000])
    assert run_cli(run_data_parallel.main, ["--workdir", str(work), "--out_dir", str(run), *SMALL, "--world_size",
                                            "1", "--resume", str(ckpt / "step_00000006")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "checkpoint step_00000006 is damaged: state.pt has 1,000 bytes, the manifest says" in err
    assert run_cli(run_data_parallel.main, ["--workdir", str(work), "--out_dir", str(run), *SMALL, "--world_size",
                                            "1", "--resume", str(ckpt), "--save_every", "2", "--max_steps", "7"]) == 0
    err = capsys.readouterr().err
    assert (f"--resume {ckpt}: skipped step_00000006 (state.pt has 1,000 bytes, the manifest says" in err
            and err.strip().endswith("resuming from step_00000004"))
    assert _steps(run) == [1, 2, 3, 4, 5, 6, 7]            # 5 and 6 trained again, no line twice
    assert _latest(run) == "step_00000007"
    assert run_cli(run_data_parallel.main, ["--workdir", str(work), "--out_dir", str(run), *SMALL, "--world_size",
                                            "1", "--resume", str(ckpt / "step_00000006")]) == 0   # re-saved, intact


def test_fault_sigkill_during_a_save_leaves_latest_on_the_previous_step(work, capsys):
    """A real SIGKILL right after step 6's state.pt is written (before its manifest): step 4 stays latest."""
    run = _copy(work, "killed")
    shutil.rmtree(run / "checkpoints" / "step_00000006")          # as if the run had got to step 4 only
    (run / "checkpoints" / "latest").write_text("step_00000004\n")
    kill = """
        import os, signal
        from project import checkpoint
        real = checkpoint.save_file
        def save_file(obj, path):
            real(obj, path)
            if path.parent.name == "step_00000006.tmp" and path.name == "state.pt":
                os.kill(os.getpid(), signal.SIGKILL)
        checkpoint.save_file = save_file
    """
    done = _dp(work, run, "--resume", str(run / "checkpoints" / "step_00000004"), "--save_every", "2",
               "--max_steps", "8", prelude=kill)
    assert done.returncode == -9, done.stderr[-2000:]
    assert _latest(run) == "step_00000004" and (run / "checkpoints" / "step_00000006.tmp").is_dir()
    assert run_cli(run_data_parallel.main, ["--workdir", str(work), "--out_dir", str(run), *SMALL, "--world_size",
                                            "1", "--resume", str(run / "checkpoints"), "--save_every", "2",
                                            "--max_steps", "8"]) == 0
    assert "skipped" not in capsys.readouterr().err
    assert _steps(run) == list(range(1, 9)) and _latest(run) == "step_00000008"
    assert not (run / "checkpoints" / "step_00000006.tmp").exists()


def test_fault_file_size_limit_during_a_save_is_one_line_and_resumable(work, capsys):
    """RLIMIT_FSIZE below state.pt's size: step 8's save fails with one line, exit 2; step 6 resumes afterwards."""
    run = _copy(work, "fsize")
    size = (run / "checkpoints" / "step_00000004" / "state.pt").stat().st_size
    done = _dp(work, run, "--resume", str(run / "checkpoints"), "--save_every", "2", "--max_steps", "8",
               limit=size // 2)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"error: cannot write checkpoint step_00000008: File too large (step_00000006 and "
                                  f"'latest' are intact: resume with --resume {run / 'checkpoints'})")
    assert _latest(run) == "step_00000006" and not (run / "checkpoints" / "step_00000008.tmp").exists()
    assert run_cli(run_data_parallel.main, ["--workdir", str(work), "--out_dir", str(run), *SMALL, "--world_size",
                                            "1", "--resume", str(run / "checkpoints"), "--max_steps", "7"]) == 0
    assert _steps(run) == list(range(1, 8))


def test_fault_file_size_limit_on_two_ranks_is_one_line_not_a_rank_traceback(work):
    """The same on 2 spawned ranks: rank 0's failed write reaches the user as one line, exit 2."""
    done = _dp(work, work / "fsize2", "--save_every", "2", "--max_steps", "2", world_size=2, limit=1 << 20)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("error: cannot write checkpoint step_00000002: File too large (no earlier "
                                  "checkpoint to keep)")


def test_fault_plot_draws_a_max_steps_run_with_a_torn_metrics_line(work):
    """No finished epoch (stopped by --max_steps) and a torn last line: plot.py warns once and draws."""
    shutil.copytree(work / "out", work / "plotted" / "out", ignore=shutil.ignore_patterns("checkpoints"))
    [log] = (work / "plotted" / "out" / "data_parallel").glob("ws1-*/metrics.jsonl")   # the fixture's run
    with log.open("a") as f:
        f.write('{"step": 7, "loss": 3.')
    done = _script("project/plot.py", "--workdir", str(work / "plotted"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr == (f"warning: {log}: line 7 is torn (the run stopped while writing it); "
                           "skipped it, read the rest\n")
    assert f"DP {log.parent.name} (steps)" in done.stdout and "6 steps, unfinished" in done.stdout
    assert {p.name for p in (work / "plotted" / "out" / "plots").iterdir()} == {"throughput.png",
                                                                               "training_curves.png"}


def test_fault_pipeline_runner_falls_back_from_a_flipped_byte(work, capsys):
    out = work / "pp"
    common = ["--workdir", str(work), "--out_dir", str(out), *SMALL, "--model_parallel_mode", "model_parallel"]
    run_pipeline.main([*common, "--save_every", "1", "--max_steps", "2", "--keep_last", "2"])
    ckpt = out / "checkpoints"   # --out_dir is the run folder
    state = ckpt / "step_00000002" / "state.pt"
    data = bytearray(state.read_bytes())
    data[-100] ^= 0xFF
    state.write_bytes(bytes(data))
    assert run_cli(run_pipeline.main, [*common, "--resume", str(ckpt), "--max_steps", "3"]) == 0
    assert "skipped step_00000002 (state.pt has sha256" in capsys.readouterr().err
    assert _steps(out) == [1, 2, 3]


def test_fault_finetune_refuses_a_damaged_deepspeed_shard_and_falls_back(work, capsys):
    """DeepSpeed's own checkpoint files are in the manifest too: one rank's missing shard is named.

    Two ranks, started from this process (DeepSpeed runs in the ranks, new processes: no DeepSpeed state stays
    here); the checkpoint is chosen in this process before any rank starts."""
    out = work / "ft"
    common = ["--workdir", str(work), "--out_dir", str(out), "--n_train", "32", "--n_valid", "8", "--n_epochs", "1",
              "--micro_batch", "2", "--world_size", "2", "--quiet"]
    assert run_cli(run_finetune.main, [*common, "--save_every", "1", "--max_steps", "2"]) == 0
    ckpt = out / "checkpoints"
    shards = sorted((ckpt / "step_00000002").rglob("*optim_states.pt"))
    assert len(shards) == 2                       # one per rank
    shards[1].unlink()
    name = shards[1].relative_to(ckpt / "step_00000002").as_posix()
    capsys.readouterr()
    assert run_cli(run_finetune.main, [*common, "--resume", str(ckpt / "step_00000002")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"step_00000002 is damaged: {name} is missing" in err
    assert run_cli(run_finetune.main, [*common, "--resume", str(ckpt), "--max_steps", "3"]) == 0
    assert f"skipped step_00000002 ({name} is missing" in capsys.readouterr().err
    assert _steps(out) == [1, 2, 3]
