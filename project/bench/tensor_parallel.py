"""Tensor parallel vs data parallel vs pipeline on the same GPT-2: per-rank parameter memory and step time.

    python scripts/run_benchmarks.py --tensor_parallel [--quick]     # after the main benchmark
    python -m project.bench.tensor_parallel [--quick]                # this comparison alone

On two ranks, every variant (``VARIANTS``) trains the same weights on the same global batches with AdamW; ``run``
measures them and writes the summary and the figure.
"""
from __future__ import annotations

import argparse
import datetime
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from common.startup import GPT2_IMPORTS
from project import readiness
from project.bench import stats
from project.bench.publish import new_run_folder, publish
from project.bench.report import ms, times
from project.devices import RankEnv, join_group
from project.launch import file_rendezvous, spawn_ranks
from project.output import quiet_libraries, write_json

COMMAND = "python -m project.bench.tensor_parallel"
SUMMARY_FILE = "tensor_parallel_summary.json"
FIGURE_FILE = "tensor_parallel.png"
# variant -> (ranks that work, the student problems it needs)
VARIANTS: dict[str, tuple[str, readiness.Needs]] = {
    "serial": ("solo", {}),
    "data_parallel": ("pair", {"1.2": ("average_gradients",)}),
    "pipeline": ("solo", readiness.PIPELINE_PARALLEL),
    "tensor_parallel": ("pair", {"5.1": None, "5.2": None}),
}


LABELS = {"serial": "unsplit\n1 rank", "data_parallel": "data parallel\n2 ranks\nhalf batch each",
          "pipeline": "pipeline\n2 stages\nin 1 process", "tensor_parallel": "tensor parallel\n2 ranks\nwhole batch"}


@dataclass
class TPOptions:
    """What to measure; ``quick`` picks small defaults for the ``None`` fields."""

    preset: str = "tiny"
    batch_size: int | None = None
    max_len: int = 64
    steps: int | None = None
    repeats: int | None = None
    n_chunk: int = 4
    quick: bool = False
    workdir: str = "workdir"
    figures_dir: str = "submit_figures"
    seed: int = 0

    def resolved(self) -> TPOptions:
        """A copy with the defaults filled in; ValueError naming a bad size."""
        out = TPOptions(**{**asdict(self), "batch_size": self.batch_size or (8 if self.quick else 16),
                           "steps": self.steps or (2 if self.quick else 4),
                           "repeats": self.repeats or (2 if self.quick else 4)})
        if out.batch_size < 2 or out.batch_size % 2:
            raise ValueError(f"batch_size must be even and >= 2 (data parallel splits it over 2 ranks), "
                             f"got {out.batch_size}")
        if not 1 <= out.n_chunk <= out.batch_size:
            raise ValueError(f"n_chunk must lie in [1, batch_size={out.batch_size}], got {out.n_chunk}")
        return out


def _workload(opts: TPOptions, path: Path) -> dict:
    """Build the model weights and ``steps`` global batches (every batch padded to one width) into ``path``."""
    from project.bench.workload import _same_width
    from project.data import make_collate, prepare_data
    from project.model import build_model, count_parameters

    quiet_libraries()
    train, _, tokenizer = prepare_data("embedded", "bpe", Path(opts.workdir), seed=opts.seed)
    collate = make_collate(tokenizer, opts.max_len)
    batches = _same_width([collate(train[k * opts.batch_size:(k + 1) * opts.batch_size])
                           for k in range(opts.steps)], tokenizer.pad_token_id)
    width = batches[0]["input_ids"].shape[1]
    model = build_model(opts.preset, tokenizer, seed=opts.seed)
    torch.save({"config": model.config.to_json_string(), "state": model.state_dict(), "batches": batches}, path)
    return {"preset": opts.preset, "parameters": count_parameters(model), "n_layer": model.config.n_layer,
            "n_head": model.config.n_head, "n_embd": model.config.n_embd, "batch_shape": [opts.batch_size, width],
            "real_tokens_per_step": [int(b["attention_mask"].sum()) for b in batches]}


