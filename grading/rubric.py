"""The rubric: problems, their criteria and points, and the cases that feed them.

A *Case* is one spawn of N rank processes running a probe (child side); a
*Criterion* judges the probe's raw results in the parent process and is worth
points. Several criteria share one case, so one spawn serves many of them,
while each criterion reads only the parts it needs, so one bug costs one
criterion.
"""
from __future__ import annotations

import hashlib
import hmac
import io
import json
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from grading.launch import LaunchResult

PROBLEMS = {
    "1.1": "Data parallel: dataset partitioning",
    "1.2": "Data parallel: gradient averaging",
    "2.1": "Pipeline: schedule and module splitting",
    "2.2": "Pipeline: Pipe forward on stage workers",
    "2.3": "Pipeline: GPT-2 as pipeline stages",
    "3.1": "Fine-tuning: apply LoRA",
    "3.2": "Fine-tuning: save and load adapters",
    "3.3": "Fine-tuning: DeepSpeed ZeRO config and micro-batch step",
}


class CheckFailed(Exception):
    """Raised by a criterion's ``evaluate`` with a message that names what is wrong."""


@dataclass(frozen=True)
class Criterion:
    """One graded statement about a case's results, worth ``points``."""

    id: str                                   # "1.2.grads_2rank"
    title: str                                # shown in the table
    points: float
    evaluate: Callable[["CaseRun"], None]     # raises CheckFailed; returns None on success
    hidden: bool = False                      # Gradescope visibility "after_published"

    @property
    def problem(self) -> str:
        return ".".join(self.id.split(".")[:2])


@dataclass(frozen=True)
class Case:
    """One spawn: ``probe`` ("module:function") runs on ``world_size`` ranks."""

    name: str
    probe: str
    criteria: tuple[Criterion, ...]
    world_size: int = 1
    init_group: bool = True
    args: dict = field(default_factory=dict)
    timeout_s: float = 90.0

    @property
    def problems(self) -> set[str]:
        return {c.problem for c in self.criteria}


class CaseRun:
    """The parent's view of a finished case: load parts, explain missing ones."""

    def __init__(self, case: Case, launch: LaunchResult):
        self.case = case
        self.launch = launch
        self._logs: dict[int, dict[str, tuple[str, str]]] = {}

    @property
    def world_size(self) -> int:
        return self.case.world_size

    def _recorded(self, rank: int) -> dict[str, tuple[str, str]]:
        """name -> (kind, sha256) of the files the probe itself wrote on ``rank`` (lines with a valid HMAC)."""
        if rank not in self._logs:
            from grading.worker import part_mac
            found: dict[str, tuple[str, str]] = {}
            try:
                lines = (self.launch.out_dir / f"rank{rank}" / "parts.log").read_text(errors="replace").splitlines()
            except OSError:
                lines = []
            for line in lines:
                try:
                    entry = json.loads(line)
                    name, kind, digest, mac = entry["name"], entry["kind"], entry["sha256"], entry["mac"]
                    genuine = hmac.compare_digest(str(mac), part_mac(self.launch.key, rank, name, kind, digest))
                except (ValueError, KeyError, TypeError, AttributeError):
                    continue
                if genuine and kind in ("pt", "error.json"):
                    found[name] = (kind, digest)
            self._logs[rank] = found
        return self._logs[rank]

    def part(self, name: str, rank: int = 0) -> Any:
        """The value rank ``rank`` recorded as ``name`` (loaded with weights_only=True).

        Raises CheckFailed with the recorded exception, or with the case's
        crash/timeout reason when the part was never written. Only files that
        the probe's ``ctx.record`` wrote count (their hash is in the rank's
        signed ``parts.log``): a file planted by student code, or changed
        after it was recorded, is rejected with a message that says so.
        """
        rank_dir = self.launch.out_dir / f"rank{rank}"
        error_file = rank_dir / f"{name}.error.json"
        value_file = rank_dir / f"{name}.pt"
        where = f"rank {rank}: " if self.world_size > 1 else ""
        if not self.launch.key:                       # a hand-made LaunchResult: unsigned files
            entry = ("error.json", None) if error_file.exists() else ("pt", None) if value_file.exists() else None
        else:
            entry = self._recorded(rank).get(name)
        if entry is None:
            if error_file.exists() or value_file.exists():
                raise CheckFailed(f"{where}the result file for '{name}' was not written by the grader's probe "
                                  "(planted by the submission?); it was ignored. "
                                  + (self.launch.failure() or ""))
            reason = self.launch.failure() or "the probe ended without recording it"
            raise CheckFailed(f"rank {rank}: no result for '{name}': {reason}")
        kind, digest = entry
        try:
            data = (rank_dir / f"{name}.{kind}").read_bytes()
        except OSError:
            data = None
        if data is None or (digest is not None and hashlib.sha256(data).hexdigest() != digest):
            raise CheckFailed(f"{where}the result file for '{name}' was changed or removed after the probe "
                              "recorded it (by the submission?); it was ignored")
        if kind == "error.json":
            info = json.loads(data)
            context = ""
            if self.world_size > 1 and not self.launch.ok:     # e.g. a peer that crashed explains this error
                context = "\nmeanwhile: " + self.launch.failure()[:1500]
            raise CheckFailed(f"{where}{info['type']}: {info['message']}{context}")
        try:
            return torch.load(io.BytesIO(data), weights_only=True)
        except Exception as exc:  # noqa: BLE001
            raise CheckFailed(f"rank {rank}: result '{name}' is not plain data "
                              f"(tensors, numbers, lists, dicts): {exc}") from None

    def parts(self, name: str) -> list[Any]:
        """``part(name, r)`` for every rank r."""
        return [self.part(name, rank) for rank in range(self.world_size)]


def all_cases() -> list[Case]:
    """Every case of the rubric, in problem order (hidden cases only when present in this kit)."""
    from grading.checks import load_cases
    return load_cases()


def criteria_for(cases: list[Case], problem: str | None = None) -> list[Criterion]:
    """The criteria of ``cases`` (only those of ``problem`` when given)."""
    return [c for case in cases for c in case.criteria if problem is None or c.problem == problem]


def max_points(problem: str) -> float:
    """Total points of ``problem`` in this kit's rubric."""
    return sum(c.points for c in criteria_for(all_cases(), problem))


def check_rubric(cases: list[Case]) -> None:
    """Raise ValueError for duplicate case names or criterion ids, or unknown problems."""
    seen_cases, seen_ids = set(), set()
    for case in cases:
        if case.name in seen_cases:
            raise ValueError(f"duplicate case name {case.name}")
        seen_cases.add(case.name)
        for criterion in case.criteria:
            if criterion.id in seen_ids:
                raise ValueError(f"duplicate criterion id {criterion.id}")
            if criterion.problem not in PROBLEMS:
                raise ValueError(f"criterion {criterion.id}: unknown problem {criterion.problem}")
            seen_ids.add(criterion.id)
