"""The options the entry points share, their checks, and the run they describe.

The shared options (``add_common_args``, ``add_launch_args``, ``add_training_args``), the checks parsing alone
cannot judge (``check_training_args``, ``check_world``), an entry point's parser (``new_parser``) and the folder a
run writes (``run_name``, ``out_dir``). Light at import, like ``project.cli``: torch and the library are imported
by the functions that run after the checks.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from project.cli import ConfigError, Parser, float_above, int_at_least, lr_spike, read_constant
from project.output import check_tensorboard

SCHEDULES = ("constant", "cosine")
# Options that never change a run's numbers: left out of its folder's name (``run_name``).
NOT_IN_RUN_NAME = frozenset({"workdir", "out_dir", "quiet", "backend", "devices", "timeline_steps", "save_every",
                             "save_dir", "keep_last", "resume", "max_steps", "tensorboard", "save_state",
                             "baseline_dir", "no_baseline", "timeout"})
# Short names of options in a run's folder name; an option not listed is named as it is spelled.
SHORT_NAMES = {"world_size": "ws", "n_epochs": "epochs", "batch_size": "batch", "n_chunk": "chunk",
               "n_stages": "stages", "grad_accum": "accum", "micro_batch": "micro", "lora_rank": "r",
               "lora_alpha": "alpha", "lora_targets": "lora", "zero_stage": "zero", "n_train": "train",
               "n_valid": "valid", "max_len": "len", "save_step": "save", "model_parallel_mode": "mode"}


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The entry points' ``--help``: the description as written, every option's default after its help text."""


def new_parser(prog: str, doc: str) -> Parser:
    """An entry point's parser: one-line errors (``project.cli.Parser``), the first paragraph of ``doc`` as its
    description, and ``(default: X)`` after every option's help text (``HelpFormatter``)."""
    return Parser(prog=prog, description=doc.split("\n\n")[0], formatter_class=HelpFormatter)


def add_common_args(parser: argparse.ArgumentParser, batch_size: int | None = 32, n_epochs: int = 3,
                    lr: float = 1e-3) -> argparse.ArgumentParser:
    """Add the data, model and training arguments every entry point shares; returns ``parser``.

    ``batch_size=None`` leaves out ``--batch_size`` (an entry point that derives it).
    Numeric options are range-checked while parsing (see ``project.cli``).
    """
    parser.add_argument("--workdir", default="workdir",
                        help="cache for data and tokenizer; runs write under <workdir>/out/")
    parser.add_argument("--out_dir", default=None,
                        help="metrics folder; None: <workdir>/out/<entry point>/<run name> (one per configuration)")
    parser.add_argument("--dataset", default=read_constant("project.data", "EMBEDDED"),
                        help="'embedded' (generated, offline), a folder of train/validation .jsonl files, "
                             "or a hub name such as bbaaaa/iwslt14-de-en-preprocess")
    parser.add_argument("--tokenizer", default="bpe", help="'bpe' (trained on the data) or a hub name like gpt2")
    parser.add_argument("--preset", default="tiny", choices=sorted(read_constant("project.model", "PRESETS")),
                        help="model size (gpt2: 124M parameters)")
    parser.add_argument("--pretrained", default=None,
                        help="load GPT2LMHeadModel weights, e.g. gpt2 (network); None: random weights from --seed")
    parser.add_argument("--n_train", type=int_at_least(1), default=None,
                        help="training pairs; None: the data set's (embedded: 4000)")
    parser.add_argument("--n_valid", type=int_at_least(1), default=None,
                        help="validation pairs; None: the data set's (embedded: 200)")
    parser.add_argument("--max_len", type=int_at_least(4), default=64, help="tokens per sequence at most")
    if batch_size is not None:
        parser.add_argument("--batch_size", type=int_at_least(1), default=batch_size,
                            help="global batch size (sequences) of one forward/backward")
    parser.add_argument("--n_epochs", type=int_at_least(1), default=n_epochs, help="passes over the training data")
    parser.add_argument("--lr", type=float_above(0.0), default=lr, help="learning rate")
    parser.add_argument("--seed", type=int_at_least(0), default=0, help="corpus and model-initialisation seed")
    parser.add_argument("--quiet", action="store_true", help="no progress bars, only the summary")
    return parser


def add_launch_args(parser: argparse.ArgumentParser, world_size: int = 2,
                    world_help: str = "ranks to start (under torchrun: its own)") -> argparse.ArgumentParser:
    """Add ``--world_size`` (default ``world_size``), ``--backend`` and ``--timeout`` (multi-rank entry points);
    returns ``parser``."""
    parser.add_argument("--world_size", type=int_at_least(1), default=world_size, help=world_help)
    parser.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto",
                        help="auto: nccl with a GPU per rank, else gloo (CPU)")
    parser.add_argument("--timeout", type=float_above(0.0), default=read_constant("common.rank_watch", "STILL_LIMIT_S"),
                        help="seconds every rank may wait at once (none using the CPU: a collective or receive no "
                             "other rank reaches) before the run ends naming where each rank waits")
    return parser


