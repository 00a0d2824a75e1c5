"""Build submissions for the similarity report: samples, the reference, planted copies, generated batches.

    python -m tests.kit.similarity_samples.make OUT_DIR [--count 200] [--seed 0]

A submission is a folder (or zip) holding the kit's student files with
chosen region bodies spliced in; every region not chosen keeps the
starter's stub. ``planted_copy`` disguises a body the way a copier would:
locally bound names renamed, adjacent independent statements swapped,
comments replaced and the layout rewritten (``ast.unparse``).
"""
from __future__ import annotations

import argparse
import ast
import random
import sys
import textwrap
import zipfile
from pathlib import Path

from common import ROOT
from common.regions import parse_regions, student_files
from grading.kit.splice import kit_text, replace_bodies, stub_body
from grading.commands.variants import all_variants

SAMPLES = Path(__file__).resolve().parent

Bodies = dict[tuple[str, str], str]      # (problem id, function) -> dedented body


def kit_regions(kit_root: Path = ROOT) -> dict[str, list]:
    """The kit's regions per student file."""
    return {rel: parse_regions(kit_text(kit_root, rel), rel) for rel in student_files(kit_root)}


def reference_bodies(kit_root: Path = ROOT) -> Bodies:
    """The kit's own region bodies (the reference solution), dedented."""
    return {(r.id, r.function): textwrap.dedent(r.body) for regions in kit_regions(kit_root).values() for r in regions}


def sample_bodies() -> dict[str, dict[str, Bodies]]:
    """problem id -> sample name -> bodies, from ``<problem>/<name>.py`` next to this module."""
    out: dict[str, dict[str, Bodies]] = {}
    for file in sorted(SAMPLES.glob("*/*.py")):
        regions = parse_regions(file.read_text(), file.name)
        out.setdefault(file.parent.name, {})[file.stem] = {(r.id, r.function): textwrap.dedent(r.body)
                                                           for r in regions}
    return out


class _Names(ast.NodeVisitor):
    """Names bound inside a body (assignment and loop targets, nested def/lambda arguments, except-as)."""

    def __init__(self) -> None:
        self.bound: set[str] = set()

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Store):
            self.bound.add(node.id)

    def visit_arg(self, node: ast.arg) -> None:
        self.bound.add(node.arg)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self.bound.add(node.name)
        self.generic_visit(node)


class _Rename(ast.NodeTransformer):
    def __init__(self, mapping: dict[str, str]) -> None:
        self.mapping = mapping

    def visit_Name(self, node: ast.Name) -> ast.Name:
        node.id = self.mapping.get(node.id, node.id)
        return node

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.arg = self.mapping.get(node.arg, node.arg)
        return node

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> ast.ExceptHandler:
        node.name = self.mapping.get(node.name, node.name) if node.name else node.name
        self.generic_visit(node)
        return node


def _names(node: ast.AST, ctx: type) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ctx)}


def _swappable(a: ast.stmt, b: ast.stmt) -> bool:
    """Two adjacent statements a copier may swap: assignments or raise-only guards with no data dependency, or
    two ``setdefault`` calls on one dict with different constant keys."""
    def guard(s: ast.stmt) -> bool:
        return isinstance(s, ast.If) and not s.orelse and all(isinstance(x, ast.Raise) for x in s.body)
    def setdefault(s: ast.stmt) -> ast.Call | None:     # d.setdefault(<constant key>, ...)
        call = s.value if isinstance(s, ast.Expr) else None
        ok = isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "setdefault" \
            and call.args and isinstance(call.args[0], ast.Constant)
        return call if ok else None
    ca, cb = setdefault(a), setdefault(b)
    if ca and cb:       # two setdefaults on one dict with different keys commute
        return ast.dump(ca.func.value) == ast.dump(cb.func.value) and ca.args[0].value != cb.args[0].value
    kinds_ok = (isinstance(a, (ast.Assign, ast.AnnAssign)) and isinstance(b, (ast.Assign, ast.AnnAssign))) \
        or (guard(a) and guard(b))
    if not kinds_ok:
        return False
    wa, wb = _names(a, ast.Store), _names(b, ast.Store)
    ra, rb = _names(a, ast.Load), _names(b, ast.Load)
    return not (wa & (rb | wb) or wb & ra)


