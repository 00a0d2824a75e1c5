"""Similarity report across a class's submissions: ``python -m grading similarity SUBMISSIONS_DIR --out report/``.

Per problem id, each submission's region bodies become one fingerprint set (``grading.commands.fingerprints``,
the starter's own text left out); two submissions' similarity on a problem is the Jaccard index of their sets.
``write_report`` writes ``pairs.csv`` and ``index.html``, the page that shows the top pairs of each problem side by
side with their shared passages highlighted (``render_html``, from ``templates/similarity.html``: every piece of
submission text is escaped); entries that cannot be read are listed, never fatal.
"""
from __future__ import annotations

import argparse
import ast
import os
import shutil
import sys
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from common import ROOT
from common.files import atomic_write
from grading.kit.intake import SubmissionError, extract_zip, find_root
from common.regions import RegionError, parse_regions, student_files
from grading.kit.splice import kit_text, replace_bodies, stub_body
from grading.kit.submission import MAX_STUDENT_FILE_BYTES
from grading.commands.csv_cells import write_csv
from grading.commands.fingerprints import (K_GRAM, PIECE_SEPARATOR, Token, content_hashes, gram_hashes, tokens_of,
                                           winnow)
from grading.commands.templates import render as render_template

TOP_PAIRS = 10      # pairs per problem shown side by side in index.html
HIGHLIGHT_RUN = 8   # k-grams in a row, in the same order in both (K_GRAM + 7 = 12 tokens), mark a shared passage


@dataclass
class Piece:
    """One region body of a submission, as shown in the report."""

    path: str
    function: str
    body: str


@dataclass
class Entry:
    """One submission's code for one problem: its pieces, normalised tokens and winnowed fingerprints."""

    submission: str
    problem: str
    pieces: list[Piece]
    tokens: list[Token] = field(default_factory=list)
    fingerprints: frozenset[int] = frozenset()


@dataclass
class Report:
    """The result of a similarity pass: ranked rows, the entries per problem and the inputs left out."""

    rows: list[tuple[str, str, str, float]]         # (problem, a, b, similarity), ranked per problem
    entries: dict[str, dict[str, Entry]]            # problem -> submission -> entry
    skipped: list[tuple[str, str]]                  # (entry name, reason)
    empty: list[str]                                # submissions with nothing beyond the starter
    submissions: int
    starter: dict[str, frozenset[int]]              # problem -> the starter's k-gram hashes (starter_hashes)


# Reading the submissions: the kit's names and starter text, then each submission's region bodies.


def kept_names(kit_root: Path) -> frozenset[str]:
    """Names the kit's student files define or import at module level (they survive normalisation)."""
    names: set[str] = set()
    for rel in student_files(kit_root):
        try:
            tree = ast.parse(kit_text(kit_root, rel))
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return frozenset(names)


def starter_hashes(kit_root: Path, kept: frozenset[str]) -> dict[str, frozenset[int]]:
    """Per problem id: every k-gram hash of the starter's stub bodies and of all provided text of the student files.

    The provided text (docstrings, signatures, helpers) is shared by every
    problem, so it is removed everywhere; a stub body only from its problem.
    """
    provided: set[int] = set()
    stubs: dict[str, set[int]] = {}
    for rel in student_files(kit_root):
        text = kit_text(kit_root, rel)
        regions = parse_regions(text, rel)
        starter = replace_bodies(text, rel, {k: stub_body(r) for k, r in enumerate(regions)})
        provided.update(gram_hashes(tokens_of(starter, kept)))
        for region in regions:
            stub = textwrap.dedent(stub_body(region))
            stubs.setdefault(region.id, set()).update(gram_hashes(tokens_of(stub, kept)))
    return {problem: frozenset(provided | hashes) for problem, hashes in stubs.items()}


def kit_stubs(kit_root: Path) -> dict[str, dict[tuple[str, str], str]]:
    """Per student file of the kit: (problem id, function) -> the starter's stub body of that region."""
    return {rel: {(r.id, r.function): stub_body(r) for r in parse_regions(kit_text(kit_root, rel), rel)}
            for rel in student_files(kit_root)}


