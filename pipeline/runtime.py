"""Provided runtime (not student code): one worker thread per pipeline stage.

``Pipe`` hands each task (a callable with no arguments) to the worker of its
stage and later collects the result::

    caller ──submit(j, fn)──▶ task queue j ──▶ worker thread j: fn() on device j
    caller ◀──receive(j)───── result queue j ◀──────────────┘

Tasks of one stage run one at a time, in submission order; tasks of
different stages run at the same time (PyTorch releases the GIL inside its
kernels, so CPU stages overlap too). Results come back per stage in
submission order.

A worker starts a task only once the caller calls ``receive`` (for any
stage) after submitting it, and that ``receive`` returns only when every
task submitted before it has finished. So the tasks of one clock cycle
(all submitted, then received) run side by side, never while the caller is
still between its submits: a task that reads the caller's variables when
it runs reads them as they are at that ``receive``, on every run, not as
the threads' timing happens to leave them.

Everything is recorded for inspection: ``events`` lists ("submit", stage) and
("receive", stage) in call order, ``threads`` holds the worker threads and
``timeline`` one dict per finished task with ``time.perf_counter`` start and
end stamps (``plot_timeline``-ready). ``events`` and ``timeline`` are lists
(``RecordList``: slicing, ``==`` with a list) that keep the most recent
``RECORD_LIMIT`` entries, up to a tenth more between trims (``.clear()``
them between steps to look at one step).

A task runs under the grad mode and the autocast state (``torch.autocast``
on CPU and CUDA) its caller had when it was submitted, so ``with
torch.autocast(...)`` around a pipeline's forward reaches the stages.
"""
from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

DEFAULT_TIMEOUT = 300.0   # seconds a receive waits for its result before raising TimeoutError
RECORD_LIMIT = 100_000     # entries kept in ``events`` and ``timeline``
_STOP = object()           # sentinel that ends a worker loop
_AUTOCAST_DEVICES = ("cpu", "cuda")


