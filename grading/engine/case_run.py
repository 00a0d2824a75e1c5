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

from common import call_log
from common.rank_reports import FRAME as _FRAME, headline, package_path, traceback_parts
from common.regions import STUDENT_PACKAGES
from grading.engine import peers
from grading.engine.expect import CheckFailed
from common.error_words import format_error, plain, traceback_error, traceback_hint
from grading.sandbox.isolation import read_rank_bytes
from grading.engine.recording import CALLS_LOG, PARTS_LOG, part_mac, rank_key
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
    limit_s: float = 0.0            # the case's limit, in load-discounted seconds (``cpus.LoadClock``)
    key: bytes = b""                # the run's signing key (parts.log and done HMACs)
    server_gone: str = ""                  # why no result of this run counts (a rank killed its fork server)
    still_s: float = 0.0            # ended early: how long every rank had been waiting then (0: not ended so)

    @property
    def ok(self) -> bool:
        return not self.timed_out and not self.server_gone and all(r.finished for r in self.ranks)

    def failure(self) -> str:
        """One human-readable reason why the run did not finish cleanly ("" when it did)."""
        if self.ok:
            return ""
        reasons = [self.server_gone] if self.server_gone else []
        if self.timed_out and self.still_s:
            stuck = [r for r in self.ranks if r.returncode is None]
            reasons.append(f"ended after {self.wall_s:.0f} s: every rank still running "
                           f"({', '.join(str(r.rank) for r in stuck) or '?'}) had waited {self.still_s:.0f} s without "
                           "using the CPU (in a collective, a receive, a sleep or a poll loop), so none could go on")
            reasons += [f"rank {r.rank} was stuck at:\n{_last_frames(r.stack)}" for r in stuck if r.stack]
        elif self.timed_out:
            stuck = [r for r in self.ranks if r.returncode is None]
            limit = (f"the limit of {self.limit_s:.0f} s" if self.limit_s >= 1 else
                     "a limit under one second, what was left of the grade's total time")
            reasons.append(f"timed out after {self.wall_s:.0f} s ({limit}, counted on an idle machine's clock: a "
                           f"busy machine stretches it) with rank(s) "
                           f"{', '.join(str(r.rank) for r in stuck) or '?'} still running")
            reasons += [f"rank {r.rank} was stuck at:\n{_last_frames(r.stack)}" for r in stuck if r.stack]
        for r in self.ranks:
            if r.returncode is None:
                continue
            if r.error:
                reasons.append(f"rank {r.rank} failed: {traceback_error(r.error)}")
            elif not r.finished:
                detail = _last_frames(r.stack) if r.stack else r.stderr_tail.strip()[-600:]
                reasons.append(f"rank {r.rank} {peers.ending(r)}" + (f"\n{detail}" if detail else ""))
        return "\n".join(reasons)


def _last_frames(stack: str, keep: int = 6) -> str:
    """The innermost frames of the first thread in a faulthandler dump (most recent call first)."""
    frames = [line for line in stack.strip().splitlines() if line.strip().startswith("File ")]
    return "\n".join(frames[:keep]) if frames else stack.strip()[-600:]


CASE_FOLDER = "<the case's folder>"      # how a message shows the path of a case's folder (its out_dir)


def in_case_folder(message: str, case_dir: Path) -> str:
    """``message`` with the path of ``case_dir`` (the case's folder: a temporary one, another on every run) shown as
    ``CASE_FOLDER``, so the same failure reads the same on every run."""
    for prefix in dict.fromkeys((str(Path(case_dir).resolve()), str(case_dir))):
        message = message.replace(prefix, CASE_FOLDER)
    return message


def describe_error(info: dict) -> str:
    """``Type: message (at path:line (in fn))`` plus a likely cause when one is known (``error_words.format_error``
    of an exception ``record`` saved)."""
    return format_error(str(info.get("type", "Error")), str(info.get("message", "")), str(info.get("where") or ""),
                        str(info.get("library") or ""))


_GRADER = ("grading", "tests")             # where the grader's probes live (the kit's tests have probes too)


def _grader_frame(error: str) -> str:
    """``path:line (in fn)`` of the frame in the grader's own code (a probe's) that failed, in a rank's traceback:
    its innermost frame when that is the grader's, or the grader's innermost frame below a library's when no frame
    of the student's code is on the way (a library that the student's code called through a grader's stand-in
    raised the student's error); else ""."""
    frames = _FRAME.findall(error)
    if frames and package_path(frames[-1][0], _GRADER):
        path, line, function = frames[-1]
        return f"{package_path(path, _GRADER)}:{line} (in {function})"
    if any(package_path(path, STUDENT_PACKAGES) for path, _, _ in frames):
        return ""
    for path, line, function in frames[::-1]:
        if package_path(path, _GRADER):
            return f"{package_path(path, _GRADER)}:{line} (in {function})"
    return ""


