"""What a student may read of a hidden criterion's failure: the kind of input and the likely cause, no values.

A hidden criterion's message names the course's secret inputs, and Gradescope shows a hidden test's output to
the student once grades are published, so ``results.json`` carries ``student_view`` of it instead; the exact
values stay in the staff's report.
"""
from __future__ import annotations

import re

MASK = "…"
KEPT_LINES = ("likely cause:", "pattern:")
_LOCATION = re.compile(r"(\.py:\d+)")                          # a student's file:line is no secret: kept
_NUMBER = re.compile(r"(?<![A-Za-z_\d])[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")   # not the digits of a name


def mask_numbers(line: str) -> str:
    """``line`` with every number replaced by ``MASK`` (``h.6.mlp`` -> ``h.….mlp``); digits that end a name
    (``GPT2``, ``x_1``) and a ``.py:LINE`` location are kept."""
    pieces = _LOCATION.split(line)
    return "".join(piece if _LOCATION.fullmatch(piece) else _NUMBER.sub(MASK, piece) for piece in pieces)


def student_view(message: str, kind: str) -> str:
    """What a student reads of a failed hidden criterion whose full ``message`` names secret inputs.

    One line saying it failed on the hidden inputs (of ``kind``, the sub-problem's ``HIDDEN_KIND``, when given),
    the message's first line and its ``likely cause:`` / ``pattern:`` lines with numbers masked (``mask_numbers``),
    and a last line saying the exact inputs and values are in the staff's report. Never a value of ``message``'s
    numbers, never its other lines (tracebacks, tensors, stacks).
    """
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    kept = [mask_numbers(lines[0])] if lines else []
    kept += [mask_numbers(line) for line in lines[1:] if line.startswith(KEPT_LINES)]
    head = f"failed on the hidden inputs ({kind})" if kind else "failed on the hidden inputs"
    return "\n".join([head + (f": {kept[0]}" if kept else ""), *kept[1:],
                      "(numbers masked: the exact inputs and values are in the course staff's report)"])
