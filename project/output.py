"""What a run shows and writes: progress, log lines, JSON files, ``metrics.jsonl``, the closing report.

On a terminal progress is a ``tqdm`` bar and log lines go through ``tqdm.write``; anywhere else only the log lines;
``--quiet`` drops both. Files are written atomically (``common.files.atomic_write``).
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Callable, Iterable

from common.files import atomic_write, read_jsonl
from project.cli import ConfigError

GUARD_EVENT = "divergence"
GUARD_ACTIONS = ("rollback", "skip", "keep")
STEP_KEYS = ("step", "loss", "grad_norm", "lr", "step_time_s", "tokens_per_s", "peak_mem_bytes")
METRICS_FILE = "metrics.jsonl"


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


def check_tensorboard(folder: str | None) -> None:
    """Raise ConfigError when ``--tensorboard`` names a file, or the ``tensorboard`` package is not installed."""
    if folder is not None and Path(folder).is_file():
        raise ConfigError(f"--tensorboard {folder!r} is a file; give a folder for the event files")
    if folder is not None and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("--tensorboard needs the optional 'tensorboard' package (pip install tensorboard); "
                          "metrics.jsonl is written without it")


class StepLog:
    """Appends step and event lines to ``<folder>/metrics.jsonl`` (and TensorBoard scalars when asked).

    One JSON object per line: a step line with the keys of ``STEP_KEYS``, or an event line with ``event``. The
    divergence guard's (``GUARD_EVENT``) says what became of the refused step (``action``, one of ``GUARD_ACTIONS``:
    ``rollback`` to ``restored_step``; ``skip``, no checkpoint old enough; ``keep``, an engine had applied the update
    already).

    ``resume_step``: keep the existing lines up to that step (a resumed run
    continues the file; lines a crashed run wrote after its checkpoint are
    dropped); None starts a fresh file. ``enabled=False`` (ranks other than 0)
    writes nothing.
    """

    def __init__(self, folder: Path, enabled: bool = True, resume_step: int | None = None,
                 tensorboard: str | None = None):
        self.path = Path(folder) / METRICS_FILE
        self.enabled = enabled
        self._writer = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if resume_step is not None and self.path.exists():   # a torn last line (killed mid-write) is dropped
            kept = [json.dumps(r) for r in read_jsonl(self.path)[0]
                    if isinstance(r, dict) and r.get("step", 0) <= resume_step]
        atomic_write(self.path, "".join(line + "\n" for line in kept))
        if tensorboard is not None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(tensorboard)

    def step(self, record: dict) -> None:
        """Append one optimizer step's metrics (must hold ``STEP_KEYS``)."""
        missing = [k for k in STEP_KEYS if k not in record]
        if missing:
            raise ValueError(f"step record lacks {missing}")
        self._write(record)
        if self._writer is not None:
            for key in ("loss", "grad_norm", "lr", "tokens_per_s", "peak_mem_bytes"):
                if record[key] is not None:
                    self._writer.add_scalar(f"train/{key}", record[key], record["step"])

    def event(self, name: str, **fields) -> None:
        """Append an event line ``{"event": name, **fields}`` (e.g. a rollback of the divergence guard)."""
        self._write({"event": name, **fields})

    def _write(self, record: dict) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def close(self) -> None:
        """Flush and close the TensorBoard writer, if any."""
        if self._writer is not None:
            self._writer.close()


def _stderr(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def read_steps(path: Path, warn: Callable[[str], None] = _stderr) -> tuple[list[dict], list[dict]]:
    """``(step lines, event lines)`` of a ``metrics.jsonl`` file.

    Tolerant: a torn last line (a run killed mid-write) or a damaged line is
    skipped with one ``warn(message)`` (default: a ``warning:`` line on
    stderr) and the rest is read; so are lines without a step number.
    """
    records, warnings = read_jsonl(path)
    for message in warnings:
        warn(message)
    rows = [r for r in records if isinstance(r, dict) and isinstance(r.get("step"), int)]
    return [r for r in rows if "event" not in r], [r for r in rows if "event" in r]


def summarize(per_rank: list[dict], keep: tuple[str, ...] = ()) -> dict:
    """Run-level numbers from per-rank metrics: per epoch all ranks' tokens over the slowest rank's time.

    Per epoch also rank 0's ``steps`` and ``micro_batches`` when the ranks record them.
    Keeps ``world_size``, ``backend``, ``preset``, the validation losses of
    rank 0 and, from rank 0, every key named in ``keep``.
    """
    first = per_rank[0]
    epochs = []
    for e in range(len(first["epochs"])):
        rows = [m["epochs"][e] for m in per_rank]
        seconds = max(r["train_time_s"] for r in rows)
        tokens = sum(r["tokens"] for r in rows)
        epochs.append({"epoch": e, "train_time_s": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
                       "train_loss": sum(r["train_loss"] for r in rows) / len(rows)}
                      | {k: rows[0][k] for k in ("steps", "micro_batches") if k in rows[0]})
    out = {"world_size": first["world_size"], "backend": first["backend"], "preset": first["preset"],
           "epochs": epochs, "val_loss_before": first["val_loss_before"], "val_loss_after": first["val_loss_after"]}
    return out | {k: first[k] for k in keep if k in first}