def add_training_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the options of long runs: accumulation, precision, checkpoints, metrics, guard.

    ``--grad_accum`` batches per optimizer step; ``--precision`` fp32/bf16/fp16
    (fp16: CUDA only); ``--grad_ckpt`` activation checkpointing of the GPT-2
    blocks; ``--save_every``/``--save_dir``/``--resume`` checkpoints;
    ``--max_steps`` stops early; ``--lr_schedule``; ``--tensorboard``;
    ``--spike_factor`` and ``--lr_spike`` (the divergence guard and a fault to test it).
    """
    parser.add_argument("--grad_accum", type=int_at_least(1), default=1,
                        help="batches accumulated per optimizer step")
    parser.add_argument("--precision", choices=read_constant("project.precision", "PRECISIONS"), default="fp32",
                        help="autocast precision (fp16 needs CUDA)")
    parser.add_argument("--grad_ckpt", action="store_true",
                        help="activation checkpointing of the GPT-2 blocks (recompute in backward)")
    parser.add_argument("--save_every", type=int_at_least(0), default=0,
                        help="write a checkpoint every N optimizer steps (0: never)")
    parser.add_argument("--save_dir", default=None, help="checkpoint folder; None: <run folder>/checkpoints")
    parser.add_argument("--keep_last", type=int_at_least(1), default=3,
                        help="checkpoints kept: older steps are removed after each successful save")
    parser.add_argument("--resume", default=None,
                        help="continue from a checkpoint folder (its newest intact step) or one step_N (verified); "
                             "None: start fresh")
    parser.add_argument("--max_steps", type=int_at_least(1), default=None,
                        help="stop after this many optimizer steps in total (checkpointed with --save_every); None: "
                             "all epochs")
    parser.add_argument("--lr_schedule", choices=SCHEDULES, default="constant",
                        help="constant, or cosine decay to 10%% of --lr over the run")
    parser.add_argument("--tensorboard", default=None,
                        help="also write TensorBoard event files to this folder; None: metrics.jsonl only")
    parser.add_argument("--spike_factor", type=float_above(0.0, inclusive=True), default=2.0,
                        help="divergence guard: refuse a step whose loss exceeds this x the recent median "
                             "(0: only non-finite losses)")
    parser.add_argument("--lr_spike", type=lr_spike, default=None, metavar="STEP:FACTOR",
                        help="fault injection: multiply the lr by FACTOR for optimizer step STEP, once; None: no fault")
    return parser


def check_training_args(args: argparse.Namespace, device_type: str, meta: dict) -> tuple[Path | None, dict | None]:
    """``(folder, its meta.json)`` of the verified ``step_<n>`` folder ``--resume`` names
    (``project.resume.resolve``; ``(None, None)``: no resume).

    Raises ConfigError for options that cannot work here, before any data is
    read or any rank starts: ``--workdir``/``--out_dir``/``--save_dir``
    naming a file, a ``--pretrained`` model whose config cannot be loaded,
    fp16 off CUDA, ``--tensorboard`` without the package, and a ``--resume``
    folder without a checkpoint or from a run whose ``meta`` (world size,
    batch size, accumulation, ...) differs. ``args`` is left as parsed.
    """
    from project import checkpoint
    from project.resume import resolve
    from project.precision import check_precision

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
    if args.resume is None:
        return None, None
    resume = resolve(args.resume)   # verified once here; the ranks load this step
    saved = checkpoint.read_meta(resume)
    changed = {k: (saved.get(k), v) for k, v in meta.items() if saved.get(k) != v}
    if changed:
        said = ", ".join(f"{k} {old} -> {new}" for k, (old, new) in changed.items())
        raise ConfigError(f"--resume {resume}: the checkpoint was written by a different run ({said}); "
                          f"resume with the same options")
    return resume, saved


def run_name(args: argparse.Namespace, parser: argparse.ArgumentParser, first: dict[str, str]) -> str:
    """The name of this run's folder: the parts of ``first`` (option -> the part that always names it, e.g.
    ``{"world_size": "ws2"}``; an empty part names nothing), then every other option that changes the
    numbers (not in ``NOT_IN_RUN_NAME``) whose value differs from the parser's default, joined by ``-``.

    Such an option is written as its ``SHORT_NAMES`` name (else as spelled) and its value: ``epochs1``,
    ``lr0.01``, ``precision_bf16`` (a string after ``_``, a path by its last part), a flag alone
    (``grad_ckpt``). So ``--world_size 2 --n_epochs 1`` is ``ws2-epochs1``, and the defaults are ``ws2``.
    """
    defaults = vars(parser.parse_args([]))   # as parsed: a string default has gone through the option's type
    parts = [part for part in first.values() if part]
    for key, value in vars(args).items():
        if key in NOT_IN_RUN_NAME or key in first or value == defaults.get(key):
            continue
        short = SHORT_NAMES.get(key, key)
        if value is True:
            parts.append(short)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            parts.append(f"{short}{value:g}")
        else:
            text = Path(value).name if isinstance(value, str) else "_".join(map(str, value or ()))
            parts.append(f"{short}_{''.join(c if c.isalnum() or c in '._' else '_' for c in text)}")
    return "-".join(parts)


def out_dir(args: argparse.Namespace, entry: str, name: str) -> Path:
    """The folder this run writes (created): ``--out_dir``, else ``<workdir>/out/<entry>/<name>`` (``run_name``).

    Each configuration has its own folder, so a run never replaces another configuration's results.
    """
    path = Path(args.out_dir) if args.out_dir else Path(args.workdir) / "out" / entry / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def check_world(world_size: int, n_train: int) -> None:
    """Raise ConfigError for a world size below 1 or larger than the training data (a rank would get nothing)."""
    if world_size < 1:
        raise ConfigError(f"--world_size must be at least 1, got {world_size}")
    if world_size > n_train:
        raise ConfigError(f"world size {world_size} is larger than the training data ({n_train} pairs): "
                          f"some ranks would get nothing")
