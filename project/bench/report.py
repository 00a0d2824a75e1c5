"""From raw run records to the summary's numbers, thresholds and the console table (no torch).

A record is one run as the suite logs it (one JSON line in ``runs.jsonl``)::

    {"group": "data_parallel", "variant": "world_size_2", "repeat": 1, "position": 1, "warmup": false,
     "role": "pair", "ranks": [[[start, end], ...], ...], "tokens": 4711, "timeline": [...] | null}

Repeats are numbered as ``stats.REPEATS`` says: from 1, the untimed warm-up run is repeat 0.

``read_runs`` is the one reader of that file; everything else here is pure.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from common.files import read_jsonl
from project.bench import stats


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def read_runs(path: Path, warn: Callable[[str], None] = _warn) -> list[dict]:
    """The records of ``runs.jsonl``; a torn last line (a run killed mid-write) is skipped with ``warn(message)``."""
    records, warnings = read_jsonl(path)
    for message in warnings:
        warn(message)
    return [r for r in records if isinstance(r, dict)]


def variant_summary(records: list[dict]) -> dict:
    """Per-repeat run times (repeat 1 first), the step time, real-token throughput and, for a pipeline, the bubble.

    ``step_time_ms`` is ``stats.step_time_ms`` (median over repeats of run
    time / steps); ``measured_bubble`` is the lower median over repeats of
    each run's timeline bubble, and ``measured_bubble_repeat`` the repeat it
    came from (numbered from 1; the run ``pipeline_timeline.png`` draws).
    """
    runs = sorted((r for r in records if not r["warmup"]), key=lambda r: r["repeat"])
    times = [stats.run_time(r["ranks"]) for r in runs]
    tokens = runs[0]["tokens"]
    steps = len(runs[0]["ranks"][0])
    out = {"role": runs[0]["role"], "ranks": len(runs[0]["ranks"]), "steps_per_run": steps,
           "run_times_s": times, "median_s": stats.median(times), "step_time_ms": stats.step_time_ms(times, steps),
           "tokens_per_run": tokens, "tokens_per_s": [tokens / t for t in times],
           "median_tokens_per_s": stats.median([tokens / t for t in times])}
    timed = [r for r in runs if r.get("timeline")]
    if timed:
        forward = [[t for t in r["timeline"] if t["stage"] != "backward"] for r in timed]
        backward = [next(t for t in r["timeline"] if t["stage"] == "backward") for r in timed]
        stages = 1 + max(t["stage"] for t in forward[0])
        bubbles = [stats.measured_bubble(f, stages) for f in forward]
        out["forward_s_median"] = stats.median([b["start"] for b in backward])
        out["backward_and_step_s_median"] = stats.median([b["end"] - b["start"] for b in backward])
        out["measured_bubble"] = stats.lower_median(bubbles)
        out["measured_bubble_repeat"] = timed[bubbles.index(out["measured_bubble"])]["repeat"]
        out["stages"] = stages
    return out


def ratio(variants: dict, numerator: str, denominator: str, meaning: str) -> dict:
    """``stats.time_ratio`` of two variants: ``value`` = step time(numerator) / step time(denominator), and
    ``per_repeat`` (the spread)."""
    return {"numerator": numerator, "denominator": denominator,
            **stats.time_ratio(variants[numerator]["run_times_s"], variants[denominator]["run_times_s"]),
            "meaning": meaning}


def group_summary(records: list[dict], ratios: list[tuple[str, str, str, str]]) -> dict:
    """``{"variants": {...}, "ratios": {...}}`` of one group; ``ratios`` are ``(key, num, den, meaning)``."""
    names = list(dict.fromkeys(r["variant"] for r in records))
    variants = {name: variant_summary([r for r in records if r["variant"] == name]) for name in names}
    return {"variants": variants,
            "ratios": {key: ratio(variants, num, den, meaning) for key, num, den, meaning in ratios
                       if num in variants and den in variants}}


def judge(summary: dict, dp_threshold: float, pp_threshold: float, gpus: int) -> dict:
    """The threshold verdicts: pass/fail on a machine with 2 GPUs, ``not_applicable`` elsewhere.

    DP: the speedup of world size 2 over 1 (``ratio``: quotient of the step
    times). PP: the best speedup of pipeline_parallel over model_parallel
    among the ``n_chunk`` values tried. A section that failed to run counts as a miss.
    """
    applicable = gpus >= 2
    reason = ("2 GPUs present: thresholds apply" if applicable else
              f"the thresholds are defined for 2 GPUs and this machine has {gpus}; they do not apply here "
              "(numbers are reported, not judged)")
    dp = summary.get("data_parallel", {}).get("ratios", {}).get("speedup", {}).get("value")
    pp_ratios = {k: v["value"] for k, v in summary.get("pipeline", {}).get("ratios", {}).items()
                 if k.startswith("speedup_m")}
    best = max(pp_ratios, key=pp_ratios.get) if pp_ratios else None
    verdicts = {}
    for key, measured, threshold, what in (
            ("dp_speedup", dp, dp_threshold, "step_time_ms(world_size_1) / step_time_ms(world_size_2)"),
            ("pp_speedup", pp_ratios.get(best), pp_threshold,
             f"step_time_ms(model_parallel) / step_time_ms(pipeline_parallel), best n_chunk ({best})")):
        status = "not_applicable" if not applicable else (
            "fail" if measured is None or measured < threshold else "pass")
        verdicts[key] = {"threshold": threshold, "measured": measured, "status": status, "definition": what}
    return {"applicable": applicable, "reason": reason, "gpus": gpus, **verdicts}


def exit_code(summary: dict) -> int:
    """2 when a part could not run, 1 when grader mode missed an applicable threshold, else 0."""
    if summary.get("errors"):
        return 2
    th = summary.get("thresholds", {})
    missed = summary.get("mode") == "grader" and th.get("applicable") and any(
        th[k]["status"] == "fail" for k in ("dp_speedup", "pp_speedup"))
    return 1 if missed else 0


def ms(value: float) -> str:
    """How a ``step_time_ms`` is printed and drawn: ``116.6``."""
    return f"{value:.1f}"


def times(value: float) -> str:
    """How a ratio of step times is printed and drawn: ``0.71x``."""
    return f"{value:.2f}x"


def fraction(value: float) -> str:
    """How a bubble (an idle fraction) is printed and drawn: ``0.42``."""
    return f"{value:.2f}"


def statistic(summary: dict) -> str:
    """Two lines saying what ``step_time_ms`` and a ratio are in this run (the console, the figures): the words of
    ``stats.STEP_TIME`` and ``stats.RATIO``, with this run's repeats and steps."""
    w = summary["workload"]
    return (stats.STEP_TIME.replace("repeats", f"{w['repeats']} repeats").replace("/ steps", f"/ {w['steps']} steps")
            + "\n" + stats.RATIO)