def _bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


class _Rank:
    """One rank's steppers (built on first use, outside the timing) and its memory measurements."""

    def __init__(self, rank: int, device: torch.device, workload: dict, n_chunk: int):
        self.rank, self.device, self.workload, self.n_chunk = rank, device, workload, n_chunk
        self.steppers: dict = {}
        self.closers: list = []
        self.memory: dict[str, list[int]] = {}

    def model(self) -> torch.nn.Module:
        from project.bench.workload import fresh_model
        return fresh_model(self.workload, self.device)

    def batch(self, index: int, half: bool) -> tuple[torch.Tensor, torch.Tensor]:
        b = self.workload["batches"][index]
        x, y = b["input_ids"], b["labels"]
        if half:
            share = x.shape[0] // 2
            x, y = x[self.rank * share:(self.rank + 1) * share], y[self.rank * share:(self.rank + 1) * share]
        return x.to(self.device), y.to(self.device)

    def build(self, name: str):
        from project.bench.context import local_step

        model = self.model()
        between, half, forward = (lambda: None), False, model
        if name == "data_parallel":
            from data_parallel.comm import average_gradients
            between, half = (lambda: average_gradients(model)), True
        elif name == "tensor_parallel":
            from tensor_parallel.gpt2 import parallelize_gpt2
            parallelize_gpt2(model)
        if name == "pipeline":
            from pipeline.gpt2 import build_pipeline_gpt2
            from project.devices import stage_devices
            batch_size = self.workload["batches"][0]["input_ids"].shape[0]
            forward = build_pipeline_gpt2(model, stage_devices("auto", 2), "pipeline_parallel",
                                          split_size=math.ceil(batch_size / self.n_chunk))
            self.memory[name] = [_bytes(stage) for stage in forward.stages]
            self.closers.append(forward.close)
        else:
            self.memory[name] = [_bytes(model)]
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        return lambda i: local_step(forward, optimizer, *self.batch(i, half), between=between)


def _rank_main(env: RankEnv, folder: str, opts: dict, variants: list[str]) -> dict | None:
    """One rank: join the group, then run every repeat of every variant; rank 0 returns the raw numbers."""
    import torch.distributed as dist

    from project.bench.workload import load_workload

    quiet_libraries()
    backend, device = join_group(env, "auto", student_setup=False)
    rank = env.rank
    me = _Rank(rank, device, load_workload(Path(folder) / "workload.pt"), opts["n_chunk"])

    def sync() -> None:
        if device.type == "cuda":
            for index in range(torch.cuda.device_count()):
                torch.cuda.synchronize(index)

    times: dict[str, list[float]] = {name: [] for name in variants}
    for repeat in range(-1, opts["repeats"]):                       # repeat -1: the untimed warm-up
        for name in stats.rotation(variants, max(repeat, 0)):
            works = VARIANTS[name][0] == "pair" or rank == 0
            if works and name not in me.steppers:
                me.steppers[name] = me.build(name)
            total = 0.0
            for i in range(opts["steps"] if repeat >= 0 else 1):
                dist.barrier()
                sync()
                t0 = time.perf_counter()
                if works:
                    me.steppers[name](i)
                sync()
                elapsed = torch.tensor([time.perf_counter() - t0 if works else 0.0], dtype=torch.float64,
                                       device=device)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)      # a step lasts as long as its slowest rank
                total += elapsed.item()
            if repeat >= 0:
                times[name].append(total)
    memory = [None, None]
    dist.all_gather_object(memory, me.memory)
    for close in me.closers:
        close()
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        return {"times": times, "memory": memory, "backend": backend, "threads": torch.get_num_threads()}
    return None


