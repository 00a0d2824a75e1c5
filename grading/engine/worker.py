"""The child side of ``grading.engine.launch``: one rank of one check.

``python -m grading.engine.worker SPEC.json RANK`` sets up stack dumps and the
process group, then calls the probe with a RankContext. The probe records
each piece of student work with ``ctx.record``; results go to
``<out>/rank<R>/<name>.pt`` and exceptions to ``<name>.error.json``. The
parent never trusts a verdict from here: it loads the raw values and judges
them itself.

Before any student code runs, the worker reads a per-run key from stdin and
applies ``grading.engine.sandbox`` limits. Recording, signing and the ``done``
marker are the results protocol of ``grading.engine.results``.
"""
from __future__ import annotations

import datetime
import faulthandler
import functools
import importlib
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

from grading.engine.results import RankContext


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


def _write_timing(rank_dir: Path, marks: dict) -> None:
    """Where this rank's time went (``timing.json``: wall-clock marks), for ``grade --profile``; never fails."""
    try:
        (rank_dir / "timing.json").write_text(json.dumps(marks))
    except OSError:
        pass


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


def main(argv: list[str]) -> int:
    marks = {"main": time.time()}
    spec_path, rank = Path(argv[0]), int(argv[1])
    spec = json.loads(spec_path.read_text())
    out_root = spec_path.parent
    rank_dir = out_root / f"rank{rank}"
    rank_dir.mkdir(exist_ok=True)
    stack_file = open(out_root / f"rank{rank}.stack", "w")
    faulthandler.enable(file=stack_file, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    key = _read_key()
    from grading.engine.sandbox import apply_limits
    (rank_dir / "sandbox.json").write_text(json.dumps(apply_limits(spec)))
    try:
        import torch
        torch.set_num_threads(int(os.environ.get("GRADING_THREADS", "1")))
        marks["torch"] = time.time()
        device = "cpu"
        if spec["init_group"]:
            device = _init_group(spec, rank)
        elif spec["backend"] == "nccl":
            device = f"cuda:{rank % torch.cuda.device_count()}"
        marks["group"] = time.time()
        loaded = set(sys.modules)
        module_name, function_name = spec["target"].split(":")
        probe = getattr(importlib.import_module(module_name), function_name)
        marks["probe_imported"] = time.time()
        ctx = RankContext(rank, spec["world_size"], spec["args"], rank_dir, spec["backend"], device,
                          spec["store"], key, join=functools.partial(_init_group, spec, rank))
        del key
        probe(ctx)
    except BaseException:  # noqa: BLE001
        (rank_dir / "error.txt").write_text(traceback.format_exc()[-6000:])
        _flush()
        os._exit(1)
    ctx.finish()
    marks.update(probe_done=time.time(), saving_s=ctx.saving_s,
                 cold_imports=_cold_imports(loaded, Path.cwd().resolve()))
    _write_timing(rank_dir, marks)
    _flush()
    # Skip interpreter shutdown: a submission's stray non-daemon thread must not keep the rank alive,
    # and destroying a process group whose peer died can block.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
