"""The CPUs this process may use: its affinity, and the CPU quota of its cgroups (v2 ``cpu.max``, v1 CFS files).

A container of half a vCPU has an affinity of every host core but a quota of
0.5; ``available_cpus`` is the smaller, for ``launch.LoadClock``.
"""
from __future__ import annotations

import functools
import os
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
