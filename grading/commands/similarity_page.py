"""The similarity report's data (pieces, entries, the ranked report) and its HTML page.

``render_html`` shows the top pairs of each problem side by side, shared
passages highlighted, from ``templates/similarity.html``; every piece of submission text is escaped.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

from grading.commands.fingerprints import K_GRAM, Token, content_hashes, gram_hashes
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
