"""Async all-reduce results that reach their tensor only at ``wait()`` (rank side, Problem 4.1's probe).

gloo may finish an ``all_reduce(tensor, async_op=True)`` at any moment after the call, so a submission that
reads the tensor before ``wait()`` reads the sum on some runs and the local value on others: its grade would
change from run to run. ``DeferredAllReduce`` makes that race lose on every run: the collective runs on a
private copy, and the copy's sum is written into the caller's tensor when (and only when) the caller waits on
the handle. A correct submission, which waits before it reads, sees exactly what gloo would have given it.
"""
from __future__ import annotations

from typing import Any, Callable

import torch


class DeferredWork:
    """The handle ``DeferredAllReduce`` returns: ``wait()`` waits for the collective on the private copy, then
    copies the result into the caller's tensor (once) and calls ``on_wait()``; other attributes are the
    underlying ``torch.distributed`` work's."""

    def __init__(self, work: Any, staged: torch.Tensor, target: torch.Tensor, on_wait: Callable[[], None]):
        self._work, self._staged, self._target = work, staged, target
        self._on_wait, self._delivered = on_wait, False

    def wait(self, *args: Any, **kwargs: Any) -> bool:
        done = self._work.wait(*args, **kwargs)
        if not self._delivered:
            self._delivered = True
            with torch.no_grad():
                self._target.copy_(self._staged)
            self._on_wait()
        return done

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


class DeferredAllReduce:
    """A stand-in for ``torch.distributed.all_reduce`` that records every call in ``events`` (``["all_reduce",
    async, numel]``; ``["wait", k]`` when the handle of the call recorded at ``events[k]`` is first waited on) and
    defers async results (above). Whoever empties ``events`` starts the numbering afresh.

    ``install()`` puts it in place of ``torch.distributed.all_reduce``; install it before the submission's module
    is imported, so a name the module binds at import is this one.
    """

    def __init__(self, events: list) -> None:
        self.events = events
        self._real = None

    def install(self) -> None:
        import torch.distributed as dist
        self._real = dist.all_reduce
        dist.all_reduce = self

    def __call__(self, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        async_op = bool(kwargs.get("async_op", args[2] if len(args) > 2 else False))
        self.events.append(["all_reduce", async_op, int(tensor.numel())])
        if not async_op:
            return self._real(tensor, *args, **kwargs)
        position = len(self.events) - 1
        staged = tensor.detach().clone()
        work = self._real(staged, *args, **kwargs)
        return DeferredWork(work, staged, tensor, lambda: self.events.append(["wait", position]))


def unwaited(events: list) -> list[int]:
    """The numbers (1 = first, in launch order) of the async all-reduces in ``events`` never waited on."""
    launches = [k for k, e in enumerate(events) if e[0] == "all_reduce" and e[1]]
    waited = {e[1] for e in events if e[0] == "wait"}
    return [n for n, k in enumerate(launches, 1) if k not in waited]
