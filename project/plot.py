"""Plot what the entry points wrote: throughput per configuration and the pipeline timeline.

    python project/plot.py                 # reads <workdir>/out, writes <workdir>/out/plots/*.png

- ``throughput.png``: real tokens per second (median over epochs; over steps for a run stopped by ``--max_steps`` or
  killed) of every run folder with metrics under ``out/data_parallel/`` and ``out/pipeline/``;
- ``pipeline_timeline.png``: one recorded training step per pipeline run, a bar per stage task (forward passes
  only: backward runs in autograd's own threads);
- ``training_curves.png``: loss and gradient norm per optimizer step of every run with a ``metrics.jsonl``,
  finished or not, the steps the divergence guard refused marked.

For the graded figures and ``performance_summary.json`` use ``scripts/run_benchmarks.py``; this script only draws
your own runs.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

if __package__ in (None, ""):  # run as `python project/plot.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.files import read_json
from project.cli import ConfigError, run_cli
from project.output import GUARD_EVENT, METRICS_FILE, read_steps
from project.options import new_parser


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def collect(out: Path, warn: Callable[[str], None] = _warn) -> dict[str, dict]:
    """``{label: metrics}`` for every run folder under ``out``: ``DP <run>`` for ``data_parallel/<run>/summary.json``,
    ``<run>`` for ``pipeline/<run>/metrics_<mode>.json``.

    A run whose per-epoch file is missing, unreadable or has no finished
    epoch (stopped by ``--max_steps`` or killed) is read from its
    ``metrics.jsonl`` instead: its throughput is the median over its steps.
    """
    places = {f"DP {p.name}": (p, p / "summary.json") for p in sorted(out.glob("data_parallel/*")) if p.is_dir()}
    for folder in sorted(p for p in out.glob("pipeline/*") if p.is_dir()):
        files = sorted(folder.glob("metrics_*_parallel.json"))
        places[folder.name] = (folder, files[0] if files else folder / "metrics_pipeline_parallel.json")
    runs = {}
    for label, (folder, path) in places.items():
        data, problem = read_json(path) if path.exists() else (None, None)
        if problem:
            warn(problem)
        if isinstance(data, dict) and data.get("epochs"):
            runs[label] = data | {"_written": _written_at(path)}
            continue
        steps_file = folder / METRICS_FILE
        steps = read_steps(steps_file, warn)[0] if steps_file.exists() else []
        speeds = [s["tokens_per_s"] for s in steps if isinstance(s.get("tokens_per_s"), (int, float))]
        if speeds:
            runs[f"{label} (steps)"] = {"epochs": [{"tokens_per_s": statistics.median(speeds)}],
                                         "_written": _written_at(steps_file) + f", {len(speeds)} steps, unfinished"}
    return runs


def step_logs(out: Path, warn: Callable[[str], None] = _warn) -> dict[str, tuple[list[dict], list[dict]]]:
    """``{label: (step lines, event lines)}`` of every ``metrics.jsonl`` under ``out`` (label: its folder).

    Tolerant: a torn last line is skipped with a warning (``warn``) and the rest is drawn.
    """
    return {path.parent.relative_to(out).as_posix(): read_steps(path, warn)
            for path in sorted(out.rglob(METRICS_FILE)) if "checkpoints" not in path.parts}


def draw_curves(logs: dict[str, tuple[list[dict], list[dict]]], path: Path) -> Path:
    """Loss and gradient norm against the optimizer step, one line per run; guard events as red crosses."""
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_norm) = plt.subplots(2, 1, figsize=(7, 5.5), sharex=True)
    for k, (label, (steps, events)) in enumerate(logs.items()):
        color = f"C{k % 10}"
        ax_loss.plot([s["step"] for s in steps], [s["loss"] for s in steps], color=color, label=label, lw=1)
        normed = [s for s in steps if s["grad_norm"] is not None]
        ax_norm.plot([s["step"] for s in normed], [s["grad_norm"] for s in normed], color=color, lw=1)
        marks = [e for e in events if e["event"] == GUARD_EVENT and isinstance(e.get("loss"), (int, float))]
        ax_loss.scatter([e["step"] for e in marks], [e["loss"] for e in marks], marker="x", color="red", zorder=3)
    ax_loss.set_ylabel("training loss")
    ax_loss.set_yscale("log")
    ax_norm.set_ylabel("gradient norm")
    ax_norm.set_xlabel("optimizer step")
    ax_loss.legend(fontsize=7)
    ax_loss.set_title("per optimizer step (metrics.jsonl); x = the divergence guard's loss (rolled back, skipped "
                      "or kept)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _draw_throughput(runs: dict[str, dict], path: Path) -> Path:
    """Bars of real tokens per second (median over epochs, or over steps of an unfinished run)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    labels = list(runs)
    speeds = [statistics.median(e["tokens_per_s"] for e in runs[k]["epochs"]) for k in labels]
    ax.bar(labels, speeds, color="tab:blue")
    ax.set_ylabel("real tokens / s (median over epochs)")
    ax.tick_params(axis="x", rotation=15)
    for x, s in enumerate(speeds):
        ax.annotate(f"{s:,.0f}", (x, s), ha="center", va="bottom", fontsize=8)
        print(f"{labels[x]:>20}: {s:,.0f} tokens/s   (run written {runs[labels[x]]['_written']})")
    print("These runs were measured at different times, so their ratios mix in whatever else the machine was "
          "doing; for speedups use scripts/run_benchmarks.py (alternating repeats on the same batches; a speedup "
          "there is the quotient of two step_time_ms).")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _written_at(path: Path) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(path.stat().st_mtime))


