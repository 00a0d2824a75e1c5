"""The results protocol between a rank process and the grader.

In the rank, ``RankContext.record(name, fn)`` runs one piece of student work
and writes its value to ``rank<R>/<name>.pt`` (or the exception to
``<name>.error.json``, with the student file and line it came from). Each
file's SHA-256 goes into ``rank<R>/parts.log`` with an HMAC under the run's
key, and a finished rank writes a signed ``done`` marker. In the parent,
``CaseRun.part(name, rank)`` accepts only files the probe itself recorded
(their hash is in the signed log), loads them with ``weights_only=True`` and
turns a recorded exception or a crash into ``CheckFailed``. Student code runs
in the rank, so nothing here trusts a verdict from it: the parent judges.
"""
from __future__ import annotations

import contextlib
import hashlib
import hmac
import io
import json
import os
import secrets
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from grading.engine.expect import CheckFailed
from grading.engine.hints import format_error, student_frame

if TYPE_CHECKING:
    from grading.engine.launch import LaunchResult

PARTS_LOG = "parts.log"
DONE_MARKER = "done"


def part_mac(key: bytes, rank: int, name: str, kind: str, digest: str) -> str:
    """HMAC-SHA256 (hex) binding a recorded file's hash to its rank, part name and kind."""
    return hmac.new(key, f"{rank}|{name}|{kind}|{digest}".encode(), hashlib.sha256).hexdigest()


def done_mac(key: bytes, rank: int) -> str:
    """The content of a genuine ``done`` marker for ``rank``."""
    return hmac.new(key, f"{rank}|done".encode(), hashlib.sha256).hexdigest()


class RankContext:
    """What a probe gets: its rank, the case arguments, and ``record`` to save results."""

    def __init__(self, rank: int, world_size: int, args: dict, out_dir: Path, backend: str, device: str,
                 store: str, key: bytes = b"", join: Callable[[], str] | None = None):
        self._join = join                   # joins the case's group, returns the device (the worker's code)
        self.rank = rank
        self.world_size = world_size
        self.args = args
        self.backend = backend
        self.device = device
        self.store = store                  # file-store path for probes that set up their own group
        self.out_dir = out_dir              # this rank's result folder
        self.saving_s = 0.0                 # time spent writing result files (for grade --profile)
        self._key = key
        self._naming: tuple[Callable[[str], str], frozenset[str]] | None = None    # see recording_as

    @contextlib.contextmanager
    def recording_as(self, rename: Callable[[str], str], allowed: frozenset[str]):
        """Within the block, ``record(name, ...)`` writes part ``rename(name)`` and accepts only ``allowed``
        names (a case's split parts; ``grading.kit.problem.SubProblem.each_split`` is the one caller)."""
        self._naming = (rename, frozenset(allowed))
        try:
            yield self
        finally:
            self._naming = None

    def record(self, name: str, fn: Callable[[], Any]) -> Any:
        """Run ``fn()``; save its return value as part ``name``, or the exception it raised.

        Returns the value, or None when ``fn`` raised (the exception is recorded,
        never propagated, so the next part still runs).
        """
        import torch
        if self._naming is not None:
            rename, allowed = self._naming
            if name not in allowed:
                raise ValueError(f"record: '{name}' is recorded once per split but is not one of the case's "
                                 f"split_parts {sorted(allowed)}")
            name = rename(name)
        try:
            value = fn()
        except BaseException as exc:  # noqa: BLE001 - a submission may raise anything, even SystemExit
            if isinstance(exc, KeyboardInterrupt):
                raise
            self._save_error(name, exc)
            return None
        scratch = self.out_dir / f".{name}.{secrets.token_hex(4)}.tmp"
        started = time.perf_counter()
        try:
            torch.save(value, scratch)
            self._commit(name, "pt", scratch)
        except Exception as exc:  # noqa: BLE001
            scratch.unlink(missing_ok=True)
            self._save_error(name, TypeError(f"returned a value that cannot be saved: {exc}"))
        self.saving_s += time.perf_counter() - started
        return value

    def join_group(self) -> None:
        """Join the case's process group now, exactly as the worker joins it for an ``init_group`` case.

        For a case with ``init_group=False`` whose probe must act first, e.g.
        fork a process while this one has no group and no thread yet.
        """
        if self._join is None:
            raise RuntimeError("join_group: this rank has no group to join")
        self.device = self._join()

    def finish(self) -> None:
        """Write this rank's signed ``done`` marker (the probe returned normally)."""
        (self.out_dir / DONE_MARKER).write_text(done_mac(self._key, self.rank))

    def _save_error(self, name: str, exc: BaseException) -> None:
        info = {"type": type(exc).__name__, "message": str(exc)[:2000],
                "where": student_frame(traceback.extract_tb(exc.__traceback__)),
                "traceback": "".join(traceback.format_exception(exc))[-6000:]}
        scratch = self.out_dir / f".{name}.{secrets.token_hex(4)}.tmp"
        scratch.write_text(json.dumps(info))
        self._commit(name, "error.json", scratch)

    def _commit(self, name: str, kind: str, scratch: Path) -> None:
        """Move ``scratch`` to ``<name>.<kind>`` (replacing anything planted there) and log its hash."""
        digest = hashlib.sha256(scratch.read_bytes()).hexdigest()
        os.replace(scratch, self.out_dir / f"{name}.{kind}")
        other = "error.json" if kind == "pt" else "pt"
        (self.out_dir / f"{name}.{other}").unlink(missing_ok=True)
        line = {"name": name, "kind": kind, "sha256": digest,
                "mac": part_mac(self._key, self.rank, name, kind, digest)}
        with open(self.out_dir / PARTS_LOG, "a") as log:
            log.write(json.dumps(line) + "\n")


def is_finished(rank_dir: Path, key: bytes, rank: int) -> bool:
    """True when ``rank_dir`` holds a genuine ``done`` marker of ``rank`` under ``key``."""
    try:
        text = (Path(rank_dir) / DONE_MARKER).read_text(errors="replace")[:200]
    except OSError:
        return False
    return hmac.compare_digest(text, done_mac(key, rank))


def describe_error(info: dict) -> str:
    """``Type: message (at path:line (in fn))`` plus a likely cause when one is known (``hints.format_error``
    of an exception ``record`` saved)."""
    return format_error(str(info.get("type", "Error")), str(info.get("message", "")), info.get("where") or "")


class CaseRun:
    """The parent's view of a finished case: load parts, explain missing ones."""

    def __init__(self, world_size: int, launch: LaunchResult):
        self.world_size = world_size
        self.launch = launch
        self._logs: dict[int, dict[str, tuple[str, str]]] = {}

    def _recorded(self, rank: int) -> dict[str, tuple[str, str]]:
        """name -> (kind, sha256) of the files the probe itself wrote on ``rank`` (lines with a valid HMAC)."""
        if rank not in self._logs:
            found: dict[str, tuple[str, str]] = {}
            try:
                lines = (self.launch.out_dir / f"rank{rank}" / PARTS_LOG).read_text(errors="replace").splitlines()
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

        Raises CheckFailed with the recorded exception (and the student file and
        line it came from), or with the case's crash/timeout reason when the
        part was never written. Only files that the probe's ``record`` wrote
        count (their hash is in the rank's signed ``parts.log``): a file planted
        by student code, or changed after it was recorded, is rejected with a
        message that says so.
        """
        if self.launch.lost:
            raise CheckFailed(f"no result for '{name}': {self.launch.lost}")
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