def spread(ratio: dict) -> str:
    """How a ratio's per-repeat values are printed, labelled so nobody takes them for the ratio itself."""
    return (f"per-repeat ratios (spread, repeat {stats.FIRST_REPEAT} first): "
            + ", ".join(f"{x:.2f}" for x in ratio["per_repeat"]))


def mib(value: float) -> str:
    """How a byte count is printed in MiB: ``28.07 MiB``."""
    return f"{value / 2**20:,.2f} MiB"


def stage_lines(stages: dict) -> list[str]:
    """The console lines of ``pipeline.stages`` (``memory.pipeline_stages``): parameters per stage, then per
    variant (micro-batch count) the activation bytes each stage keeps for the backward pass."""
    counts = stages["parameters_per_stage"]
    lines = [f"  parameters_per_stage {', '.join(f'{n:,}' for n in counts)} (stage 0 first; sum {sum(counts):,})",
             f"  activations_saved_bytes per stage: {stages['measure']}"]
    for name, saved in stages["activations_saved_bytes"].items():
        lines.append(f"    {name:<26} {stages['micro_batches'][name]:>2} micro-batch(es): "
                     + ", ".join(f"stage {j} {mib(b)}" for j, b in enumerate(saved)))
    return lines


def table(summary: dict) -> str:
    """The console report: the parameters, per group each variant's step time and each ratio, the
    thresholds, the checks and any errors; every name is the summary's key for that number."""
    lines = [f"parameters {summary['workload']['parameters']:,} ({summary['workload']['preset']} GPT-2)"]
    if any(group in summary for group in ("data_parallel", "pipeline", "finetune")):
        lines.append(statistic(summary))
    for group in ("data_parallel", "pipeline", "finetune"):
        if group not in summary:
            continue
        lines.append(f"{group}:")
        for name, v in summary[group]["variants"].items():
            extra = (f"  measured_bubble {fraction(v['measured_bubble'])} (repeat {v['measured_bubble_repeat']})"
                     if "measured_bubble" in v else "")
            lines.append(f"  {name:<28} step_time_ms {ms(v['step_time_ms']):>8}  "
                         f"{v['median_tokens_per_s']:>10,.0f} tokens/s{extra}")
        for key, r in summary[group]["ratios"].items():
            lines.append(f"  {key:<28} {times(r['value']):>7}  (step_time_ms {r['numerator']} / "
                         f"{r['denominator']}; {spread(r)})")
        if group == "pipeline" and "timeline" in summary["pipeline"]:
            tl = summary["pipeline"]["timeline"]
            lines.append(f"  theoretical_bubble {fraction(tl['theoretical_bubble'])} ((K-1)/(M+K-1), K = "
                         f"{tl['stages']}, M = {tl['microbatches']})")
        if group == "pipeline" and "stages" in summary["pipeline"]:
            lines += stage_lines(summary["pipeline"]["stages"])
    if "memory" in summary:
        mem = summary["memory"]
        plain, ckpt = (mem[v]["peak_step_bytes"] / 2**20 for v in ("plain", "grad_ckpt"))
        lines.append(f"activation checkpointing ({mem['plain']['measure']}): one step's peak {plain:,.1f} MiB -> "
                     f"{ckpt:,.1f} MiB ({mem['ratio_peak']:.2f}x less); saved for backward "
                     f"{mem['ratio_saved']:.2f}x less")
    for name, check in summary.get("checks", {}).items():
        lines.append(f"check {name}: max abs diff {check['max_abs_diff']:.2e} (ok: {check['ok']})")
    th = summary.get("thresholds", {})
    for key in ("dp_speedup", "pp_speedup"):
        if key in th:
            m = th[key]["measured"]
            lines.append(f"threshold {key}: {'-' if m is None else f'{m:.2f}x'} vs {th[key]['threshold']}x -> "
                         f"{th[key]['status']}")
    if th and not th["applicable"]:
        lines.append(f"  ({th['reason']})")
    for section, error in summary.get("errors", {}).items():
        lines.append(f"ERROR in {section}: {error.strip().splitlines()[-1] if error.strip() else error}")
    return "\n".join(lines)
