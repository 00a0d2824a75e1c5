"""Staff-only Problem 4: the bucket-assignment generator and the hidden cases (3 ranks, other bucket sizes).

``expected_buckets`` computes exactly what ``BucketedDDP.buckets`` must be, so
it lives here and never ships; the public criterion reads its output stored as
data in ``grading/fixtures/p4_buckets.json`` (written by ``python -m grading
fixtures``; a kit test checks it is up to date). The hidden bucket sizes
follow the course secret (``grading.hidden.inputs``).
"""
from __future__ import annotations


from torch import nn

from grading.problems.p4_1_ddp import checks as p4_1_ddp
from grading.problems.p4_2_zero1 import checks as p4_2_zero1
from grading.problems.p4_3_checkpoint import checks as p4_3_checkpoint
from grading.kit.data import hidden
from grading.problems.p4_1_ddp import reference as ref
from grading.engine.results import CaseRun
from grading.engine.rubric import Case, Criterion

PUBLIC_BUCKET_SIZES = [1e-9, 272 / 2 ** 20, 1100 / 2 ** 20, 1000.0]   # per parameter, exact fit, mid, one bucket
HIDDEN_BUCKET_SIZES = hidden("p4")["bucket_sizes"]           # chosen by the course secret


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


def bucket_cases(sizes: list[float]) -> list[dict]:
    """``[{"bucket_mb", "buckets"}]`` of DDPProbeNet for each size."""
    return [{"bucket_mb": mb, "buckets": expected_buckets(ref.DDPProbeNet(seed=0), mb)} for mb in sizes]


def bucket_fixture() -> dict:
    """The content of ``grading/fixtures/p4_buckets.json``."""
    return {"model": "grading.problems.p4_1_ddp.reference.DDPProbeNet(seed=0)", "cases": bucket_cases(PUBLIC_BUCKET_SIZES)}


def check_hidden_buckets(run: CaseRun) -> None:
    p4_1_ddp.judge_buckets(run, bucket_cases(HIDDEN_BUCKET_SIZES))


CASES = [
    Case("p4_ddp_3rank", "grading.problems.p4_1_ddp.checks:probe_ddp", world_size=3, init_group=True, timeout_s=90,
         args={"bucket_sizes": HIDDEN_BUCKET_SIZES, "train": False}, criteria=(
             Criterion("4.1.buckets_hidden", "bucket assignment for other bucket sizes", 1, check_hidden_buckets,
                       hidden=True),
             Criterion("4.1.grads_3rank", "3-rank grads equal serial global-batch grads", 1, p4_1_ddp.check_grads,
                       hidden=True),
         )),
    Case("p4_zero_3rank", "grading.problems.p4_2_zero1.checks:probe_zero", world_size=3, init_group=True, timeout_s=90,
         criteria=(
             Criterion("4.2.steps_3rank", "3 ranks (212 parameters, padded): 5 Adam and SGD steps equal serial", 1,
                       p4_2_zero1.check_steps, hidden=True),
             Criterion("4.2.memory_3rank", "3 ranks: optimizer state is 12 x ceil(P/3) bytes", 1,
                       p4_2_zero1.check_memory, hidden=True),
         )),
    Case("p4_checkpoint_3rank", "grading.problems.p4_3_checkpoint.checks:probe_checkpoint", world_size=3, init_group=True,
         timeout_s=120, args={"resume": False}, criteria=(
             Criterion("4.3.roundtrip_3rank", "3 ranks: round trip restores every rank's own shard", 1,
                       p4_3_checkpoint.check_roundtrip, hidden=True),
             Criterion("4.3.refuse_3rank", "3 ranks: damaged checkpoints refused", 1,
                       p4_3_checkpoint.check_refuse, hidden=True),
         )),
]
