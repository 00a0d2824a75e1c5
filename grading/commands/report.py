"""Grading output: the terminal table, Gradescope's results.json, and the exit code.

``python -m grading.commands.report placeholder|finalize`` are the steps the
Gradescope bundle's ``run_autograder`` runs before and after the grade. While a
grade runs, its results.json is a ``PartialReport``, so a grade stopped at any
point keeps every verdict it reached (``finish``).
"""
from __future__ import annotations

import json
import re
import sys
import textwrap
import threading
from dataclasses import replace
from pathlib import Path
from typing import Callable

from grading.kit import points
from common.files import atomic_write, read_json
from grading.problems import titles
from grading.engine.runner import NOT_GRADED, CriterionResult, out_of_time, while_running

EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_INCOMPLETE, EXIT_GRADER_ERROR = 0, 1, 2, 3, 4


def exit_code(results: list[CriterionResult]) -> int:
    """0 all passed; 1 some criterion failed; 3 nothing wrong but some work not implemented, or not graded (the
    grade's total time ran out); 4 grader bug."""
    statuses = {r.status for r in results}
    if "grader_error" in statuses:
        return EXIT_GRADER_ERROR
    if "failed" in statuses:
        return EXIT_FAIL
    if statuses & {"not_implemented", "not_graded"}:
        return EXIT_INCOMPLETE
    return EXIT_PASS


