"""The measurement plan: build the workload, start the workers, run each group, write the summary.

Each group of variants (data parallel, pipeline, fine-tuning) is warmed up, then timed in repeats that rotate the
variants' order (``_Runner``); every run is logged raw before anything is derived from it (``run``).
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from common.cpus import available_cpus
from project import readiness
from project.bench import SUMMARY_NAME, report
from project.bench.options import Options
from project.bench.pool import BenchError, Pool
from project.bench.publish import new_run_folder, publish
from project.bench.stats import FIRST_REPEAT, RATIO, REPEATS, STEP_TIME, rotation
from project.bench.workload import WorkloadSpec
from project.devices import THREAD_POLICY, gpu_count
from project.output import write_json

GRAD_TOLERANCE = 1e-5   # max abs gradient difference accepted as "the same" (fp32, other summation orders)


# (variant name, worker role, stepper kind, stepper options)
DP_OURS = [("world_size_1", "solo", "dp_ours", {}), ("world_size_2", "pair", "dp_ours", {})]
DP_PEERS = [("ddp", "pair", "dp_ddp", {}), ("flat_allreduce", "pair", "dp_flat", {}),
            ("comm_ours", "pair", "comm_ours", {}), ("comm_floor", "pair", "comm_floor", {}),
            ("capacity_sequential", "solo", "no_comm_sequential", {}), ("capacity_concurrent", "pair", "no_comm", {})]
DP_RATIOS = [
    ("speedup", "world_size_1", "world_size_2", "speedup of world size 2 over 1 (same global batches)"),
    ("ours_over_ddp", "world_size_2", "ddp", "our step time / DistributedDataParallel's (>1: ours slower)"),
    ("ours_over_flat", "world_size_2", "flat_allreduce", "our step time / one-flat-all-reduce step's"),
    ("comm_ours_over_floor", "comm_ours", "comm_floor",
     "average_gradients time / one bare all-reduce of all gradients (communication floor)"),
    ("comm_share_of_step", "comm_ours", "world_size_2", "average_gradients time / whole world-size-2 step"),
    ("parallel_capacity", "capacity_sequential", "capacity_concurrent",
     "two copies of one rank's work one after the other / both at once (2.0 = two free devices)"),
    ("speedup_bound", "world_size_1", "capacity_concurrent",
     "world size 1 / two ranks' work at once without communication: the best DP speedup here"),
    ("efficiency_vs_bound", "capacity_concurrent", "world_size_2",
     "our DP speedup as a fraction of that bound (= bound time / our time; 1.0: communication is free)"),
]


def skipped_parts(opts: Options) -> dict[str, str]:
    """``{group: why}`` for the groups this run would measure whose problems are not written yet.

    ``readiness.BENCH_PARTS``: data_parallel (1.1, 1.2), pipeline (2.1-2.3), with ``--peers`` finetune (3.1).
    """
    parts = {k: v for k, v in readiness.BENCH_PARTS.items() if k != "finetune" or opts.peers}
    return readiness.parts_not_ready(parts)


def _pp_variants(opts: Options) -> tuple[list, list]:
    variants = [("model_parallel", "solo", "pipeline_ours", {"mode": "model_parallel", "n_chunk": 1})]
    ratios = []
    for m in opts.n_chunks:
        variants.append((f"pipeline_parallel_m{m}", "solo", "pipeline_ours", {"mode": "pipeline_parallel",
                                                                              "n_chunk": m}))
        ratios.append((f"speedup_m{m}", "model_parallel", f"pipeline_parallel_m{m}",
                       f"speedup of pipeline_parallel with {m} micro-batches over model_parallel"))
    if opts.peers:
        g = opts.gpipe_chunks
        variants.append((f"gpipe_m{g}", "pair", "gpipe", {"n_chunk": g}))
        ratios.append((f"ours_over_gpipe_m{g}", f"pipeline_parallel_m{g}", f"gpipe_m{g}",
                       f"our Pipe step time / torch ScheduleGPipe's on 2 ranks, {g} micro-batches"))
    return variants, ratios


FT_VARIANTS = [("lora_ours", "solo", "lora_ours", {}), ("lora_peft", "solo", "lora_peft", {})]
FT_RATIOS = [("ours_over_peft", "lora_ours", "lora_peft", "our LoRA step time / PEFT's (>1: ours slower)")]


class _Runner:
    """Runs groups of variants on a pool and appends every run to the raw log (one JSON line each)::

        warm-up:   each variant once, ``warmup`` steps, not timed (logged as repeat 0)
        repeat r:  every variant once, in ``rotation(variants, r - 1)`` order, ``steps`` timed steps each
                   (r = 1 ... repeats: numbered from 1 in the log, the summary, the console and the figures)
    """

    def __init__(self, pool: Pool, opts: Options, tokens_per_run: int, log_path: Path, echo: Callable):
        self.pool, self.opts, self.tokens, self.log_path, self.echo = pool, opts, tokens_per_run, log_path, echo

    def group(self, name: str, variants: list) -> list[dict]:
        opts, records = self.opts, []
        indices = list(range(opts.steps))
        warm = [i % opts.steps for i in range(opts.warmup)]
        by_name = {v[0]: v for v in variants}
        plan = [(-1, [v[0] for v in variants])] if warm else []
        plan += [(r, rotation([v[0] for v in variants], r)) for r in range(opts.repeats)]
        for repeat, order in plan:
            for position, variant in enumerate(order):
                _, role, kind, options = by_name[variant]
                results = self.pool.call(role, "run", key=variant, kind=kind,
                                         indices=warm if repeat < 0 else indices, options=options)
                record = {"group": name, "variant": variant, "repeat": max(repeat + FIRST_REPEAT, 0),
                          "position": position,
                          "warmup": repeat < 0, "role": role, "batch_indices": warm if repeat < 0 else indices,
                          "tokens": self.tokens if repeat >= 0 else None,
                          "ranks": [res["stamps"] for res in results], "timeline": results[0]["timeline"]}
                with self.log_path.open("a") as f:
                    f.write(json.dumps(record) + "\n")
                records.append(record)
            if repeat >= 0:
                self.echo(f"  {name}: repeat {repeat + FIRST_REPEAT}/{opts.repeats} done")
        for role in ("solo", "pair"):
            self.pool.call(role, "clear")
        return records


def _grad_checks(pool: Pool, opts: Options) -> dict:
    """Gradients of ours and the peers on global batch 0, from the same weights, compared (max abs diff)."""
    import torch

    def load(paths: list[str]) -> dict:
        out: dict = {}
        for path in paths:   # the ranks of a pipeline hold different parameters; a tied one gets both parts
            for name, grad in torch.load(path, weights_only=True).items():
                out[name] = out[name] + grad if name in out else grad
        return out

    def diff(a: dict, b: dict) -> float:
        if set(a) != set(b):
            raise BenchError(f"gradient sets differ: {sorted(set(a) ^ set(b))[:5]}")
        return max((a[n] - b[n]).abs().max().item() for n in a)

    g = opts.gpipe_chunks
    # untimed, so the solo and the pair workers run at the same time
    first = pool.call_both({"solo": ("grads", {"variant": "serial"}), "pair": ("grads", {"variant": "dp_ours"})})
    second = pool.call_both({"solo": ("grads", {"variant": "pipe_ours", "n_chunk": g}),
                             "pair": ("grads", {"variant": "dp_ddp"})})
    third = pool.call_both({"solo": ("lora_check", {}), "pair": ("grads", {"variant": "dp_flat"})})
    gpipe_paths = pool.call("pair", "grads", variant="gpipe", n_chunk=g)
    serial, ours = load(first["solo"]), load(second["solo"])
    scale = max(g.abs().max().item() for g in serial.values())
    checks = {}
    for variant, paths in (("dp_ours", first["pair"]), ("dp_ddp", second["pair"]), ("dp_flat", third["pair"])):
        worst = max(diff(load([p]), serial) for p in paths)
        checks[f"{variant}_vs_serial"] = {"max_abs_diff": worst, "reference_max_abs": scale}
    checks[f"pipe_ours_m{g}_vs_serial"] = {"max_abs_diff": diff(ours, serial), "reference_max_abs": scale}
    checks[f"gpipe_m{g}_vs_pipe_ours"] = {"max_abs_diff": diff(load(gpipe_paths), ours), "reference_max_abs": scale}
    lora = third["solo"][0]
    checks["lora_peft_vs_ours_grads"] = {"max_abs_diff": lora["grad_max_abs_diff"],
                                         "reference_max_abs": lora["grad_max_abs"]}
    checks["lora_peft_vs_ours_logits"] = {"max_abs_diff": lora["logits_max_abs_diff"], "reference_max_abs": None}
    for check in checks.values():
        check["ok"] = check["max_abs_diff"] <= GRAD_TOLERANCE
        check["tolerance"] = GRAD_TOLERANCE
    checks["lora_peft_vs_ours_grads"]["trainable_parameters"] = lora["trainable_parameters"]
    return checks


def _hardware(pool: Pool) -> dict:
    import torch

    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")),
                 platform.processor())
    gpus = gpu_count()
    return {"cpu": model, "cpu_count": os.cpu_count(),
            "cpus_usable": available_cpus(),
            "gpus": [torch.cuda.get_device_name(k) for k in range(gpus)], "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__,
            "workers": {role: info for role, info in pool.info.items()}}


def run(opts: Options, echo: Callable[[str], None] = print) -> tuple[dict, int]:
    """Run the whole benchmark; write the raw log, the summary and the figures; return ``(summary, exit code)``.

    Every run is logged as one JSON line in ``<workdir>/perf/<stamp>/runs.jsonl``
    before anything is derived from it; ``performance_summary.json`` holds the
    derived numbers and the path of that log. The summary and the figures are
    written to that folder, then copied to the figures folder (``publish``).
    A group whose problems are not written yet is skipped and named (the
    summary's ``skipped``), so a partial solution still gets the figures its
    finished problems allow.

    Exit code: 0 fine (or thresholds not applicable), 1 a threshold missed
    in grader mode on 2 GPUs, 2 a group could not run (its error is in the
    summary; the other groups are still measured).
    """
    from project.bench import figures

    opts = opts.resolved()
    skipped = skipped_parts(opts)
    t_start, plain = time.perf_counter(), echo
    echo = lambda text: plain(f"[{time.perf_counter() - t_start:6.1f} s] {text}")  # noqa: E731
    folder = new_run_folder(Path(opts.workdir) / "perf")
    log_path = folder / "runs.jsonl"
    echo(f"benchmark ({opts.mode}{', quick' if opts.quick else ''}{', peers' if opts.peers else ''}): "
         f"raw logs in {folder}")
    for part, why in skipped.items():
        echo(f"skipping {part}: {why}")
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    summary = _measure_in_workers(opts, folder, log_path, echo, skipped)
    _measure_memory(summary, opts, folder, echo)
    summary["raw_log"] = str(log_path)
    summary["hardware"]["load_average_before_after"] = [load_before, os.getloadavg() if load_before else None]
    summary["wall_time_s"] = time.perf_counter() - t_start
    if "pipeline" in summary:
        summary["pipeline"]["timeline"] = _timeline(log_path, opts, summary["pipeline"]["variants"])
    gpus = gpu_count()
    summary["thresholds"] = report.judge(summary, opts.dp_threshold, opts.pp_threshold, gpus)
    summary["run_folder"] = str(folder)
    summary["figures"] = figures.draw_all(summary, folder)
    write_json(folder / SUMMARY_NAME, summary, indent=1)
    for line in publish(folder, Path(opts.figures_dir), SUMMARY_NAME, summary["figures"], figures.FIGURE_FILES):
        echo(line)
    return summary, report.exit_code(summary)


def _measure_in_workers(opts: Options, folder: Path, log_path: Path, echo: Callable[[str], None],
                        skipped: dict[str, str]) -> dict:
    """Start the worker pool (solo + pair), build the workload in ``folder`` and load it in both, then
    ``_measure``; returns the summary so far (the pool is closed)."""
    problem1 = "data_parallel" not in skipped   # else no student code joins the groups or splits the data
    spec = WorkloadSpec(opts.preset, opts.batch_size, opts.max_len, opts.steps, opts.seed, workdir=opts.workdir,
                        student_split=problem1)
    echo("starting the worker processes (solo + pair) ...")
    with Pool(folder, opts.threads, opts.timeout_s, student_setup=problem1) as pool:
        echo("building the workload (data, tokenizer, model) ...")
        workload = pool.call("solo", "build", spec=asdict(spec), path=str(folder / "workload.pt"))[0]

        def restart() -> None:
            pool.restart()
            pool.call_both({role: ("load", {"path": str(folder / "workload.pt")}) for role in ("solo", "pair")})
        pool.call_both({role: ("load", {"path": str(folder / "workload.pt")}) for role in ("solo", "pair")})
        return _measure(pool, restart, opts, workload, log_path, echo, skipped)


def _measure_memory(summary: dict, opts: Options, folder: Path, echo: Callable[[str], None]) -> None:
    """Add one step's peak memory with and without activation checkpointing and, with a pipeline group, each
    stage's parameters and saved activations to ``summary`` (fresh processes); a failure goes to its ``errors``."""
    from project.bench import memory

    echo("measuring one step's peak memory with and without activation checkpointing (fresh processes) ...")
    try:
        summary["memory"] = memory.measure(opts.preset, opts.batch_size, opts.max_len, opts.threads, opts.timeout_s)
    except RuntimeError as exc:
        summary["errors"]["memory"] = str(exc)
    if "pipeline" in summary:
        echo("measuring each pipeline stage's parameters and saved activations per micro-batch count ...")
        try:
            summary["pipeline"]["stages"] = memory.pipeline_stages(folder / "workload.pt", opts.n_chunks,
                                                                   opts.threads, opts.timeout_s)
        except RuntimeError as exc:
            summary["errors"]["pipeline_stages"] = str(exc)


def _measure(pool: Pool, restart: Callable[[], None], opts: Options, workload: dict, log_path: Path,
             echo: Callable[[str], None], skipped: dict[str, str]) -> dict:
    """The checks (with peers) and every group not ``skipped``, on a started pool; returns the summary so far."""
    tokens = sum(workload["real_tokens_per_batch"])
    summary: dict = {"schema": "assignment5-benchmark/1", "mode": opts.mode, "quick": opts.quick,
                     "peers": opts.peers, "created": datetime.datetime.now().isoformat(timespec="seconds"),
                     "command": opts.argv, "options": asdict(opts), "errors": {}, "skipped": dict(skipped),
                     "definitions": {"step_time_ms": STEP_TIME, "ratio": RATIO, "repeats": REPEATS}}
    summary["workload"] = {**workload, "tokens_per_run": tokens, "warmup_steps": opts.warmup,
                           "repeats": opts.repeats, "threads_per_worker": opts.threads or "torch default",
                           "thread_policy": THREAD_POLICY,
                           "token_count": "real tokens (attention_mask == 1), padding excluded",
                           "step_time": "max over ranks of each rank's step time; run time = sum over steps"}
    groups = [("data_parallel", DP_OURS + (DP_PEERS if opts.peers else []), DP_RATIOS),
              ("pipeline", *_pp_variants(opts))]
    if opts.peers:
        groups.append(("finetune", FT_VARIANTS, FT_RATIOS))
    groups = [g for g in groups if g[0] not in skipped]
    summary["hardware"] = _hardware(pool)
    if opts.peers and skipped:
        summary["skipped"]["checks"] = "compares every group's gradients; skipped with " + ", ".join(skipped)
    elif opts.peers:
        echo("checking that ours and the peers compute the same gradients ...")
        try:
            summary["checks"] = _grad_checks(pool, opts)
        except BenchError as exc:
            summary["errors"]["checks"] = str(exc)
            restart()
    for name, variants, ratios in groups:
        echo(f"measuring {name}: {', '.join(v[0] for v in variants)}")
        try:
            summary[name] = report.group_summary(_Runner(pool, opts, tokens, log_path, echo).group(name, variants),
                                                 ratios)
        except BenchError as exc:
            summary["errors"][name] = str(exc)
            echo(f"  {name} FAILED: {str(exc).strip().splitlines()[-1]}")
            restart()
    return summary


def _timeline(log_path: Path, opts: Options, variants: dict) -> dict:
    """The Gantt data: the last step of model_parallel's and the largest n_chunk's run whose bubble is the
    variant's ``measured_bubble`` (``report.variant_summary``: the lower median over repeats)."""
    from project.bench import stats

    records = report.read_runs(log_path)   # tolerant: a torn last line (a killed run) is skipped, with a warning
    m = max(opts.n_chunks)
    out = {"stages": 2, "microbatches": m, "theoretical_bubble": stats.theoretical_bubble(m, 2)}
    for variant in ("model_parallel", f"pipeline_parallel_m{m}"):
        if "measured_bubble_repeat" not in variants.get(variant, {}):
            continue
        chosen = next(r for r in records if r["variant"] == variant and not r["warmup"]
                      and r["repeat"] == variants[variant]["measured_bubble_repeat"])
        tasks = chosen["timeline"]
        forward = [t for t in tasks if t["stage"] != "backward"]
        out[variant] = {"repeat": chosen["repeat"], "tasks": tasks,
                        "measured_bubble": stats.measured_bubble(forward, 2)}
    return out
