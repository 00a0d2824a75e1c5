"""What a student may read of a hidden criterion's failure: the kind of input and the likely cause, no values.

A hidden criterion's message names the course's secret inputs, and Gradescope shows a hidden test's output to
the student once grades are published, so ``results.json`` carries ``student_view`` of it instead; the exact
values stay in the staff's report.
"""
from __future__ import annotations

import re

from grading.engine.runner import CriterionResult, Status

MASK = "…"
KEPT_LINES = ("likely cause:", "pattern:")
_LOCATION = re.compile(r"(\.py:\d+)")                          # a student's file:line is no secret: kept
_NUMBER = re.compile(r"(?<![A-Za-z_\d])[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")   # not the digits of a name
_STRING = re.compile(r"""(?<![\w])(['"`])(?:(?!\1).)+?\1(?![\w])""")      # a quoted text, not "rank 1's"
_CLOSE = {"[": "]", "(": ")", "{": "}"}
_ONLY_MASKS = re.compile(r"[\s…,:+\-.]*")


def _matching(text: str, start: int) -> int | None:
    """The index of the bracket closing the one at ``start``, or None."""
    depth = 0
    for index in range(start, len(text)):
        if text[index] in _CLOSE:
            depth += 1
        elif text[index] in _CLOSE.values():
            depth -= 1
            if depth == 0:
                return index if text[index] == _CLOSE[text[start]] else None
    return None


def _collapse_literals(text: str) -> str:
    """``text`` with every bracketed literal (a list, tuple, dict or set, nested or of quoted texts, or of masked
    numbers alone) shown as ``[…]``: its length and nesting are the hidden input's shape. A call's or an index's
    brackets stay (``clock_cycles(…, …)``, ``x[…]``), and so does prose in parentheses."""
    out, index = [], 0
    while index < len(text):
        char = text[index]
        end = _matching(text, index) if char in _CLOSE else None
        follows_name = index > 0 and (text[index - 1].isalnum() or text[index - 1] in "_.)]")
        if end is not None and not follows_name:
            inner = text[index + 1:end]
            if ".py:" not in inner and (any(c in inner for c in "[({'\"`") or _ONLY_MASKS.fullmatch(inner)):
                out.append(char + MASK + _CLOSE[char])
                index = end + 1
                continue
        out.append(char)
        index += 1
    return "".join(out)


def mask_numbers(line: str) -> str:
    """``line`` with every value of a hidden input masked: each number replaced by ``MASK`` (``h.6.mlp`` ->
    ``h.….mlp``; digits that end a name, ``GPT2``, ``x_1``, stay), each quoted text by ``'…'`` (module names,
    file names, option strings), each literal list, tuple or dict by ``[…]`` (its length and nesting:
    ``_collapse_literals``). A ``.py:LINE`` location is kept."""
    pieces = _LOCATION.split(line)
    masked = "".join(piece if _LOCATION.fullmatch(piece) else
                     _NUMBER.sub(MASK, _STRING.sub(lambda m: m.group(1) + MASK + m.group(1), piece))
                     for piece in pieces)
    return _collapse_literals(masked)


def student_view(message: str, kind: str) -> str:
    """What a student reads of a failed hidden criterion whose full ``message`` names secret inputs.

    One line saying it failed on the hidden inputs (of ``kind``, the sub-problem's ``HIDDEN_KIND``, when given),
    the message's first line and its ``likely cause:`` / ``pattern:`` lines with the inputs' values masked
    (``mask_numbers``: numbers, quoted texts, the shape of lists), and a last line saying the exact inputs and
    values are in the staff's report. Never a value of ``message``'s numbers or texts, never its other lines
    (tracebacks, tensors, stacks).
    """
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    kept = [mask_numbers(lines[0])] if lines else []
    kept += [mask_numbers(line) for line in lines[1:] if line.startswith(KEPT_LINES)]
    head = f"failed on the hidden inputs ({kind})" if kind else "failed on the hidden inputs"
    return "\n".join([head + (f": {kept[0]}" if kept else ""), *kept[1:],
                      "(values masked: the exact inputs and values are in the course staff's report)"])


GRADER_ERROR_HIDDEN = ("the grader failed on the hidden inputs (not your fault; please tell the course staff: "
                       "their report has the details)")


def student_message(result: CriterionResult) -> str:
    """What a student may read of a verdict: its message, or of a failed hidden criterion its ``student_view``
    (the kind of input and the likely cause, no secret value); a hidden criterion's grader error says only that
    (its traceback may name a hidden input)."""
    if result.hidden and result.status == Status.FAILED:
        return student_view(result.message, result.hidden_kind)
    if result.hidden and result.status == Status.GRADER_ERROR:
        return GRADER_ERROR_HIDDEN
    return result.message
