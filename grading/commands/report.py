"""Grading output: the terminal table, Gradescope's results.json, and the exit code.

``python -m grading.commands.report placeholder|finalize`` are the steps the
Gradescope bundle's ``run_autograder`` runs before and after the grade.
"""
from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

from grading.kit import points
from grading.problems import titles
from grading.engine.runner import CriterionResult

EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_INCOMPLETE, EXIT_GRADER_ERROR = 0, 1, 2, 3, 4


def exit_code(results: list[CriterionResult]) -> int:
    """0 all passed; 1 some criterion failed; 3 nothing wrong but some work not implemented; 4 grader bug."""
    statuses = {r.status for r in results}
    if "grader_error" in statuses:
        return EXIT_GRADER_ERROR
    if "failed" in statuses:
        return EXIT_FAIL
    if "not_implemented" in statuses:
        return EXIT_INCOMPLETE
    return EXIT_PASS


def summary(message: str, width: int = 100) -> list[str]:
    """What the default table shows of a failure message: its first line and every "likely cause", "pattern" and
    "symptom" line, each wrapped at ``width`` (never cut). ``--verbose`` shows the whole message instead."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    kept = lines[:1] + [line for line in lines[1:] if line.startswith(("likely cause", "pattern:", "symptom:"))]
    return [part for line in kept for part in textwrap.wrap(line, width, break_on_hyphens=False)]


def table(results: list[CriterionResult], notes: list[str] = (), verbose: bool = False) -> str:
    """The per-problem table: each criterion's points, status, seconds and reason, then totals."""
    lines = []
    for note in notes:
        lines.append(f"NOTE: {note}")
    if notes:
        lines.append("")
    problems = sorted({r.problem for r in results}, key=lambda p: [int(x) for x in p.split(".")])
    for problem in problems:
        rows = [r for r in results if r.problem == problem]
        lines.append(f"Problem {problem}  {titles().get(problem, '')}")
        lines.append(f"  [{points.scored(rows)}]")
        for r in rows:
            mark = {"passed": "PASS", "failed": "FAIL", "not_implemented": "TODO", "grader_error": "ERR!"}[r.status]
            lines.append(f"  {mark} {r.score:>4g}/{r.max_score:<4g} {r.seconds:6.1f}s  {r.id:<34} {r.title}")
            if r.message:
                body = r.message.strip().splitlines() if verbose else summary(r.message)
                lines.extend("         " + line for line in body)
    lines.append("")
    lines.append(f"TOTAL {points.scored(results)}")
    return "\n".join(lines)


def gradescope_json(results: list[CriterionResult], notes: list[str] = ()) -> dict:
    """Gradescope's results.json: score, tests[] (name, score, max_score, status, output, visibility)."""
    tests = [{
        "name": f"{r.id}: {r.title}",
        "number": r.problem,
        "score": r.score,
        "max_score": r.max_score,
        "status": "passed" if r.passed else "failed",
        "output": r.message or "passed",
        "visibility": "after_published" if r.hidden else "visible",
    } for r in results]
    return {
        "score": sum(r.score for r in results),
        "max_score": sum(r.max_score for r in results),
        "output": "\n".join(notes),
        "visibility": "visible",
        "tests": tests,
    }


def write_json(path: Path, results: list[CriterionResult], notes: list[str] = ()) -> None:
    """Write ``gradescope_json`` to ``path`` (parents created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(gradescope_json(results, notes), indent=1) + "\n")


PLACEHOLDER = "grading started but did not finish (the grader was killed or ran out of time)"


def write_placeholder(path: Path) -> None:
    """A results.json saying the grade did not finish, written before it starts (the real report replaces it)."""
    write_json(path, [], [PLACEHOLDER])


def finalize(results: Path, exit_code: int, out_of_time: bool) -> bool:
    """Keep the grade's results.json when the grade finished; otherwise write one that says why it did not.

    ``exit_code`` is the grade's (through ``timeout``), ``out_of_time`` whether the whole run reached its limit
    (``GRADING_TOTAL_TIMEOUT``). Returns True when the grade's own report was kept.
    """
    try:
        data = json.loads(results.read_text())
        finished = isinstance(data, dict) and isinstance(data.get("tests"), list) and data.get("output") != PLACEHOLDER
    except (OSError, ValueError):
        finished = False
    if finished and not out_of_time:
        return True
    if out_of_time:
        why = ("ran out of time (GRADING_TOTAL_TIMEOUT): a submission that runs far slower than the reference, or "
               "a limit set below what the assignment needs")
    elif exit_code >= 128:
        why = (f"was stopped by signal {exit_code - 128} before it finished: a submission that kills its grader, "
               "or the container ran out of memory")
    else:
        why = f"stopped with exit code {exit_code} without a report"
    write_json(results, [], [f"The autograder {why}. Please tell the course staff."])
    return False


def main(argv: list[str]) -> int:
    """``placeholder RESULTS`` or ``finalize RESULTS EXIT_CODE OUT_OF_TIME(0|1)``: the two steps ``run_autograder``
    (Gradescope) runs around the grade, so that Gradescope always gets a valid results.json that says what
    happened."""
    if len(argv) == 2 and argv[0] == "placeholder":
        write_placeholder(Path(argv[1]))
        return 0
    if len(argv) == 4 and argv[0] == "finalize" and argv[2].isdigit() and argv[3] in ("0", "1"):
        finalize(Path(argv[1]), int(argv[2]), argv[3] == "1")
        return 0
    print("usage: python -m grading.commands.report placeholder RESULTS | finalize RESULTS EXIT_CODE OUT_OF_TIME",
          file=sys.stderr)
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
