"""Staff only (never released): the 4.1 answers (bucket assignment), hidden inputs and hidden criteria."""
from __future__ import annotations

import random

from torch import nn

from grading.check import Spawn
from grading.problems.p4_1_ddp import checks
from grading.problems.p4_1_ddp import reference as ref
from grading.problems.p4_1_ddp.checks import Expected, Inputs


def expected_buckets(model: nn.Module, bucket_mb: float) -> list[list[str]]:
    """The contract of ``BucketedDDP.buckets``: trainable parameters in reverse order, cut at the byte cap."""
    cap = bucket_mb * 2 ** 20
    buckets: list[list[str]] = []
    current: list[str] = []
    size = 0
    for name, param in reversed(list(model.named_parameters())):
        if not param.requires_grad:
            continue
        nbytes = param.numel() * param.element_size()
        if current and size + nbytes > cap:
            buckets.append(current)
            current, size = [], 0
        current.append(name)
        size += nbytes
    if current:
        buckets.append(current)
    return buckets


def expected(inputs: Inputs) -> Expected:
    """The buckets of ``DDPProbeNet(seed=0)`` for every cap of ``inputs``."""
    return Expected(buckets={mb: expected_buckets(ref.DDPProbeNet(seed=0), mb) for mb in inputs.bucket_sizes})


def hidden_inputs(rng: random.Random) -> Inputs:
    """Three caps (MiB): one fits the first k trainable parameters (reverse order) exactly, k drawn from 3..5
    (the public exact fit is k = 2), and two between a few small parameters and most of DDPProbeNet."""
    sizes = [p.numel() * p.element_size() for p in reversed(list(ref.DDPProbeNet(seed=0).parameters()))
             if p.requires_grad]
    exact = sum(sizes[:rng.randint(3, len(sizes) - 1)])
    return Inputs(bucket_sizes=tuple(sorted([exact / 2 ** 20, *(rng.randint(300, 2400) / 2 ** 20 for _ in range(2))])))


HIDDEN_KIND = "other bucket caps, one of them an exact fit for the last few parameters"
HIDDEN_POINTS = {checks.check_buckets: 1, checks.check_grads: 1}
HIDDEN_SPAWN = Spawn(world_size=3)            # the hidden caps, and the gradients, on 3 ranks
