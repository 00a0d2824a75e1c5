"""Problem 2.2: GPipe forward over worker threads.

The batch is cut into micro-batches; in clock cycle ``k`` every task
``(i, j)`` with ``i + j == k`` runs micro-batch ``i`` through stage ``j``
(see ``pipeline.schedule``). Each stage has its own worker thread
(``pipeline.runtime.StageWorkers``), so the tasks of one cycle run at the
same time::

    stage 0 | F0 F1 F2 F3
    stage 1 |    F0 F1 F2 F3
    stage 2 |       F0 F1 F2 F3      (Fi = micro-batch i, one column per cycle)

Backward needs nothing special: autograd follows the graph that the stages
built across threads and devices, because nothing is detached.
"""
from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch
from torch import nn

from pipeline import runtime, schedule


class Pipe(nn.Module):
    """Run ``stages`` as a GPipe pipeline: stage ``j`` on ``devices[j]`` in its own thread.

    ``stages`` (modules, registered in ``self.stages``, an ``nn.ModuleList``)
    should already be on their devices; ``split_size`` is the micro-batch
    size. The workers (``self.workers``, a ``runtime.StageWorkers``) start
    here and stop with ``close()`` or at the end of a ``with Pipe(...) as
    pipe:`` block (or when the Pipe is garbage collected). Raises ValueError for no stages, a length mismatch or
    ``split_size < 1``.
    """

    def __init__(self, stages: Sequence[nn.Module], devices: Sequence[torch.device | str], split_size: int):
        super().__init__()
        if len(stages) < 1:
            raise ValueError("Pipe needs at least one stage")
        if len(stages) != len(devices):
            raise ValueError(f"Pipe got {len(stages)} stages but {len(devices)} devices")
        if split_size < 1:
            raise ValueError(f"split_size must be >= 1, got {split_size}")
        self.stages = nn.ModuleList(stages)
        self.devices = [torch.device(d) for d in devices]
        self.split_size = int(split_size)
        self.workers = runtime.StageWorkers(self.devices)
        weakref.finalize(self, self.workers.close)   # a forgotten close() still stops the threads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return ``stages[-1](...(stages[0](x)))``, computed micro-batch by micro-batch.

        Contract:
        - split ``x`` along dim 0 with ``torch.split(x, self.split_size)`` (the
          last micro-batch may be smaller; ``split_size > len(x)`` gives one);
        - for each clock cycle of ``schedule.clock_cycles(m, n)`` (``m``
          micro-batches, ``n`` stages), first ``self.workers.submit(j, fn)`` every task of the
          cycle, in the cycle's order, and only then ``self.workers.receive(j)``
          each of them, in the same order: the stages of one cycle must run
          at the same time;
        - each ``fn`` takes no arguments and must compute its own task
          ``(i, j)``, although the loop moves on before the worker runs it:
          bind the loop variables ``i`` and ``j`` *when* ``fn`` *is created*
          (default arguments, ``lambda i=i, j=j, xb=...: ...``;
          ``functools.partial``; or a closure returned by a helper function
          called with them). Any of these forms is fine, and so is reading
          micro-batch ``i`` from a list when ``fn`` runs (with ``i`` bound),
          as long as that entry changes only when this task's result is
          received (as ``batches[i] = self.workers.receive(j)`` does). A
          plain ``lambda: ...`` that reads the loop's ``i`` or ``j`` when the
          worker runs it is wrong: by then they name a later task. The
          checks judge what ``fn`` computes, never how it is written;
        - ``fn`` moves its input (micro-batch ``i`` as stage ``j - 1`` left
          it) to ``self.devices[j]`` itself, inside stage ``j``'s worker, and
          calls the stage on the moved tensor (``Tensor.to`` returns a new
          one; it does not move the stage or its output); it never detaches
          it, so gradients reach the input and every stage;
        - return the outputs of the last stage, concatenated in micro-batch
          order with ``torch.cat`` into one tensor (not the list of the
          micro-batches' outputs), on the last stage's device.
        Errors raised by a stage propagate to the caller (``receive`` re-raises
        them).
        """
        # BEGIN_STUDENT 2.2
        batches = list(torch.split(x, self.split_size))
        for wave in schedule.clock_cycles(len(batches), len(self.stages)):
            for i, j in wave:
                self.workers.submit(j, lambda i=i, j=j, xb=batches[i]: self.stages[j](xb.to(self.devices[j])))
            for i, j in wave:
                batches[i] = self.workers.receive(j)
        return torch.cat(batches).to(self.devices[-1])
        # END_STUDENT 2.2

    def close(self) -> None:
        """Stop the stage workers (idempotent)."""
        self.workers.close()

    def __enter__(self) -> Pipe:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
