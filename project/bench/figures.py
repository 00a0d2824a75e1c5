"""The PNG plots of ``submit_figures/``, drawn from the summary alone (so they can be redrawn from it).

Every number drawn is the summary's own, formatted as the console prints it (``report.ms``, ``report.times``,
``report.fraction``): a bar is a variant's ``step_time_ms``, the dots its single repeats; a ratio is the ratio's
``value`` (the quotient of two step times, ``stats.RATIO``), its dots the ``per_repeat`` spread; a repeat is named by
its number (from 1, ``stats.REPEATS``). One ``draw_*`` per figure.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from project.bench.report import fraction, ms, statistic, times  # noqa: E402

COLORS = {"baseline": "#9e9e9e", "ours": "#1f77b4", "peer": "#ff7f0e", "bound": "#2ca02c"}
DP_SHOWN = [("world_size_1", "world size 1", "baseline"), ("world_size_2", "world size 2\n(ours)", "ours"),
            ("ddp", "DDP", "peer"), ("flat_allreduce", "one flat\nall-reduce", "peer"),
            ("capacity_concurrent", "2 ranks,\nno comm", "bound")]


def _bars(ax, rows: list[tuple[str, dict, str]], bar, dots, ylabel: str, unit: str = "") -> None:
    """One bar (``bar(v)``) and its dots (``dots(v)``) per row; with ``unit``, the bar's value under its label."""
    for x, (label, v, kind) in enumerate(rows):
        ax.bar(x, bar(v), color=COLORS[kind], alpha=0.85)
        ax.scatter([x] * len(dots(v)), dots(v), color="black", s=10, zorder=3)
    labels = [f"{label}\n{ms(bar(v))} {unit}" if unit else label for label, v, _ in rows]
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)


