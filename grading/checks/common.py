"""Small helpers shared by the probes of every problem."""
from __future__ import annotations

from typing import Callable

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
