"""Every option of every entry point, given a bad value: one line naming the option, exit code 2, nothing started.

The table below must name every option each parser has (a new option
without a bad value here fails ``test_every_option_has_a_bad_value``).
Runs in this process: a refused command never reaches a rank.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from project import run_data_parallel, run_finetune, run_pipeline
from project.cli import run_cli

pytestmark = pytest.mark.project

ENTRY_POINTS = {"run_data_parallel": run_data_parallel, "run_pipeline": run_pipeline, "run_finetune": run_finetune}

# option -> bad value; "FILE" is an existing file, "EMPTY" an empty folder, "MISSING" a path that does not exist
COMMON = {
    "--workdir": "FILE", "--out_dir": "FILE", "--dataset": "MISSING/data", "--tokenizer": "MISSING/tok",
    "--preset": "huge", "--pretrained": "MISSING/model", "--n_train": "0", "--n_valid": "-3", "--max_len": "3",
    "--n_epochs": "0", "--lr": "nan", "--seed": "-1", "--quiet": "=yes",
    "--grad_accum": "0", "--precision": "fp16", "--grad_ckpt": "=no", "--save_every": "-1", "--save_dir": "FILE",
    "--resume": "EMPTY", "--keep_last": "0", "--max_steps": "0", "--lr_schedule": "linear", "--tensorboard": "FILE",
    "--spike_factor": "-2", "--lr_spike": "7",
}
BAD = {
    "run_data_parallel": {**COMMON, "--batch_size": "0", "--world_size": "0", "--backend": "mpi", "--timeout": "0",
                          "--optimizer": "lion", "--save_state": "EMPTY"},
    "run_pipeline": {**COMMON, "--batch_size": "x", "--model_parallel_mode": "tensor", "--n_chunk": "0",
                     "--n_stages": "0", "--devices": "tpu:0,cpu", "--timeline_steps": "-1"},
    "run_finetune": {**COMMON, "--world_size": "-1", "--backend": "ucc", "--timeout": "-5", "--micro_batch": "0",
                     "--zero_stage": "1",
                     "--offload": "nvme", "--lora_rank": "0", "--lora_alpha": "inf", "--lora_targets": "c_attn,lm_head",
                     "--base_state": "MISSING/x.pt"},
}


def _options(entry: str) -> set[str]:
    parser = ENTRY_POINTS[entry].build_parser()
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--") and s != "--help"}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_every_option_has_a_bad_value(entry):
    assert _options(entry) == set(BAD[entry])


CASES = [(entry, option) for entry in sorted(BAD) for option in BAD[entry]]


@pytest.mark.parametrize(("entry", "option"), CASES, ids=[f"{e}{o}" for e, o in CASES])
def test_a_bad_value_is_one_line_and_exit_2(entry, option, tmp_path, capsys):
    places = {"FILE": tmp_path / "a_file", "EMPTY": tmp_path / "empty", "MISSING": tmp_path / "missing"}
    places["FILE"].write_text("not a folder\n")
    places["EMPTY"].mkdir()
    value = BAD[entry][option]
    for key, path in places.items():
        value = value.replace(key, str(path))
    bad = [option + value] if value.startswith("=") else [option, value]
    argv = ["--workdir", str(tmp_path / "work"), "--n_train", "16", "--n_valid", "4", "--quiet", "--world_size", "1",
            *bad] if entry != "run_pipeline" else ["--workdir", str(tmp_path / "work"), "--n_train", "16",
                                                   "--n_valid", "4", "--quiet", *bad]
    try:
        code = run_cli(ENTRY_POINTS[entry].main, argv)
    except SystemExit as exc:   # argparse refuses while parsing
        code = exc.code
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: ") and option in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "work" / "out").exists()          # nothing was trained, no metrics folder


def test_fp16_on_the_cpu_is_refused_with_a_reason(tmp_path, capsys):
    code = run_cli(run_pipeline.main, ["--workdir", str(tmp_path), "--precision", "fp16"])
    assert code == 2 and "needs CUDA" in capsys.readouterr().err


def test_resume_from_another_run_shape_is_refused(tmp_path, capsys):
    common = ["--workdir", str(tmp_path / "w"), "--out_dir", str(tmp_path / "o"), "--n_train", "16", "--n_valid",
              "4", "--quiet", "--model_parallel_mode", "model_parallel", "--batch_size", "8", "--n_epochs", "1",
              "--save_every", "1"]
    run_pipeline.main(common)
    code = run_cli(run_pipeline.main, [*common, "--batch_size", "4",
                                       "--resume", str(Path(tmp_path / "o" / "checkpoints"))])
    err = capsys.readouterr().err
    assert code == 2 and "batch_size 8 -> 4" in err, err
