"""What a run shows and writes: progress, log lines, JSON files, the closing report.

Progress is decided here and only here: on a terminal (stderr is a tty) a
``tqdm`` bar, and log lines go through ``tqdm.write`` so they never break it;
anywhere else (a pipe, a log file, a batch job) plain lines, one every
``PLAIN_LINES``-th of the way and one at the end, so no carriage-return
frames bury the result lines. Both disappear with ``--quiet``. JSON files are
written atomically (``grading.kit.files.atomic_write``: a reader never sees
half a file).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Iterable, Iterator

from grading.kit.files import atomic_write

PLAIN_LINES = 10   # off a terminal: about this many progress lines per loop, plus the last one


def on_terminal() -> bool:
    """True when progress bars can be drawn: stderr (where tqdm draws) is a terminal."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):   # replaced or closed stream
        return False


def progress(iterable: Iterable, quiet: bool, desc: str = "", unit: str = "it", every: int | None = None,
             **kwargs):
    """``iterable`` with progress: a tqdm bar on a terminal, plain lines elsewhere, nothing when ``quiet``.

    Off a terminal a line ``<desc>: <n>/<total> <unit> (<seconds> s)`` goes
    to stderr as every ``every``-th item is handed out (default: a tenth of
    the length, at least 1; 50 when the length is unknown) and with the last
    one (length unknown: when the iterable is exhausted). ``kwargs`` go to
    tqdm.
    """
    if quiet:
        return iterable
    if on_terminal():
        from tqdm.auto import tqdm

        return tqdm(iterable, dynamic_ncols=True, leave=False, desc=desc, unit=unit, **kwargs)
    return _plain(iterable, desc, unit, every)


def _plain(iterable: Iterable, desc: str, unit: str, every: int | None) -> Iterator:
    try:
        total = len(iterable)   # type: ignore[arg-type]
    except TypeError:
        total = None
    every = every or (max(1, total // PLAIN_LINES) if total else 50)
    start, n, said = time.perf_counter(), 0, 0
    for n, item in enumerate(iterable, 1):
        if n % every == 0 or n == total:   # said when the item is handed out: callers may stop asking after the last
            said = n
            print(f"{desc or 'progress'}: {n}/{total if total is not None else '?'} {unit} "
                  f"({time.perf_counter() - start:.1f} s)", file=sys.stderr, flush=True)
        yield item
    if n != said:
        print(f"{desc or 'progress'}: {n}/{n} {unit} ({time.perf_counter() - start:.1f} s)", file=sys.stderr,
              flush=True)


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