def summary(message: str, width: int = 100) -> list[str]:
    """What the default table shows of a failure message: its first line and every "likely cause", "pattern" and
    "symptom" line, each wrapped at ``width`` (never cut). ``--verbose`` shows the whole message instead."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    kept = lines[:1] + [line for line in lines[1:] if line.startswith(("likely cause", "pattern:", "symptom:"))]
    return [part for line in kept for part in textwrap.wrap(line, width, break_on_hyphens=False)]


MARKS = {"passed": "PASS", "failed": "FAIL", "not_implemented": "TODO", "grader_error": "ERR!", "not_graded": "SKIP"}


def table(results: list[CriterionResult], notes: list[str] = (), verbose: bool = False, public: bool = False) -> str:
    """The per-problem table: each criterion's points, status, seconds and reason, then totals.

    ``public`` (what a student may see): hidden criteria are left out, each problem says only how many it has,
    and the subtotals and total earn public points only, the hidden ones stated as a starter's table states them
    (``_public``).
    """
    lines = []
    for note in notes:
        lines.append(f"NOTE: {note}")
    if notes:
        lines.append("")
    problems = sorted({r.problem for r in results}, key=lambda p: [int(x) for x in p.split(".")])
    for problem in problems:
        rows = [r for r in results if r.problem == problem and not (public and r.hidden)]
        lines.append(f"Problem {problem}  {titles().get(problem, '')}")
        lines.append(f"  [{_public([r for r in results if r.problem == problem]) if public else points.scored(rows)}]")
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
    lines.append("")
    lines.append(f"TOTAL {_public(results) if public else points.scored(results)}")
    return "\n".join(lines)


STUB = re.compile(r"NotImplementedError: Problem ([\d.]+): (\w+) is not implemented yet")    # splice.stub_body


def _stubs(rows: list[CriterionResult]) -> dict[str, str]:
    """The unfinished criteria of ``rows`` (``not_implemented`` at a starter's stub), one table line per stub
    function: criterion id -> the line of its function at its first criterion, '' at the others."""
    groups: dict[str, list[CriterionResult]] = {}
    for r in rows:
        if r.status == "not_implemented" and (match := STUB.search(r.message)):
            groups.setdefault(f"{match.group(2)} is not implemented yet (BEGIN_STUDENT {match.group(1)})", []).append(r)
    out = {}
    for stub, group in groups.items():
        worth = sum(r.max_score for r in group)
        out.update({r.id: "" for r in group})
        out[group[0].id] = f"  {MARKS['not_implemented']} {0:>4g}/{worth:<4g}          {stub}: {len(group)} " \
                           f"check(s)"
    return out


def _public(results: list[CriterionResult]) -> points.Tally:
    """What a student may see of ``results``' points: public ones earned of their maximum, hidden ones as points
    the course adds (what a starter's own table says), none of their verdicts."""
    public = [r for r in results if not r.hidden]
    return points.Tally(sum(r.max_score for r in public), sum(r.max_score for r in results if r.hidden),
                        sum(r.score for r in public))


UNFINISHED = "unfinished"        # extra_data key of a results.json written while its grade still ran
HIT_LIMIT = "hit_limit"          # extra_data key: the cases that reached their limit (staff notes; may be hidden)
PROTECTION = "protection"        # extra_data key: what student code could not read or write (``isolation.summary``)


def gradescope_json(results: list[CriterionResult], notes: list[str] = (), extra: dict | None = None) -> dict:
    """Gradescope's results.json: score, tests[] (name, score, max_score, status, output, visibility).

    Hidden criteria are ``after_published``; stdout (the staff table) is ``hidden`` from students. ``extra`` goes
    to ``extra_data`` (Gradescope's spec: "extra data to be stored"; it describes no display of it).
    """
    tests = [{
        "name": f"{r.id}: {r.title}",
        "number": r.problem,
        "score": r.score,
        "max_score": r.max_score,
        "status": "passed" if r.passed else "failed",
        "output": r.student_message or "passed",
        "visibility": "after_published" if r.hidden else "visible",
    } for r in results]
    return {
        "score": sum(r.score for r in results),
        "max_score": sum(r.max_score for r in results),
        "output": "\n".join(notes),
        "visibility": "visible",
        "stdout_visibility": "hidden",
        **({"extra_data": extra} if extra else {}),
        "tests": tests,
    }


def write_json(path: Path, results: list[CriterionResult], notes: list[str] = (), extra: dict | None = None) -> None:
    """Write ``gradescope_json`` to ``path`` atomically (parents created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(gradescope_json(results, notes, extra), indent=1) + "\n")


class PartialReport:
    """A results.json kept current while a grade runs: the criteria judged so far with their verdicts, every other
    one not graded (``runner.NOT_GRADED``), rewritten atomically when a case starts and once it is judged.

    A grade stopped at any point (its total time, a signal) thus leaves what it judged; ``extra_data[UNFINISHED]``
    names the problem whose case was running, and ``finish`` turns the file into a final report. ``pending``: the
    verdicts to start from (``runner.not_graded``); ``transform`` maps each message before it is written.
    """

    def __init__(self, path: Path, pending: list[CriterionResult], notes: list[str],
                 transform: Callable[[str], str] = str):
        self.path, self.notes, self.transform = Path(path), list(notes), transform
        self.verdicts = {r.id: r for r in pending}
        self.running_problem: str | None = None
        self._lock = threading.Lock()
        self.write()

    def running(self, problem: str) -> None:
        """A case of ``problem`` starts."""
        self.running_problem = problem
        self.write()

    def judged(self, verdicts: list[CriterionResult]) -> None:
        """A case's verdicts are known."""
        with self._lock:
            self.verdicts.update((v.id, v) for v in verdicts if v.id in self.verdicts)
        self.write()

    def write(self) -> None:
        """Rewrite the file (atomically) with what is known now."""
        with self._lock:
            results = [replace(r, message=self.transform(r.message)) for r in self.verdicts.values()]
            write_json(self.path, results, self.notes, {UNFINISHED: {"running": self.running_problem}})


def finish(path: Path, why: str, headline: str = "") -> dict | None:
    """Turn the unfinished results.json at ``path`` (a ``PartialReport`` whose grade was stopped) into a final one
    and return it: each criterion not graded says ``why``, with the problem that was running, and so does the
    top-level output, once (after ``headline``, when given). None, and nothing written, when ``path`` holds no
    unfinished report."""
    try:
        data = json.loads(Path(path).read_text())
        state = data["extra_data"][UNFINISHED]
        tests = [t for t in data["tests"] if isinstance(t, dict)]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    reason = while_running(why, state.get("running") if isinstance(state, dict) else None)
    skipped = [t for t in tests if str(t.get("output", "")).startswith(NOT_GRADED)]
    for test in skipped:
        test["output"] = NOT_GRADED + reason
    line = (f"{reason}: {len(skipped)} check(s) not graded, every other one keeps its verdict"
            if skipped else reason)
    data["output"] = "\n".join(x for x in (headline, str(data.get("output", "")), line) if x)
    data["tests"] = tests
    del data["extra_data"][UNFINISHED]
    if not data["extra_data"]:
        del data["extra_data"]
    atomic_write(path, json.dumps(data, indent=1) + "\n")
    return data


PLACEHOLDER = "grading started but did not finish (the grader was killed or ran out of time)"


def write_placeholder(path: Path) -> None:
    """A results.json saying the grade did not finish, written before it starts (the real report replaces it)."""
    write_json(path, [], [PLACEHOLDER])


def finalize(results: Path, exit_code: int, reached_s: float) -> bool:
    """Keep the grade's results.json when the grade finished; otherwise make it say why the grade stopped.

    ``exit_code`` is the grade's (through ``timeout``), ``reached_s`` the total time (``GRADING_TOTAL_TIMEOUT``)
    the run reached, 0 when it did not. A grade stopped midway left a ``PartialReport``: its judged criteria
    keep their verdicts and the rest say why they were not graded (``finish``); a grade stopped before it listed
    its criteria leaves a report with no tests that says why; one that finished with criteria it had no time for
    (its own total) gets the out-of-time headline. Returns True when the grade's own report was kept.
    """
    data, _ = read_json(results)
    data = data if isinstance(data, dict) and isinstance(data.get("tests"), list) else None
    unfinished = data is not None and UNFINISHED in (data.get("extra_data") or {})
    finished = data is not None and not unfinished and data.get("output") != PLACEHOLDER
    if finished and not any(str(t.get("output", "")).startswith(NOT_GRADED) for t in data["tests"]
                            if isinstance(t, dict)):
        return True
    if reached_s or finished:       # finished with criteria it had no time for: it reached its own total
        why = out_of_time(reached_s)
        headline = ("The autograder ran out of time (GRADING_TOTAL_TIMEOUT): a submission that runs far slower than "
                    "the reference, or a limit set below what the assignment needs.")
    elif exit_code >= 128:
        why = f"the grade was stopped by signal {exit_code - 128}"
        headline = (f"The autograder was stopped by signal {exit_code - 128} before it finished: the container ran "
                    "out of memory, or something outside the grade stopped it.")
    else:
        why = f"the grade stopped with exit code {exit_code}"
        headline = f"The autograder stopped with exit code {exit_code} without a report."
    headline += " Please tell the course staff."
    if finished:
        data["output"] = "\n".join(x for x in (headline, str(data.get("output", ""))) if x)
        atomic_write(results, json.dumps(data, indent=1) + "\n")
        return True
    if not unfinished or finish(results, why, headline) is None:
        write_json(results, [], [headline, while_running(why, None)])
    return False


def main(argv: list[str]) -> int:
    """``placeholder RESULTS`` or ``finalize RESULTS EXIT_CODE REACHED_S``: the two steps ``run_autograder``
    (Gradescope) runs around the grade, so that Gradescope always gets a valid results.json that says what
    happened (``REACHED_S``: the total time in seconds the run reached, 0 when it did not)."""
    if len(argv) == 2 and argv[0] == "placeholder":
        write_placeholder(Path(argv[1]))
        return 0
    if len(argv) == 4 and argv[0] == "finalize" and argv[2].isdigit() and argv[3].isdigit():
        finalize(Path(argv[1]), int(argv[2]), float(argv[3]))
        return 0
    print("usage: python -m grading.commands.report placeholder RESULTS | finalize RESULTS EXIT_CODE REACHED_S",
          file=sys.stderr)
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
