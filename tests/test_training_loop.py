"""The shared training loop through the real entry points (CPU, tiny GPT-2, a few steps each).

Gradient accumulation, bf16 autocast, activation checkpointing, bitwise
resume and the divergence guard's rollback, each compared with a plain run
of the same entry point on the same data.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from project import run_data_parallel, run_pipeline
from project.loop import REDUCED_BY_ENGINE, SINGLE_REPLICA, LoopParts
from project.output import GUARD_EVENT, read_steps

pytestmark = pytest.mark.project

N_TRAIN = 32


def _args(work: Path, out: str, *extra: str) -> list[str]:
    return ["--workdir", str(work / "cache"), "--out_dir", str(work / out), "--n_train", str(N_TRAIN),
            "--n_valid", "8", "--quiet", *extra]


def _state(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def _losses(folder: Path) -> list[float]:
    return [r["loss"] for r in read_steps(folder / "metrics.jsonl")[0]]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("training")


def test_accumulated_gradient_equals_the_gradient_of_the_larger_batch(work):
    """2 x 8 sequences accumulated vs one batch of 16, the same rows in the same order; SGD step = -lr * gradient."""
    sgd = ["--world_size", "1", "--optimizer", "sgd", "--lr", "1.0", "--n_epochs", "1", "--max_steps", "1"]
    run_data_parallel.main(_args(work, "acc2", *sgd, "--batch_size", "8", "--grad_accum", "2",
                                 "--save_state", str(work / "acc2.pt")))
    run_data_parallel.main(_args(work, "big", *sgd, "--batch_size", "16", "--save_state", str(work / "big.pt")))
    run_data_parallel.main(_args(work, "init", *sgd, "--batch_size", "16", "--lr", "1e-30",
                                 "--save_state", str(work / "init.pt")))
    init = _state(work / "init.pt")
    grad_acc = {k: init[k] - v for k, v in _state(work / "acc2.pt").items()}
    grad_big = {k: init[k] - v for k, v in _state(work / "big.pt").items()}
    scale = max(g.abs().max().item() for g in grad_big.values())
    assert scale > 1e-3                               # real gradients were compared
    assert _max_diff(grad_acc, grad_big) < 1e-5 * max(scale, 1.0)
    (step_acc,), (step_big,) = read_steps(work / "acc2" / "metrics.jsonl")[0], read_steps(work / "big" /
                                                                                           "metrics.jsonl")[0]
    assert step_acc["micro_batches"] == 2 and step_big["micro_batches"] == 1
    assert step_acc["loss"] == pytest.approx(step_big["loss"], abs=1e-5)
    assert step_acc["tokens"] == step_big["tokens"]


def test_bf16_autocast_trains_and_tracks_fp32(work):
    """Pipeline (stage threads inherit the caller's autocast): bf16 per-step losses within 0.05 of fp32."""
    runs = {}
    for precision in ("fp32", "bf16"):
        runs[precision] = run_pipeline.main(_args(work, f"pp_{precision}", "--precision", precision, "--batch_size",
                                                  "8", "--n_epochs", "2", "--lr", "3e-3"))
    fp32 = _losses(work / "pp_fp32")
    bf16 = _losses(work / "pp_bf16")
    assert len(fp32) == len(bf16) == 8
    assert fp32 != bf16                                  # autocast really changed the arithmetic
    assert max(abs(a - b) for a, b in zip(fp32, bf16)) < 0.05
    assert runs["bf16"]["val_loss_after"] < runs["bf16"]["val_loss_before"] - 0.3


def test_activation_checkpointing_gives_the_same_gradients(work):
    common = ["--world_size", "1", "--optimizer", "sgd", "--lr", "0.3", "--batch_size", "8", "--n_epochs", "1"]
    run_data_parallel.main(_args(work, "plain", *common, "--save_state", str(work / "plain.pt")))
    run_data_parallel.main(_args(work, "ckpt", *common, "--grad_ckpt", "--save_state", str(work / "ckpt.pt")))
    assert _max_diff(_state(work / "plain.pt"), _state(work / "ckpt.pt")) < 1e-6
    assert _losses(work / "ckpt") == pytest.approx(_losses(work / "plain"), abs=1e-6)
    assert json.loads((work / "ckpt" / "summary.json").read_text())["grad_ckpt"] is True


def test_resume_after_a_crash_is_bitwise_equal_data_parallel_two_ranks(work):
    """2 ranks, 8 steps with checkpoints at steps 5 and 8; a copy of the run 'crashes' after step 8 and is
    resumed from step 5 (the lines it wrote after step 5 are dropped): same bits, same per-step losses.

    Global batch 4 (2 rows a rank), 2 batches a step: 4 steps an epoch, so step 5 lies inside epoch 1.
    """
    common = ["--world_size", "2", "--batch_size", "4", "--n_epochs", "2", "--grad_accum", "2", "--save_every", "5"]
    run_data_parallel.main(_args(work, "straight", *common, "--save_state", str(work / "straight.pt")))
    ckpt = work / "straight" / "checkpoints"
    assert (ckpt / "latest").read_text().strip() == "step_00000005"   # 8 is not a multiple of 5
    assert not list(ckpt.glob("*.tmp*"))                # nothing half-written left behind
    shutil.copytree(work / "straight", work / "crashed")
    run_data_parallel.main(_args(work, "crashed", *common, "--resume", str(work / "crashed" / "checkpoints"),
                                 "--save_state", str(work / "resumed.pt")))
    a, b = _state(work / "straight.pt"), _state(work / "resumed.pt")
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed parameters are not bitwise equal"
    straight = read_steps(work / "straight" / "metrics.jsonl")[0]
    assert [s["step"] for s in straight] == list(range(1, 9))
    assert _losses(work / "crashed") == [s["loss"] for s in straight]   # exact floats, one line per step
    per_rank = [json.loads((work / run / "summary.json").read_text())["epochs"] for run in ("straight", "crashed")]
    assert [e["steps"] for e in per_rank[1]] == [4, 4]
    assert [e["train_loss"] for e in per_rank[1]] == [e["train_loss"] for e in per_rank[0]]   # rank-wise sums too


def test_resume_pipeline_with_a_shuffled_loader_is_bitwise_equal(work):
    common = ["--model_parallel_mode", "model_parallel", "--batch_size", "8", "--n_epochs", "2"]
    run_pipeline.main(_args(work, "pp_straight", *common))
    run_pipeline.main(_args(work, "pp_cut", *common, "--save_every", "1", "--max_steps", "5"))   # interrupted
    assert len(_losses(work / "pp_cut")) == 5
    ckpt = work / "pp_cut" / "checkpoints"
    run_pipeline.main(_args(work, "pp_cut", *common, "--resume", str(ckpt / "step_00000005")))
    assert _losses(work / "pp_cut") == _losses(work / "pp_straight")
    straight = json.loads((work / "pp_straight" / "metrics_model_parallel.json").read_text())
    resumed = json.loads((work / "pp_cut" / "metrics_model_parallel.json").read_text())
    assert resumed["val_loss_after"] == straight["val_loss_after"]


def test_divergence_guard_rolls_back_after_a_forced_spike(work):
    """lr x 10000 on step 6's update: step 7's loss spikes, the guard refuses it and rolls back to step 4."""
    run_pipeline.main(_args(work, "spike", "--model_parallel_mode", "model_parallel", "--batch_size", "4",
                            "--n_epochs", "2", "--save_every", "2", "--lr_spike", "6:10000"))
    steps, events = read_steps(work / "spike" / "metrics.jsonl")
    assert GUARD_EVENT == "divergence"
    assert [(e["event"], e["action"], e["step"], e["restored_step"]) for e in events] == [("divergence", "rollback",
                                                                                           7, 4)]
    assert "median" in events[0]["reason"] or "loss is" in events[0]["reason"]
    by_step: dict[int, list[float]] = {}
    for s in steps:
        by_step.setdefault(s["step"], []).append(s["loss"])
    assert by_step[5][0] == by_step[5][1] and by_step[6][0] == by_step[6][1]   # replayed exactly after rollback
    assert len(by_step[7]) == 1 and by_step[7][0] < 2 * by_step[6][0]         # the spike's step, now sane
    assert sorted(by_step) == list(range(1, 17))
    metrics = json.loads((work / "spike" / "metrics_model_parallel.json").read_text())
    assert metrics["rollbacks"] == 1 and metrics["val_loss_after"] < metrics["val_loss_before"]


def test_divergence_guard_without_a_checkpoint_skips_the_step(work):
    """The same spike without checkpoints: nothing to roll back to, so the refused update is dropped ("skip")."""
    run_pipeline.main(_args(work, "spike_skip", "--model_parallel_mode", "model_parallel", "--batch_size", "4",
                            "--n_epochs", "1", "--lr_spike", "6:10000"))
    steps, events = read_steps(work / "spike_skip" / "metrics.jsonl")
    skipped = [e["step"] for e in events if e["event"] == GUARD_EVENT and e["action"] == "skip"]
    assert skipped and all(e["restored_step"] is None for e in events)
    assert not set(skipped) & {s["step"] for s in steps}          # a skipped step has no step line
    metrics = json.loads((work / "spike_skip" / "metrics_model_parallel.json").read_text())
    assert metrics["optimizer_steps"] == 8 and metrics["rollbacks"] == 0
    assert metrics["epochs"][0]["steps"] == 8 - len(skipped) == len(steps)


def _parts(**overrides) -> dict:
    model = torch.nn.Linear(2, 2)
    return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1), "scheduler": None,
            "loader": [], "device": torch.device("cpu"), "loss_of": lambda batch, epoch, index: model.weight.sum(),
            **overrides}


def test_loop_parts_refuse_a_missing_gradient_reduction():
    """Forgetting ``reduce_grads`` is an error at construction, not a run that trains without averaging."""
    with pytest.raises(TypeError, match="LoopParts needs reduce_grads: a function that averages the gradients"):
        LoopParts(**_parts(world_size=2))
    with pytest.raises(TypeError, match="reduce_grads is None"):
        LoopParts(**_parts(reduce_grads=None))
    with pytest.raises(ValueError, match="SINGLE_REPLICA but world_size is 2"):
        LoopParts(**_parts(reduce_grads=SINGLE_REPLICA, world_size=2))
    for reduction in (SINGLE_REPLICA, REDUCED_BY_ENGINE, lambda: None):   # said explicitly: accepted
        assert LoopParts(**_parts(reduce_grads=reduction)).reduce_grads is reduction
