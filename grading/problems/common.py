"""Small helpers shared by the probes of every problem."""
from __future__ import annotations

from typing import Callable

import torch

from grading.engine.expect import expect

MESSAGE_CHARS = 300


def call_outcome(fn: Callable[[], object], message: bool = False) -> str:
    """Call ``fn()`` and name what happened: 'no exception', 'ValueError', or 'Type: message' of another error.

    Probes record this for calls that must raise ValueError, so a starter's
    NotImplementedError keeps its "Problem <id>: ..." message in the report.
    With ``message`` a ValueError keeps its message too ('ValueError: ...'),
    for contracts that say what the message must name.
    """
    try:
        fn()
    except ValueError as exc:
        return f"ValueError: {exc}"[:MESSAGE_CHARS] if message else "ValueError"
    except Exception as exc:  # noqa: BLE001 - a submission may raise anything
        return f"{type(exc).__name__}: {exc}"[:MESSAGE_CHARS]
    return "no exception"


def labelled(label: str, fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)``; an exception comes back as RuntimeError naming the call and the original."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001
        raise RuntimeError(f"{label} raised {type(exc).__name__}: {exc}") from exc


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
