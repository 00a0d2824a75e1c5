"""The shape of code, names and constants forgotten: how the kit tells that a function is "the answer"."""
from __future__ import annotations

import ast

MIN_NODES = 12        # regions smaller than this (``return len(self.index)``) have no distinctive shape


class _Shape(ast.NodeTransformer):
    """Forget names, attributes and constants: what is left is the shape of the code."""

    def visit_Name(self, node):
        return ast.copy_location(ast.Name(id="_", ctx=node.ctx), node)

    def visit_arg(self, node):
        return ast.copy_location(ast.arg(arg="_"), node)

    def visit_Attribute(self, node):
        self.generic_visit(node)
        node.attr = "_"
        return node

    def visit_Constant(self, node):
        return ast.copy_location(ast.Constant(value=0), node)


def shape(statements: list[ast.stmt]) -> str:
    module = ast.Module(body=[_Shape().visit(ast.parse(ast.unparse(s)).body[0]) for s in statements],
                        type_ignores=[])
    return ast.dump(module, annotate_fields=False)


def node_count(statements: list[ast.stmt]) -> int:
    return sum(1 for s in statements for _ in ast.walk(s))
