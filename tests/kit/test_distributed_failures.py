"""Ranks that disagree are explained as precisely as a wrong number (docs/distributed-failures.md lists each mode).

Each mode is a plausible wrong region body in which the ranks stop agreeing: one raises, one returns early,
one skips or reorders collective calls, one calls another collective. Graded through the real machinery
(gloo ranks, torch's collective checks), the criterion it costs must fail with a first line that names the rank
at fault (or every rank and its call), the collective and the student's ``file:line``; no failed criterion's
lines in the default table may show the communication library's internals, or end at a colon.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from grading.commands.report import summary
from grading.kit.variants import Variant, edited
from grading.commands.variants import grade_group

COMM, DDP, ZERO1, LAYERS, CHECKPOINT = ("data_parallel/comm.py", "data_parallel/ddp.py", "data_parallel/zero1.py",
                                        "tensor_parallel/layers.py", "data_parallel/checkpoint.py")
DOC = Path(__file__).resolve().parents[2] / "docs" / "distributed-failures.md"
ALL_REDUCE = "dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)"
ROW_REDUCE = "dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)"
LAUNCH = "self._launched.append((dist.all_reduce(buffer, op=dist.ReduceOp.SUM, async_op=True), buffer))"
# What the default table must never show: gloo's and torch's internals.
INTERNALS = re.compile(r"GLHF|pair\.cc|\.cc:\d|\.cpp:\d|\[rank\d+\]:|third_party|/__w/|CollectiveFingerPrint|"
                       r"TensorOptions|Check failed|monitoredBarrier|ProcessGroupWrapper|died from signal SIGABRT")


@dataclass(frozen=True)
class Mode:
    """A failure mode: the bug, the criterion it costs, and the first line (a regex) and later lines (substrings)
    of that criterion's message in the default table."""

    variant: Variant
    criterion: str
    first: str
    shown: tuple[str, ...] = ()


def _average(*swaps: tuple[str, str]) -> str:
    return edited(COMM, "average_gradients", *swaps)


def _disagree(path: str, function: str, rank_0: str, rank_1: str, function_1: str = "") -> str:
    """The first line (a regex) of ranks 0 and 1 making the calls ``rank_0`` and ``rank_1`` (regexes) in ``path``
    (rank 1 in ``function_1`` when given: then the calls differ in where they come from), as their call logs show
    them (``common.call_log``)."""
    where = rf"{re.escape(path)}:\d+ \(in {function}\)"
    where_1 = rf"{re.escape(path)}:\d+ \(in {function_1 or function}\)"
    what = r"where their collective call number \d+ comes from" if function_1 else r"their collective call number \d+"
    return rf"ranks disagree on {what}: rank 0 calls {rank_0} at {where}; rank 1 calls {rank_1} at {where_1}$"


def _call(op: str, dtype: str = "float32") -> str:
    return rf"{op}\({dtype} \[[\d, ]+\]\)"