def read_pieces(submission_root: Path, stubs: dict[str, dict[tuple[str, str], str]]
                ) -> tuple[dict[str, list[Piece]], list[str]]:
    """The submission's region bodies per problem id (starter stubs left out) and notes on unreadable files.

    ``stubs`` is ``kit_stubs(kit_root)``. Regions are matched to the kit's by
    (problem id, enclosing function), as the grader splices them; a file
    with malformed markers, or larger than the grader accepts, is noted and
    contributes nothing.
    """
    pieces: dict[str, list[Piece]] = {}
    notes: list[str] = []
    for rel, kit in stubs.items():
        path = submission_root / rel
        if not path.is_file() or path.is_symlink():
            continue
        try:
            if path.stat().st_size > MAX_STUDENT_FILE_BYTES:
                raise RegionError(f"{rel}: larger than {MAX_STUDENT_FILE_BYTES} bytes")
            regions = parse_regions(path.read_text(errors="replace"), rel)
        except (RegionError, OSError) as exc:
            notes.append(str(exc))
            continue
        for region in regions:
            stub = kit.get((region.id, region.function))
            if stub is None or not region.body.strip() or region.body.strip() == stub.strip():
                continue
            pieces.setdefault(region.id, []).append(Piece(rel, region.function, region.body))
    return pieces, notes


def collect(submissions_dir: Path, kit_root: Path, kept: frozenset[str], base: dict[str, frozenset[int]]
            ) -> tuple[dict[str, dict[str, Entry]], list[tuple[str, str]], list[str], int]:
    """Read every entry of ``submissions_dir`` (folders and zips, as ``batch`` grades them).

    ``kept`` and ``base`` are ``kept_names`` and ``starter_hashes`` of the kit.
    Returns (problem -> submission -> Entry, skipped (name, reason), names of
    submissions with nothing beyond the starter, number of submissions read). An
    entry that cannot be opened is skipped with its reason, never fatal.
    """
    from grading.commands.batch import submissions_in

    stubs = kit_stubs(kit_root)
    entries: dict[str, dict[str, Entry]] = {}
    skipped: list[tuple[str, str]] = []
    empty: list[str] = []
    read = 0
    for path in submissions_in(submissions_dir):
        name = path.name                            # as grades.csv names it: a zip keeps its .zip
        scratch = Path(tempfile.mkdtemp(prefix="similarity-"))
        try:
            root = find_root(extract_zip(path, scratch) if path.is_file() else path, list(stubs))
            pieces, notes = read_pieces(root, stubs)
        except (SubmissionError, RegionError, OSError, UnicodeError, RecursionError) as exc:
            skipped.append((path.name, str(exc).splitlines()[0] if str(exc) else type(exc).__name__))
            continue
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        read += 1
        skipped += [(path.name, f"file ignored: {note}") for note in notes]
        implemented = False
        for problem, items in pieces.items():
            tokens = [t for k, piece in enumerate(items)
                      for t in tokens_of(textwrap.dedent(piece.body), kept, k) + [Token(PIECE_SEPARATOR, k, 0)]]
            own = content_hashes(tokens, base.get(problem, frozenset()))
            fingerprints = winnow([h for h in own if h is not None])
            if fingerprints:
                entries.setdefault(problem, {})[name] = Entry(name, problem, items, tokens, fingerprints)
                implemented = True
        if not implemented:
            empty.append(name)
    return entries, skipped, empty, read


# Ranking the pairs into the report.


def _problem_order(problem: str) -> list[tuple[int, int | str]]:
    """Sort key of a problem id: numeric parts numerically ("2.10" after "2.9"), any other id after them."""
    return [(0, int(x)) if x.isdigit() else (1, x) for x in problem.split(".")]


def rank_pairs(entries: dict[str, dict[str, Entry]]) -> list[tuple[str, str, str, float]]:
    """Every pair of submissions per problem with its Jaccard similarity, ranked per problem (highest first)."""
    rows = []
    for problem in sorted(entries, key=_problem_order):
        items = sorted(entries[problem].values(), key=lambda e: e.submission)
        ranked = []
        for i, a in enumerate(items):
            for b in items[i + 1:]:
                shared = len(a.fingerprints & b.fingerprints)
                union = len(a.fingerprints) + len(b.fingerprints) - shared
                ranked.append((problem, a.submission, b.submission, shared / union if union else 0.0))
        ranked.sort(key=lambda row: (-row[3], row[1], row[2]))
        rows += ranked
    return rows


def build_report(submissions_dir: Path, kit_root: Path = ROOT) -> Report:
    """Read ``submissions_dir`` and rank every pair of submissions per problem."""
    kit_root = Path(kit_root)
    kept = kept_names(kit_root)
    base = starter_hashes(kit_root, kept)
    entries, skipped, empty, read = collect(Path(submissions_dir), kit_root, kept, base)
    return Report(rank_pairs(entries), entries, skipped, empty, read, base)


# The page: per problem the top pairs side by side, shared passages marked.


def _shared_lines(a: Entry, b: Entry, base: frozenset[int]) -> set[tuple[int, int]]:
    """(piece, line) of ``a`` inside a passage it shares with ``b``: consecutive k-grams in the same order in
    both, HIGHLIGHT_RUN or more of them outside the starter. A passage is marked whole, from its first line to
    its last, the starter's text and comment lines inside it too (identical code is marked from end to end); a
    passage made mostly of starter text is not. Shorter or scattered matches are common idioms
    (``x[-1].append(y)``) and stay unmarked, though they count in the score."""
    where: dict[int, list[int]] = {}
    for position, value in enumerate(gram_hashes(b.tokens)):
        where.setdefault(value, []).append(position)
    content = [value is not None for value in content_hashes(a.tokens, base)]
    marked: set[tuple[int, int]] = set()
    previous: dict[int, tuple[int, int]] = {}   # position in b -> (length, own k-grams) of the common run ending there

    def mark(end: int, length: int) -> None:
        """Every line from the passage's first token to its last (comment lines inside it too)."""
        lines: dict[int, list[int]] = {}
        for token in a.tokens[end - length + 1:end + K_GRAM]:
            if token.line:
                lines.setdefault(token.piece, []).append(token.line)
        marked.update((piece, n) for piece, found in lines.items() for n in range(min(found), max(found) + 1))

    hashes = gram_hashes(a.tokens)
    for position, value in enumerate(hashes):
        current = {}
        for p in where.get(value, ()):
            length, own = previous.get(p - 1, (0, 0))
            current[p] = (length + 1, own + content[position])
        for p, (length, own) in previous.items():      # a run that ends here: mark it if it is a shared passage
            if p + 1 not in current and own >= HIGHLIGHT_RUN:
                mark(position - 1, length)
        previous = current
    for length, own in previous.values():
        if own >= HIGHLIGHT_RUN:
            mark(len(hashes) - 1, length)
    return marked


def _pane(entry: Entry, marked: set[tuple[int, int]]) -> list[dict]:
    """One side of a pair: each piece with its dedented lines, as (text, inside a shared passage)."""
    return [{"submission": entry.submission, "path": piece.path, "function": piece.function,
             "lines": [(text, (k, n) in marked)
                       for n, text in enumerate(textwrap.dedent(piece.body).splitlines(), start=1)]}
            for k, piece in enumerate(entry.pieces)]


def render_html(report: Report, top: int = TOP_PAIRS, class_report: str | None = None) -> str:
    """The static report page: per problem, the ``top`` pairs ranked, each side by side with shared lines marked.

    Rendered from ``templates/similarity.html``: every piece of submission text (names, code, error messages)
    is HTML-escaped. ``class_report``, a relative link to the batch's class report page, is shown at the top
    when given.
    """
    by_problem: dict[str, list] = {}
    for row in report.rows:
        by_problem.setdefault(row[0], []).append(row)
    problems = []
    for problem, rows in by_problem.items():
        entries, base = report.entries[problem], report.starter[problem]
        pairs = [{"a": a, "b": b, "similarity": sim,
                  "left": _pane(entries[a], _shared_lines(entries[a], entries[b], base)),
                  "right": _pane(entries[b], _shared_lines(entries[b], entries[a], base))}
                 for _, a, b, sim in rows[:top]]
        problems.append({"id": problem, "count": len(rows), "pairs": pairs})
    return render_template("similarity.html", submissions=report.submissions, passage_tokens=K_GRAM + HIGHLIGHT_RUN - 1,
                           class_report=class_report, skipped=report.skipped, empty=report.empty, problems=problems)