def _pair_plot(rows: list[tuple[str, dict, str]], title: str, summary: dict, path: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    _bars(left, rows, lambda v: v["step_time_ms"],
          lambda v: [1000 * t / v["steps_per_run"] for t in v["run_times_s"]],
          "step_time_ms (ms per training step)", "ms")
    left.set_title("step_time_ms (lower is better); bar: median, dots: repeats", fontsize=10)
    _bars(right, rows, lambda v: v["median_tokens_per_s"], lambda v: v["tokens_per_s"],
          "real tokens / s (padding excluded)")
    right.set_title("throughput (higher is better); bar: median, dots: repeats", fontsize=10)
    fig.suptitle(f"{title}\n{statistic(summary)}", fontsize=10)
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
    _pair_plot(rows, f"Data parallel, {w['preset']} GPT-2 ({w['parameters']:,} parameters), global batch "
                     f"{w['batch_size']}: speedup {times(r['value'])} (step_time_ms world_size_1 / world_size_2)\n"
                     f"{_threshold_note(summary, 'dp_speedup')}", summary, path)


def draw_pipeline(summary: dict, path: Path) -> None:
    """``pipeline.png``: step time and tokens/s of model_parallel vs pipeline_parallel per n_chunk (and GPipe)."""
    pp = summary["pipeline"]
    rows = []
    for name, v in pp["variants"].items():
        if name == "model_parallel":
            rows.append(("model\nparallel", v, "baseline"))
        elif name.startswith("pipeline_parallel_m"):
            m = name.rsplit("m", 1)[1]
            rows.append((f"pipeline\nn_chunk={m}\nspeedup_m{m} {times(pp['ratios'][f'speedup_m{m}']['value'])}",
                         v, "ours"))
        else:
            rows.append((f"torch GPipe\n2 ranks, {name.rsplit('m', 1)[1]} mb", v, "peer"))
    best = summary.get("thresholds", {}).get("pp_speedup", {}).get("measured")
    best_text = f"best speedup {times(best)}" if best is not None else "no speedup measured"
    _pair_plot(rows, f"Pipeline (2 stages): {best_text} over model parallel; "
                     f"{_threshold_note(summary, 'pp_speedup')}", summary, path)


def draw_timeline(summary: dict, path: Path) -> None:
    """``pipeline_timeline.png``: a Gantt chart of one step per mode, its ``measured_bubble`` next to (K-1)/(M+K-1).

    The step drawn is the last of the run whose bubble is the variant's ``measured_bubble`` (``report``)."""
    tl = summary["pipeline"]["timeline"]
    panels = [v for v in ("model_parallel", f"pipeline_parallel_m{tl['microbatches']}") if v in tl]
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 2.4 * len(panels) + 0.6), squeeze=False)
    cmap = plt.get_cmap("tab10")
    labels = []
    for ax, variant in zip(axes[:, 0], panels):
        data, runs = tl[variant], summary["pipeline"]["variants"][variant]["run_times_s"]
        m = 1 if variant == "model_parallel" else tl["microbatches"]
        lanes = ["stage 0", "stage 1", "loss + backward\n+ optimizer"]
        for t in data["tasks"]:
            lane = 2 if t["stage"] == "backward" else t["stage"]
            start, width = 1000 * t["start"], 1000 * (t["end"] - t["start"])
            color = "#bdbdbd" if lane == 2 else cmap(t["microbatch"] % 10)
            ax.barh(lane, width, left=start, height=0.6, color=color, edgecolor="black", linewidth=0.4)
            if lane < 2:
                labels.append((ax, start, width, ax.text(start + width / 2, lane, f"F{t['microbatch']}",
                                                         ha="center", va="center", fontsize=7)))
        ax.set_yticks(range(3), lanes, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("ms since the step started")
        ax.grid(axis="x", alpha=0.3)
        theory = (tl["stages"] - 1) / (m + tl["stages"] - 1)
        name = "model_parallel (whole batch)" if m == 1 else f"pipeline_parallel, M = {m} micro-batches"
        bubble = summary["pipeline"]["variants"][variant]["measured_bubble"]
        ax.set_title(f"{name}: measured_bubble {fraction(bubble)} (lower median of {len(runs)} repeats: repeat "
                     f"{data['repeat']}, drawn), theory (K-1)/(M+K-1) = {fraction(theory)} (K = {tl['stages']})",
                     fontsize=9)
    on_gpu = bool(summary["hardware"]["gpus"])
    fig.suptitle("One training step: forward tasks per stage worker; backward runs after the forward"
                 + (" (GPU: host-side stamps, kernels may run later)" if on_gpu else
                    " in the main thread on CPU"), fontsize=9)
    fig.tight_layout()
    _fit_labels(fig, labels)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fit_labels(fig, labels: list, smallest: float = 5.0) -> None:
    """Keep each bar's label (``(ax, start, width, text)``) inside its bar: a smaller font where that is enough
    (down to ``smallest`` points), else no label. Run once the layout is final."""
    renderer = fig.canvas.get_renderer()
    for ax, start, width, text in labels:
        left, right = ax.transData.transform([(start, 0.0), (start + width, 0.0)])[:, 0]
        room = abs(right - left) - 2.0            # pixels, a pixel of margin each side
        size = text.get_fontsize()
        while text.get_window_extent(renderer).width > room and size > smallest:
            size = max(smallest, size - 0.5)
            text.set_fontsize(size)
        if text.get_window_extent(renderer).width > room:
            text.set_visible(False)


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
        ax.barh(y, r["value"] - 1.0, left=1.0, color=COLORS["ours"], alpha=0.85)   # from 1: faster or slower
        ax.scatter(r["per_repeat"], [y] * len(r["per_repeat"]), color="black", s=10, zorder=3)
        ax.text(max([r["value"], *r["per_repeat"]]) * 1.08, y, times(r["value"]), va="center", fontsize=8)
    ax.set_xscale("log")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("our step_time_ms / the reference's, log scale (1 = same; > 1: ours slower); "
                  "dots: per-repeat ratios (spread)")
    ratios = summary.get("data_parallel", {}).get("ratios", {})
    title = f"Ours vs reference implementations on the same workload\n{statistic(summary)}"
    if {"parallel_capacity", "speedup_bound", "efficiency_vs_bound"} <= set(ratios):
        title += (f"\nmachine's parallel capacity: {ratios['parallel_capacity']['value']:.2f} of 2.0 "
                  f"(two copies of one rank's work: sequential time / concurrent time)\nbest DP speedup "
                  f"without communication {ratios['speedup_bound']['value']:.2f}x; ours "
                  f"{times(ratios['speedup']['value'])} = {ratios['efficiency_vs_bound']['value']:.2f} of that bound")
    fig.suptitle(title, fontsize=9)
    ax.margins(x=0.25)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


FIGURE_FILES = ("data_parallel.png", "pipeline.png", "pipeline_timeline.png", "peers.png")


def draw_all(summary: dict, out: Path) -> list[str]:
    """Draw every figure (of ``FIGURE_FILES``) whose data is in ``summary`` into ``out``; return the names written."""
    written = []
    for name, needs, draw in zip(FIGURE_FILES, ("data_parallel", "pipeline", "pipeline",
                                                "data_parallel" if summary.get("peers") else None),
                                 (draw_data_parallel, draw_pipeline, draw_timeline, draw_peers)):
        target = Path(out) / name
        if needs and needs in summary:
            draw(summary, target)
            written.append(name)
        else:
            target.unlink(missing_ok=True)   # never leave a stale figure from an earlier run
    return written
