"""End-to-end runs of the entry points on tiny configurations (CPU, gloo, a few dozen examples).

Multi-rank runs start real processes: the 2-rank data-parallel run goes
through ``torchrun`` (env:// rendezvous); the others start in this process
and start their ranks themselves.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from project.cli import ConfigError
from project.corpus import generate_pairs
from common import ROOT

pytestmark = pytest.mark.project

RUN_TIMEOUT_S = 300
RUNS = {"model_parallel": "model_parallel", "pipeline_parallel": "pipeline-chunk4"}   # run folders, per mode
N_TRAIN, GLOBAL_BATCH = 32, 8


def _run(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)


def _write_split(folder: Path, name: str, rows: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("project_runs")


def _common(work: Path, out: str | None, dataset: str = "embedded") -> list[str]:
    """Tiny-run arguments; ``out=None`` keeps the default metrics folder ``<workdir>/out/...``."""
    return ["--workdir", str(work), *(["--out_dir", str(work / out)] if out else []), "--dataset", dataset,
            "--n_train", str(N_TRAIN), "--n_valid", "16", "--n_epochs", "2", "--lr", "3e-3", "--quiet"]


def test_data_parallel_two_ranks_equal_one_rank_on_the_same_global_batches(work):
    """torchrun with 2 ranks vs. 1 rank in this process, fed the same global batch at every step.

    Rank r of the 2-rank run reads part r of ``partition_indices(N, 2)``, in
    order; the 1-rank run reads ``partition_indices(N, 1)[0]``. The 1-rank
    dataset is permuted so that its k-th batch holds exactly the two ranks'
    k-th batches. With equal per-rank batches, averaging the per-rank
    gradients equals the global-batch gradient, so the weights must match.
    """
    from data_parallel.dataset import partition_indices
    from project import run_data_parallel

    rows = generate_pairs(N_TRAIN, seed=11)
    valid = generate_pairs(16, seed=12)
    local = GLOBAL_BATCH // 2
    parts, order = partition_indices(N_TRAIN, 2), partition_indices(N_TRAIN, 1)[0]
    permuted = [None] * N_TRAIN
    for step in range(N_TRAIN // GLOBAL_BATCH):
        for t in range(GLOBAL_BATCH):
            permuted[order[step * GLOBAL_BATCH + t]] = rows[parts[t // local][step * local + t % local]]
    for name, data in (("two", rows), ("one", permuted)):
        _write_split(work / f"dp_{name}", "train", data)
        _write_split(work / f"dp_{name}", "validation", valid)

    # SGD: the update is linear in the gradient, so fp32 rounding stays fp32 rounding (Adam would turn the
    # rounding noise of exactly-zero gradients, e.g. GPT-2's key biases, into lr-sized steps)
    sgd = ["--optimizer", "sgd", "--lr", "0.3", "--batch_size", str(GLOBAL_BATCH)]
    two = _run(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                "project/run_data_parallel.py", *_common(work, "dp2", str(work / "dp_two")), *sgd,
                "--save_state", str(work / "dp2.pt")])
    assert two.returncode == 0, two.stderr[-3000:]
    summary = run_data_parallel.main([*_common(work, "dp1", str(work / "dp_one")), "--world_size", "1", *sgd,
                                      "--save_state", str(work / "dp1.pt")])

    for out, world in (("dp2", 2), ("dp1", 1)):
        per_rank = [json.loads((work / out / f"metrics_rank{r}.json").read_text()) for r in range(world)]
        for m in per_rank:
            assert [e["epoch"] for e in m["epochs"]] == [0, 1]
            assert all(e["tokens_per_s"] > 0 and e["train_time_s"] > 0 and e["steps"] == 4 for e in m["epochs"])
            assert m["val_loss_after"] < m["val_loss_before"] - 0.2, m
        assert sum(m["examples_on_rank"] for m in per_rank) == N_TRAIN
    two_summary = json.loads((work / "dp2" / "summary.json").read_text())
    # same real tokens per epoch in both runs: the same examples were seen
    assert [e["tokens"] for e in two_summary["epochs"]] == [e["tokens"] for e in summary["epochs"]]

    a = torch.load(work / "dp2.pt", weights_only=True)
    b = torch.load(work / "dp1.pt", weights_only=True)
    assert a.keys() == b.keys()
    worst = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
    assert worst < 1e-5, f"2-rank and 1-rank final weights differ by up to {worst:.2e}"
    assert abs(summary["val_loss_after"] - two_summary["val_loss_after"]) < 1e-4


def test_pipeline_both_modes_train_and_agree(work):
    from project import run_pipeline

    results = {}
    for mode in ("model_parallel", "pipeline_parallel"):
        results[mode] = run_pipeline.main([*_common(work, None), "--model_parallel_mode", mode,
                                           "--batch_size", str(GLOBAL_BATCH), "--n_chunk", "4",
                                           "--timeline_steps", "2"])
    for mode, m in results.items():
        assert m["val_loss_after"] < m["val_loss_before"] - 0.5, (mode, m)
        assert all(e["tokens_per_s"] > 0 and e["steps"] == N_TRAIN // GLOBAL_BATCH for e in m["epochs"])
        [written] = (work / "out" / "pipeline").glob(f"{RUNS[mode]}*/metrics_{mode}.json")   # its own folder
        assert json.loads(written.read_text())["epochs"] == m["epochs"]
        tasks_per_step = 2 * (4 if mode == "pipeline_parallel" else 1)
        first = [t for t in m["timeline"] if t["epoch"] == 0 and t["step"] == 0]
        assert len(first) == tasks_per_step and {t["stage"] for t in first} == {0, 1}
        assert all(t["end"] >= t["start"] >= 0 for t in m["timeline"])
        assert len(m["timeline"]) == 2 * 2 * tasks_per_step   # 2 epochs x 2 recorded steps
    # micro-batching changes the schedule, not the arithmetic
    mp, pp = results["model_parallel"], results["pipeline_parallel"]
    assert abs(mp["val_loss_after"] - pp["val_loss_after"]) < 1e-3
    assert abs(mp["epochs"][0]["train_loss"] - pp["epochs"][0]["train_loss"]) < 1e-4

    from project import plot
    figures = plot.main(["--workdir", str(work)])
    assert [f.name for f in figures] == ["throughput.png", "pipeline_timeline.png", "training_curves.png"]
    assert all(f.stat().st_size > 1000 for f in figures)


def test_finetune_lora_zero2_two_ranks(work, capsys):
    from project import run_finetune

    returned = run_finetune.main([*_common(work, "ft"), "--world_size", "2", "--micro_batch", "4"])
    assert "trainable parameters" in capsys.readouterr().out
    s = json.loads((work / "ft" / "summary.json").read_text())
    assert s == returned
    # LoRA rank 8 on c_attn (128->384), attn c_proj (128->128), c_fc (128->512), mlp c_proj (512->128), 4 blocks
    assert s["trainable_parameters"] == 4 * 8 * ((128 + 384) + (128 + 128) + (128 + 512) + (512 + 128))
    assert s["val_loss_after"] < s["val_loss_before"] - 0.1, s
    assert abs(s["val_loss_reloaded"] - s["val_loss_after"]) < 1e-5
    # ZeRO-2: each rank holds Adam's two fp32 states for its half of the adapter parameters only
    assert len(s["optimizer_state_bytes_per_rank"]) == 2
    for measured in s["optimizer_state_bytes_per_rank"]:
        assert s["formula_state_bytes_per_rank"] <= measured <= s["formula_state_bytes_per_rank"] * 1.01 + 64
    assert sum(s["optimizer_state_bytes_per_rank"]) < 1.05 * s["unsharded_state_bytes"]
    state = torch.load(work / "ft" / "adapter.pt", weights_only=True)
    assert state and all(k.endswith((".lora_A", ".lora_B")) for k in state)
    assert (work / "ft" / "peft_adapter" / "adapter_config.json").exists()
    for r in range(2):
        m = json.loads((work / "ft" / f"metrics_rank{r}.json").read_text())
        assert m["epochs"][-1]["optimizer_steps"] == 2 * N_TRAIN // (2 * 4)


def test_bad_arguments_are_config_errors(work):
    from project import run_data_parallel, run_finetune, run_pipeline

    common = ["--workdir", str(work), "--out_dir", str(work / "bad"), "--n_train", str(N_TRAIN), "--quiet"]
    with pytest.raises(ConfigError, match="larger than the training data"):
        run_data_parallel.main([*common, "--world_size", str(N_TRAIN + 1), "--batch_size", str(N_TRAIN + 1)])
    with pytest.raises(ConfigError, match="not divisible by world size 2"):
        run_data_parallel.main([*common, "--world_size", "2", "--batch_size", "5"])
    with pytest.raises(ConfigError, match="not found"):
        run_pipeline.main([*common, "--dataset", str(work / "no_such_folder")])
    with pytest.raises(SystemExit, match="2"):   # refused while parsing (tests/test_training_options.py: all)
        run_finetune.main([*common, "--micro_batch", "0"])
    torch.save({"transformer.wte.weight": torch.zeros(3, 3)}, work / "unrelated.pt")
    with pytest.raises(ConfigError, match="does not fit --preset tiny"):
        run_finetune.main([*common, "--base_state", str(work / "unrelated.pt")])
    if (torch.cuda.device_count() if torch.cuda.is_available() else 0) < 2:
        with pytest.raises(ConfigError, match="nccl needs one GPU per rank"):
            run_data_parallel.main([*common, "--world_size", "2", "--backend", "nccl"])
    assert not (work / "bad" / "summary.json").exists()


def test_script_exits_2_with_a_message_not_a_traceback(work):
    result = _run(["project/run_data_parallel.py", "--workdir", str(work), "--quiet",
                   "--dataset", "no-such-user/no-such-dataset"])
    assert result.returncode == 2, result.stderr[-2000:]
    assert "error: --dataset: could not load dataset 'no-such-user/no-such-dataset'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr
