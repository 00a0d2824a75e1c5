"""The class report as one static page (``grades_class_report.html``): what to act on, first.

Sections, top to bottom: who was not counted and why; the score
distribution per problem (public and hidden subtotals, and the histogram);
per criterion the pass rate among the submissions that attempted it and
its largest failure groups with their likely causes; the pass-rate figure;
one row per student, linking to that student's ``results.json`` and
``report.txt`` (relative links, so the folder can be copied or zipped).
Every piece of student-controlled text (names, messages) is HTML-escaped.
"""
from __future__ import annotations

import html
from pathlib import Path
from urllib.parse import quote

PAGE_STYLE = ("body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;margin-bottom:1em}"
          "td,th{border:1px solid #bbb;padding:2px 6px;font-size:13px;vertical-align:top}"
          "ol{margin:0;padding-left:1.2em}.cause{color:#555}img{max-width:100%;height:auto}")
_STUDENT_COLUMNS = ("score", "max_score", "status")


def _e(value: object) -> str:
    return html.escape(str(value))


def _link(target: str, text: str) -> str:
    return f"<a href='{_e(quote(target))}'>{_e(text)}</a>"


def _table(header: list[str], rows: list[list[str]]) -> str:
    """A table of already escaped cells."""
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _figure(path: Path, note: str, alt: str) -> str:
    return f"<p>{_e(note)}</p>" if note else f"<p><img src='{_e(quote(path.name))}' alt='{_e(alt)}'></p>"


def _groups(row: dict) -> str:
    """The criterion's failure groups as a list: example message, how many share it, likely cause."""
    items = []
    k = 1
    while row.get(f"failure_{k}") is not None:
        cause = row.get(f"likely_cause_{k}", "")
        items.append(f"<li>{_e(row[f'failure_{k}'])} <b>[{_e(row[f'sharing_{k}'])}]</b>"
                     + (f"<br><span class='cause'>likely cause: {_e(cause)}</span>" if cause else "") + "</li>")
        k += 1
    return f"<ol>{''.join(items)}</ol>" if items else ""


def _criteria(rows: list[dict]) -> str:
    header = ["criterion", "problem", "points", "visibility", "attempted", "not attempted", "passed",
              "pass rate (of attempts)", "largest failure groups [submissions]"]
    cells = [[_e(r["criterion"]) + f"<br><small>{_e(r['title'])}</small>", _e(r["problem"]), _e(r["points"]),
              _e(r["visibility"]), _e(r["attempted"]), _e(r["not_attempted"]), _e(r["passed"]),
              _e(r["pass_rate"] or "-"), _groups(r)] for r in rows]
    return _table(header, cells)


def _students(students: list[dict]) -> str:
    if not students:
        return ""
    problems = [c for c in dict.fromkeys(k for s in students for k in s) if c.startswith("problem_")]
    rows = []
    for s in sorted(students, key=lambda s: str(s.get("submission", ""))):
        target = str(s.get("results", ""))
        links = (f" ({_link(target, 'results.json')}, {_link(str(Path(target).with_name('report.txt')), 'report')})"
                 if target else "")
        rows.append([_e(s.get("submission", "")) + links, *[_e(s.get(c, "")) for c in _STUDENT_COLUMNS],
                     *[_e(s.get(c, "")) for c in problems], _e(s.get("notes", ""))])
    return ("<h2>Students</h2><p>A blank score was not graded to the end (see notes): never upload it as 0.</p>"
            + _table(["submission", *_STUDENT_COLUMNS, *problems, "notes"], rows))


def render(paths: dict[str, Path], rows: list[dict], score_rows: list[dict], submissions: int,
           not_graded: dict[str, str], students: list[dict], notes: dict[str, str]) -> str:
    """The page's HTML. ``paths``: ``class_report.report_paths``; ``rows``: the criterion rows of the report's
    CSV; ``score_rows``: ``score_distribution.summary_rows``; ``submissions``: how many were counted;
    ``not_graded``: name -> status of those that were not; ``students``: grades.csv rows (with their
    ``results`` link); ``notes``: figure kind (``png``, ``scores_png``) -> why it is missing, or ""."""
    missing = ("Not counted (not graded to the end): "
               + ", ".join(f"{_e(n)} ({_e(s)})" for n, s in sorted(not_graded.items())) + ".") if not_graded else ""
    scores = _table(["problem", "sub-problems", "graded", "not attempted", "public mean / max",
                     "hidden mean / max", "total mean / max", "median", "full marks"],
                    [[_e(r["problem"]), _e(r["sub_problems"]), _e(r["graded"]), _e(r["not_attempted"]),
                      f"{_e(r['public_mean'] or '-')} / {_e(r['public_max'])}",
                      f"{_e(r['hidden_mean'] or '-')} / {_e(r['hidden_max'])}",
                      f"{_e(r['mean'] or '-')} / {_e(r['max_score'])} of {_e(r['attempted'])} attempted",
                      _e(r["median"] or "-"),
                      _e(r["full_marks"])] for r in score_rows])
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>Class report</title>"
            f"<style>{PAGE_STYLE}</style></head><body><h1>Class report</h1>"
            f"<p>{submissions} graded submission(s). {missing}</p>"
            "<h2>Scores per problem</h2><p>Public criteria are the ones students run themselves; hidden ones run "
            "only here. Not attempted: every criterion of every sub-problem still stops at the starter's stub "
            f"(NotImplementedError); means, median, full marks and the histograms count only the submissions "
            f"that attempted the problem. As CSV: {_link(paths['scores_csv'].name, paths['scores_csv'].name)}.</p>"
            f"{scores}{_figure(paths['scores_png'], notes.get('scores_png', ''), 'score distributions')}"
            "<h2>Criteria</h2><p>Pass rate: passed / attempted (a sub-problem left as the starter's stub is not "
            "attempted and counts neither way). A failure group is one mistake: messages that differ only in "
            "their numbers; each shows one example, how many submissions share it and the likely cause their "
            f"own results give. As CSV: {_link(paths['csv'].name, paths['csv'].name)}.</p>"
            f"{_criteria(rows)}{_figure(paths['png'], notes.get('png', ''), 'pass rates')}"
            f"{_students(students)}</body></html>\n")