def build_parser() -> argparse.ArgumentParser:
    """The command line of this script."""
    parser = new_parser("project/plot.py", __doc__)
    parser.add_argument("--workdir", default="workdir", help="the runs' --workdir (their metrics: <workdir>/out)")
    parser.add_argument("--out_dir", default=None, help="where the figures go; None: <workdir>/out/plots")
    return parser


def main(argv: list[str] | None = None) -> list[Path]:
    """Draw the figures; return their paths. Raises ConfigError when there is nothing to plot."""
    args = build_parser().parse_args(argv)
    out = Path(args.workdir) / "out"
    said: set[str] = set()

    def warn(message: str) -> None:   # each torn or unreadable file once, though two readers meet it
        if message not in said:
            said.add(message)
            _warn(message)

    runs = collect(out, warn)
    logs = {label: log for label, log in step_logs(out, warn).items() if log[0]}
    if not runs and not logs:
        raise ConfigError(f"no metrics under {out}: run project/run_data_parallel.py or "
                          f"project/run_pipeline.py first")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(args.out_dir) if args.out_dir else out / "plots"
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    if runs:
        written.append(_draw_throughput(runs, folder / "throughput.png"))
    modes = [k for k, run in runs.items() if run.get("timeline")]
    if modes:
        fig, axes = plt.subplots(len(modes), 1, figsize=(7, 1.6 + 1.2 * len(modes)), squeeze=False)
        for ax, mode in zip(axes[:, 0], modes):
            timeline = runs[mode]["timeline"]
            last = max((t["epoch"], t["step"]) for t in timeline)
            for t in (t for t in timeline if (t["epoch"], t["step"]) == last):
                ax.barh(t["stage"], t["end"] - t["start"], left=t["start"], color=f"C{t['task_index'] % 10}",
                        edgecolor="black")
            ax.set_yticks(sorted({t["stage"] for t in timeline}))
            ax.set_ylabel("stage")
            ax.set_title(f"{mode}: forward tasks of epoch {last[0]} step {last[1]}", fontsize=9)
        axes[-1, 0].set_xlabel("seconds since the step started")
        fig.tight_layout()
        written.append(folder / "pipeline_timeline.png")
        fig.savefig(written[-1], dpi=120)
        plt.close(fig)
    if logs:
        written.append(draw_curves(logs, folder / "training_curves.png"))
    print("wrote " + ", ".join(str(p) for p in written))
    return written


if __name__ == "__main__":
    sys.exit(run_cli(main))