class RecordList(list):
    """A ``list`` that keeps only its most recent ``limit`` entries (thread-safe ``append``).

    It is a real list (slicing, indexing, ``==`` with a list, ``len``,
    ``clear``); once it grows past ``limit`` by a tenth, the oldest entries
    are dropped down to ``limit`` (amortised: not one shift per append).
    """

    def __init__(self, limit: int = RECORD_LIMIT):
        super().__init__()
        self.limit = int(limit)
        self._lock = threading.Lock()

    def append(self, item: Any) -> None:
        """Add ``item`` at the end; drop the oldest entries beyond ``limit`` now and then."""
        with self._lock:
            super().append(item)
            if len(self) > self.limit + max(1, self.limit // 10):
                del self[:len(self) - self.limit]


def _autocast_state() -> list[tuple[str, torch.dtype]]:
    """The (device type, dtype) pairs for which the calling thread has autocast enabled."""
    return [(d, torch.get_autocast_dtype(d)) for d in _AUTOCAST_DEVICES if torch.is_autocast_enabled(d)]


class StageWorkers:
    """One daemon worker thread per stage, with a task queue and a result queue each.

    ``devices[j]`` is stage ``j``'s device; a worker for an indexed CUDA
    device (``cuda:1``) binds it (``torch.cuda.set_device``) before running
    tasks. ``timeout`` bounds every ``receive`` (default ``DEFAULT_TIMEOUT``).
    Use as a context manager or call ``close()``.
    """

    def __init__(self, devices: Sequence[torch.device | str], timeout: float | None = None):
        if len(devices) < 1:
            raise ValueError("StageWorkers needs at least one device")
        self.devices = [torch.device(d) for d in devices]
        self.timeout = DEFAULT_TIMEOUT if timeout is None else float(timeout)
        # Bounded, so a long training run does not grow them forever: the most recent RECORD_LIMIT entries.
        self.events: RecordList = RecordList(RECORD_LIMIT)
        self.timeline: RecordList = RecordList(RECORD_LIMIT)
        self._tasks: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in self.devices]
        self._results: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in self.devices]
        self._submitted = [0] * len(self.devices)
        self._received = [0] * len(self.devices)
        self._finished = [0] * len(self.devices)      # tasks done per stage (written by the workers)
        self._released = [0] * len(self.devices)      # tasks per stage a worker may start
        self._gate = threading.Condition()
        self._closed = False
        self.threads = [threading.Thread(target=self._work, args=(stage,), name=f"pipeline-stage-{stage}",
                                         daemon=True) for stage in range(len(self.devices))]
        for thread in self.threads:
            thread.start()

    # -- caller side ---------------------------------------------------------------------------------

    def submit(self, stage: int, fn: Callable[[], Any]) -> int:
        """Queue ``fn()`` on ``stage``'s worker and return at once (the task's index on that stage).

        The worker runs ``fn`` under the grad mode the caller has *now*
        (``torch.is_grad_enabled()``), so ``with torch.no_grad(): pipe(x)``
        builds no graph, and under the caller's autocast state. Raises
        RuntimeError after ``close()`` and IndexError for an unknown stage.
        """
        self._check_stage(stage)
        if self._closed:
            raise RuntimeError("StageWorkers.submit after close()")
        self.events.append(("submit", stage))
        index = self._submitted[stage]
        self._submitted[stage] += 1
        self._tasks[stage].put((index, fn, torch.is_grad_enabled(), _autocast_state()))
        return index

    def receive(self, stage: int, timeout: float | None = None) -> Any:
        """Return the result of ``stage``'s oldest task not yet received, waiting for it.

        First lets the workers start every task submitted so far, on every
        stage, and waits until all of them have finished (see the module's
        docstring). Waits at most ``timeout`` seconds (default: the constructor's) and then
        raises TimeoutError naming the stage (or the stages still running). When the task raised, the same
        exception object is re-raised here (its traceback still holds the
        worker's frames, and a note names the stage); before that, every other outstanding result on every stage is
        collected and dropped, so the workers stay usable for the next call.
        """
        self._check_stage(stage)
        self.events.append(("receive", stage))
        if self._received[stage] >= self._submitted[stage]:
            raise RuntimeError(f"StageWorkers.receive({stage}): nothing was submitted to stage {stage} "
                               "that has not been received already")
        self._release(timeout)
        ok, value = self._get(stage, timeout)
        if not ok:
            self._drain(timeout)
            raise value
        return value

    def close(self, timeout: float = 10.0) -> None:
        """Stop every worker (a sentinel after its queued tasks) and join it; calling again is a no-op."""
        if self._closed:
            return
        self._closed = True
        with self._gate:
            self._released = list(self._submitted)
            self._gate.notify_all()
        for tasks in self._tasks:
            tasks.put(_STOP)
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._closed

    def __enter__(self) -> StageWorkers:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------------------

    def _check_stage(self, stage: int) -> None:
        if not 0 <= stage < len(self.devices):
            raise IndexError(f"stage {stage} out of range for {len(self.devices)} stage(s)")

    def _release(self, timeout: float | None) -> None:
        """Let every submitted task start; return once all have finished (TimeoutError after ``timeout``)."""
        limit = self.timeout if timeout is None else timeout
        with self._gate:
            self._released = list(self._submitted)
            self._gate.notify_all()
            if not self._gate.wait_for(lambda: self._finished == self._released, timeout=limit):
                running = [s for s in range(len(self.devices)) if self._finished[s] < self._released[s]]
                stages = ", ".join(f"stage {s} (device {self.devices[s]})" for s in running)
                raise TimeoutError(f"pipeline {stages} returned no result within {limit:g} s")

    def _get(self, stage: int, timeout: float | None) -> tuple[bool, Any]:
        limit = self.timeout if timeout is None else timeout
        try:
            result = self._results[stage].get(timeout=limit)
        except queue.Empty:
            raise TimeoutError(f"pipeline stage {stage} (device {self.devices[stage]}) returned no result "
                               f"within {limit:g} s") from None
        self._received[stage] += 1
        return result

    def _drain(self, timeout: float | None) -> None:
        try:
            for stage in range(len(self.devices)):
                while self._received[stage] < self._submitted[stage]:
                    self._get(stage, timeout)
        except TimeoutError:
            pass   # a stuck task: the caller gets the original error, not this one

    def _work(self, stage: int) -> None:
        device = self.devices[stage]
        if device.type == "cuda" and device.index is not None:
            torch.cuda.set_device(device)
        tasks, results = self._tasks[stage], self._results[stage]
        while True:
            task = tasks.get()
            if task is _STOP:
                return
            index, fn, grad_enabled, autocasts = task
            with self._gate:
                self._gate.wait_for(lambda: index < self._released[stage])
            start = time.perf_counter()
            try:
                with torch.set_grad_enabled(grad_enabled), contextlib.ExitStack() as stack:
                    for device_type, dtype in autocasts:
                        stack.enter_context(torch.autocast(device_type, dtype=dtype))
                    result = (True, fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, who re-raises it
                exc.add_note(f"(raised in the worker of pipeline stage {stage} on {device}, task {index}; "
                             "the frames after 'raise value' in receive() are the worker's)")
                result = (False, exc)
            end = time.perf_counter()
            self.timeline.append({"stage": stage, "task_index": index, "start": start, "end": end})
            results.put(result)
            with self._gate:
                self._finished[stage] += 1
                self._gate.notify_all()
            del task, fn, result   # drop references to activations before blocking again
