"""``run_finetune.py --zero_stage 3 --offload cpu`` against ZeRO-2 on 2 CPU ranks (real DeepSpeed, gloo).

The runs start in this process (``run_finetune.main``); their ranks are new processes, where DeepSpeed runs.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from project import run_finetune
from project.output import STEP_KEYS, read_steps

pytestmark = pytest.mark.project


def _finetune(work: Path, out: str, *extra: str) -> dict:
    return run_finetune.main(["--workdir", str(work / "cache"), "--out_dir", str(work / out), "--n_train", "32",
                              "--n_valid", "8", "--n_epochs", "1", "--micro_batch", "4", "--world_size", "2",
                              "--quiet", *extra])


def test_zero3_with_cpu_offload_matches_zero2_updates_and_resumes_bitwise(tmp_path):
    """ZeRO-3 + offload vs ZeRO-2: the same adapters; then a copy of the ZeRO-3 run resumed from its step-2
    checkpoint (DeepSpeed's sharded checkpoint + position + RNG) ends with the same adapters and losses."""
    zero2 = _finetune(tmp_path, "z2")
    zero3 = _finetune(tmp_path, "z3", "--zero_stage", "3", "--offload", "cpu", "--save_every", "2")
    a = torch.load(tmp_path / "z2" / "adapter.pt", weights_only=True)
    b = torch.load(tmp_path / "z3" / "adapter.pt", weights_only=True)
    assert a.keys() == b.keys() and all(a[k].shape == b[k].shape for k in a)   # gathered, not ZeRO-3 shards
    moved = max(a[k].abs().max().item() for k in a if k.endswith("lora_B"))
    assert moved > 1e-4                                                       # the adapters were updated
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-6
    assert (zero2["zero_stage"], zero3["zero_stage"], zero3["offload"]) == (2, 3, "cpu")
    config = json.loads((tmp_path / "z3" / "metrics_rank0.json").read_text())["deepspeed_config"]
    assert config["zero_optimization"] == {"stage": 3, "offload_optimizer": {"device": "cpu"}}
    assert zero3["optimizer_state_bytes_per_rank"] == zero2["optimizer_state_bytes_per_rank"]
    assert zero3["val_loss_reloaded"] == pytest.approx(zero3["val_loss_after"], abs=1e-5)
    steps, events = read_steps(tmp_path / "z3" / "metrics.jsonl")
    assert [s["step"] for s in steps] == [1, 2, 3, 4] and not events
    assert all(set(STEP_KEYS) <= set(s) and s["loss"] > 0 for s in steps)
    assert (tmp_path / "z3" / "checkpoints" / "latest").read_text().strip() == "step_00000004"

    shutil.copytree(tmp_path / "z3", tmp_path / "z3_resumed")
    _finetune(tmp_path, "z3_resumed", "--zero_stage", "3", "--offload", "cpu", "--save_every", "2",
              "--resume", str(tmp_path / "z3_resumed" / "checkpoints" / "step_00000002"))
    c = torch.load(tmp_path / "z3_resumed" / "adapter.pt", weights_only=True)
    assert all(torch.equal(b[k], c[k]) for k in b), "resumed ZeRO-3 adapters are not bitwise equal"
    resumed = read_steps(tmp_path / "z3_resumed" / "metrics.jsonl")[0]
    assert [s["loss"] for s in resumed] == [s["loss"] for s in steps]
