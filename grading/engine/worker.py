"""The child side of ``grading.engine.launch``: one rank of one check.

``main([SPEC.json, RANK])``, in a rank a fork server forked or a cold interpreter (``common.rank_process``), runs
the probe with a ``RankContext`` (``grading.engine.recording``: what it records, signed). The parent never trusts
a verdict from here: it loads the raw values and judges.
"""
from __future__ import annotations

import contextlib
import datetime
import faulthandler
import importlib
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

from common.regions import STUDENT_PACKAGES
from grading.engine.recording import CALLS_LOG, RankContext, RankStopped


def _device(spec: dict, rank: int) -> str:
    """This rank's device (its own GPU under NCCL), joining the case's group first when the spec says so."""
    import torch
    import torch.distributed as dist
    if spec.get("collective_checks") and dist.is_available():     # before any group exists (launch's docstring)
        dist.set_debug_level(dist.DebugLevel.DETAIL)
    device = f"cuda:{rank % torch.cuda.device_count()}" if spec["backend"] == "nccl" else "cpu"
    if spec["init_group"]:
        if device != "cpu":
            torch.cuda.set_device(device)
        dist.init_process_group(spec["backend"], init_method=f"file://{spec['store']}", rank=rank,
                                world_size=spec["world_size"],
                                timeout=datetime.timedelta(seconds=spec["pg_timeout_s"]))
        # every rank has joined before any goes on: one that ends at once cannot cut off a peer still connecting
        dist.barrier(**({"device_ids": [torch.cuda.current_device()]} if device != "cpu" else {}))
    return device


def _flush() -> None:
    """Flush stdout/stderr, ignoring errors (a flooded log may be over its file size limit)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()


def _read_key() -> bytes:
    """The per-run key the launcher writes to stdin; stdin is then /dev/null for the student code."""
    key = b""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        key = sys.stdin.buffer.read(256).strip()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return key


def _cold_imports(before: set[str], kit: Path, least: int = 20) -> dict[str, int]:
    """Library packages the probe imported itself (not preloaded), for ``grade --profile``: each outermost new
    module outside the kit that brought at least ``least`` modules, with their count."""
    new = set(sys.modules) - before
    counts: dict[str, int] = {}
    for name in new:
        root = name
        while "." in root and root.rsplit(".", 1)[0] in new:
            root = root.rsplit(".", 1)[0]
        counts[root] = counts.get(root, 0) + 1
    outside = {root: n for root, n in counts.items() if n >= least and not str(
        getattr(sys.modules.get(root), "__file__", None) or "").startswith(str(kit))}
    return dict(sorted(outside.items()))


def _log_calls(rank_dir: Path) -> None:
    """Log every collective call of this rank, with the student's file and line, to ``rank_dir/CALLS_LOG``
    (``common.call_log.install``: its first ``MAX_CALLS`` calls, a few MB at most), so that the parent can name the
    call on which ranks part (``grading.engine.peers``). A log that cannot be opened is left out: the rank runs
    as it would without it."""
    import torch.distributed as dist

    from common import call_log
    with contextlib.suppress(OSError):
        call_log.install(rank_dir / CALLS_LOG, STUDENT_PACKAGES, dist)


def main(argv: list[str]) -> int:
    """Run rank ``argv[1]`` of the case whose spec file is ``argv[0]``; return the process's exit code.

    Reads this rank's key from stdin, applies the sandbox limits and the rank's view of the machine
    (``grading.sandbox.rank_view.enter``: from there on the process is the rank's child in its case's PID
    namespace), sets up stack dumps, the process group and the log of its collective calls (``_log_calls``), then
    calls the probe. A cold worker ends the normal way (``sys.exit``), a forked one as its fork server ends a
    child. The ``done`` marker is its last act; the launcher bounds what comes after it.
    """
    marks = {"main": time.time()}
    spec_path, rank = Path(argv[0]), int(argv[1])
    spec = json.loads(spec_path.read_text())
    out_root = spec_path.parent
    rank_dir = out_root / f"rank{rank}"
    stack_file = open(out_root / f"rank{rank}.stack", "w")
    faulthandler.enable(file=stack_file, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    key = _read_key()
    from common.settings import settings
    from grading.sandbox import isolation, rank_view
    from grading.sandbox.limits import apply_limits
    limited = apply_limits(spec)
    isolated = rank_view.enter(spec["isolation"], rank, spec["namespaces"])   # from here on: the rank (its docstring)
    rank_view.watch(spec["isolation"], rank)
    (rank_dir / isolation.SANDBOX_FILE).write_text(json.dumps({
        "applied": limited["applied"] + isolated["applied"], "skipped": limited["skipped"] + isolated["skipped"],
        "isolation": isolated}))
    try:
        import torch
        torch.set_num_threads(settings().threads)
        marks["torch"] = time.time()
        device = _device(spec, rank)
        _log_calls(rank_dir)              # after the set-up's barrier: the log holds the probe's calls only
        marks["group"] = time.time()
        loaded = set(sys.modules)
        module_name, function_name = spec["target"].split(":")
        probe = getattr(importlib.import_module(module_name), function_name)
        marks["probe_imported"] = time.time()
        ctx = RankContext(rank, spec["world_size"], spec["args"], rank_dir, spec["backend"], device,
                          spec["store"], Path(spec["handoff"]), key)
        del key
        probe(ctx)
    except BaseException as exc:  # noqa: BLE001
        cause = exc.__cause__ if isinstance(exc, RankStopped) and exc.__cause__ else exc
        (rank_dir / "error.txt").write_text("".join(traceback.format_exception(cause))[-6000:])
        _flush()
        return 1
    marks.update(probe_done=time.time(), saving_s=ctx.saving_s,
                 cold_imports=_cold_imports(loaded, Path.cwd().resolve()))
    with contextlib.suppress(OSError):          # where this rank's time went, for ``grade --profile``
        (rank_dir / "timing.json").write_text(json.dumps(marks))
    _flush()
    ctx.finish()                  # last: the launcher may stop a finished rank from here on
    return 0
