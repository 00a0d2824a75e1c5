"""What the entry points tell and where they write (issue 49): every option's help and default in ``--help``, one
run folder per configuration (``project.options.run_name``), the fine-tuning run's LoRA lines, ``plot.py``
reading the run folders, the capstone's closing ``--resume`` line and the loop's epoch lines."""
from __future__ import annotations

import json
import re

import pytest

from project import plot, run_capstone, run_data_parallel, run_finetune, run_pipeline, run_tensor_parallel
from project.options import out_dir, run_name
from common import ROOT

ENTRY_POINTS = [run_data_parallel, run_pipeline, run_finetune, run_tensor_parallel, run_capstone, plot]


def _help_entries(parser) -> dict[str, str]:
    """``{first option string: its help text}`` as ``--help`` shows it (whitespace collapsed)."""
    entries: dict[str, list[str]] = {}
    body = parser.format_help().split("\noptions:\n", 1)[1]
    for line in body.splitlines():
        if re.match(r"^  -", line):
            invocation, _, text = line.strip().partition("  ")
            entries[invocation.split(",")[0].split()[0]] = [text]
        elif entries:
            entries[list(entries)[-1]].append(line)
    return {option: " ".join(" ".join(lines).split()) for option, lines in entries.items()}


@pytest.mark.parametrize("module", ENTRY_POINTS, ids=lambda m: m.__name__.rpartition(".")[2])
def test_every_option_has_help_text_and_shows_its_default(module):
    entries = _help_entries(module.build_parser())
    assert len(entries) > 2
    for option, text in entries.items():
        if option == "-h":
            continue
        said, default = text.rpartition(" (default: ")[::2]
        assert default.endswith(")") and said.strip(), f"{module.__name__} {option}: {text!r}"


def _name(module, argv: list[str], first: dict[str, str]) -> str:
    parser = module.build_parser()
    return run_name(parser.parse_args(argv), parser, first)


def test_each_configuration_names_its_own_folder():
    ws2 = {"world_size": "ws2"}
    assert _name(run_data_parallel, [], ws2) == "ws2"
    assert _name(run_data_parallel, ["--n_epochs", "1"], ws2) == "ws2-epochs1"
    assert _name(run_data_parallel, ["--n_epochs", "3", "--quiet", "--save_every", "5", "--backend", "gloo",
                                     "--workdir", "w", "--max_steps", "4"], ws2) == "ws2"   # same numbers
    assert _name(run_data_parallel, ["--grad_ckpt", "--precision", "bf16", "--lr", "0.01",
                                     "--dataset", "/data/my set"], ws2) == \
        "ws2-dataset_my_set-lr0.01-precision_bf16-grad_ckpt"
    assert _name(run_finetune, ["--lora_targets", "c_attn"], ws2) == "ws2-lora_c_attn"
    assert _name(run_finetune, ["--lora_targets", "c_attn,c_proj,c_fc"], ws2) == "ws2"
    pipeline = run_pipeline.build_parser()
    names = [run_pipeline.folder_name(pipeline.parse_args(argv)) for argv in (
        ["--model_parallel_mode", "model_parallel", "--n_chunk", "5"], [], ["--n_chunk", "5", "--n_epochs", "1"])]
    assert names == ["model_parallel", "pipeline-chunk4", "pipeline-chunk5-epochs1"]


def test_the_run_folder_is_out_dir_when_given_else_under_workdir(tmp_path):
    parser = run_data_parallel.build_parser()
    args = parser.parse_args(["--workdir", str(tmp_path / "w")])
    assert out_dir(args, "data_parallel", "ws2") == tmp_path / "w" / "out" / "data_parallel" / "ws2"
    args = parser.parse_args(["--workdir", str(tmp_path / "w"), "--out_dir", str(tmp_path / "mine")])
    assert out_dir(args, "data_parallel", "ws2") == tmp_path / "mine"
    assert (tmp_path / "mine").is_dir() and (tmp_path / "w" / "out" / "data_parallel" / "ws2").is_dir()


def test_a_lora_target_list_is_checked_while_parsing():
    assert run_finetune.lora_targets("c_fc, c_attn") == ("c_fc", "c_attn")
    for bad in ("c_attn,c_attn", "lm_head", "c_attn,", ""):
        with pytest.raises(Exception, match="expected a comma list"):
            run_finetune.lora_targets(bad)


