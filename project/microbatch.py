"""How a pipeline run cuts its batches, said exactly, and where its stage timeline lives.

``Pipe`` takes a micro-batch *size* (``torch.split(x, split_size)``); the
entry points and the benchmark take a micro-batch *count* ``n_chunk`` and
derive ``split_size = ceil(batch / n_chunk)``. That gives exactly
``n_chunk`` micro-batches only when ``ceil(batch / split_size) == n_chunk``
(a batch of 9 with ``n_chunk`` 4 gives ``split_size`` 3, so 3 micro-batches:
``torch.chunk`` behaves the same way); such counts are refused up front, so
the count a run reports is the count that ran. The last, smaller batch of an
epoch may still run fewer (recorded per epoch).
"""
from __future__ import annotations

import math

from torch import nn

from project.cli import ConfigError


def split_size(batch_size: int, n_chunk: int) -> int:
    """The micro-batch size that cuts ``batch_size`` rows into ``n_chunk`` micro-batches."""
    return math.ceil(batch_size / n_chunk)


def count(rows: int, size: int) -> int:
    """Micro-batches ``torch.split`` makes of ``rows`` rows with micro-batches of ``size``."""
    return math.ceil(rows / size)


def check_n_chunk(batch_size: int, n_chunk: int) -> None:
    """Raise ConfigError unless ``n_chunk`` micro-batches is what a batch of ``batch_size`` rows really gives."""
    if n_chunk > batch_size:
        raise ConfigError(f"--n_chunk {n_chunk} is more than --batch_size {batch_size}: a micro-batch needs a row")
    actual = count(batch_size, split_size(batch_size, n_chunk))
    if actual != n_chunk:
        fits = [m for m in range(1, batch_size + 1) if count(batch_size, split_size(batch_size, m)) == m]
        near = sorted(fits, key=lambda m: abs(m - n_chunk))[:3]
        raise ConfigError(f"--n_chunk {n_chunk} with --batch_size {batch_size}: micro-batches of "
                          f"ceil({batch_size}/{n_chunk}) = {split_size(batch_size, n_chunk)} rows make {actual} "
                          f"micro-batches, not {n_chunk}; choose e.g. {', '.join(map(str, sorted(near)))}")


def stage_timeline(net: nn.Module) -> list:
    """The list a pipeline wrapper appends one ``{stage, task_index, start, end}`` per stage task to.

    ``Pipe``: its workers' ``timeline``; ``ModelParallel``: its own ``timeline``.
    """
    workers = getattr(net, "workers", None)
    return workers.timeline if workers is not None else net.timeline
