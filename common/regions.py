"""Student regions: reading them, the packages that may hold them, and the pristine student files.

A region is the block of lines between ``# BEGIN_STUDENT <id>`` and ``# END_STUDENT <id>`` inside a function
body. Everything outside regions is *protected*: the grader uses the kit's own text there and takes only region
bodies from a submission. In a student starter the kit's own text is the pristine copy in ``PRISTINE_DIR``, so a
local grade splices exactly like the course's grader (``grading.kit.splice``).
"""
from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path

BEGIN_RE = re.compile(r"^(?P<indent>[ \t]*)#\s*BEGIN_STUDENT\b\s*(?P<id>\S*)\s*$")
END_RE = re.compile(r"^(?P<indent>[ \t]*)#\s*END_STUDENT\b\s*(?P<id>\S*)\s*$")
MARKER_RE = re.compile(r"#\s*(BEGIN|END)_STUDENT\b")
DEF_RE = re.compile(r"^\s*(?:async\s+)?def\s+(\w+)")

# The top-level packages that hold student code: only their .py files may hold regions, and a traceback frame
# in them is the student's.
STUDENT_PACKAGES = ("data_parallel", "pipeline", "finetune", "tensor_parallel")
PRISTINE_DIR = "grading/pristine"         # in a starter: the released text of every student file


class RegionError(ValueError):
    """A malformed student marker; the message names the file and line."""


@dataclass(frozen=True)
class Region:
    """One student region: ``body`` is the text between the marker lines."""

    id: str
    path: str          # relative to the kit root, posix separators
    begin_line: int    # 1-based line of the BEGIN marker
    end_line: int      # 1-based line of the END marker
    indent: str
    function: str      # name of the enclosing function ("" when none)
    body: str


def parse_regions(text: str, path: str = "<string>") -> list[Region]:
    """Return the regions of one file's ``text`` in order.

    Raises RegionError (with ``path:line``) for an unclosed, nested, stray or
    mismatched marker, an empty id, a region whose END indentation differs
    from its BEGIN, or a region that is not inside a function. A process
    parses each distinct (text, path) once (a grade parses every kit file
    several times: splice, protected text, hints); regions are immutable.
    """
    return list(_parse_regions(text, path))


@functools.lru_cache(maxsize=256)
def _parse_regions(text: str, path: str) -> tuple[Region, ...]:
    lines = text.splitlines(keepends=True)
    regions: list[Region] = []
    open_at: tuple[int, re.Match] | None = None
    functions: list[tuple[int, int, str]] | None = None       # parsed once, at the first region
    for number, line in enumerate(lines, start=1):
        begin, end = BEGIN_RE.match(line), END_RE.match(line)
        if not begin and not end and MARKER_RE.search(line):
            raise RegionError(f"{path}:{number}: student marker must stand alone on its line")
        if begin:
            if not begin["id"]:
                raise RegionError(f"{path}:{number}: BEGIN_STUDENT without a problem id")
            if open_at is not None:
                raise RegionError(f"{path}:{number}: BEGIN_STUDENT {begin['id']} nested inside region "
                                  f"{open_at[1]['id']} opened at line {open_at[0]}")
            open_at = (number, begin)
        elif end:
            if open_at is None:
                raise RegionError(f"{path}:{number}: END_STUDENT {end['id']} without a matching BEGIN_STUDENT")
            start, begin_match = open_at
            if end["id"] != begin_match["id"]:
                raise RegionError(f"{path}:{number}: END_STUDENT {end['id']!r} does not match "
                                  f"BEGIN_STUDENT {begin_match['id']!r} at line {start}")
            if end["indent"] != begin_match["indent"]:
                raise RegionError(f"{path}:{number}: END_STUDENT {end['id']} indentation differs from its "
                                  f"BEGIN_STUDENT at line {start}")
            if functions is None:
                functions = _function_spans(lines)
            function = _enclosing_function(functions, lines, start, begin_match["indent"])
            if not function:
                raise RegionError(f"{path}:{start}: region {begin_match['id']} is not inside a function body")
            regions.append(Region(begin_match["id"], path, start, number, begin_match["indent"], function,
                                  "".join(lines[start:number - 1])))
            open_at = None
    if open_at is not None:
        raise RegionError(f"{path}:{open_at[0]}: BEGIN_STUDENT {open_at[1]['id']} is never closed")
    return tuple(regions)


def _function_spans(lines: list[str]) -> list[tuple[int, int, str]] | None:
    """(first line, last line, name) of every function in the text; None when it does not parse."""
    try:
        tree = ast.parse("".join(lines))
    except SyntaxError:
        return None
    return [(node.lineno, node.end_lineno, node.name) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _enclosing_function(functions: list[tuple[int, int, str]] | None, lines: list[str], begin_line: int,
                        indent: str) -> str:
    """Name of the innermost function around line ``begin_line`` ("" when the region is not in one)."""
    if functions is None:
        return _enclosing_function_by_indent(lines, begin_line, indent)
    best = None
    for first, last, name in functions:
        if first < begin_line <= last and (best is None or first > best[0]):
            best = (first, name)
    return best[1] if best is not None else ""


def _enclosing_function_by_indent(lines: list[str], begin_line: int, indent: str) -> str:
    """Fallback for text that does not parse: the nearest less-indented ``def`` above."""
    for line in reversed(lines[:begin_line - 1]):
        stripped = line.lstrip(" \t")
        depth = len(line) - len(stripped)
        if not stripped.strip() or stripped.startswith(("#", ")")) or depth >= len(indent):
            continue
        match = DEF_RE.match(line)
        if match:
            return match.group(1)
        if stripped.startswith("class "):
            return ""
    return ""


def student_files(root: Path, problems: tuple[str, ...] | None = None) -> list[str]:
    """Relative paths of the kit's files that contain student regions, sorted.

    With ``problems`` (e.g. ("1", "2", "3")), only files with a region of one
    of those problems. In a starter (``grading/pristine/`` exists) these are
    the pristine files, whatever the student did to the working copies.
    Raises RegionError when any candidate file has malformed markers.
    """
    root = Path(root)
    base = root / PRISTINE_DIR if (root / PRISTINE_DIR).is_dir() else root
    found = []
    for package in STUDENT_PACKAGES:
        for file in sorted((base / package).rglob("*.py")):
            rel = file.relative_to(base).as_posix()
            if "__pycache__" in rel:
                continue
            ids = [r.id.split(".")[0] for r in parse_regions(file.read_text(), rel)]
            if ids and (problems is None or any(i in problems for i in ids)):
                found.append(rel)
    return sorted(found)
