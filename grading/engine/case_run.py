"""What the parent reads of a finished case: how each rank ended (``LaunchResult``), what it recorded (``CaseRun``).

The parent half of the results protocol (the rank half is ``grading.engine.recording``). ``CaseRun.part`` accepts
only files the probe itself recorded (their hash is in the rank's signed ``parts.log``), loads them with
``weights_only=True`` and turns a recorded exception or a crash into ``CheckFailed``: the parent judges.
"""
from __future__ import annotations

import hashlib
import hmac
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grading.engine import peers
from grading.engine.expect import CheckFailed
from grading.engine.hints import format_error
from grading.engine.isolation import read_rank_bytes
from grading.engine.recording import PARTS_LOG, part_mac, rank_key
from common.rank_reports import is_symptom


@dataclass
class RankOutcome:
    """How one rank ended: exit code, the exception it reported, its stack if it was stuck."""

    rank: int
    returncode: int | None          # None: killed at the limit
    finished: bool                  # it wrote its signed 'done' marker: how it exited afterwards is no reason
    error: str = ""                 # traceback of an exception outside ctx.record (from the worker)
    stack: str = ""                 # faulthandler dump (stuck or crashed ranks)
    stderr_tail: str = ""


@dataclass
class LaunchResult:
    """Everything the parent needs to judge a run: per-rank outcomes and where results lie."""

    out_dir: Path
    world_size: int
    ranks: list[RankOutcome] = field(default_factory=list)
    timed_out: bool = False
    wall_s: float = 0.0
    limit_s: float = 0.0            # the case's limit, in load-discounted seconds (``launch.LoadClock``)
    key: bytes = b""                # the run's signing key (parts.log and done HMACs)
    lost: str = ""                  # why no result of this run counts (a rank killed its fork server)

    @property
    def ok(self) -> bool:
        return not self.timed_out and not self.lost and all(r.finished for r in self.ranks)

    def failure(self) -> str:
        """One human-readable reason why the run did not finish cleanly ("" when it did)."""
        if self.ok:
            return ""
        reasons = [self.lost] if self.lost else []
        if self.timed_out:
            stuck = [r for r in self.ranks if r.returncode is None]
            reasons.append(f"timed out after {self.wall_s:.0f} s (the limit of {self.limit_s:.0f} s, counted on an "
                           f"idle machine's clock) with rank(s) "
                           f"{', '.join(str(r.rank) for r in stuck) or '?'} still running")
            reasons += [f"rank {r.rank} was stuck at:\n{_last_frames(r.stack)}" for r in stuck if r.stack]
        for r in self.ranks:
            if r.returncode is None:
                continue
            if r.error:
                lines = [line for line in r.error.strip().splitlines() if line.strip()] or [r.error]
                reasons.append(f"rank {r.rank} failed: {lines[-1]}")
            elif not r.finished:
                detail = _last_frames(r.stack) if r.stack else r.stderr_tail.strip()[-600:]
                reasons.append(f"rank {r.rank} {peers.ending(r)}" + (f"\n{detail}" if detail else ""))
        return "\n".join(reasons)


def _last_frames(stack: str, keep: int = 6) -> str:
    """The innermost frames of the first thread in a faulthandler dump (most recent call first)."""
    frames = [line for line in stack.strip().splitlines() if line.strip().startswith("File ")]
    return "\n".join(frames[:keep]) if frames else stack.strip()[-600:]


CASE_FOLDER = "<the case's folder>"      # how a message shows the path of a case's folder (its out_dir)


def describe_error(info: dict, case_dir: Path | None = None) -> str:
    """``Type: message (at path:line (in fn))`` plus a likely cause when one is known (``hints.format_error``
    of an exception ``record`` saved). A path inside ``case_dir`` (the case's folder: a temporary one, another
    on every run) shows as ``CASE_FOLDER/...``, so the same error reads the same on every run."""
    message = str(info.get("message", ""))
    if case_dir is not None:
        for prefix in dict.fromkeys((str(Path(case_dir).resolve()), str(case_dir))):
            message = message.replace(prefix, CASE_FOLDER)
    return format_error(str(info.get("type", "Error")), message, info.get("where") or "")


