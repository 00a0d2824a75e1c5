"""CSV files the kit writes (grades.csv, the class report, pairs.csv): safe cells, written atomically.

Submission names and failure messages are student-controlled text, and a spreadsheet runs a cell that starts
with ``=``, ``+``, ``-`` or ``@`` (or a tab or carriage return) as a formula: ``safe_cell`` neutralises such a
cell with a leading apostrophe (OWASP's advice), ``=HYPERLINK("http://x")`` -> ``'=HYPERLINK("http://x")``.
"""
from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from common.files import atomic_write

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?")


def safe_cell(value: object) -> str:
    """``value`` as CSV cell text that no spreadsheet runs as a formula; plain numbers are kept as they are."""
    text = "" if value is None else str(value)
    if text.startswith(FORMULA_START) and not _NUMBER.fullmatch(text):
        return "'" + text
    return text


def write_csv(path: Path, columns: Sequence[str], rows: Iterable[Mapping[str, object] | Sequence[object]]) -> Path:
    """Write ``rows`` (dicts keyed by ``columns``, or sequences in their order) under a header, atomically.

    Every cell, the header included, goes through ``safe_cell``; missing dict keys are empty cells.
    The parent folder is created. Returns ``path``.
    """
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow([safe_cell(c) for c in columns])
    for row in rows:
        values = [row.get(c, "") for c in columns] if isinstance(row, Mapping) else list(row)
        writer.writerow([safe_cell(v) for v in values])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, buffer.getvalue())
