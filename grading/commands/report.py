"""Grading output: the terminal table and the exit code (Gradescope's results.json is ``results_json``'s).

``python -m grading.commands.report placeholder|finalize`` are the steps the
Gradescope bundle's ``run_autograder`` runs before and after the grade
(``results_json.write_placeholder``, ``results_json.finalize``).
"""
from __future__ import annotations

import re
import sys
import textwrap
import threading
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

from grading.kit import points
from grading.problems import titles
from grading.commands import results_json
from grading.commands.grades_csv import RowStatus
from grading.commands.result_tests import Verdict, is_hidden, verdict
from grading.engine.runner import CriterionResult, Status

EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_INCOMPLETE, EXIT_GRADER_ERROR = 0, 1, 2, 3, 4


def exit_code(results: list[CriterionResult]) -> int:
    """0 all passed; 1 some criterion failed; 3 nothing wrong but some work not implemented, or not graded (the
    grade's total time ran out); 4 grader bug."""
    statuses = {r.status for r in results}
    if Status.GRADER_ERROR in statuses:
        return EXIT_GRADER_ERROR
    if Status.FAILED in statuses:
        return EXIT_FAIL
    if statuses & {Status.NOT_IMPLEMENTED, Status.NOT_GRADED}:
        return EXIT_INCOMPLETE
    return EXIT_PASS


