"""What a worker process runs: steppers over the student API ("ours"), the timed loop, the command loop.

A *stepper* is built once per variant and cached, so its set-up (model copy, optimizer, worker threads, DDP buckets)
is outside the timing and the warm-up run warms it; ``run`` times it, ``serve`` is a worker's command loop. The
peers' steppers (``project.bench.peers``) plug into the same loop; the pieces are in ``project.bench.context``.
"""
from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

from project.bench import peers
from project.bench.context import Context, Stepper, local_step
from project.bench.workload import load_workload
from project.devices import RankEnv, join_group


# -- ours: steppers on the student API --------------------------------------------------------------------

def dp_ours(ctx: Context) -> Stepper:
    """Data parallel with the student's ``train_step`` (which calls ``average_gradients``), AdamW."""
    from data_parallel.comm import train_step
    from project.model import lm_loss

    model = ctx.model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return Stepper(lambda i: train_step(model, optimizer, *ctx.batch(i), lm_loss))


def no_comm(ctx: Context) -> Stepper:
    """This rank's share of the data-parallel work without any communication (parallel-capacity probe)."""
    model = ctx.model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return Stepper(lambda i: local_step(model, optimizer, *ctx.batch(i)))


def no_comm_sequential(ctx: Context) -> Stepper:
    """Both ranks' shares, one after the other, in one process (what two devices would do at once)."""
    model = ctx.model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(i: int) -> None:
        for part in range(2):
            local_step(model, optimizer, *ctx.half(i, part))
    return Stepper(step)


def comm_ours(ctx: Context) -> Stepper:
    """Only the student's ``average_gradients`` on a model holding real gradients (reset before each run)."""
    from data_parallel.comm import average_gradients
    from project.model import lm_loss

    model = ctx.model()
    lm_loss(model(ctx.batch(0)[0]), ctx.batch(0)[1]).backward()
    saved = [p.grad.clone() for p in model.parameters()]

    def prepare() -> None:   # repeated averaging would halve the values towards denormals
        for p, g in zip(model.parameters(), saved):
            p.grad.copy_(g)
    return Stepper(lambda i: average_gradients(model), prepare)


def pipeline_ours(ctx: Context, mode: str, n_chunk: int) -> Stepper:
    """``build_pipeline_gpt2`` (the student's stages and ``Pipe``) in ``mode``; AdamW; records a timeline.

    In ``pipeline_parallel`` mode the student's ``clock_cycles`` is checked first (``microbatch.check_schedule``):
    a schedule that breaks its contract raises UniformError, one line, before anything is built.

    The timeline of the last step holds the forward task of every (stage,
    micro-batch) with start/end relative to the step's start, plus one
    ``backward`` entry (loss, backward and optimizer step, run by this thread).
    """
    from pipeline.gpt2 import build_pipeline_gpt2
    from project import microbatch
    from project.devices import stage_devices
    from project.model import lm_loss

    if mode == "pipeline_parallel":
        from pipeline import schedule
        microbatch.check_schedule(schedule.clock_cycles, n_chunk, 2)   # what Pipe will walk: one line if broken
    model = ctx.model()
    batch_size = ctx.workload["batches"][0]["input_ids"].shape[0]
    net = build_pipeline_gpt2(model, stage_devices("auto", 2), mode,
                              split_size=microbatch.split_size(batch_size, n_chunk))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    source = microbatch.stage_timeline(net)   # Pipe's workers.timeline, or ModelParallel's own
    last: list = []

    def step(i: int) -> None:
        x, y = ctx.batch(i, rows=False)
        source.clear()
        t0 = time.perf_counter()
        optimizer.zero_grad()
        logits = net(x)
        t1 = time.perf_counter()
        lm_loss(logits, y).backward()
        optimizer.step()
        ctx.sync()
        t2 = time.perf_counter()
        tasks = sorted(source, key=lambda t: (t["stage"], t["start"]))
        per_stage: dict[int, int] = {}
        last[:] = []
        for t in tasks:
            index = per_stage.get(t["stage"], 0)
            per_stage[t["stage"]] = index + 1
            last.append({"stage": t["stage"], "microbatch": index, "start": t["start"] - t0, "end": t["end"] - t0})
        last.append({"stage": "backward", "microbatch": None, "start": t1 - t0, "end": t2 - t0})
    return Stepper(step, close=net.close, timeline=lambda: list(last))


