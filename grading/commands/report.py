"""Grading output: the terminal table, Gradescope's results.json, and the exit code."""
from __future__ import annotations

import json
from pathlib import Path

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


def _short(message: str, width: int = 110) -> str:
    first = message.strip().splitlines()[0] if message.strip() else ""
    return first if len(first) <= width else first[: width - 1] + "…"


def table(results: list[CriterionResult], notes: list[str] = (), verbose: bool = False) -> str:
    """The per-problem table: each criterion's points, status, seconds and reason, then totals."""
    lines = []
    for note in notes:
        lines.append(f"NOTE: {note}")
    if notes:
        lines.append("")
    problems = sorted({r.problem for r in results}, key=lambda p: [int(x) for x in p.split(".")])
    total = got = 0.0
    for problem in problems:
        rows = [r for r in results if r.problem == problem]
        score, max_score = sum(r.score for r in rows), sum(r.max_score for r in rows)
        total, got = total + max_score, got + score
        lines.append(f"Problem {problem}  {titles().get(problem, '')}  [{score:g}/{max_score:g}]")
        for r in rows:
            mark = {"passed": "PASS", "failed": "FAIL", "not_implemented": "TODO", "grader_error": "ERR!"}[r.status]
            lines.append(f"  {mark} {r.score:>4g}/{r.max_score:<4g} {r.seconds:6.1f}s  {r.id:<34} {r.title}")
            if r.message:
                body = r.message.strip() if verbose else _short(r.message)
                lines.extend("         " + line for line in body.splitlines())
    lines.append("")
    lines.append(f"TOTAL {got:g}/{total:g}")
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