MODES = [
    Mode(Variant("rank_raises_before_all_reduce", COMM, "average_gradients", _average((
        "    for param in model.parameters():",
        "    if dist.get_rank() == 1:\n        raise KeyError('w')\n    for param in model.parameters():")),
        frozenset()), "1.2.grads_2rank",
        r"rank 1: KeyError: 'w' \(at data_parallel/comm\.py:\d+ \(in average_gradients\)\)$",
        ("symptom: rank 0 was waiting in all_reduce at data_parallel/comm.py:",
         "(in average_gradients) when rank 1 failed")),
    Mode(Variant("rank_returns_early", COMM, "average_gradients", _average((
        "    for param in model.parameters():",
        "    if dist.get_rank() == 1:\n        return\n    for param in model.parameters():")), frozenset()),
        "1.2.grads_2rank", r"rank 1 returned from average_gradients without the all_reduce that rank 0 waits in at "
        r"data_parallel/comm\.py:\d+ \(in average_gradients\)$", ("likely cause: rank 1 skipped a collective call",)),
    Mode(Variant("rank_skips_bias_all_reduces", COMM, "average_gradients", _average(
        ("for param in model.parameters():", "for name, param in model.named_parameters():"),
        ("            continue\n", "            continue\n        if dist.get_rank() == 1 and name.endswith('bias'):\n"
                                  "            continue\n")), frozenset()),
        "1.2.grads_2rank", _disagree(COMM, "average_gradients", r"all_reduce\(float32 \[\d+\]\)",
                                     r"all_reduce\(float32 \[\d+, \d+\]\)"),
        ("likely cause: every rank must make the same collective calls in the same order",)),
    Mode(Variant("rank_reverses_parameters", COMM, "average_gradients", _average((
        "for param in model.parameters():",
        "for param in (list(model.parameters())[::-1] if dist.get_rank() == 1 else model.parameters()):")),
        frozenset()), "1.2.grads_2rank",
        _disagree(COMM, "average_gradients", _call("all_reduce"), _call("all_reduce"))),
    Mode(Variant("rank_broadcasts", COMM, "average_gradients", _average((
        ALL_REDUCE, f"if dist.get_rank() == 0:\n            {ALL_REDUCE}\n        else:\n"
                    "            dist.broadcast(param.grad.data, src=1)")), frozenset()),
        "1.2.grads_2rank", _disagree(COMM, "average_gradients", _call("all_reduce"),
                                     r"broadcast\(float32 \[[\d, ]+\], root 1\)")),
    Mode(Variant("rank_skips_first_bucket", DDP, "_grad_ready", edited(DDP, "_grad_ready", (
        LAUNCH, f"if not (dist.get_rank() == 1 and self._next == 0):\n                {LAUNCH}")), frozenset()),
        "4.1.grads", _disagree(DDP, "_grad_ready", _call("all_reduce"), _call("all_reduce"))),
    Mode(Variant("rank_skips_last_bucket", DDP, "_grad_ready", edited(DDP, "_grad_ready", (
        LAUNCH, f"if not (dist.get_rank() == 1 and self._next == len(self._params) - 1):\n                {LAUNCH}")),
        frozenset()), "4.1.grads", rf"ranks disagree on their collective call number \d+: rank 0 calls "
        rf"{_call('all_reduce')} at data_parallel/ddp\.py:\d+ \(in _grad_ready\); rank 1 calls broadcast\(float32 "
        r"\[\d+\], root 0\) at data_parallel/ddp\.py:\d+ \(in __init__\)$"),
    Mode(Variant("last_shard_one_short", ZERO1, "step", edited(ZERO1, "step", (
        "shard_grad = torch.empty(self.shard_numel, ",
        "shard_grad = torch.empty(self.shard_numel - (dist.get_rank() == self.world_size - 1), ")), frozenset()),
        "4.2.uneven", _disagree(ZERO1, "step", _call("reduce_scatter"), _call("reduce_scatter"))),
    Mode(Variant("shards_not_padded", ZERO1, "_flat", """
        return torch.cat([(t if t is not None else torch.zeros_like(p)).reshape(-1).float().to(device)
                          for p, t in zip(self.params, tensors)])
    """, frozenset()), "4.2.uneven", r"rank 1: RuntimeError: the communication library refused the call: two of its "
        r"tensors differ in size \(28 vs\. 27 elements\) \(at data_parallel/zero1\.py:\d+ \(in step\); raised inside "
        r"torch\.distributed\)$",
        ("likely cause: the tensors of one collective call do not fit",)),
    Mode(Variant("rank_skips_row_all_reduce", LAYERS, "forward#1", edited(LAYERS, "forward#1", (
        ROW_REDUCE, f"if dist.get_rank() == 0:\n            {ROW_REDUCE}")), frozenset()),
        "5.1.weight_grads", _disagree(LAYERS, "forward", _call("all_reduce"), _call("all_reduce"), "backward"),
        ("likely cause: every rank must make the same collective calls",)),
    Mode(Variant("barrier_on_rank_0_only", CHECKPOINT, "save_sharded", edited(CHECKPOINT, "save_sharded", (
        "        manifest.unlink(missing_ok=True)\n    dist.barrier()\n",
        "        manifest.unlink(missing_ok=True)\n        dist.barrier()\n")), frozenset()),
        "4.3.roundtrip", _disagree(CHECKPOINT, "save_sharded", "barrier", "all_gather_object")),
]


@pytest.mark.parametrize("mode", MODES, ids=[m.variant.name for m in MODES])
def test_the_rank_at_fault_comes_first(mode: Mode, tmp_path, fork_servers):
    verdicts = grade_group((mode.variant,), tmp_path, fork_servers)
    failed = {cid: v for cid, v in verdicts.items() if not v.passed}
    assert mode.criterion in failed, f"{mode.variant.name} passed {mode.criterion}"
    shown = summary(failed[mode.criterion].message, width=10_000)
    assert re.match(mode.first, shown[0]), shown
    for text in mode.shown:
        assert any(text in line for line in shown), (text, shown)
    for cid, verdict in failed.items():
        table = summary(verdict.message, width=10_000)
        assert not INTERNALS.search("\n".join(table)), (cid, table)
        assert not table[0].rstrip().endswith(":"), (cid, table)


def test_the_catalogue_lists_every_mode():
    text = DOC.read_text()
    missing = [m.variant.name for m in MODES if f"`{m.variant.name}`" not in text]
    assert not missing, f"docs/distributed-failures.md does not list {missing}"
