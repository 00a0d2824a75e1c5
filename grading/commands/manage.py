"""The staff commands' command lines: ``release``, ``gradescope``, ``fixtures``, ``batch``.

Each refuses in one line where the staff parts are absent (a student
starter); their modules are imported only when run, so a starter, which
lacks ``release.py``, still parses every command.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from grading import KIT_ROOT
from grading.commands import report, similarity
from grading.commands.options import add_course_options
from grading.kit.course import parse_problems
from grading.kit.regions import RegionError
from grading.kit.secret import SECRET_ENV, staff_side


def _staff_only(command: str) -> int | None:
    """EXIT_USAGE with a one-line message when ``command`` runs in a student starter (no grading/staff)."""
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
        record = release(KIT_ROOT, Path(args.out_dir), parse_problems(args.problems), preface=args.preface)
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


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``release``, ``gradescope``, ``fixtures`` and ``batch`` to the CLI."""
    rel = subparsers.add_parser("release", help="write the student starter (staff)")
    rel.add_argument("out_dir")
    rel.add_argument("--problems", default="1,2,3", help="the problems this course hands out (default 1,2,3)")
    rel.add_argument("--preface", metavar="FILE", help="a UTF-8 text file put first in the starter's README "
                     "(course name, deadline, policies)")
    rel.set_defaults(func=cmd_release)
    bundle = subparsers.add_parser("gradescope", help="write the Gradescope autograder (setup.sh, run_autograder, zip)")
    bundle.add_argument("out_dir")
    bundle.add_argument("--problems", default="1,2,3", help="the problems this course grades (default 1,2,3)")
    bundle.add_argument("--course-secret", help="derive the hidden inputs from this secret (stored in the bundle "
                        f"only, never in a starter); default: ${SECRET_ENV}")
    bundle.set_defaults(func=cmd_gradescope, keeps_secret=True)
    fixtures = subparsers.add_parser("fixtures", help="write the public expected values from the staff answers (staff)")
    fixtures.add_argument("--check", action="store_true", help="only check that they are up to date")
    fixtures.set_defaults(func=cmd_fixtures)
    batch = subparsers.add_parser("batch", help="grade every submission (folder or zip) in a folder into a CSV")
    batch.add_argument("submissions_dir")
    batch.add_argument("--out", required=True, help="the CSV file to write")
    batch.add_argument("--jobs", type=int, default=1, help="submissions graded at the same time (default 1)")
    batch.add_argument("--results", help="folder for each submission's results.json and report "
                       "(default: next to the CSV, <name>_results/)")
    batch.add_argument("--problem", help="only this problem, e.g. 1.2 or 1")
    batch.add_argument("--timeout", type=float, help="limit per case in seconds (an idle machine's clock)")
    batch.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    add_course_options(batch)
    batch.add_argument("--similarity", metavar="DIR", help="also write the similarity report (pairs.csv, index.html)")
    batch.set_defaults(func=cmd_batch)
