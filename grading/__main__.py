"""Command line: ``python -m grading grade|list|release|gradescope|batch|fixtures|similarity|benchmarks``.

    python -m grading grade [SUBMISSION] [--problem ID] [--json FILE] [--timeout S]
    python -m grading list
    python -m grading release OUT_DIR [--problems 1,2,3]                 (staff)
    python -m grading gradescope OUT_DIR [--problems 1,2,3] [--course-secret S]   (staff)
    python -m grading batch SUBMISSIONS_DIR --out grades.csv [--jobs N]  (staff)
    python -m grading fixtures [--check]                                 (staff)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import threading
import traceback
from dataclasses import replace
from pathlib import Path

from grading import KIT_ROOT
from grading.commands import benchmarks, report, similarity
from grading.kit.course import PROBLEMS_ENV, all_cases, chosen_problems, parse_problems
from grading.kit.secret import SECRET_ENV, staff_side
from grading.kit.regions import PROTECTED_RECORD, RegionError
from grading.engine.rubric import selects
from grading.problems import titles
from grading.engine.runner import CriterionResult, run_cases
from grading.kit.submission import SubmissionError, build_grading_copy, open_submission, scratch_dir



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
        if not any((KIT_ROOT / "grading" / "checks").glob(f"p{top}_*.py")):
            print(f"error: Problem {top} is not part of this course's kit (its problems: "
                  f"{', '.join(chosen_problems())})", file=sys.stderr)
            return report.EXIT_USAGE
        os.environ[PROBLEMS_ENV] = ",".join((*chosen_problems(), top))
    if args.json:           # a placeholder until the real report replaces it: a killed grader still leaves one
        report.write_json(Path(args.json), [], ["grading started but did not finish (the grader was killed "
                                                "or ran out of time)"])
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
        notes += splice.notes()
        if args.submission is not None:
            notes += benchmarks.figures_notes(submission_root)
        cases = all_cases()
        progress = None if args.quiet else (lambda case: print(f"... running {case.name} "
                                                               f"({case.world_size} rank(s))", file=sys.stderr))
        if args.timeout is not None:
            cases = [replace(case, timeout_s=args.timeout) for case in cases]
        results = run_cases(cases, code_root, scratch / "runs", problem=problem, progress=progress,
                            barred=splice.barred, hints=splice.hints)
        print(report.table(results, notes, verbose=args.verbose))
        if args.json:
            report.write_json(Path(args.json), results, notes)
        return report.exit_code(results)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            print(f"(kept the grading folder {scratch})", file=sys.stderr)


def _staff_only(command: str) -> int | None:
    """EXIT_USAGE with a one-line message when ``command`` runs in a student starter (no grading/hidden)."""
    if staff_side():
        return None
    print(f"error: `python -m grading {command}` is a staff command: it needs the course kit (grading/staff), "
          "which a student starter does not have", file=sys.stderr)
    return report.EXIT_USAGE


def cmd_release(args: argparse.Namespace) -> int:
    if (refused := _staff_only("release")) is not None:
        return refused
    from grading.commands.release import release
    try:
        record = release(KIT_ROOT, Path(args.out_dir), parse_problems(args.problems))
    except (RegionError, FileExistsError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return report.EXIT_USAGE
    regions = sum(len(v["regions"]) for v in record["student_files"].values())
    print(f"wrote the student starter to {args.out_dir} (Problems {', '.join(record['problems'])}): "
          f"{len(record['student_files'])} student files, {regions} regions emptied, "
          f"{len(record['provided_files'])} provided files")
    return 0


def cmd_fixtures(args: argparse.Namespace) -> int:
    if (refused := _staff_only("fixtures")) is not None:
        return refused
    from grading.staff import expected
    if args.check:
        stale = expected.stale()
        if stale:
            print(f"error: public fixtures out of date: {', '.join(stale)} (run `python -m grading fixtures`)",
                  file=sys.stderr)
            return report.EXIT_FAIL
        print("public fixtures match the staff answers")
        return 0
    for path in expected.write():
        print(f"wrote {path}")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    cases = all_cases()
    for case in cases:
        print(f"{case.name}  ({case.world_size} rank(s), limit {case.timeout_s:g} s)")
        for c in case.criteria:
            print(f"    {c.id:<34} {c.points:>4g}  {c.title}{'  [hidden]' if c.hidden else ''}")
    for problem in sorted({c.problem.split(".")[0] for case in cases for c in case.criteria}):
        criteria = [c for case in cases for c in case.criteria if selects(problem, c.problem)]
        hidden = sum(c.points for c in criteria if c.hidden)
        print(f"Problem {problem}: {sum(c.points for c in criteria):g} points ({hidden:g} hidden)")
    print(f"TOTAL {sum(c.points for case in cases for c in case.criteria):g}")
    return 0


def cmd_gradescope(args: argparse.Namespace) -> int:
    if (refused := _staff_only("gradescope")) is not None:
        return refused
    from grading.commands.gradescope import build_bundle
    try:
        archive = build_bundle(KIT_ROOT, Path(args.out_dir), parse_problems(args.problems),
                               args.course_secret or os.environ.get(SECRET_ENV, ""))
    except (RegionError, FileExistsError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return report.EXIT_USAGE
    print(f"wrote the Gradescope autograder {archive} (unpacked in {Path(args.out_dir) / 'source'}); "
          "upload the zip as the assignment's autograder")
    return 0


def cmd_batch(args: argparse.Namespace) -> int:
    from grading.commands.batch import run_batch
    if not Path(args.submissions_dir).is_dir():
        print(f"error: {args.submissions_dir}: not a folder", file=sys.stderr)
        return report.EXIT_USAGE
    extra = [*(["--problem", args.problem] if args.problem else []),
             *(["--timeout", str(args.timeout)] if args.timeout is not None else [])]
    rows = run_batch(Path(args.submissions_dir), Path(args.out), jobs=args.jobs, grade_args=extra,
                     results_dir=Path(args.results) if args.results else None,
                     progress=None if args.quiet else lambda line: print(line, file=sys.stderr))
    print(f"graded {len(rows)} submission(s) into {args.out}")
    if args.similarity:
        return similarity.run(Path(args.submissions_dir), Path(args.similarity))
    return 0


def _add_course_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--problems", dest="course_problems", help="grade these problems (default: the course's "
                        "choice in grading/course.json, else 1,2,3), e.g. 1,2,3,4")
    parser.add_argument("--course-secret", help=f"derive the hidden inputs from this secret (default: ${SECRET_ENV})")


def _apply_course_options(args: argparse.Namespace) -> None:
    """Put --problems and --course-secret in the environment, where every case builder (and batch child) reads them."""
    if getattr(args, "course_problems", None):
        os.environ[PROBLEMS_ENV] = ",".join(parse_problems(args.course_problems))
    if getattr(args, "course_secret", None) and args.func is not cmd_gradescope:
        os.environ[SECRET_ENV] = args.course_secret


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the command; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m grading", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    grade = sub.add_parser("grade", help="grade a submission (a folder or zip; default: this kit)")
    grade.add_argument("submission", nargs="?", help="submission folder or zip (default: this kit itself)")
    grade.add_argument("--problem", help="only this problem, e.g. 1.2 or 1")
    grade.add_argument("--json", help="write Gradescope results.json here")
    grade.add_argument("--timeout", type=float, help="wall-clock limit per case in seconds (default: each case's)")
    grade.add_argument("--verbose", "-v", action="store_true", help="show full failure messages")
    grade.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    grade.add_argument("--keep", action="store_true", help="keep the temporary grading folder")
    _add_course_options(grade)
    grade.set_defaults(func=cmd_grade)
    rel = sub.add_parser("release", help="write the student starter (staff)")
    rel.add_argument("out_dir")
    rel.add_argument("--problems", default="1,2,3", help="the problems this course hands out (default 1,2,3)")
    rel.set_defaults(func=cmd_release)
    listing = sub.add_parser("list", help="list cases and criteria")
    _add_course_options(listing)
    listing.set_defaults(func=cmd_list)
    bundle = sub.add_parser("gradescope", help="write the Gradescope autograder (setup.sh, run_autograder, zip)")
    bundle.add_argument("out_dir")
    bundle.add_argument("--problems", default="1,2,3", help="the problems this course grades (default 1,2,3)")
    bundle.add_argument("--course-secret", help="derive the hidden inputs from this secret (stored in the bundle "
                        f"only, never in a starter); default: ${SECRET_ENV}")
    bundle.set_defaults(func=cmd_gradescope)
    fixtures = sub.add_parser("fixtures", help="write the public fixtures from the staff answers (staff)")
    fixtures.add_argument("--check", action="store_true", help="only check that they are up to date")
    fixtures.set_defaults(func=cmd_fixtures)
    batch = sub.add_parser("batch", help="grade every submission (folder or zip) in a folder into a CSV")
    batch.add_argument("submissions_dir")
    batch.add_argument("--out", required=True, help="the CSV file to write")
    batch.add_argument("--jobs", type=int, default=1, help="submissions graded at the same time (default 1)")
    batch.add_argument("--results", help="folder for each submission's results.json and report "
                       "(default: next to the CSV, <name>_results/)")
    batch.add_argument("--problem", help="only this problem, e.g. 1.2 or 1")
    batch.add_argument("--timeout", type=float, help="wall-clock limit per case in seconds")
    batch.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    _add_course_options(batch)
    batch.add_argument("--similarity", metavar="DIR", help="also write the similarity report (pairs.csv, index.html)")
    batch.set_defaults(func=cmd_batch)
    similarity.register(sub)
    benchmarks.register(sub)
    args = parser.parse_args(argv)
    try:
        _apply_course_options(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return report.EXIT_USAGE
    if threading.current_thread() is not threading.main_thread():
        return args.func(args)
    # SIGTERM (e.g. from `timeout`) unwinds like an exception, so every launch kills its ranks on the way out
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        return args.func(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
