"""Where a rank runs and how it joins its group: backend, rank and stage devices, CPU threads, peak memory.

The one place these choices are made, for ``project/run_*.py`` and ``project/bench`` alike (``join_group`` applies
them to a rank process): backend ``auto`` is NCCL with a GPU per local rank, else gloo on the CPU, where every rank
or pipeline stage is one simulated device with the threads of ``THREAD_POLICY``.
"""
from __future__ import annotations

import datetime
import os
import resource
from dataclasses import dataclass
from multiprocessing.connection import Connection

import torch

from common.cpus import available_cpus
from project.cli import ConfigError

GROUP_TIMEOUT = datetime.timedelta(minutes=10)
THREAD_POLICY = ("cpu: usable CPUs (affinity, cgroup quota) // max(devices, 2) torch threads per rank or stage "
                 "(at least 1); gpu: torch default")


def gpu_count() -> int:
    """Number of CUDA devices torch can use here (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def cpu_threads_per_rank(local_ranks: int) -> int:
    """Torch CPU threads for each of ``local_ranks`` ranks (or stages) on this machine: ``THREAD_POLICY``, where the
    usable CPUs are ``common.cpus.available_cpus`` rounded down (a container's quota counts, not the host's cores)."""
    return max(1, int(available_cpus()) // max(local_ranks, 2))


def thread_facts() -> dict:
    """``{"torch_threads": n, "thread_policy": THREAD_POLICY}`` of this process, for the metrics files."""
    return {"torch_threads": torch.get_num_threads(), "thread_policy": THREAD_POLICY}


def resolve_backend(backend: str, local_ranks: int) -> str:
    """``auto`` -> ``nccl`` when this machine has a GPU per local rank, else ``gloo``.

    Raises ConfigError for ``nccl`` without enough GPUs or an unknown backend.
    """
    if backend not in ("auto", "gloo", "nccl"):
        raise ConfigError(f"unknown backend {backend!r}; choose auto, gloo or nccl")
    gpus = gpu_count()
    if backend == "nccl" and gpus < local_ranks:
        raise ConfigError(f"--backend nccl needs one GPU per rank ({local_ranks} here) but this machine has {gpus}; "
                          f"use --backend gloo (CPU) or --backend auto")
    if backend == "auto":
        return "nccl" if gpus >= local_ranks else "gloo"
    return backend


def rank_device(backend: str, local_rank: int, share_gpu: bool = False) -> torch.device:
    """The device a rank computes on: ``cuda:<local_rank>`` with NCCL; with gloo the CPU, or ``cuda:0``
    when ``share_gpu`` and this machine has a GPU (ranks that share one GPU, as the benchmark's do)."""
    if backend == "nccl":
        return torch.device(f"cuda:{local_rank}")
    return torch.device("cuda:0") if share_gpu and gpu_count() else torch.device("cpu")


def bind_rank(backend: str, local_rank: int, local_ranks: int, threads: int | None = None,
              share_gpu: bool = False) -> torch.device:
    """Bind this process to its rank's device (``rank_device``) and return it.

    A GPU rank makes its device current; a CPU rank points DeepSpeed at the
    CPU (``DS_ACCELERATOR=cpu``, should it be imported later). Torch threads:
    ``threads`` when given (0 keeps torch's default), else ``THREAD_POLICY``
    (``cpu_threads_per_rank(local_ranks)`` with gloo, torch's default with NCCL).
    """
    device = rank_device(backend, local_rank, share_gpu)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")   # gloo means CPU tensors (matters only to DeepSpeed)
    if threads is None:
        threads = cpu_threads_per_rank(local_ranks) if backend == "gloo" else 0
    if threads > 0:
        torch.set_num_threads(threads)
    return device


def stage_devices(spec: str, n_stages: int) -> list[torch.device]:
    """The device of each pipeline stage. ``auto``: one GPU per stage if there are enough, else cuda:0, else CPU.

    ``spec`` is ``auto`` or a comma list with one device per stage
    (``cuda:0,cuda:1``). Raises ConfigError for a list of the wrong length,
    an unknown device or a missing GPU.
    """
    gpus = gpu_count()
    if spec == "auto":
        if gpus >= n_stages:
            return [torch.device(f"cuda:{k}") for k in range(n_stages)]
        return [torch.device("cuda:0" if gpus else "cpu")] * n_stages
    try:
        devices = [torch.device(d.strip()) for d in spec.split(",")]
    except RuntimeError as exc:
        raise ConfigError(f"--devices {spec!r}: {exc}") from None
    if len(devices) != n_stages:
        raise ConfigError(f"--devices lists {len(devices)} device(s) for {n_stages} stages")
    for d in devices:
        if d.type not in ("cpu", "cuda"):
            raise ConfigError(f"--devices: only cpu and cuda devices are supported, got {d}")
        if d.type == "cuda" and (d.index or 0) >= gpus:
            raise ConfigError(f"--devices names {d} but this machine has {gpus} GPU(s)")
    return devices


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory so far: CUDA max allocated on ``device`` for a GPU, else this process's peak RSS."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024   # Linux reports KiB


@dataclass(frozen=True)
class RankEnv:
    """Where one rank process stands: rank, world size, local rank and size, rendezvous, pipe to the parent.

    ``init_method`` is None for a process that joins no group; ``conn`` is
    None in a process that was not spawned (torchrun, or a 1-rank run).
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    init_method: str | None
    conn: Connection | None = None


def join_group(env: RankEnv, backend: str, student_setup: bool = True, threads: int | None = None,
               share_gpu: bool = False) -> tuple[str, torch.device]:
    """Bind this rank to its device and join the process group; return ``(backend, device)``.

    ``backend`` ``auto`` resolves as ``resolve_backend`` says;
    the device, threads and DeepSpeed's accelerator follow
    ``bind_rank`` (``threads``, ``share_gpu`` as there). With
    ``student_setup`` the group is joined through the student's
    ``setup_process_group`` (Problem 1.2), else with ``torch.distributed``
    directly (code that does not depend on Problem 1).
    """
    import torch.distributed as dist

    backend = resolve_backend(backend, env.local_world_size)
    device = bind_rank(backend, env.local_rank, env.local_world_size, threads, share_gpu)
    if student_setup:
        from data_parallel.comm import setup_process_group
        setup_process_group(env.rank, env.world_size, backend, init_method=env.init_method, timeout=GROUP_TIMEOUT)
    else:
        dist.init_process_group(backend, init_method=env.init_method, rank=env.rank, world_size=env.world_size,
                                timeout=GROUP_TIMEOUT)
    return backend, device


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """``t`` summed in place over the ranks of the default group (a collective); returns ``t``."""
    import torch.distributed as dist

    dist.all_reduce(t)
    return t