def lora_ours(ctx: Context) -> Stepper:
    """The student's ``apply_lora`` on GPT-2 (after ``conv1d_to_linear``); AdamW on the adapters."""
    from finetune.lora import adapter_parameters
    from project.bench.peers import our_lora_model

    ours = our_lora_model(ctx)
    optimizer = torch.optim.AdamW(list(adapter_parameters(ours).values()), lr=3e-3)
    return Stepper(lambda i: local_step(ours, optimizer, *ctx.batch(i, rows=False)))


# -- the command loop ---------------------------------------------------------------------------------------

def _stepper_factories() -> dict[str, Callable[..., Stepper]]:
    return {"dp_ours": dp_ours, "no_comm": no_comm, "no_comm_sequential": no_comm_sequential,
            "comm_ours": comm_ours, "pipeline_ours": pipeline_ours, "lora_ours": lora_ours,
            "dp_ddp": peers.dp_ddp, "dp_flat": peers.dp_flat, "comm_floor": peers.comm_floor,
            "gpipe": peers.gpipe, "lora_peft": peers.lora_peft}


def run(ctx: Context, key: str, kind: str, indices: list[int], options: dict | None = None) -> dict:
    """Run stepper ``kind`` (built once under ``key``) over batch ``indices``; return its stamps.

    Returns ``{"stamps": [[start, end], ...], "timeline": [...] or None}``. Every step is stamped::

        [barrier]  sync  t0 = perf_counter()  step(i)  sync  t1 = perf_counter()

    (the barrier on multi-rank workers, so the ranks start each step together; ``sync`` waits for a GPU).
    """
    if key not in ctx.steppers:
        ctx.steppers[key] = _stepper_factories()[kind](ctx, **(options or {}))
    stepper = ctx.steppers[key]
    stepper.prepare()
    stamps = []
    for i in indices:
        if ctx.world_size > 1:
            dist.barrier()
        ctx.sync()
        t0 = time.perf_counter()
        stepper.step(i)
        ctx.sync()
        stamps.append([t0, time.perf_counter()])
    return {"stamps": stamps, "timeline": stepper.timeline() if stepper.timeline else None}


def clear(ctx: Context) -> None:
    """Close and drop every cached stepper (frees models and worker threads)."""
    for stepper in ctx.steppers.values():
        stepper.close()
    ctx.steppers.clear()


def build(ctx: Context, spec: dict, path: str) -> dict:
    """Build the workload file (``project.bench.workload.build_workload``) and return its description."""
    from project.bench.workload import WorkloadSpec, build_workload
    from project.output import quiet_libraries

    quiet_libraries()   # no dataset-building progress bars in the benchmark's output
    return build_workload(WorkloadSpec(**spec), Path(path))


def load(ctx: Context, path: str) -> None:
    """Load the workload file every stepper trains on."""
    ctx.workload = load_workload(Path(path))


def serve(env: RankEnv, role: str, folder: str, threads: int, student_setup: bool = True) -> None:
    """A worker's life: join a process group with the student's ``setup_process_group``, then obey ``env.conn``.

    (``student_setup`` False: with ``torch.distributed`` directly, when Problem 1 is not written.)

    Started by ``project.launch.spawn_ranks`` (``project.bench.pool``); the
    device is the runners' choice (``project.devices.join_group``), except that
    ranks without a GPU each share ``cuda:0`` when there is one. ``threads``:
    torch threads (0 keeps torch's default). First reply: ``("ok", {role,
    rank, backend, device, threads})``. Then each message is ``(command,
    kwargs)``; ``None`` ends the loop. Replies are ``("ok", result)`` or
    ``("error", traceback text)``. Commands: ``build`` and ``load`` (the
    workload), ``run`` (see ``run``), ``clear``, and the one-off checks of
    ``project.bench.peers`` (``grads``, ``lora_check``).
    """
    import warnings

    import transformers

    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    backend, device = join_group(env, "auto", student_setup=student_setup, threads=threads, share_gpu=True)
    ctx = Context(role, env.rank, env.world_size, device, Path(folder), {})
    conn = env.conn
    conn.send(("ok", {"role": role, "rank": env.rank, "backend": backend, "device": str(device),
                      "threads": torch.get_num_threads()}))
    commands = {"build": build, "load": load, "run": run, "clear": clear, "grads": peers.grads,
                "lora_check": peers.lora_check}
    while True:
        message = conn.recv()
        if message is None:
            break
        command, kwargs = message
        try:
            conn.send(("ok", commands[command](ctx, **kwargs)))
        except BaseException:   # noqa: BLE001 - reported to the parent, which decides
            conn.send(("error", traceback.format_exc()))
    clear(ctx)
    if dist.is_initialized():
        dist.destroy_process_group()
