"""The CPUs this process may use: its affinity, and the CPU quota of its cgroups (v2 ``cpu.max``, v1 CFS files).

A container of half a vCPU has an affinity of every host core but a quota of
0.5; ``available_cpus`` is the smaller, for ``LoadClock`` below.
"""
from __future__ import annotations

import functools
import os
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def parse_cpu_max(text: str) -> float | None:
    """The CPUs a cgroup v2 ``cpu.max`` allows: "QUOTA PERIOD" (microseconds) -> QUOTA / PERIOD ("50000 100000"
    -> 0.5); None for "max QUOTA" (no limit). Raises ValueError for anything else."""
    fields = text.split()
    if len(fields) != 2 or not fields[1].isdigit() or int(fields[1]) <= 0:
        raise ValueError(f"cpu.max: expected 'QUOTA PERIOD' or 'max PERIOD', got {text.strip()!r}")
    if fields[0] == "max":
        return None
    if not fields[0].isdigit() or int(fields[0]) <= 0:
        raise ValueError(f"cpu.max: the quota must be 'max' or a positive integer, got {fields[0]!r}")
    return int(fields[0]) / int(fields[1])


def parse_cfs_quota(quota: str, period: str) -> float | None:
    """The CPUs a cgroup v1 ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us`` allows ("50000", "100000" -> 0.5);
    None for a quota of -1 (no limit). Raises ValueError for anything else."""
    try:
        quota_us, period_us = int(quota), int(period)
    except ValueError:
        raise ValueError(f"cpu.cfs_quota_us/cpu.cfs_period_us: not integers: {quota.strip()!r}, "
                         f"{period.strip()!r}") from None
    if period_us <= 0 or quota_us == 0 or quota_us < -1:
        raise ValueError(f"cpu.cfs_quota_us/cpu.cfs_period_us: expected a positive quota or -1 over a positive "
                         f"period, got {quota_us}/{period_us}")
    return None if quota_us == -1 else quota_us / period_us


def _quota_of(folder: Path) -> float | None:
    """The CPU quota set on one cgroup folder (v2 ``cpu.max`` or v1 CFS files); None when none is set or readable."""
    try:
        if (folder / "cpu.max").is_file():
            return parse_cpu_max((folder / "cpu.max").read_text())
        if (folder / "cpu.cfs_quota_us").is_file():
            return parse_cfs_quota((folder / "cpu.cfs_quota_us").read_text(),
                                   (folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        pass
    return None


@functools.lru_cache(maxsize=1)
def cpu_quota(proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = CGROUP_ROOT) -> float | None:
    """The CPUs this process's cgroups (``proc_cgroup``, mounted under ``root``) let it use: the smallest quota
    from its cgroup up to its hierarchy's root, v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us`` (0.5 in a container of
    half a vCPU); None when no quota is set or the cgroups cannot be read."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    quotas = []
    for _, controllers, rel in (line.split(":", 2) for line in lines if line.count(":") >= 2):
        if controllers and "cpu" not in controllers.split(","):
            continue
        mounts = [root / controllers, root / "cpu"] if controllers else [root, root / "unified"]
        for mount in (m for m in mounts if m.is_dir()):
            folder = mount / rel.strip("/")
            folder = folder if folder.is_dir() else mount     # in a cgroup namespace the mount is its own cgroup
            quotas += [q for f in (folder, *folder.parents) if f == mount or mount in f.parents
                       if (q := _quota_of(f)) is not None]
            break
    return min(quotas) if quotas else None


def available_cpus() -> float:
    """The CPUs this process may run on: its affinity's count, or its cgroups' quota when smaller (0.5 on half a
    vCPU); 1 when neither can be read."""
    try:
        affinity = len(os.sched_getaffinity(0)) or 1
    except (OSError, AttributeError):
        affinity = 1
    quota = cpu_quota()
    return min(affinity, quota) if quota else affinity


class LoadClock:
    """Seconds since creation as an idle machine would count them: wall time divided by how busy the machine is.

    From ``/proc/loadavg`` (runnable tasks, this process excluded) against the CPUs this process may use
    (``available_cpus``: affinity and cgroup quota): with 8 runnable tasks on 2 cores, 4 wall seconds count as 1;
    on half a vCPU one busy rank counts 2 wall seconds as 1. A limit on this clock cuts a hang (sleeping ranks
    accrue time as on an idle machine) but not a correct submission that a busy machine slows down: no verdict
    depends on load. In a container ``/proc/loadavg`` counts the whole host's tasks, so a busy host stretches
    limits further than the container's own load would.
    """

    def __init__(self):
        self._last, self._elapsed = time.monotonic(), 0.0

    @staticmethod
    def slowdown(recent: bool = False) -> float:
        """How many times slower than on an idle machine a runnable process runs now (>= 1); with ``recent``, the
        worse of that and the last minute's average load (to scale a limit set once)."""
        try:
            fields, cpus = Path("/proc/loadavg").read_text().split(), available_cpus()
            return max(1.0, (int(fields[3].split("/")[0]) - 1) / cpus, float(fields[0]) / cpus if recent else 1.0)
        except (OSError, ValueError, IndexError):
            return 1.0

    def elapsed(self) -> float:
        """Load-discounted seconds so far (call it often: each call weighs the time since the last one)."""
        now = time.monotonic()
        self._elapsed += (now - self._last) / self.slowdown()
        self._last = now
        return self._elapsed
