"""``project.loop.train`` with its update strategies, in this process on a tiny regression (no ranks, no files
but metrics.jsonl): what the divergence guard does with a refused step, and accumulation across epoch ends."""
from __future__ import annotations

import pytest
import torch

from project.loop import SINGLE_REPLICA, LoopParts, LoopSpec, train
from project.output import GUARD_EVENT, StepLog, read_steps
from project.updates import TorchUpdate

pytestmark = pytest.mark.project


def _batches(n: int, rows: int = 32) -> list[dict]:
    """``n`` batches of a noise-free linear target (each loss below the last while training goes well)."""
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(rows, 4, generator=gen) for _ in range(n)]
    return [{"input_ids": torch.zeros(rows, 3, dtype=torch.long), "attention_mask": torch.ones(rows, 3),
             "x": x, "y": x.sum(dim=1, keepdim=True)} for x in xs]


class AppliedInBackward(TorchUpdate):
    """A strategy whose update is in the weights before the loop sees the loss (as a DeepSpeed engine's is)."""

    applied_in_backward = True

    def forward_backward(self, batch, weight, epoch, index):
        loss = super().forward_backward(batch, weight, epoch, index)
        self.optimizer.step()
        return loss

    def step(self):
        pass


class CountsAcrossEpochs(TorchUpdate):
    """A strategy whose accumulation groups run on across an epoch's end (as DeepSpeed's do)."""

    spans_epochs = True


def _run(tmp_path, name: str, strategy: type, batches: list[dict], **spec) -> tuple[dict, list, list]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    def loss_of(batch, epoch, index):
        return torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])

    log = StepLog(tmp_path / name)
    parts = LoopParts(model=model, optimizer=optimizer, scheduler=None, loader=batches, device=torch.device("cpu"),
                      reduce_grads=SINGLE_REPLICA, update=strategy(model, optimizer, loss_of), step_log=log)
    result = train(parts, LoopSpec(**spec))
    steps, events = read_steps(log.path)
    return result, steps, events


def test_a_refused_step_is_skipped_by_plain_torch_and_kept_when_already_applied(tmp_path):
    """lr x 1e4 on step 6: the next losses explode; no checkpoint, so no rollback."""
    spec = {"n_epochs": 1, "lr_spike": (6, 1e4)}
    plain, plain_steps, plain_events = _run(tmp_path, "plain", TorchUpdate, _batches(10), **spec)
    eager, eager_steps, eager_events = _run(tmp_path, "eager", AppliedInBackward, _batches(10), **spec)
    assert plain_events and eager_events
    assert {e["event"] for e in plain_events + eager_events} == {GUARD_EVENT}
    assert {e["action"] for e in plain_events} == {"skip"} and {e["action"] for e in eager_events} == {"keep"}
    refused = {e["step"] for e in plain_events}
    assert min(refused) == 7                                            # the first loss after the spiked update
    assert [s["step"] for s in plain_steps] == [s for s in range(1, 11) if s not in refused]   # dropped
    assert [s["step"] for s in eager_steps] == list(range(1, 11))                          # kept and counted
    assert plain["steps"] == eager["steps"] == 10
    assert plain["epochs"][0]["steps"] == 10 - len(refused) and eager["epochs"][0]["steps"] == 10


def test_accumulation_groups_end_with_the_epoch_unless_the_update_counts_across_epochs(tmp_path):
    """4 batches an epoch, 3 per step, 2 epochs: plain steps 3+1 | 3+1; across epochs 3 | 3 (2 left over)."""
    spec = {"n_epochs": 2, "grad_accum": 3, "spike_factor": 0.0}
    plain, plain_steps, _ = _run(tmp_path, "plain_acc", TorchUpdate, _batches(4), **spec)
    across, across_steps, _ = _run(tmp_path, "across_acc", CountsAcrossEpochs, _batches(4), **spec)
    assert [s["micro_batches"] for s in plain_steps] == [3, 1, 3, 1]
    assert [s["micro_batches"] for s in across_steps] == [3, 3]
    assert [(e["steps"], e["micro_batches"], e["optimizer_steps"]) for e in plain["epochs"]] == [(2, 4, 2),
                                                                                                 (2, 4, 4)]
    assert [(e["steps"], e["micro_batches"], e["optimizer_steps"]) for e in across["epochs"]] == [(1, 3, 1),
                                                                                                  (1, 3, 2)]
    assert [s["epoch"] for s in across_steps] == [0, 1]     # the second step began in epoch 0, ended in 1
    assert plain["losses"] == [s["loss"] for s in plain_steps]
