"""``python -m grading grade`` and ``list``: grade a submission as the course does, list the rubric."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from common import ROOT
from common.settings import STARTED_ENV as STARTED_ENV     # re-exported: ``__main__`` and tests name grade.STARTED_ENV
from common.settings import PROBLEMS_ENV
from grading.commands import benchmarks, profile, report, results_json
from grading.commands.options import add_course_options
from grading.sandbox import isolation
from grading.engine.rubric import selects
from grading.commands.result_tests import verdict
from grading.engine.runner import (MIN_CASE_S, NOT_GRADED, CriterionResult, Status, TotalTime, not_graded,
                                   run_cases, warm_servers)
from grading.kit import points
from grading.kit.course import chosen_problems
from grading.kit.intake import SubmissionError, open_submission
from grading.kit.splice import PROTECTED_RECORD
from grading.kit.submission import build_grading_copy, scratch_dir
from grading.problems import all_cases, folders, titles


def _self_check_notes(kit_root: Path) -> list[str]:
    """In a released starter, warn when the provided files differ from the release record."""
    record_file = kit_root / PROTECTED_RECORD
    if not record_file.exists():
        return []
    import hashlib
    record = json.loads(record_file.read_text())
    changed = [rel for rel, digest in record.get("provided_files", {}).items()
               if not (kit_root / rel).is_file()
               or hashlib.sha256((kit_root / rel).read_bytes()).hexdigest() != digest]
    grading_changed = [rel for rel in changed if rel.startswith(("grading/", "common/"))]
    return [f"this kit's grader differs from its release ({rel}): local scores may not match the course's"
            for rel in grading_changed]


def _all_failed(status: Status, message: str, problem: str | None) -> list[CriterionResult]:
    """Every criterion (of ``problem``) at zero with ``message``: the report when nothing could be graded."""
    try:
        cases = all_cases()
    except Exception:  # noqa: BLE001 - the rubric itself is broken: nothing to list
        return []
    return [CriterionResult(c.id, c.problem, c.title, c.points, 0.0, status, message, 0.0, c.hidden)
            for case in cases for c in case.criteria if selects(problem, c.problem)]


def _deadline(total_s: float | None, started: float) -> TotalTime | None:
    """The cases' share of a grade's ``--total-timeout`` (counted from ``started``, ``process_started``): all of
    it but a reserve for what comes after the last case (its judging, writing the results), a tenth of it and at
    most ``END_RESERVE_S``."""
    if total_s is None:
        return None
    return TotalTime(total_s, started + total_s - min(END_RESERVE_S, total_s / 10))


END_RESERVE_S = 20.0


def process_started() -> float:
    """``time.monotonic()`` of when this grade began, so ``--total-timeout`` counts the interpreter's start and
    imports as an outer ``timeout`` does: the creation time that ``python -m grading grade`` recorded in
    ``STARTED_ENV`` (``grading.__main__``; a fork server may run the grade on that process's behalf), taken out of
    the environment so no process under the grade inherits it; now for a grade called in this process."""
    now = time.monotonic()
    try:
        return now - max(0.0, time.time() - float(os.environ.pop(STARTED_ENV, "")))
    except ValueError:
        return now


def cmd_grade(args: argparse.Namespace) -> int:
    """``grade``: a report (and --json file) always comes out, even when the grader itself fails."""
    started = process_started()
    problem = args.problem
    if args.total_timeout is not None and args.total_timeout <= 0:
        print(f"error: --total-timeout must be positive, got {args.total_timeout:g}", file=sys.stderr)
        return report.EXIT_USAGE
    if args.timeout is not None and args.timeout < MIN_CASE_S:
        print(f"error: --timeout must be at least {MIN_CASE_S:g} second (a case's limit), got {args.timeout:g}",
              file=sys.stderr)
        return report.EXIT_USAGE
    if problem is not None and problem not in titles() and problem not in {p.split(".")[0] for p in titles()}:
        print(f"error: unknown problem {problem!r}; choose from {', '.join(titles())}", file=sys.stderr)
        return report.EXIT_USAGE
    if problem is not None and problem.split(".")[0] not in chosen_problems():
        # an optional problem the course did not pick: grade it when this kit has it (staff), else say so
        top = problem.split(".")[0]
        if not any(p.split(".")[0] == top for p in folders()):
            print(f"error: Problem {top} is not part of this course's kit (its problems: "
                  f"{', '.join(chosen_problems())})", file=sys.stderr)
            return report.EXIT_USAGE
        os.environ[PROBLEMS_ENV] = ",".join((*chosen_problems(), top))
    out = results_json.GradeFile(Path(args.json) if args.json else None)
    try:
        return _grade(args, problem, _deadline(args.total_timeout, started), out)
    except Exception:  # noqa: BLE001 - a bug of the grader: still write a report that says so
        message = "grader error (not your fault; please tell the course staff):\n" + traceback.format_exc()[-3000:]
        print(message, file=sys.stderr)
        # what was judged before keeps its verdict; the rest is not graded, for this reason
        out.grader_failed(GRADER_FAILED, message, _all_failed(Status.NOT_GRADED, NOT_GRADED + GRADER_FAILED, problem))
        return report.EXIT_GRADER_ERROR


GRADER_FAILED = "the grader failed (not your fault; please tell the course staff)"


def _grade(args: argparse.Namespace, problem: str | None, total: TotalTime | None, out: results_json.GradeFile) -> int:
    """Splice the submission (default: this folder) into a fresh copy of the kit and grade it, as the course does.

    ``out`` (``--json``) is a ``results_json.PartialReport`` while the cases run, so a grade stopped midway keeps
    what it judged; ``total``: the cases' share of ``--total-timeout`` (``runner.run_cases``).
    """
    scratch = scratch_dir()
    notes = _self_check_notes(ROOT)
    try:
        submission_root = _open_or_reject(args.submission, problem, scratch, out)
        if submission_root is None:
            return report.EXIT_USAGE
        results = _grade_copy(args, problem, total, submission_root, scratch, notes, out)
        if args.profile:
            print("\nwhere the time went (seconds; per case, the rank that finished last):")
            print(profile.table(scratch / "runs"))
        return report.exit_code(results)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            print(f"(kept the grading folder {scratch})", file=sys.stderr)


def _open_or_reject(submission: str | None, problem: str | None, scratch: Path,
                    out: results_json.GradeFile) -> Path | None:
    """The root of ``submission`` (this kit for None), or None once its rejection is said on stderr and written
    to ``out`` as every criterion failed."""
    try:
        return ROOT if submission is None else open_submission(Path(submission), ROOT, scratch)
    except SubmissionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        reason = f"submission rejected: {exc}"
        out.final(_all_failed(Status.FAILED, reason, problem), [reason])
        return None


def _grade_copy(args: argparse.Namespace, problem: str | None, total: TotalTime | None, submission_root: Path,
                scratch: Path, notes: list[str], out: results_json.GradeFile) -> list[CriterionResult]:
    """Splice ``submission_root`` into the grading copy ``scratch/graded``, run its cases on warm fork servers
    (closed at the end) and report the verdicts (``_report``); ``notes`` gains the splice's and the isolation's
    notes."""
    code_root = scratch / "graded"
    splice = build_grading_copy(ROOT, submission_root, code_root)
    servers = warm_servers(code_root)           # they import torch while this process loads the checks
    if servers is not None:
        servers.warm_up()
    try:
        notes += splice.notes()
        if args.submission is not None:
            notes += benchmarks.figures_notes(submission_root)
        cases = all_cases()
        if args.timeout is not None:
            cases = [replace(case, timeout_s=args.timeout) for case in cases]
        live = _LiveReport(args, problem, cases, notes, splice.student_lines, out)
        if servers is not None and cases:
            servers.warm_up(max(case.world_size for case in cases))
        results = run_cases(cases, code_root, scratch / "runs", problem=problem, progress=live.progress,
                            refused=splice.refused, hints=splice.hints, servers=servers, total=total,
                            judged=live.judged)
        results = [replace(r, message=splice.student_lines(r.message)) for r in results]   # the student's lines
        _report(out, results, notes, live, *isolation.run_report(scratch / "runs", cases))
        return results
    finally:
        if servers is not None:
            servers.close()


class _LiveReport:
    """What a grade shows while its cases run: a progress line per case (unless ``--quiet``), the staff table's
    rows as each case ends (``report.LiveTable``), ``out``'s ``results_json.PartialReport``; it keeps the cases
    that hit their limit (``hit_limit``)."""

    def __init__(self, args: argparse.Namespace, problem: str | None, cases: list, notes: list[str],
                 student_lines: Callable[[str], str], out: results_json.GradeFile) -> None:
        listed = [v for case in cases for v in not_graded(case, results_json.PENDING) if selects(problem, v.problem)]
        self.quiet = args.quiet
        self.partial = out.partial(listed, notes, student_lines)
        self.table = report.LiveTable(listed, notes, verbose=args.verbose, public=args.public_table,
                                      transform=student_lines)
        self.hit_limit: list[str] = []

    def progress(self, case) -> None:
        """``run_cases``'s ``progress``: a case's ranks are about to start."""
        if not self.quiet:
            print(f"... running {case.name} ({case.world_size} rank(s))", file=sys.stderr)
        if self.partial is not None:
            self.partial.running(case.criteria[0].problem, [c.id for c in case.criteria])

    def judged(self, case, verdicts, result) -> None:
        """``run_cases``'s ``judged``: a case's verdicts are known."""
        if result is not None and result.timed_out:
            self.hit_limit.append(f"{case.name} (Problem {case.criteria[0].problem}) hit its limit of "
                                  f"{result.limit_s:.1f} s")
        if self.partial is not None:
            self.partial.judged(verdicts)
        self.table.judged(verdicts)           # the staff table's rows, as each case ends


def _report(out: results_json.GradeFile, results: list[CriterionResult], notes: list[str], live: _LiveReport,
            protection: str, flags: list[str]) -> None:
    """Write the final report: ``out`` first, then the table's end; ``notes`` gains the isolation's ``flags``
    and a warning when the protection (``isolation.run_report``) was not applied."""
    notes += flags
    if "NOT applied" in protection or "no isolation" in protection:
        notes.append(f"warning: {protection}")
    extra = {**({results_json.HIT_LIMIT: live.hit_limit} if live.hit_limit else {}),
             **({results_json.PROTECTION: protection} if protection else {})}
    # first, while the margin of the total time lasts (``_deadline``)
    out.final(results, [*notes, *_not_graded_notes(results)], extra or None)
    live.table.close(results, notes, [f"protection: {protection}"] if protection else [])


def _not_graded_notes(results: list[CriterionResult]) -> list[str]:
    """One note per reason some criteria were not graded (the grade's total time ran out), with their count
    (``result_tests.verdict``'s ``why``, as the table's end and grades.csv state them)."""
    return list(verdict(results_json.gradescope_json(results)).why)


def cmd_list(args: argparse.Namespace) -> int:
    cases = all_cases()
    for case in cases:
        print(f"{case.name}  ({case.world_size} rank(s), limit {case.timeout_s:g} s)")
        for c in case.criteria:
            print(f"    {c.id:<34} {c.points:>4g}  {c.title}{'  [hidden]' if c.hidden else ''}")
    print("\n".join(points.problem_lines([c for case in cases for c in case.criteria], points.worth)))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``grade`` and ``list`` to the CLI."""
    grade = subparsers.add_parser("grade", help="grade a submission (a folder or zip; default: this kit)")
    grade.add_argument("submission", nargs="?", help="submission folder or zip (default: this kit itself)")
    grade.add_argument("--problem", help="only this problem, e.g. 1.2 or 1")
    grade.add_argument("--json", help="write Gradescope results.json here")
    grade.add_argument("--timeout", type=float, help="limit per case in seconds, counted on an idle machine's "
                       "clock (default: each case's)")
    grade.add_argument("--verbose", "-v", action="store_true",
                       help="show each failure's whole message (tracebacks, every line); by default the "
                       "table shows its first line and likely cause, wrapped")
    grade.add_argument("--total-timeout", type=float, metavar="S", help="seconds the whole grade may take: each "
                       "case may use what is left in proportion to its limit, so a hang cannot starve the problems "
                       "after it; a case with no time left is listed as not graded (default: no total)")
    grade.add_argument("--public-table", action="store_true", help="print the table a student may see: no "
                       "hidden criterion, totals of the public ones (for a course that shows stdout to students)")
    grade.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    grade.add_argument("--keep", action="store_true", help="keep the temporary grading folder")
    grade.add_argument("--profile", action="store_true", help="also print where each case's time went")
    add_course_options(grade)
    grade.set_defaults(func=cmd_grade)
    listing = subparsers.add_parser("list", help="list cases and criteria")
    add_course_options(listing)
    listing.set_defaults(func=cmd_list)
