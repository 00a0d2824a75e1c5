"""Data-parallel GPT-2 training with your Problem 1 code.

    python project/run_data_parallel.py --world_size 2            # starts 2 ranks itself
    torchrun --nproc_per_node 2 project/run_data_parallel.py     # or let torchrun start them

Each rank joins the group with your ``setup_process_group``, trains the same model on its ``partition_dataset``
slice of every global batch (``--batch_size`` is global, per forward/backward) and averages gradients with your
``average_gradients`` once per optimizer step (after ``--grad_accum`` batches). Per rank it writes
``metrics_rank<r>.json`` (per epoch: training time, real tokens per second, mean training loss; validation loss
before and after training), rank 0 ``metrics.jsonl`` (one line per optimizer step) and the launching process
``summary.json``, to ``<workdir>/out/data_parallel/<run>/``: one folder per configuration, ``ws<N>`` and the
options that differ from their defaults (``ws2``, ``ws1``, ``ws2-epochs1``).
"""
from __future__ import annotations

import argparse
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
from project.config import RunConfig
from project.options import (add_common_args, add_launch_args, add_training_args, check_training_args, check_world,
                             new_parser, out_dir, run_name)
from project.output import print_header, print_outcome, quiet_libraries, summarize, write_json

if TYPE_CHECKING:
    from project.devices import RankEnv

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


def train_rank(env: RankEnv, config: RunConfig, data: tuple) -> None:
    """One rank, top to bottom: group, data, model, optimizer, the training loop, evaluation, outputs."""
    import torch
    import torch.distributed as dist

    from data_parallel.comm import average_gradients
    from data_parallel.dataset import partition_dataset
    from project.devices import all_reduce_sum, join_group, thread_facts
    from project.loop import LoopParts, make_scheduler, prepare_run, train
    from project.model import build_model, count_parameters, enable_activation_checkpointing, lm_loss, validation_loss

    quiet_libraries()
    _, device = join_group(env, config.backend)   # process group: your setup_process_group (Problem 1.2)
    rank, world_size = env.rank, env.world_size
    quiet = config.quiet or rank != 0

    train_set, valid, tokenizer, collate = data                                         # data (main prepared it)
    loader = partition_dataset(rank, world_size, train_set, config.batch_size, collate)
    model = build_model(config.preset, tokenizer, config.pretrained, config.seed).to(device)   # model
    if config.grad_ckpt:
        enable_activation_checkpointing(model)
    n_params = count_parameters(model)
    if config.optimizer == "sgd":                                                       # optimizer
        optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    scheduler = make_scheduler(optimizer, config, len(loader))

    spec, step_log, before = prepare_run(config, rank,                                    # the training loop
                                         lambda: validation_loss(model, valid, collate, device, quiet))
    parts = LoopParts(model=model, optimizer=optimizer, scheduler=scheduler, loader=loader, device=device,
                      loss_of=lambda batch, epoch, index: lm_loss(model(batch["input_ids"].to(device)),
                                                                  batch["labels"]),
                      reduce_grads=lambda: average_gradients(model), rank=rank, world_size=world_size,
                      all_reduce_sum=all_reduce_sum, barrier=dist.barrier, step_log=step_log)
    dist.barrier()
    result = train(parts, spec)
    step_log.close()
    after = validation_loss(model, valid, collate, device, quiet)                      # evaluation

    folder = config.out_dir                                                             # outputs
    write_json(folder / f"metrics_rank{rank}.json", {
        "rank": rank, "world_size": world_size, "backend": config.backend, "device": str(device),
        "preset": config.preset, "parameters": n_params, "global_batch_size": config.batch_size,
        "grad_accum": config.grad_accum, "precision": config.precision, "grad_ckpt": config.grad_ckpt,
        **thread_facts(), "examples_on_rank": len(loader.dataset), "val_loss_before": before,
        "epochs": result["epochs"], "optimizer_steps": result["steps"], "rollbacks": result["rollbacks"],
        "stopped_early": result["stopped_early"], "val_loss_after": after})
    if config.save_state and rank == 0:
        Path(config.save_state).parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(config.save_state) as scratch:
            torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, scratch)
    dist.barrier()   # every rank's metrics file is written
    dist.destroy_process_group()


def summarize_data_parallel(per_rank: list[dict]) -> dict:
    """``project.output.summarize`` of the ranks' metrics, with the training options they share."""
    return summarize(per_rank, keep=("grad_accum", "precision", "grad_ckpt", "torch_threads", "thread_policy",
                                     "optimizer_steps", "rollbacks", "stopped_early"))


def main(argv: list[str] | None = None) -> dict | None:
    """Train on every rank; return the run summary (None on ranks other than torchrun's rank 0).

    Raises ConfigError for bad arguments and unwritten Problem 1 code before any rank starts.
    """
    args = build_parser().parse_args(argv)   # a bad option exits with code 2 and one line
    readiness.ensure_ready(COMMAND, readiness.DATA_PARALLEL)
    from project.resume import save_errors_in_one_line   # torch and the library: only after the checks
    from project.data import make_collate, prepare_data
    from project.launch import launch_and_summarise, start_rank_server, world_of

    world_size, local_ranks, backend = world_of(args)
    start_rank_server(world_size, GPT2_IMPORTS)
    meta = resume_meta(args, world_size)
    resume, checkpoint_meta = check_training_args(args, "cuda" if backend == "nccl" else "cpu", meta)
    quiet_libraries()
    train_set, valid, tokenizer = prepare_data(args.dataset, args.tokenizer, Path(args.workdir), args.n_train,
                                               args.n_valid, args.seed)   # once: every rank receives it
    check_args(args, world_size, len(train_set))
    folder = out_dir(args, NAME, run_name(args, build_parser(), {"world_size": f"ws{world_size}"}))
    config = RunConfig.of(args, world_size=world_size, backend=backend, resume=resume, checkpoint_meta=checkpoint_meta,
                          out_dir=folder, meta=meta)
    print_header(f"data parallel: {world_size} rank(s), backend {backend}, preset {args.preset}, global batch "
                 f"{args.batch_size} ({args.batch_size // world_size} per rank) x {args.grad_accum} accumulated, "
                 f"{args.n_epochs} epoch(s)")
    with save_errors_in_one_line():   # a rank's failed checkpoint write: one line, not its traceback
        summary = launch_and_summarise(train_rank, config, (train_set, valid, tokenizer,
                                                            make_collate(tokenizer, args.max_len)),
                                       summarize_data_parallel, GPT2_IMPORTS)
    if summary is None:
        return None
    print_outcome(summary, folder)
    return summary


if __name__ == "__main__":
    sys.exit(run_cli(main))