def summarize(raw: dict, workload: dict, skipped: dict[str, str], opts: TPOptions) -> dict:
    """Step times, ratios against ``serial`` (``value`` and ``per_repeat``) and per-rank parameter bytes, from the
    ranks' raw numbers.

    Ratios ``time(variant) / time(serial)`` are quotients of step times (``stats.time_ratio``). Memory is the bytes
    of the parameters each rank (or pipeline stage) holds, measured on the built modules; AdamW's state is twice
    that again.
    """
    times, memory = raw["times"], raw["memory"]
    variants = {}
    for name, runs in times.items():
        held = memory[0][name] + (memory[1][name] if VARIANTS[name][0] == "pair" else [])
        variants[name] = {"ranks": 2 if VARIANTS[name][0] == "pair" else 1, "run_times_s": runs,
                          "step_time_ms": stats.step_time_ms(runs, opts.steps),
                          "parameter_bytes_per_rank": held, "max_parameter_bytes": max(held)}
    serial_bytes = variants["serial"]["max_parameter_bytes"]
    for name, v in variants.items():
        v["time_vs_serial"] = stats.time_ratio(v["run_times_s"], variants["serial"]["run_times_s"])
        v["memory_vs_serial"] = v["max_parameter_bytes"] / serial_bytes
    return {"schema": "assignment5-tensor-parallel/1",
            "created": datetime.datetime.now().isoformat(timespec="seconds"), "options": asdict(opts),
            "workload": workload, "backend": raw["backend"], "threads_per_rank": raw["threads"],
            "variants": variants, "skipped": skipped,
            "meaning": {"step_time_ms": "median over repeats of (run time / steps)",
                        "time_vs_serial": "step_time_ms / serial's step_time_ms (value; per_repeat: each repeat's own "
                                          "ratio, the spread)",
                        "memory_vs_serial": "largest per-rank (per-stage) parameter bytes / the unsplit model's"}}


def table(summary: dict) -> str:
    """The console table: one line per variant."""
    lines = [f"tensor vs data vs pipeline parallel ({summary['workload']['preset']} GPT-2, backend "
             f"{summary['backend']}, batch {summary['workload']['batch_shape']}):",
             f"  {'variant':16s} {'ranks':>5s} {'params/rank (MiB)':>18s} {'x serial':>9s} {'step_time_ms':>12s} "
             f"{'x serial':>9s}"]
    for name, v in summary["variants"].items():
        lines.append(f"  {name:16s} {v['ranks']:5d} {v['max_parameter_bytes'] / 2**20:18.2f} "
                     f"{v['memory_vs_serial']:9.2f} {ms(v['step_time_ms']):>12s} "
                     f"{times(v['time_vs_serial']['value']):>9s}")
    lines += [f"  skipped {name}: {why}" for name, why in summary["skipped"].items()]
    return "\n".join(lines)


