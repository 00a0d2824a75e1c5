"""Data-parallel GPT-2 training with your Problem 1 code.

    python project/run_data_parallel.py --world_size 2            # starts 2 ranks itself
    torchrun --nproc_per_node 2 project/run_data_parallel.py     # or let torchrun start them

Each rank trains the same model on its ``partition_dataset`` slice of every
global batch (``--batch_size`` is global) through ``train_step``, which calls
your ``average_gradients``. Backend ``auto`` picks NCCL (one GPU per rank)
when there are enough GPUs, else gloo on the CPU. Per rank it writes
``metrics_rank<r>.json`` (per epoch: training time, real tokens per second,
mean training loss; validation loss before and after training), and rank 0
writes ``summary.json``, to ``<workdir>/out/data_parallel/world<N>/``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as `python project/run_data_parallel.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from project.data import ConfigError, make_collate, prepare_data
from project.model import build_model, count_parameters
from project.train_lib import (add_common_args, check_common_args, cpu_threads_per_rank, evaluate,
                               launch_and_summarise, lm_loss, log, out_dir, print_epochs, progress, quiet_libraries,
                               resolve_backend, run_cli, torchrun_env, write_json)

NAME = "data_parallel"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``argv`` or ``sys.argv[1:]``); argparse exits with code 2 on malformed options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world_size", type=int, default=2, help="ranks to start (under torchrun: its own)")
    parser.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    parser.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw",
                        help="sgd makes runs comparable to fp32 rounding (Adam amplifies noise in ~zero gradients)")
    parser.add_argument("--save_state", default=None, help="rank 0 saves the final state_dict here (torch.save)")
    add_common_args(parser, batch_size=32, n_epochs=3, lr=1e-3)
    return parser.parse_args(argv)


def check_args(args: argparse.Namespace, world_size: int, n_train: int) -> None:
    """Raise ConfigError when the run cannot be split over ``world_size`` ranks."""
    if world_size < 1:
        raise ConfigError(f"--world_size must be at least 1, got {world_size}")
    if world_size > n_train:
        raise ConfigError(f"world size {world_size} is larger than the training data ({n_train} pairs): "
                          f"some ranks would get nothing")
    if args.batch_size % world_size:
        raise ConfigError(f"--batch_size {args.batch_size} (global) is not divisible by world size {world_size}")


def train_rank(rank: int, world_size: int, local_rank: int, local_ranks: int, init_method: str,
               args: argparse.Namespace) -> None:
    """One rank, top to bottom: join the group, load data and model, train, evaluate, write metrics."""
    from data_parallel.comm import setup_process_group, train_step
    from data_parallel.dataset import partition_dataset
    import torch.distributed as dist

    quiet_libraries()
    backend = resolve_backend(args.backend, local_ranks)
    if backend == "gloo":
        torch.set_num_threads(cpu_threads_per_rank(local_ranks))
    setup_process_group(rank, world_size, backend, init_method=init_method, timeout=datetime.timedelta(minutes=10))
    device = torch.device(f"cuda:{local_rank}") if backend == "nccl" else torch.device("cpu")
    quiet = args.quiet or rank != 0

    train, valid, tokenizer = prepare_data(args.dataset, args.tokenizer, Path(args.workdir), args.n_train,
                                           args.n_valid, args.seed)
    check_args(args, world_size, len(train))
    collate = make_collate(tokenizer, args.max_len)
    model = build_model(args.preset, tokenizer, args.pretrained, args.seed).to(device)
    if args.optimizer == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loader = partition_dataset(rank, world_size, train, args.batch_size, collate)

    def validation_loss() -> float:
        model.eval()
        loss = evaluate(model, valid, collate, 64, device, quiet)
        model.train()
        return loss

    metrics = {"rank": rank, "world_size": world_size, "backend": backend, "device": str(device),
               "preset": args.preset, "parameters": count_parameters(model), "global_batch_size": args.batch_size,
               "examples_on_rank": len(loader.dataset), "val_loss_before": validation_loss(), "epochs": []}
    for epoch in range(args.n_epochs):
        dist.barrier()
        start, tokens, losses = time.perf_counter(), 0, []
        for batch in progress(loader, quiet, desc=f"epoch {epoch}", unit="batch"):
            inputs, labels = batch["input_ids"].to(device), batch["labels"].to(device)
            losses.append(train_step(model, optimizer, inputs, labels, lm_loss))
            tokens += int(batch["attention_mask"].sum())   # real tokens, no padding
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
        metrics["epochs"].append({"epoch": epoch, "train_time_s": seconds, "tokens": tokens,
                                  "tokens_per_s": tokens / seconds, "train_loss": sum(losses) / max(len(losses), 1),
                                  "steps": len(losses)})
        log(f"rank {rank} epoch {epoch}: train loss {metrics['epochs'][-1]['train_loss']:.4f}, "
            f"{tokens / seconds:,.0f} tokens/s, {seconds:.1f} s", args.quiet)
    metrics["val_loss_after"] = validation_loss()
    folder = out_dir(args, f"{NAME}/world{world_size}")
    write_json(folder / f"metrics_rank{rank}.json", metrics)
    if args.save_state and rank == 0:
        Path(args.save_state).parent.mkdir(parents=True, exist_ok=True)
        torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, args.save_state)
    dist.barrier()   # every rank's metrics file is written
    if rank == 0:
        per_rank = [json.loads((folder / f"metrics_rank{r}.json").read_text()) for r in range(world_size)]
        write_json(folder / "summary.json", summarize(per_rank))
    dist.destroy_process_group()


def summarize(per_rank: list[dict]) -> dict:
    """Whole-run numbers from the per-rank metrics: per epoch, all ranks' tokens over the slowest rank's time."""
    epochs = []
    for e in range(len(per_rank[0]["epochs"])):
        rows = [m["epochs"][e] for m in per_rank]
        seconds = max(r["train_time_s"] for r in rows)
        tokens = sum(r["tokens"] for r in rows)
        epochs.append({"epoch": e, "train_time_s": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
                       "train_loss": sum(r["train_loss"] for r in rows) / len(rows)})
    return {"world_size": per_rank[0]["world_size"], "backend": per_rank[0]["backend"],
            "preset": per_rank[0]["preset"], "epochs": epochs,
            "val_loss_before": per_rank[0]["val_loss_before"], "val_loss_after": per_rank[0]["val_loss_after"]}


def main(argv: list[str] | None = None) -> dict | None:
    """Train on every rank; return the run summary (None on ranks other than torchrun's rank 0).

    Raises ConfigError for bad arguments before any rank starts.
    """
    args = parse_args(argv)
    env = torchrun_env()
    world_size, local_ranks = (env[1], env[3]) if env else (args.world_size, args.world_size)
    check_common_args(args)
    resolve_backend(args.backend, local_ranks)
    quiet_libraries()
    train, _, _ = prepare_data(args.dataset, args.tokenizer, Path(args.workdir), args.n_train, args.n_valid,
                               args.seed)   # fails early on a bad dataset, and fills the caches the ranks read
    check_args(args, world_size, len(train))
    folder = out_dir(args, f"{NAME}/world{world_size}")
    summary = launch_and_summarise(train_rank, world_size, args, folder)
    if summary is None:
        return None
    print(f"data parallel: {world_size} rank(s), backend {summary['backend']}, preset {summary['preset']}")
    print_epochs(summary)
    print(f"  validation loss {summary['val_loss_before']:.4f} -> {summary['val_loss_after']:.4f}")
    print(f"  metrics: {folder}")
    return summary


if __name__ == "__main__":
    sys.exit(run_cli(main))
