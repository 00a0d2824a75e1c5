"""The one seam between checks and student code: isolation swaps.

To make one bug cost one criterion, a probe sometimes replaces a student function that another student function
calls (the schedule under ``Pipe``, ``Partition`` under ``partition_dataset``) with a grader stand-in: a ``Swap``
in the ``SWAPS`` table of its check module, installed in the rank by ``apply``. Stand-ins are never readable
solutions: a table of recorded answers (``Recorded``), a library class, or a different computation.
"""
from __future__ import annotations

import copy
import importlib
from dataclasses import dataclass
from typing import Any, Callable



@dataclass(frozen=True)
class Swap:
    """Replace ``module.name`` by ``make()`` (called in the rank, when the swap is applied)."""

    module: str                    # "data_parallel.dataset"
    name: str                      # "Partition"
    make: Callable[[], Any]        # builds the stand-in
    why: str                       # which criterion it isolates, from what


def apply(swaps: list[Swap] | tuple[Swap, ...]) -> dict[str, Any]:
    """Install every stand-in of ``swaps``; return ``{"module.name": stand_in}``.

    Each is set as the name on its student module: student code looks the name up through its module's globals
    at call time, so the stand-in is what it calls.

    Raises AttributeError when a student module lacks the name (a kit bug).
    """
    installed = {}
    for swap in swaps:
        module = importlib.import_module(swap.module)
        getattr(module, swap.name)                 # the name must exist where the student code looks it up
        stand_in = swap.make()
        setattr(module, swap.name, stand_in)
        installed[f"{swap.module}.{swap.name}"] = stand_in
    return installed


class Recorded:
    """A stand-in that answers from a table of recorded results (keyed by its arguments), computing nothing.

    ``Recorded(table, name)(10, 3, 0)`` returns a copy of ``table[(10, 3, 0)]`` (the table is keyed by the
    call's argument tuple); an unrecorded call raises KeyError naming ``name`` and the arguments.
    """

    def __init__(self, table: dict[tuple, Any], name: str):
        self.table, self.name = table, name

    def __call__(self, *args: Any) -> Any:
        try:
            return copy.deepcopy(self.table[tuple(args)])
        except KeyError:
            raise KeyError(f"the grader recorded no {self.name}({', '.join(map(str, args))})") from None
