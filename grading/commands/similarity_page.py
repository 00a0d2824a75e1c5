"""The similarity report's data (pieces, entries, the ranked report) and its HTML page.

``render_html`` shows the top pairs of each problem side by side, shared
passages highlighted; every piece of submission text is escaped.
"""
from __future__ import annotations

import html
import textwrap
from dataclasses import dataclass, field
from urllib.parse import quote

from grading.commands.fingerprints import K_GRAM, Token, content_hashes, gram_hashes

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


def _pane(entry: Entry, marked: set[tuple[int, int]]) -> str:
    parts = []
    for k, piece in enumerate(entry.pieces):
        lines = textwrap.dedent(piece.body).splitlines()
        body = "\n".join(f'<span class="m">{html.escape(text) or " "}</span>' if (k, n) in marked
                         else html.escape(text) for n, text in enumerate(lines, start=1))
        parts.append(f"<figure><figcaption>{html.escape(entry.submission)}: {html.escape(piece.path)} "
                     f"({html.escape(piece.function)})</figcaption><pre>{body}</pre></figure>")
    return "".join(parts)


_STYLE = """body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}
td,th{border:1px solid #bbb;padding:2px 8px;vertical-align:top}.pair{display:flex;gap:1em}
.pair>div{flex:1;min-width:0}pre{background:#f6f6f6;padding:4px;overflow-x:auto;font-size:12px}
.m{background:#ffd54f;display:inline-block;min-width:100%}
figure{margin:0 0 .5em 0}figcaption{font-weight:bold;font-size:13px}"""


def render_html(report: Report, top: int = TOP_PAIRS, class_report: str | None = None) -> str:
    """The static report page: per problem, the ``top`` pairs ranked, each side by side with shared lines marked.

    Every piece of submission text (names, code, error messages) is HTML-escaped. ``class_report``, a
    relative link to the batch's class report page, is shown at the top when given.
    """
    base = report.starter
    out = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>Similarity report</title>",
           f"<style>{_STYLE}</style></head><body><h1>Similarity report</h1>",
           f"<p>{report.submissions} submission(s) read. A score is the share of normalised code fingerprints two "
           "submissions have in common on one problem (1.0: the same code up to names, literals, comments and "
           "layout). Starter and provided text are ignored. Highlighted lines hold a passage of "
           f"{K_GRAM + HIGHLIGHT_RUN - 1} or more normalised tokens that both have in the same order. <b>A high "
           "score is a reason to look, not a verdict</b>: short problems leave little room for different "
           "solutions.</p>"]
    if class_report:
        out.append(f"<p>What the class got wrong, per criterion: <a href='{html.escape(quote(class_report))}'>class "
                   "report</a>.</p>")
    if report.skipped:
        out.append("<h2>Inputs left out</h2><ul>" + "".join(
            f"<li>{html.escape(name)}: {html.escape(reason)}</li>" for name, reason in report.skipped) + "</ul>")
    if report.empty:
        out.append("<p>Nothing implemented beyond the starter: " + ", ".join(html.escape(n) for n in report.empty)
                   + "</p>")
    by_problem: dict[str, list] = {}
    for row in report.rows:
        by_problem.setdefault(row[0], []).append(row)
    for problem, rows in by_problem.items():
        shown = rows[:top]
        out.append(f"<h2>Problem {html.escape(problem)}</h2><table><tr><th>#</th><th>a</th><th>b</th>"
                   "<th>similarity</th></tr>")
        out += [f"<tr><td><a href='#p{html.escape(problem)}-{n}'>{n}</a></td><td>{html.escape(a)}</td>"
                f"<td>{html.escape(b)}</td><td>{sim:.3f}</td></tr>" for n, (_, a, b, sim) in enumerate(shown, 1)]
        out.append(f"</table><p>{len(rows)} pair(s) in pairs.csv.</p>")
        entries = report.entries[problem]
        for n, (_, a, b, sim) in enumerate(shown, 1):
            left, right = entries[a], entries[b]
            out.append(f"<h3 id='p{html.escape(problem)}-{n}'>Problem {html.escape(problem)} #{n}: "
                       f"{html.escape(a)} vs {html.escape(b)} ({sim:.3f})</h3><div class='pair'>"
                       f"<div>{_pane(left, _shared_lines(left, right, base[problem]))}</div>"
                       f"<div>{_pane(right, _shared_lines(right, left, base[problem]))}</div></div>")
    out.append("</body></html>\n")
    return "\n".join(out)