def test_the_lora_lines_give_r_alpha_each_wrapped_layer_and_the_count_the_handout_derives():
    """The tiny preset's layers as ``wrapped_layers`` records them: the handout's worked example (c_attn only)
    and the default's count come out of the lines the run prints."""
    block = {"attn.c_attn": [128, 384], "attn.c_proj": [128, 128], "mlp.c_fc": [128, 512], "mlp.c_proj": [512, 128]}
    layers = {f"transformer.h.{b}.{name}": shape for b in range(4) for name, shape in block.items()}
    summary = {"lora_rank": 8, "lora_alpha": 16.0, "lora_layers": layers, "trainable_parameters": 65_536,
               "parameters": 1_000_000}
    lines = run_finetune.lora_lines(summary)
    assert lines[0].startswith("  LoRA: r = 8, alpha = 16 (scale alpha / r = 2), 16 wrapped layers")
    assert "attn.c_attn    128 -> 384   x 4: r x (in + out) = 4,096 each" in [line.strip() for line in lines]
    assert lines[-1] == "  trainable parameters 65,536 of 1,000,000 (6.55%)"
    counts = [int(line.split(" = ")[1].split()[0].replace(",", "")) * int(line.split(" x ")[1].split(":")[0])
              for line in lines[1:-1]]
    assert sum(counts) == 65_536 and counts[0] == 16_384
    handout = (ROOT / "grading/staff/handout/problem3.md").read_text()
    assert "16,384" in handout and "--lora_targets c_attn" in handout


def test_plot_reads_every_run_folder(tmp_path):
    out = tmp_path / "out"
    for folder, name in (("data_parallel/ws2", "summary.json"), ("data_parallel/ws2-epochs1", "summary.json"),
                         ("pipeline/pipeline-chunk4", "metrics_pipeline_parallel.json"),
                         ("pipeline/model_parallel", "metrics_model_parallel.json")):
        (out / folder).mkdir(parents=True)
        (out / folder / name).write_text(json.dumps({"epochs": [{"tokens_per_s": 10.0}]}))
    assert sorted(plot.collect(out)) == ["DP ws2", "DP ws2-epochs1", "model_parallel", "pipeline-chunk4"]


def test_the_capstone_resume_says_what_it_compared(tmp_path):
    """``--resume`` of the folder's own checkpoint checks the uninterrupted run; any other says where it wrote."""
    import argparse

    folder = tmp_path / "ws2"
    (folder / "straight").mkdir(parents=True)
    (folder / "checkpoint_step2").mkdir()
    for r in range(2):
        (folder / "straight" / f"rank{r}.json").write_text(json.dumps({"rank": r, "losses": [3.0, 2.0, 1.5, 1.0],
                                                                      "params_sha256": "same"}))
    resumed = [{"rank": r, "start": 2, "losses": [1.5, 1.0], "params_sha256": "same"} for r in range(2)]
    own = argparse.Namespace(resume=str(folder / "checkpoint_step2"), world_size=2)
    assert run_capstone.resume_verdict(own, folder, resumed).startswith(
        "resumed at step 3: steps 3-4 match the uninterrupted run")
    other = argparse.Namespace(resume=str(tmp_path / "elsewhere"), world_size=2)
    assert "written to" in run_capstone.resume_verdict(other, folder, resumed)
    with pytest.raises(run_capstone.InvariantError, match="resume mismatch"):
        run_capstone.resume_verdict(own, folder, [{**r, "losses": [1.5, 1.1]} for r in resumed])


def test_a_single_process_run_logs_its_epochs_without_a_rank():
    import torch

    from project.loop import SINGLE_REPLICA, LoopParts, _who

    parts = LoopParts(model=torch.nn.Linear(1, 1), optimizer=None, scheduler=None, loader=[],
                      device=torch.device("cpu"), loss_of=lambda *a: None, reduce_grads=SINGLE_REPLICA)
    assert _who(parts) == ""
    parts.world_size, parts.rank = 2, 1
    assert _who(parts) == "rank 1 "
