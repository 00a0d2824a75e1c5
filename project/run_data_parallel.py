"""Data-parallel GPT-2 training with your Problem 1 code.

    python project/run_data_parallel.py --world_size 2            # starts 2 ranks itself
    torchrun --nproc_per_node 2 project/run_data_parallel.py     # or let torchrun start them

Each rank joins the group with your ``setup_process_group``, trains the same
model on its ``partition_dataset`` slice of every global batch
(``--batch_size`` is global, per forward/backward) and averages gradients
with your ``average_gradients`` once per optimizer step (after
``--grad_accum`` batches; the loop is ``project/loop.py``). Backend ``auto``
picks NCCL (one GPU per rank) when there are enough GPUs, else gloo on the
CPU. Per rank it writes ``metrics_rank<r>.json`` (per epoch: training time,
real tokens per second, mean training loss; validation loss before and
after training), rank 0 writes ``summary.json`` and ``metrics.jsonl`` (one
line per optimizer step), to ``<workdir>/out/data_parallel/<run>/``: one
folder per configuration, ``ws<N>`` and the options that differ from their
defaults (``ws2``, ``ws1``, ``ws2-epochs1``; ``project.options.run_name``).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if __package__ in (None, ""):  # run as `python project/run_data_parallel.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# no torch here: the library is imported where it runs, after the checks (project/__init__.py)
from common.startup import GPT2_IMPORTS
from common.files import atomic_path
from project import readiness
from project.cli import ConfigError, run_cli
from project.metrics import summarize
from project.options import (add_common_args, add_launch_args, add_training_args, check_training_args, check_world,
                             make_scheduler, new_parser, out_dir, prepare_run, run_name, steps_per_epoch)
from project.output import print_header, print_outcome, quiet_libraries, write_json

if TYPE_CHECKING:
    from project.launch import RankEnv

NAME = "data_parallel"
COMMAND = "project/run_data_parallel.py"


def build_parser() -> argparse.ArgumentParser:
    """The command line of this entry point (every option range-checked while parsing)."""
    parser = new_parser(COMMAND, __doc__)
    add_launch_args(parser)
    parser.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw",
                        help="sgd makes runs comparable to fp32 rounding (Adam amplifies noise in ~zero gradients)")
    parser.add_argument("--save_state", default=None,
                        help="rank 0 saves the final state_dict to this file (torch.save); None: not saved")
    add_common_args(parser, batch_size=32, n_epochs=3, lr=1e-3)
    add_training_args(parser)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``argv`` or ``sys.argv[1:]``); a bad option exits with code 2 and one line."""
    return build_parser().parse_args(argv)


def check_args(args: argparse.Namespace, world_size: int, n_train: int) -> None:
    """Raise ConfigError when the run cannot be split over ``world_size`` ranks."""
    check_world(world_size, n_train)
    if args.batch_size % world_size:
        raise ConfigError(f"--batch_size {args.batch_size} (global) is not divisible by world size {world_size}")
    if args.save_state and Path(args.save_state).is_dir():
        raise ConfigError(f"--save_state {args.save_state!r} is a folder; give a file name")


def resume_meta(args: argparse.Namespace, world_size: int) -> dict:
    """What a checkpoint of this run records and a ``--resume`` must match."""
    return {"entry": NAME, "world_size": world_size, "batch_size": args.batch_size, "grad_accum": args.grad_accum,
            "preset": args.preset, "optimizer": args.optimizer, "seed": args.seed}


