"""Problem 4 next to its peers: BucketedDDP vs torch DDP vs Problem 1's average_gradients; ZeRO-1 memory.

    python scripts/run_benchmarks.py --peers     # adds the "ddp_zero" group to performance_summary.json

Two rank processes of their own (``run``) train the benchmark's workload with every variant (``VARIANTS``) in an
order rotated per repeat, timed as ``stats`` says; then each rank measures the optimizer state it holds after one
step (``_zero_memory``), next to the formula 12P/N.
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

from common.startup import GPT2_IMPORTS
from project.bench import stats
from project.bench.context import Context, local_step
from project.bench.workload import load_workload
from project.devices import RankEnv, join_group
from project.launch import file_rendezvous, spawn_ranks
from project.model import lm_loss
from project.output import quiet_libraries, write_json

VARIANTS = ("bucketed_ddp", "ddp", "average_gradients")
RATIOS = [("bucketed_over_ddp", "bucketed_ddp", "ddp", "BucketedDDP step time / torch DDP's (>1: ours slower)"),
          ("average_gradients_over_ddp", "average_gradients", "ddp",
           "Problem 1 average_gradients step time / torch DDP's"),
          ("bucketed_over_average_gradients", "bucketed_ddp", "average_gradients",
           "BucketedDDP step time / average_gradients' (<1: bucketing and overlap pay off)")]
BUCKET_MB = 25.0


def _stepper(ctx: Context, variant: str) -> Callable[[int], None]:
    """One training step of ``variant`` on this rank's rows of global batch ``i``, with AdamW::

        bucketed_ddp       the student's BucketedDDP + finish_gradient_synchronization
        ddp                torch.nn.parallel.DistributedDataParallel
        average_gradients  backward, then Problem 1's average_gradients (one all-reduce per parameter)
    """
    model = ctx.model()
    if variant == "bucketed_ddp":
        from data_parallel.ddp import BucketedDDP

        wrapper = BucketedDDP(model, bucket_mb=BUCKET_MB)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step(i: int) -> None:
            optimizer.zero_grad()
            x, y = ctx.batch(i)
            lm_loss(wrapper(x), y).backward()
            wrapper.finish_gradient_synchronization()
            optimizer.step()
        return step
    if variant == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        net = DistributedDataParallel(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
        optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
        return lambda i: local_step(net, optimizer, *ctx.batch(i))
    from data_parallel.comm import average_gradients

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return lambda i: local_step(model, optimizer, *ctx.batch(i), between=lambda: average_gradients(model))


def _held_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor) and t.dim() >= 1)


def _zero_memory(ctx: Context) -> dict:
    """Optimizer-state bytes this rank holds after one step: the student's ShardedOptimizer(Adam) (fp32 master shard
    + moments) and DeepSpeed ZeRO-1 and -2 (fp32 partitions + moments), next to the formula 12P/N."""
    from data_parallel.zero1 import ShardedOptimizer
    from finetune.zero import init_engine

    x, y = ctx.batch(0)
    model = ctx.model()
    numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
    ours = ShardedOptimizer(model.parameters(), torch.optim.Adam, lr=1e-3)
    lm_loss(model(x), y).backward()
    ours.step()
    out = {"parameters": numel, "world_size": ctx.world_size,
           "formula_12P_over_N": 12 * math.ceil(numel / ctx.world_size), "replicated_adam_12P": 12 * numel,
           "sharded_optimizer": ours.state_bytes()}
    micro = x.shape[0]
    for stage in (1, 2):
        model = ctx.model()
        config = {"train_batch_size": micro * ctx.world_size, "train_micro_batch_size_per_gpu": micro,
                  "gradient_accumulation_steps": 1, "gradient_clipping": 0.0, "zero_allow_untested_optimizer": True,
                  "zero_optimization": {"stage": stage}, "steps_per_print": 10 ** 9}
        engine = init_engine(model, torch.optim.Adam(model.parameters(), lr=1e-3), config)
        loss = lm_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        inner = engine.optimizer
        masters = list(getattr(inner, "single_partition_of_fp32_groups", []))
        state = [v for s in inner.optimizer.state.values() for v in s.values()]
        out[f"deepspeed_zero{stage}"] = _held_bytes([*masters, *state])
    return out


def _rank(env: RankEnv, workload_path: str, plan: list, steps: int, warmup: int) -> dict:
    """One rank: join the group, build the variants, obey ``plan`` (order per repeat); return stamps and memory."""
    import warnings

    quiet_libraries()
    warnings.filterwarnings("ignore")     # torch's deprecation notes from inside DeepSpeed, once per rank
    backend, device = join_group(env, "auto", student_setup=False)
    ctx = Context("pair", env.rank, env.world_size, device, Path(workload_path).parent,
                  load_workload(Path(workload_path)))
    steppers = {variant: _stepper(ctx, variant) for variant in VARIANTS}
    for variant in VARIANTS:
        for i in range(warmup):
            steppers[variant](i % steps)
    runs = []
    for repeat, order in enumerate(plan):
        for variant in order:
            stamps = []
            for i in range(steps):
                dist.barrier()
                ctx.sync()
                t0 = time.perf_counter()
                steppers[variant](i)
                ctx.sync()
                stamps.append([t0, time.perf_counter()])
            runs.append({"repeat": repeat, "variant": variant, "stamps": stamps})
    memory = _zero_memory(ctx)
    dist.barrier()
    dist.destroy_process_group()
    return {"runs": runs, "memory": memory, "backend": backend}


def run(workload_path: Path, steps: int, warmup: int, repeats: int, timeout_s: float = 600.0) -> dict:
    """Measure the Problem 4 group on 2 fresh rank processes; return its summary (JSON-ready).

    ``{"variants": {name: {"run_times_s": [...], "step_time_ms": t}}, "ratios": {name: {"value": v,
    "per_repeat": [...], "what": ...}}, "memory_bytes": {...}, "backend": ...}`` (``stats.time_ratio``). Raises
    RuntimeError (``RankError``) with a rank's traceback when a rank fails or gives no answer within ``timeout_s``.
    """
    plan = [stats.rotation(list(VARIANTS), r) for r in range(repeats)]
    ranks = spawn_ranks(_rank, 2, file_rendezvous(Path(workload_path).parent, "store_ddp_zero"),
                        (str(workload_path), plan, steps, warmup), name="ddp_zero",
                        preload=GPT2_IMPORTS)
    return summarize(ranks.wait(timeout_s))


def summarize(replies: list[dict]) -> dict:
    """Run times per variant and repeat (slowest rank per step), ``step_time_ms`` and ratios (``stats``), memory."""
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    steps = len(replies[0]["runs"][0]["stamps"])
    for k, record in enumerate(replies[0]["runs"]):
        ranks = [reply["runs"][k]["stamps"] for reply in replies]
        times[record["variant"]].append(stats.run_time(ranks))
    ratios = {name: {**stats.time_ratio(times[a], times[b]), "what": what} for name, a, b, what in RATIOS}
    variants = {v: {"run_times_s": t, "step_time_ms": stats.step_time_ms(t, steps)} for v, t in times.items()}
    return {"variants": variants, "ratios": ratios, "memory_bytes": [reply["memory"] for reply in replies],
            "backend": replies[0]["backend"], "bucket_mb": BUCKET_MB}


def table(summary: dict) -> str:
    """The group's lines for the terminal: each variant's step time, the ratios, then bytes per rank next to 12P/N."""
    from project.bench.report import ms, spread, times
    from project.bench.stats import RATIO, STEP_TIME

    lines = [f"Problem 4 (2 ranks; {STEP_TIME}; {RATIO})"]
    for name, v in summary["variants"].items():
        lines.append(f"  {name:34s} step_time_ms {ms(v['step_time_ms']):>8}")
    for name, ratio in summary["ratios"].items():
        lines.append(f"  {name:34s} {times(ratio['value']):>7}   {ratio['what']} ({spread(ratio)})")
    lines.append("  optimizer state per rank (bytes): rank  ShardedOptimizer  DeepSpeed ZeRO-1  ZeRO-2  12P/N  12P")
    for rank, m in enumerate(summary["memory_bytes"]):
        lines.append(f"  {'':33s} {rank:4d}  {m['sharded_optimizer']:16,d}  {m['deepspeed_zero1']:16,d}  "
                     f"{m['deepspeed_zero2']:,d}  {m['formula_12P_over_N']:,d}  {m['replicated_adam_12P']:,d}")
    return "\n".join(lines)


def extend_summary(summary: dict, opts, figures_dir: Path) -> str:
    """Run the group after ``suite.run`` (``--peers``), add it to ``summary`` and rewrite the summary files.

    Uses the workload and raw-log folder of that run and its resolved
    ``steps``/``warmup``/``repeats``/``timeout_s``. Problem 4 is optional: a
    failure (e.g. an unfinished BucketedDDP) lands in ``summary["errors"]
    ["ddp_zero"]`` and the returned text says so; nothing is raised.
    Returns the lines to print.
    """
    from project.bench import SUMMARY_NAME

    folder = Path(summary["raw_log"]).parent
    try:
        summary["ddp_zero"] = run(folder / "workload.pt", opts.steps, opts.warmup, opts.repeats, opts.timeout_s)
        text = table(summary["ddp_zero"])
    except RuntimeError as exc:
        summary.setdefault("errors", {})["ddp_zero"] = str(exc)
        text = f"Problem 4 group not measured: {str(exc).strip().splitlines()[-1]}"
    for target in (Path(figures_dir) / SUMMARY_NAME, folder / SUMMARY_NAME):
        write_json(target, summary, indent=1)
    return text
