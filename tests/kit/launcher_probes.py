"""Misbehaving probes for tests/kit/test_launcher.py (run inside rank processes)."""
import ctypes
import faulthandler
import os
import signal
import subprocess
import sys
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
    import psutil
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    (ctx.out_dir / "child_pid.txt").write_text(str(psutil.Process(child.pid).create_time()))


def forks_a_setsid_daemon(ctx):
    """A bare fork (no exec, so the run marker is not in the daemon's own start-up environment when the rank
    was forked warm) that double-forks, leaves its session and lingers; records the daemon's pid."""
    path = ctx.out_dir / "daemon_pid.txt"
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            (ctx.out_dir / "daemon_pid.tmp").write_text(_process_identity().split("@")[1])
            os.replace(ctx.out_dir / "daemon_pid.tmp", path)
            time.sleep(600)
        os._exit(0)
    os.waitpid(pid, 0)
    for _ in range(200):
        if path.exists():
            break
        time.sleep(0.02)
    ctx.record("daemon", lambda: float(path.read_text()))


def reports_fresh_state(ctx):
    """What a fresh interpreter draws anew: the str hash seed, the random module, the run marker, the threads."""
    import random
    ctx.record("state", lambda: {"hash": hash("grading"), "random": random.random(),
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


def _process_identity() -> str:
    """This process among all of the machine's: its pid (in its own PID namespace a rank is pid 1) and the
    time it started."""
    import psutil
    return f"{os.getpid()}@{psutil.Process().create_time()}"


def alive_since(started: float) -> bool:
    """Whether a python process that started at ``started`` (``_process_identity``'s time: a rank's pids are
    those of its own PID namespace, its start time is the machine's) still runs."""
    import psutil
    for process in psutil.process_iter():
        try:
            if process.create_time() == started and "python" in process.name() and \
                    process.status() != psutil.STATUS_ZOMBIE:
                return True
        except psutil.Error:
            continue
    return False


def hands_a_file_over(ctx):
    """Phase 1 of a two-phase case: leaves its process identity in the shared folder and records it."""
    (ctx.handoff_dir / f"rank{ctx.rank}.pid").write_text(_process_identity())
    ctx.record("first", _process_identity)


def takes_the_file(ctx):
    """Phase 2: records its own process identity and what phase 1 left for this rank."""
    left = ctx.handoff_dir / f"rank{ctx.rank}.pid"
    ctx.record("second", lambda: {"pid": _process_identity(), "left": left.read_text()})