def draw(summary: dict, path: Path) -> None:
    """Two panels: parameter MiB held per rank (stage), and step time with the single repeats as dots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary["variants"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = {"serial": "#9e9e9e", "data_parallel": "#ff7f0e", "pipeline": "#2ca02c", "tensor_parallel": "#1f77b4"}
    for x, name in enumerate(names):
        v = summary["variants"][name]
        held = [b / 2**20 for b in v["parameter_bytes_per_rank"]]
        width = 0.8 / len(held)
        for k, mib in enumerate(held):
            left.bar(x - 0.4 + width * (k + 0.5), mib, width=width * 0.9, color=colors[name], alpha=0.85)
        left.text(x, max(held) * 1.02, f"{v['memory_vs_serial']:.2f}x", ha="center", fontsize=8)
        runs = [1000 * t / summary["options"]["steps"] for t in v["run_times_s"]]
        right.bar(x, v["step_time_ms"], color=colors[name], alpha=0.85)
        right.scatter([x] * len(runs), runs, color="black", s=10, zorder=3)
        right.text(x, max(runs) * 1.02, f"{ms(v['step_time_ms'])} ms, {times(v['time_vs_serial']['value'])}",
                   ha="center", fontsize=8)
    labels = [LABELS[n] for n in names]
    for ax in (left, right):
        ax.set_xticks(range(len(names)), labels, fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        ax.margins(y=0.12)
    left.set_ylabel("parameters held (MiB), one bar per rank / stage")
    left.set_title("parameters per rank (x: largest rank vs unsplit; TP splits the blocks only)", fontsize=10)
    right.set_ylabel("step_time_ms (ms per training step)")
    right.set_title("step_time_ms (bar: median of repeats, dots: repeats; x: vs serial's)", fontsize=10)
    w = summary["workload"]
    fig.suptitle(f"{w['preset']} GPT-2 ({w['n_layer']} layers, {w['n_embd']} wide), global batch "
                 f"{w['batch_shape'][0]} x {w['batch_shape'][1]} tokens, AdamW, backend {summary['backend']}"
                 + (f"; skipped: {', '.join(summary['skipped'])}" if summary["skipped"] else ""), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(opts: TPOptions, echo=print) -> dict:
    """Measure every runnable variant on 2 ranks; write the summary JSON and the figure; return the summary::

        serial           rank 0 alone, the whole batch                                         (the baseline)
        data_parallel    both ranks, half the batch each, the student's average_gradients      (Problem 1.2)
        pipeline         rank 0, two stages of the student's Pipe on the two stage devices     (Problem 2)
        tensor_parallel  both ranks, the whole batch, every block split by parallelize_block   (Problem 5)

    A warm-up run, then ``repeats`` repeats; in each, every variant runs ``steps`` timed steps, in an order rotated
    per repeat (``stats.rotation``); a step lasts as long as its slowest rank. Writes ``tensor_parallel.png`` and
    ``tensor_parallel_summary.json`` to its own run folder, then copies them to the figures folder (``publish``).
    Raises ValueError for bad options; a variant whose problem is not written is skipped (listed under
    ``skipped``).
    """
    opts = opts.resolved()
    skipped = {name: "; ".join(why) for name, (_, needs) in VARIANTS.items()
               if (why := readiness.problems_not_ready(needs))}
    variants = [name for name in VARIANTS if name not in skipped]
    folder = new_run_folder(Path(opts.workdir) / "perf", "tp-")
    echo(f"tensor-parallel comparison: {', '.join(variants)} ({opts.repeats} repeats of {opts.steps} steps); "
         f"raw numbers in {folder}")
    workload = _workload(opts, folder / "workload.pt")
    raw = spawn_ranks(_rank_main, 2, file_rendezvous(folder, "store"), (str(folder), asdict(opts), variants),
                      name="tensor_parallel", preload=GPT2_IMPORTS).wait()[0]
    write_json(folder / "times.json", raw)
    summary = summarize(raw, workload, skipped, opts)
    out = Path(opts.figures_dir)
    draw(summary, folder / FIGURE_FILE)
    summary["figure"], summary["run_folder"] = str(out / FIGURE_FILE), str(folder)
    write_json(folder / SUMMARY_FILE, summary, indent=1)
    for line in publish(folder, out, SUMMARY_FILE, [FIGURE_FILE], (FIGURE_FILE,)):
        echo(line)
    return summary


def main(argv: list[str] | None = None) -> int:
    """CLI (``python -m project.bench.tensor_parallel``): run, print the table; 2 and one line for bad options, or
    when Problem 5 is not written yet (before any rank starts: the comparison exists to measure it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small batch, few steps and repeats")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--workdir", default="workdir")
    parser.add_argument("--figures_dir", default="submit_figures")
    args = parser.parse_args(argv)
    try:
        readiness.ensure_ready(COMMAND, readiness.TENSOR_PARALLEL)
        summary = run(TPOptions(preset=args.preset, quick=args.quick, workdir=args.workdir,
                                figures_dir=args.figures_dir))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(table(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