# Writing the report, and the command.


def write_report(submissions_dir: Path, out_dir: Path, kit_root: Path = ROOT, top: int = TOP_PAIRS,
                 class_report: Path | None = None) -> Report:
    """Build the report of ``submissions_dir`` and write ``pairs.csv`` and ``index.html`` into ``out_dir``.

    Cells of ``pairs.csv`` are formula-safe (``csv_cells``); ``class_report``, the batch's class report
    page, is linked from ``index.html`` (by a path relative to ``out_dir``) when given.
    """
    report = build_report(submissions_dir, kit_root)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_csv(out_dir / "pairs.csv", ["problem", "a", "b", "similarity"],
              ((p, a, b, f"{s:.4f}") for p, a, b, s in report.rows))
    link = Path(os.path.relpath(Path(class_report).resolve(), out_dir.resolve())).as_posix() if class_report else None
    atomic_write(out_dir / "index.html", render_html(report, top, class_report=link))
    return report


def run(submissions_dir: Path, out_dir: Path, top: int = TOP_PAIRS, class_report: Path | None = None) -> int:
    """CLI body shared by ``similarity`` and ``batch --similarity``: write the report, print a summary.

    ``class_report`` (the class report page of a batch) is linked from the page when given.
    Returns 0, or 2 (with a one-line error) for a missing SUBMISSIONS_DIR, an
    output path that is a file or cannot be written, or a negative ``top``.
    """
    if not Path(submissions_dir).is_dir():
        print(f"error: {submissions_dir}: not a folder", file=sys.stderr)
        return 2
    if Path(out_dir).exists() and not Path(out_dir).is_dir():
        print(f"error: {out_dir}: exists and is not a folder", file=sys.stderr)
        return 2
    if top < 0:
        print(f"error: --top must be >= 0, got {top}", file=sys.stderr)
        return 2
    try:
        report = write_report(Path(submissions_dir), Path(out_dir), top=top, class_report=class_report)
    except OSError as exc:
        print(f"error: cannot write the report into {out_dir}: {exc}", file=sys.stderr)
        return 2
    for name, reason in report.skipped:
        print(f"left out: {name}: {reason}", file=sys.stderr)
    listed = len({name for name, _ in report.skipped})
    unread = f"; {listed} entr{'y' if listed == 1 else 'ies'} unreadable or with files ignored (listed above)"
    print(f"compared {report.submissions} submission(s){unread if listed else ''}; "
          f"wrote {Path(out_dir) / 'pairs.csv'} ({len(report.rows)} pairs) and {Path(out_dir) / 'index.html'}")
    return 0


def _cmd(args: argparse.Namespace) -> int:
    return run(Path(args.submissions_dir), Path(args.out), args.top,
               Path(args.class_report) if args.class_report else None)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``similarity`` command to the grading CLI's subparsers."""
    parser = subparsers.add_parser("similarity", help="rank pairs of submissions by code similarity per problem "
                                   "(pairs.csv + index.html)")
    parser.add_argument("submissions_dir", help="folder of submissions (folders or zips, as for batch)")
    parser.add_argument("--out", required=True, help="report folder (pairs.csv, index.html)")
    parser.add_argument("--top", type=int, default=TOP_PAIRS, help=f"pairs per problem shown side by side "
                        f"(default {TOP_PAIRS})")
    parser.add_argument("--class-report", help="link this class report page (grades_class_report.html, written "
                        "by batch) from index.html")
    parser.set_defaults(func=_cmd)
