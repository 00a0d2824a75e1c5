"""GPT-2 training split over two stages with your Problem 2 code.

    python project/run_pipeline.py --model_parallel_mode model_parallel
    python project/run_pipeline.py --model_parallel_mode pipeline_parallel --n_chunk 4

``gpt2_stages`` cuts the model into stages; ``model_parallel`` runs the whole batch through stage 0, then stage 1;
``pipeline_parallel`` runs your ``Pipe`` over ``--n_chunk`` micro-batches of ``ceil(batch_size / n_chunk)`` rows (a
count that does not come out exact is refused), so the stages overlap. Devices ``auto``: ``cuda:0,cuda:1`` with two
GPUs, both stages on ``cuda:0`` with one, else both on the CPU, each stage in its own worker thread. Writes
``metrics_<mode>.json`` (per epoch: training time, real tokens per second, training loss, micro-batches run;
validation loss before and after; a per-task timeline of the first batches of every epoch) and ``metrics.jsonl``
(one line per optimizer step) to ``<workdir>/out/pipeline/<run>/``: one folder per configuration,
``model_parallel`` or ``pipeline-chunk<n_chunk>`` and the options that differ from their defaults.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as `python project/run_pipeline.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# no torch here: the library is imported where it runs, after the checks (project/__init__.py)
from project import readiness
from project.cli import ConfigError, int_at_least, read_constant, run_cli
from project.config import RunConfig
from project.options import add_common_args, add_training_args, check_training_args, new_parser, out_dir, run_name
from project.output import print_header, print_outcome, quiet_libraries, write_json

NAME = "pipeline"
COMMAND = "project/run_pipeline.py"
NEEDS = {"model_parallel": readiness.MODEL_PARALLEL, "pipeline_parallel": readiness.PIPELINE_PARALLEL}


def build_parser() -> argparse.ArgumentParser:
    """The command line of this entry point (every option range-checked while parsing)."""
    parser = new_parser(COMMAND, __doc__)
    # read from pipeline/gpt2.py's source, which main first checks parses
    parser.add_argument("--model_parallel_mode", choices=read_constant("pipeline.gpt2", "MODES"),
                        default="pipeline_parallel",
                        help="model_parallel: the whole batch through stage 0, then stage 1; pipeline_parallel: "
                             "your Pipe over --n_chunk micro-batches")
    parser.add_argument("--n_chunk", type=int_at_least(1), default=4,
                        help="micro-batches per batch (pipeline_parallel only): split size ceil(batch_size / n_chunk)")
    parser.add_argument("--n_stages", type=int_at_least(1), default=2, help="pipeline stages")
    parser.add_argument("--devices", default="auto", help="'auto' or a comma list, one per stage: cuda:0,cuda:1")
    parser.add_argument("--timeline_steps", type=int_at_least(0), default=3,
                        help="batches per epoch whose stage tasks are kept in the timeline")
    add_common_args(parser, batch_size=32, n_epochs=3, lr=1e-3)
    add_training_args(parser)
    return parser


def resume_meta(args: argparse.Namespace) -> dict:
    """What a checkpoint of this run records and a ``--resume`` must match."""
    return {"entry": NAME, "mode": args.model_parallel_mode, "batch_size": args.batch_size,
            "grad_accum": args.grad_accum, "n_stages": args.n_stages, "preset": args.preset, "seed": args.seed}


def folder_name(args: argparse.Namespace) -> str:
    """The run folder's name: ``model_parallel`` (``--n_chunk`` plays no part) or ``pipeline-chunk<n_chunk>``, then
    the other options that differ from their defaults (``project.options.run_name``)."""
    first = ({"model_parallel_mode": "model_parallel", "n_chunk": ""} if args.model_parallel_mode == "model_parallel"
             else {"model_parallel_mode": "pipeline", "n_chunk": f"chunk{args.n_chunk}"})
    return run_name(args, build_parser(), first)


def main(argv: list[str] | None = None) -> dict:
    """Train in one process with the chosen mode; return the metrics.

    Raises ConfigError for bad arguments, unwritten Problem 2 code and (pipeline_parallel) a ``clock_cycles``
    that breaks its contract (``microbatch.check_schedule``), before training starts.
    """
    readiness.ensure_ready(COMMAND, {**NEEDS["model_parallel"], **NEEDS["pipeline_parallel"]}, stubs_too=False)
    args = build_parser().parse_args(argv)   # a bad option exits with code 2 and one line
    mode = args.model_parallel_mode
    readiness.ensure_ready(f"{COMMAND} --model_parallel_mode {mode}", NEEDS[mode])
    import torch   # torch, the library and the student code: only after the checks

    from project import microbatch
    from project.data import make_collate, prepare_data
    from project.devices import cpu_threads_per_rank, stage_devices

    devices = stage_devices(args.devices, args.n_stages)
    meta = resume_meta(args)
    resume, checkpoint_meta = check_training_args(args, devices[0].type, meta)
    n_chunk = args.n_chunk if mode == "pipeline_parallel" else 1
    microbatch.check_n_chunk(args.batch_size, n_chunk)
    if mode == "pipeline_parallel":
        from pipeline import schedule
        microbatch.check_schedule(schedule.clock_cycles, n_chunk, args.n_stages)   # what Pipe will walk
    if devices[0].type == "cpu":
        torch.set_num_threads(cpu_threads_per_rank(args.n_stages))   # one share of the cores per stage thread
    size = microbatch.split_size(args.batch_size, n_chunk)
    print_header(f"{mode}: stages on {', '.join(str(d) for d in devices)}, preset {args.preset}, "
                 f"{microbatch.count(args.batch_size, size)} micro-batch(es) of up to {size} rows per batch of "
                 f"{args.batch_size}, {args.n_epochs} epoch(s)")
    quiet_libraries()
    train_set, valid, tokenizer = prepare_data(args.dataset, args.tokenizer, Path(args.workdir), args.n_train,
                                               args.n_valid, args.seed)
    config = RunConfig.of(args, resume=resume, checkpoint_meta=checkpoint_meta,
                          out_dir=out_dir(args, NAME, folder_name(args)), meta=meta)
    metrics = train_stages(config, (train_set, valid, tokenizer, make_collate(tokenizer, args.max_len)), devices,
                           n_chunk)
    print_outcome(metrics, f"{config.out_dir} (metrics_{mode}.json, metrics.jsonl)")
    return metrics


def train_stages(config: RunConfig, data: tuple, devices: list, n_chunk: int) -> dict:
    """The run, top to bottom: data, model cut into stages on ``devices``, optimizer, the training loop,
    evaluation, outputs; each batch runs as ``n_chunk`` micro-batches."""
    import torch

    from project import microbatch
    from project.loop import SINGLE_REPLICA, LoopParts, make_scheduler, prepare_run, train
    from project.model import validation_loss

    mode, size = config.model_parallel_mode, microbatch.split_size(config.batch_size, n_chunk)
    train_set, valid, tokenizer, collate = data                                         # data (main prepared it)
    loader = torch.utils.data.DataLoader(train_set, batch_size=config.batch_size, shuffle=True, collate_fn=collate,
                                         generator=torch.Generator().manual_seed(config.seed))
    model, net = _staged_model(config, tokenizer, devices, size)                       # model
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)                    # optimizer
    scheduler = make_scheduler(optimizer, config, len(loader))
    timeline = microbatch.stage_timeline(net)

    def val_loss() -> float:
        return validation_loss(model, valid, collate, devices[0], config.quiet, forward=net,
                               batch_size=config.batch_size)

    metrics = _run_facts(config, model, devices, n_chunk, size)
    spec, step_log, metrics["val_loss_before"] = prepare_run(config, 0, val_loss)   # loop
    loss_of = _timed_loss(net, devices[0], timeline, config.timeline_steps, metrics["timeline"])
    parts = LoopParts(model=model, optimizer=optimizer, scheduler=scheduler, loader=loader, loss_of=loss_of,
                      device=devices[0], reduce_grads=SINGLE_REPLICA, step_log=step_log)
    with net:
        result = train(parts, spec)
        metrics["val_loss_after"] = val_loss()                                          # evaluation
    step_log.close()
    full, last = divmod(len(train_set), config.batch_size)   # every batch of an epoch ran, each cut as above
    for e in result["epochs"]:                                                          # outputs
        e["pipeline_micro_batches"] = full * microbatch.count(config.batch_size, size) + microbatch.count(last, size)
    metrics |= {"epochs": result["epochs"], "optimizer_steps": result["steps"], "rollbacks": result["rollbacks"],
                "stopped_early": result["stopped_early"]}
    write_json(config.out_dir / f"metrics_{mode}.json", metrics)
    return metrics


def _staged_model(config: RunConfig, tokenizer, devices: list, size: int) -> tuple:
    """``(model, net)``: the GPT-2 of ``config`` and your Pipe (Problem 2) over its stages on ``devices``, each
    batch cut into micro-batches of ``size`` rows; prints each stage's parameters. ConfigError for more stages
    than blocks."""
    from pipeline.gpt2 import build_pipeline_gpt2
    from project.bench.memory import parameters_per_stage, stages_of
    from project.model import build_model, enable_activation_checkpointing

    model = build_model(config.preset, tokenizer, config.pretrained, config.seed)
    if config.n_stages > model.config.n_layer:
        raise ConfigError(f"--n_stages {config.n_stages} is more than the model's {model.config.n_layer} blocks")
    if config.grad_ckpt:
        enable_activation_checkpointing(model)
    net = build_pipeline_gpt2(model, devices, config.model_parallel_mode, split_size=size)
    counts = parameters_per_stage(stages_of(net))   # what each stage registers (the tied head weight: stage 0)
    print(f"  parameters_per_stage {', '.join(f'{n:,}' for n in counts)} (stage 0 first; sum {sum(counts):,})")
    return model, net


def _run_facts(config: RunConfig, model, devices: list, n_chunk: int, size: int) -> dict:
    """The metrics known before training: mode, devices, how a batch is cut, model and run options, threads; an
    empty ``timeline`` that ``_timed_loss`` fills."""
    from project import microbatch
    from project.devices import thread_facts
    from project.model import count_parameters

    return {"mode": config.model_parallel_mode, "devices": [str(d) for d in devices], "n_chunk": n_chunk,
            "split_size": size, "micro_batches_per_batch": microbatch.count(config.batch_size, size),
            "micro_batch_rule": "split_size = ceil(batch_size / n_chunk); micro-batches = ceil(rows / split_size)",
            "preset": config.preset, "parameters": count_parameters(model), "batch_size": config.batch_size,
            "grad_accum": config.grad_accum, "precision": config.precision, "grad_ckpt": config.grad_ckpt,
            **thread_facts(), "timeline": []}


def _timed_loss(net, device, timeline: list, timeline_steps: int, records: list):
    """The loop's ``loss_of(batch, epoch, index)``: the loss of ``net`` on ``batch``; for the first
    ``timeline_steps`` steps of an epoch it appends each stage's ``timeline`` entries to ``records``, times from the
    step's start."""
    from project.model import lm_loss

    def loss_of(batch: dict, epoch: int, index: int):
        timeline.clear()
        start = time.perf_counter()
        loss = lm_loss(net(batch["input_ids"].to(device)), batch["labels"])
        if index < timeline_steps:
            records.extend({**t, "epoch": epoch, "step": index, "start": t["start"] - start,
                            "end": t["end"] - start} for t in timeline)
        return loss
    return loss_of


if __name__ == "__main__":
    sys.exit(run_cli(main))
