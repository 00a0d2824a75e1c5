"""Problem 4.3 references: the optimizer the checkpoints hold, and bitwise equality. Never imports student code.

``OwnerAdam`` stands in for the student's ``ShardedOptimizer`` (4.2) in the
4.3 checks: it is not ZeRO-1 (whole parameters owned round-robin, plain
``torch.optim.Adam`` per owner), so a bug in 4.2 costs no 4.3 point. The
models, batches and serial training come from ``grading.problems.p4_1_ddp.reference``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


class OwnerAdam:
    """Isolation stand-in for ``ShardedOptimizer`` in the 4.3 checks: per-parameter ownership, not flat shards.

    Parameter i belongs to rank ``i % world_size``, which alone keeps its
    ``torch.optim.Adam`` state and updates it from its *own* gradient; then
    every parameter is broadcast from its owner, over ``group`` (all ranks;
    None: the default group). ``state_dict`` /
    ``load_state_dict`` carry this rank's Adam state only.
    """

    def __init__(self, model: torch.nn.Module, lr: float, group=None):
        self.rank, self.world_size, self.group = dist.get_rank(), dist.get_world_size(), group
        self.params = list(model.parameters())
        self.adam = torch.optim.Adam([p for i, p in enumerate(self.params) if i % self.world_size == self.rank],
                                     lr=lr)

    def zero_grad(self) -> None:
        """Drop every parameter's gradient."""
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        """Adam on the parameters this rank owns, then every parameter broadcast from its owner."""
        self.adam.step()
        with torch.no_grad():
            for i, p in enumerate(self.params):
                dist.broadcast(p.data, src=i % self.world_size, group=self.group)

    def state_dict(self) -> dict:
        """This rank's Adam state (and its rank): what a checkpoint shard holds."""
        return {"adam": self.adam.state_dict(), "owner": self.rank}

    def load_state_dict(self, state: dict) -> None:
        """Restore this rank's Adam state from ``state_dict`` output."""
        self.adam.load_state_dict(state["adam"])


def same(a: dict, b: dict) -> bool:
    """Bitwise equality of two nested dicts/lists of tensors and plain values."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return a == b
