"""What a run shows and writes: progress, log lines, JSON files, the closing report.

Progress is decided here and only here: on a terminal (stderr is a tty) a
``tqdm`` bar, and log lines go through ``tqdm.write`` so they never break it;
anywhere else (a pipe, a log file, a batch job) no progress at all, only the
log lines (the training loop's one line per epoch), so nothing buries the
result lines. Bars and log lines disappear with ``--quiet``. JSON files are
written atomically (``common.files.atomic_write``: a reader never sees
half a file).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Iterable

from common.files import atomic_write

def on_terminal() -> bool:
    """True when progress bars can be drawn: stderr (where tqdm draws) is a terminal."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):   # replaced or closed stream
        return False


def progress(iterable: Iterable, quiet: bool, desc: str = "", unit: str = "it", **kwargs) -> Iterable:
    """``iterable`` with progress: a tqdm bar (``desc``, ``unit``, ``kwargs``) on a terminal; ``iterable``
    itself, with no output, when ``quiet`` or off a terminal (a pipe or a log file gets no per-item lines)."""
    if quiet or not on_terminal():
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, dynamic_ncols=True, leave=False, desc=desc, unit=unit, **kwargs)


def log(message: str, quiet: bool = False) -> None:
    """Print a line (through ``tqdm.write`` on a terminal, so a bar is not broken); nothing when ``quiet``."""
    if quiet:
        return
    if on_terminal():
        from tqdm.auto import tqdm

        tqdm.write(message)
    else:
        print(message, flush=True)


def write_json(path: Path, obj, indent: int = 2) -> None:
    """Write ``obj`` as indented JSON to ``path`` (folders created), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(obj, indent=indent) + "\n")


def print_header(line: str) -> None:
    """Print a run's first line, before its ranks start; under torchrun only on rank 0 (each rank runs main)."""
    from project.cli import torchrun_rank

    started = torchrun_rank()
    if started is None or started[0] == 0:
        print(line, flush=True)


def print_outcome(metrics: dict, where: Path | str) -> None:
    """The end of a run's report: its epochs and optimizer steps, the validation loss before -> after,
    rollbacks, and where the files are (``wrote: <where>``)."""
    print_epochs(metrics)
    if "optimizer_steps" in metrics:
        print(f"  {metrics['optimizer_steps']} optimizer step(s)" + (" (stopped early)" if metrics.get(
            "stopped_early") else ""))
    print(f"  validation loss {metrics['val_loss_before']:.4f} -> {metrics['val_loss_after']:.4f}")
    if metrics.get("rollbacks"):
        print(f"  divergence guard: {metrics['rollbacks']} rollback(s), see metrics.jsonl")
    print(f"  wrote: {where}")


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
