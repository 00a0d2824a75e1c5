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

from project.cli import float_above, int_at_least, lr_spike
from project.data import EMBEDDED, IGNORE_INDEX, ConfigError
from project.devices import cpu_threads_per_rank, resolve_backend  # noqa: F401 - part of this module's API
from project.precision import PRECISIONS, check_precision

SCHEDULES = ("constant", "cosine")


def add_common_args(parser: argparse.ArgumentParser, batch_size: int | None = 32, n_epochs: int = 3,
                    lr: float = 1e-3) -> argparse.ArgumentParser:
    """Add the data, model and training arguments every entry point shares; returns ``parser``.

    ``batch_size=None`` leaves out ``--batch_size`` (an entry point that derives it).
    Numeric options are range-checked while parsing (see ``project.cli``).
    """
    from project.model import PRESETS

    parser.add_argument("--workdir", default="workdir", help="cache for data and tokenizer (default: workdir)")
    parser.add_argument("--out_dir", default=None, help="metrics folder (default: <workdir>/out/<entry point>)")
    parser.add_argument("--dataset", default=EMBEDDED,
                        help="'embedded' (generated, offline), a folder of train/validation .jsonl files, "
                             "or a hub name such as bbaaaa/iwslt14-de-en-preprocess")
    parser.add_argument("--tokenizer", default="bpe", help="'bpe' (trained on the data) or a hub name like gpt2")
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS), help="model size (gpt2: 124M)")
    parser.add_argument("--pretrained", default=None, help="load GPT2LMHeadModel weights, e.g. gpt2 (network)")
    parser.add_argument("--n_train", type=int_at_least(1), default=None, help="training pairs (embedded default 4000)")
    parser.add_argument("--n_valid", type=int_at_least(1), default=None, help="validation pairs (embedded default 200)")
    parser.add_argument("--max_len", type=int_at_least(4), default=64, help="tokens per sequence at most")
    if batch_size is not None:
        parser.add_argument("--batch_size", type=int_at_least(1), default=batch_size,
                            help="global batch size (sequences) of one forward/backward")
    parser.add_argument("--n_epochs", type=int_at_least(1), default=n_epochs)
    parser.add_argument("--lr", type=float_above(0.0), default=lr)
    parser.add_argument("--seed", type=int_at_least(0), default=0, help="corpus and model-initialisation seed")
    parser.add_argument("--quiet", action="store_true", help="no progress bars, only the summary")
    return parser


def add_launch_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--world_size`` and ``--backend`` (multi-rank entry points); returns ``parser``."""
    parser.add_argument("--world_size", type=int_at_least(1), default=2,
                        help="ranks to start (under torchrun: its own)")
    parser.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto",
                        help="auto: nccl with a GPU per rank, else gloo (CPU)")
    return parser


def add_training_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the options of long runs (issue 15): accumulation, precision, checkpoints, metrics, guard.

    ``--grad_accum`` batches per optimizer step; ``--precision`` fp32/bf16/fp16
    (fp16: CUDA only); ``--grad_ckpt`` activation checkpointing of the GPT-2
    blocks; ``--save_every``/``--save_dir``/``--resume`` checkpoints;
    ``--max_steps`` stops early; ``--lr_schedule``; ``--tensorboard``;
    ``--spike_factor`` and ``--lr_spike`` (the divergence guard and a fault to test it).
    """
    parser.add_argument("--grad_accum", type=int_at_least(1), default=1,
                        help="batches accumulated per optimizer step (default 1)")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32",
                        help="autocast precision (fp16 needs CUDA)")
    parser.add_argument("--grad_ckpt", action="store_true",
                        help="activation checkpointing of the GPT-2 blocks (recompute in backward)")
    parser.add_argument("--save_every", type=int_at_least(0), default=0,
                        help="write a checkpoint every N optimizer steps (0: never)")
    parser.add_argument("--save_dir", default=None, help="checkpoint folder (default: <out_dir>/checkpoints)")
    parser.add_argument("--resume", default=None, help="continue from a checkpoint folder (its 'latest' or a step_N)")
    parser.add_argument("--max_steps", type=int_at_least(1), default=None,
                        help="stop after this many optimizer steps in total (checkpointed with --save_every)")
    parser.add_argument("--lr_schedule", choices=SCHEDULES, default="constant",
                        help="constant, or cosine decay to 10%% of --lr over the run")
    parser.add_argument("--tensorboard", default=None, help="also write TensorBoard event files to this folder")
    parser.add_argument("--spike_factor", type=float_above(0.0, inclusive=True), default=2.0,
                        help="divergence guard: refuse a step whose loss exceeds this x the recent median "
                             "(0: only non-finite losses)")
    parser.add_argument("--lr_spike", type=lr_spike, default=None, metavar="STEP:FACTOR",
                        help="fault injection: multiply the lr by FACTOR for optimizer step STEP, once")
    return parser


