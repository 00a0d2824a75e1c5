"""Student regions: parsing, splicing, release and the tamper record.

A region is a block of lines inside a function body::

        # BEGIN_STUDENT 1.2
        ...reference solution...
        # END_STUDENT 1.2

Everything outside regions is *protected*: the grader always uses the kit's
own text there and only takes region bodies from a submission.
"""
from __future__ import annotations

import ast
import hashlib
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

BEGIN_RE = re.compile(r"^(?P<indent>[ \t]*)#\s*BEGIN_STUDENT\b\s*(?P<id>\S*)\s*$")
END_RE = re.compile(r"^(?P<indent>[ \t]*)#\s*END_STUDENT\b\s*(?P<id>\S*)\s*$")
MARKER_RE = re.compile(r"#\s*(BEGIN|END)_STUDENT\b")
DEF_RE = re.compile(r"^\s*(?:async\s+)?def\s+(\w+)")

# Directories whose .py files may hold student regions.
STUDENT_PACKAGES = ("data_parallel", "pipeline", "finetune")
# Never copied into a release (solution-only or local state).
RELEASE_EXCLUDE = (".git", ".ci", "workdir", "tests/kit", "grading/hidden", "__pycache__", ".pytest_cache",
                   ".ruff_cache", ".mypy_cache", ".venv", "venv", ".ipynb_checkpoints", ".DS_Store",
                   "submit_figures/*.png", "submit_figures/*.json", "results.json", "submission.zip")
PROTECTED_RECORD = "grading/protected.json"


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
    from its BEGIN, or a region that is not inside a function.
    """
    lines = text.splitlines(keepends=True)
    regions: list[Region] = []
    open_at: tuple[int, re.Match] | None = None
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
            function = _enclosing_function(lines, start, begin_match["indent"])
            if not function:
                raise RegionError(f"{path}:{start}: region {begin_match['id']} is not inside a function body")
            regions.append(Region(begin_match["id"], path, start, number, begin_match["indent"], function,
                                  "".join(lines[start:number - 1])))
            open_at = None
    if open_at is not None:
        raise RegionError(f"{path}:{open_at[0]}: BEGIN_STUDENT {open_at[1]['id']} is never closed")
    return regions


def _enclosing_function(lines: list[str], begin_line: int, indent: str) -> str:
    """Name of the innermost function around line ``begin_line`` ("" when the region is not in one)."""
    try:
        tree = ast.parse("".join(lines))
    except SyntaxError:
        return _enclosing_function_by_indent(lines, begin_line, indent)
    best = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node.lineno < begin_line <= node.end_lineno:
            if best is None or node.lineno > best.lineno:
                best = node
    return best.name if best is not None else ""


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


def stub_body(region: Region) -> str:
    """The starter's body for ``region``: a NotImplementedError naming the problem and function."""
    return (f'{region.indent}raise NotImplementedError("Problem {region.id}: {region.function} is not '
            f'implemented yet (fill in the region marked BEGIN_STUDENT {region.id})")\n')


def replace_bodies(text: str, path: str, bodies: dict[int, str]) -> str:
    """Return ``text`` with the body of the k-th region (0-based) replaced by ``bodies[k]``."""
    regions = parse_regions(text, path)
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    cursor = 0
    for k, region in enumerate(regions):
        out.extend(lines[cursor:region.begin_line])          # up to and including BEGIN
        out.append(bodies[k] if k in bodies else region.body)
        out.append(lines[region.end_line - 1])               # END marker
        cursor = region.end_line
    out.extend(lines[cursor:])
    return "".join(out)


def protected_text(text: str, path: str) -> str:
    """``text`` with every region body removed (marker lines kept): what students may not change."""
    return replace_bodies(text, path, {k: "" for k in range(len(parse_regions(text, path)))})


def student_files(root: Path) -> list[str]:
    """Relative paths of the kit's files that contain student regions, sorted.

    Raises RegionError when any candidate file has malformed markers.
    """
    found = []
    for package in STUDENT_PACKAGES:
        for file in sorted((root / package).rglob("*.py")):
            rel = file.relative_to(root).as_posix()
            if "__pycache__" in rel:
                continue
            if parse_regions(file.read_text(), rel):
                found.append(rel)
    return sorted(found)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _excluded(rel: str) -> bool:
    parts = rel.split("/")
    for pattern in RELEASE_EXCLUDE:
        if "*" in pattern:
            if Path(rel).match(pattern):
                return True
        elif rel == pattern or rel.startswith(pattern + "/") or pattern in parts:
            return True
    return False


def release(kit_root: Path, out_dir: Path) -> dict:
    """Write the student starter of ``kit_root`` into ``out_dir`` (which must be absent or empty).

    Region bodies become ``raise NotImplementedError("Problem <id>: ...")``;
    files and folders in RELEASE_EXCLUDE are left out; ``grading/protected.json``
    records a SHA-256 of the protected text of every student file and of every
    other released file. Raises RegionError for malformed markers (before
    anything is written) and FileExistsError for a non-empty ``out_dir``.
    Returns the record.
    """
    kit_root, out_dir = Path(kit_root).resolve(), Path(out_dir).resolve()
    if out_dir == kit_root or kit_root in out_dir.parents:
        raise ValueError(f"release target {out_dir} must be outside the kit {kit_root}")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"release target {out_dir} is not empty")
    students = set(student_files(kit_root))   # validates every marker first
    files = [p for p in sorted(kit_root.rglob("*")) if p.is_file()
             and not _excluded(p.relative_to(kit_root).as_posix())]
    record: dict = {"student_files": {}, "provided_files": {}}
    staged: dict[str, bytes] = {}
    for file in files:
        rel = file.relative_to(kit_root).as_posix()
        if rel == PROTECTED_RECORD:
            continue
        if rel in students:
            text = file.read_text()
            regions = parse_regions(text, rel)
            starter = replace_bodies(text, rel, {k: stub_body(r) for k, r in enumerate(regions)})
            staged[rel] = starter.encode()
            record["student_files"][rel] = {"protected_sha256": sha256(protected_text(text, rel)),
                                            "regions": [r.id for r in regions]}
        else:
            data = file.read_bytes()
            staged[rel] = data
            record["provided_files"][rel] = hashlib.sha256(data).hexdigest()
    for rel, data in staged.items():
        target = out_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        shutil.copymode(kit_root / rel, target)
    (out_dir / PROTECTED_RECORD).parent.mkdir(parents=True, exist_ok=True)
    (out_dir / PROTECTED_RECORD).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record
