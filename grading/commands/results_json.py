"""Gradescope's results.json of a grade: written whole at its end, kept current while it runs.

While a grade runs, its results.json is a ``PartialReport``, so a grade stopped at any point keeps every verdict
it reached (``finish``); ``finalize`` makes any file the bundle's grade left say what happened.
"""
from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path
from typing import Callable

from common.files import atomic_write, read_json
from grading.commands.result_tests import GRADESCOPE_FAILED, GRADESCOPE_PASSED, criterion_id, verdict
from grading.engine.runner import NOT_GRADED, CriterionResult, cut_reason, out_of_time, skipped_reason
from grading.kit.hidden_view import student_message

UNFINISHED = "unfinished"        # extra_data key of a results.json written while its grade still ran
HIT_LIMIT = "hit_limit"          # extra_data key: the cases that reached their limit (staff notes; may be hidden)
PROTECTION = "protection"        # extra_data key: what student code could not read or write (``isolation.summary``)


def gradescope_json(results: list[CriterionResult], notes: list[str] = (), extra: dict | None = None) -> dict:
    """Gradescope's results.json: score, tests[] (name, score, max_score, status, output, visibility).

    Hidden criteria are ``after_published``; stdout (the staff table) is ``hidden`` from students. ``extra`` goes
    to ``extra_data`` (Gradescope's spec: "extra data to be stored"; it describes no display of it). The
    top-level ``score`` is ``result_tests.verdict``'s, the points of the criteria judged, and is left out (a blank)
    when none was (``finalize`` gives Gradescope, which has no blank, the sum of the tests: 0).
    """
    tests = [{
        "name": f"{r.id}: {r.title}",
        "number": r.problem,
        "score": r.score,
        "max_score": r.max_score,
        "status": GRADESCOPE_PASSED if r.passed else GRADESCOPE_FAILED,
        "output": student_message(r) or "passed",
        "visibility": "after_published" if r.hidden else "visible",
    } for r in results]
    return _with_verdict({
        "score": None,
        "max_score": sum(r.max_score for r in results),
        "output": "\n".join(notes),
        "visibility": "visible",
        "stdout_visibility": "hidden",
        **({"extra_data": extra} if extra else {}),
        "tests": tests,
    })


def _with_verdict(data: dict) -> dict:
    """``data`` (a results.json) with its top-level ``score`` set to its ``verdict``'s, or removed when blank."""
    found = verdict(data)
    if found.score is None:
        data.pop("score", None)
    else:
        data["score"] = found.score
    return data