def check_training_args(args: argparse.Namespace, device_type: str, meta: dict) -> None:
    """Raise ConfigError for options that cannot work here, before any data is read or any rank starts.

    ``--workdir``/``--out_dir``/``--save_dir`` naming a file, a
    ``--pretrained`` model whose config cannot be loaded, fp16 off CUDA,
    ``--tensorboard`` without the package, and a ``--resume`` folder without
    a checkpoint or from a run whose ``meta`` (world size, batch size,
    accumulation, ...) differs.
    """
    from project import checkpoint
    from project.metrics import check_tensorboard

    for name in ("workdir", "out_dir", "save_dir"):
        if getattr(args, name) is not None and Path(getattr(args, name)).is_file():
            raise ConfigError(f"--{name} {getattr(args, name)!r} is a file, not a folder")
    if args.pretrained:
        from transformers import AutoConfig

        try:
            AutoConfig.from_pretrained(args.pretrained)
        except Exception as exc:  # noqa: BLE001 - any failure means the weights cannot be loaded either
            raise ConfigError(f"--pretrained {args.pretrained!r}: cannot load its config ({type(exc).__name__}); "
                              f"the presets (--preset tiny|small|gpt2) need no network") from None
    check_precision(args.precision, device_type)
    check_tensorboard(args.tensorboard)
    if args.resume is not None:
        saved = checkpoint.read_meta(checkpoint.resolve(args.resume))
        changed = {k: (saved.get(k), v) for k, v in meta.items() if saved.get(k) != v}
        if changed:
            said = ", ".join(f"{k} {old} -> {new}" for k, (old, new) in changed.items())
            raise ConfigError(f"--resume {args.resume}: the checkpoint was written by a different run ({said}); "
                              f"resume with the same options")


def save_dir(args: argparse.Namespace, folder: Path) -> Path:
    """The checkpoint root of this run: ``--save_dir`` or ``<metrics folder>/checkpoints``."""
    return Path(args.save_dir) if args.save_dir else Path(folder) / "checkpoints"


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


def validation_loss(model: torch.nn.Module, examples: list, collate: Callable, device: torch.device | str,
                    quiet: bool = True, forward: Callable | None = None, batch_size: int = 64) -> float:
    """``evaluate`` with ``model`` in eval mode (dropout off), back in train mode afterwards.

    ``forward`` (default: ``model``) is what the inputs go through, e.g. a pipeline wrapping the model.
    """
    model.eval()
    try:
        return evaluate(forward or model, examples, collate, batch_size, device, quiet)
    finally:
        model.train()


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


def torchrun_env() -> tuple[int, int, int, int] | None:
    """``(rank, world_size, local_rank, local_world_size)`` when started by torchrun (env:// variables), else None."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return (rank, world_size, int(os.environ.get("LOCAL_RANK", rank)),
            int(os.environ.get("LOCAL_WORLD_SIZE", world_size)))


def world_of(args: argparse.Namespace) -> tuple[int, int, str]:
    """``(world_size, local_ranks, backend)`` of this launch: torchrun's sizes, else ``--world_size``.

    The backend is ``--backend`` resolved (``resolve_backend``; ConfigError for nccl without enough GPUs).
    """
    env = torchrun_env()
    world_size, local_ranks = (env[1], env[3]) if env else (args.world_size, args.world_size)
    return world_size, local_ranks, resolve_backend(args.backend, local_ranks)


def check_world(world_size: int, n_train: int) -> None:
    """Raise ConfigError for a world size below 1 or larger than the training data (a rank would get nothing)."""
    if world_size < 1:
        raise ConfigError(f"--world_size must be at least 1, got {world_size}")
    if world_size > n_train:
        raise ConfigError(f"world size {world_size} is larger than the training data ({n_train} pairs): "
                          f"some ranks would get nothing")


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


def join_group(rank: int, world_size: int, local_rank: int, local_ranks: int, init_method: str,
               backend: str, student_setup: bool = True) -> tuple[str, torch.device]:
    """Join the process group; return ``(backend, device)``.

    With ``student_setup`` through the student's ``setup_process_group``
    (Problem 1.2), else with ``torch.distributed`` directly (entry points that
    do not depend on Problem 1). ``backend`` ``auto`` resolves as
    ``resolve_backend`` says; on gloo the CPU thread policy applies
    (``project.devices.THREAD_POLICY``) and DeepSpeed, if it is imported
    later, is pointed at the CPU; NCCL ranks get ``cuda:<local_rank>``.
    """
    import datetime

    import torch.distributed as dist

    backend = resolve_backend(backend, local_ranks)
    if backend == "gloo":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")   # gloo means CPU tensors (matters only to DeepSpeed)
        torch.set_num_threads(cpu_threads_per_rank(local_ranks))
    timeout = datetime.timedelta(minutes=10)
    if student_setup:
        from data_parallel.comm import setup_process_group
        setup_process_group(rank, world_size, backend, init_method=init_method, timeout=timeout)
    else:
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timeout)
    return backend, torch.device(f"cuda:{local_rank}") if backend == "nccl" else torch.device("cpu")


def print_outcome(metrics: dict, where: Path | str) -> None:
    """The end of a run's report: its epochs, the validation loss before -> after, rollbacks, where the files are."""
    print_epochs(metrics)
    print(f"  validation loss {metrics['val_loss_before']:.4f} -> {metrics['val_loss_after']:.4f}")
    if metrics.get("rollbacks"):
        print(f"  divergence guard: {metrics['rollbacks']} rollback(s), see metrics.jsonl")
    print(f"  metrics: {where}")


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
    """Run ``main(argv)``; a ConfigError becomes one line ``error: ...`` on stderr and exit code 2 (no traceback)."""
    try:
        main(argv)
    except ConfigError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    return 0
