"""The PNG plots of ``submit_figures/``, drawn from the summary alone (so they can be redrawn from it).

- ``data_parallel.png``: time per step and real tokens/s, world size 1 vs 2 (and the peers);
- ``pipeline.png``: the same for model_parallel vs pipeline_parallel at each n_chunk (and GPipe);
- ``pipeline_timeline.png``: Gantt of stage x micro-batch of one step, measured bubble beside (K-1)/(M+K-1);
- ``peers.png`` (with ``--peers``): each reference's time relative to ours, and the machine's capacity.

Bars are medians over repeats; the dots are the single repeats.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from project.bench.stats import median  # noqa: E402

COLORS = {"baseline": "#9e9e9e", "ours": "#1f77b4", "peer": "#ff7f0e", "bound": "#2ca02c"}
DP_SHOWN = [("world_size_1", "world size 1", "baseline"), ("world_size_2", "world size 2\n(ours)", "ours"),
            ("ddp", "DDP", "peer"), ("flat_allreduce", "one flat\nall-reduce", "peer"),
            ("capacity_concurrent", "2 ranks,\nno comm", "bound")]


def _bars(ax, rows: list[tuple[str, dict, str]], key: str, scale: float, ylabel: str) -> None:
    for x, (label, v, kind) in enumerate(rows):
        values = [scale * t for t in v[key]]
        ax.bar(x, median(values), color=COLORS[kind], alpha=0.85)
        ax.scatter([x] * len(values), values, color="black", s=10, zorder=3)
    ax.set_xticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)


def _pair_plot(rows: list[tuple[str, dict, str]], title: str, path: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    steps = rows[0][1]["steps_per_run"]
    _bars(left, rows, "run_times_s", 1000 / steps, "time per training step (ms)")
    left.set_title("time per step (lower is better); bar: median, dots: repeats", fontsize=10)
    _bars(right, rows, "tokens_per_s", 1.0, "real tokens / s (padding excluded)")
    right.set_title("throughput (higher is better); bar: median, dots: repeats", fontsize=10)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _threshold_note(summary: dict, key: str) -> str:
    th = summary.get("thresholds", {}).get(key)
    if not th:
        return ""
    if th["status"] == "not_applicable":
        return f"threshold {th['threshold']}x (2 GPUs): not applicable here"
    return f"threshold {th['threshold']}x: {th['status'].upper()}"


def draw_data_parallel(summary: dict, path: Path) -> None:
    """``data_parallel.png``: step time and tokens/s of world size 1 vs 2 (and the peers), with the speedup."""
    dp = summary["data_parallel"]
    rows = [(label, dp["variants"][name], kind) for name, label, kind in DP_SHOWN if name in dp["variants"]]
    r = dp["ratios"]["speedup"]
    w = summary["workload"]
    _pair_plot(rows, f"Data parallel, {w['preset']} GPT-2, global batch {w['batch_size']}: speedup "
                     f"{r['median']:.2f}x (median of {len(r['paired'])} paired repeats); "
                     f"{_threshold_note(summary, 'dp_speedup')}", path)


def draw_pipeline(summary: dict, path: Path) -> None:
    """``pipeline.png``: step time and tokens/s of model_parallel vs pipeline_parallel per n_chunk (and GPipe)."""
    pp = summary["pipeline"]
    rows = []
    for name, v in pp["variants"].items():
        if name == "model_parallel":
            rows.append(("model\nparallel", v, "baseline"))
        elif name.startswith("pipeline_parallel_m"):
            m = name.rsplit("m", 1)[1]
            rows.append((f"pipeline\nn_chunk={m}\n{pp['ratios'][f'speedup_m{m}']['median']:.2f}x", v, "ours"))
        else:
            rows.append((f"torch GPipe\n2 ranks, {name.rsplit('m', 1)[1]} mb", v, "peer"))
    best = summary.get("thresholds", {}).get("pp_speedup", {}).get("measured")
    best_text = f"best speedup {best:.2f}x" if best is not None else "no speedup measured"
    _pair_plot(rows, f"Pipeline (2 stages): {best_text} over model parallel (median of paired repeats); "
                     f"{_threshold_note(summary, 'pp_speedup')}", path)


def draw_timeline(summary: dict, path: Path) -> None:
    """``pipeline_timeline.png``: a Gantt chart of one step per mode, measured bubble next to (K-1)/(M+K-1)."""
    tl = summary["pipeline"]["timeline"]
    panels = [v for v in ("model_parallel", f"pipeline_parallel_m{tl['microbatches']}") if v in tl]
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 2.4 * len(panels) + 0.6), squeeze=False)
    cmap = plt.get_cmap("tab10")
    for ax, variant in zip(axes[:, 0], panels):
        data = tl[variant]
        m = 1 if variant == "model_parallel" else tl["microbatches"]
        lanes = ["stage 0", "stage 1", "loss + backward\n+ optimizer"]
        for t in data["tasks"]:
            lane = 2 if t["stage"] == "backward" else t["stage"]
            start, width = 1000 * t["start"], 1000 * (t["end"] - t["start"])
            color = "#bdbdbd" if lane == 2 else cmap(t["microbatch"] % 10)
            ax.barh(lane, width, left=start, height=0.6, color=color, edgecolor="black", linewidth=0.4)
            if lane < 2:
                ax.text(start + width / 2, lane, f"F{t['microbatch']}", ha="center", va="center", fontsize=7)
        ax.set_yticks(range(3), lanes, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("ms since the step started")
        ax.grid(axis="x", alpha=0.3)
        theory = (tl["stages"] - 1) / (m + tl["stages"] - 1)
        name = "model_parallel (whole batch)" if m == 1 else f"pipeline_parallel, M = {m} micro-batches"
        ax.set_title(f"{name}: forward bubble measured {data['measured_bubble']:.2f}, "
                     f"theory (K-1)/(M+K-1) = {theory:.2f} (K = {tl['stages']})", fontsize=9)
    on_gpu = bool(summary["hardware"]["gpus"])
    fig.suptitle("One training step (median run): forward tasks per stage worker; backward runs after the forward"
                 + (" (GPU: host-side stamps, kernels may run later)" if on_gpu else
                    " in the main thread on CPU"), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


PEER_LABELS = {"ours_over_ddp": "DP step: ours / DistributedDataParallel",
               "ours_over_flat": "DP step: ours / one flat all-reduce",
               "comm_ours_over_floor": "DP comm: average_gradients / bare all-reduce",
               "ours_over_peft": "LoRA step: ours / PEFT"}


def draw_peers(summary: dict, path: Path) -> None:
    """``peers.png``: each reference's time relative to ours (log scale), with the machine's parallel capacity."""
    rows = []
    for group in ("data_parallel", "pipeline", "finetune"):
        for key, r in summary.get(group, {}).get("ratios", {}).items():
            if key in PEER_LABELS:
                rows.append((PEER_LABELS[key], r))
            elif key.startswith("ours_over_gpipe_m"):
                rows.append((f"PP step: our Pipe / torch ScheduleGPipe ({key.rsplit('m', 1)[1]} micro-batches)", r))
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(rows) + 2.0))
    for y, (label, r) in enumerate(rows):
        ax.barh(y, r["median"] - 1.0, left=1.0, color=COLORS["ours"], alpha=0.85)   # from 1: faster or slower
        ax.scatter(r["paired"], [y] * len(r["paired"]), color="black", s=10, zorder=3)
        ax.text(max([r["median"], *r["paired"]]) * 1.08, y, f"{r['median']:.2f}x", va="center", fontsize=8)
    ax.set_xscale("log")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("our time / reference time, log scale (1 = same; > 1: ours slower); dots: paired repeats")
    ratios = summary.get("data_parallel", {}).get("ratios", {})
    title = "Ours vs reference implementations on the same workload (medians of paired repeats)"
    if {"parallel_capacity", "speedup_bound", "efficiency_vs_bound"} <= set(ratios):
        title += (f"\nmachine's parallel capacity: {ratios['parallel_capacity']['median']:.2f} of 2.0 "
                  f"(two copies of one rank's work: sequential time / concurrent time)\nbest DP speedup "
                  f"without communication {ratios['speedup_bound']['median']:.2f}x; ours "
                  f"{ratios['speedup']['median']:.2f}x = {ratios['efficiency_vs_bound']['median']:.2f} of that bound")
    fig.suptitle(title, fontsize=9)
    ax.margins(x=0.25)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw_all(summary: dict, out: Path) -> list[str]:
    """Draw every figure whose data is in ``summary`` into ``out``; return the file names written."""
    written = []
    for name, needs, draw in (("data_parallel.png", "data_parallel", draw_data_parallel),
                              ("pipeline.png", "pipeline", draw_pipeline),
                              ("pipeline_timeline.png", "pipeline", draw_timeline),
                              ("peers.png", "data_parallel" if summary.get("peers") else None, draw_peers)):
        target = Path(out) / name
        if needs and needs in summary:
            draw(summary, target)
            written.append(name)
        else:
            target.unlink(missing_ok=True)   # never leave a stale figure from an earlier run
    return written