def train_rank(env: RankEnv, args: argparse.Namespace) -> None:
    """One rank, top to bottom: join the group, load data and model, train, evaluate, write metrics."""
    import torch
    import torch.distributed as dist

    from data_parallel.comm import average_gradients
    from data_parallel.dataset import partition_dataset
    from project.data import make_collate, prepare_data
    from project.devices import thread_facts
    from project.launch import all_reduce_sum, join_group
    from project.loop import LoopParts, train
    from project.loss import lm_loss, validation_loss
    from project.model import build_model, count_parameters, enable_activation_checkpointing

    quiet_libraries()
    backend, device = join_group(env, args.backend)
    rank, world_size = env.rank, env.world_size
    quiet = args.quiet or rank != 0

    train_set, valid, tokenizer = prepare_data(args.dataset, args.tokenizer, Path(args.workdir), args.n_train,
                                               args.n_valid, args.seed)
    check_args(args, world_size, len(train_set))
    collate = make_collate(tokenizer, args.max_len)
    model = build_model(args.preset, tokenizer, args.pretrained, args.seed).to(device)
    if args.grad_ckpt:
        enable_activation_checkpointing(model)
    if args.optimizer == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loader = partition_dataset(rank, world_size, train_set, args.batch_size, collate)
    scheduler = make_scheduler(optimizer, args.lr_schedule,
                               args.n_epochs * steps_per_epoch(len(loader), args.grad_accum))
    folder = Path(args.out_dir)   # the run folder main chose
    spec, step_log, before = prepare_run(args, folder, rank, resume_meta(args, world_size),
                                         lambda: validation_loss(model, valid, collate, device, quiet))
    metrics = {"rank": rank, "world_size": world_size, "backend": backend, "device": str(device),
               "preset": args.preset, "parameters": count_parameters(model), "global_batch_size": args.batch_size,
               "grad_accum": args.grad_accum, "precision": args.precision, "grad_ckpt": args.grad_ckpt,
               **thread_facts(),
               "examples_on_rank": len(loader.dataset), "val_loss_before": before}
    parts = LoopParts(model=model, optimizer=optimizer, scheduler=scheduler, loader=loader, device=device,
                      loss_of=lambda batch, epoch, index: lm_loss(model(batch["input_ids"].to(device)),
                                                                  batch["labels"]),
                      reduce_grads=lambda: average_gradients(model), rank=rank, world_size=world_size,
                      all_reduce_sum=all_reduce_sum, barrier=dist.barrier, step_log=step_log)
    dist.barrier()
    result = train(parts, spec)
    step_log.close()
    metrics |= {"epochs": result["epochs"], "optimizer_steps": result["steps"], "rollbacks": result["rollbacks"],
                "stopped_early": result["stopped_early"],
                "val_loss_after": validation_loss(model, valid, collate, device, quiet)}
    write_json(folder / f"metrics_rank{rank}.json", metrics)
    if args.save_state and rank == 0:
        Path(args.save_state).parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(args.save_state) as scratch:
            torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, scratch)
    dist.barrier()   # every rank's metrics file is written
    if rank == 0:
        per_rank = [json.loads((folder / f"metrics_rank{r}.json").read_text()) for r in range(world_size)]
        write_json(folder / "summary.json", summarize(per_rank, keep=(
            "grad_accum", "precision", "grad_ckpt", "torch_threads", "thread_policy", "optimizer_steps",
            "rollbacks", "stopped_early")))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> dict | None:
    """Train on every rank; return the run summary (None on ranks other than torchrun's rank 0).

    Raises ConfigError for bad arguments and unwritten Problem 1 code before any rank starts.
    """
    args = parse_args(argv)
    readiness.ensure_ready(COMMAND, readiness.DATA_PARALLEL)
    from project.checkpoint import save_errors_in_one_line   # torch and the library: only after the checks
    from project.data import prepare_data
    from project.launch import launch_and_summarise, start_rank_server, world_of

    world_size, local_ranks, backend = world_of(args)
    start_rank_server(world_size, GPT2_IMPORTS)
    check_training_args(args, "cuda" if backend == "nccl" else "cpu", resume_meta(args, world_size))
    quiet_libraries()
    train_set, _, _ = prepare_data(args.dataset, args.tokenizer, Path(args.workdir), args.n_train, args.n_valid,
                                   args.seed)   # fails early on a bad dataset, and fills the caches the ranks read
    check_args(args, world_size, len(train_set))
    folder = out_dir(args, NAME, run_name(args, build_parser(), {"world_size": f"ws{world_size}"}))
    args.out_dir = str(folder)   # every rank writes here
    print_header(f"data parallel: {world_size} rank(s), backend {backend}, preset {args.preset}, global batch "
                 f"{args.batch_size} ({args.batch_size // world_size} per rank) x {args.grad_accum} accumulated, "
                 f"{args.n_epochs} epoch(s)")
    with save_errors_in_one_line():   # a rank's failed checkpoint write: one line, not its traceback
        summary = launch_and_summarise(train_rank, world_size, args, folder, GPT2_IMPORTS)
    if summary is None:
        return None
    print_outcome(summary, folder)
    return summary


if __name__ == "__main__":
    sys.exit(run_cli(main))
