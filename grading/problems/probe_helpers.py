"""Small helpers shared by the probes of every problem.

A probe that catches a student exception itself (rather than letting
``ctx.record`` save it) reports it with ``describe_exception`` (from
``grading.check``, like everything a check imports of the grader):
``Type: message (at path:line (in fn))`` plus the likely cause, exactly as
``record`` reports what it catches; the helpers below report so too.
"""
from __future__ import annotations

import functools
import inspect
from contextlib import contextmanager
from typing import Callable, Iterator

import torch

from grading.engine.expect import expect
from grading.check import describe_exception
# What a case's ranks import from the libraries, for ``Case.preload`` (the run's fork servers import it once,
# not every rank of every case; ``grade --profile`` lists what a case's ranks still import themselves).
from common.startup import DEEPSPEED_IMPORTS, GPT2_IMPORTS, OPTIMIZER_IMPORTS

__all__ = ["COLLECTIVES", "CodeOnLoad", "CollectiveLog", "DEEPSPEED_IMPORTS", "GPT2_IMPORTS", "MESSAGE_CHARS",
           "OPTIMIZER_IMPORTS", "call_outcome", "describe_call", "expect_refusals", "labelled",
           "stage_devices", "unchecked_group"]

MESSAGE_CHARS = 300
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
               "broadcast", "reduce", "all_to_all", "all_to_all_single", "gather", "scatter")


class CodeOnLoad:
    """Pickled, it becomes a call of ``os.mkdir(marker)`` when loaded with ``weights_only=False`` (what an
    untrusted file can do); ``weights_only=True`` refuses it without running anything."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        import os
        return os.mkdir, (self.marker,)



def call_outcome(fn: Callable[[], object], message: bool = False) -> str:
    """Call ``fn()`` and name what happened: 'no exception', 'ValueError', or another error described by
    ``describe_exception`` ('Type: message (at path:line (in fn))' and the likely cause).

    Probes record this for calls that must raise ValueError, so a starter's
    NotImplementedError keeps its "Problem <id>: ..." message in the report,
    and any other error says where in the student's code it was raised.
    With ``message`` a ValueError keeps its message too ('ValueError: ...'),
    for contracts that say what the message must name.
    """
    try:
        fn()
    except ValueError as exc:
        return f"ValueError: {exc}"[:MESSAGE_CHARS] if message else "ValueError"
    except Exception as exc:  # noqa: BLE001 - a submission may raise anything
        return describe_exception(exc, limit=MESSAGE_CHARS)
    return "no exception"


def labelled(label: str, fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)``; an exception comes back as RuntimeError naming the call and the original
    (``describe_exception``: its type, message, student file and line, likely cause)."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001
        raise RuntimeError(f"{label} raised {describe_exception(exc)}") from exc


def unchecked_group():
    """A new process group of every rank whose calls torch does not compare across ranks (``Case.collective_checks``
    checks the default group's): for the grader's own collectives, so that the checks cost only the student's.

    Every rank calls it, in the same order, as ``torch.distributed.new_group``. A student call and a grader call
    on the two groups are not compared with each other: use it for traffic that never stands in for a student's.
    """
    import torch.distributed as dist

    level = dist.get_debug_level()
    dist.set_debug_level(dist.DebugLevel.OFF)     # a group is wrapped with the checks when it is created
    try:
        return dist.new_group()
    finally:
        dist.set_debug_level(level)


class CollectiveLog:
    """``torch.distributed``'s collectives (``COLLECTIVES``), wrapped in a rank: each call made inside
    ``watching()`` is logged as plain data (a part can record it), then made as it was.

    Create it before the student module is imported, so that a ``from torch.distributed import ...`` there binds
    the wrapped function. Only the window is logged: the grader's own traffic (``unchecked_group()`` included)
    stays outside it. A logged call::

        {"op": "reduce_scatter", "async_op": False, "sizes": {"output": 106, "input_list": [106, 106]}}

    ``sizes``: the element count of each tensor argument (by its parameter name), a list for a list of tensors.
    """

    def __init__(self, dist, names: tuple[str, ...] = COLLECTIVES):
        self._calls: list[dict] | None = None
        for name in names:
            real = getattr(dist, name, None)
            if real is not None:
                setattr(dist, name, self._wrap(name, real))

    @contextmanager
    def watching(self) -> Iterator[list[dict]]:
        """Inside the block, every collective call is appended to the list it yields."""
        calls: list[dict] = []
        self._calls = calls
        try:
            yield calls
        finally:
            self._calls = None

    def _wrap(self, name: str, real: Callable) -> Callable:
        signature = inspect.signature(real)

        @functools.wraps(real)
        def logged(*args, **kwargs):
            if self._calls is not None:
                self._calls.append(_call_record(name, signature, args, kwargs))
            return real(*args, **kwargs)
        return logged


def _call_record(name: str, signature: inspect.Signature, args: tuple, kwargs: dict) -> dict:
    try:
        bound = signature.bind(*args, **kwargs).arguments
    except TypeError:                   # a malformed call: the real collective raises its own error
        bound = {}
    sizes: dict[str, int | list[int]] = {}
    for argument, value in bound.items():
        if isinstance(value, torch.Tensor):
            sizes[argument] = int(value.numel())
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
            sizes[argument] = [int(v.numel()) for v in value]
    return {"op": name, "async_op": bool(bound.get("async_op", False)), "sizes": sizes}


def describe_call(call: object) -> str:
    """A logged call (``CollectiveLog``) in words: 'reduce_scatter(output: 106 elements, input_list: 2 tensors of
    [106, 106] elements)'."""
    if not isinstance(call, dict) or not isinstance(call.get("sizes"), dict):
        return repr(call)[:MESSAGE_CHARS]
    sizes = ", ".join(f"{argument}: {n} elements" if isinstance(n, int) else
                      f"{argument}: {len(n)} tensors of {n} elements" for argument, n in call["sizes"].items())
    return f"{call.get('op')}({sizes})"


