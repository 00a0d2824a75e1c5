"""Shared pieces of the entry points: arguments, loss, evaluation, metrics files, error exits.

Kept small on purpose: each ``run_*.py`` reads top to bottom (config, data,
model, loop, log) and only borrows these helpers.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Callable, Iterable

import torch
import torch.nn.functional as F

from project.data import EMBEDDED, IGNORE_INDEX, ConfigError


def add_common_args(parser: argparse.ArgumentParser, batch_size: int | None = 32, n_epochs: int = 3,
                    lr: float = 1e-3) -> argparse.ArgumentParser:
    """Add the data, model and training arguments every entry point shares; returns ``parser``.

    ``batch_size=None`` leaves out ``--batch_size`` (an entry point that derives it).
    """
    parser.add_argument("--workdir", default="workdir", help="cache for data and tokenizer (default: workdir)")
    parser.add_argument("--out_dir", default=None, help="metrics folder (default: <workdir>/out/<entry point>)")
    parser.add_argument("--dataset", default=EMBEDDED,
                        help="'embedded' (generated, offline), a folder of train/validation .jsonl files, "
                             "or a hub name such as bbaaaa/iwslt14-de-en-preprocess")
    parser.add_argument("--tokenizer", default="bpe", help="'bpe' (trained on the data) or a hub name like gpt2")
    parser.add_argument("--preset", default="tiny", help="model size: tiny, small or gpt2 (124M)")
    parser.add_argument("--pretrained", default=None, help="load GPT2LMHeadModel weights, e.g. gpt2 (network)")
    parser.add_argument("--n_train", type=int, default=None, help="training pairs (embedded default 4000)")
    parser.add_argument("--n_valid", type=int, default=None, help="validation pairs (embedded default 200)")
    parser.add_argument("--max_len", type=int, default=64, help="tokens per sequence at most")
    if batch_size is not None:
        parser.add_argument("--batch_size", type=int, default=batch_size, help="global batch size (sequences)")
    parser.add_argument("--n_epochs", type=int, default=n_epochs)
    parser.add_argument("--lr", type=float, default=lr)
    parser.add_argument("--seed", type=int, default=0, help="corpus and model-initialisation seed")
    parser.add_argument("--quiet", action="store_true", help="no progress bars, only the summary")
    return parser


def check_common_args(args: argparse.Namespace) -> None:
    """Raise ConfigError for out-of-range shared arguments."""
    for name in ("batch_size", "n_epochs", "max_len"):
        if hasattr(args, name) and getattr(args, name) < (4 if name == "max_len" else 1):
            raise ConfigError(f"--{name} must be at least {4 if name == 'max_len' else 1}, got {getattr(args, name)}")
    for name in ("n_train", "n_valid"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ConfigError(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.lr <= 0:
        raise ConfigError(f"--lr must be positive, got {args.lr}")


def out_dir(args: argparse.Namespace, name: str) -> Path:
    """The metrics folder of this run (created)."""
    path = Path(args.out_dir) if args.out_dir else Path(args.workdir) / "out" / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def logits_of(output) -> torch.Tensor:
    """The logits tensor of a Hugging Face model output (or the tensor itself)."""
    return output.logits if hasattr(output, "logits") else output


def lm_loss(output, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy on the labelled (target) tokens: mean over sequences of each sequence's mean.

    ``output`` is a model output with ``.logits`` or a logits tensor ``[B, T, V]``;
    ``labels`` is ``[B, T]`` with -100 where there is no loss. Position ``t``
    predicts ``labels[:, t + 1]``. Averaging per sequence first makes the
    mean over ranks of per-rank losses equal to the loss of the whole global
    batch when the ranks hold equally many sequences.
    """
    logits = logits_of(output)
    labels = labels.to(logits.device)
    per_token = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(),
                                ignore_index=IGNORE_INDEX, reduction="none").view(labels.shape[0], -1)
    counts = (labels[:, 1:] != IGNORE_INDEX).sum(dim=1)
    return (per_token.sum(dim=1) / counts.clamp(min=1)).mean()


@torch.no_grad()
def evaluate(forward: Callable[[torch.Tensor], object], examples: list, collate: Callable, batch_size: int,
             device: torch.device | str = "cpu", quiet: bool = True) -> float:
    """Token-level mean cross entropy of the targets of ``examples`` (a validation loss).

    ``forward(input_ids)`` returns logits or a model output; runs under
    ``no_grad``. Callers put the model in eval mode if it has dropout.
    A progress bar shows unless ``quiet``.
    """
    total, count = 0.0, 0
    for start in progress(range(0, len(examples), batch_size), quiet, desc="validation", unit="batch"):
        batch = collate(examples[start:start + batch_size])
        logits = logits_of(forward(batch["input_ids"].to(device)))
        labels = batch["labels"].to(logits.device)
        total += F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(),
                                 ignore_index=IGNORE_INDEX, reduction="sum").item()
        count += int((labels[:, 1:] != IGNORE_INDEX).sum())
    return total / max(count, 1)


