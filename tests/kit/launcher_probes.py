"""Misbehaving probes for tests/kit/test_launcher.py (run inside rank processes)."""
import ctypes
import faulthandler
import os
import signal
import subprocess
import sys
from pathlib import Path
import tempfile
import time

import torch
import torch.distributed as dist


def all_reduce_rank(ctx):
    def total():
        value = torch.tensor([float(ctx.rank + 1)])
        dist.all_reduce(value)
        return value.item()
    ctx.record("sum", total)


def rank1_hangs_in_collective(ctx):
    if ctx.rank == 1:
        while True:
            time.sleep(0.1)
    dist.barrier()


def hangs_deaf_to_stack_dumps(ctx):
    """Hangs where the stack dump request ends the process (as before the worker registers its handler)."""
    faulthandler.unregister(signal.SIGUSR1)
    while True:
        time.sleep(0.1)


def rank0_raises_rank1_segfaults(ctx):
    dist.barrier()          # both ranks through the group's set-up first: rank 1's crash cannot cut rank 0's
    if ctx.rank == 0:
        raise RuntimeError("boom on rank 0")
    ctypes.string_at(0)


def exits_early(ctx):
    os._exit(0)


def spawns_sleeper(ctx):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    (ctx.out_dir / "child_pid.txt").write_text(_process_identity(child.pid))


def forks_a_setsid_daemon(ctx):
    """A bare fork (no exec, so the run marker is not in the daemon's own start-up environment when the rank
    was forked warm) that double-forks, leaves its session and lingers; records the daemon's pid."""
    path = ctx.out_dir / "daemon_pid.txt"
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            (ctx.out_dir / "daemon_pid.tmp").write_text(_process_identity())
            os.replace(ctx.out_dir / "daemon_pid.tmp", path)
            time.sleep(600)
        os._exit(0)
    os.waitpid(pid, 0)
    for _ in range(200):
        if path.exists():
            break
        time.sleep(0.02)
    ctx.record("daemon", path.read_text)


def reports_fresh_state(ctx):
    """What a fresh interpreter draws anew: the str hash seed, the random module, the run marker, the threads;
    and what it starts with: the garbage collector's thresholds."""
    import gc
    import random
    ctx.record("state", lambda: {"hash": hash("grading"), "random": random.random(), "gc": gc.get_threshold(),
                                 "marker": os.environ.get("GRADING_RUN_ID", ""),
                                 "variable": os.environ.get("TORCH_LAUNCHER_TEST_VARIABLE"),
                                 "secret": os.environ.get("GRADING_COURSE_SECRET"),
                                 "server_kit": os.environ.get("GRADING_FORKSERVER_KIT"),
                                 "pool": os.environ.get("GRADING_FORKSERVER_POOL"),
                                 "tempdir": tempfile.gettempdir(),
                                 "torch_seed": torch.initial_seed(), "modules": sorted(
                                     m for m in sys.modules if m.startswith(("data_parallel", "pipeline")))})


def reports_preloaded(ctx):
    ctx.record("preloaded", lambda: {name: name in sys.modules for name in ctx.args["names"]})


def reports_kit(ctx):
    import common.startup
    import grading
    ctx.record("kit", lambda: {"grading": grading.__file__, "common": common.startup.__file__,
                               "pythonpath": os.environ.get("PYTHONPATH"), "path0": sys.path[0], "probes": __file__})


def imports_matplotlib(ctx):
    import matplotlib  # noqa: F401 - about 80 modules: what grade --profile lists as imported by the ranks


def leaves_a_thread(ctx):
    """Records, then leaves a non-daemon thread that sleeps ten minutes (a stray thread of a submission)."""
    import threading
    ctx.record("started", lambda: True)
    threading.Thread(target=time.sleep, args=(600,), daemon=False).start()


def _process_identity(pid: int | None = None) -> str:
    """A process among all of the machine's (default: this one): its PID namespace and its pid there (a rank's
    pids are those of its case's namespace, which another case reuses)."""
    own = f"/proc/{pid}" if pid else "/proc/self"
    status = Path(own, "status").read_text()
    in_namespace = next(line.split()[-1] for line in status.splitlines() if line.startswith("NSpid:"))
    return f"{os.readlink(own + '/ns/pid')}|{in_namespace}"


def alive_since(identity: str) -> bool:
    """Whether the process of ``identity`` (``_process_identity``) still runs (not a zombie), read from outside."""
    import psutil
    namespace, in_namespace = identity.split("|")
    for pid in psutil.pids():
        try:
            if os.readlink(f"/proc/{pid}/ns/pid") != namespace:
                continue
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        lines = {line.split(":")[0]: line.split()[1:] for line in status.splitlines() if ":" in line}
        if lines.get("NSpid", [""])[-1] == in_namespace and lines.get("State", ["Z"])[0] != "Z":
            return True
    return False


def hands_a_file_over(ctx):
    """Phase 1 of a two-phase case: leaves its process identity in the shared folder and records it."""
    (ctx.handoff_dir / f"rank{ctx.rank}.pid").write_text(_process_identity())
    ctx.record("first", _process_identity)


def takes_the_file(ctx):
    """Phase 2: records its own process identity and what phase 1 left for this rank."""
    left = ctx.handoff_dir / f"rank{ctx.rank}.pid"
    ctx.record("second", lambda: {"pid": _process_identity(), "left": left.read_text()})


def records_debug_level(ctx):
    """Records torch's collective check level in this phase's ranks: "level1" in the first phase, "level2" in the
    next (the file a rank's first phase leaves in the handoff folder tells them apart)."""
    import torch.distributed as dist
    seen = ctx.handoff_dir / f"rank{ctx.rank}.seen"
    name = "level2" if seen.exists() else "level1"
    seen.touch()
    ctx.record(name, lambda: str(dist.get_debug_level()))


def rank1_polls_rank0_waits(ctx):
    """Rank 0 waits in a barrier, rank 1 in a poll loop for a file nobody writes: every rank waits, none uses CPU."""
    if ctx.rank == 1:
        while not os.path.exists("/nonexistent-file-of-the-launcher-test"):
            time.sleep(0.05)
    dist.barrier()


def rank0_computes_rank1_waits(ctx):
    """Rank 0 computes for 3.5 s while rank 1 waits in a barrier: slow, not stuck."""
    if ctx.rank == 0:
        end = time.monotonic() + 3.5
        while time.monotonic() < end:
            sum(range(10_000))
    dist.barrier()
    ctx.record("done", lambda: 1)
