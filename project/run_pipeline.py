"""GPT-2 training split over two stages with your Problem 2 code.

    python project/run_pipeline.py --model_parallel_mode model_parallel
    python project/run_pipeline.py --model_parallel_mode pipeline_parallel --n_chunk 4

``gpt2_stages`` cuts the model into stages; ``model_parallel`` runs the whole
batch through stage 0, then stage 1; ``pipeline_parallel`` runs your ``Pipe``
over ``--n_chunk`` micro-batches, so the stages overlap. Devices ``auto``:
``cuda:0,cuda:1`` with two GPUs, both stages on ``cuda:0`` with one, else
both on the CPU, each stage in its own worker thread. Writes
``metrics_<mode>.json`` (per epoch: training time, real tokens per second,
training loss; validation loss before and after; a per-task timeline of the
first steps of every epoch) to ``<workdir>/out/pipeline/``.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as `python project/run_pipeline.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from project.data import ConfigError, make_collate, prepare_data
from project.model import build_model, count_parameters
from project.train_lib import (add_common_args, check_common_args, cpu_threads_per_rank, evaluate, lm_loss, log,
                               out_dir, print_epochs, progress, quiet_libraries, run_cli, write_json)

NAME = "pipeline"
MODES = ("model_parallel", "pipeline_parallel")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``argv`` or ``sys.argv[1:]``); argparse exits with code 2 on malformed options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_parallel_mode", choices=MODES, default="pipeline_parallel")
    parser.add_argument("--n_chunk", type=int, default=4, help="micro-batches per batch (pipeline_parallel)")
    parser.add_argument("--n_stages", type=int, default=2, help="pipeline stages (default 2)")
    parser.add_argument("--devices", default="auto", help="'auto' or a comma list, one per stage: cuda:0,cuda:1")
    parser.add_argument("--timeline_steps", type=int, default=3, help="steps per epoch kept in the timeline")
    add_common_args(parser, batch_size=32, n_epochs=3, lr=1e-3)
    return parser.parse_args(argv)


def stage_devices(spec: str, n_stages: int) -> list[torch.device]:
    """The device of each stage. ``auto``: one GPU per stage if there are enough, else all on cuda:0, else CPU.

    Raises ConfigError for a list of the wrong length, an unknown device or a missing GPU.
    """
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
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
        if d.type == "cuda" and (d.index or 0) >= gpus:
            raise ConfigError(f"--devices names {d} but this machine has {gpus} GPU(s)")
        if d.type not in ("cpu", "cuda"):
            raise ConfigError(f"--devices: only cpu and cuda devices are supported, got {d}")
    return devices


def _stage_timer(stages: list[torch.nn.Module], timeline: list[dict]) -> list:
    """Record a start/end stamp per stage call (model_parallel has no workers that keep a timeline)."""
    handles = []
    for j, stage in enumerate(stages):
        def pre(module, inputs, j=j):
            module._t0 = time.perf_counter()

        def post(module, inputs, output, j=j):
            timeline.append({"stage": j, "task_index": sum(t["stage"] == j for t in timeline),
                             "start": module._t0, "end": time.perf_counter()})
        handles += [stage.register_forward_pre_hook(pre), stage.register_forward_hook(post)]
    return handles


def main(argv: list[str] | None = None) -> dict:
    """Train in one process with the chosen mode; return the metrics. Raises ConfigError for bad arguments."""
    from pipeline.gpt2 import build_pipeline_gpt2

    args = parse_args(argv)
    check_common_args(args)
    if args.n_chunk < 1 or args.n_stages < 1:
        raise ConfigError(f"--n_chunk and --n_stages must be at least 1, got {args.n_chunk}, {args.n_stages}")
    devices = stage_devices(args.devices, args.n_stages)
    if devices[0].type == "cpu":
        torch.set_num_threads(cpu_threads_per_rank(args.n_stages))   # one share of the cores per stage thread
    quiet_libraries()

    train, valid, tokenizer = prepare_data(args.dataset, args.tokenizer, Path(args.workdir), args.n_train,
                                           args.n_valid, args.seed)
    collate = make_collate(tokenizer, args.max_len)
    model = build_model(args.preset, tokenizer, args.pretrained, args.seed)
    if args.n_stages > model.config.n_layer:
        raise ConfigError(f"--n_stages {args.n_stages} is more than the model's {model.config.n_layer} blocks")
    split_size = math.ceil(args.batch_size / args.n_chunk)
    net = build_pipeline_gpt2(model, devices, args.model_parallel_mode, split_size=split_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    generator = torch.Generator().manual_seed(args.seed)
    loader = torch.utils.data.DataLoader(train, batch_size=args.batch_size, shuffle=True, collate_fn=collate,
                                         generator=generator)
    timeline: list[dict] = []
    if args.model_parallel_mode == "model_parallel":
        _stage_timer(list(net.stages), timeline)
    else:
        timeline = net.workers.timeline   # StageWorkers appends one entry per finished task

    def validation_loss() -> float:
        model.eval()
        loss = evaluate(net, valid, collate, args.batch_size, devices[0], args.quiet)
        model.train()
        return loss

    metrics = {"mode": args.model_parallel_mode, "devices": [str(d) for d in devices], "n_chunk": args.n_chunk,
               "split_size": split_size, "preset": args.preset, "parameters": count_parameters(model),
               "batch_size": args.batch_size, "val_loss_before": validation_loss(), "epochs": [], "timeline": []}
    with net:
        for epoch in range(args.n_epochs):
            start, tokens, losses = time.perf_counter(), 0, []
            for step, batch in enumerate(progress(loader, args.quiet, desc=f"epoch {epoch}", unit="batch")):
                timeline.clear()
                step_start = time.perf_counter()
                optimizer.zero_grad()
                loss = lm_loss(net(batch["input_ids"].to(devices[0])), batch["labels"])
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
                tokens += int(batch["attention_mask"].sum())   # real tokens, no padding
                if step < args.timeline_steps:
                    metrics["timeline"] += [{**t, "epoch": epoch, "step": step, "start": t["start"] - step_start,
                                             "end": t["end"] - step_start} for t in timeline]
            if devices[-1].type == "cuda":
                torch.cuda.synchronize(devices[-1])
            seconds = time.perf_counter() - start
            metrics["epochs"].append({"epoch": epoch, "train_time_s": seconds, "tokens": tokens,
                                      "tokens_per_s": tokens / seconds, "steps": len(losses),
                                      "train_loss": sum(losses) / max(len(losses), 1)})
            log(f"epoch {epoch}: train loss {metrics['epochs'][-1]['train_loss']:.4f}, "
                f"{tokens / seconds:,.0f} tokens/s, {seconds:.1f} s", args.quiet)
        metrics["val_loss_after"] = validation_loss()
    folder = out_dir(args, NAME)
    write_json(folder / f"metrics_{args.model_parallel_mode}.json", metrics)
    print(f"{args.model_parallel_mode}: stages on {', '.join(metrics['devices'])}, preset {args.preset}, "
          f"{args.n_chunk if args.model_parallel_mode == 'pipeline_parallel' else 1} micro-batch(es) per batch")
    print_epochs(metrics)
    print(f"  validation loss {metrics['val_loss_before']:.4f} -> {metrics['val_loss_after']:.4f}")
    print(f"  metrics: {folder / f'metrics_{args.model_parallel_mode}.json'}")
    return metrics


if __name__ == "__main__":
    sys.exit(run_cli(main))