def progress(iterable: Iterable, quiet: bool, **kwargs):
    """``tqdm(iterable, **kwargs)``, or the iterable itself when ``quiet``."""
    if quiet:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, dynamic_ncols=True, leave=False, **kwargs)


def log(message: str, quiet: bool = False) -> None:
    """Print a line without breaking progress bars (nothing when ``quiet``)."""
    if quiet:
        return
    from tqdm.auto import tqdm

    tqdm.write(message)


def write_json(path: Path, obj) -> None:
    """Write ``obj`` as indented JSON, atomically (a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    tmp.replace(path)


def cpu_threads_per_rank(local_ranks: int) -> int:
    """CPU threads each of ``local_ranks`` processes on this machine should use (at least 1)."""
    return max(1, (os.cpu_count() or 1) // max(local_ranks, 1))


def resolve_backend(backend: str, local_ranks: int) -> str:
    """``auto`` -> ``nccl`` when this machine has a GPU per local rank, else ``gloo``.

    Raises ConfigError for ``nccl`` without enough GPUs or an unknown backend.
    """
    if backend not in ("auto", "gloo", "nccl"):
        raise ConfigError(f"unknown backend {backend!r}; choose auto, gloo or nccl")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "nccl" and gpus < local_ranks:
        raise ConfigError(f"--backend nccl needs one GPU per rank ({local_ranks} here) but this machine has {gpus}; "
                          f"use --backend gloo (CPU) or --backend auto")
    if backend == "auto":
        return "nccl" if gpus >= local_ranks else "gloo"
    return backend


def torchrun_env() -> tuple[int, int, int, int] | None:
    """``(rank, world_size, local_rank, local_world_size)`` when started by torchrun (env:// variables), else None."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return (rank, world_size, int(os.environ.get("LOCAL_RANK", rank)),
            int(os.environ.get("LOCAL_WORLD_SIZE", world_size)))


def _spawned(index: int, target: Callable, world_size: int, init_method: str, args: argparse.Namespace) -> None:
    target(index, world_size, index, world_size, init_method, args)


def launch(target: Callable, world_size: int, args: argparse.Namespace, folder: Path) -> None:
    """Run ``target(rank, world_size, local_rank, local_world_size, init_method, args)`` on every rank.

    Under torchrun this process is one rank and rendezvous is ``env://``.
    Otherwise one rank runs in this process, or ``world_size`` ranks are
    spawned (``torch.multiprocessing``, start method ``spawn``), meeting over
    a file store in ``folder`` (no port needed). An exception in a spawned
    rank is re-raised here (``ProcessRaisedException``, with its traceback).
    """
    env = torchrun_env()
    if env is not None:
        rank, world, local_rank, local_world = env
        target(rank, world, local_rank, local_world, "env://", args)
        return
    store = Path(folder) / "rendezvous"
    store.unlink(missing_ok=True)
    init_method = f"file://{store.resolve()}"
    try:
        if world_size == 1:
            target(0, 1, 0, 1, init_method, args)
        else:
            import torch.multiprocessing as mp

            mp.start_processes(_spawned, args=(target, world_size, init_method, args), nprocs=world_size,
                               start_method="spawn")
    finally:
        store.unlink(missing_ok=True)


def launch_and_summarise(target: Callable, world_size: int, args: argparse.Namespace,
                         folder: Path) -> dict | None:
    """Clear old metrics in ``folder``, ``launch`` the ranks, and return rank 0's ``summary.json``.

    Returns None in torchrun processes other than rank 0 (they have no summary to report).
    """
    env = torchrun_env()
    if env is None or env[0] == 0:
        for old in [*folder.glob("metrics_rank*.json"), folder / "summary.json"]:
            old.unlink(missing_ok=True)
    launch(target, world_size, args, folder)
    if env is not None and env[0] != 0:
        return None
    return json.loads((folder / "summary.json").read_text())


def print_epochs(metrics: dict) -> None:
    """One line per epoch (train loss, real tokens/s, time) of an entry point's metrics."""
    for e in metrics["epochs"]:
        print(f"  epoch {e['epoch']}: train loss {e['train_loss']:.4f}  {e['tokens_per_s']:,.0f} tokens/s "
              f"({e['train_time_s']:.1f} s)")


def quiet_libraries() -> None:
    """Silence library chatter that is not ours (dataset-building bars, transformers' padding advice)."""
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()


def run_cli(main: Callable[[list[str] | None], object], argv: list[str] | None = None) -> int:
    """Run ``main(argv)``; a ConfigError becomes ``error: ...`` on stderr and exit code 2 (no traceback)."""
    try:
        main(argv)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
