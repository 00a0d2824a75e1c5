"""Likely causes read from a region's code before it runs (the splice adds them to its problem's failed criteria).

The runtime half, what an exception a rank raised says, is ``common.error_words.describe_exception``.
"""
from __future__ import annotations

import ast
import textwrap

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
# Nodes with a scope of their own: a name stored inside one is not stored in the code around it.
_SCOPES = (*_FUNCTIONS, ast.ClassDef, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def static_hints(body: str, first_line: int, path: str) -> list[str]:
    """Likely causes read from a region's code before it runs: a function defined in a loop that reads, without
    binding it as a parameter, a name the loop (re)binds on every pass: its target, or a name assigned anywhere in
    its body, before or after the function (a late-binding closure). One hint per function, naming every such
    name. ``first_line`` is the file line of the body's first line; each hint names ``path:line``.
    """
    try:
        tree = ast.parse(textwrap.dedent(body))
    except SyntaxError:
        return []
    late: dict[int, tuple[ast.AST, set[str]]] = {}      # id(function) -> (function, names it reads late)
    for loop in (n for n in ast.walk(tree) if isinstance(n, (ast.For, ast.AsyncFor, ast.While))):
        rebound = _rebound(loop)
        for fn in _functions(loop.body):
            names = _reads(fn) & rebound
            if names:
                late.setdefault(id(fn), (fn, set()))[1].update(names)
    hints = []
    for fn, names in sorted(late.values(), key=lambda item: (item[0].lineno, item[0].col_offset)):
        listed = sorted(names)
        hints.append(f"likely cause: a late-binding closure at {path}:{first_line + fn.lineno - 1}: the "
                     f"function defined in the loop reads {', '.join(repr(v) for v in listed)} when it runs, "
                     "not when it was created; bind them as default arguments "
                     f"(lambda {', '.join(f'{v}={v}' for v in listed)}: ...)")
    return hints


def _local_nodes(nodes: list[ast.AST], scopes: tuple[type, ...] = _SCOPES):
    """Every node under ``nodes``; a node of one of ``scopes`` is yielded but not entered."""
    stack = list(nodes)
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, scopes):
            stack.extend(ast.iter_child_nodes(node))


def _rebound(loop: ast.For | ast.AsyncFor | ast.While) -> set[str]:
    """The names ``loop`` binds anew on every pass: its target's and those its body stores in its own scope."""
    parts = [*([loop.target] if isinstance(loop, (ast.For, ast.AsyncFor)) else []), *loop.body]
    return {n.id for n in _local_nodes(parts) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _functions(statements: list[ast.stmt]) -> list[ast.AST]:
    """The outermost functions and lambdas defined in ``statements`` (those nested in them are part of them)."""
    return [n for n in _local_nodes(statements, _FUNCTIONS) if isinstance(n, _FUNCTIONS)]


def _reads(fn: ast.AST) -> set[str]:
    """The free names ``fn``'s code reads when it runs: loaded there, neither a parameter nor stored inside it
    (default values, decorators and annotations are evaluated when it is created, so they do not count)."""
    args = fn.args
    params = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
    params |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    inside = [fn.body] if isinstance(fn, ast.Lambda) else fn.body
    names = [n for part in inside for n in ast.walk(part) if isinstance(n, ast.Name)]
    stored = {n.id for n in names if isinstance(n.ctx, ast.Store)}
    return {n.id for n in names if isinstance(n.ctx, ast.Load)} - params - stored
