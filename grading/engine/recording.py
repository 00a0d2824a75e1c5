"""What a rank writes: the rank half of the results protocol (the parent half is ``grading.engine.case_run``).

``RankContext.record(name, fn)`` runs one piece of student work and writes its value to ``rank<R>/<name>.pt``
(or the exception to ``<name>.error.json``, with the student file and line it came from); each file's SHA-256
goes into ``rank<R>/parts.log`` with an HMAC under the rank's own key (``rank_key``: derived from the run's key,
which no rank holds, so no rank can sign for another). A rank whose probe returned writes a signed ``done``
marker (``done_mac``) as its last act. The parent checks both with these functions, so nothing the submission
plants or changes is taken for a result.
"""
from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from common.error_words import library_frame, student_frame

PARTS_LOG = "parts.log"
CALLS_LOG = "calls.txt"          # the rank's log of its collective calls (``common.call_log``; data, not signed)
DONE_MARKER = "done"
COLLECTIVES_MODULE = "torch/distributed/distributed_c10d.py"     # where torch.distributed's collectives live


# The library's own assertion failing inside a call on this rank alone (gloo's "Check failed: ... (71 vs. 70)"),
# unlike torch's checks, which refuse a mismatched call on every rank before it runs
LIBRARY_CHECK = re.compile(r"Check failed:|[Ee]nforce fail")


class RankStopped(BaseException):
    """Raised by ``RankContext.record`` after it recorded an error that broke the group (``broke_the_group``) in
    a case of several ranks: its peers wait in a call this rank left, and its next call would wait for them, so
    the rank ends now (the peers' call then fails at once instead of at the group's timeout). The cause is that
    error."""


def broke_the_group(exc: BaseException) -> bool:
    """Whether ``exc`` is a ``LIBRARY_CHECK`` failure out of a ``torch.distributed`` collective call (its
    innermost frames are there): this rank left a call that its peers entered and still wait in."""
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(LIBRARY_CHECK.search(str(exc))) and \
        any(frame.filename.replace("\\", "/").endswith(COLLECTIVES_MODULE) for frame in frames[-3:])


def rank_key(run_key: bytes, rank: int) -> bytes:
    """The key rank ``rank`` signs its records with: an HMAC of the run's key, which stays in the parent."""
    return hmac.new(run_key, f"rank{rank}".encode(), hashlib.sha256).hexdigest().encode()


def part_mac(key: bytes, rank: int, name: str, kind: str, digest: str) -> str:
    """HMAC-SHA256 (hex) binding a recorded file's hash to its rank, part name and kind."""
    return hmac.new(key, f"{rank}|{name}|{kind}|{digest}".encode(), hashlib.sha256).hexdigest()


def done_mac(key: bytes, rank: int) -> str:
    """The content of a genuine ``done`` marker for ``rank``."""
    return hmac.new(key, f"{rank}|done".encode(), hashlib.sha256).hexdigest()


def is_finished(rank_dir: Path, run_key: bytes, rank: int) -> bool:
    """True when ``rank_dir`` holds a genuine ``done`` marker of ``rank`` under the run's key ``run_key``."""
    from grading.sandbox.isolation import read_rank_file
    text = read_rank_file(Path(rank_dir) / DONE_MARKER, 200)
    return bool(text) and hmac.compare_digest(text, done_mac(rank_key(run_key, rank), rank))


class RankContext:
    """What a probe gets: its rank, the case arguments, and ``record`` to save results. ``handoff_dir`` is one folder
    for every rank and phase of the case (``Case.next_phases``), where a phase leaves files for the next (a
    checkpoint)."""

    def __init__(self, rank: int, world_size: int, args: dict, out_dir: Path, backend: str, device: str,
                 store: str, handoff_dir: Path, key: bytes = b""):
        self.rank, self.world_size, self.args, self.backend, self.device = rank, world_size, args, backend, device
        self.store = store                  # file-store path for probes that set up their own group
        self.out_dir = out_dir              # this rank's result folder
        self.handoff_dir = handoff_dir      # the case's folder for files handed from phase to phase
        self.saving_s = 0.0                 # time spent writing result files (for grade --profile)
        self._key = key
        self._naming: tuple[Callable[[str], str], frozenset[str]] | None = None    # see recording_as

    @contextlib.contextmanager
    def recording_as(self, rename: Callable[[str], str], allowed: frozenset[str] | None):
        """Within the block, ``record(name, ...)`` writes part ``rename(name)`` and accepts only ``allowed``
        names (a case's split parts; None: any name; ``grading.kit.problem.SubProblem.each_split`` is the one
        caller)."""
        self._naming = (rename, allowed)
        try:
            yield self
        finally:
            self._naming = None

    def record(self, name: str, fn: Callable[[], Any]) -> Any:
        """Run ``fn()``; save its return value as part ``name``, or the exception it raised.

        Returns the value, or None when ``fn`` raised (the exception is recorded,
        never propagated, so the next part still runs), except after an error that broke the group
        (``broke_the_group``) in a case of several ranks: then ``RankStopped`` ends the rank (its docstring).
        """
        import torch
        if self._naming is not None:
            rename, allowed = self._naming
            if allowed is not None and name not in allowed:
                raise ValueError(f"record: '{name}' is recorded once per split but is not one of the case's "
                                 f"split_parts {sorted(allowed)}")
            name = rename(name)
        try:
            value = fn()
        except BaseException as exc:  # noqa: BLE001 - a submission may raise anything, even SystemExit
            if isinstance(exc, KeyboardInterrupt):
                raise
            self._save_error(name, exc)
            if self.world_size > 1 and broke_the_group(exc):
                raise RankStopped(f"part {name!r}: a collective call failed; the rank stops") from exc
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

    def finish(self) -> None:
        """Write this rank's signed ``done`` marker (the probe returned normally; the worker's last act)."""
        (self.out_dir / DONE_MARKER).write_text(done_mac(self._key, self.rank))

    def _save_error(self, name: str, exc: BaseException) -> None:
        frames = traceback.extract_tb(exc.__traceback__)
        info = {"type": type(exc).__name__, "message": str(exc)[:2000], "where": student_frame(frames),
                "library": library_frame(frames),
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