def _reorder(statements: list[ast.stmt]) -> None:
    k = 0
    while k < len(statements) - 1:
        if _swappable(statements[k], statements[k + 1]):
            statements[k], statements[k + 1] = statements[k + 1], statements[k]
            k += 2
        else:
            k += 1
    for statement in statements:
        for field in ("body", "orelse", "finalbody"):
            inner = getattr(statement, field, None)
            if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                _reorder(inner)


def planted_copy(body: str, rng: random.Random) -> str:
    """``body`` disguised: bound names renamed, independent neighbours swapped, comments and layout replaced."""
    try:
        tree = ast.parse(textwrap.dedent(body))
    except SyntaxError:
        return "# rewritten\n" + body
    finder = _Names()
    finder.visit(tree)
    words = ["acc", "buf", "item", "val", "tmp", "res", "cur", "obj", "elem", "part", "thing", "chunk"]
    mapping = {name: f"{rng.choice(words)}_{k}" for k, name in enumerate(sorted(finder.bound))
               if name not in ("self", "_")}
    tree = _Rename(mapping).visit(tree)
    _reorder(tree.body)
    comment = rng.choice(["# my own implementation", "# worked this out myself", "# solution"])
    return comment + "\n" + ast.unparse(tree) + "\n"


def write_submission(dest: Path, bodies: Bodies, kit_root: Path = ROOT, as_zip: bool = False) -> Path:
    """A submission at ``dest`` (a folder, or ``dest`` + ``.zip``): the kit's student files with ``bodies`` spliced in.

    Regions whose (problem id, function) is not in ``bodies`` keep the starter stub. Returns the path written.
    """
    files = {}
    for rel, regions in kit_regions(kit_root).items():
        text = kit_text(kit_root, rel)
        new = {k: textwrap.indent(bodies[(r.id, r.function)].strip("\n") + "\n", r.indent)
               if (r.id, r.function) in bodies else stub_body(r) for k, r in enumerate(regions)}
        files[rel] = replace_bodies(text, rel, new)
    if as_zip:
        path = dest.with_name(dest.name + ".zip")
        with zipfile.ZipFile(path, "w") as archive:
            for rel, text in files.items():
                archive.writestr(rel, text)
        return path
    for rel, text in files.items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_text(text)
    return dest


def _variant_bodies() -> list[tuple[str, str]]:
    """(function, body) of the buggy variants of Problems 1-3 (each sub-problem folder's ``variants.py``)."""
    return [(v.function, textwrap.dedent(v.body)) for v in all_variants() if v.problem.split(".")[0] in ("1", "2", "3")]


def generate_batch(out_dir: Path, count: int = 200, seed: int = 0) -> list[Path]:
    """``count`` submissions in ``out_dir``: per problem a random pick of the reference, a sample, a buggy
    variant of the reference, a planted copy of one of those, or the starter; every 10th is a zip."""
    rng = random.Random(seed)
    reference, samples, variants = reference_bodies(), sample_bodies(), _variant_bodies()
    problems = sorted({problem for problem, _ in reference})
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for n in range(count):
        bodies: Bodies = {}
        for problem in problems:
            keys = [key for key in reference if key[0] == problem]
            choice = rng.choice(["reference", "sample", "sample", "variant", "copy", "copy", "starter"])
            source = dict(reference)
            if choice in ("sample", "copy") and samples.get(problem):
                source.update(rng.choice(list(samples[problem].values())))
            if choice == "variant":
                matching = [(f, b) for f, b in variants if any(key[1] == f for key in keys)]
                if matching:
                    function, body = rng.choice(matching)
                    source[(problem, function)] = body
            if choice == "starter":
                continue
            for key in keys:
                body = source[key]
                bodies[key] = planted_copy(body, rng) if choice == "copy" else body
        written.append(write_submission(out_dir / f"student{n:03d}", bodies, as_zip=n % 10 == 9))
    return written


def main(argv: list[str] | None = None) -> int:
    """CLI: write a generated batch (a class to try the similarity report on: docs/grading-a-class.md)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    paths = generate_batch(Path(args.out_dir), args.count, args.seed)
    print(f"wrote {len(paths)} submissions to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