def summary(message: str, width: int = 100) -> list[str]:
    """What the default table shows of a failure message: its first line and every "likely cause", "pattern" and
    "symptom" line, each wrapped at ``width`` (never cut). ``--verbose`` shows the whole message instead."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    kept = lines[:1] + [line for line in lines[1:] if line.startswith(("likely cause", "pattern:", "symptom:"))]
    return [part for line in kept for part in textwrap.wrap(line, width, break_on_hyphens=False)]


MARKS = {Status.PASSED: "PASS", Status.FAILED: "FAIL", Status.NOT_IMPLEMENTED: "TODO", Status.GRADER_ERROR: "ERR!",
         Status.NOT_GRADED: "SKIP"}


def table(results: list[CriterionResult], notes: list[str] = (), verbose: bool = False, public: bool = False) -> str:
    """The per-problem table: each criterion's points, status, seconds and reason, then totals.

    ``public`` (what a student may see): hidden criteria are left out, each problem says only how many it has,
    and the subtotals and total earn public points only, the hidden ones stated as a starter's table states them
    (``_public``). ``LiveTable`` writes the same lines as a grade goes.
    """
    lines = _note_lines(notes)
    for problem in _problems(results):
        lines += _block(results, problem, verbose, public)
    return "\n".join([*lines, *_footer(results, public)])


def _note_lines(notes: list[str]) -> list[str]:
    return [f"NOTE: {note}" for note in notes] + ([""] if notes else [])


def _problems(results: list[CriterionResult]) -> list[str]:
    return sorted({r.problem for r in results}, key=lambda p: [int(x) for x in p.split(".")])


def _block(results: list[CriterionResult], problem: str, verbose: bool, public: bool) -> list[str]:
    """The table's lines of ``problem``: its header with its subtotal, then one line per criterion (a starter's
    stubs one line per function)."""
    rows = [r for r in results if r.problem == problem and not (public and r.hidden)]
    lines = [f"Problem {problem}  {titles().get(problem, '')}",
             f"  [{_public([r for r in results if r.problem == problem]) if public else points.scored(rows)}]"]
    stubs = {} if verbose else _stubs(rows)
    for r in rows:
        if r.id in stubs:
            if stubs[r.id]:
                lines.append(stubs[r.id])
            continue
        lines.append(f"  {MARKS[r.status]} {r.score:>4g}/{r.max_score:<4g} {r.seconds:6.1f}s  {r.id:<34} {r.title}")
        if r.message:
            body = r.message.strip().splitlines() if verbose else summary(r.message)
            lines.extend("         " + line for line in body)
    if hidden := sum(1 for r in results if r.problem == problem and r.hidden and public):
        lines.append(f"  ({hidden} more check(s) the course shows after grades are published)")
    return lines


def _footer(results: list[CriterionResult], public: bool = False) -> list[str]:
    """The table's last lines: the grade's ``verdict`` (``verdict_lines``), the total its own way."""
    found = verdict(results_json.gradescope_json(results))
    return verdict_lines(found, _public(results) if public else points.scored(results))


def verdict_lines(found: Verdict, total: points.Tally | str | None = None, status: RowStatus | str = "") -> list[str]:
    """How a table ends: "" and ``TOTAL <total>`` (default: ``found``'s points) for a grade that judged every
    criterion; for one that did not, first the verdict's ``marker`` and each reason (``Verdict.why``), then
    ``TOTAL score left blank`` when it judged nothing. The grade's table and a batch's ``report.txt`` of a grade
    it stopped (``batch``) end with these lines, as results.json and grades.csv state the same verdict."""
    if total is None:
        total = "" if found.score is None else f"{found.score:g}/{found.max_score:g} points"
    lines = [""]
    if found.partial or found.score is None:
        lines.append(f"NOTE: {found.marker(status or RowStatus.TIMEOUT)}")
        lines += [f"NOTE: {why}" for why in found.why]
    lines.append("TOTAL score left blank: no check was graded" if found.score is None else f"TOTAL {total}")
    return lines


def stopped_lines(data: dict, why: str, status: RowStatus) -> list[str]:
    """The end of the table of a grade that was stopped before it wrote its own (``batch`` appends these to its
    ``report.txt``): why it stopped, then ``verdict_lines`` of the results.json ``data`` it left, the total stated
    as the grade's own table states it."""
    tests = [t for t in data.get("tests", []) if isinstance(t, dict)] if isinstance(data, dict) else []
    rows = [SimpleNamespace(problem=str(t.get("number", "")), score=float(t.get("score", 0) or 0),
                            max_score=float(t.get("max_score", 0) or 0), hidden=is_hidden(t)) for t in tests]
    ending = verdict_lines(verdict(data), points.scored(rows), status)
    return ["", f"NOTE: the grade did not finish: {why}", *ending[1:]]


class LiveTable:
    """The staff table written while a grade runs (``grade``), so stdout holds what was graded however the grade
    ends (an outer ``timeout``, a kill): the notes known at the start, then each problem's block as soon as all
    its criteria are judged (in table order, flushed), and at the end (``close``) the other blocks, the notes
    found since and the footer. Written whole, it reads as ``table``."""

    def __init__(self, listed: list[CriterionResult], notes: list[str], verbose: bool = False, public: bool = False,
                 transform: Callable[[str], str] = str, out=None):
        self.verbose, self.public, self.transform, self.out = verbose, public, transform, out
        self.verdicts: dict[str, CriterionResult | None] = {r.id: None for r in listed}
        self.problems = _problems(listed)
        self.notes, self.written = list(notes), 0
        self._lock = threading.Lock()
        self._write(_note_lines(self.notes))

    def judged(self, verdicts: list[CriterionResult]) -> None:
        """A case's verdicts are known: write every block now complete, in order."""
        with self._lock:
            self.verdicts.update((v.id, v) for v in verdicts if v.id in self.verdicts)
            while self.written < len(self.problems):
                problem = self.problems[self.written]
                rows = [v for k, v in self.verdicts.items() if _problem_of(k) == problem]
                if any(v is None for v in rows):
                    break
                self._write(_block(self._shown(rows), problem, self.verbose, self.public))
                self.written += 1

    def close(self, results: list[CriterionResult], notes: list[str], before_footer: list[str] = ()) -> None:
        """The grade is done: its remaining blocks, the notes not written yet, ``before_footer``, the footer."""
        with self._lock:
            shown = self._shown(results)
            lines = [line for problem in self.problems[self.written:] for line in _block(shown, problem, self.verbose,
                                                                                          self.public)]
            self.written = len(self.problems)
            late = [note for note in notes if note not in self.notes]
            self._write([*lines, *(([""] + [f"NOTE: {note}" for note in late]) if late else []), *before_footer,
                         *_footer(shown, self.public)])

    def _shown(self, rows: list[CriterionResult]) -> list[CriterionResult]:
        return [replace(r, message=self.transform(r.message)) for r in rows]

    def _write(self, lines: list[str]) -> None:
        if lines:
            out = self.out or sys.stdout
            out.write("\n".join(lines) + "\n")
            out.flush()


def _problem_of(criterion: str) -> str:
    return ".".join(criterion.split(".")[:2])


STUB = re.compile(r"NotImplementedError: Problem ([\d.]+): (\w+) is not implemented yet")    # splice.stub_body


def _stubs(rows: list[CriterionResult]) -> dict[str, str]:
    """The unfinished criteria of ``rows`` (``not_implemented`` at a starter's stub), one table line per stub
    function: criterion id -> the line of its function at its first criterion, '' at the others."""
    groups: dict[str, list[CriterionResult]] = {}
    for r in rows:
        if r.status == Status.NOT_IMPLEMENTED and (match := STUB.search(r.message)):
            groups.setdefault(f"{match.group(2)} is not implemented yet (BEGIN_STUDENT {match.group(1)})", []).append(r)
    out = {}
    for stub, group in groups.items():
        worth = sum(r.max_score for r in group)
        out.update({r.id: "" for r in group})
        out[group[0].id] = f"  {MARKS[Status.NOT_IMPLEMENTED]} {0:>4g}/{worth:<4g}          {stub}: {len(group)} " \
                           f"check(s)"
    return out


def _public(results: list[CriterionResult]) -> points.Tally:
    """What a student may see of ``results``' points: public ones earned of their maximum, hidden ones as points
    the course adds (what a starter's own table says), none of their verdicts."""
    public = [r for r in results if not r.hidden]
    return points.Tally(sum(r.max_score for r in public), sum(r.max_score for r in results if r.hidden),
                        sum(r.score for r in public))


def main(argv: list[str]) -> int:
    """``placeholder RESULTS`` or ``finalize RESULTS EXIT_CODE REACHED_S``: the two steps ``run_autograder``
    (Gradescope) runs around the grade, so that Gradescope always gets a valid results.json that says what
    happened (``REACHED_S``: the total time in seconds the run reached, 0 when it did not)."""
    if len(argv) == 2 and argv[0] == "placeholder":
        results_json.write_placeholder(Path(argv[1]))
        return 0
    if len(argv) == 4 and argv[0] == "finalize" and argv[2].isdigit() and argv[3].isdigit():
        results_json.finalize(Path(argv[1]), int(argv[2]), float(argv[3]))
        return 0
    print("usage: python -m grading.commands.report placeholder RESULTS | finalize RESULTS EXIT_CODE REACHED_S",
          file=sys.stderr)
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