def stage_devices(count: int) -> list[str]:
    """Devices for ``count`` pipeline stages: GPUs round robin when there are >= 2, else all CPU."""
    gpus = torch.cuda.device_count()
    return [f"cuda:{k % gpus}" for k in range(count)] if gpus >= 2 else ["cpu"] * count


def expect_refusals(items: list[dict], what: str, changes: dict[str, str]) -> None:
    """Each recorded item (``label``, ``outcome`` and the ``changes`` keys) raised ValueError and changed nothing.

    ``changes`` maps a recorded key (a list of what the call changed before raising) to the advice shown.
    """
    for item in items:
        label = f"{what} {item['label']}"
        expect(item["outcome"] == "ValueError", f"{label}: expected ValueError, got {item['outcome']}")
        for key, advice in changes.items():
            expect(not item[key], f"{label}: raised, but had already changed {item[key][:4]} ({advice})")


def factor_hint(got, expected: dict, world_size: int) -> str:
    """A likely cause when every tensor of ``got`` (name -> tensor) is the expected one times N or 1/N.

    N is the world size: a sum without the division, or the division done twice. "" when neither fits.
    """
    pairs = [(got.get(n), e) for n, e in expected.items() if e is not None] if isinstance(got, dict) else []
    pairs = [(g, e) for g, e in pairs if isinstance(g, torch.Tensor) and g.shape == e.shape]
    if not pairs:
        return ""
    for factor, cause in ((world_size, "a sum without the division by the world size"),
                          (1 / world_size, "a division by the world size twice")):
        if all(torch.allclose(g.double(), e.double() * factor, atol=1e-6, rtol=1e-4) for g, e in pairs):
            return f"\nlikely cause: {cause} (every gradient is {factor:g} x the expected one)"
    return ""
