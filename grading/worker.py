"""The child side of ``grading.launch``: one rank of one check.

``python -m grading.worker SPEC.json RANK`` sets up stack dumps and the
process group, then calls the probe with a RankContext. The probe records
each piece of student work with ``ctx.record``; results go to
``<out>/rank<R>/<name>.pt`` and exceptions to ``<name>.error.json``. The
parent never trusts a verdict from here: it loads the raw values and judges
them itself.

Before any student code runs, the worker reads a per-run key from stdin and
applies ``grading.sandbox`` limits. Every file ``record`` writes is logged in
``parts.log`` with its SHA-256 and an HMAC under that key (the ``done``
marker too), so the parent can reject result files planted or altered by
student code (see ``grading.rubric.CaseRun.part``).
"""
from __future__ import annotations

import datetime
import faulthandler
import hashlib
import hmac
import importlib
import json
import os
import secrets
import signal
import sys
import traceback
from pathlib import Path
from typing import Any, Callable


class RankContext:
    """What a probe gets: its rank, the case arguments, and ``record`` to save results."""

    def __init__(self, rank: int, world_size: int, args: dict, out_dir: Path, backend: str, device: str,
                 store: str, key: bytes = b""):
        self.rank = rank
        self.world_size = world_size
        self.args = args
        self.backend = backend
        self.device = device
        self.store = store                  # file-store path for probes that set up their own group
        self.out_dir = out_dir              # this rank's result folder
        self._key = key

    def record(self, name: str, fn: Callable[[], Any]) -> Any:
        """Run ``fn()``; save its return value as part ``name``, or the exception it raised.

        Returns the value, or None when ``fn`` raised (the exception is recorded,
        never propagated, so the next part still runs).
        """
        import torch
        try:
            value = fn()
        except BaseException as exc:  # noqa: BLE001 - a submission may raise anything, even SystemExit
            if isinstance(exc, KeyboardInterrupt):
                raise
            self._save_error(name, exc)
            return None
        scratch = self.out_dir / f".{name}.{secrets.token_hex(4)}.tmp"
        try:
            torch.save(value, scratch)
            self._commit(name, "pt", scratch)
        except Exception as exc:  # noqa: BLE001
            scratch.unlink(missing_ok=True)
            self._save_error(name, TypeError(f"returned a value that cannot be saved: {exc}"))
        return value

    def _save_error(self, name: str, exc: BaseException) -> None:
        info = {"type": type(exc).__name__, "message": str(exc)[:2000],
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
        line = {"name": name, "kind": kind, "sha256": digest, "mac": part_mac(self._key, self.rank, name, kind,
                                                                                digest)}
        with open(self.out_dir / "parts.log", "a") as log:
            log.write(json.dumps(line) + "\n")


def part_mac(key: bytes, rank: int, name: str, kind: str, digest: str) -> str:
    """HMAC-SHA256 (hex) binding a recorded file's hash to its rank, part name and kind."""
    return hmac.new(key, f"{rank}|{name}|{kind}|{digest}".encode(), hashlib.sha256).hexdigest()


def done_mac(key: bytes, rank: int) -> str:
    """The content of a genuine ``done`` marker for ``rank``."""
    return hmac.new(key, f"{rank}|done".encode(), hashlib.sha256).hexdigest()


def _init_group(spec: dict, rank: int) -> str:
    import torch
    import torch.distributed as dist
    backend = spec["backend"]
    device = "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device = f"cuda:{rank % torch.cuda.device_count()}"
    dist.init_process_group(backend, init_method=f"file://{spec['store']}", rank=rank,
                            world_size=spec["world_size"],
                            timeout=datetime.timedelta(seconds=spec["pg_timeout_s"]))
    return device


def _flush() -> None:
    """Flush stdout/stderr, ignoring errors (a flooded log may be over its file size limit)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def _read_key() -> bytes:
    """The per-run key the launcher writes to stdin; stdin is then /dev/null for the student code."""
    try:
        key = sys.stdin.buffer.read(256).strip()
    except (OSError, ValueError, AttributeError):
        key = b""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return key


def main(argv: list[str]) -> int:
    spec_path, rank = Path(argv[0]), int(argv[1])
    spec = json.loads(spec_path.read_text())
    out_root = spec_path.parent
    rank_dir = out_root / f"rank{rank}"
    rank_dir.mkdir(exist_ok=True)
    stack_file = open(out_root / f"rank{rank}.stack", "w")
    faulthandler.enable(file=stack_file, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    key = _read_key()
    from grading.sandbox import apply_limits
    (rank_dir / "sandbox.json").write_text(json.dumps(apply_limits(spec)))
    try:
        import torch
        torch.set_num_threads(int(os.environ.get("GRADING_THREADS", "1")))
        device = "cpu"
        if spec["init_group"]:
            device = _init_group(spec, rank)
        elif spec["backend"] == "nccl":
            device = f"cuda:{rank % torch.cuda.device_count()}"
        module_name, function_name = spec["target"].split(":")
        probe = getattr(importlib.import_module(module_name), function_name)
        ctx = RankContext(rank, spec["world_size"], spec["args"], rank_dir, spec["backend"], device,
                          spec["store"], key)
        del key
        probe(ctx)
    except BaseException:  # noqa: BLE001
        (rank_dir / "error.txt").write_text(traceback.format_exc()[-6000:])
        _flush()
        os._exit(1)
    (rank_dir / "done").write_text(done_mac(ctx._key, rank))
    _flush()
    # Skip interpreter shutdown: a submission's stray non-daemon thread must not keep the rank alive,
    # and destroying a process group whose peer died can block.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
