"""Step-level metrics (``metrics.jsonl``, optional TensorBoard) and run summaries of the entry points.

``metrics.jsonl`` holds one JSON object per line, written by rank 0 and
flushed at once::

    {"step": 12, "epoch": 1, "loss": 3.91, "grad_norm": 0.84, "lr": 0.001, "step_time_s": 0.21,
     "tokens_per_s": 5310.0, "peak_mem_bytes": 612630528, "micro_batches": 1}
    {"event": "divergence", "step": 13, "epoch": 1, "action": "rollback", "reason": "...", "loss": 51.2,
     "restored_step": 10}

Step lines have the keys of ``STEP_KEYS``; event lines have ``event``. The
divergence guard's event (``GUARD_EVENT``) says what became of the refused
step (``GUARD_ACTIONS``): ``rollback`` to ``restored_step``, ``skip`` (no
checkpoint old enough: its update is dropped) or ``keep`` (an engine such as
DeepSpeed had applied the update before the loss was known, and there was
no checkpoint to return to). ``project/plot.py`` draws the loss and
gradient-norm curves.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Callable

from common.files import atomic_write, read_jsonl
from project.cli import ConfigError

GUARD_EVENT = "divergence"
GUARD_ACTIONS = ("rollback", "skip", "keep")
STEP_KEYS = ("step", "loss", "grad_norm", "lr", "step_time_s", "tokens_per_s", "peak_mem_bytes")
METRICS_FILE = "metrics.jsonl"


def check_tensorboard(folder: str | None) -> None:
    """Raise ConfigError when ``--tensorboard`` names a file, or the ``tensorboard`` package is not installed."""
    if folder is not None and Path(folder).is_file():
        raise ConfigError(f"--tensorboard {folder!r} is a file; give a folder for the event files")
    if folder is not None and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("--tensorboard needs the optional 'tensorboard' package (pip install tensorboard); "
                          "metrics.jsonl is written without it")


class StepLog:
    """Appends step and event lines to ``<folder>/metrics.jsonl`` (and TensorBoard scalars when asked).

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
