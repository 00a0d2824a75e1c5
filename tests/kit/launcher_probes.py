"""Misbehaving probes for tests/kit/test_launcher.py (run inside rank processes)."""
import ctypes
import os
import subprocess
import sys
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


def rank0_raises_rank1_segfaults(ctx):
    if ctx.rank == 0:
        raise RuntimeError("boom on rank 0")
    ctypes.string_at(0)


def exits_early(ctx):
    os._exit(0)


def spawns_sleeper(ctx):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    (ctx.out_dir / "child_pid.txt").write_text(str(child.pid))
