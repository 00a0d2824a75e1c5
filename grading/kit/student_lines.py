"""Where the student's lines are: the grading copy's line numbers mapped back to the submitted file.

The grading copy of a student file is the kit's text around the submitted region bodies, so its lines are not
the submitted file's: ``line_map`` gives, for each line of the grading copy, the submitted line it stands for,
and ``location_pattern`` finds the ``file:line`` locations a message holds (``SpliceReport.student_lines``
rewrites them with the map). ``outside_note`` says what a submitted file changed outside its regions.
"""
from __future__ import annotations

import ast
import difflib
import functools
import re

MAX_MAPPED_LINES = 20000                  # a longer submitted file keeps the grading copy's line numbers


@functools.lru_cache(maxsize=64)
def location_pattern(paths: tuple[str, ...]) -> re.Pattern:
    """A pattern for ``path:line`` and ``path", line N`` (a traceback's ``File "path", line N``) of any of
    ``paths``, also behind a folder but not inside a longer name; groups ``path``, ``sep`` and ``line``."""
    names = "|".join(re.escape(p) for p in sorted(paths, key=len, reverse=True))
    return re.compile(rf"(?<![\w.-])(?P<path>{names})(?P<sep>:|\", line )(?P<line>\d+)")


def line_map(graded: str, submitted: str) -> tuple[int, ...]:
    """The line of ``submitted`` (a student file as the student submitted it) that each line of ``graded`` (its
    text in the grading copy) stands for: index 0 holds line 1's. Lines are Python's (``\\n``, ``\\r\\n``, ``\\r``).

    Lines that match (the spliced region bodies, kit text the student kept) map to their counterpart, found
    by ``difflib.SequenceMatcher``. A kit line the student changed maps to the changed line in its place (the
    k-th line of a replaced block to the k-th of its replacement, the surplus to the replacement's last
    line); a kit line the student removed (a starter stub of a missing region, say) maps to the submitted
    line that now stands where it stood (the file's last line at its end). A submitted file of more than
    ``MAX_MAPPED_LINES`` lines is not compared: each line maps to itself.
    """
    old, new = _python_lines(graded), _python_lines(submitted)
    changes = _changes(old, new)
    if changes is None:
        return tuple(range(1, len(old) + 1))
    out: list[int] = []
    for tag, i1, i2, j1, j2 in changes:
        for k in range(i2 - i1):
            if tag == "equal":
                out.append(j1 + k + 1)
            elif tag == "replace":
                out.append(j1 + min(k, j2 - j1 - 1) + 1)
            else:                               # "delete"
                out.append(max(min(j1 + 1, len(new)), 1))
    return tuple(out)


def _changes(old: list[str], new: list[str]) -> list[tuple[str, int, int, int, int]] | None:
    """``difflib.SequenceMatcher``'s opcodes (exact: no junk heuristic) turning lines ``old`` into ``new``; None
    when ``new`` has more than ``MAX_MAPPED_LINES`` lines (the comparison's time grows with both lengths)."""
    if len(new) > MAX_MAPPED_LINES:
        return None
    return difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()


def _python_lines(text: str) -> list[str]:
    """``text``'s lines as Python numbers them (a form feed or U+2028 ends no line), without their ends."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def outside_note(rel: str, pristine: str, graded: str, submitted: str) -> str:
    """What the ``submitted`` text of student file ``rel`` changed outside the regions, for the report.

    The top-level and class-level names it defines or imports that the kit's text (``pristine``) lacks, each
    with its line: "data_parallel/comm.py: `_world` (line 12), defined outside a region, is not graded: move
    it into the region that uses it". With no new name, the first submitted line that differs from the
    grading copy's text (``graded``: the kit's text around the submitted region bodies): "data_parallel/comm.py
    (first change at line 7)". ``rel`` alone when the submitted text does not parse.
    """
    mine, kits = _outside_names(submitted), _outside_names(pristine)
    if mine is None or kits is None:
        return rel
    added = sorted((line, name, kind) for name, (line, kind) in mine.items() if name not in kits)
    if not added:
        return f"{rel} (first change at line {_first_change(graded, submitted)})"
    groups = [f"{', '.join(f'`{name}` (line {line})' for line, name, k in added if k == kind)}, {kind} outside "
              "a region" for kind in ("defined", "imported") if any(k == kind for _, _, k in added)]
    one = len(added) == 1
    return (f"{rel}: {', and '.join(groups)}, {'is' if one else 'are'} not graded: move "
            f"{'it into the region that uses it' if one else 'them into the regions that use them'}")


def _outside_names(text: str) -> dict[str, tuple[int, str]] | None:
    """Name -> (line, "defined" or "imported") of every name ``text`` binds at module level or in a class body
    (``Pipe._helper``), inside ``if``/``try``/``with``/``for`` blocks too but never in a function (where every
    region is); None when ``text`` does not parse."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    found: dict[str, tuple[int, str]] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    if alias.name != "*":
                        found.setdefault(prefix + (alias.asname or alias.name.split(".")[0]), (node.lineno, "imported"))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.setdefault(prefix + node.name, (node.lineno, "defined"))
                if isinstance(node, ast.ClassDef):
                    visit(node.body, f"{prefix}{node.name}.")
            else:
                for name in _stored_names(node):
                    found.setdefault(prefix + name, (node.lineno, "defined"))
                nested = [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.stmt)]
                visit(nested + [s for h in getattr(node, "handlers", []) for s in h.body], prefix)
    visit(tree.body, "")
    return found


def _stored_names(node: ast.stmt) -> list[str]:
    """The plain names an assignment, ``for`` or ``with`` statement binds (not attributes or subscripts)."""
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.For, ast.AsyncFor)):
        targets = [node.target]
    elif isinstance(node, (ast.With, ast.AsyncWith)):
        targets = [item.optional_vars for item in node.items if item.optional_vars is not None]
    else:
        targets = []
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]


def _first_change(graded: str, submitted: str) -> int:
    """The first line of ``submitted`` that is not ``graded``'s text (one past its last when it only ends early)."""
    old, new = _python_lines(graded), _python_lines(submitted)
    changes = _changes(old, new)
    if changes is None:
        return next((k + 1 for k, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)) + 1)
    return next((j1 + 1 for tag, _, _, j1, _ in changes if tag != "equal"), len(new) + 1)