class CaseRun:
    """The parent's view of a finished case: load parts, explain missing ones."""

    def __init__(self, world_size: int, launch: LaunchResult):
        self.world_size, self.launch = world_size, launch
        self._logs: dict[int, dict[str, tuple[str, str]]] = {}

    def _recorded(self, rank: int) -> dict[str, tuple[str, str]]:
        """name -> (kind, sha256) of the files the probe itself wrote on ``rank`` (lines with a valid HMAC)."""
        if rank not in self._logs:
            found: dict[str, tuple[str, str]] = {}
            key = rank_key(self.launch.key, rank)
            try:
                lines = read_rank_bytes(self.launch.out_dir / f"rank{rank}" / PARTS_LOG).decode(
                    errors="replace").splitlines()
            except OSError:
                lines = []
            for line in lines:
                try:
                    entry = json.loads(line)
                    name, kind, digest, mac = entry["name"], entry["kind"], entry["sha256"], entry["mac"]
                    genuine = hmac.compare_digest(str(mac), part_mac(key, rank, name, kind, digest))
                except (ValueError, KeyError, TypeError, AttributeError):
                    continue
                if genuine and kind in ("pt", "error.json"):
                    found[name] = (kind, digest)
            self._logs[rank] = found
        return self._logs[rank]

    def _read(self, name: str, rank: int) -> tuple[str, bytes | None]:
        """(kind, bytes) of part ``name`` of ``rank`` as its probe recorded it: kind "pt" or "error.json" with the
        file's bytes (None when the file was changed or removed since), or "" with None when it was not recorded."""
        entry = self._recorded(rank).get(name)
        if entry is None:
            return "", None
        kind, digest = entry
        try:
            data = read_rank_bytes(self.launch.out_dir / f"rank{rank}" / f"{name}.{kind}")
        except OSError:
            return kind, None
        return kind, data if hashlib.sha256(data).hexdigest() == digest else None

    def outcome(self, name: str, rank: int) -> tuple[str, dict | None]:
        """What ``rank`` recorded as ``name``: ("value", None), ("error", the recorded exception) or ("missing",
        None) (never recorded, or changed since)."""
        kind, data = self._read(name, rank)
        if data is None:
            return "missing", None
        if kind == "pt":
            return "value", None
        try:
            return "error", dict(json.loads(data))
        except (ValueError, TypeError):
            return "missing", None

    def first_symptom(self, rank: int) -> str | None:
        """The first part ``rank`` recorded (in recording order) whose error is a symptom of a peer's fault
        (``common.rank_reports.is_symptom``), or None."""
        for name in self._recorded(rank):
            kind, info = self.outcome(name, rank)
            if kind == "error" and is_symptom(f"{info.get('type')}: {info.get('message')}"):
                return name
        return None

    def part(self, name: str, rank: int = 0) -> Any:
        """The value rank ``rank`` recorded as ``name`` (loaded with weights_only=True).

        Raises CheckFailed with the recorded exception (and the student file and
        line it came from), or with the case's crash/timeout reason when the
        part was never written. When that error is another rank's doing (a
        closed connection, collectives that differ), the message starts with
        the rank at fault (``peers.explain``). Only files that the probe's
        ``record`` wrote count (their hash is in the rank's signed
        ``parts.log``): a file planted by student code, or changed after it was
        recorded, is rejected with a message that says so.
        """
        if self.launch.lost:
            raise CheckFailed(f"no result for '{name}': {self.launch.lost}")
        rank_dir = self.launch.out_dir / f"rank{rank}"
        where = f"rank {rank}: " if self.world_size > 1 else ""
        kind, data = self._read(name, rank)
        if not kind:
            if (rank_dir / f"{name}.error.json").exists() or (rank_dir / f"{name}.pt").exists():
                raise CheckFailed(f"{where}the result file for '{name}' was not written by the grader's probe "
                                  "(planted by the submission?); it was ignored. "
                                  + (self.launch.failure() or ""))
            explained = peers.explain(self, name, rank, None) if self.world_size > 1 else None
            if explained:
                raise CheckFailed(f"{explained}\nno result for '{name}' on rank {rank}: {self.launch.failure()}")
            reason = self.launch.failure() or "the probe ended without recording it"
            raise CheckFailed(f"rank {rank}: no result for '{name}': {reason}")
        if data is None:
            raise CheckFailed(f"{where}the result file for '{name}' was changed or removed after the probe "
                              "recorded it (by the submission?); it was ignored")
        if kind == "error.json":
            info = json.loads(data)
            explained = peers.explain(self, name, rank, info) if self.world_size > 1 else None
            if explained:
                raise CheckFailed(explained)
            context = "\nmeanwhile: " + self.launch.failure()[:1500] if self.world_size > 1 and not self.launch.ok \
                else ""
            raise CheckFailed(f"{where}{describe_error(info, self.launch.out_dir)}{context}")
        import torch
        try:
            return torch.load(io.BytesIO(data), weights_only=True)
        except Exception as exc:  # noqa: BLE001
            raise CheckFailed(f"rank {rank}: result '{name}' is not plain data "
                              f"(tensors, numbers, lists, dicts): {exc}") from None

    def parts(self, name: str) -> list[Any]:
        """``part(name, r)`` for every rank r."""
        return [self.part(name, rank) for rank in range(self.world_size)]
