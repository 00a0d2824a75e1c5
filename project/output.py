"""What a run shows and writes: progress bars, log lines, JSON files, the closing report.

Progress bars and log lines go through ``tqdm`` (so a line never breaks a
bar) and disappear with ``--quiet``; JSON files are written atomically
(``grading.kit.files.atomic_write``: a reader never sees half a file).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from grading.kit.files import atomic_write


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