def write_json(path: Path, results: list[CriterionResult], notes: list[str] = (), extra: dict | None = None) -> None:
    """Write ``gradescope_json`` to ``path`` atomically (parents created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(gradescope_json(results, notes, extra), indent=1) + "\n")


PENDING = "the grade stopped before this check ran"      # a partial report's reason until the grade says more


class PartialReport:
    """A results.json kept current while a grade runs: the criteria judged so far with their verdicts, every other
    one not graded (``runner.NOT_GRADED``), rewritten atomically when a case starts and once it is judged.

    A grade stopped at any point (its total time, a signal) thus leaves what it judged; ``extra_data[UNFINISHED]``
    names the problem whose case was running and the criteria whose cases had started, and ``finish`` turns the
    file into a final report. ``pending``: the verdicts to start from (``runner.not_graded`` with ``PENDING``);
    ``transform`` maps each message before it is written.
    """

    def __init__(self, path: Path, pending: list[CriterionResult], notes: list[str],
                 transform: Callable[[str], str] = str):
        self.path, self.notes, self.transform = Path(path), list(notes), transform
        self.verdicts = {r.id: r for r in pending}
        self.running_problem: str | None = None
        self.started: list[str] = []
        self._lock = threading.Lock()
        self.write()

    def running(self, problem: str, criteria: list[str] = ()) -> None:
        """A case of ``problem`` starts, judging ``criteria`` (their ids)."""
        with self._lock:
            self.running_problem = problem
            self.started += [c for c in criteria if c in self.verdicts and c not in self.started]
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
            write_json(self.path, results, self.notes, {UNFINISHED: {"running": self.running_problem,
                                                                     "started": list(self.started)}})


def finish(path: Path, why: str, headline: str = "") -> dict | None:
    """Turn the unfinished results.json at ``path`` (a ``PartialReport`` whose grade was stopped) into a final one
    and return it: each criterion still pending says ``why``, cut while its problem ran when a case of that problem
    had started (``runner.cut_reason``), else skipped before its problem started (``runner.skipped_reason``); the
    criteria whose verdicts were known (a case the grade itself skipped, too) keep them; the top-level
    output says each reason once (after ``headline``, when given), and the score is the ``verdict``'s. None, and
    nothing written, when ``path`` holds no unfinished report."""
    try:
        data = json.loads(Path(path).read_text())
        state = data["extra_data"][UNFINISHED]
        tests = [t for t in data["tests"] if isinstance(t, dict)]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    started = set(state.get("started") or []) if isinstance(state, dict) else set()
    running = {str(t.get("number", "")) for t in tests if criterion_id(t) in started}     # problems that started
    for test in tests:
        if str(test.get("output", "")) == NOT_GRADED + PENDING:
            problem = str(test.get("number", "")) or None
            test["output"] = NOT_GRADED + (cut_reason(why, problem) if problem in running or not problem
                                           else skipped_reason(why, problem))
    data["tests"] = tests
    found = verdict(data)
    data["output"] = "\n".join(x for x in (headline, str(data.get("output", "")), *found.why) if x)
    if not found.why and why not in data["output"]:
        data["output"] = "\n".join(x for x in (data["output"], why) if x)
    del data["extra_data"][UNFINISHED]
    if not data["extra_data"]:
        del data["extra_data"]
    atomic_write(path, json.dumps(_with_verdict(data), indent=1) + "\n")
    return data


PLACEHOLDER = "grading started but did not finish (the grader was killed or ran out of time)"


def write_placeholder(path: Path) -> None:
    """A results.json saying the grade did not finish, written before it starts (the real report replaces it)."""
    write_json(path, [], [PLACEHOLDER])


class GradeFile:
    """The ``--json`` file of one ``grade`` (None: the grade writes none, and every method does nothing): a
    placeholder from the start (``write_placeholder``: a killed grader still leaves one), a ``PartialReport`` while
    the cases run, then the final report; a rejected submission or a grader failure is written over whatever it
    holds."""

    def __init__(self, path: Path | None):
        self.path = None if path is None else Path(path)
        if self.path is not None:
            write_placeholder(self.path)

    def partial(self, pending: list[CriterionResult], notes: list[str],
                transform: Callable[[str], str] = str) -> PartialReport | None:
        """The ``PartialReport`` the file is while the cases run (``pending``, ``notes``, ``transform``: its own)."""
        return None if self.path is None else PartialReport(self.path, pending, notes, transform)

    def final(self, results: list[CriterionResult], notes: list[str] = (), extra: dict | None = None) -> None:
        """The grade's report (``write_json``): its verdicts, notes and ``extra_data``."""
        if self.path is not None:
            write_json(self.path, results, notes, extra)

    def grader_failed(self, why: str, message: str, unjudged: list[CriterionResult]) -> None:
        """The grader itself failed (``message``: its traceback): a partial report keeps what it judged, the rest
        saying ``why`` (``finish``); without one, every criterion is ``unjudged``."""
        if self.path is not None and finish(self.path, why, message) is None:
            write_json(self.path, unjudged, [message])


def finalize(results: Path, exit_code: int, reached_s: float) -> bool:
    """Keep the grade's results.json when the grade finished; otherwise make it say why the grade stopped.

    ``exit_code`` is the grade's (through ``timeout``), ``reached_s`` the total time (``GRADING_TOTAL_TIMEOUT``)
    the run reached, 0 when it did not. A grade stopped midway left a ``PartialReport``: its judged criteria
    keep their verdicts and the rest say why they were not graded (``finish``); a grade stopped before it listed
    its criteria leaves a report with no tests that says why; one that finished with criteria it had no time for
    (its own total) gets the out-of-time headline. Gradescope has no blank score: a report that judged nothing
    (``verdict``) gets the sum of its tests, 0, its output saying why. Returns True when the grade's own report
    was kept.
    """
    kept = _finalize(results, exit_code, reached_s)
    data, _ = read_json(results)
    if isinstance(data, dict) and "score" not in data:
        tests = [t for t in data.get("tests", []) if isinstance(t, dict)] if isinstance(data.get("tests"), list) else []
        data["score"] = sum(float(t.get("score", 0) or 0) for t in tests)
        atomic_write(results, json.dumps(data, indent=1) + "\n")
    return kept


def _finalize(results: Path, exit_code: int, reached_s: float) -> bool:
    data, _ = read_json(results)
    data = data if isinstance(data, dict) and isinstance(data.get("tests"), list) else None
    unfinished = data is not None and UNFINISHED in (data.get("extra_data") or {})
    finished = data is not None and not unfinished and data.get("output") != PLACEHOLDER
    if finished and not any(str(t.get("output", "")).startswith(NOT_GRADED) for t in data["tests"]
                            if isinstance(t, dict)):
        return True
    if reached_s or finished:       # finished with criteria it had no time for: it reached its own total
        why = out_of_time(reached_s) if reached_s else "the grade's total time ran out"
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
        write_json(results, [], [headline, why])
    return False
