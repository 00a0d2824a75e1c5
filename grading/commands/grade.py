"""``python -m grading grade`` and ``list``: grade a submission as the course does, list the rubric."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import traceback
from dataclasses import replace
from pathlib import Path

from grading import KIT_ROOT
from grading.commands import benchmarks, profile, report
from grading.commands.options import add_course_options
from grading.engine.rubric import selects
from grading.engine.runner import CriterionResult, run_cases, warm_servers
from grading.kit import points
from grading.kit.course import PROBLEMS_ENV, chosen_problems
from grading.kit.intake import SubmissionError, open_submission
from grading.kit.regions import PROTECTED_RECORD
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
    grading_changed = [rel for rel in changed if rel.startswith("grading/")]
    return [f"this kit's grader differs from its release ({rel}): local scores may not match the course's"
            for rel in grading_changed]


def _all_failed(status: str, message: str, problem: str | None) -> list[CriterionResult]:
    """Every criterion (of ``problem``) at zero with ``message``: the report when nothing could be graded."""
    try:
        cases = all_cases()
    except Exception:  # noqa: BLE001 - the rubric itself is broken: nothing to list
        return []
    return [CriterionResult(c.id, c.problem, c.title, c.points, 0.0, status, message, 0.0, c.hidden)
            for case in cases for c in case.criteria if selects(problem, c.problem)]


def cmd_grade(args: argparse.Namespace) -> int:
    """``grade``: a report (and --json file) always comes out, even when the grader itself fails."""
    problem = args.problem
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
    if args.json:           # a placeholder until the real report replaces it: a killed grader still leaves one
        report.write_placeholder(Path(args.json))
    try:
        return _grade(args, problem)
    except Exception:  # noqa: BLE001 - a bug of the grader: still write a report that says so
        message = "grader error (not your fault; please tell the course staff):\n" + traceback.format_exc()[-3000:]
        print(message, file=sys.stderr)
        if args.json:
            report.write_json(Path(args.json), _all_failed("grader_error", message, problem), [message])
        return report.EXIT_GRADER_ERROR


def _grade(args: argparse.Namespace, problem: str | None) -> int:
    """Splice the submission (default: this folder) into a fresh copy of the kit and grade it, as the course does."""
    scratch = scratch_dir()
    notes = _self_check_notes(KIT_ROOT)
    try:
        try:
            submission_root = (KIT_ROOT if args.submission is None
                               else open_submission(Path(args.submission), KIT_ROOT, scratch))
        except SubmissionError as exc:
            print(f"error: {exc}", file=sys.stderr)
            if args.json:
                reason = f"submission rejected: {exc}"
                report.write_json(Path(args.json), _all_failed("failed", reason, problem), [reason])
            return report.EXIT_USAGE
        code_root = scratch / "kit"
        splice = build_grading_copy(KIT_ROOT, submission_root, code_root)
        servers = warm_servers(code_root)           # they import torch while this process loads the checks
        if servers is not None:
            servers.warm_up()
        try:
            notes += splice.notes()
            if args.submission is not None:
                notes += benchmarks.figures_notes(submission_root)
            cases = all_cases()
            progress = None if args.quiet else (lambda case: print(f"... running {case.name} "
                                                                   f"({case.world_size} rank(s))", file=sys.stderr))
            if args.timeout is not None:
                cases = [replace(case, timeout_s=args.timeout) for case in cases]
            if servers is not None and cases:
                servers.warm_up(max(case.world_size for case in cases))
            results = run_cases(cases, code_root, scratch / "runs", problem=problem, progress=progress,
                                barred=splice.barred, hints=splice.hints, servers=servers)
            results = [replace(r, message=splice.student_lines(r.message)) for r in results]   # the student's lines
        finally:
            if servers is not None:
                servers.close()
        print(report.table(results, notes, verbose=args.verbose))
        if args.profile:
            print("\nwhere the time went (seconds; per case, the rank that finished last):")
            print(profile.table(scratch / "runs"))
        if args.json:
            report.write_json(Path(args.json), results, notes)
        return report.exit_code(results)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            print(f"(kept the grading folder {scratch})", file=sys.stderr)


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
    grade.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    grade.add_argument("--keep", action="store_true", help="keep the temporary grading folder")
    grade.add_argument("--profile", action="store_true", help="also print where each case's time went")
    add_course_options(grade)
    grade.set_defaults(func=cmd_grade)
    listing = subparsers.add_parser("list", help="list cases and criteria")
    add_course_options(listing)
    listing.set_defaults(func=cmd_list)
