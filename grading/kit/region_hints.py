"""Likely causes read from a region's code before it runs (the splice adds them to its problem's failed criteria).

The runtime half, what an exception a rank raised says, is ``grading.engine.hints``.
"""
from __future__ import annotations

import ast
import textwrap


def static_hints(body: str, first_line: int, path: str) -> list[str]:
    """Likely causes read from a region's code before it runs: a function defined in a loop that reads a loop
    variable without binding it (a late-binding closure). ``first_line`` is the file line of the body's first
    line; each hint names ``path:line``.
    """
    try:
        tree = ast.parse(textwrap.dedent(body))
    except SyntaxError:
        return []
    hints = []
    for loop in (n for n in ast.walk(tree) if isinstance(n, (ast.For, ast.While, ast.comprehension))):
        target = loop.target if not isinstance(loop, ast.While) else None
        names = {n.id for n in ast.walk(target) if isinstance(n, ast.Name)} if target is not None else set()
        holder = loop if isinstance(loop, (ast.For, ast.While)) else None
        if not names or holder is None:
            continue
        for fn in (n for stmt in holder.body for n in ast.walk(stmt) if isinstance(n, (ast.Lambda, ast.FunctionDef))):
            bound = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
            inside = [fn.body] if isinstance(fn, ast.Lambda) else fn.body      # not the defaults: bound at creation
            used = {n.id for part in inside for n in ast.walk(part)
                    if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
            late = sorted((used & names) - bound)
            if late:
                hints.append(f"likely cause: a late-binding closure at {path}:{first_line + fn.lineno - 1}: the "
                             f"function defined in the loop reads {', '.join(repr(v) for v in late)} when it runs, "
                             "not when it was created; bind them as default arguments "
                             f"(lambda {', '.join(f'{v}={v}' for v in late)}: ...)")
    return hints