def _probe_error(error: str) -> str:
    """A probe's exception in one line: ``Type: message``, the grader's frame that failed (with the library that
    raised it below that frame), and the innermost frame of the student's code on the way, if any."""
    exception, where, library = traceback_parts(error, STUDENT_PACKAGES)
    return (plain(headline(exception)) + f" (at the grader's {_grader_frame(error)}"
            + (f"; raised inside {library}" if library else "") + "); "
            + (f"the innermost frame of your code: {where}" if where else "no frame of your code was running"))


class CaseRun:
    """The parent's view of a finished case: load parts, explain missing ones."""

    def __init__(self, world_size: int, launch: LaunchResult):
        self.world_size, self.launch = world_size, launch
        self._logs: dict[int, dict[str, tuple[str, str]]] = {}
        self._calls: dict[int, list[call_log.Call]] | None = None
        self._note: str | None = None

    def call_logs(self) -> dict[int, list[call_log.Call]]:
        """Every rank's collective calls as its worker logged them (``rank<R>/calls.txt``, ``common.call_log``;
        read once, bounded; what a rank wrote there is data only), for ranks that left a log."""
        if self._calls is None:
            found = {rank: call_log.read(self.launch.out_dir / f"rank{rank}" / CALLS_LOG)
                     for rank in range(self.world_size)}
            self._calls = {rank: calls for rank, calls in found.items()
                           if calls or (self.launch.out_dir / f"rank{rank}" / CALLS_LOG).is_file()}
        return self._calls

    def calls_note(self, message: str = "") -> str:
        """A ``likely cause:`` line for a failure ``message`` of the case when the ranks' collective calls part ways
        (``common.call_log.divergence``: a call that differs, a skipped call or step, a deadlock) and no rank
        raised an error of its own, so that a wrong number reads as what caused it; "" otherwise, or when
        ``message`` already names the parting (read once)."""
        if self._note is None:
            self._note = ""
            if self.world_size > 1 and self.launch is not None and not self._own_errors():
                ended = {r.rank for r in self.launch.ranks if not r.finished and r.returncode != 0 and not r.error}
                found = call_log.divergence(self.call_logs(), ended=ended)
                if found:
                    self._note = found[1].splitlines()[0]
        if not self._note or self._note in message:
            return ""
        return f"likely cause: the ranks' collective calls part ways: {self._note}"

    def _own_errors(self) -> bool:
        """Whether some rank raised an error of its own (not a symptom of a peer's), in a part or outside."""
        for rank in range(self.world_size):
            outcome = self.launch.ranks[rank] if rank < len(self.launch.ranks) else None
            if outcome is not None and outcome.error and not is_symptom(outcome.error):
                return True
            for name in self._recorded(rank):
                kind, info = self.outcome(name, rank)
                if kind == "error" and not is_symptom(f"{info.get('type')}: {info.get('message')}"):
                    return True
        return False

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
        if self.launch.server_gone:
            raise CheckFailed(f"no result for '{name}': {self.launch.server_gone}")
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
            own = self.launch.ranks[rank] if rank < len(self.launch.ranks) else None
            if own is not None and own.error and is_symptom(own.error):    # a peer's doing, seen from this rank
                symptom = f"symptom: rank {rank} then failed: {traceback_error(own.error)}"
                for peer in range(self.world_size):     # a peer's own exception in this part (e.g. not implemented)
                    kind_p, info = self.outcome(name, peer) if peer != rank else ("", None)
                    if kind_p == "error" and not is_symptom(f"{info.get('type')}: {info.get('message')}"):
                        raise CheckFailed(f"rank {peer}: {describe_error(info)}\n{symptom}\n"
                                          f"no result for '{name}' on rank {rank}")
                ended = [r for r in self.launch.ranks if r.rank != rank and not r.finished and r.returncode is not None]
                if ended:                               # a peer that crashed or exited
                    raise CheckFailed(f"rank {ended[0].rank} {peers.ending(ended[0])}\n{symptom}\n"
                                      f"no result for '{name}' on rank {rank}")
            if own is not None and own.error and not own.finished and _grader_frame(own.error):
                raise CheckFailed(f"rank {rank}: no result for '{name}': the grader's probe failed before recording "
                                  f"it: {_probe_error(own.error)}")
            reason = self.launch.failure() or "the grader's probe returned without recording it"
            cause = traceback_hint(own.error) if own is not None and own.error else ""
            raise CheckFailed(f"rank {rank}: no result for '{name}': {reason}" + (f"\n{cause}" if cause else ""))
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
            raise CheckFailed(f"{where}{describe_error(info)}{context}")
        import torch
        try:
            return torch.load(io.BytesIO(data), weights_only=True)
        except Exception as exc:  # noqa: BLE001
            raise CheckFailed(f"rank {rank}: result '{name}' is not plain data "
                              f"(tensors, numbers, lists, dicts): {exc}") from None

    def parts(self, name: str) -> list[Any]:
        """``part(name, r)`` for every rank r."""
        return [self.part(name, rank) for rank in range(self.world_size)]
